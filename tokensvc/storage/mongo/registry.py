"""The MongoDB store's registry (:class:`MongoRegistry`, the Store contract's
:class:`~tokensvc.storage.base.Registry`): clients, a client's removal and its previous secret,
users and node installations. The package's docstring lists the queries and their indexes."""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import pymongo
from pymongo import ASCENDING, ReturnDocument

from tokensvc.identifiers import username_key
from tokensvc.records import RESOURCE_SERVER, Client, Installation, PreviousSecret, Removal, User
from tokensvc.storage.base import ClientRecord, Conflict, Registry, Removing, ResourceTaken, StorageError
from tokensvc.storage.mongo.connection import Connection
from tokensvc.storage.mongo.feed import marked, with_mark
from tokensvc.storage.mongo.indexes import CASELESS
from tokensvc.storage.mongo.mapping import CLIENTS, INSTALLATIONS, PREVIOUS_SECRETS, REMOVALS, USERS
from tokensvc.storage.mongo.recent import Recent
from tokensvc.storage.mongo.retry import guarded

# The field of a client's document that says which registration wrote it (random): a removal
# takes the document it found, or one with none (written back by a release that knows nothing
# of it), never one a registration made since.
CLAIM = "claim"


def _claimed_by(claim: str) -> dict[str, Any]:
    """The filter of a removal's document: one with no claim, or the claim it found ("": none)."""
    return {CLAIM: {"$in": [None, claim]}} if claim else {CLAIM: None}


# How long a removal's mark outlives its write: every relay has long polled it by then.
REMOVED_CLIENT_SECONDS = 86400


async def _page(collection: Any, key: str, after: str | None, limit: int | None) -> list[dict[str, Any]]:
    """The documents ordered by ``key``: every one, or ``limit`` of them after ``after``."""
    cursor = collection.find({key: {"$gt": after}} if after is not None else {}).sort(key, ASCENDING)
    if limit is not None:
        cursor = cursor.limit(limit)
    return await cursor.to_list(None)


