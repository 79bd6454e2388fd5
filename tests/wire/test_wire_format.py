"""The versioned store on the wire: the format document a store gets, the refusal of a store
this release cannot read, lookups in either format and writes in the one the compatibility
version says, the processes and connections the storage commands see, finalize's refusals,
and the index rule (a retired index dropped only once no release allowed to run needs it)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import timedelta

import pytest
from helpers import eventually
from primary import Fault, ReplicaSet, wire_settings
from pymongo import AsyncMongoClient

from tokensvc import __version__
from tokensvc.bootstrap import make_store
from tokensvc.oauth import hashing
from tokensvc.records import AuthorizationCode, Client, Family, Installation, Pair, Session, User, utcnow
from tokensvc.storage.base import StorageError, StoreFault, StoreObserver
from tokensvc.storage.mongo import MongoStore, migrations, processes, upgrade
from tokensvc.storage.mongo.format import FORMATS, TRIPWIRE, Format, History, Migration

pytestmark = pytest.mark.gen_test

DB = "tokensvc"


def digest(name: str) -> str:
    return hashing.digest(name)


def written_by_0_9_0(primary: ReplicaSet) -> None:
    """What a store 0.9.0 ran on holds before any later release opens it: no format document."""
    primary.db[DB]["users"].insert_one({"_id": "u_alice", "username": "alice", "password_hash": "x", "admin": False})


async def opened(primary: ReplicaSet, serving: bool = False, history: History | None = None) -> MongoStore:
    store = make_store(wire_settings(primary), serving=serving)
    if history is not None:
        store.history = history
    await store.open()
    return store


def meta(primary: ReplicaSet) -> dict:
    return primary.db[DB]["meta"].find_one({"_id": "format"})


def raw(primary: ReplicaSet, collection: str) -> list[dict]:
    return list(primary.db[DB][collection].find())


def credentials(now):
    """A code, a family and a session, keyed by real digests."""
    code = AuthorizationCode(digest("code"), "webapp", "https://a/cb", ["read"], "u_alice", None, "x" * 43, "S256",
                             now + timedelta(minutes=5))
    family = Family(digest("family"), "g1", "webapp", "u_alice", None, 0, ["read"], now, digest("refresh"),
                    digest("access"), now, now + timedelta(hours=1), now + timedelta(minutes=10), renewed_at=now)
    session = Session(digest("session"), "u_alice", now, now + timedelta(hours=1))
    return code, family, session


async def write_credentials(store: MongoStore):
    now = utcnow()
    code, family, session = credentials(now)
    await store.add_code(code)
    assert await store.create_family(family)
    await store.add_session(session)
    return code, family, session


# -- the format document -----------------------------------------------------------------------


async def test_an_empty_database_starts_at_this_releases_format_with_nothing_to_migrate(primary):
    store = await opened(primary)
    document = meta(primary)
    assert (document["format"], document["compatibility"]) == (3, 3)
    assert set(document["migrations"]) == {"packed-hashes"}
    assert [entry["release"] for entry in document["releases"]] == [__version__]
    await write_credentials(store)
    for collection in ("codes", "families", "sessions"):
        assert all(isinstance(doc["_id"], bytes) for doc in raw(primary, collection))
    family = raw(primary, "families")[0]
    assert all(isinstance(family[field], bytes) for field in ("refresh_hash", "access_hash"))
    await store.close()


async def test_a_store_0_9_0_wrote_is_format_1_and_is_written_as_0_9_0_writes_it(primary):
    written_by_0_9_0(primary)
    store = await opened(primary)
    document = meta(primary)
    assert (document["format"], document["compatibility"]) == (3, 1)  # expanded, not finalized
    assert document["migrations"] == {}
    code, family, session = await write_credentials(store)
    now = utcnow()
    await store.consume_code(code.code_hash, now, family_id=family.family_id)
    pair = Pair(digest("access 2"), digest("refresh 2"), ["read"], now, now + timedelta(hours=1),
                now + timedelta(minutes=10))
    await store.rotate_family(family.family_id, family.refresh_hash, pair, now)
    # Every hash as 0.9.0 writes it: 64 hex characters, key and fields.
    assert raw(primary, "codes")[0]["_id"] == code.code_hash and raw(primary, "codes")[0]["family_id"] == \
        family.family_id
    stored = raw(primary, "families")[0]
    assert (stored["_id"], stored["refresh_hash"], stored["access_hash"], stored["previous_hash"]) == (
        family.family_id, pair.refresh_hash, pair.access_hash, family.refresh_hash)
    assert raw(primary, "sessions")[0]["_id"] == session.session_hash
    assert all("_moving" not in doc for name in ("codes", "families", "sessions") for doc in raw(primary, name))
    await store.close()


async def test_several_processes_opening_one_store_agree_on_its_format(primary):
    written_by_0_9_0(primary)
    stores = await asyncio.gather(*(opened(primary) for _ in range(4)))
    assert {(store.format.format, store.format.compatibility) for store in stores} == {(3, 1)}
    assert primary.db[DB]["meta"].count_documents({}) == 1
    for store in stores:
        await store.close()


async def test_a_store_of_a_newer_format_is_refused_in_one_line(primary):
    await (await opened(primary)).close()
    primary.db[DB]["meta"].update_one({"_id": "format"}, {"$set": {"format": 4, "compatibility": 4}})
    primary.forget()
    store = make_store(wire_settings(primary))
    with pytest.raises(StoreFault) as refused:
        await store.open()
    assert str(refused.value) == (f"the store holds format 4 (its compatibility version), which tokensvc {__version__} "
                                  "cannot read (it reads formats 1 to 3): run a later release, one that reads format 4")
    assert primary.sent("createIndexes") == []  # nothing touched
    await store.close()


async def test_a_newer_release_expanded_but_not_finalized_still_serves_this_one(primary):
    written_by_0_9_0(primary)
    await (await opened(primary)).close()
    primary.db[DB]["meta"].update_one({"_id": "format"}, {"$set": {"format": 4}})  # 0.12 opened it: a rollback
    store = await opened(primary)
    assert (store.format.format, store.format.compatibility) == (4, 1)  # never lowered
    await store.close()


async def test_a_release_that_no_longer_reads_the_stores_format_says_what_to_finish_first(primary):
    written_by_0_9_0(primary)
    await (await opened(primary)).close()
    later = History(FORMATS, oldest=2, release="0.12.0")  # a release that dropped format 1's read path
    store = make_store(wire_settings(primary))
    store.history = later
    with pytest.raises(StoreFault, match=r"still holds rows of format 1, which tokensvc 0\.12\.0 no longer reads: "
                                         r"finish that upgrade first with tokensvc 0\.10\.0"):
        await store.open()
    await store.close()


# -- either format -----------------------------------------------------------------------------


async def test_every_operation_keyed_by_a_hash_finds_it_in_either_format(primary):
    """Rows written in format 1 (before finalize) are found and acted on by a process writing
    format 2 (after it), each operation through its own path."""
    written_by_0_9_0(primary)
    old = await opened(primary)
    code, family, session = await write_credentials(old)
    primary.db[DB]["grants"].insert_one({"_id": "g1", "client_id": "webapp", "user_id": "u_alice",
                                         "installation_id": None, "scopes": ["read"], "created_at": utcnow(),
                                         "revoked_at": None, "generation": 0})
    new = await opened(primary)
    new.format = replace(new.format, compatibility=2)  # as after finalize
    now = utcnow()
    assert (await new.get_code(code.code_hash)).code_hash == code.code_hash
    assert (await new.consume_code(code.code_hash, now, family_id=family.family_id)).consumed_at is None
    found, grant = await new.get_family(family.family_id)
    assert found.refresh_hash == family.refresh_hash and grant.grant_id == "g1"
    assert (await new.find_access(family.access_hash))[0].family_id == family.family_id
    await new.mark_access_used(family.family_id, family.access_hash, now)
    assert (await new.get_family(family.family_id))[0].access_used_at is not None
    pair = Pair(digest("access 2"), digest("refresh 2"), ["read"], now, now + timedelta(hours=1),
                now + timedelta(minutes=10))
    rotated = await new.rotate_family(family.family_id, family.refresh_hash, pair, now)
    assert rotated.refresh_hash == pair.refresh_hash and rotated.previous_hash == family.refresh_hash
    stored = raw(primary, "families")[0]
    assert stored["_id"] == family.family_id and stored["refresh_hash"] == bytes.fromhex(pair.refresh_hash)
    assert (await new.find_access(pair.access_hash))[0].family_id == family.family_id  # its packed access hash
    again = Pair(digest("access 3"), digest("refresh 3"), ["read"], now, now + timedelta(hours=1),
                 now + timedelta(minutes=10))
    await new.db["families"].update_one({"_id": family.family_id}, {"$set": {"access_used_at": None}})
    assert (await new.reissue_pair(family.family_id, pair.refresh_hash, again)).access_hash == again.access_hash
    assert [f.family_id for f in await new.list_families("g1")] == [family.family_id]
    assert await new.revoke_access(family.family_id, again.access_hash, now)
    assert await new.revoke_family(family.family_id, now)
    assert (await new.get_session(session.session_hash)).user_id == "u_alice"
    await new.touch_session(session.session_hash, now)
    assert [s.last_seen_at for s in await new.list_user_sessions("u_alice", now)] == [now]
    assert await new.end_session(session.session_hash, now)
    assert await new.get_session(session.session_hash) is None
    for store in (old, new):
        await store.close()


async def test_nothing_is_written_before_the_stores_format_is_read(primary):
    """A serving process answers requests while its store opens (an election, a slow server):
    until open has read the format it writes no hash (503), and then writes what the format
    says. A command line's store reads the format at its first write."""
    written_by_0_9_0(primary)
    await (await opened(primary)).close()
    code, family, session = credentials(utcnow())
    serving = make_store(wire_settings(primary), serving=True)
    for write in (lambda: serving.add_code(code), lambda: serving.create_family(family),
                  lambda: serving.add_session(session)):
        with pytest.raises(StorageError, match="start-up has not read the store's format yet"):
            await write()
    assert [raw(primary, name) for name in ("codes", "families", "sessions")] == [[], [], []]
    await serving.open()
    await serving.add_session(session)
    command_line = make_store(wire_settings(primary))
    await command_line.add_code(code)
    assert [raw(primary, name)[0]["_id"] for name in ("codes", "sessions")] == [code.code_hash, session.session_hash]
    for store in (serving, command_line):
        await store.close()


