"""MongoDB start-up: every index attempted; an index that exists with other options is
reconciled (a TTL, by collMod) or stops start-up with one line naming it and what to do;
``/readyz`` answers 503 until the store is prepared."""

from __future__ import annotations

import json

import pytest
import requests
from pymongo.errors import OperationFailure
from service import free_port, start_service

from tokensvc.storage.base import StoreFault
from tokensvc.storage.mongo import INDEXES, MongoStore
from tokensvc.storage.mongo.format import HISTORY


class FakeCollection:
    """Index bookkeeping as a MongoDB server does it, with its error codes (mongomock gives none);
    documents (the store's format document) in mongomock."""

    def __init__(self, name, db):
        self.name, self.db, self.indexes = name, db, {}
        self.documents = db.documents[name]

    def __getattr__(self, name):
        return getattr(self.documents, name)

    async def create_index(self, keys, **options):
        info = {"key": list(keys), **{k: v for k, v in options.items() if k != "name"}}
        existing = self.indexes.get(options["name"])
        if existing is not None and existing != info:
            raise OperationFailure("An existing index has the same name as the requested index", 86
                                   if existing["key"] != info["key"] else 85)
        self.indexes[options["name"]] = info
        self.db.made.append(f"{self.name}.{options['name']}")
        return options["name"]

    async def create_indexes(self, models, **command):
        return [await self.create_index(list(model.document["key"].items()),
                                        **{key: value for key, value in model.document.items() if key != "key"})
                for model in models]

    async def drop_index(self, name):
        if name not in self.indexes:
            raise OperationFailure(f"index not found with name [{name}]", 27)
        del self.indexes[name]

    async def index_information(self):
        return {name: {**info, "v": 2} for name, info in self.indexes.items()}


class FakeDatabase:
    def __init__(self):
        from mongomock_motor import AsyncMongoMockClient

        self.collections, self.commands, self.made = {}, [], []
        self.documents = AsyncMongoMockClient()["tokensvc"]

    def __getitem__(self, name):
        return self.collections.setdefault(name, FakeCollection(name, self))

    async def command(self, document):
        if document == "hello":
            return {"ok": 1, "isWritablePrimary": True}
        self.commands.append(document)
        if "collMod" in document:
            index = document["index"]
            self[document["collMod"]].indexes[index["name"]]["expireAfterSeconds"] = index["expireAfterSeconds"]
        return {"ok": 1}


class FakeClient:
    def __init__(self, database):
        self.database = database

    def get_database(self, name, **options):
        return self.database

    def close(self):
        pass


def store_with(existing):
    db = FakeDatabase()
    for collection, name, info in existing:
        db[collection].indexes[name] = info
    return MongoStore(FakeClient(db), "tokensvc"), db


@pytest.mark.gen_test
async def test_a_changed_ttl_is_reconciled_in_place_and_every_index_is_made():
    store, db = store_with([("codes", "ttl", {"key": [("expires_at", 1)], "expireAfterSeconds": 60})])
    await store.open()
    assert db.commands == [{"collMod": "codes", "index": {"name": "ttl", "expireAfterSeconds": 3600}}]
    assert db["codes"].indexes["ttl"]["expireAfterSeconds"] == 3600
    assert sorted(db.made) == sorted(f"{c}.{HISTORY.index_name(c, o['name'], store.format)}" for c, _, o in INDEXES
                                     if (c, o["name"]) != ("codes", "ttl"))


@pytest.mark.gen_test
async def test_an_index_that_cannot_be_changed_stops_start_up_naming_it_after_making_the_others():
    store, db = store_with([("users", "username", {"key": [("username", 1)]})])  # not unique
    with pytest.raises(StoreFault) as refused:
        await store.open()
    message = str(refused.value)
    assert "index users.username exists with other options" in message
    assert "db.users.dropIndex('username')" in message and "\n" not in message
    assert len(db.made) == len(INDEXES) - 1  # every other index was still made
    assert db.commands == []


def test_serve_stops_with_the_conflict_as_one_line(monkeypatch):
    from helpers import serve_refusal

    from tokensvc import config
    from tokensvc.cli import main as cli

    store, _ = store_with([("users", "username", {"key": [("username", 1)]})])
    monkeypatch.setattr(cli, "make_store", lambda settings, **_: store)
    settings = config.load(None, environ={"TOKENSVC_STORAGE_BACKEND": "mongodb"}, overrides={"demo": True, "port": 1})
    assert serve_refusal(settings, 10).startswith("index users.username exists with other options")


@pytest.mark.gen_test
async def test_readyz_is_503_until_start_up_has_prepared_the_store(http_client, base_url, store, monkeypatch):
    """503 with Retry-After and, in the body, why: a store not yet prepared, then a member that
    takes no writes (what the driver's topology says), then ready."""
    store.prepared = False
    response = await http_client.fetch(base_url + "/readyz", raise_error=False)
    assert response.code == 503 and "Retry-After" in response.headers
    assert json.loads(response.body) == {"detail": "The token store is not answering; try again shortly.",
                                         "reason": "start-up has not prepared the store yet"}
    store.prepared = True
    secondary = "MongoDB at db1:27017 is not a writable primary (secondary): point storage.mongodb_uri at ..."
    monkeypatch.setattr(store, "unwritable", lambda: secondary)
    response = await http_client.fetch(base_url + "/readyz", raise_error=False)
    assert response.code == 503 and json.loads(response.body)["reason"] == secondary
    monkeypatch.undo()
    assert (await http_client.fetch(base_url + "/readyz")).code == 200


@pytest.mark.process
def test_readyz_waits_for_a_store_that_is_not_there(tmp_path):
    port = free_port()  # nothing listens there
    storage = (f'[storage]\nbackend = "mongodb"\nmongodb_uri = "mongodb://127.0.0.1:{port}"\n'
               'timeout_ms = 200\n')
    service = start_service(tmp_path, storage)
    try:
        ready = requests.get(service.base + "/readyz", timeout=5)
        assert ready.status_code == 503 and "Retry-After" in ready.headers
    finally:
        service.stop()
