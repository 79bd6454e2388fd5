"""The MongoDB store's table of retry kinds (``mongo.RETRY_KINDS``) against the Store contract
and against the operations as they run: each method of the contract has exactly one kind, and
each operation runs as its kind says. How each kind meets a lost reply: tests/wire/test_wire_store.py."""

from __future__ import annotations

import inspect

import pytest
from backends import contract_methods
from mongomock_motor import AsyncMongoMockClient

from tokensvc.storage.mongo import ONCE, READ, RERUN, RETRY_KINDS, STEPS, MongoStore, guarded

pytestmark = pytest.mark.mongodb


def test_the_table_names_every_method_of_the_store_contract_and_no_other():
    steps = {name for name in RETRY_KINDS if name.startswith("_")} | {"heartbeat"}  # upkeep's: processes.py
    public = set(RETRY_KINDS) - steps
    assert public == set(contract_methods())
    assert set(RETRY_KINDS.values()) == {ONCE, RERUN, READ, STEPS}


def parts() -> list[type]:
    """The classes of the store's parts (each on the store's connection), then the store's own
    (the revocation feed's operations)."""
    store = MongoStore(AsyncMongoMockClient(tz_aware=True), "tokensvc_test")
    found = [type(value) for value in vars(store).values() if getattr(value, "connection", None) is store.connection]
    assert len(found) >= 5
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