async def test_a_running_process_stops_serving_on_a_format_it_cannot_write(primary, caplog):
    """A heartbeat that finds the compatibility version raised past this release (a later
    release finalized): the same line as a refused start, not ready, nothing written, and the
    entry never says it writes that format."""
    store = await opened(primary, serving=True)
    primary.db[DB]["meta"].update_one({"_id": "format"}, {"$set": {"format": 4, "compatibility": 4}})
    with pytest.raises(StoreFault) as refused:
        await store.heartbeat()
    assert str(refused.value) == (f"the store holds format 4 (its compatibility version), which tokensvc {__version__} "
                                  "cannot read (it reads formats 1 to 3): run a later release, one that reads format 4")
    assert store.prepared is False
    with pytest.raises(StorageError, match="no longer serves from the store: the store holds format 4"):
        await store.add_session(credentials(utcnow())[2])
    assert raw(primary, "sessions") == [] and primary.db[DB]["processes"].find_one()["writes"] == 3
    store.registration.heartbeat_seconds = 0.05
    with pytest.raises(StoreFault):  # the heartbeat's loop ends with it: the process stops
        await asyncio.wait_for(store.registration.run(store.connection, store.heartbeat), 5)
    await store.close()


async def test_a_family_written_before_finalize_is_not_written_again_in_the_other_format(primary):
    """The retry of an exchange whose family was written in format 1: no second family in format 2."""
    written_by_0_9_0(primary)
    old = await opened(primary)
    _, family, _ = await write_credentials(old)
    old.format = replace(old.format, compatibility=2)
    assert not await old.create_family(family)
    assert primary.db[DB]["families"].count_documents({}) == 1
    await old.close()


