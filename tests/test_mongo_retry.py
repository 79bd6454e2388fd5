"""The MongoDB store's table of retry kinds (``mongo.RETRY_KINDS``) against the Store contract
and against the operations as they run: each method of the contract has exactly one kind, and
each operation runs as its kind says. How each kind meets a lost reply: tests/wire/test_wire_store.py."""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest
from backends import contract_methods
from helpers import eventually
from mongomock_motor import AsyncMongoMockClient

from tokensvc.storage.base import StorageError, StoreObserver
from tokensvc.storage.mongo import ONCE, READ, RERUN, RETRY_KINDS, STEPS, MongoStore, calls, guarded
from tokensvc.storage.mongo.calls import Calls
from tokensvc.storage.mongo.feed import MongoRevocationFeed
from tokensvc.storage.mongo.topology import Topology

pytestmark = pytest.mark.mongodb


def test_the_table_names_every_method_of_the_store_contract_and_no_other():
    steps = {name for name in RETRY_KINDS if name.startswith("_")} | {"heartbeat"}  # upkeep's: processes.py
    public = set(RETRY_KINDS) - steps
    assert public == set(contract_methods())
    assert set(RETRY_KINDS.values()) == {ONCE, RERUN, READ, STEPS}


def parts() -> list[type]:
    """The classes of the store's parts (each on the store's connection: the revocation feed is
    one of them), then the store's own."""
    store = MongoStore(AsyncMongoMockClient(tz_aware=True), "tokensvc_test")
    found = [type(value) for value in vars(store).values() if getattr(value, "connection", None) is store.connection]
    assert len(found) >= 5
    assert MongoRevocationFeed in found  # a part of its own, not a mixin of the store
    assert MongoRevocationFeed not in MongoStore.__mro__
    return [*found, MongoStore]


def test_every_operation_of_the_store_runs_as_the_table_says():
    classes = parts()
    for name, kind in RETRY_KINDS.items():
        # The part that implements it (the store hands the operation to it), else the store's own.
        owners = [cls for cls in classes[:-1] if hasattr(cls, name)] or [MongoStore]
        assert len(owners) == 1, (name, owners)
        method = getattr(owners[0], name)
        if kind == STEPS:
            # Not one operation: each step it runs is guarded on its own, and none of it twice.
            assert not hasattr(method, "retry_kind"), name
        else:
            assert method.retry_kind == kind, name
    guarded_methods = {name for cls in classes for name, member in inspect.getmembers(cls)
                       if hasattr(member, "retry_kind")}
    assert guarded_methods <= set(RETRY_KINDS), guarded_methods - set(RETRY_KINDS)


def test_an_operation_without_a_kind_in_the_table_is_refused_where_it_is_written():
    with pytest.raises(KeyError):
        @guarded()
        async def not_in_the_table(self):  # pragma: no cover - never runs
            pass
    with pytest.raises(ValueError, match="no kind of a single operation"):
        @guarded(STEPS)
        async def several(self):  # pragma: no cover - never runs
            pass


class Abandoned:
    """Just enough of the store for :func:`guarded`: a read that never answers, in a deployment
    whose elections a test plays (:class:`Topology`)."""

    budget = 0.05

    def __init__(self) -> None:
        self.topology, self.calls, self.clock, self.observer = Topology(), Calls(), None, StoreObserver()
        self.answer = asyncio.Event()  # the read's attempts end once the test lets them
        self.connection = self  # what guarded reads of a part's connection, this fake holds itself

    def unwritable(self) -> None:
        return None

    @guarded(kind=READ)
    async def read(self) -> None:
        await self.answer.wait()


@pytest.mark.gen_test
async def test_an_election_that_abandons_a_read_as_its_budget_runs_out_is_a_503_not_a_500():
    """The election's wake and the budget's end come in one turn of the loop (a busy process):
    the read is abandoned with nothing of its budget left. It is answered as a read whose
    budget ran out (StorageError, 503); it was tried again with a negative budget, which the
    driver refuses with a ValueError (a 500)."""
    store = Abandoned()
    reading = asyncio.ensure_future(store.read())
    await eventually(lambda: store.topology.elections, what="the read waiting")

    def elected_late() -> None:
        time.sleep(store.budget * 2)  # the loop busy past the budget
        for waiter in list(store.topology.elections):
            calls.wake(waiter, calls.ELECTED)  # before the budget's own timer runs

    asyncio.get_running_loop().call_soon(elected_late)
    with pytest.raises(StorageError, match="no answer within"):
        await reading
    store.answer.set()
    assert await store.calls.settle(5) == 0  # the attempt left behind ends by itself
