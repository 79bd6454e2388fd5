"""``/readyz`` asks the store cheaply: one short ping a second whatever the number of probes,
and readiness that lasts through a primary election."""

from __future__ import annotations

import asyncio

import pytest

from tokensvc.handlers.edge.readiness import CHECK_SECONDS, GRACE_SECONDS, PING_SECONDS, Readiness
from tokensvc.storage.base import StorageError

pytestmark = pytest.mark.gen_test


class Store:
    prepared = True
    unwritable_because = None

    def __init__(self):
        self.pings, self.down, self.hang = 0, False, False

    def unwritable(self):
        return self.unwritable_because

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
    assert await asyncio.gather(*(readiness.unready() for _ in range(20))) == [None] * 20
    assert store.pings == 1
    clock.now += CHECK_SECONDS / 2
    assert await readiness.unready() is None and store.pings == 1
    clock.now += CHECK_SECONDS
    assert await readiness.unready() is None and store.pings == 2


async def test_an_election_does_not_make_the_instance_unready_but_a_long_outage_does():
    store, clock = Store(), Clock()
    readiness = Readiness(store, clock)
    assert await readiness.unready() is None
    store.down = True
    for _ in range(10):  # ten seconds without a primary
        clock.now += CHECK_SECONDS
        assert await readiness.unready() is None
    clock.now += GRACE_SECONDS
    assert await readiness.unready() is not None
    store.down = False
    clock.now += CHECK_SECONDS
    assert await readiness.unready() is None


async def test_a_ping_that_hangs_is_given_up_after_a_second(io_loop):
    store = Store()
    store.hang = True
    readiness = Readiness(store)
    started = io_loop.asyncio_loop.time()
    assert await readiness.unready() == "the store has not answered a ping for 30 s"  # never answered
    assert io_loop.asyncio_loop.time() - started < PING_SECONDS + 0.5


async def test_a_store_not_yet_prepared_is_not_ready():
    store = Store()
    store.prepared = False
    assert await Readiness(store).unready() == "start-up has not prepared the store yet" and store.pings == 0


async def test_a_store_that_knows_it_takes_no_writes_is_unready_at_once_saying_why():
    store, clock = Store(), Clock()
    readiness = Readiness(store, clock)
    assert await readiness.unready() is None
    store.unwritable_because = "MongoDB at db1:27017 is not a writable primary (secondary): ..."
    assert await readiness.unready() == store.unwritable_because  # no grace: waiting will not mend it
    store.unwritable_because = None
    assert await readiness.unready() is None