async def test_a_field_a_later_release_added_survives_this_ones_writes(primary):
    """What 0.9.0 did not do (it replaced whole documents): a rollout of a release that adds a
    field keeps it whichever release writes the record meanwhile."""
    store = await opened(primary)
    for collection, key in (("clients", "webapp"), ("users", "u_alice"), ("installations", "scope")):
        primary.db[DB][collection].insert_one({"_id": key, "added_later": "kept"})
    await store.put_client(Client("webapp", "Web", ["https://a/cb"]))
    await store.put_user(User("u_alice", "alice", "scrypt$x"))
    await store.put_installation(Installation("scope", "Scope", "telescope"))
    for collection in ("clients", "users", "installations"):
        assert primary.db[DB][collection].find_one()["added_later"] == "kept"
    assert (await store.get_client("webapp")).name == "Web" and (await store.get_user("u_alice")).username == "alice"
    await store.close()


# -- processes and connections -----------------------------------------------------------------


async def test_a_serving_process_is_registered_and_follows_a_raised_compatibility_version(primary, caplog):
    written_by_0_9_0(primary)
    store = await opened(primary, serving=True)
    [seen] = await processes.running(store.connection)
    assert (seen.release, seen.reads, seen.writes) == (__version__, 3, 1)
    primary.db[DB]["meta"].update_one({"_id": "format"}, {"$set": {"compatibility": 2}})
    with caplog.at_level(logging.INFO, "tokensvc.storage.mongo.processes"):
        await store.heartbeat()
    assert store.format.compatibility == 2 and (await store.writing())(digest("x")) == bytes.fromhex(digest("x"))
    assert "the store's compatibility version is now 2 (was 1): writing format 2" in caplog.text
    assert (await processes.running(store.connection))[0].writes == 2
    await store.close()
    assert primary.db[DB]["processes"].find_one()["stopped_at"] is not None
    watcher = await opened(primary)
    assert await processes.running(watcher.connection) == []  # stopped
    await watcher.close()


