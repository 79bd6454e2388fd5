"""The MongoDB store reaches its collections only through the accessor that runs each call in
the current operation's causally consistent session: no path of the store holds a collection
that could skip it. What the server receives: tests/wire/test_wire_store.py."""

from __future__ import annotations

import asyncio

import pytest
from backends import held
from mongomock_motor import AsyncMongoMockClient

from tokensvc.storage.mongo import MongoStore, causal

pytestmark = pytest.mark.mongodb


class Recording:
    """A collection that records the keyword arguments of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, kwargs))


class Database:
    def __init__(self) -> None:
        self.collections: dict[str, Recording] = {}

    def __getitem__(self, name: str) -> Recording:
        return self.collections.setdefault(name, Recording())


def test_every_collection_the_store_holds_or_hands_out_is_sessioned():
    store = MongoStore(AsyncMongoMockClient(tz_aware=True), "tokensvc_test")
    raw = (type(store.db._db), type(store.db._db["clients"]))  # as the driver gives them
    values = held(store)
    assert store.registry in values and store.authorizations.credentials in values  # the parts were walked
    assert [value for value in values if isinstance(value, raw)] == []
    collections = {value._collection.name for value in values if isinstance(value, causal.SessionedCollection)}
    assert {"clients", "users", "installations", "grants", "codes", "families", "sessions", "failures"} \
        <= collections
    assert store.db is store.connection.db
    assert isinstance(store.db["families"], causal.SessionedCollection)
    assert isinstance(store.db.get_collection("families"), causal.SessionedCollection)


def test_a_call_through_the_accessor_runs_in_the_operations_session_and_only_then():
    db = causal.SessionedDatabase(Database())
    db["families"].find({"revoked_at": None})
    session = object()
    token = causal.CAUSAL_SESSION.set(session)
    try:
        db["families"].find({"revoked_at": None})
        db.get_collection("families").update_one({}, {})
        db["families"].create_indexes([])  # an index build reads no record: no session
    finally:
        causal.CAUSAL_SESSION.reset(token)
    assert db._db["families"].calls == [("find", {}), ("find", {"session": session}),
                                        ("update_one", {"session": session}), ("create_indexes", {})]


def test_a_sessioned_collection_passes_the_session_of_its_own_task():
    db = causal.SessionedDatabase(Database())

    async def operation(session):
        causal.CAUSAL_SESSION.set(session)  # each task has its own context
        await asyncio.sleep(0)
        db["codes"].find_one({})

    async def both():
        await asyncio.gather(operation("first"), operation("second"))

    asyncio.run(both())
    assert sorted(kwargs["session"] for _, kwargs in db._db["codes"].calls) == ["first", "second"]
