"""``tokensvc serve`` processes while their store is unreachable, down, stepping down or coming
back: every request is answered within its budget (503 with ``Retry-After``, or the 200s the
interface promises whatever the store does), never 500 and never left unanswered; start-up keeps
trying and ``/readyz`` is 200 within seconds of the store's return; SIGTERM stops every process
(``--processes N`` too) within the drain, exit code 0, whatever the store does."""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from helpers import wait_until
from primary import ReplicaSet
from service import WEBAPP_SECRET, Service, free_port, start_service

from tokensvc.cli.supervisor import STOP_MARGIN

pytestmark = pytest.mark.e2e

BUDGET_MS = 1500  # storage.timeout_ms: the issue's
DRAIN_SECONDS = 20  # server.drain_seconds, the default
READY_SECONDS = 5.0  # /readyz answers 200 this soon after the store is back
ANSWER_SECONDS = 30.0  # a request not answered by then is left unanswered

# What each request may answer while the store does not: 503 (with Retry-After) where it needs
# the store, and what the interface answers whatever the store does.
REQUESTS = [
    ("GET", "/oauth/clients", {}, None, {503}),
    ("POST", "/oauth/revoke?token=abc", {"Authorization": "Bearer xyz"}, None, {503}),
    ("POST", "/oauth/revoke", {}, None, {200}),
    ("POST", "/oauth/sign-out?token=abc", {}, None, {503}),
    ("POST", "/oauth/sign-out", {}, None, {200}),
    ("POST", "/oauth/token/introspect", {}, {"token": "abc"}, {503}),
    ("POST", "/oauth/token/refresh", {}, {"refresh_token": "abc", "client_id": "webapp"}, {503}),
    ("GET", "/v1/me", {"Authorization": "Bearer abc"}, None, {503}),
    ("GET", "/readyz", {}, None, {503}),
    ("GET", "/healthz", {}, None, {200}),
    ("GET", "/.well-known/oauth-authorization-server", {}, None, {200}),
]
# Once the store answers again: the same requests, as a working store answers them.
SERVED = {"/oauth/clients": {200}, "/oauth/revoke?token=abc": {200}, "/oauth/sign-out?token=abc": {200},
          "/oauth/token/introspect": {200}, "/oauth/token/refresh": {400}, "/v1/me": {401}, "/readyz": {200}}


class Traffic:
    """Clients sending :data:`REQUESTS` in turn, ``width`` at a time, until stopped; every
    answer (or its absence) recorded."""

    def __init__(self, base: str, width: int = 4) -> None:
        self.base, self.width = base, width
        self.answers: list[tuple[str, int | None, str]] = []  # (path, status or None, what was wrong)
        self.running = True
        self.stopping = False  # the service is being stopped: a refused or closed connection is its doing
        self.pool = ThreadPoolExecutor(width)
        self.done = [self.pool.submit(self._client, index) for index in range(width)]

    def _client(self, index: int) -> None:
        session = requests.Session()
        sent = index
        while self.running:
            method, path, headers, form, _ = REQUESTS[sent % len(REQUESTS)]
            sent += 1
            auth = ("webapp", WEBAPP_SECRET) if path.startswith("/oauth/token") else None
            try:
                answer = session.request(method, self.base + path, headers=headers, data=form, auth=auth,
                                         timeout=ANSWER_SECONDS)
            except requests.ConnectionError as exc:
                if not self.stopping:
                    self.answers.append((path, None, f"no answer: {exc!r}"))
                return
            except requests.RequestException as exc:
                self.answers.append((path, None, f"no answer: {exc!r}"))
                continue
            wrong = "" if answer.status_code != 503 or answer.headers.get("Retry-After") else "no Retry-After"
            self.answers.append((path, answer.status_code, wrong))

    def stop(self) -> list[tuple[str, int | None, str]]:
        self.running = False
        for future in self.done:
            future.result(timeout=ANSWER_SECONDS + 5)
        self.pool.shutdown()
        return self.answers

    def count(self) -> int:
        return len(self.answers)


