"""The MongoDB store (:class:`MongoStore`): the Store contract's operations, start-up (the
indexes, the store's format) and the process's upkeep. The package's docstring describes its
collections, queries and indexes."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pymongo
from pymongo import ASCENDING, DESCENDING, IndexModel, ReadPreference, ReturnDocument, WriteConcern
from pymongo.errors import DuplicateKeyError, OperationFailure, PyMongoError
from pymongo.read_concern import ReadConcern

from tokensvc import __version__
from tokensvc.config import StorageSettings
from tokensvc.identifiers import username_key
from tokensvc.records import (
    AuthorizationCode,
    Client,
    Family,
    Grant,
    Installation,
    Pair,
    PreviousSecret,
    Removal,
    Session,
    Subject,
    User,
    utcnow,
)
from tokensvc.storage.base import (
    CODE_RETENTION_SECONDS,
    MAX_LISTED_SESSIONS,
    Conflict,
    FailureCounts,
    StorageError,
    Store,
    StoreFault,
    StoreObserver,
)
from tokensvc.storage.mongo import calls, hashes, processes, topology
from tokensvc.storage.mongo import format as store_format
from tokensvc.storage.mongo.calls import Calls
from tokensvc.storage.mongo.causal import CausalClock, _SessionedDatabase
from tokensvc.storage.mongo.feed import STREAM_WAIT_MS, WATCHED, RevocationFeed
from tokensvc.storage.mongo.mapping import (
    CLIENTS,
    CODES,
    FAMILIES,
    GRANTS,
    INSTALLATIONS,
    PREVIOUS_SECRETS,
    REMOVALS,
    SESSIONS,
    USERS,
    _as_is,
    _pair_fields,
    _stored,
    _utc,
)
from tokensvc.storage.mongo.retry import _RUN_AGAIN, guarded

if TYPE_CHECKING:
    from tokensvc.storage.mongo.retry import R

log = logging.getLogger(__name__)

Index = tuple[str, list[tuple[str, int]], dict[str, Any]]  # (collection, keys, options)


def _revoked_only(collection: str, field: str) -> Index:
    """An index holding only the records whose ``field`` is set (a time): the revoked ones."""
    return collection, [(field, ASCENDING)], {"name": field, "partialFilterExpression": {field: {"$type": "date"}}}


# How long a removal's mark outlives its write: every relay has long polled it by then.
REMOVED_CLIENT_SECONDS = 86400

# Usernames compared whatever their case (ICU at strength 2): for the ASCII usernames are
# (identifiers.USERNAME), the comparison of their keys (identifiers.username_key). A read under it
# is served by the index of the same collation, username_caseless.
CASELESS: dict[str, Any] = {"locale": "en", "strength": 2}

# Created at start-up, idempotently.
INDEXES: list[Index] = [
    ("users", [("username", ASCENDING)], {"unique": True, "name": "username"}),
    # A username typed in another case than stored (release 0.9.0 kept capitals), or no user's:
    # one equality on this index, where a caseless regex read the whole of the one above.
    ("users", [("username", ASCENDING)], {"name": "username_caseless", "collation": CASELESS}),
    # The previous secrets whose time is up (expire_previous_secret; not a TTL index, which
    # would delete them with no one to tell of it).
    ("previous_secrets", [("expires_at", ASCENDING)], {"name": "expires_at"}),
    ("grants", [("client_id", ASCENDING), ("user_id", ASCENDING), ("installation_id", ASCENDING)],
     {"unique": True, "name": "subject_client"}),
    ("grants", [("user_id", ASCENDING), ("installation_id", ASCENDING), ("revoked_at", ASCENDING)],
     {"name": "user_subject"}),
    ("grants", [("client_id", ASCENDING), ("revoked_at", ASCENDING), ("_id", ASCENDING)], {"name": "client_live"}),
    ("codes", [("expires_at", ASCENDING)], {"expireAfterSeconds": CODE_RETENTION_SECONDS, "name": "ttl"}),
    # A narrowed client's codes on their way (withdraw_scopes).
    ("codes", [("client_id", ASCENDING), ("consumed_at", ASCENDING)], {"name": "client_unconsumed"}),
    ("families", [("expires_at", ASCENDING)], {"expireAfterSeconds": 0, "name": "ttl"}),
    ("families", [("access_hash", ASCENDING)], {"unique": True, "name": "access_hash"}),
    # The family of an access token its last rotation replaced, presented again (a second holder).
    ("families", [("previous_access_hash", ASCENDING)], {"name": "previous_access_hash"}),
    # A grant's live families, in order (list_families), and the sweep of a revoked grant.
    ("families", [("grant_id", ASCENDING), ("revoked_at", ASCENDING), ("created_at", ASCENDING)],
     {"name": "grant_live"}),
    ("families", [("client_id", ASCENDING), ("revoked_at", ASCENDING)], {"name": "client_revoked"}),
    # One family per id while keys of both formats are written (storage/mongo/hashes.py, Twins).
    ("families", [(hashes.GUARD, ASCENDING)], {"unique": True, "sparse": True, "name": hashes.GUARD}),
    ("sessions", [("expires_at", ASCENDING)], {"expireAfterSeconds": 0, "name": "ttl"}),
    ("sessions", [("user_id", ASCENDING)], {"name": "user_id"}),
    ("failures", [("expires_at", ASCENDING)], {"expireAfterSeconds": 0, "name": "ttl"}),
    # The running processes' entries (storage/mongo/processes.py), kept a day after their last heartbeat.
    ("processes", [("seen_at", ASCENDING)], {"expireAfterSeconds": 86400, "name": "ttl"}),
    # A removal's mark (mark_removal), kept a day: long after every relay polled it.
    ("removed_clients", [("expires_at", ASCENDING)], {"expireAfterSeconds": 0, "name": "ttl"}),
    # What the polling fallback of the revocation feed reads.
    *(_revoked_only(collection, field) for collection, fields in WATCHED.items() for field in fields),
]
INDEX_CONFLICT = frozenset({85, 86})  # IndexOptionsConflict, IndexKeySpecsConflict
INDEX_NOT_FOUND = 27
UNAUTHORIZED = 13
BUILD_TIMEOUT_MS = 30 * 60 * 1000  # index builds at start-up: a new index on a large collection takes long
# How long closing the store may take, whatever the server does: within the supervisor's margin
# past the drain (supervisor.STOP_MARGIN), with room for the process to leave.
CLOSE_SECONDS = 5.0
CLOSE_MARGIN_SECONDS = 2.5  # the driver's close gives up on the server this much sooner, then closes the rest


def have_options(index: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in index.items() if key not in ("key", "v", "ns")}


async def _page(collection: Any, key: str, after: str | None, limit: int | None) -> list[dict[str, Any]]:
    """The documents ordered by ``key``: every one, or ``limit`` of them after ``after``."""
    cursor = collection.find({key: {"$gt": after}} if after is not None else {}).sort(key, ASCENDING)
    if limit is not None:
        cursor = cursor.limit(limit)
    return await cursor.to_list(None)


def _collated(index: dict[str, Any]) -> tuple[Any, Any]:
    """An index's collation as it compares (a server lists it with every default filled in)."""
    collation = index.get("collation") or {}
    return collation.get("locale", "simple"), collation.get("strength")