async def test_a_process_that_stopped_beating_counts_as_running_for_three_heartbeats(primary):
    store = await opened(primary)
    now = utcnow()
    for name, ago in (("recent", 25), ("gone", 35)):
        primary.db[DB]["processes"].insert_one({"_id": name, "release": "0.10.0", "reads": 2, "writes": 2,
                                                "heartbeat_seconds": 10, "host": name, "pid": 1,
                                                "seen_at": now - timedelta(seconds=ago), "stopped_at": None})
    assert [seen.where for seen in await processes.running(store.connection)] == ["recent:1"]
    await store.close()


class Serving:
    """A client as a serving process holds one: its ``appName`` (0.9.0's names no release), and
    the change stream its revocation relay keeps open on the database it serves (0.9.0's asks
    for more every second at most, as here)."""

    def __init__(self, primary: ReplicaSet, database: str = DB, app: str = "tokensvc") -> None:
        self.client = AsyncMongoClient(primary.uri(), appname=app)
        self.database = database
        self.task: asyncio.Task | None = None

    async def start(self) -> Serving:
        stream = await self.client[self.database].watch(max_await_time_ms=1000)
        opened = asyncio.Event()

        async def follow() -> None:
            async with stream:
                opened.set()
                while True:
                    await stream.try_next()

        self.task = asyncio.create_task(follow())
        await opened.wait()
        return self

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.client.close()


async def test_only_connections_that_concern_this_store_count(primary, caplog):
    """A connection counts when the server lists it executing an operation in this store's
    database (a serving process's change stream): a 0.9.0 process serving another database of
    the server is none of this store's concern, and the asking store's own connections are
    never listed."""
    store = await opened(primary)
    elsewhere = await Serving(primary, "third").start()  # 0.9.0 serving another database
    current_elsewhere = await Serving(primary, "third", f"tokensvc/{__version__}").start()
    assert await processes.connected(store.connection) == []
    here = await Serving(primary).start()  # 0.9.0 serving this store
    current = await Serving(primary, app=f"tokensvc/{__version__}").start()
    # A look sees a connection while it executes; a serving process's stream is idle for an
    # instant between two requests, which a busy machine may stretch: look until each is seen.
    found: list = []

    async def seen(expected) -> bool:
        found[:] = await processes.connected(store.connection)
        return expected(found)

    await eventually(lambda: seen(lambda found: sorted((seen.release or "", seen.reads) for seen in found)
                                  == [("", 1), (__version__, 3)]), what="both processes of this store seen")
    assert all(seen.where.startswith("127.0.0.1:") for seen in found)
    await here.close()
    await eventually(lambda: seen(lambda found: [seen.release for seen in found] == [__version__]),
                     what="the closed process gone")
    for serving in (current, elsewhere, current_elsewhere):
        await serving.close()
    primary.current_op = False
    assert await processes.connected(store.connection) is None
    # Its code, not its answer: that carries the cluster time's signature.
    assert "$currentOp: error 13 Unauthorized" in caplog.text and "signature" not in caplog.text
    await store.close()


async def test_a_0_9_0_process_caught_between_two_requests_of_its_stream_is_found_at_the_next_look(primary,
                                                                                                   monkeypatch):
    """Between an answer of its change stream and its next request a 0.9.0 process of this
    store executes nothing: while the server lists a 0.9.0 connection no operation places, the
    check looks again (here the first look finds its stream idle)."""
    store = await opened(primary)
    here = await Serving(primary).start()
    looks = 0
    real = processes._operations

    async def first_between_requests(store, quiet):
        nonlocal looks
        looks += 1
        operations = await real(store, quiet)
        if looks == 1:  # as the server lists it in that instant: idle, no database
            return [{**op, "active": False, "ns": None} if op.get("appName") == "tokensvc" else op
                    for op in operations]
        return operations

    monkeypatch.setattr(processes, "_operations", first_between_requests)
    assert [seen.release for seen in await processes.connected(store.connection)] == [None]
    assert looks == 2  # and no more: found
    await here.close()
    await store.close()


async def test_through_mongos_the_connections_are_not_known():
    """A router lists the operations running on the shards, not the clients idle behind it:
    no answer, rather than an incomplete one that would say no 0.9.0 process runs."""
    class Router:
        def __getitem__(self, name):
            return None

        async def command(self, name):
            return {"ok": 1, "msg": "isdbgrid"}

    class Client:
        admin = None  # never asked

        def get_database(self, name, **options):
            return Router()

    assert await processes.connected(MongoStore(Client(), DB).connection) is None
    # Nor on a standalone server: 0.9.0 has no change stream to keep open there (it polls now
    # and then), so no look at the operations finds it for certain.
    Router.command = lambda self, name: asyncio.sleep(0, {"ok": 1, "isWritablePrimary": True})
    assert await processes.connected(MongoStore(Client(), DB).connection) is None


# -- finalize and migrate ----------------------------------------------------------------------


