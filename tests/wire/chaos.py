"""A store chaos run: two ``tokensvc serve`` processes on the wire tier's three-member replica set
(:class:`primary.ReplicaSet`, no MongoDB server), while a seeded script takes the set down and
back, steps its primary down and crashes it (another member elected each time), and clients
sign in, exchange their codes, refresh, introspect, hold WebSockets and revoke, each request
sent to one of the two processes in turn.

:func:`run` returns a report: every answer by status, the requests left unanswered, every
revocation and how long after its store's return both processes refused its token and its
WebSocket closed, the revoked families that still held a live pair, and how each process
stopped on SIGTERM. ``bench/chaos.py`` runs it from the command line; tests/wire/test_wire_chaos.py
runs a shorter one in the suite."""

from __future__ import annotations

import asyncio
import base64
import bisect
import hashlib
import random
import secrets
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import requests
from primary import ReplicaSet
from service import NOWHERE, WEBAPP_SECRET, Service, hidden_fields, start_service
from tornado.httpclient import HTTPClientError
from tornado.websocket import websocket_connect

BUDGET_MS = 1500  # storage.timeout_ms
ANSWER_SECONDS = 30.0  # a request not answered by then is unanswered: far above the budget
HEARD_SECONDS = 1.0  # a revoked token is refused everywhere this soon after the store is back
CLIENTS = 4  # client loops, each one family at a time
PROBE_SECONDS = 0.1  # a revoked token is introspected this often until both processes refuse it
PROBES = 16  # at most this many probes of one token at one process in flight (budget / PROBE_SECONDS)
SHORTEST = 30.0  # every kind at least once (the last by 18 s, back by 22 s), then clients on a served store
KINDS = ("down", "step-down", "crash")  # every kind comes back ("back", "elected") on its own
REDIRECT = NOWHERE["webapp"]
AUTH = ("webapp", WEBAPP_SECRET)


def storage(uri: str) -> str:
    return f'[storage]\nbackend = "mongodb"\nmongodb_uri = "{uri}"\ntimeout_ms = {BUDGET_MS}\n'


@dataclass
class Revocation:
    access: str
    refresh: str
    at: float  # when the revocation was answered 200
    socket_closed: float | None = None  # when its WebSocket closed (None: it had none, or never)
    socket_code: int | None = None
    has_socket: bool = False
    # By when the introspection was sent: process -> the first answered "active": false, and
    # (process, when) of every one answered "active": true.
    refused: dict[int, float] = field(default_factory=dict)
    accepted: list[tuple[int, float]] = field(default_factory=list)
    probes: list[tuple[int, float, float, int | None]] = field(default_factory=list)  # process, sent, answered, status


