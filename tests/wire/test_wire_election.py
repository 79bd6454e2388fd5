"""Elections on the wire: the primary of a three-member set steps down (its writes in flight
interrupted, the next ones refused as not primary) and, after a scripted delay, another member
is elected with a new term. A write in flight lands once on the new primary, and a client of
the HTTP service sees the failover as latency, not errors: the measured figures of
docs/guide/operations.md ("Failover") come from :func:`test_an_election_costs_latency_not_errors`.
A primary that crashes instead (it answers nothing, closes nothing) costs the single-document
writes sent to it before the election their budget, while reads are abandoned at the election
and run again: the figures for a crash come from
:func:`test_a_crashed_primary_costs_the_writes_it_holds_their_budget_and_no_more`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from helpers import WEBAPP_REDIRECT, WEBAPP_SECRET, basic, eventually, exchange, json_of, make_config, post_form
from primary import Fault, ReplicaSet, wire_settings
from test_wire_relay import Listening, States
from tornado.httpclient import AsyncHTTPClient

from tokensvc.bootstrap import make_store
from tokensvc.handlers.edge import recheck as recheck_module
from tokensvc.handlers.edge.recheck import Recheck
from tokensvc.records import AuthorizationCode, Client, Session, utcnow
from tokensvc.storage.base import StorageError
from tokensvc.storage.mongo import MongoStore

pytestmark = pytest.mark.gen_test(timeout=60)

BUDGET_MS = 4000  # storage.timeout_ms here: longer than the election, as in production (15 s against 10-12 s)
ELECTION_SECONDS = 1.5  # no primary for this long
HEARD_SECONDS = 1.0  # the bound: a revocation reaches every process's sockets this soon


@pytest.fixture
def primary():
    replica_set = ReplicaSet(size=3).start()
    yield replica_set
    replica_set.stop()


@pytest.fixture
def wire_budget_ms():
    return BUDGET_MS


@pytest.fixture
def store(wire_store):
    return wire_store


@pytest.fixture
def config():
    return make_config(storage={"backend": "mongodb", "mongodb_uri": "mongodb://db1,db2,db3/?replicaSet=rs0",
                                "timeout_ms": BUDGET_MS})  # the store itself is the wire tier's


def primary_address(store: MongoStore) -> str | None:
    description = store.topology.description
    servers = [server for server in description.known_servers if server.is_writable] if description else []
    return f"{servers[0].address[0]}:{servers[0].address[1]}" if servers else None


async def test_a_write_in_flight_at_a_step_down_lands_once_on_the_new_primary(wire_store, primary):
    now = utcnow()
    await wire_store.add_code(AuthorizationCode("c1", "webapp", "https://a/cb", ["read"], "u_alice", None, "x" * 43,
                                                "S256", now + timedelta(minutes=5)))
    primary.script(Fault("findAndModify", "delay", collection="codes", seconds=30))
    consuming = asyncio.ensure_future(wire_store.consume_code("c1", now, family_id="f1"))
    await eventually(lambda: primary.sent("findAndModify", "codes"), what="the write under way")
    elected = primary.step_down(elect=1, after=ELECTION_SECONDS)
    consumed = await consuming
    assert consumed is not None and consumed.consumed_at is None  # consumed by this call, once
    assert elected.is_set() and primary.term == 2 and primary.primary == 1
    assert ("findAndModify", 11602) in primary.refusals  # InterruptedDueToReplStateChange
    first, retry = primary.sent("findAndModify", "codes")
    assert first["txnNumber"] == retry["txnNumber"] and first["lsid"] == retry["lsid"]
    assert (await wire_store.get_code("c1")).family_id == "f1"
    await eventually(lambda: primary_address(wire_store) == primary.members[1].address,
                     what="the driver following the new term")


async def test_commands_that_reach_the_old_primary_are_refused_and_tried_again_on_the_new_one(wire_store, primary):
    """Before the driver hears of the step-down, a write and a read still go to the old primary:
    NotWritablePrimary (10107, retried by the driver) and NotPrimaryNoSecondaryOk (13435, tried
    again by the store), both answered by the member elected next."""
    now = utcnow()
    await wire_store.add_code(AuthorizationCode("c1", "webapp", "https://a/cb", ["read"], "u_alice", None, "x" * 43,
                                                "S256", now + timedelta(minutes=5)))
    primary.step_down(elect=2, after=ELECTION_SECONDS, announce=False)
    assert await wire_store.consume_code("c1", now, family_id="f1") is not None
    primary.step_down(elect=0, after=ELECTION_SECONDS, announce=False)
    assert (await wire_store.get_code("c1")).family_id == "f1"
    assert {("findAndModify", 10107), ("find", 13435)} <= set(primary.refusals)
    assert primary.term == 3


async def test_reads_waiting_on_a_crashed_primary_run_again_on_the_new_one(wire_store, primary):
    """A read in flight on a primary that crashes (it never answers, and closes nothing) is
    abandoned when the driver learns of the new primary, and run again there: answered soon
    after the election, not after the whole budget."""
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"]))
    primary.script(Fault("aggregate", "delay", collection="clients", seconds=30))
    before = len(primary.sent("aggregate", "clients"))
    started = time.monotonic()
    reading = asyncio.ensure_future(wire_store.get_client("webapp"))
    await eventually(lambda: len(primary.sent("aggregate", "clients")) > before, what="the read on the primary")
    elected = primary.crash(elect=1, after=ELECTION_SECONDS)
    assert (await reading).name == "Web"
    assert elected.is_set() and time.monotonic() - started < BUDGET_MS / 1000 * 0.75
    assert len(primary.sent("aggregate", "clients")) == before + 2  # once on each primary


async def test_a_single_document_write_waiting_on_a_crashed_primary_is_not_run_again(wire_store, primary):
    """A single-document write in flight on a primary that crashes may have applied there: it is
    not abandoned (only the driver's own retry, with its txnNumber, may run it again), so it
    waits its budget and is a StorageError (503): what docs/guide/operations.md says a crash costs."""
    now = utcnow()
    await wire_store.add_code(AuthorizationCode("c1", "webapp", "https://a/cb", ["read"], "u_alice", None, "x" * 43,
                                                "S256", now + timedelta(minutes=5)))
    primary.script(Fault("findAndModify", "delay", collection="codes", seconds=30))
    started = time.monotonic()
    consuming = asyncio.ensure_future(wire_store.consume_code("c1", now, family_id="f1"))
    await eventually(lambda: primary.sent("findAndModify", "codes"), what="the write on the primary")  # the first
    primary.crash(elect=1, after=ELECTION_SECONDS)
    with pytest.raises(StorageError, match="no answer within"):
        await consuming
    assert time.monotonic() - started >= BUDGET_MS / 1000 * 0.9
    assert len(primary.sent("findAndModify", "codes")) == 1


async def test_a_change_stream_on_a_crashed_primary_follows_the_new_one_where_it_stood(wire_store, primary):
    """The relay's change stream stands on the primary, which crashes: the getMore it waits on
    is never answered. As soon as the driver knows of the new primary, the stream is opened
    again on it where it stood (resumeAfter), without waiting out its watchdog (the stream's
    wait and the budget, 5 s here): a session another process ends then is heard within a
    second. Nothing was missed, so no socket re-checks, and the feed never says it was
    interrupted."""
    await wire_store.add_session(Session("s2", "u_alice", utcnow(), utcnow() + timedelta(hours=1)))
    other = make_store(wire_settings(primary, timeout_ms=BUDGET_MS))  # a second process
    wire_store.observer = observer = States()
    listening = Listening(wire_store)
    try:
        await eventually(lambda: observer.states == ["stream"] and primary.sent("getMore"), what="the stream open")
        assert await other.get_session("s2") is not None  # the other process's driver follows the set
        primary.crash(elect=1, after=ELECTION_SECONDS)
        await eventually(lambda: primary_address(other) == primary.members[1].address, what="the new primary known")
        assert await other.end_session("s2", utcnow())
        await eventually(lambda: listening.delivered == 1, seconds=HEARD_SECONDS,
                         what="the revocation heard within a second")
        assert listening.rechecks == [] and "interrupted" not in observer.states
        reopened = primary.sent("aggregate")[-1]["pipeline"][0]["$changeStream"]
        assert "resumeAfter" in reopened
    finally:
        await listening.stop()
        await other.close()


async def test_a_recheck_that_failed_on_a_crashed_primary_runs_again_once_another_is_elected(wire_store, primary,
                                                                                            caplog, monkeypatch):
    """A socket's re-check reads the store on the primary, which crashes; no member is elected
    within the read's budget, so the check fails. It runs again as soon as the driver learns
    of the new primary, not at its next second: the revocation it missed is heard within a
    second of the store's return, also where the relay's stream, following the new primary
    where it stood, announces nothing again."""
    monkeypatch.setattr(recheck_module, "RETRY_SECONDS", 60.0)  # only the election brings it back in time
    await wire_store.add_session(Session("s2", "u_alice", utcnow(), utcnow() + timedelta(hours=1)))
    attempts, answers = [], []

    async def check() -> None:
        attempts.append(1)
        answers.append(await wire_store.get_session("s2"))

    recheck = Recheck(check, "could not re-check the socket", wire_store.reachable)
    try:
        primary.crash(elect=1, after=None)  # nobody elected yet
        recheck.request()
        await eventually(lambda: "could not re-check the socket" in caplog.text, what="the check failed")
        assert attempts == [1] and answers == []
        primary.elect(1)
        await eventually(lambda: answers, seconds=HEARD_SECONDS, what="the check again within a second")
        assert len(attempts) == 2 and answers[0] is not None
    finally:
        recheck.stop()


class Traffic:
    """Clients of the service, each doing its kind of request in a loop, timing every answer."""

    def __init__(self, client: AsyncHTTPClient, base_url: str) -> None:
        self.client, self.base_url = client, base_url
        self.answers: list[tuple[str, float, float, str]] = []  # (kind, started, seconds, problem or "")
        self.running = True

    async def timed(self, kind: str, request, expect) -> dict:
        started = time.monotonic()
        response = await request()
        seconds = time.monotonic() - started
        body = json_of(response) if response.body else {}
        problem = "" if response.code == 200 and expect(body) else f"{response.code} {response.body[:120]!r}"
        self.answers.append((kind, started, seconds, problem))
        return body

    def auth(self) -> dict:
        return {"Authorization": basic("webapp", WEBAPP_SECRET)}

    async def exchanges(self, codes: list[str], chains: list[dict]) -> None:
        while self.running and codes:
            code = codes.pop()
            tokens = await self.timed("exchange", lambda code=code: exchange(self.client, self.base_url, code),
                                      lambda body: "access_token" in body)
            if "refresh_token" in tokens:
                chains.append(tokens)

    async def refreshes(self, chains: list[dict]) -> None:
        while self.running:
            if not chains:
                await asyncio.sleep(0.01)
                continue
            tokens = chains.pop(0)
            renewed = await self.timed("refresh", lambda token=tokens["refresh_token"]: post_form(
                self.client, self.base_url + "/oauth/token/refresh", {"refresh_token": token}, self.auth()),
                lambda body: "access_token" in body)
            if "access_token" in renewed:  # a refresh that failed has nothing to introspect
                await self.timed("introspection", lambda token=renewed["access_token"]: post_form(
                    self.client, self.base_url + "/oauth/token/introspect", {"token": token}, self.auth()),
                    lambda body: body.get("active") is True)
            chains.append(renewed if "refresh_token" in renewed else tokens)

    async def revocations(self, chains: list[dict], codes: list[str]) -> None:
        while self.running:
            if len(chains) < 4 or not codes:
                await asyncio.sleep(0.01)
                continue
            tokens = chains.pop()
            await self.timed("revocation", lambda token=tokens["refresh_token"]: post_form(
                self.client, self.base_url + "/oauth/token/revoke", {"token": token}, self.auth()),
                lambda body: True)


async def through(browser, base_url: str, failover: Callable[[], threading.Event]) -> tuple[Traffic, float, float]:
    """Exchanges, refreshes (an introspection after each) and revocations from eight clients
    while ``failover`` happens; the traffic, when it began and when its election was over."""
    client = AsyncHTTPClient(force_instance=True, max_clients=32)
    codes = [await browser.code_for("webapp", WEBAPP_REDIRECT) for _ in range(60)]
    chains: list[dict] = []
    traffic = Traffic(client, base_url)
    workers = [asyncio.ensure_future(traffic.exchanges(codes, chains)),
               *(asyncio.ensure_future(traffic.refreshes(chains)) for _ in range(6)),
               asyncio.ensure_future(traffic.revocations(chains, codes))]
    await eventually(lambda: len(traffic.answers) >= 30, what="traffic before the failover")
    began = time.monotonic()
    elected = failover()
    await eventually(elected.is_set, what="the election")
    known = time.monotonic()
    after = len(traffic.answers)
    await eventually(lambda: len(traffic.answers) >= after + 60, seconds=30, what="traffic after the election")
    traffic.running = False
    await asyncio.gather(*workers)
    client.close()
    return traffic, began, known


async def test_an_election_costs_latency_not_errors(browser, base_url, primary, capsys):
    """Exchanges, refreshes, introspections and revocations keep going while the primary steps
    down and another is elected 1.5 s later: none fails, and none waits much longer than the
    election (nor its budget)."""
    traffic, stepped_down, _ = await through(browser, base_url, lambda: primary.step_down(after=ELECTION_SECONDS))

    during = [answer for answer in traffic.answers if answer[1] + answer[2] >= stepped_down]
    failed = [answer for answer in traffic.answers if answer[3]]
    longest = max(seconds for _, _, seconds, _ in traffic.answers)
    kinds = {kind for kind, *_ in during}
    with capsys.disabled():
        print(f"\nelection of {ELECTION_SECONDS} s (budget {BUDGET_MS / 1000:g} s): {len(traffic.answers)} requests, "
              f"{len(during)} answered after the step-down, {len(failed)} failed, the longest waited {longest:.2f} s")
    assert failed == []
    assert kinds == {"exchange", "refresh", "introspection", "revocation"}
    assert max(seconds for _, _, seconds, _ in during) >= ELECTION_SECONDS * 0.8  # they did wait through it
    assert longest < BUDGET_MS / 1000  # for the new primary, never the whole budget


async def test_a_crashed_primary_costs_the_writes_it_holds_their_budget_and_no_more(browser, base_url, primary,
                                                                                      capsys):
    """The same traffic, but the primary crashes (it answers nothing more and closes nothing, as
    a host that lost power or a partition does) and another member is elected 1.5 s later.
    Unlike a step-down, what is in flight on it, or sent to it before the driver hears of the
    election, gets no answer: reads are abandoned at the election and run again on the new
    primary; a single-document write (an exchange's, a rotation's, a revocation's) waits its
    whole budget and is a 503 with Retry-After (never a 500). Every request that starts once the
    new primary is known is answered. The figures of docs/guide/operations.md ("Failover", a crash)
    come from here."""
    traffic, crashed, known = await through(browser, base_url,
                                            lambda: primary.crash(elect=1, after=ELECTION_SECONDS))

    failed = [answer for answer in traffic.answers if answer[3]]
    longest = max(seconds for _, _, seconds, _ in traffic.answers)
    held = [answer for answer in traffic.answers if answer[1] < known <= answer[1] + answer[2]]
    with capsys.disabled():
        print(f"\ncrash, election after {ELECTION_SECONDS} s (budget {BUDGET_MS / 1000:g} s): "
              f"{len(traffic.answers)} requests, {len(held)} in flight across the election, {len(failed)} failed "
              f"({', '.join(sorted(kind for kind, *_ in failed))}), the longest waited {longest:.2f} s")
    for kind, started, seconds, problem in failed:
        assert kind in ("exchange", "refresh", "revocation"), (kind, problem)  # a write; reads run again
        assert problem.startswith("503 ") and "not answering" in problem, (kind, problem)
        assert started < known, (kind, started - crashed)  # sent before the election was known
        assert seconds >= BUDGET_MS / 1000 * 0.9, (kind, seconds)  # it waited its budget...
    assert longest < BUDGET_MS / 1000 + 1.0  # ...and no request longer
    started_after = [answer for answer in traffic.answers if answer[1] >= known + 0.1]
    assert len(started_after) >= 50 and not [answer for answer in started_after if answer[3]]
