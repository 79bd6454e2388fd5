"""The storage backends every contract test runs against.

``memory``; ``mongodb`` through mongomock-motor in process, every driver call yielding to the
event loop as a real server's does (:mod:`yielding`); ``mongodb-real`` against the
server named by ``TOKENSVC_TEST_MONGODB_URI`` (skipped when it is not set), each test in
a database of its own that is dropped afterwards.
"""

from __future__ import annotations

import inspect
import os
import secrets

import pytest

from tokensvc.storage.base import FailureCounts, Store
from tokensvc.storage.memory import MemoryStore
from tokensvc.storage.mongo import MongoStore
from tokensvc.storage.mongo.causal import SessionedCollection, SessionedDatabase

REAL_URI = os.environ.get("TOKENSVC_TEST_MONGODB_URI")

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("mongodb", marks=pytest.mark.mongodb, id="mongodb"),
    pytest.param("mongodb-real", id="mongodb-real", marks=[
        pytest.mark.mongodb,
        pytest.mark.skipif(not REAL_URI, reason="set TOKENSVC_TEST_MONGODB_URI to run against a real MongoDB server"),
    ]),
]


def open_store(kind: str, io_loop):
    """(store, cleanup) for a backend kind, opened (indexes created)."""
    if kind == "memory":
        return MemoryStore(), lambda: None
    if kind == "mongodb":
        from mongomock_motor import AsyncMongoMockClient
        from yielding import Yielding

        # The stand-in has no change streams: revocations across processes are polled.
        store = MongoStore(Yielding(AsyncMongoMockClient(tz_aware=True)), "tokensvc_test", change_streams=False)
    else:
        from pymongo import AsyncMongoClient

        database = "tokensvc_test_" + secrets.token_hex(4)
        client = AsyncMongoClient(REAL_URI, tz_aware=True, serverSelectionTimeoutMS=5000)
        store = MongoStore(client, database)
    io_loop.run_sync(store.open)

    def cleanup():
        async def drop():
            if kind == "mongodb-real":
                await store.client.drop_database(store.db.name)
            await store.close()

        io_loop.run_sync(drop)

    return store, cleanup


def store_fixture():
    """A ``store`` fixture parametrized over every backend, for modules that run the HTTP app
    on each. Tests must name ``store`` in their signature: pytest-tornado reaches the app
    (and so the store) dynamically, which parametrization cannot see."""

    @pytest.fixture(params=BACKENDS)
    def store(request, io_loop):
        opened, cleanup = open_store(request.param, io_loop)
        yield opened
        cleanup()

    return store


def contract_methods() -> dict[str, object]:
    """Every operation a caller of the Store contract may run (storage/base.py): the public
    coroutines and streams of the Store and of the failure-count concern."""
    return {name: member for concern in (Store, FailureCounts) for name, member in inspect.getmembers(concern)
            if not name.startswith("_") and (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member))}


def held(store: MongoStore) -> list[object]:
    """Everything the store holds, and its parts (each on the store's connection) hold, down
    to the accessor: the objects of the MongoDB package, and the values they keep."""
    found, seen, objects = [], set(), [store]
    while objects:
        holder = objects.pop()
        if id(holder) in seen:
            continue
        seen.add(id(holder))
        values = list(getattr(holder, "__dict__", {}).values())
        values += [item for value in values if isinstance(value, dict) for item in value.values()]
        for value in values:
            found.append(value)
            if type(value).__module__.startswith("tokensvc.storage.mongo") \
                    and not isinstance(value, SessionedDatabase | SessionedCollection):
                objects.append(value)
    return found
