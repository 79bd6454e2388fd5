"""The MongoDB store's table of retry kinds (``mongo.RETRY_KINDS``) against the Store contract
and against the operations as they run: each method of the contract has exactly one kind, and
each operation runs as its kind says. How each kind meets a lost reply: tests/wire/test_wire_store.py."""

from __future__ import annotations

import inspect

import pytest
from backends import contract_methods

from tokensvc.storage.mongo import ONCE, READ, RERUN, RETRY_KINDS, STEPS, MongoStore, guarded

pytestmark = pytest.mark.mongodb


def test_the_table_names_every_method_of_the_store_contract_and_no_other():
    steps = {name for name in RETRY_KINDS if name.startswith("_")} | {"heartbeat"}  # upkeep's: processes.py
    public = set(RETRY_KINDS) - steps
    assert public == set(contract_methods())
    assert set(RETRY_KINDS.values()) == {ONCE, RERUN, READ, STEPS}


def test_every_operation_of_the_store_runs_as_the_table_says():
    for name, kind in RETRY_KINDS.items():
        method = getattr(MongoStore, name)
        if kind == STEPS:
            # Not one operation: each step it runs is guarded on its own, and none of it twice.
            assert not hasattr(method, "retry_kind"), name
        else:
            assert method.retry_kind == kind, name
    guarded_methods = {name for name, member in inspect.getmembers(MongoStore) if hasattr(member, "retry_kind")}
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