async def test_finalize_is_refused_for_each_thing_that_may_still_need_the_old_format(primary):
    written_by_0_9_0(primary)
    store = await opened(primary)
    elsewhere = await Serving(primary, "third").start()  # none of this store's concern
    assert (await upgrade.status(store)).blockers == []
    old = await Serving(primary).start()
    now = utcnow()
    primary.db[DB]["processes"].insert_one({"_id": "x", "release": "0.9.5", "reads": 1, "writes": 1,
                                            "heartbeat_seconds": 10, "host": "db9", "pid": 7, "seen_at": now,
                                            "stopped_at": None})
    with pytest.raises(upgrade.Refused) as refused:
        await upgrade.finalize(store)
    message = str(refused.value)
    assert "tokensvc 0.9.5 is running at db9:7 (it reads formats up to 1)" in message
    assert "tokensvc 0.9.0 or earlier is connected from 127.0.0.1:" in message
    assert meta(primary)["compatibility"] == 1
    assert message.count("0.9.0 or earlier is connected") == 1  # not the one serving database third
    await old.close()
    await elsewhere.close()
    primary.db[DB]["processes"].delete_many({})
    primary.current_op = False  # a server that does not say who is connected: the operator's word
    with pytest.raises(upgrade.Refused, match="--previous-release-stopped"):
        await upgrade.finalize(store)
    assert (await upgrade.finalize(store, assume_stopped=True))[0] == 1
    assert meta(primary)["compatibility"] == 3
    await store.close()


async def test_finalize_is_refused_before_this_release_has_opened_the_store(primary):
    written_by_0_9_0(primary)
    await (await opened(primary)).close()
    primary.db[DB]["meta"].update_one({"_id": "format"}, {"$set": {"format": 1}})
    store = make_store(wire_settings(primary))  # a command line's: never opened
    with pytest.raises(upgrade.Refused, match="no process of tokensvc .* has opened the store yet"):
        await upgrade.finalize(store)
    await store.close()


async def test_finalize_is_refused_while_a_migration_the_current_version_allows_is_unfinished(primary):
    """A backfill every running release reads (runs from the previous format) must be done
    before the compatibility version moves on."""
    written_by_0_9_0(primary)
    backfill = Migration("packed-hashes", runs_from=1, summary="a migration the current version allows")
    history = History((FORMATS[0], replace(FORMATS[1], migrations=(backfill,))), oldest=1, release=__version__)
    store = await opened(primary, history=history)
    with pytest.raises(upgrade.Refused, match="migration packed-hashes is unfinished: run tokensvc storage migrate"):
        await upgrade.finalize(store)
    assert await upgrade.migrate(store) == {"packed-hashes": 0}
    assert (await upgrade.finalize(store))[0] == 1
    await store.close()


async def test_finalize_converts_every_row_and_every_credential_reads_the_same(primary):
    written_by_0_9_0(primary)
    store = await opened(primary)
    code, family, session = await write_credentials(store)
    before = (await store.get_code(code.code_hash), await store.get_family(family.family_id),
              await store.get_session(session.session_hash))
    assert await upgrade.migrate(store) == {}  # nothing before finalize: the conversion is its
    lines: list[tuple[str, str, int]] = []
    assert await upgrade.finalize(store, progress=lambda *line: lines.append(line)) == (1, {"packed-hashes": 3})
    assert lines and lines[-1][0] == "packed-hashes" and lines[-1][2] == 3
    for collection in ("codes", "families", "sessions"):
        assert all(isinstance(doc["_id"], bytes) and "_moving" not in doc for doc in raw(primary, collection))
    assert (await store.get_code(code.code_hash), await store.get_family(family.family_id),
            await store.get_session(session.session_hash)) == before
    document = meta(primary)
    assert document["compatibility"] == 3 and document["migrations"]["packed-hashes"]["rows"] == 3
    assert document["progress"] == {}
    assert [entry["compatibility"] for entry in document["finalized"]] == [3]
    assert await upgrade.finalize(store) == (3, {})  # once
    await store.close()


async def serving_on_a_0_9_0_store(primary: ReplicaSet) -> MongoStore:
    """A serving process of this release (a heartbeat a second) on a store 0.9.0 wrote, with a
    code, a family and a session written before finalize."""
    written_by_0_9_0(primary)
    server = await opened(primary, serving=True)
    server.registration.heartbeat_seconds = 1
    await write_credentials(server)
    return server


async def test_finalize_waits_for_every_process_to_write_the_new_format_before_converting(primary):
    server = await serving_on_a_0_9_0_store(primary)
    beating = asyncio.create_task(server.registration.run(server.connection, server.heartbeat))
    store = await opened(primary)
    await upgrade.finalize(store)
    assert server.format.compatibility == 3  # it followed, then the rows were converted
    assert primary.db[DB]["families"].count_documents({"_id": {"$type": "string"}}) == 0
    beating.cancel()
    await server.close()
    await store.close()


