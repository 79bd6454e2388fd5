"""A socket's re-check (tokensvc/handlers/recheck.py): one check at a time; a change announced
while one runs causes exactly one more run after it, however many arrived; a failing check is
logged, never raised, and the next request checks again."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tokensvc.handlers.recheck import Recheck


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
    return await asyncio.wait_for(check.started.get(), 10)


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
