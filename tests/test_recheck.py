"""A socket's re-check (tokensvc/handlers/edge/recheck.py): one check at a time; a change announced
while one runs causes exactly one more run after it, however many arrived; a failing check is
logged, never raised, and the next request checks again. A socket that subscribes after its
handshake read the store checks before going on only when one of its keys was announced since
it began reading (or anything was, or more than are remembered)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from helpers import DEADLINE, eventually

from tokensvc.handlers.edge import recheck as recheck_module
from tokensvc.handlers.edge.recheck import Recheck
from tokensvc.oauth.events import REMEMBERED, RevocationEvents
from tokensvc.storage.base import CLIENT, FAMILY, GRANT, Revocation, StorageError


class GatedCheck:
    """A check that waits for its gate, counting its runs and the most of them at once."""

    def __init__(self) -> None:
        self.started: asyncio.Queue[int] = asyncio.Queue()
        self.gate = asyncio.Event()
        self.runs = self.running = self.most = 0
        self.fail = False

    async def __call__(self) -> None:
        self.runs += 1
        self.running += 1
        self.most = max(self.most, self.running)
        self.started.put_nowait(self.runs)
        try:
            await self.gate.wait()
            if self.fail:
                raise RuntimeError("the store is away")
        finally:
            self.running -= 1
            self.gate.clear()


async def started(check: GatedCheck) -> int:
    return await asyncio.wait_for(check.started.get(), DEADLINE)


async def let_run(check: GatedCheck, recheck: Recheck) -> None:
    """Open the gate for the running check and wait until no check runs."""
    check.gate.set()
    while recheck._task is not None:
        await asyncio.sleep(0)


@pytest.mark.gen_test
async def test_a_change_during_a_check_causes_exactly_one_more_run():
    check = GatedCheck()
    recheck = Recheck(check, "could not re-check")
    recheck.request()
    assert await started(check) == 1
    for _ in range(5):  # a burst while the first check runs
        recheck.request()
    check.gate.set()
    assert await started(check) == 2
    await let_run(check, recheck)
    assert (check.runs, check.most) == (2, 1)
    assert check.started.empty()


@pytest.mark.gen_test
async def test_requests_with_no_check_running_each_run_one():
    check = GatedCheck()
    recheck = Recheck(check, "could not re-check")
    for expected in (1, 2, 3):
        recheck.request()
        assert await started(check) == expected
        await let_run(check, recheck)
    assert (check.runs, check.most) == (3, 1)


class StoreAwayCheck:
    async def __call__(self) -> None:
        raise StorageError("the store did not answer within 2.0 s")


@pytest.mark.gen_test
async def test_a_check_the_store_cannot_answer_logs_one_line_with_no_traceback(caplog):
    """The store away is expected (every socket's check fails through an outage): one line
    that says why, never a traceback."""
    recheck = Recheck(StoreAwayCheck(), "could not re-check the thing")
    with caplog.at_level(logging.WARNING, logger="tokensvc.handlers.recheck"):
        recheck.request()
        await eventually(lambda: recheck._task is None, what="the check ended")
        recheck.stop()
    failures = [record for record in caplog.records if record.name == "tokensvc.handlers.recheck"]
    assert [record.getMessage() for record in failures] == [
        "could not re-check the thing: the store did not answer within 2.0 s"]
    assert failures[0].exc_info is None and "\n" not in caplog.text.strip()


@pytest.mark.gen_test
async def test_a_failing_check_is_logged_not_raised_and_the_next_request_checks_again(caplog):
    check = GatedCheck()
    check.fail = True
    recheck = Recheck(check, "could not re-check the thing")
    with caplog.at_level(logging.WARNING, logger="tokensvc.handlers.recheck"):
        recheck.request()
        await started(check)
        recheck.request()  # arrived during the failing check: still run once more
        check.gate.set()
        await started(check)
        check.fail = False
        await let_run(check, recheck)
    failures = [record for record in caplog.records if record.getMessage() == "could not re-check the thing"]
    assert len(failures) == 1 and failures[0].exc_info[0] is RuntimeError
    recheck.request()
    assert await started(check) == 3
    await let_run(check, recheck)
    assert check.most == 1


OURS = [Revocation(FAMILY, "f1"), Revocation(GRANT, "g1")]


async def stood_on(announce) -> list[str]:
    """The checks a socket standing on OURS runs in :meth:`Recheck.stand_on`, after
    ``announce(events)`` between its mark and its subscription: each one over before it returned."""
    events, checks = RevocationEvents(), []

    async def check() -> None:
        await asyncio.sleep(0)  # a store read yields
        checks.append("checked")

    recheck = Recheck(check, "could not re-check")
    mark = events.mark()
    announce(events)
    await recheck.stand_on(events, OURS, mark)
    assert recheck._task is None, "stand_on returned before its check was over"
    return checks


@pytest.mark.parametrize(("announce", "checks"), [
    (lambda events: None, 0),
    (lambda events: events.publish(Revocation(FAMILY, "f2")), 0),  # another socket's
    (lambda events: events.publish(Revocation(CLIENT, "f1")), 0),  # the same id, another kind
    (lambda events: events.publish(Revocation(GRANT, "g1")), 1),
    (lambda events: [events.publish(Revocation(FAMILY, "f1")) for _ in range(3)], 1),
    (lambda events: events.publish_all(), 1),  # anything may have been revoked
    (lambda events: [events.publish(Revocation(FAMILY, "f1"))] + [
        events.publish(Revocation(FAMILY, str(n))) for n in range(REMEMBERED)], 1),  # ours, among the last
    (lambda events: [events.publish(Revocation(FAMILY, "f1"))] + [
        events.publish(Revocation(FAMILY, str(n))) for n in range(REMEMBERED - 1)], 1),
    (lambda events: [events.publish(Revocation(FAMILY, str(n))) for n in range(REMEMBERED)], 0),
    (lambda events: [events.publish(Revocation(FAMILY, str(n))) for n in range(REMEMBERED + 1)], 1),  # forgotten
], ids=["none", "another-family", "another-kind", "its-grant", "its-family-thrice", "anything",
        "its-family-since-forgotten", "its-family-still-remembered", "as-many-as-remembered",
        "more-than-remembered"])
@pytest.mark.gen_test
async def test_a_socket_checks_before_going_on_only_when_what_it_stands_on_was_announced_since_its_mark(announce,
                                                                                                        checks):
    assert len(await stood_on(announce)) == checks


@pytest.mark.gen_test
async def test_after_standing_on_its_keys_a_socket_hears_each_later_announcement():
    events, heard = RevocationEvents(), asyncio.Event()

    async def check() -> None:
        heard.set()

    recheck = Recheck(check, "could not re-check")
    await recheck.stand_on(events, OURS, events.mark())
    assert not heard.is_set()
    events.publish(Revocation(GRANT, "g1"))
    await asyncio.wait_for(heard.wait(), 10)


@pytest.mark.gen_test
async def test_a_failing_check_is_tried_again_on_its_own_until_one_succeeds(monkeypatch):
    """The store away, a check fails, and nothing may announce again (the relay's own stream
    survived): the socket checks again on its own, a moment later, until a check succeeds."""
    monkeypatch.setattr(recheck_module, "RETRY_SECONDS", 0.01)
    check = GatedCheck()
    check.fail = True
    recheck = Recheck(check, "could not re-check")
    recheck.request()
    await started(check)
    await let_run(check, recheck)
    assert await started(check) == 2  # no request: tried again on its own
    await let_run(check, recheck)
    assert await started(check) == 3
    check.fail = False
    await let_run(check, recheck)
    await asyncio.sleep(0.05)
    assert check.runs == 3 and check.started.empty()  # a check that succeeded is not tried again


@pytest.mark.gen_test
async def test_a_stopped_recheck_is_not_tried_again(monkeypatch):
    monkeypatch.setattr(recheck_module, "RETRY_SECONDS", 0.01)
    check = GatedCheck()
    check.fail = True
    recheck = Recheck(check, "could not re-check")
    recheck.request()
    await started(check)
    await let_run(check, recheck)
    recheck.stop()  # the socket closed
    await asyncio.sleep(0.05)
    recheck.request()
    assert check.runs == 1 and check.started.empty()


@pytest.mark.gen_test
async def test_a_failing_check_is_tried_again_as_soon_as_the_store_may_answer_again():
    """The check failed with the store away. Its next try does not wait out its second when the
    store says sooner that it may answer again (MongoDB: a newly elected primary, a member that
    takes writes seen again): a change the failed check missed is heard as the store returns."""
    back = asyncio.Event()
    waited: list[float] = []

    async def reachable(seconds: float) -> None:  # the store's: at most ``seconds``, or until it is back
        waited.append(seconds)
        await back.wait()  # here, only the store's return ends it

    check = GatedCheck()
    check.fail = True
    recheck = Recheck(check, "could not re-check", reachable)
    recheck.request()
    await started(check)
    await let_run(check, recheck)
    await eventually(lambda: waited, what="the failed check waiting for the store")
    assert waited == [recheck_module.RETRY_SECONDS] and check.started.empty()
    back.set()  # the store is back
    assert await started(check) == 2
    check.fail = False
    await let_run(check, recheck)


@pytest.mark.gen_test
async def test_a_request_while_a_failed_check_waits_for_the_store_checks_at_once():
    never, waited = asyncio.Event(), []

    async def reachable(seconds: float) -> None:
        waited.append(seconds)
        await never.wait()

    check = GatedCheck()
    check.fail = True
    recheck = Recheck(check, "could not re-check", reachable)
    recheck.request()
    await started(check)
    await let_run(check, recheck)
    await eventually(lambda: waited, what="the failed check waiting for the store")
    waiting = recheck._retry
    assert waiting is not None
    recheck.request()  # an announcement: no need to wait for the store any more
    assert await started(check) == 2
    await eventually(waiting.cancelled, what="the wait for the store given up")
    check.fail = False
    await let_run(check, recheck)
    recheck.stop()