def _missed(result: Any) -> bool:
    """Whether a single-document write changed nothing (None, or no match)."""
    return result is None or getattr(result, "matched_count", 1) == 0


class MongoStore(RevocationFeed, Store, FailureCounts):
    def __init__(self, client: Any, database: str, *, change_streams: bool = True, timeout_ms: int = 15_000,
                 build_timeout_ms: int = BUILD_TIMEOUT_MS, causal: bool = False) -> None:
        """``client`` is a ``pymongo.AsyncMongoClient`` (or an API-compatible stand-in in tests,
        which has no change streams: ``change_streams=False`` polls instead). ``timeout_ms`` is
        every operation's budget, retries included; ``build_timeout_ms`` that of :meth:`open`,
        whose index builds may take long on a large collection.

        Whatever the URI says, every write waits for a journaled majority (an acknowledged
        code consumption, rotation or revocation survives a failover) and every read goes to
        the primary at majority read concern (a decision made on a read never rests on a
        write a failover can roll back). ``causal`` (a real client's sessions): every
        operation runs in a causally consistent session advanced by :class:`CausalClock`, so
        a read also never misses a write acknowledged before it, even just after an election.
        """
        self._client = client
        db = client.get_database(database, write_concern=WriteConcern("majority", j=True, wtimeout=timeout_ms),
                                 read_preference=ReadPreference.PRIMARY, read_concern=ReadConcern("majority"))
        # The store holds the database only through the accessor that runs every collection
        # call in the current operation's session (none without ``causal``).
        self._db = _SessionedDatabase(db)
        self.clock = CausalClock() if causal else None
        self.clients, self.users, self.installations = self._db["clients"], self._db["users"], self._db["installations"]
        # A collection of its own, which 0.9.0 never reads nor rewrites (ARCHITECTURE.md).
        self.previous_secrets = self._db["previous_secrets"]
        self.removals = self._db["removals"]  # clients being removed: 0.9.0 never reads nor writes it
        # The removals' marks, which the relays watch, kept a while after the removal is
        # finished (a poll finds them): 0.9.0 never reads nor writes it either.
        self.removed_clients = self._db["removed_clients"]
        self.grants, self.codes, self.families = self._db["grants"], self._db["codes"], self._db["families"]
        self.sessions = self._db["sessions"]
        self.failures = self._db["failures"]  # failure counts shared by the processes (ratelimit)
        self.change_streams = change_streams
        self._resume_token: Any = None
        self.budget, self.build_budget = timeout_ms / 1000, build_timeout_ms / 1000
        self.stop_budget = min(self.budget, CLOSE_SECONDS / 2)  # the stop's one write (its entry marked stopped)
        self.observer = StoreObserver()
        # The formats this release knows, and where the store stands: what is written follows
        # its compatibility version, read by open and followed by the process's heartbeat
        # (writing). Until it is read, the oldest format this release reads stands for it.
        self.history = store_format.HISTORY
        self._format: store_format.StoreFormat | None = None
        self.refusal: str | None = None  # why this process no longer serves from the store (a heartbeat's)
        # A serving process's entry among the running processes (None: a command line's store).
        self.registration: processes.Registration | None = None
        self.topology = topology.Topology()  # the deployment as the driver last saw it
        self.calls = Calls()  # the driver calls the store waits for, and those it stopped waiting for
        self.replica_set = True  # whether the server is a replica-set member (open() asks)

    @property
    def db(self) -> _SessionedDatabase:
        """The database, in the current operation's causally consistent session (the storage
        commands, the migrations and the process registry work on it directly)."""
        return self._db

    @property
    def client(self) -> Any:
        return self._client

    @property
    def format(self) -> store_format.StoreFormat:
        return self._format or store_format.StoreFormat(self.history.oldest, self.history.oldest)

    @format.setter
    def format(self, state: store_format.StoreFormat) -> None:
        self._format = state

    async def writing(self) -> Callable[[Any], Any]:
        """How a hash is written now: what every release allowed to run reads, by the store's
        compatibility version. Nothing is written before it is known: a serving process reads
        it at open, after registering (storage/mongo/processes.py), and answers 503 until then, or
        once a heartbeat found a compatibility version it cannot write (it is stopping); a
        command line's store reads it at its first write."""
        if self.refusal is not None:
            raise StorageError(f"this process no longer serves from the store: {self.refusal}")
        if self._format is None:
            if self.registration is not None:
                raise StorageError("start-up has not read the store's format yet")
            state = await store_format.read(self.db)
            if state is None:
                raise StorageError("the store has no format document yet: start tokensvc serve once")
            self._format = state
        return hashes.packed if self._format.compatibility >= hashes.PACKED_FROM else _as_is

    @classmethod
    def from_settings(cls, settings: StorageSettings, *, serving: bool = False) -> MongoStore:
        """The store ``settings`` describe; ``serving``: a ``tokensvc serve`` process, which
        registers among the running processes and keeps a heartbeat (storage/mongo/processes.py)."""
        from pymongo import AsyncMongoClient

        events = topology.DriverEvents()
        # The client connects lazily, in the background: building it never blocks or fails
        # on an absent server; the first operation does, after serverSelectionTimeoutMS.
        # Keyword options override the URI's.
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            settings.mongodb_uri,
            tz_aware=True,
            serverSelectionTimeoutMS=settings.timeout_ms,
            connectTimeoutMS=min(10_000, settings.timeout_ms),
            maxPoolSize=settings.max_pool_size,
            waitQueueTimeoutMS=settings.timeout_ms,
            # A reply that has not come a second after the budget is the driver's to give up on:
            # every call the store stops waiting for ends by itself (storage/mongo/calls.py). A
            # read's pymongo.timeout, and an index build's, say less or more.
            socketTimeoutMS=settings.timeout_ms + STREAM_WAIT_MS,
            # No timeoutMS (whatever the URI says): under it the driver retries a failing operation
            # back to back for the whole budget. The store holds each operation to its budget
            # itself, and retries with backoff (guarded).
            timeoutMS=None,
            retryWrites=True,
            retryReads=False,
            w="majority",
            journal=True,
            wTimeoutMS=settings.timeout_ms,
            readPreference="primary",
            readConcernLevel="majority",
            appname=f"tokensvc/{__version__}",  # the release, for the storage commands' check of who is connected
            event_listeners=[events],
        )
        store = cls(client, settings.database, timeout_ms=settings.timeout_ms, causal=True)
        events.store = store
        if serving:
            store.registration = processes.Registration(settings.heartbeat_seconds)
        return store

    @guarded(budget="build_budget")
    async def open(self) -> None:
        """Check that the server takes writes and that this release can read the store's format
        (:class:`StoreFault` naming the release it needs otherwise), then make every index. One
        that exists with other options is reconciled where MongoDB can change it in place (a
        TTL: ``collMod``); otherwise the others are still made and then :class:`StoreFault`
        names each conflicting index (found by its keys, whatever its name) and what to do. An
        index no release allowed to run relies on any more is dropped first, and an index a
        tripwire renamed is made under its new name (storage/mongo/format.py); then the store records
        this release's format as made."""
        await self.check_primary()
        if self.registration is not None:  # before the format is read: see storage/mongo/processes.py
            await self.registration.announce(self)
        now = utcnow()
        state = await store_format.recorded(self.db, self.history, now)
        refusal = self.history.refusal(state)
        if refusal is not None:
            raise StoreFault(refusal)
        self.format = state
        await self.drop_retired_indexes()
        retired = set(self.history.retired_indexes(state))
        conflicts = []
        for collection, keys, options in INDEXES:
            options = {**options, "name": self.history.index_name(collection, options["name"], state)}
            if (collection, options["name"]) in retired:
                continue
            try:
                await self._make_index(collection, keys, options)
            except OperationFailure as exc:
                if exc.code not in INDEX_CONFLICT:
                    raise
                conflict = await self._reconcile(collection, keys, options)
                if conflict:
                    conflicts.append(conflict)
        if conflicts:
            raise StoreFault("; ".join(conflicts))
        self.format = await store_format.expanded(self.db, self.history, now)
        self._tell_format()
        if self.registration is not None:
            await self.registration.beat(self)

    async def check_primary(self) -> None:
        hello = await self._db.command("hello")
        self.replica_set = "setName" in hello
        if not hello.get("isWritablePrimary", hello.get("ismaster")):
            # directConnection=true to a secondary would serve reads and fail every write:
            # not ready until the URI reaches a primary (start-up keeps trying, /readyz is 503).
            state = "secondary" if hello.get("secondary") else "not in a primary state"
            raise StorageError(topology.not_primary(hello.get("me", "the configured address"), state))

    async def _make_index(self, collection: str, keys: list[tuple[str, int]], options: dict[str, Any]) -> None:
        # A build waits for the members its quorum names: all voting ones by default, so one
        # member down would hold start-up; a majority builds as a majority write is acknowledged.
        quorum = {"commitQuorum": "majority"} if self.replica_set else {}
        with pymongo.timeout(self.build_budget):  # a build may take long: longer than a reply's socket timeout
            await self._db[collection].create_indexes([IndexModel(keys, **options)], **quorum)

    async def drop_retired_indexes(self) -> list[str]:
        """Drop each index an earlier release relied on that no release allowed to run on this
        store needs (by its compatibility version): never one a running release still uses, so
        releases started in any order never build and drop one by turns. One another process
        dropped first is as good as dropped. The indexes this call dropped."""
        dropped = []
        for collection, name in self.history.retired_indexes(self.format):
            if name not in await self._db[collection].index_information():
                continue
            try:
                await self._db[collection].drop_index(name)
            except OperationFailure as exc:
                if exc.code != INDEX_NOT_FOUND:
                    raise
                continue
            dropped.append(f"{collection}.{name}")
            log.info("index %s.%s dropped: no release allowed to run on this store uses it", collection, name)
        return dropped

    async def follow_indexes(self) -> list[str]:
        """The indexes the compatibility version calls for (after a finalize, and on every
        heartbeat after it): the retired ones dropped, and each one a tripwire renames made under
        its new name (so a release that predates the format document cannot start). An old name
        made again meanwhile (that release, started between the drop and the rename) is dropped
        again. The indexes dropped."""
        dropped = await self.drop_retired_indexes()
        for collection, keys, options in INDEXES:
            name = self.history.index_name(collection, options["name"], self.format)
            if name == options["name"] or name in await self._db[collection].index_information():
                continue  # nothing renamed, or made already (a heartbeat's look writes nothing)
            for _ in range(3):
                try:
                    await self._make_index(collection, keys, {**options, "name": name})
                    break
                except OperationFailure as exc:
                    if exc.code not in INDEX_CONFLICT:
                        raise
                    dropped += await self.drop_retired_indexes()
            else:
                raise StoreFault(f"index {collection}.{name} cannot be made: index {collection}.{options['name']} "
                                 "is made again each time it is dropped, by a release that cannot read this store: "
                                 "stop it")
        return dropped

    async def set_tripwires(self, after: int, upto: int, placed: bool = True) -> None:
        """Place the tripwires of a raise of the compatibility version from ``after`` to
        ``upto`` (storage/mongo/format.py): each index made under its new name, its old name dropped,
        before the raise, so that a release that cannot read the new format stops at its
        start-up from now on. ``placed=False`` takes them back (a finalize refused before its
        raise leaves the store as it found it). An old name made again between the drop and
        the make (that release, starting just then: it runs, and is seen) is dropped again."""
        for collection, old, new in self.history.tripwires(after, upto):
            keys, options = next((keys, options) for where, keys, options in INDEXES
                                 if where == collection and options["name"] == old)
            gone, made = (old, new) if placed else (new, old)
            for _ in range(3):
                try:
                    await self._db[collection].drop_index(gone)
                except OperationFailure as exc:
                    if exc.code != INDEX_NOT_FOUND:
                        raise
                try:
                    await self._make_index(collection, keys, {**options, "name": made})
                    break
                except OperationFailure as exc:
                    if exc.code not in INDEX_CONFLICT:
                        raise
            else:
                raise StoreFault(f"index {collection}.{made} cannot be made: index {collection}.{gone} is made again "
                                 "each time it is dropped, by a release that cannot read this store, started over and "
                                 "over: stop it")

    async def _reconcile(self, collection: str, keys: list[tuple[str, int]], options: dict[str, Any]) -> str | None:
        """Bring an existing index to ``options``, or say why it cannot be (None: done)."""
        name = options["name"]
        indexes = await self._db[collection].index_information()
        # The index in the way: tokensvc's name with other keys, or tokensvc's keys (under its
        # collation: the same keys under another are another index) under another name.
        in_the_way = name if name in indexes else next(
            (other for other, info in indexes.items() if list(info["key"]) == keys
             and _collated(info) == _collated(options)), None)
        if in_the_way != name and in_the_way in self.history.index_names(collection, name):
            return None  # its other name (a tripwire's): the store was finalized since its format was read
        existing = indexes.get(in_the_way) if in_the_way else None
        wanted = {key: value for key, value in options.items() if key != "name"}
        if existing is not None and in_the_way == name and list(existing["key"]) == keys:
            have = {key: existing[key] for key in ("unique", "expireAfterSeconds") if key in existing}
            if {k: v for k, v in have.items() if k != "expireAfterSeconds"} == \
                    {k: v for k, v in wanted.items() if k != "expireAfterSeconds"} and "expireAfterSeconds" in wanted:
                try:
                    await self._db.command({"collMod": collection, "index": {
                        "name": name, "expireAfterSeconds": wanted["expireAfterSeconds"]}})
                except OperationFailure as exc:
                    if exc.code != UNAUTHORIZED:
                        raise
                    return (f"index {collection}.{name} needs expireAfterSeconds {wanted['expireAfterSeconds']} "
                            f"(it has {existing.get('expireAfterSeconds')}), and changing it needs collMod, which "
                            "the role readWrite lacks: grant dbAdmin on the database once, or run "
                            f"db.runCommand({{collMod: '{collection}', index: {{name: '{name}', expireAfterSeconds: "
                            f"{wanted['expireAfterSeconds']}}}}})")
                log.info("index %s.%s: expireAfterSeconds %s -> %s", collection, name,
                         existing.get("expireAfterSeconds"), wanted["expireAfterSeconds"])
                return None
        if existing is None:
            found = "another index on these keys"
            in_the_way = name
        else:
            found = f"{existing['key']} {have_options(existing)}"
        where = f"index {collection}.{in_the_way}" + (f" (tokensvc's {name})" if in_the_way != name else "")
        return (f"{where} exists with other options ({found}; tokensvc needs {keys} {wanted}): "
                f"drop it (db.{collection}.dropIndex('{in_the_way}')) and start tokensvc again, which makes it anew")

    @guarded()
    async def heartbeat(self) -> None:
        """Follow the store's format and renew this process's entry (storage/mongo/processes.py)."""
        if self.registration is not None:
            await self.registration.beat(self)
            self._tell_format()

    def _tell_format(self) -> None:
        state = self.format
        self.observer.format_seen(state.format, state.compatibility, {
            migration.name: (int((state.migrations.get(migration.name) or state.progress.get(migration.name)
                                  or {}).get("rows", 0)), state.done(migration.name))
            for migration in self.history.migrations})

    async def upkeep(self) -> None:
        """While the service runs: the heartbeat, and the migrations the compatibility version
        allows, in the background (storage/mongo/migrations.py); nothing for a command line's store."""
        if self.registration is None:
            return
        from tokensvc.storage.mongo import migrations

        work = [asyncio.ensure_future(self.registration.run(self)), asyncio.ensure_future(
            migrations.in_background(self, self.registration.id, self.registration.heartbeat_seconds))]
        try:
            await asyncio.gather(*work)
        finally:  # the heartbeat stopped (the store's format refuses this release): so does the rest
            for task in work:
                task.cancel()

    async def close(self) -> None:
        """Mark this process's entry stopped, close the client, and let the calls the store
        stopped waiting for end: within :data:`CLOSE_SECONDS` whatever the server does (a stop
        is bounded: the supervisor kills a worker that outlasts its drain by a margin), never
        cancelling the driver (storage/mongo/calls.py). The client's close ends its sessions
        on the server, within what is left (``pymongo.timeout``: no server selection waits the
        whole budget for a server that is gone)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_SECONDS
        if self.registration is not None and self.registration.announced:
            with contextlib.suppress(StorageError, StoreFault):
                await self._mark_stopped()

        async def close_client() -> None:
            # The driver's own deadline, a moment before the store stops waiting: it ends the
            # close itself (its ending of the sessions gives up; the rest takes no server).
            with pymongo.timeout(max(deadline - loop.time() - CLOSE_MARGIN_SECONDS, 0.001)):
                result = self._client.close()
                if inspect.isawaitable(result):
                    await result

        closing = self.calls.start(close_client())
        with contextlib.suppress(calls.Left, PyMongoError):
            await self.calls.wait(closing, deadline - loop.time())
        left = await self.calls.settle(deadline - loop.time())  # the close among them, if it is not done
        if left:
            log.warning("the MongoDB client did not close within %g s (%d calls still running): stopping anyway",
                        CLOSE_SECONDS, left)

    async def deployment_settings(self, settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        if self.registration is None:  # no serving process's store: it says nothing for one
            return {}
        await self._declare_settings(dict(settings))
        return processes.disagreeing(await self._running_settings(), self.registration.id, dict(settings))

    @guarded()
    async def _declare_settings(self, settings: dict[str, Any]) -> None:
        assert self.registration is not None
        await self.db[processes.COLLECTION].update_one({"_id": self.registration.id},
                                                       {"$set": {processes.SETTINGS_FIELD: settings}})

    @guarded()
    async def _running_settings(self) -> list[dict[str, Any]]:
        return await self.db[processes.COLLECTION].find(processes.SETTINGS_FILTER).to_list(None)

    @guarded(budget="stop_budget")
    async def _mark_stopped(self) -> None:
        if self.registration is not None:
            await self.registration.stopped(self)

    def unwritable(self) -> str | None:
        return self.topology.unwritable()

    async def reachable(self, seconds: float) -> None:
        await asyncio.wait({self.topology.writable()}, timeout=seconds)

    def failure_counts(self) -> FailureCounts:
        return self  # every process sharing the store counts in it

    @guarded()
    async def ping(self) -> None:
        await self._db.command("ping")

    # -- clients

    async def _clients(self, match: dict[str, Any], limit: int | None = None) -> list[Client]:
        """The clients ``match`` finds, by id, none whose removal is recorded: one read, the
        removal looked up beside each (a document 0.9.0 wrote back during a removal is no
        client)."""
        pipeline: list[dict[str, Any]] = [
            {"$match": match}, {"$sort": {"_id": ASCENDING}},
            {"$lookup": {"from": "removals", "localField": "_id", "foreignField": "_id", "as": "removal"}},
            {"$match": {"removal": {"$size": 0}}}]
        if limit is not None:
            pipeline.append({"$limit": limit})
        cursor = self.clients.aggregate(pipeline)
        if inspect.isawaitable(cursor):  # PyMongo's aggregate is a coroutine; Motor-style ones are not
            cursor = await cursor
        documents = await cursor.to_list(limit)
        return [CLIENTS.record({key: value for key, value in doc.items() if key != "removal"}) for doc in documents]

    @guarded()
    async def get_client(self, client_id: str) -> Client | None:
        return next(iter(await self._clients({"_id": client_id}, 1)), None)

    @guarded()
    async def list_clients(self, after: str | None = None, limit: int | None = None) -> list[Client]:
        return await self._clients({"_id": {"$gt": after}} if after is not None else {}, limit)

    @guarded()
    async def put_client(self, client: Client) -> None:
        await self.clients.update_one({"_id": client.client_id}, CLIENTS.setting(client), upsert=True)

    @guarded()
    async def add_client(self, client: Client) -> None:
        await self.clients.insert_one(CLIENTS.doc(client))  # a duplicate _id: Conflict (guarded)

    @guarded()
    async def update_client(self, client_id: str, fields: dict[str, Any], *,
                            if_confidential: bool = False) -> Client | None:
        match: dict[str, Any] = {"_id": client_id}
        if if_confidential:
            match["secret_hash"] = {"$ne": None}
        return CLIENTS.record(await self.clients.find_one_and_update(
            match, {"$set": dict(fields)}, return_document=ReturnDocument.BEFORE))

    @guarded()
    async def delete_client(self, client_id: str) -> None:
        await self.clients.delete_one({"_id": client_id})
        await self.previous_secrets.delete_one({"_id": client_id})

    @guarded()
    async def begin_removal(self, client_id: str, now: datetime, tag: str) -> Removal:
        # The call's own tag, set only by the write that made the record: a retry of that write
        # (its reply lost) finds its tag still; any other call, the tag of the one that made it.
        return REMOVALS.record(await self.removals.find_one_and_update(
            {"_id": client_id}, {"$setOnInsert": {"started_at": now, "tag": tag}}, upsert=True,
            return_document=ReturnDocument.AFTER))

    @guarded()
    async def mark_removal(self, client_id: str, now: datetime) -> None:
        await self.removed_clients.update_one(
            {"_id": client_id},
            {"$set": {"removed_at": now, "expires_at": now + timedelta(seconds=REMOVED_CLIENT_SECONDS)}},
            upsert=True)

    @guarded()
    async def get_removal(self, client_id: str) -> Removal | None:
        return REMOVALS.record(await self.removals.find_one({"_id": client_id}))

    @guarded()
    async def list_removals(self) -> list[Removal]:
        return [REMOVALS.record(doc) for doc in await self.removals.find({}).sort("_id", ASCENDING).to_list(None)]

    async def end_removal(self, removal: Removal) -> None:
        # Two operations, each run again alone after a lost reply: the document and the previous
        # secret deleted while this removal's record is there, then the record, by its tag. Run
        # as one, a run again after the record's deletion was applied deleted a client registered
        # under the id in between (its 201 and secret, then 404).
        await self._clear_removed(removal)
        await self._drop_removal(removal)

    @guarded()
    async def _clear_removed(self, removal: Removal) -> None:
        with pymongo.timeout(self.budget):  # a read: the server stops at the budget too
            recorded = await self.removals.find_one({"_id": removal.client_id, "tag": removal.tag}, {"_id": 1})
        if recorded is None:
            return  # finished already (by another call of the same removal): the id may be someone's again
        await self.clients.delete_one({"_id": removal.client_id})
        await self.previous_secrets.delete_one({"_id": removal.client_id})

    @guarded()
    async def _drop_removal(self, removal: Removal) -> None:
        await self.removals.delete_one({"_id": removal.client_id, "tag": removal.tag})

    @guarded()
    async def put_previous_secret(self, previous: PreviousSecret) -> None:
        document = PREVIOUS_SECRETS.doc(previous)
        await self.previous_secrets.replace_one({"_id": document["_id"]}, document, upsert=True)

    @guarded()
    async def get_previous_secret(self, client_id: str) -> PreviousSecret | None:
        return PREVIOUS_SECRETS.record(await self.previous_secrets.find_one({"_id": client_id}))

    @guarded()
    async def delete_previous_secret(self, client_id: str) -> None:
        await self.previous_secrets.delete_one({"_id": client_id})

    @guarded()
    async def note_previous_secret_use(self, client_id: str, now: datetime, every_seconds: float) -> bool:
        quiet = {"$or": [{"last_used_at": None}, {"last_used_at": {"$lte": now - timedelta(seconds=every_seconds)}}]}
        result = await self.previous_secrets.update_one({"_id": client_id, **quiet}, {"$set": {"last_used_at": now}})
        return result.modified_count == 1

    @guarded()
    async def expire_previous_secret(self, now: datetime) -> PreviousSecret | None:
        # One process deletes each (the one that tells of it), the earliest first (expires_at).
        return PREVIOUS_SECRETS.record(await self.previous_secrets.find_one_and_delete(
            {"expires_at": {"$lte": now}}, sort=[("expires_at", ASCENDING)]))

    # -- users

    @guarded()
    async def get_user(self, user_id: str) -> User | None:
        return USERS.record(await self.users.find_one({"_id": user_id}))

    @guarded()
    async def get_user_by_username(self, username: str) -> User | None:
        # New usernames are stored as their key, so the unique index on username holds one
        # user per key; one stored with capitals by release 0.9.0 (Alice) is found typed
        # otherwise (ALICE, alice) too. One read, an equality under the caseless collation on its
        # index (username_caseless), for a name no user has as well (a typo, a new user, a
        # guess): the name as written, else the one stored as its key, else of those stored
        # under its key the first by name, as listed (two 0.9.0 users differing only in case).
        return USERS.record(next(iter(await self._same_key(username)), None))

    @guarded()
    async def list_users(self, after: str | None = None, limit: int | None = None) -> list[User]:
        return [USERS.record(doc) for doc in await _page(self.users, "username", after, limit)]

    async def seed_user(self, user: User, now: datetime) -> User:
        # Written only over the admin flag it read (a compare-and-set), so that whether the write
        # demotes, and so carries the mark, is decided on the document it replaces; a new user
        # is inserted only while no administrator holds the name (the unique index then refuses
        # the insert, and the loop reads it).
        for _ in range(3):  # a concurrent first insert, or change of the flag: read again
            found = await self._seeded_admin(user.username)
            fields: dict[str, Any] = {"password_hash": user.password_hash, "admin": user.admin}
            where: dict[str, Any]
            if found is None:
                where = {"username": user.username, **({} if user.admin else {"admin": {"$ne": True}})}
                update = {"$set": fields, "$setOnInsert": {"_id": user.user_id}}
            else:
                where = {"_id": found["_id"], "admin": found.get("admin")}
                update = {"$set": {**fields, "narrowed_at": now} if found.get("admin") is True and not user.admin
                          else fields}
            try:
                seeded = await self._seed_write(where, update)
            except Conflict:
                continue
            if seeded is not None:
                return USERS.record(seeded)
        raise StorageError(f"could not seed user {user.username!r} (concurrent updates)")

    @guarded()
    async def _seeded_admin(self, username: str) -> dict[str, Any] | None:
        return await self.users.find_one({"username": username}, {"admin": 1})

    @guarded()
    async def _seed_write(self, where: dict[str, Any], update: dict[str, Any]) -> dict[str, Any] | None:
        # Run again after a lost reply: the flag it wrote no longer matches, and seeding reads again.
        return await self.users.find_one_and_update(where, update, upsert="$setOnInsert" in update,
                                                    return_document=ReturnDocument.AFTER)

    async def put_user(self, user: User) -> None:
        # Usernames are ASCII (identifiers.USERNAME), where a caseless regex is the key's
        # comparison: it also finds a user that release 0.9.0 stored with capitals under the
        # same key, which the unique index alone would not. A user who keeps their name is
        # never refused (two such users from before stay as they are).
        same = await self._caseless_holders(user.username)
        kept = any(doc["_id"] == user.user_id and doc["username"] == user.username for doc in same)
        if not kept and any(doc["_id"] != user.user_id for doc in same):
            raise Conflict(f"username {user.username!r} is taken")
        await self._write_user(user)

    @guarded()
    async def _caseless_holders(self, username: str) -> list[dict[str, Any]]:
        return await self._same_key(username, {"username": 1})

    async def _same_key(self, username: str, projection: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The users whose username has the key of ``username`` (identifiers.username_key), in the
        order a lookup takes them: the name as written, the key, then the others by name. One
        read under the caseless collation (its index), which finds the name, its key and every
        ASCII name differing from them in case; the key decides."""
        key = username_key(username)
        documents = await self.users.find({"username": {"$in": sorted({username, key})}}, projection,
                                          collation=CASELESS).to_list(None)
        same = [doc for doc in documents if doc["username"] == username or username_key(doc["username"]) == key]
        return sorted(same, key=lambda doc: (doc["username"] != username, doc["username"] != key, doc["username"]))

    @guarded()
    async def _write_user(self, user: User) -> None:
        await self.users.update_one({"_id": user.user_id}, USERS.setting(user), upsert=True)

    @guarded()
    async def update_user(self, user_id: str, fields: dict[str, Any]) -> User | None:
        assert "username" not in fields and "user_id" not in fields  # a user's keys stay
        return USERS.record(await self.users.find_one_and_update(
            {"_id": user_id}, {"$set": dict(fields)}, return_document=ReturnDocument.BEFORE))

    @guarded()
    async def delete_user(self, user_id: str) -> None:
        await self.users.delete_one({"_id": user_id})

    # -- installations

    @guarded()
    async def get_installation(self, installation_id: str) -> Installation | None:
        return INSTALLATIONS.record(await self.installations.find_one({"_id": installation_id}))

    @guarded()
    async def list_installations(self, after: str | None = None, limit: int | None = None) -> list[Installation]:
        return [INSTALLATIONS.record(doc) for doc in await _page(self.installations, "_id", after, limit)]

    @guarded()
    async def put_installation(self, installation: Installation) -> None:
        await self.installations.update_one({"_id": installation.installation_id},
                                            INSTALLATIONS.setting(installation), upsert=True)

    @guarded()
    async def delete_installation(self, installation_id: str) -> None:
        await self.installations.delete_one({"_id": installation_id})

    # -- grants

    @staticmethod
    def _subject_filter(client_id: str, subject: Subject) -> dict[str, Any]:
        return {"client_id": client_id, "user_id": subject.user_id, "installation_id": subject.installation_id}

    @guarded()
    async def save_grant(self, client_id: str, subject: Subject, scopes: list[str], now: datetime) -> Grant:
        where = self._subject_filter(client_id, subject)
        for _ in range(3):  # a concurrent first insert of the same grant: read it back and go on
            active = await self.grants.find_one_and_update(
                {**where, "revoked_at": None}, {"$set": {"scopes": list(scopes)}},
                return_document=ReturnDocument.AFTER)
            if active is not None:
                return GRANTS.record(active)
            revived = await self.grants.find_one_and_update(
                {**where, "revoked_at": {"$ne": None}},
                {"$set": {"scopes": list(scopes), "created_at": now, "revoked_at": None}, "$inc": {"generation": 1}},
                return_document=ReturnDocument.AFTER)
            if revived is not None:
                return GRANTS.record(revived)
            grant = Grant(secrets.token_hex(16), client_id, subject.user_id, subject.installation_id,
                          list(scopes), now)
            try:
                await self.grants.insert_one(GRANTS.doc(grant))
                return grant
            except DuplicateKeyError:
                continue
        raise StorageError("could not save the grant (concurrent updates)")

    @guarded()
    async def get_grant(self, grant_id: str) -> Grant | None:
        return GRANTS.record(await self.grants.find_one({"_id": grant_id}))

    @guarded()
    async def find_grant(self, client_id: str, subject: Subject) -> Grant | None:
        return GRANTS.record(await self.grants.find_one(self._subject_filter(client_id, subject)))

    @guarded()
    async def list_grants(self, subject: Subject) -> list[Grant]:
        docs = await self.grants.find({"user_id": subject.user_id, "installation_id": subject.installation_id,
                                       "revoked_at": None}).to_list(None)
        return sorted((GRANTS.record(doc) for doc in docs), key=lambda grant: (grant.created_at, grant.grant_id))

    @guarded()
    async def list_client_grants(self, client_id: str, after: str | None = None,
                                 limit: int | None = None) -> list[Grant]:
        live: dict[str, Any] = {"client_id": client_id, "revoked_at": None}
        if after is not None:
            live["_id"] = {"$gt": after}
        cursor = self.grants.find(live).sort("_id", ASCENDING)
        return [GRANTS.record(doc) for doc in await (cursor.limit(limit) if limit else cursor).to_list(None)]

    async def revoke_client_grants(self, client_id: str, now: datetime, limit: int,
                                   before: datetime | None = None) -> list[str]:
        # Three operations, each with its own budget and run again alone after a lost reply:
        # the batch read (client_live), the families' sweep, then the grants' (grant_live, _id).
        grant_ids = await self._live_client_grant_ids(client_id, limit, before)
        if grant_ids:
            await self._revoke_where(self.families, {"grant_id": {"$in": grant_ids}, "revoked_at": None}, now)
            await self._revoke_where(self.grants, {"_id": {"$in": grant_ids}, "revoked_at": None}, now)
        return grant_ids

    @guarded()
    async def _live_client_grant_ids(self, client_id: str, limit: int, before: datetime | None) -> list[str]:
        live: dict[str, Any] = {"client_id": client_id, "revoked_at": None}
        if before is not None:
            live["created_at"] = {"$lt": before}
        cursor = self.grants.find(live, {"_id": 1}).sort("_id", ASCENDING)
        return [doc["_id"] for doc in await cursor.limit(limit).to_list(limit)]

    @guarded()
    async def _revoke_where(self, collection: Any, match: dict[str, Any], now: datetime) -> None:
        await collection.update_many(match, {"$set": {"revoked_at": now}})

    @guarded()
    async def withdraw_scopes(self, client_id: str, kept: list[str]) -> None:
        # What holds a scope beyond ``kept`` loses it; a sweep, as a removed client's revocation
        # is (a frozen original of a move takes it too, and hands it to its copy: hashes.finish).
        beyond = {"scopes": {"$elemMatch": {"$nin": list(kept)}}}
        withdraw = {"$pull": {"scopes": {"$nin": list(kept)}}}
        await self.grants.update_many({"client_id": client_id, "revoked_at": None, **beyond}, withdraw)
        await self.codes.update_many({"client_id": client_id, "consumed_at": None, **beyond}, withdraw)
        await self.families.update_many({"client_id": client_id, "revoked_at": None, **beyond}, withdraw)

    @guarded()
    async def mark_grant_revoked(self, grant_id: str, now: datetime) -> bool:
        result = await self.grants.update_one({"_id": grant_id, "revoked_at": None}, {"$set": {"revoked_at": now}})
        return result.modified_count == 1

    @guarded()
    async def revoke_grant_families(self, grant_id: str, now: datetime) -> int:
        now = _stored(now)
        result = await self.families.update_many({"grant_id": grant_id, "revoked_at": None},
                                                 {"$set": {"revoked_at": now}})
        return await self._swept(result, self.families, {"grant_id": grant_id, "revoked_at": now})

    async def _swept(self, result: Any, collection: Any, match: dict[str, Any]) -> int:
        """What a sweep revoked. Run again after an attempt that failed (a reply lost after the
        server applied it), its own ``modified_count`` says 0 and the announcement of what it
        revoked would be skipped: then it is what the store holds revoked at the sweep's ``now``."""
        if not _RUN_AGAIN.get():
            return int(result.modified_count)
        with pymongo.timeout(self.budget):  # a read: the server stops at the budget too
            return int(await collection.count_documents(match))

    # -- codes, families and sessions: keyed by a hash, found in either format (storage/mongo/hashes.py)

    async def _one(self, collection: str, match: dict[str, Any]) -> dict[str, Any] | None:
        """The document of one credential, never a frozen original on its own (hashes.settled)."""
        found = self._db_collection(collection).find
        return hashes.merged(collection, await hashes.settled(self.db, collection,
                                                              lambda: found(match).limit(2).to_list(2)))

    def _db_collection(self, collection: str) -> Any:
        return {"codes": self.codes, "families": self.families, "sessions": self.sessions}[collection]

    async def _write_one(self, collection: str, key: str, write: Callable[[], Coroutine[Any, Any, R]]) -> R:
        """A single-document write on the credential keyed by ``key`` (its filter skips a frozen
        document): one that found nothing because its document is being moved finishes the
        move, and runs again on the copy."""
        result = await write()
        if _missed(result):
            with pymongo.timeout(self.budget):  # a read: the server stops at the budget too
                frozen = await self._db_collection(collection).find_one(hashes.frozen(key))
            if frozen is not None:
                await hashes.finish(self.db, collection, frozen)
                result = await write()
        return result

    async def _listing(self, collection: str,
                       read: Callable[[], Awaitable[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
        """A listing's documents, one per credential, none of them a frozen original: one the
        listing met, or the original of a copy it met (while the conversion to packed hashes
        runs, a sweep may have revoked an original whose copy the listing's filter took as
        live), has its move finished and the listing is read again (hashes.settled). Nothing
        to look for before the conversion starts (the compatibility version below it) or once
        it is done."""
        state = self.format

        async def with_originals() -> list[dict[str, Any]]:
            documents = await read()
            if state.compatibility >= hashes.PACKED_FROM and not state.done(store_format.PACKED_HASHES.name):
                copies = [hashes.unpacked(doc["_id"]) for doc in documents if isinstance(doc["_id"], bytes)]
                if copies:
                    documents = documents + await self._db_collection(collection).find(
                        {"_id": {"$in": copies}, hashes.MOVING: {"$ne": None}}).to_list(None)
            return documents

        return hashes.merged_all(collection, await hashes.settled(self.db, collection, with_originals))

    @guarded()
    async def add_code(self, code: AuthorizationCode) -> None:
        await self.codes.insert_one(CODES.doc(code, await self.writing()))

    @guarded()
    async def get_code(self, code_hash: str) -> AuthorizationCode | None:
        return CODES.record(await self._one("codes", CODES.match(code_hash=code_hash)))

    @guarded()
    async def consume_code(self, code_hash: str, now: datetime, *, family_id: str | None = None,
                           failed: bool = False) -> AuthorizationCode | None:
        pack = await self.writing()
        return CODES.record(await self._write_one("codes", code_hash, lambda: self.codes.find_one_and_update(
            CODES.writable(code_hash=code_hash, consumed_at=None),
            {"$set": CODES.fields(pack, consumed_at=now, spent_by_failure=failed, family_id=family_id)},
            return_document=ReturnDocument.BEFORE)))

    # -- token families

    @guarded()
    async def create_family(self, family: Family) -> bool:
        """False when the family exists, in either format (a code redeemed again). While the
        conversion to packed hashes is unfinished, processes may write either format, and
        the two keys of one family differ: the family holds the guard (hashes.GUARD, unique),
        so two writes of it in different formats at once collide, and the key of the other
        format is looked for first (a family written without the guard: by 0.9.0, or a copy)."""
        pack = await self.writing()
        document = FAMILIES.doc(family, pack)
        if not self.format.done(store_format.PACKED_HASHES.name):
            document[hashes.GUARD] = hashes.packed(family.family_id)
            other = family.family_id if pack is hashes.packed else hashes.packed(family.family_id)
            with pymongo.timeout(self.budget):  # a read: the server stops at the budget too
                if await self.families.find_one({"_id": other}, {"_id": 1}) is not None:
                    return False
        try:
            await self.families.insert_one(document)
        except DuplicateKeyError:
            return False
        return True

    async def _with_grant(self, match: dict[str, Any]) -> tuple[Family | None, Grant | None]:
        async def read() -> list[dict[str, Any]]:
            cursor = self.families.aggregate([
                {"$match": match},
                {"$limit": 2},  # the one family, or, while it moves, its frozen original and its copy
                {"$lookup": {"from": "grants", "localField": "grant_id", "foreignField": "_id", "as": "grant"}},
            ])
            if inspect.isawaitable(cursor):  # PyMongo's aggregate is a coroutine; Motor-style ones are not
                cursor = await cursor
            return await cursor.to_list(2)

        document = hashes.merged("families", await hashes.settled(self.db, "families", read))
        if document is None:
            return None, None
        grants = document.pop("grant")
        return FAMILIES.record(document), GRANTS.record(grants[0] if grants else None)

    @guarded()
    async def get_family(self, family_id: str) -> tuple[Family | None, Grant | None]:
        return await self._with_grant(FAMILIES.match(family_id=family_id))

    @guarded()
    async def find_access(self, access_hash: str) -> tuple[Family | None, Grant | None]:
        return await self._with_grant({"$or": [FAMILIES.match(access_hash=access_hash),
                                                FAMILIES.match(previous_access_hash=access_hash)]})

    @guarded()
    async def rotate_family(self, family_id: str, refresh_hash: str, pair: Pair, now: datetime, *,
                            previous_access: tuple[str, datetime] | None = None) -> Family | None:
        pack = await self.writing()
        replaced_hash, replaced_expiry = previous_access or (None, None)
        current = {} if replaced_hash is None else {"access_hash": replaced_hash}
        return FAMILIES.record(await self._write_one("families", family_id, lambda: self.families.find_one_and_update(
            FAMILIES.writable(family_id=family_id, refresh_hash=refresh_hash, **current, revoked_at=None,
                              expires_at={"$gt": now}),
            {"$set": FAMILIES.fields(pack, **_pair_fields(pair), previous_hash=refresh_hash, renewed_at=now,
                                     previous_access_hash=replaced_hash, previous_access_expires_at=replaced_expiry),
             "$inc": {"rotations": 1}},
            return_document=ReturnDocument.AFTER)))

    @guarded()
    async def reissue_pair(self, family_id: str, refresh_hash: str, pair: Pair) -> Family | None:
        pack = await self.writing()
        return FAMILIES.record(await self._write_one("families", family_id, lambda: self.families.find_one_and_update(
            FAMILIES.writable(family_id=family_id, refresh_hash=refresh_hash, access_used_at=None, revoked_at=None),
            {"$set": FAMILIES.fields(pack, **_pair_fields(pair))}, return_document=ReturnDocument.AFTER)))

    @guarded()
    async def mark_access_used(self, family_id: str, access_hash: str, now: datetime) -> None:
        await self._write_one("families", family_id, lambda: self.families.update_one(
            FAMILIES.writable(family_id=family_id, access_hash=access_hash, access_used_at=None),
            {"$set": {"access_used_at": now}}))

    @guarded()
    async def mark_second_holder(self, family_id: str, now: datetime) -> bool:
        now = _stored(now)
        result = await self._write_one("families", family_id, lambda: self.families.update_one(
            FAMILIES.writable(family_id=family_id, second_holder_at=None),
            {"$set": {"second_holder_at": now}}))
        if result.modified_count == 1:
            return True
        if not _RUN_AGAIN.get():
            return False
        # Run again after a reply lost: the mark found set is this call's when it holds this
        # call's moment (another holder's would hold its own).
        with pymongo.timeout(self.budget):  # a read: the server stops at the budget too
            family = await self._one("families", FAMILIES.match(family_id=family_id))
        return family is not None and _utc(family.get("second_holder_at")) == now

    @guarded()
    async def revoke_access(self, family_id: str, access_hash: str, now: datetime) -> bool:
        result = await self._write_one("families", family_id, lambda: self.families.update_one(
            FAMILIES.writable(family_id=family_id, access_hash=access_hash, access_revoked_at=None),
            {"$set": {"access_revoked_at": now, "access_used_at": now}}))
        return result.modified_count == 1

    @guarded()
    async def revoke_family(self, family_id: str, now: datetime) -> bool:
        result = await self._write_one("families", family_id, lambda: self.families.update_one(
            FAMILIES.writable(family_id=family_id, revoked_at=None),
            {"$set": {"revoked_at": now}}))
        return result.modified_count == 1

    @guarded()
    async def list_families(self, grant_id: str) -> list[Family]:
        live = {"grant_id": grant_id, "revoked_at": None}
        documents = await self._listing("families", lambda: self.families.find(live).sort(
            [("created_at", ASCENDING), ("_id", ASCENDING)]).to_list(None))
        return [family for family in map(FAMILIES.record, documents) if family.revoked_at is None]

    # -- sessions

    @guarded()
    async def add_session(self, session: Session) -> None:
        await self.sessions.insert_one(SESSIONS.doc(session, await self.writing()))

    @guarded()
    async def get_session(self, session_hash: str) -> Session | None:
        session = SESSIONS.record(await self._one("sessions", SESSIONS.match(session_hash=session_hash)))
        return None if session is None or session.ended_at is not None else session

    @guarded()
    async def end_session(self, session_hash: str, now: datetime) -> bool:
        result = await self._write_one("sessions", session_hash, lambda: self.sessions.update_one(
            SESSIONS.writable(session_hash=session_hash, ended_at=None),
            {"$set": {"ended_at": now}}))
        return result.modified_count == 1

    @guarded()
    async def list_user_sessions(self, user_id: str, now: datetime) -> list[Session]:
        live = {"user_id": user_id, "ended_at": None, "expires_at": {"$gt": now}}
        documents = await self._listing("sessions", lambda: self.sessions.find(live).sort(
            [("last_seen_at", DESCENDING), ("_id", DESCENDING)]).limit(MAX_LISTED_SESSIONS).to_list(None))
        return [session for session in map(SESSIONS.record, documents) if session.ended_at is None]

    @guarded()
    async def touch_session(self, session_hash: str, now: datetime) -> None:
        await self._write_one("sessions", session_hash, lambda: self.sessions.update_one(
            SESSIONS.writable(session_hash=session_hash), {"$set": {"last_seen_at": now}}))

    @guarded()
    async def end_user_sessions(self, user_id: str, now: datetime) -> int:
        now = _stored(now)
        result = await self.sessions.update_many({"user_id": user_id, "ended_at": None}, {"$set": {"ended_at": now}})
        return await self._swept(result, self.sessions, {"user_id": user_id, "ended_at": now})

    # -- failure counts shared by the processes (FailureCounts)

    @guarded()
    async def count_attempt(self, group: str, counters: list[str], window_seconds: int) -> tuple[list[int], float]:
        now = datetime.now(UTC)
        for _ in range(3):
            counted = await self.failures.find_one_and_update(
                {"_id": group, "expires_at": {"$gt": now}}, {"$inc": {f"c.{name}": 1 for name in counters}},
                return_document=ReturnDocument.AFTER)
            if counted is not None:
                return [counted["c"][name] for name in counters], (_utc(counted["expires_at"]) - now).total_seconds()
            # No window, or one the TTL monitor has not removed yet: start one.
            await self.failures.delete_one({"_id": group, "expires_at": {"$lte": now}})
            try:
                window = {"c": dict.fromkeys(counters, 1), "expires_at": now + timedelta(seconds=window_seconds)}
                await self.failures.insert_one({"_id": group, **window})
                return [1] * len(counters), float(window_seconds)
            except DuplicateKeyError:  # another process started it first: count in it
                continue
        raise StorageError("could not count an attempt (concurrent updates)")

    @guarded()
    async def uncount_attempt(self, group: str, counters: list[str], reset: list[str]) -> None:
        update: dict[str, Any] = {"$inc": {f"c.{name}": -1 for name in counters}} if counters else {}
        if reset:
            update["$set"] = {f"c.{name}": 0 for name in reset}
        if not update:
            return
        await self.failures.update_one({"_id": group, "expires_at": {"$gt": datetime.now(UTC)}}, update)

    @guarded()
    async def read_counts(self, group: str, counters: list[str]) -> tuple[list[int], float]:
        now = datetime.now(UTC)
        found = await self.failures.find_one({"_id": group, "expires_at": {"$gt": now}})
        if found is None:
            return [0] * len(counters), 0.0
        return [found["c"].get(name, 0) for name in counters], (_utc(found["expires_at"]) - now).total_seconds()

    # -- housekeeping

    @guarded()
    async def purge_expired(self, now: datetime) -> dict[str, int]:
        # The TTL index keeps every code the retention past its expiry; here an unconsumed one
        # (nothing to detect a replay of) goes at once.
        counts = {"codes": (await self.codes.delete_many({"$or": [
            {"consumed_at": None, "expires_at": {"$lte": now}},
            {"expires_at": {"$lte": now - timedelta(seconds=CODE_RETENTION_SECONDS)}},
        ]})).deleted_count}
        for name, collection in (("families", self.families), ("sessions", self.sessions)):
            counts[name] = (await collection.delete_many({"expires_at": {"$lte": now}})).deleted_count
        return counts