class Chaos:
    def __init__(self, seconds: float, seed: int, directory: Path, clients: int = CLIENTS,
                 log: Any = print) -> None:
        self.seconds, self.seed, self.directory, self.clients, self.log = seconds, seed, directory, clients, log
        self.random = random.Random(seed)
        self.started = time.monotonic()
        self.answers: Counter[tuple[str, int | str]] = Counter()  # (what, status or "unanswered")
        self.unanswered: list[str] = []
        self.lock = threading.Lock()
        self.ups: list[float] = [0.0]  # when the store came back (it is up at the start)
        self.downs: list[float] = []
        self.transitions: list[tuple[float, str]] = []
        self.revocations: list[Revocation] = []
        self.running = True
        self.ended = seconds
        self.settled = False  # every client's last revocation is in
        self.loop = asyncio.new_event_loop()

    def now(self) -> float:
        return time.monotonic() - self.started

    # -- the store's script

    def script(self) -> list[tuple[float, str]]:
        """(when, kind): every kind at least once, in a seeded order, a few seconds apart; the
        last comes back with time to spare before the end."""
        if self.seconds < SHORTEST:
            raise ValueError(f"a chaos run lasts at least {SHORTEST:g} s (every kind of transition, and the last back)")
        kinds = list(KINDS)
        self.random.shuffle(kinds)
        plan, at = [], 2.0
        while len(plan) < len(kinds) or at < self.seconds - 8.0:
            kind = kinds[len(plan)] if len(plan) < len(kinds) else self.random.choice(KINDS)
            plan.append((at, kind))
            at += self.random.uniform(5.0, 8.0)
        return plan

    def _mark(self, what: str, up: bool | None = None) -> None:
        with self.lock:
            self.transitions.append((round(self.now(), 2), what))
            if up is True:
                self.ups.append(self.now())
            elif up is False:
                self.downs.append(self.now())
        self.log(f"{self.now():6.2f}s  {what}")

    def _store(self, rs: ReplicaSet, plan: list[tuple[float, str]]) -> None:
        for at, kind in plan:
            time.sleep(max(0.0, at - self.now()))
            if not self.running:
                return
            if kind == "down":  # every member's process killed, then started again
                self._mark("down", up=False)
                for index in range(len(rs.members)):
                    rs.set_down(index)
                time.sleep(self.random.uniform(2.0, 4.0))
                for index in range(len(rs.members)):
                    rs.set_down(index, False)
                self._mark("back", up=True)
            elif kind == "step-down":
                target = ((rs.primary or 0) + 1) % len(rs.members)
                self._mark(f"step-down, electing member {target}", up=False)
                rs.step_down(elect=target, after=1.5).wait(10)
                self._mark(f"member {target} elected", up=True)
            else:  # the primary crashes (answers nothing, closes nothing); another is elected
                crashed = rs.primary or 0
                target = (crashed + 1) % len(rs.members)
                self._mark(f"member {crashed} crashes, electing member {target}", up=False)
                rs.crash(elect=target, after=1.5).wait(10)
                self._mark(f"member {target} elected", up=True)
                time.sleep(self.random.uniform(1.0, 2.0))
                rs.set_down(crashed)  # the crashed process is restarted: a secondary again
                rs.members[crashed].silent = False
                rs.set_down(crashed, False)
                self._mark(f"member {crashed} restarted")

    # -- the clients

    def _record(self, what: str, status: int | str) -> None:
        with self.lock:
            self.answers[(what, status)] += 1

    def _send(self, what: str, session: requests.Session, method: str, url: str,
              **kwargs: Any) -> requests.Response | None:
        """One request, its answer recorded; None when it had none."""
        try:
            answer = session.request(method, url, timeout=ANSWER_SECONDS, allow_redirects=False, **kwargs)
        except requests.RequestException as exc:
            self._record(what, "unanswered")
            with self.lock:
                self.unanswered.append(f"{self.now():.2f}s {what} {url}: {exc!r}")
            return None
        self._record(what, answer.status_code)
        return answer

    def _until_served(self, what: str, session: requests.Session, method: str, url: str,
                      **kwargs: Any) -> requests.Response | None:
        """Sent again while it is answered 503 (the store away), a moment apart; None when the
        run ends first or it is unanswered."""
        while self.running:
            answer = self._send(what, session, method, url, **kwargs)
            if answer is None or answer.status_code != 503:
                return answer
            time.sleep(0.2)
        return None

    def _family(self, bases: list[str], turn: int) -> None:
        """One family: sign in, the code, its exchange, a refresh, an introspection, a held
        WebSocket, the revocation. A step answered otherwise than a working store answers it
        (a code or a refresh token used by a try the store did not answer) starts over."""
        def base() -> str:
            nonlocal turn
            turn += 1
            return bases[turn % len(bases)]

        browser = requests.Session()
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = {"response_type": "code", "client_id": "webapp", "redirect_uri": REDIRECT, "scope": "read",
                 "code_challenge": challenge, "code_challenge_method": "S256"}
        home = base()
        answer = self._until_served("authorize", browser, "GET", home + "/oauth/authorize", params=query)
        if answer is None or answer.status_code != 302:
            return
        page = self._until_served("sign-in page", browser, "GET", urljoin(home, answer.headers["Location"]))
        if page is None or page.status_code != 200:
            return
        answer = self._until_served("sign-in", browser, "POST", home + "/login",
                                    data={**hidden_fields(page.text), "username": "alice",
                                          "password": "violet-tide-anchor"})
        if answer is None or answer.status_code != 302:
            return
        answer = self._until_served("authorize", browser, "GET", urljoin(home, answer.headers["Location"]))
        if answer is None or answer.status_code != 302 or not answer.headers["Location"].startswith(REDIRECT):
            return
        code = parse_qs(urlsplit(answer.headers["Location"]).query)["code"][0]
        client = requests.Session()
        issued = self._until_served("exchange", client, "POST", base() + "/oauth/token", auth=AUTH, data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "code_verifier": verifier})
        if issued is None or issued.status_code != 200:
            return
        refreshed = self._until_served("refresh", client, "POST", base() + "/oauth/token/refresh", auth=AUTH,
                                       data={"refresh_token": issued.json()["refresh_token"]})
        if refreshed is None or refreshed.status_code != 200:
            return
        tokens = refreshed.json()
        self._until_served("introspect", client, "POST", base() + "/oauth/token/introspect", auth=AUTH,
                           data={"token": tokens["access_token"]})
        revocation = Revocation(tokens["access_token"], tokens["refresh_token"], at=0.0)
        asyncio.run_coroutine_threadsafe(self._hold(base(), revocation), self.loop)
        time.sleep(self.random.uniform(0.5, 3.0))  # held across whatever the store does meanwhile
        answer = self._until_served("revoke", client, "POST", base() + "/oauth/token/revoke", auth=AUTH,
                                    data={"token": tokens["refresh_token"]})
        if answer is not None and answer.status_code == 200:
            revocation.at = self.now()
            with self.lock:
                self.revocations.append(revocation)

    async def _hold(self, base: str, revocation: Revocation) -> None:
        """A WebSocket with the family's access token, held until the service closes it."""
        url = base.replace("http://", "ws://") + "/v1/ws?access_token=" + revocation.access
        try:
            connection = await websocket_connect(url, connect_timeout=ANSWER_SECONDS)
        except HTTPClientError as exc:
            self._record("websocket", exc.code)
            return
        except Exception as exc:  # every other failure: the upgrade unanswered
            self._record("websocket", "unanswered")
            with self.lock:
                self.unanswered.append(f"{self.now():.2f}s websocket: {exc!r}")
            return
        self._record("websocket", 101)
        revocation.has_socket = True
        while await connection.read_message() is not None:
            pass
        revocation.socket_closed, revocation.socket_code = self.now(), connection.close_code

    def _client(self, bases: list[str], index: int) -> None:
        turn = index
        while self.running:
            self._family(bases, turn)
            turn += 3

    # -- the revocations, watched

    def _watch(self, bases: list[str]) -> None:
        """Introspect every revoked token at both processes until both refuse it: a probe every
        :data:`PROBE_SECONDS` while fewer than :data:`PROBES` of its own are in flight (a probe
        sent while the store is away waits out its budget, and the next must not wait for it).
        Every answer that still says active is kept."""
        in_flight: Counter[tuple[int, int]] = Counter()
        sessions = threading.local()

        def probe(key: tuple[int, int], revocation: Revocation, process: int) -> None:
            sent = self.now()
            try:
                if not hasattr(sessions, "session"):
                    sessions.session = requests.Session()
                answer = self._send("introspect (watch)", sessions.session, "POST",
                                    bases[process] + "/oauth/token/introspect", auth=AUTH,
                                    data={"token": revocation.access})
                with self.lock:
                    revocation.probes.append((process, round(sent, 3), round(self.now(), 3),
                                              answer.status_code if answer is not None else None))
                if answer is not None and answer.status_code == 200:
                    with self.lock:  # by when the probe was sent: when the token was presented
                        if answer.json()["active"]:
                            revocation.accepted.append((process, sent))
                        else:
                            revocation.refused[process] = min(sent, revocation.refused.get(process, sent))
            finally:
                with self.lock:
                    in_flight[key] -= 1

        with ThreadPoolExecutor(PROBES * 2 * self.clients) as pool:
            while not self.settled or (self._pending() and self.now() < self.ended + 10):
                for revocation in self._pending():
                    for process in range(len(bases)):
                        key = (id(revocation), process)
                        with self.lock:
                            if process in revocation.refused or in_flight[key] >= PROBES:
                                continue
                            in_flight[key] += 1
                        pool.submit(probe, key, revocation, process)
                time.sleep(PROBE_SECONDS)

    def _pending(self) -> list[Revocation]:
        with self.lock:
            return [revocation for revocation in self.revocations if len(revocation.refused) < 2]

    def back_before(self, moment: float) -> float:
        """When the store last came back before ``moment``."""
        return self.ups[bisect.bisect_right(self.ups, moment) - 1]

    def away_at(self, moment: float) -> bool:
        """Whether the store was away (down, or without a primary) at ``moment``."""
        before = bisect.bisect_right(self.downs, moment)
        return before > 0 and self.downs[before - 1] > self.back_before(moment)

    def lag(self, revocation: Revocation, moment: float) -> float:
        """How long after the revocation, or after the store's return if it was away since,
        ``moment`` came; 0 for a moment while the store was away (a request sent then waits for
        its return, or its budget)."""
        if self.away_at(moment):
            return 0.0
        return max(0.0, moment - max(revocation.at, self.back_before(moment)))

    # -- the run

    def run(self) -> dict[str, Any]:
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        rs = ReplicaSet(size=3).start()
        services: list[Service] = []
        try:
            for name in ("a", "b"):
                (self.directory / name).mkdir(parents=True, exist_ok=True)
                services.append(start_service(self.directory / name, storage(rs.uri())).wait_ready())
            bases = [service.base for service in services]
            self.started = time.monotonic()
            self.ended = self.seconds
            plan = self.script()
            watcher = threading.Thread(target=self._watch, args=(bases,), daemon=True)
            workers = [threading.Thread(target=self._store, args=(rs, plan), daemon=True)]
            workers += [threading.Thread(target=self._client, args=(bases, index), daemon=True)
                        for index in range(self.clients)]
            for worker in [watcher, *workers]:
                worker.start()
            time.sleep(max(0.0, self.seconds - self.now()))
            self.running = False
            self.ended = self.now()
            for worker in workers:
                worker.join(ANSWER_SECONDS + 15)
            self.settled = True
            watcher.join(ANSWER_SECONDS + 15)
            time.sleep(HEARD_SECONDS)  # the last sockets' closes
            live = self._live_pairs(bases)
            stops = []
            for service in services:
                begun = time.monotonic()
                output = service.stop()
                stops.append({"exit": service.returncode, "seconds": round(time.monotonic() - begun, 2),
                              "uncaught": [line for line in output.splitlines() if any(
                                  mark in line for mark in ("Uncaught exception", "Lock is not acquired"))],
                              "warnings_with_traceback": output.count("Traceback")})
            return self._report(live, stops)
        finally:
            self.running = False
            for service in services:
                service.stop()
            rs.stop()
            self.loop.call_soon_threadsafe(self.loop.stop)

    def _live_pairs(self, bases: list[str]) -> list[str]:
        """Every revoked family, with the store up: its refresh token refused at both processes,
        its access token inactive at both. What is not, by its refresh token's first characters."""
        session, live = requests.Session(), []
        for revocation in self.revocations:
            for base in bases:
                refreshed = self._send("refresh (revoked)", session, "POST", base + "/oauth/token/refresh",
                                       auth=AUTH, data={"refresh_token": revocation.refresh})
                looked = self._send("introspect (revoked)", session, "POST", base + "/oauth/token/introspect",
                                    auth=AUTH, data={"token": revocation.access})
                if (refreshed is None or refreshed.status_code != 400 or looked is None
                        or looked.status_code != 200 or looked.json()["active"]):
                    live.append(revocation.refresh[:8])
        return live

    def _report(self, live: list[str], stops: list[dict[str, Any]]) -> dict[str, Any]:
        by_status: Counter[str] = Counter()
        for (_, status), count in self.answers.items():
            by_status[str(status)] += count
        refusal_lags = [self.lag(r, max(r.refused.values())) for r in self.revocations if len(r.refused) == 2]
        timed = [r for r in self.revocations if len(r.refused) == 2]
        worst = max(timed, key=lambda r: self.lag(r, max(r.refused.values())), default=None)
        slowest = {} if worst is None else {"revoked_at": round(worst.at, 3), "refused": worst.refused,
                                            "back": round(self.back_before(max(worst.refused.values())), 3),
                                            "probes": worst.probes}
        socket_lags = [self.lag(r, r.socket_closed) for r in self.revocations if r.socket_closed is not None]
        unheard = [r.refresh[:8] for r in self.revocations if len(r.refused) < 2
                   or (r.has_socket and (r.socket_closed is None or r.socket_code != 4401))]
        late = [(r.refresh[:8], process, round(self.lag(r, moment), 3)) for r in self.revocations
                for process, moment in r.accepted if self.lag(r, moment) > HEARD_SECONDS]
        return {
            "seed": self.seed, "seconds": self.seconds, "transitions": self.transitions,
            "by_status": dict(sorted(by_status.items())),
            "by_request": {f"{what} {status}": count for (what, status), count in sorted(self.answers.items(),
                                                                                          key=str)},
            "unanswered": self.unanswered,
            "revocations": len(self.revocations),
            "sockets_closed_by_revocation": sum(1 for r in self.revocations if r.socket_code == 4401),
            "longest_refusal_seconds": round(max(refusal_lags, default=0.0), 3),
            "longest_socket_close_seconds": round(max(socket_lags, default=0.0), 3),
            "slowest": slowest,
            "details": [{"token": r.refresh[:8], "revoked_at": round(r.at, 3), "refused": r.refused,
                         "socket": r.has_socket, "socket_closed": r.socket_closed, "socket_code": r.socket_code,
                         "first_probes": r.probes[:4], "last_probes": r.probes[-4:]} for r in self.revocations],
            "unheard": unheard, "accepted_late": late, "live_pairs": live, "stops": stops,
        }