class InFlight:
    """One request in flight at a process: sent on a connection that process has already taken
    (it answered ``/healthz`` on it first), so that it is not waiting to be accepted, in a thread
    of its own. :meth:`start` returns once the request is sent; :attr:`outcome` holds its status
    and ``Retry-After``, or what went wrong instead."""

    def __init__(self, base: str, path: str) -> None:
        self.base, self.path = urlsplit(base), path
        self.outcome: list[Any] = []
        self.sent = threading.Event()
        self.thread = threading.Thread(target=self._send, daemon=True)

    def start(self) -> InFlight:
        self.thread.start()
        assert self.sent.wait(ANSWER_SECONDS), self.outcome
        return self

    def _send(self) -> None:
        connection = http.client.HTTPConnection(self.base.hostname, self.base.port, timeout=ANSWER_SECONDS)
        try:
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            connection.request("GET", self.path)
            self.sent.set()
            answer = connection.getresponse()
            answer.read()
            self.outcome.append((answer.status, answer.getheader("Retry-After")))
        except (OSError, http.client.HTTPException) as exc:  # the test looks at it
            self.outcome.append(exc)
        finally:
            self.sent.set()
            connection.close()

    def answer(self) -> Any:
        """The outcome, once the thread has ended."""
        self.thread.join(ANSWER_SECONDS + 5)
        assert not self.thread.is_alive() and len(self.outcome) == 1, self.outcome
        return self.outcome[0]


def unexpected(answers, allowed=None) -> list:
    """The answers that are not what the store's absence (or ``allowed``) permits."""
    expected = {path: statuses for _, path, _, _, statuses in REQUESTS}
    return [(path, status, wrong) for path, status, wrong in answers
            if status is None or wrong or status not in (allowed or expected).get(path, expected[path])]


def storage(uri: str) -> str:
    return f'[storage]\nbackend = "mongodb"\nmongodb_uri = "{uri}"\ntimeout_ms = {BUDGET_MS}\n'


def stopped_in_time(service: Service, traffic: Traffic | None = None) -> float:
    """SIGTERM to the service's process group (every worker), with ``traffic`` still coming;
    how long until it had all left. Each process's drain ends once the requests in flight are
    answered: a client sending one request after another on a kept-alive connection does not
    hold it (each connection ends with the next answer it carries)."""
    if traffic is not None:
        traffic.stopping = True
    started = time.monotonic()
    output = service.stop()
    took = time.monotonic() - started
    assert service.returncode == 0, output
    assert "Traceback" not in output and "Lock is not acquired" not in output, output
    assert "still in flight" not in output, output
    return took


@pytest.mark.parametrize("processes", [1, 2])
def test_with_the_store_unreachable_every_request_is_answered_and_sigterm_stops_every_process(tmp_path, processes):
    """The issue's case: the URI names a port where nothing listens; requests of every kind,
    four at a time. Then SIGTERM while some are in flight."""
    unreachable = free_port()  # nothing listens there
    args = ("--processes", str(processes)) if processes > 1 else ()
    service = start_service(tmp_path, storage(f"mongodb://127.0.0.1:{unreachable}"), args=args)
    traffic = Traffic(service.base)
    try:
        wait_until(lambda: traffic.count() >= 60, "60 answers", seconds=120)
        assert unexpected(traffic.answers) == []
        assert {status for _, status, _ in traffic.answers} == {200, 503}
        took = stopped_in_time(service, traffic)  # requests still in flight
        assert took < DRAIN_SECONDS + STOP_MARGIN
        assert unexpected(traffic.stop()) == []
    finally:
        traffic.running = False
        service.stop()