async def test_the_service_migrates_in_the_background_once_finalized(primary):
    server = await serving_on_a_0_9_0_store(primary)
    upkeep = asyncio.create_task(server.upkeep())
    primary.db[DB]["meta"].update_one({"_id": "format"}, {"$set": {"compatibility": 2}})  # an interrupted finalize
    # Done, then the lease given back (a moment after: wait for both).
    await eventually(lambda: "packed-hashes" in meta(primary)["migrations"] and meta(primary)["lease"] is None,
                     what="the migration done in the background and its lease given back")
    assert primary.db[DB]["families"].count_documents({"_id": {"$type": "string"}}) == 0
    upkeep.cancel()
    await server.close()


async def test_a_migrations_copies_of_a_revoked_family_and_an_ended_session_announce_nothing(primary):
    """The move to format 2 inserts a copy of each family and session (hashes.finish), the
    revoked and ended ones with their marks: the change stream hears those inserts and
    announces none of them (nothing is revoked by a move); the next revocation is the first
    thing heard."""
    from helpers import DEADLINE

    from tokensvc.storage.base import SESSION, Revocation

    server = await serving_on_a_0_9_0_store(primary)
    _, family, session = credentials(utcnow())
    assert await server.revoke_family(family.family_id, utcnow()) and await server.end_session(session.session_hash,
                                                                                                utcnow())
    feed = server.revocation_feed()
    heard = asyncio.ensure_future(feed.__anext__())
    await eventually(lambda: server.feed.resume_token is not None, what="the change stream open")
    upkeep = asyncio.create_task(server.upkeep())
    primary.db[DB]["meta"].update_one({"_id": "format"}, {"$set": {"compatibility": 2}})
    await eventually(lambda: "packed-hashes" in meta(primary)["migrations"], what="the migration done")
    copies = {event["ns"]["coll"] for event in primary.streams.events if event["operationType"] == "insert"}
    assert {"families", "sessions"} <= copies
    await server.add_session(Session(digest("later"), "u_alice", utcnow(), utcnow() + timedelta(hours=1)))
    assert await server.end_session(digest("later"), utcnow())
    assert await asyncio.wait_for(heard, DEADLINE) == Revocation(SESSION, digest("later"))
    upkeep.cancel()
    await feed.aclose()
    await server.close()


async def test_finalize_waits_for_no_process_whose_heartbeat_lapsed_and_says_when_it_raised_already(primary,
                                                                                                   monkeypatch):
    server = await serving_on_a_0_9_0_store(primary)  # registered, writing format 1, its heartbeat not running
    primary.db[DB]["processes"].update_one({}, {"$set": {"heartbeat_seconds": 1, "seen_at": utcnow()}})
    monkeypatch.setattr(upgrade, "_wait_seconds", lambda running: 0.5)
    store = await opened(primary)
    with pytest.raises(upgrade.Refused) as refused:  # it never follows: the raise is done, the conversion waits
        await upgrade.finalize(store)
    assert str(refused.value).startswith(
        "finalized: the compatibility version is raised from 1 to 3 (irreversible: tokensvc storage finalize need "
        f"not run again); but migration packed-hashes waits: these processes do not write format 2 yet: "
        f"{__version__} at ")
    assert meta(primary)["compatibility"] == 3
    # Two heartbeats without a word (killed -9, cut off): no longer waited for, though counted as running.
    primary.db[DB]["processes"].update_one({}, {"$set": {"seen_at": utcnow() - timedelta(seconds=2.5)}})
    assert len(await processes.running(store.connection)) == 1
    assert await upgrade.migrate(store) == {"packed-hashes": 3}
    await server.close()
    await store.close()


class Heard(StoreObserver):
    def __init__(self) -> None:
        self.connections: list[int] = []
        self.rows: list[int] = []

    def old_release_connections(self, count: int) -> None:
        self.connections.append(count)

    def old_format_rows(self, count: int) -> None:
        self.rows.append(count)


