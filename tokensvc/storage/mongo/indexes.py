"""The MongoDB store's indexes (:data:`INDEXES`), and how they follow the store's format
(:class:`Indexes`): made at start-up, reconciled where MongoDB can change one in place, those no
release allowed to run relies on dropped, and the tripwires of a finalize placed (format.py).
The package's docstring says which query each serves."""

from __future__ import annotations

import logging
from typing import Any

import pymongo
from pymongo import ASCENDING, IndexModel
from pymongo.errors import OperationFailure

from tokensvc.storage.base import CODE_RETENTION_SECONDS, StoreFault
from tokensvc.storage.mongo import hashes
from tokensvc.storage.mongo.connection import Connection
from tokensvc.storage.mongo.feed import WATCHED

log = logging.getLogger(__name__)

Index = tuple[str, list[tuple[str, int]], dict[str, Any]]  # (collection, keys, options)


def _revoked_only(collection: str, field: str) -> Index:
    """An index holding only the records whose ``field`` is set (a time): the revoked ones."""
    return collection, [(field, ASCENDING)], {"name": field, "partialFilterExpression": {field: {"$type": "date"}}}


# Usernames compared whatever their case (ICU at strength 2): for the ASCII usernames are
# (identifiers.USERNAME), the comparison of their keys (identifiers.username_key). A read under it
# is served by the index of the same collation, username_caseless.
CASELESS: dict[str, Any] = {"locale": "en", "strength": 2}

RESOURCES: Index = ("clients", [("resources", ASCENDING)], {
    "unique": True, "name": "resources", "partialFilterExpression": {"resources": {"$type": "string"}}})
DUPLICATE_KEY = 11000

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
    # One family per id while keys of both formats are written (hashes.py, Twins).
    ("families", [(hashes.GUARD, ASCENDING)], {"unique": True, "sparse": True, "name": hashes.GUARD}),
    ("sessions", [("expires_at", ASCENDING)], {"expireAfterSeconds": 0, "name": "ttl"}),
    ("sessions", [("user_id", ASCENDING)], {"name": "user_id"}),
    ("failures", [("expires_at", ASCENDING)], {"expireAfterSeconds": 0, "name": "ttl"}),
    # The running processes' entries (processes.py), kept a day after their last heartbeat.
    ("processes", [("seen_at", ASCENDING)], {"expireAfterSeconds": 86400, "name": "ttl"}),
    # A resource URI (RFC 8707) is one client's: two writers in two processes at once cannot
    # both declare it. Multikey (each element indexed); documents without one are left out.
    RESOURCES,
    # A removal's mark (mark_removal), kept a day: long after every relay polled it.
    ("removed_clients", [("expires_at", ASCENDING)], {"expireAfterSeconds": 0, "name": "ttl"}),
    # What the polling fallback of the revocation feed reads.
    *(_revoked_only(collection, field) for collection, fields in WATCHED.items() for field in fields),
]
INDEX_CONFLICT = frozenset({85, 86})  # IndexOptionsConflict, IndexKeySpecsConflict
INDEX_NOT_FOUND = 27
UNAUTHORIZED = 13


def have_options(index: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in index.items() if key not in ("key", "v", "ns")}


def _collated(index: dict[str, Any]) -> tuple[Any, Any]:
    """An index's collation as it compares (a server lists it with every default filled in)."""
    collation = index.get("collation") or {}
    return collation.get("locale", "simple"), collation.get("strength")


def _unmade(shared: str) -> str:
    """The index ``clients.resources`` unmade, and what to do. Until it is made, each writer of
    this release still refuses a new duplicate, and no token is bound to a shared URI
    (declared_resources)."""
    shared = shared or "by a write just now"
    return (f"index clients.resources is not made: resource URIs are declared twice ({shared}). No token is "
            "bound to such a URI until one client alone declares it: change the others' resources (the admin API, "
            "tokensvc apply, the configuration file), then restart tokensvc or run tokensvc storage migrate, which "
            "makes the index")


