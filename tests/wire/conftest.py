"""The wire tier: the real ``AsyncMongoClient`` against :class:`primary.ReplicaSet`."""

from __future__ import annotations

import pytest
from primary import BUDGET_MS, ReplicaSet, wire_settings

from tokensvc.bootstrap import make_store
from tokensvc.storage.mongo import MongoStore


def pytest_collection_modifyitems(items):
    for item in items:
        if "/wire/" in str(item.fspath):
            item.add_marker(pytest.mark.wire)
            item.add_marker(pytest.mark.mongodb)


@pytest.fixture
def primary(request):
    """A replica set of one member; of ``MEMBERS`` where the module names them (three, as a
    deployment runs, where every command any member receives is counted)."""
    server = ReplicaSet(size=getattr(request.module, "MEMBERS", 1)).start()
    yield server
    server.stop()


@pytest.fixture
def wire_budget_ms() -> int:
    """``storage.timeout_ms`` of ``wire_store``: the tier's short budget, so that a fault that
    waits it out ends quickly. A module none of whose faults waits on it gives a longer one."""
    return BUDGET_MS


@pytest.fixture
def wire_store(primary, io_loop, wire_budget_ms):
    """A MongoStore over the real driver, opened (its indexes made), talking to ``primary``."""
    async def opened() -> MongoStore:  # the driver's event listeners start within a running loop
        store = make_store(wire_settings(primary, timeout_ms=wire_budget_ms))
        await store.open()
        return store

    store = io_loop.run_sync(opened)
    primary.forget()
    yield store
    io_loop.run_sync(store.close)