async def test_a_release_that_cannot_read_the_store_is_reported_and_what_it_writes_converted(primary, caplog):
    """0.9.0 started after finalize anyway (here on a store this release made, format 2): every
    process warns and says so in its metrics, the rows it writes are converted though the
    migration is done, and tokensvc storage status warns."""
    server = await opened(primary, serving=True)
    server.observer = heard = Heard()
    elsewhere = await Serving(primary, "third").start()  # 0.9.0 serving another database: no concern
    operator = make_store(wire_settings(primary))  # a command line's
    assert (await upgrade.status(operator)).warnings == []
    with caplog.at_level(logging.WARNING):
        await migrations.watch(server)
    assert heard.connections == [0] and "is connected from" not in caplog.text
    heard.connections.clear()
    old = await Serving(primary).start()  # 0.9.0 serving this store
    code, family, session = credentials(utcnow())  # as 0.9.0 writes them
    for collection, document in (("codes", {"_id": code.code_hash, "family_id": None}),
                                 ("sessions", {"_id": session.session_hash, "user_id": "u_alice"}),
                                 ("families", {"_id": family.family_id, "refresh_hash": family.refresh_hash,
                                               "access_hash": family.access_hash, "grant_id": "g1"})):
        primary.db[DB][collection].insert_one(document)
    primary.db[DB]["failures"].drop_index(TRIPWIRE)  # as 0.9.0's line advises; then its start makes its own
    primary.db[DB]["failures"].create_index([("expires_at", 1)], expireAfterSeconds=0, name="ttl")
    found = await upgrade.status(operator)
    await operator.close()
    # Among the releases seen: 0.9.0, known by its connection (it records nothing in the store).
    assert [(seen.name, seen.how) for seen in found.seen] == [("0.9.0 or earlier", ["connected"]),
                                                             (__version__, ["opened the store", "running"])]
    assert any(warning.startswith("tokensvc 0.9.0 or earlier is connected from 127.0.0.1:") and
               "cannot read this store (compatibility 3; it reads formats up to 1): stop it" in warning
               for warning in found.warnings), found.warnings
    assert "3 rows of an older format were written after migration packed-hashes was done" in " ".join(found.warnings)
    with caplog.at_level(logging.WARNING):
        background = asyncio.create_task(migrations.in_background(server, "me", 0.05))
        deadline = asyncio.get_running_loop().time() + 10
        while not heard.connections or any(primary.db[DB][name].count_documents({"_id": {"$type": "string"}})
                                           for name in ("codes", "sessions", "families")):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        background.cancel()
    assert heard.rows[0] == 3 and heard.connections[0] >= 1
    assert "3 rows of an older format were written after migration packed-hashes was done" in caplog.text
    assert "tokensvc 0.9.0 or earlier is connected from 127.0.0.1:" in caplog.text
    assert meta(primary)["migrations"]["packed-hashes"]["rows"] == 3
    assert "index failures.ttl was made again since finalize" in caplog.text  # and the tripwire made again
    assert sorted(primary.db[DB]["failures"].index_information()) == ["_id_", TRIPWIRE]
    await old.close()
    await elsewhere.close()
    await server.close()


# -- indexes -----------------------------------------------------------------------------------


RETIRING = History((*FORMATS, Format(4, "0.12.0", "users by email", retired_indexes=(("users", "username"),))),
                   oldest=1, release="0.12.0")


async def test_an_index_is_dropped_only_once_no_release_allowed_to_run_needs_it(primary):
    written_by_0_9_0(primary)
    store = await opened(primary, history=RETIRING)  # 0.12.0 expands: 0.11.0 still uses users.username
    assert "username" in primary.db[DB]["users"].index_information()
    primary.db[DB]["meta"].update_one({"_id": "format"}, {"$set": {"compatibility": 4}})  # finalized
    await store.close()
    store = await opened(primary, history=RETIRING)
    assert "username" not in primary.db[DB]["users"].index_information()
    await store.close()


async def test_finalize_leaves_0_9_0_an_index_it_cannot_make_alongside(primary):
    """The tripwire: after finalize the failure counts' TTL index has another name, and the
    server refuses 0.9.0's request for it under its own (IndexOptionsConflict, 85: what stops
    0.9.0's start-up); this release's processes, whichever version they read, take it as theirs."""
    from pymongo.errors import OperationFailure

    written_by_0_9_0(primary)
    store = await opened(primary)
    # A process starting as finalize runs: it reads compatibility 1, and asks for "ttl" after the rename.
    late = Fault("createIndexes", "delay", seconds=1.5,
                 when=lambda doc: (doc["createIndexes"], doc["indexes"][0]["name"]) == ("failures", "ttl"))
    primary.script(late)
    laggard = make_store(wire_settings(primary))
    opening = asyncio.create_task(laggard.open())
    while not late.hits:
        await asyncio.sleep(0.01)
    await upgrade.finalize(store)
    await opening  # its request met the renamed index: its own, under the other name
    failures = primary.db[DB]["failures"].index_information()
    assert "ttl" not in failures and failures[TRIPWIRE]["key"] == [("expires_at", 1)]
    as_0_9_0 = AsyncMongoClient(primary.uri(), appname="tokensvc")
    with pytest.raises(OperationFailure) as refused:  # what 0.9.0's open() asks, word for word
        await as_0_9_0["tokensvc"]["failures"].create_index([("expires_at", 1)], expireAfterSeconds=0, name="ttl")
    assert refused.value.code == 85
    await as_0_9_0.close()
    await (await opened(primary)).close()  # a process that starts now
    assert sorted(primary.db[DB]["failures"].index_information()) == ["_id_", TRIPWIRE]
    for opener in (laggard, store):
        await opener.close()