class MongoRegistry(Registry):
    """Clients, users and installations, each in a collection of its own; a client's removal and
    its previous secret in collections that release 0.9.0 never reads nor writes."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        db = connection.db
        self.clients, self.users, self.installations = db["clients"], db["users"], db["installations"]
        # A collection of its own, which 0.9.0 never reads nor rewrites (docs/decisions/0039).
        self.previous_secrets = db["previous_secrets"]
        self.removals = db["removals"]  # clients being removed: 0.9.0 never reads nor writes it
        # The removals' marks, which the relays watch, kept a while after the removal is
        # finished (a poll finds them): 0.9.0 never reads nor writes it either.
        self.removed_clients = db["removed_clients"]
        # The clients client authentication weighs, as this process read them lately (recent.py).
        self.recent: Recent[ClientRecord] = Recent()

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

    async def client_record(self, client_id: str) -> ClientRecord | None:
        kept = self.recent.get(client_id)
        if kept is not None:
            return kept
        began = self.recent.began()
        found = await self._client_record(client_id)
        if found is not None:
            self.recent.keep(client_id, found, began)
        return found

    @guarded()
    async def _client_record(self, client_id: str) -> ClientRecord | None:
        """The client and its previous secret, in one read (the removal looked up beside it)."""
        cursor = self.clients.aggregate([
            {"$match": {"_id": client_id}},
            {"$lookup": {"from": "removals", "localField": "_id", "foreignField": "_id", "as": "removal"}},
            {"$match": {"removal": {"$size": 0}}},
            {"$lookup": {"from": "previous_secrets", "localField": "_id", "foreignField": "_id", "as": "previous"}},
        ])
        if inspect.isawaitable(cursor):  # PyMongo's aggregate is a coroutine; Motor-style ones are not
            cursor = await cursor
        documents = await cursor.to_list(1)
        if not documents:
            return None
        document = documents[0]
        previous = document.pop("previous", None) or []
        document.pop("removal", None)
        return ClientRecord(CLIENTS.record(document), PREVIOUS_SECRETS.record(previous[0]) if previous else None)

    @guarded()
    async def declared_resources(self, resources: list[str]) -> set[str]:
        found = await self._clients({"kind": RESOURCE_SERVER, "resources": {"$in": list(resources)}})
        return {resource for resource in resources
                if sum(resource in (client.resources or []) for client in found) == 1}

    @guarded()
    async def list_clients(self, after: str | None = None, limit: int | None = None) -> list[Client]:
        return await self._clients({"_id": {"$gt": after}} if after is not None else {}, limit)

    @guarded()
    async def put_client(self, client: Client) -> None:
        await self.clients.update_one({"_id": client.client_id}, CLIENTS.setting(client), upsert=True)

    async def add_client(self, client: Client) -> None:
        # Inserted with a claim of its own, which no removal's step matches (_claimed_by), then
        # the removal looked for: a registration that lands while one is recorded takes back
        # what it inserted and is refused; one that finds none stands, whatever the removal's
        # steps, run late or again, do after. Its document holds nothing it would not without
        # the claim, and a release that knows nothing of it keeps it ($set) or drops it (0.9.0):
        # a document with none is taken by whichever removal is recorded (fail closed).
        claim = secrets.token_hex(8)
        try:
            await self._insert_client({**CLIENTS.doc(client), CLAIM: claim})  # a duplicate _id: Conflict
        except ResourceTaken:
            # A server may name either index a document breaks: the id taken is what it is.
            if await self._exists(client.client_id):
                raise Conflict(f"client id {client.client_id!r} is taken") from None
            raise
        if await self._removal_recorded(client.client_id):
            await self._take_back(client.client_id, claim)
            raise Removing(f"client id {client.client_id!r} is being removed")

    @guarded()
    async def _exists(self, client_id: str) -> bool:
        return await self.clients.find_one({"_id": client_id}, {"_id": 1}) is not None

    @guarded()
    async def _insert_client(self, document: dict[str, Any]) -> None:
        await self.clients.insert_one(document)

    @guarded()
    async def _removal_recorded(self, client_id: str) -> bool:
        return await self.removals.find_one({"_id": client_id}, {"_id": 1}) is not None

    @guarded()
    async def _take_back(self, client_id: str, claim: str) -> None:
        await self.clients.delete_one({"_id": client_id, CLAIM: claim})

    @guarded()
    async def update_client(self, client_id: str, fields: dict[str, Any], *,
                            if_confidential: bool = False) -> Client | None:
        match: dict[str, Any] = {"_id": client_id}
        if if_confidential:
            match["secret_hash"] = {"$ne": None}
        return CLIENTS.record(await self.clients.find_one_and_update(
            match, {"$set": with_mark(fields)}, return_document=ReturnDocument.BEFORE))

    @guarded()
    async def set_owners(self, kind: str, owners: Mapping[str, str]) -> dict[str, str]:
        # Idempotent as a whole, so run again after a lost reply (which then reports nothing
        # taken: the marks are already as ``owners`` says); a start-up's few round trips (one
        # per owner), on a collection of a deployment's entries.
        collection = {"client": self.clients, "user": self.users, "installation": self.installations}[kind]
        marked = await collection.find({"owner": {"$ne": None}}, {"owner": 1}).to_list(None)
        taken = {doc["_id"]: doc["owner"] for doc in marked if owners.get(doc["_id"]) != doc["owner"]}
        await collection.update_many({"_id": {"$nin": list(owners)}, "owner": {"$ne": None}},
                                     {"$unset": {"owner": ""}})
        for owner in sorted(set(owners.values())):
            await collection.update_many({"_id": {"$in": [key for key, value in owners.items() if value == owner]},
                                          "owner": {"$ne": owner}}, {"$set": {"owner": owner}})
        return taken

    async def begin_removal(self, client_id: str, now: datetime, tag: str) -> Removal:
        # The claim of the document there (read before the record: once it is written, no
        # registration of this release inserts one), kept by the write that makes the record.
        held = await self._claim_of(client_id)
        return await self._record_removal(client_id, now, tag, "" if held is None else held)

    @guarded()
    async def _claim_of(self, client_id: str) -> str | None:
        document = await self.clients.find_one({"_id": client_id}, {CLAIM: 1})
        return None if document is None else document.get(CLAIM)

    @guarded()
    async def _record_removal(self, client_id: str, now: datetime, tag: str, claim: str) -> Removal:
        # The call's own tag, set only by the write that made the record: a retry of that write
        # (its reply lost) finds its tag still; any other call, the tag of the one that made it.
        return REMOVALS.record(await self.removals.find_one_and_update(
            {"_id": client_id}, {"$setOnInsert": {"started_at": now, "tag": tag, "client_claim": claim}},
            upsert=True, return_document=ReturnDocument.AFTER))

    @guarded()
    async def mark_removal(self, client_id: str, now: datetime, audience: list[str] | None = None) -> None:
        await self.removed_clients.update_one(
            {"_id": client_id},
            {"$set": {"removed_at": now, "expires_at": now + timedelta(seconds=REMOVED_CLIENT_SECONDS),
                      **marked(now, audience)}},
            upsert=True)

    @guarded()
    async def get_removal(self, client_id: str) -> Removal | None:
        return REMOVALS.record(await self.removals.find_one({"_id": client_id}))

    @guarded()
    async def list_removals(self) -> list[Removal]:
        return [REMOVALS.record(doc) for doc in await self.removals.find({}).sort("_id", ASCENDING).to_list(None)]

    async def end_removal(self, removal: Removal) -> None:
        # Two operations, each run again alone after a lost reply: the document and the previous
        # secret withdrawn (never a client registered since), then the record, by its tag.
        await self.withdraw_client(removal)
        await self._drop_removal(removal)

    @guarded()
    async def withdraw_client(self, removal: Removal) -> None:
        # While this removal's record is there (a call run after another finished it deletes
        # nothing), and only a document the removal takes: the one it found, or one with no
        # claim (written back by a release that knows nothing of it), never one a registration
        # of this release inserted since, however this step and the registration interleave.
        # A record of 0.10.0 found no claim: any document (fail closed; a registration of the
        # id between the look and the deletion was 0.10.0's race, and stays one for it).
        with pymongo.timeout(self.connection.budget):  # a read: the server stops at the budget too
            recorded = await self.removals.find_one({"_id": removal.client_id, "tag": removal.tag}, {"_id": 1})
        if recorded is None:
            return  # finished already (by another call of the same removal): the id may be someone's again
        claimed = {} if removal.client_claim is None else _claimed_by(removal.client_claim)
        await self.clients.delete_one({"_id": removal.client_id, **claimed})
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
        # Written only over the admin flag and password hash it read (a compare-and-set), so that
        # whether the write demotes or sets a new password, and so carries the mark, is decided on
        # the document it replaces; a new user
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
                where = {"_id": found["_id"], "admin": found.get("admin"), "password_hash": found.get("password_hash")}
                narrowed = ((found.get("admin") is True and not user.admin)
                            or found.get("password_hash") != user.password_hash)
                update = {"$set": {**fields, "narrowed_at": now} if narrowed else fields}
            try:
                seeded = await self._seed_write(where, update)
            except Conflict:
                continue
            if seeded is not None:
                return USERS.record(seeded)
        raise StorageError(f"could not seed user {user.username!r} (concurrent updates)")

    @guarded()
    async def _seeded_admin(self, username: str) -> dict[str, Any] | None:
        return await self.users.find_one({"username": username}, {"admin": 1, "password_hash": 1})

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
            {"_id": user_id}, {"$set": with_mark(fields)}, return_document=ReturnDocument.BEFORE))

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

