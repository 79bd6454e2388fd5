"""``/readyz`` asks the store cheaply: one short ping a second whatever the number of probes,
and readiness that lasts through a primary election."""

from __future__ import annotations

import asyncio

import pytest

from tokensvc.handlers.readiness import CHECK_SECONDS, GRACE_SECONDS, PING_SECONDS, Readiness
from tokensvc.storage.base import StorageError

pytestmark = pytest.mark.gen_test


class Store:
    prepared = True

    def __init__(self):
        self.pings, self.down, self.hang = 0, False, False

    async def ping(self):
        self.pings += 1
        if self.hang:
            await asyncio.sleep(60)
        if self.down:
            raise StorageError("no primary")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


async def test_concurrent_probes_share_one_ping_a_second():
    store, clock = Store(), Clock()
    readiness = Readiness(store, clock)
    assert all(await asyncio.gather(*(readiness.ready() for _ in range(20))))
    assert store.pings == 1
    clock.now += CHECK_SECONDS / 2
    assert await readiness.ready() and store.pings == 1
    clock.now += CHECK_SECONDS
    assert await readiness.ready() and store.pings == 2


async def test_an_election_does_not_make_the_instance_unready_but_a_long_outage_does():
    store, clock = Store(), Clock()
    readiness = Readiness(store, clock)
    assert await readiness.ready()
    store.down = True
    for _ in range(10):  # ten seconds without a primary
        clock.now += CHECK_SECONDS
        assert await readiness.ready()
    clock.now += GRACE_SECONDS
    assert not await readiness.ready()
    store.down = False
    clock.now += CHECK_SECONDS
    assert await readiness.ready()


async def test_a_ping_that_hangs_is_given_up_after_a_second(io_loop):
    store = Store()
    store.hang = True
    readiness = Readiness(store)
    started = io_loop.asyncio_loop.time()
    assert not await readiness.ready()  # never answered: not ready
    assert io_loop.asyncio_loop.time() - started < PING_SECONDS + 0.5


async def test_a_store_not_yet_prepared_is_not_ready():
    store = Store()
    store.prepared = False
    assert not await Readiness(store).ready() and store.pings == 0