async def starts_as_0_9_0(primary: ReplicaSet) -> bool:
    """What 0.9.0's start-up asks before it serves, word for word: whether it gets its failure
    counts' TTL index (True: it goes on to serve), or the server refuses it beside the tripwire
    (IndexOptionsConflict, 85: it stops)."""
    from pymongo.errors import OperationFailure

    client = AsyncMongoClient(primary.uri(), appname="tokensvc")
    try:
        await client[DB]["failures"].create_index([("expires_at", 1)], expireAfterSeconds=0, name="ttl")
        return True
    except OperationFailure as exc:
        assert exc.code == 85
        return False
    finally:
        await client.close()


def raising(doc: dict) -> bool:
    """The raise of the compatibility version (finalize's update of the format document)."""
    return doc.get("update") == "meta" and "compatibility" in str(doc.get("updates", [{}])[0].get("u", {}))


async def test_a_0_9_0_process_started_while_finalize_raises_the_version_stops_at_start_up(primary):
    """The tripwire is placed before the raise: with the raise held, a 0.9.0 process that
    starts meanwhile is refused its index, and stops; then the raise goes on."""
    written_by_0_9_0(primary)
    store = await opened(primary)
    store.budget = 30.0  # the raise is held here longer than a budget
    held = Fault("update", "hold", collection="meta", when=raising)
    primary.script(held)
    finalizing = asyncio.ensure_future(upgrade.finalize(store))
    await eventually(lambda: held.hits, what="the raise, held")
    assert meta(primary)["compatibility"] == 1
    assert not await starts_as_0_9_0(primary)
    primary.release(held)
    assert (await finalizing)[0] == 1
    assert meta(primary)["compatibility"] == 3
    assert sorted(primary.db[DB]["failures"].index_information()) == ["_id_", TRIPWIRE]
    await store.close()


async def test_a_0_9_0_process_started_before_the_tripwire_is_seen_and_the_tripwire_taken_back(primary):
    """A 0.9.0 process that got its index just before the tripwire (here, while the tripwire's
    own request is held) runs: the look that follows the tripwire sees it, finalize is refused,
    and the store is left as it was (its index under its old name: 0.9.0 may start again)."""
    written_by_0_9_0(primary)
    store = await opened(primary)
    store.build_budget = 30.0
    held = Fault("createIndexes", "hold", collection="failures",
                 when=lambda doc: doc["indexes"][0]["name"] == TRIPWIRE)
    primary.script(held)
    finalizing = asyncio.ensure_future(upgrade.finalize(store))
    await eventually(lambda: held.hits, what="the tripwire's request, held")
    assert await starts_as_0_9_0(primary)  # "ttl" is dropped: it makes it again, and serves
    old = await Serving(primary).start()
    primary.release(held)
    with pytest.raises(upgrade.Refused, match="not finalized: tokensvc 0.9.0 or earlier is connected from 127.0.0.1:"):
        await finalizing
    assert meta(primary)["compatibility"] == 1
    assert sorted(primary.db[DB]["failures"].index_information()) == ["_id_", "ttl"]
    assert await starts_as_0_9_0(primary)
    await old.close()
    await store.close()


async def test_a_0_9_0_process_seen_only_after_the_raise_is_named_by_finalize(primary):
    """One that got past its index before the tripwire but was not yet listed at the look
    before the raise (still starting: its change stream not open) is seen by the look after
    it; the raise stands, and the command says to stop it."""
    written_by_0_9_0(primary)
    store = await opened(primary)
    store.budget = 30.0
    held = Fault("update", "hold", collection="meta", when=raising)
    primary.script(held)
    finalizing = asyncio.ensure_future(upgrade.finalize(store))
    await eventually(lambda: held.hits, what="the raise, held")
    old = await Serving(primary).start()  # its stream open only now
    primary.release(held)
    with pytest.raises(upgrade.Refused) as refused:
        await finalizing
    assert str(refused.value).startswith("finalized: the compatibility version is raised from 1 to 3")
    assert "tokensvc 0.9.0 or earlier is connected from 127.0.0.1:" in str(refused.value)
    assert str(refused.value).endswith("stop it, then run tokensvc storage migrate (the running processes convert "
                                       "what it writes)")
    assert meta(primary)["compatibility"] == 3
    await old.close()
    await store.close()


async def test_processes_dropping_one_index_together_all_succeed(primary):
    primary.db[DB]["families"].create_index([("grant_id", 1)], name="grant_id")
    # Each drop waits, so that every process has seen the index before any drops it.
    primary.script(Fault("dropIndexes", "delay", seconds=0.3, times=4))
    stores = await asyncio.gather(*(opened(primary) for _ in range(4)))
    assert len(primary.sent("dropIndexes")) == 4
    assert "grant_id" not in primary.db[DB]["families"].index_information()
    for store in stores:
        await store.close()