def run(seconds: float, seed: int, directory: Path, clients: int = CLIENTS, log: Any = print) -> dict[str, Any]:
    return Chaos(seconds, seed, directory, clients, log).run()


def summary(report: dict[str, Any]) -> str:
    lines = [f"store chaos: {report['seconds']:g} s, seed {report['seed']}",
             "transitions: " + "; ".join(f"{at:g}s {what}" for at, what in report["transitions"]),
             "answers by status: " + ", ".join(f"{status} x {count}" for status, count in report["by_status"].items()),
             f"unanswered: {len(report['unanswered'])}",
             f"revocations: {report['revocations']} ({report['sockets_closed_by_revocation']} WebSockets closed)",
             f"longest revocation to refusal at both processes, from the store's return: "
             f"{report['longest_refusal_seconds']:.3f} s; to its WebSocket's close: "
             f"{report['longest_socket_close_seconds']:.3f} s",
             f"unheard: {len(report['unheard'])}; accepted late: {len(report['accepted_late'])}; "
             f"revoked families with a live pair: {len(report['live_pairs'])}",
             "SIGTERM: " + ", ".join(f"exit {stop['exit']} in {stop['seconds']:.2f} s" for stop in report["stops"])]
    return "\n".join(lines)


def failures(report: dict[str, Any]) -> list[str]:
    """What the issue asks of a run that it did not do."""
    wrong = []
    if report["by_status"].get("500"):
        wrong.append(f"{report['by_status']['500']} answered 500")
    if report["unanswered"]:
        wrong.append(f"{len(report['unanswered'])} unanswered")
    if report["unheard"] or report["accepted_late"]:
        wrong.append(f"revocations unheard {report['unheard']}, accepted late {report['accepted_late']}")
    if report["longest_socket_close_seconds"] > HEARD_SECONDS:
        wrong.append(f"a revoked token's WebSocket closed {report['longest_socket_close_seconds']} s after")
    if report["longest_refusal_seconds"] > HEARD_SECONDS:
        wrong.append(f"a revoked token refused at both processes {report['longest_refusal_seconds']} s after")
    if report["live_pairs"]:
        wrong.append(f"revoked families with a live pair: {report['live_pairs']}")
    if any(stop["exit"] != 0 or stop["uncaught"] for stop in report["stops"]):
        wrong.append(f"stops: {report['stops']}")
    return wrong


def passed(report: dict[str, Any]) -> bool:
    return not failures(report)