def test_the_store_down_then_back_costs_503s_and_nothing_else(tmp_path):
    primary = ReplicaSet().start()
    service = start_service(tmp_path, storage(primary.uri())).wait_ready()
    traffic = Traffic(service.base)
    try:
        wait_until(lambda: traffic.count() >= 10, "answers while the store answers")
        primary.set_down(0)
        down = traffic.count()
        wait_until(lambda: any(status == 503 for _, status, _ in traffic.answers[down:])
                   and traffic.count() >= down + 40, "40 answers while the store is down", seconds=120)
        outage = traffic.answers[down:]
        primary.set_down(0, False)
        back = time.monotonic()
        wait_until(lambda: requests.get(service.base + "/oauth/clients", timeout=ANSWER_SECONDS).status_code == 200,
                   "the store serving again", seconds=ANSWER_SECONDS)
        assert time.monotonic() - back < READY_SECONDS
        assert requests.get(service.base + "/readyz", timeout=ANSWER_SECONDS).status_code == 200
        wait_until(lambda: 'tokensvc_revocation_feed_state{state="stream"} 1.0' in requests.get(
            service.base + "/metrics", timeout=ANSWER_SECONDS).text, "the relay's change stream open again")
        served = traffic.count()
        wait_until(lambda: traffic.count() >= served + 20, "answers once the store is back")
        answers = traffic.stop()
        assert [answer for answer in outage if answer[1] in (None, 500) or answer[2]] == []
        assert unexpected(answers[served + traffic.width:], SERVED) == []  # past those in flight at the return
        assert stopped_in_time(service) < DRAIN_SECONDS + STOP_MARGIN
    finally:
        traffic.running = False
        service.stop()
        primary.stop()


def test_start_up_keeps_trying_and_is_ready_within_seconds_of_the_stores_return(tmp_path):
    """The store is away when the service starts, long enough for start-up's back-off to
    grow past the seconds /readyz may take to follow it; it comes back, and /readyz is 200
    within those seconds (start-up tries again as soon as the driver sees the store)."""
    primary = ReplicaSet().start()
    primary.set_down(0)
    service = start_service(tmp_path, storage(primary.uri()))
    try:
        wait_until(lambda: "retrying in 8s" in service.output(), "start-up's back-off reaching 8 s", seconds=120)
        assert requests.get(service.base + "/readyz", timeout=ANSWER_SECONDS).status_code == 503
        primary.set_down(0, False)
        back = time.monotonic()
        wait_until(lambda: requests.get(service.base + "/readyz", timeout=ANSWER_SECONDS).status_code == 200,
                   "/readyz 200", seconds=ANSWER_SECONDS)
        assert time.monotonic() - back < READY_SECONDS
        assert stopped_in_time(service) < DRAIN_SECONDS + STOP_MARGIN
    finally:
        service.stop()
        primary.stop()


def test_a_step_down_costs_no_request_an_error(tmp_path):
    primary = ReplicaSet(size=3).start()
    service = start_service(tmp_path, storage(primary.uri())).wait_ready()
    traffic = Traffic(service.base)
    try:
        wait_until(lambda: traffic.count() >= 10, "answers before the step-down")
        elected = primary.step_down(elect=1, after=1.0)
        before = traffic.count()
        wait_until(elected.is_set, "the election")
        wait_until(lambda: traffic.count() >= before + 30, "answers across the election")
        answers = traffic.stop()
        assert [answer for answer in answers if answer[1] in (None, 500) or answer[2]] == []
        assert stopped_in_time(service) < DRAIN_SECONDS + STOP_MARGIN
    finally:
        traffic.running = False
        service.stop()
        primary.stop()


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_stops_every_process_while_the_primary_answers_nothing(tmp_path, processes):
    """The primary crashed (it answers nothing, closes nothing) and no other is elected: the
    requests in flight wait their budget and are answered 503, one of them sent just before
    SIGTERM on a connection a process had taken; SIGTERM stops every process within the drain."""
    primary = ReplicaSet().start()
    args = ("--processes", str(processes)) if processes > 1 else ()
    service = start_service(tmp_path, storage(primary.uri()), args=args).wait_ready()
    traffic = Traffic(service.base)
    try:
        wait_until(lambda: traffic.count() >= 10, "answers before the crash")
        primary.crash(after=None)
        before = traffic.count()
        wait_until(lambda: any(status == 503 for _, status, _ in traffic.answers[before:]), "a 503 after the crash")
        in_flight = InFlight(service.base, "/oauth/clients").start()
        assert stopped_in_time(service, traffic) < DRAIN_SECONDS + STOP_MARGIN
        answer = in_flight.answer()  # answered within its budget, while the process drained
        assert isinstance(answer, tuple) and answer[0] == 503 and answer[1], answer
        answers = traffic.stop()
        assert [answer for answer in answers[before:] if answer[1] == 500 or answer[2]] == []
        assert Counter(status for _, status, _ in answers[before:])[None] == 0
    finally:
        traffic.running = False
        service.stop()
        primary.stop()