class Indexes:
    """The store's indexes on its connection, as the store's format calls for them."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        # What keeps an index from being made that the store still serves without (said at
        # every start-up and by ``tokensvc storage status`` and ``migrate``).
        self.problems: list[str] = []

    async def make(self) -> None:
        """Make every index (at start-up). One that exists with other options is reconciled
        where MongoDB can change it in place (a TTL: ``collMod``); otherwise the others are
        still made and then :class:`StoreFault` names each conflicting index (found by its keys,
        whatever its name) and what to do. An index no release allowed to run relies on any
        more is dropped first, and an index a tripwire renamed is made under its new name
        (format.py)."""
        history, state = self.connection.history, self.connection.format
        await self.drop_retired()
        retired = set(history.retired_indexes(state))
        conflicts, self.problems = [], []
        for collection, keys, options in INDEXES:
            options = {**options, "name": history.index_name(collection, options["name"], state)}
            if (collection, options["name"]) in retired:
                continue
            try:
                await self._make(collection, keys, options)
            except OperationFailure as exc:
                if exc.code == DUPLICATE_KEY and (collection, keys) == RESOURCES[:2]:
                    self.problems.append(await self._shared_resources())
                    log.error("%s", self.problems[-1])
                    continue
                if exc.code not in INDEX_CONFLICT:
                    raise
                conflict = await self._reconcile(collection, keys, options)
                if conflict:
                    conflicts.append(conflict)
        if conflicts:
            raise StoreFault("; ".join(conflicts))

    async def make_resources(self) -> list[str]:
        """The index ``clients.resources`` made (``tokensvc storage migrate``, whose store is
        not opened): the problems left, as :meth:`make` says them."""
        collection, keys, options = RESOURCES
        try:
            await self._make(collection, keys, options)
            self.problems = []
        except OperationFailure as exc:
            if exc.code != DUPLICATE_KEY:
                raise
            self.problems = [await self._shared_resources()]
        return self.problems

    async def unmade(self) -> list[str]:
        """What keeps an index from being made, read only (``tokensvc storage status``)."""
        if RESOURCES[2]["name"] in await self.connection.db["clients"].index_information():
            return []
        shared = await self._shared()
        return [_unmade(shared)] if shared else []

    async def _shared_resources(self) -> str:
        return _unmade(await self._shared())

    async def _shared(self) -> str:
        """What a store written before the rule holds: each resource URI two clients declare,
        and which."""
        declaring: dict[str, list[str]] = {}
        found = await self.connection.db["clients"].find({"resources": {"$type": "string"}},
                                                         {"resources": 1}).to_list(None)
        for document in found:
            for resource in dict.fromkeys(document.get("resources") or []):
                declaring.setdefault(resource, []).append(str(document["_id"]))
        return "; ".join(f"{resource} by clients {', '.join(sorted(ids))}"
                         for resource, ids in sorted(declaring.items()) if len(ids) > 1)

    async def _make(self, collection: str, keys: list[tuple[str, int]], options: dict[str, Any]) -> None:
        # A build waits for the members its quorum names: all voting ones by default, so one
        # member down would hold start-up; a majority builds as a majority write is acknowledged.
        quorum = {"commitQuorum": "majority"} if self.connection.replica_set else {}
        budget = self.connection.build_budget
        with pymongo.timeout(budget):  # a build may take long: longer than a reply's socket timeout
            await self.connection.db[collection].create_indexes([IndexModel(keys, **options)], **quorum)

    async def drop_retired(self) -> list[str]:
        """Drop each index an earlier release relied on that no release allowed to run on this
        store needs (by its compatibility version): never one a running release still uses, so
        releases started in any order never build and drop one by turns. One another process
        dropped first is as good as dropped. The indexes this call dropped."""
        db = self.connection.db
        dropped = []
        for collection, name in self.connection.history.retired_indexes(self.connection.format):
            if name not in await db[collection].index_information():
                continue
            try:
                await db[collection].drop_index(name)
            except OperationFailure as exc:
                if exc.code != INDEX_NOT_FOUND:
                    raise
                continue
            dropped.append(f"{collection}.{name}")
            log.info("index %s.%s dropped: no release allowed to run on this store uses it", collection, name)
        return dropped

    async def follow(self) -> list[str]:
        """The indexes the compatibility version calls for (after a finalize, and on every
        heartbeat after it): the retired ones dropped, and each one a tripwire renames made under
        its new name (so a release that predates the format document cannot start). An old name
        made again meanwhile (that release, started between the drop and the rename) is dropped
        again. The indexes dropped."""
        dropped = await self.drop_retired()
        for collection, keys, options in INDEXES:
            name = self.connection.history.index_name(collection, options["name"], self.connection.format)
            if name == options["name"] or name in await self.connection.db[collection].index_information():
                continue  # nothing renamed, or made already (a heartbeat's look writes nothing)
            for _ in range(3):
                try:
                    await self._make(collection, keys, {**options, "name": name})
                    break
                except OperationFailure as exc:
                    if exc.code not in INDEX_CONFLICT:
                        raise
                    dropped += await self.drop_retired()
            else:
                raise StoreFault(f"index {collection}.{name} cannot be made: index {collection}.{options['name']} "
                                 "is made again each time it is dropped, by a release that cannot read this store: "
                                 "stop it")
        return dropped

    async def set_tripwires(self, after: int, upto: int, placed: bool = True) -> None:
        """Place the tripwires of a raise of the compatibility version from ``after`` to
        ``upto`` (format.py): each index made under its new name, its old name dropped,
        before the raise, so that a release that cannot read the new format stops at its
        start-up from now on. ``placed=False`` takes them back (a finalize refused before its
        raise leaves the store as it found it). An old name made again between the drop and
        the make (that release, starting just then: it runs, and is seen) is dropped again."""
        for collection, old, new in self.connection.history.tripwires(after, upto):
            keys, options = next((keys, options) for where, keys, options in INDEXES
                                 if where == collection and options["name"] == old)
            gone, made = (old, new) if placed else (new, old)
            for _ in range(3):
                try:
                    await self.connection.db[collection].drop_index(gone)
                except OperationFailure as exc:
                    if exc.code != INDEX_NOT_FOUND:
                        raise
                try:
                    await self._make(collection, keys, {**options, "name": made})
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
        indexes = await self.connection.db[collection].index_information()
        # The index in the way: tokensvc's name with other keys, or tokensvc's keys (under its
        # collation: the same keys under another are another index) under another name.
        in_the_way = name if name in indexes else next(
            (other for other, info in indexes.items() if list(info["key"]) == keys
             and _collated(info) == _collated(options)), None)
        if in_the_way != name and in_the_way in self.connection.history.index_names(collection, name):
            return None  # its other name (a tripwire's): the store was finalized since its format was read
        existing = indexes.get(in_the_way) if in_the_way else None
        wanted = {key: value for key, value in options.items() if key != "name"}
        if existing is not None and in_the_way == name and list(existing["key"]) == keys:
            have = {key: existing[key] for key in ("unique", "expireAfterSeconds") if key in existing}
            if {k: v for k, v in have.items() if k != "expireAfterSeconds"} == \
                    {k: v for k, v in wanted.items() if k != "expireAfterSeconds"} and "expireAfterSeconds" in wanted:
                try:
                    await self.connection.db.command({"collMod": collection, "index": {
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
