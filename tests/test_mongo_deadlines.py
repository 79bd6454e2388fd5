"""How the MongoDB store bounds the driver's calls: it waits for each at most its budget and
never cancels one. A cancellation delivered while the driver waits on its topology's condition
(server selection) can leave the driver's lock held by no one on Python 3.11 (docs/guide/operations.md,
"A store that cannot be reached"): every later server selection, the driver's own monitor and
its close then wait forever. The real driver here, against a port where nothing listens."""

from __future__ import annotations

import asyncio
import socket
import sys
from datetime import timedelta

import pytest
from pymongo.asynchronous import pool as driver_pool
from pymongo.asynchronous import topology as driver_topology

from tokensvc.bootstrap import make_store
from tokensvc.config import StorageSettings
from tokensvc.records import Session, utcnow
from tokensvc.storage.base import StorageError
from tokensvc.storage.mongo import MongoStore, calls

pytestmark = [pytest.mark.mongodb, pytest.mark.gen_test(timeout=60)]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unreachable(timeout_ms: int) -> MongoStore:
    """A store as ``tokensvc serve`` builds it (its budget, the driver's server-selection and
    pool timeouts as the settings give them), whose server is not there."""
    return make_store(StorageSettings(backend="mongodb", mongodb_uri=f"mongodb://127.0.0.1:{closed_port()}",
                                      timeout_ms=timeout_ms))


@pytest.fixture
def driver_waits(monkeypatch):
    """Every cancellation that reaches the driver while it waits on a condition of its own
    (server selection, a connection from the pool): the operation that asked for it."""
    cancelled: list[str] = []
    for module in (driver_topology, driver_pool):
        original = module._async_cond_wait

        async def spy(condition, timeout, original=original):
            try:
                return await original(condition, timeout)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                cancelled.append(task.get_name() if task else "?")
                raise

        monkeypatch.setattr(module, "_async_cond_wait", spy)
    return cancelled


async def test_concurrent_operations_on_an_unreachable_store_end_in_503_and_never_cancel_the_driver(driver_waits):
    """Reads and writes of each kind, several at once, as requests make them: each ends in a
    StorageError within its budget, and no deadline of the store lands inside the driver."""
    store = unreachable(timeout_ms=700)
    now = utcnow()
    try:
        for _ in range(3):
            answers = await asyncio.gather(*(operation for _ in range(3) for operation in (
                store.get_client("webapp"), store.find_access("a" * 64), store.list_clients(),
                store.revoke_family("f" * 64, now), store.end_session("s" * 64, now),
                store.add_session(Session("s" * 64, "u_alice", now, now + timedelta(hours=1))),
                store.failure_counts().count_attempt("g", ["address"], 60))),
                return_exceptions=True)
            assert all(isinstance(answer, StorageError) for answer in answers), answers
        assert driver_waits == []
        # The calls the store stopped waiting for end by the driver's own deadlines; then
        # nothing holds the driver's topology.
        assert await store.calls.settle(10) == 0
        assert not store.client._topology._lock.locked()
    finally:
        await store.close()


async def test_settling_waits_for_every_call_still_running_and_cancels_none():
    """What a stop waits for once the client is closed: the calls left behind, a call a request
    still waits for (a drain that did not wait the request out), and one left meanwhile. The
    event loop's end cancels whatever still runs (asyncio.run), a driver call among them."""
    store_calls = calls.Calls()
    cancelled: list[str] = []

    async def call(name: str, seconds: float) -> str:  # as the driver waits for a server
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.append(name)
            raise
        return name

    left = store_calls.start(call("left", 0.1))
    store_calls.leave(left)
    waited = store_calls.start(call("waited", 0.6))
    request = asyncio.ensure_future(store_calls.wait(waited, 0.3))  # its budget ends while the store settles
    assert await store_calls.settle(10) == 0
    assert left.done() and waited.done() and cancelled == []
    with pytest.raises(calls.Left):
        await request
    assert store_calls.running == store_calls.left == set()
    assert calls.running(asyncio.get_running_loop()) == 0


async def test_the_stores_close_waits_for_the_call_of_a_request_still_in_flight(driver_waits):
    """A request the drain did not wait out is still waiting for its call when the store closes:
    the close waits for the call too (the closed client ends it at once), so nothing of the
    driver is left running for the event loop's end to cancel."""
    store = unreachable(timeout_ms=5000)
    request = asyncio.ensure_future(store.list_clients())
    await asyncio.sleep(0.2)  # its call is selecting a server
    assert len(store.calls.running) == 1 and not store.calls.left
    await store.close()
    assert store.calls.running == set() and calls.running(asyncio.get_running_loop()) == 0
    assert driver_waits == []
    with pytest.raises(StorageError):
        await request


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 rewrote asyncio.wait_for on asyncio.timeout")
async def test_the_drivers_condition_wait_leaves_its_lock_held_by_no_one_when_cancelled_at_the_wrong_moment():
    """Why the store never cancels a driver call (the upstream bug, as PyMongo 4.20 and Python
    3.11 have it): ``pymongo.lock._async_cond_wait`` waits with ``asyncio.wait_for``, which runs
    ``Condition.wait`` in a task of its own. When that wait times out while another task holds
    the lock, the inner task queues to take it back; a cancellation of the waiting task then
    makes ``wait_for`` return at once, the waiter's ``async with lock`` releases a lock it does
    not hold (``RuntimeError: Lock is not acquired``), and the inner task takes the lock later
    and ends holding it. When this test fails, the driver is fixed: see docs/guide/operations.md."""
    from pymongo.lock import _async_cond_wait, _async_create_condition, _async_create_lock

    lock = _async_create_lock()
    condition = _async_create_condition(lock)

    async def selection() -> None:  # Topology.select_servers: the lock, then the condition's wait
        async with lock:
            await _async_cond_wait(condition, 0.2)

    waiting = asyncio.ensure_future(selection())
    await asyncio.sleep(0.1)  # its wait began: the lock is free
    async with lock:  # another selection, or the monitor's update, holds the lock a moment
        await asyncio.sleep(0.2)  # the first wait timed out meanwhile: its inner task queues for the lock
        waiting.cancel()  # a deadline lands
    with pytest.raises(RuntimeError, match="Lock is not acquired"):
        await waiting
    await asyncio.sleep(0.05)
    assert lock.locked()  # by no one: nobody can select a server again
