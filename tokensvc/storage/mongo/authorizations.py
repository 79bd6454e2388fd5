"""The MongoDB store's authorizations (:class:`MongoAuthorizations`, the Store contract's
:class:`~tokensvc.storage.base.Authorizations`): grants, authorization codes and token families.
Codes and families are credentials, keyed by a hash in either format (credentials.py). The
package's docstring lists the queries and their indexes."""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pymongo
from pymongo import ASCENDING, ReturnDocument
from pymongo.errors import DuplicateKeyError

from tokensvc.records import AuthorizationCode, Family, Grant, Pair, Subject, User
from tokensvc.storage.base import Authorizations, Presentation, Standing, StorageError
from tokensvc.storage.mongo import format as store_format
from tokensvc.storage.mongo import hashes
from tokensvc.storage.mongo.connection import Connection
from tokensvc.storage.mongo.credentials import Credentials
from tokensvc.storage.mongo.feed import MARK_AUDIENCE, marked, marked_own
from tokensvc.storage.mongo.mapping import CLIENTS, CODES, FAMILIES, GRANTS, USERS, as_utc, pair_fields, stored
from tokensvc.storage.mongo.retry import RUN_AGAIN, guarded
from tokensvc.storage.mongo.stamps import Stamps


class MongoAuthorizations(Authorizations):
    """Grants in a collection of their own; codes and families, the credentials they issue."""

    def __init__(self, connection: Connection, credentials: Credentials, stamps: Stamps) -> None:
        self.connection, self.credentials, self.stamps = connection, credentials, stamps
        self.grants = connection.db["grants"]
        self.codes, self.families = credentials.collections["codes"], credentials.collections["families"]

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
    async def grant_standing(self, client_id: str, subject: Subject,
                             grant_id: str | None = None) -> tuple[Grant | None, User | None]:
        match = self._subject_filter(client_id, subject)
        if grant_id is not None:  # by its key, and only as the (subject, client) grant
            match = {"_id": grant_id, **match}

        async def read() -> list[dict[str, Any]]:
            cursor = self.grants.aggregate([
                {"$match": match},
                {"$limit": 1},
                {"$lookup": {"from": "users", "localField": "user_id", "foreignField": "_id", "as": "user"}},
            ])
            if inspect.isawaitable(cursor):  # PyMongo's aggregate is a coroutine; Motor-style ones are not
                cursor = await cursor
            return await cursor.to_list(1)

        found = await read()
        if not found:
            return None, None
        users = found[0].pop("user", None) or []
        user = USERS.record(users[0]) if users and subject.user_id is not None else None
        return GRANTS.record(found[0]), user

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
                                   before: datetime | None = None) -> dict[str, list[str] | None]:
        # Four operations, each with its own budget and run again alone after a lost reply: the
        # batch read (client_live), its live families' audiences by grant (grant_live), the
        # families' sweep, each marked with its own audience, then the grants', each with its
        # families'.
        grant_ids = await self._live_client_grant_ids(client_id, limit, before)
        if not grant_ids:
            return {}
        audiences = await self._grants_audiences(grant_ids, now)
        await self._revoke_families_where({"grant_id": {"$in": grant_ids}, "revoked_at": None}, now)
        await self._mark_grants(grant_ids, now, audiences)
        return {grant_id: audiences[grant_id] for grant_id in grant_ids}

    @guarded()
    async def _live_client_grant_ids(self, client_id: str, limit: int, before: datetime | None) -> list[str]:
        live: dict[str, Any] = {"client_id": client_id, "revoked_at": None}
        if before is not None:
            live["created_at"] = {"$lt": before}
        cursor = self.grants.find(live, {"_id": 1}).sort("_id", ASCENDING)
        return [doc["_id"] for doc in await cursor.limit(limit).to_list(limit)]

    @guarded()
    async def _grants_audiences(self, grant_ids: list[str], now: datetime) -> dict[str, list[str] | None]:
        """The audience of each grant's live families (None: one names none; []: none live)."""
        cursor = self.families.aggregate([
            {"$match": {"grant_id": {"$in": grant_ids}, "revoked_at": None, "expires_at": {"$gt": stored(now)}}},
            {"$project": {"_id": 0, "grant_id": 1, "resource": {"$ifNull": ["$audience", [None]]}}},
            {"$unwind": "$resource"},
            {"$group": {"_id": {"grant": "$grant_id", "resource": "$resource"}}},
        ])
        if inspect.isawaitable(cursor):  # PyMongo's aggregate is a coroutine; Motor-style ones are not
            cursor = await cursor
        together: dict[str, set[str] | None] = {grant_id: set() for grant_id in grant_ids}
        for doc in await cursor.to_list(None):
            grant_id, resource = doc["_id"]["grant"], doc["_id"].get("resource")
            held = together.get(grant_id, set())
            together[grant_id] = None if held is None or not isinstance(resource, str) else {*held, resource}
        return {grant_id: None if held is None else sorted(held) for grant_id, held in together.items()}

    @guarded(stamps=lambda self, match, now: (
        "families", {key: value for key, value in match.items() if key != "revoked_at"}, "revoked_at", now))
    async def _revoke_families_where(self, match: dict[str, Any], now: datetime) -> None:
        # An update with an aggregation pipeline: each family's mark carries its own audience.
        await self.families.update_many(match, [{"$set": {"revoked_at": now, **marked_own(now)}}])

    @guarded(stamps=lambda self, grant_ids, now, audiences: (
        "grants", {"_id": {"$in": grant_ids}}, "revoked_at", now))
    async def _mark_grants(self, grant_ids: list[str], now: datetime,
                           audiences: dict[str, list[str] | None]) -> None:
        # One update with an aggregation pipeline: each grant's mark carries its families'
        # audience, picked by its id.
        own = {"$switch": {"branches": [{"case": {"$eq": ["$_id", {"$literal": grant_id}]},
                                         "then": {"$literal": audiences.get(grant_id)}} for grant_id in grant_ids],
                           "default": None}}
        await self.grants.update_many({"_id": {"$in": grant_ids}, "revoked_at": None},
                                      [{"$set": {"revoked_at": now, MARK_AUDIENCE: {"at": now, "audience": own}}}])

    @guarded()
    async def withdraw_scopes(self, client_id: str, kept: list[str]) -> None:
        # What holds a scope beyond ``kept`` loses it; a sweep, as a removed client's revocation
        # is (a frozen original of a move takes it too, and hands it to its copy: hashes.finish).
        beyond = {"scopes": {"$elemMatch": {"$nin": list(kept)}}}
        withdraw = {"$pull": {"scopes": {"$nin": list(kept)}}}
        await self.grants.update_many({"client_id": client_id, "revoked_at": None, **beyond}, withdraw)
        await self.codes.update_many({"client_id": client_id, "consumed_at": None, **beyond}, withdraw)
        await self.families.update_many({"client_id": client_id, "revoked_at": None, **beyond}, withdraw)

    async def mark_grant_revoked(self, grant_id: str, now: datetime, audience: list[str] | None = None) -> bool:
        # Revoked already: its mark stamped again when a write landed it late (stamps.py).
        if await self._mark_grant_revoked(grant_id, now, audience):
            return True
        await self.stamps.late("grants", {"_id": grant_id}, "revoked_at", now)
        return False

    @guarded(stamps=lambda self, grant_id, now, audience: ("grants", {"_id": grant_id}, "revoked_at", now))
    async def _mark_grant_revoked(self, grant_id: str, now: datetime, audience: list[str] | None) -> bool:
        result = await self.grants.update_one({"_id": grant_id, "revoked_at": None},
                                              {"$set": {"revoked_at": now, **marked(now, audience)}})
        return result.modified_count == 1

    @guarded(stamps=lambda self, grant_id, now: ("families", {"grant_id": grant_id}, "revoked_at", stored(now)))
    async def revoke_grant_families(self, grant_id: str, now: datetime) -> int:
        now = stored(now)
        # An update with an aggregation pipeline: each family's mark carries its own audience.
        result = await self.families.update_many({"grant_id": grant_id, "revoked_at": None},
                                                 [{"$set": {"revoked_at": now, **marked_own(now)}}])
        return await self.credentials.swept(result, "families", {"grant_id": grant_id, "revoked_at": now})

    # -- codes

    @guarded()
    async def add_code(self, code: AuthorizationCode) -> None:
        await self.codes.insert_one(CODES.doc(code, await self.connection.writing()))

    @guarded()
    async def get_code(self, code_hash: str) -> AuthorizationCode | None:
        return CODES.record(await self.credentials.one("codes", CODES.match(code_hash=code_hash)))

    @guarded()
    async def consume_code(self, code_hash: str, now: datetime, *, family_id: str | None = None,
                           failed: bool = False) -> AuthorizationCode | None:
        pack = await self.connection.writing()
        return CODES.record(await self.credentials.write_one("codes", code_hash, lambda: self.codes.find_one_and_update(
            CODES.writable(code_hash=code_hash, consumed_at=None),
            {"$set": CODES.fields(pack, consumed_at=now, spent_by_failure=failed, family_id=family_id)},
            return_document=ReturnDocument.BEFORE)))

    @guarded()
    async def redeem_code(self, code_hash: str, now: datetime, family_id: str,
                          presented: Presentation) -> AuthorizationCode | None:
        # One findAndModify: the code is consumed only as it was issued, so a presentation that
        # does not match it writes nothing (the exchange then reads it to say why).
        pack = await self.connection.writing()
        match = {**CODES.writable(code_hash=code_hash, consumed_at=None), "expires_at": {"$gt": now},
                 "client_id": presented.client_id, "redirect_uri": presented.redirect_uri,
                 "code_challenge_method": "S256", "code_challenge": presented.code_challenge}
        if presented.refused_scope is not None:
            match["scopes"] = {"$ne": presented.refused_scope}
        return CODES.record(await self.credentials.write_one("codes", code_hash, lambda: self.codes.find_one_and_update(
            match, {"$set": CODES.fields(pack, consumed_at=now, spent_by_failure=False, family_id=family_id)},
            return_document=ReturnDocument.BEFORE)))

    # -- token families

    @guarded()
    async def create_family(self, family: Family) -> bool:
        """False when the family exists, in either format (a code redeemed again). While the
        conversion to packed hashes is unfinished, processes may write either format, and
        the two keys of one family differ: the family holds the guard (hashes.GUARD, unique),
        so two writes of it in different formats at once collide, and the key of the other
        format is looked for first (a family written without the guard: by 0.9.0, or a copy)."""
        pack = await self.connection.writing()
        document = FAMILIES.doc(family, pack)
        if not self.connection.format.done(store_format.PACKED_HASHES.name):
            document[hashes.GUARD] = hashes.packed(family.family_id)
            other = family.family_id if pack is hashes.packed else hashes.packed(family.family_id)
            with pymongo.timeout(self.connection.budget):  # a read: the server stops at the budget too
                if await self.families.find_one({"_id": other}, {"_id": 1}) is not None:
                    return False
        try:
            await self.families.insert_one(document)
        except DuplicateKeyError:
            return False
        return True

    async def _with_grant(self, match: dict[str, Any]) -> tuple[Family | None, Grant | None]:
        standing = await self._read_standing(match, holders=False)
        return standing.family, standing.grant

    # The lookups of a family's holders: its client (with its removal, which makes it no
    # client) and its user, beside its grant, so that a token's use is decided on one read.
    HOLDERS: list[dict[str, Any]] = [
        {"$lookup": {"from": "clients", "localField": "client_id", "foreignField": "_id", "as": "client"}},
        {"$lookup": {"from": "removals", "localField": "client_id", "foreignField": "_id", "as": "removal"}},
        {"$lookup": {"from": "users", "localField": "user_id", "foreignField": "_id", "as": "user"}},
    ]

    async def _read_standing(self, match: dict[str, Any], *, holders: bool = True) -> Standing:
        async def read() -> list[dict[str, Any]]:
            cursor = self.families.aggregate([
                {"$match": match},
                {"$limit": 2},  # the one family, or, while it moves, its frozen original and its copy
                {"$lookup": {"from": "grants", "localField": "grant_id", "foreignField": "_id", "as": "grant"}},
                *(self.HOLDERS if holders else []),
            ])
            if inspect.isawaitable(cursor):  # PyMongo's aggregate is a coroutine; Motor-style ones are not
                cursor = await cursor
            return await cursor.to_list(2)

        document = hashes.merged("families", await hashes.settled(self.connection.db, "families", read))
        if document is None:
            return Standing(None)
        grants = document.pop("grant")
        clients, removal, users = (document.pop(name, None) or [] for name in ("client", "removal", "user"))
        family = FAMILIES.record(document)
        if not holders:
            return Standing(family, GRANTS.record(grants[0] if grants else None))
        client = CLIENTS.record(clients[0]) if clients and not removal else None
        user = USERS.record(users[0]) if users and family.user_id is not None else None
        return Standing(family, GRANTS.record(grants[0] if grants else None), client, user)

    @guarded()
    async def get_family(self, family_id: str) -> tuple[Family | None, Grant | None]:
        return await self._with_grant(FAMILIES.match(family_id=family_id))

    @guarded()
    async def find_access(self, access_hash: str,
                          family_ids: Sequence[str] = ()) -> tuple[Family | None, Grant | None]:
        return await self._with_grant(self._access_match(access_hash, family_ids))

    @guarded()
    async def family_standing(self, family_id: str) -> Standing:
        return await self._read_standing(FAMILIES.match(family_id=family_id))

    @guarded()
    async def access_standing(self, access_hash: str, family_ids: Sequence[str] = ()) -> Standing:
        return await self._read_standing(self._access_match(access_hash, family_ids))

    @staticmethod
    def _access_match(access_hash: str, family_ids: Sequence[str]) -> dict[str, Any]:
        """The token's hash, current or replaced, and, for a routed token, the ids it names:
        the shard key, in either format of a hash."""
        match: dict[str, Any] = {"$or": [FAMILIES.match(access_hash=access_hash),
                                         FAMILIES.match(previous_access_hash=access_hash)]}
        if family_ids:
            match["_id"] = {"$in": [form for family_id in family_ids for form in hashes.forms(family_id)]}
        return match

    @guarded()
    async def rotate_family(self, family_id: str, refresh_hash: str, pair: Pair, now: datetime, *,
                            previous_access: tuple[str, datetime] | None = None) -> Family | None:
        pack = await self.connection.writing()
        replaced_hash, replaced_expiry = previous_access or (None, None)
        current = {} if replaced_hash is None else {"access_hash": replaced_hash}

        def rotate() -> Any:
            return self.families.find_one_and_update(
                FAMILIES.writable(family_id=family_id, refresh_hash=refresh_hash, **current, revoked_at=None,
                                  expires_at={"$gt": now}),
                {"$set": FAMILIES.fields(pack, **pair_fields(pair), previous_hash=refresh_hash, renewed_at=now,
                                         previous_access_hash=replaced_hash,
                                         previous_access_expires_at=replaced_expiry),
                 "$inc": {"rotations": 1}},
                return_document=ReturnDocument.AFTER)

        return FAMILIES.record(await self.credentials.write_one("families", family_id, rotate))

    @guarded()
    async def reissue_pair(self, family_id: str, refresh_hash: str, pair: Pair) -> Family | None:
        pack = await self.connection.writing()

        def reissue() -> Any:
            return self.families.find_one_and_update(
                FAMILIES.writable(family_id=family_id, refresh_hash=refresh_hash, access_used_at=None,
                                  revoked_at=None),
                {"$set": FAMILIES.fields(pack, **pair_fields(pair))}, return_document=ReturnDocument.AFTER)

        return FAMILIES.record(await self.credentials.write_one("families", family_id, reissue))

    @guarded()
    async def mark_access_used(self, family_id: str, access_hash: str, now: datetime) -> None:
        await self.credentials.write_one("families", family_id, lambda: self.families.update_one(
            FAMILIES.writable(family_id=family_id, access_hash=access_hash, access_used_at=None),
            {"$set": {"access_used_at": now}}))

    @guarded()
    async def mark_second_holder(self, family_id: str, now: datetime) -> bool:
        now = stored(now)
        result = await self.credentials.write_one("families", family_id, lambda: self.families.update_one(
            FAMILIES.writable(family_id=family_id, second_holder_at=None),
            {"$set": {"second_holder_at": now}}))
        if result.modified_count == 1:
            return True
        if not RUN_AGAIN.get():
            return False
        # Run again after a reply lost: the mark found set is this call's when it holds this
        # call's moment (another holder's would hold its own).
        with pymongo.timeout(self.connection.budget):  # a read: the server stops at the budget too
            family = await self.credentials.one("families", FAMILIES.match(family_id=family_id))
        return family is not None and as_utc(family.get("second_holder_at")) == now

    async def revoke_access(self, family_id: str, access_hash: str, now: datetime,
                            audience: list[str] | None = None) -> bool:
        # Revoked already: its mark stamped again when a write landed it late (stamps.py).
        if await self._revoke_access(family_id, access_hash, now, audience):
            return True
        await self.stamps.late("families", FAMILIES.match(family_id=family_id, access_hash=access_hash),
                               "access_revoked_at", now)
        return False

    @guarded(stamps=lambda self, family_id, access_hash, now, audience: (
        "families", FAMILIES.match(family_id=family_id, access_hash=access_hash), "access_revoked_at", now))
    async def _revoke_access(self, family_id: str, access_hash: str, now: datetime,
                             audience: list[str] | None) -> bool:
        result = await self.credentials.write_one("families", family_id, lambda: self.families.update_one(
            FAMILIES.writable(family_id=family_id, access_hash=access_hash, access_revoked_at=None),
            {"$set": {"access_revoked_at": now, "access_used_at": now, **marked(now, audience)}}))
        return result.modified_count == 1

    async def revoke_family(self, family_id: str, now: datetime, audience: list[str] | None = None) -> bool:
        # Revoked already: its mark stamped again when a write landed it late (stamps.py).
        if await self._revoke_family(family_id, now, audience):
            return True
        await self.stamps.late("families", FAMILIES.match(family_id=family_id), "revoked_at", now)
        return False

    @guarded(stamps=lambda self, family_id, now, audience: (
        "families", FAMILIES.match(family_id=family_id), "revoked_at", now))
    async def _revoke_family(self, family_id: str, now: datetime, audience: list[str] | None) -> bool:
        result = await self.credentials.write_one("families", family_id, lambda: self.families.update_one(
            FAMILIES.writable(family_id=family_id, revoked_at=None),
            {"$set": {"revoked_at": now, **marked(now, audience)}}))
        return result.modified_count == 1

    async def families_audience(self, *, grant_id: str | None = None, client_id: str | None = None,
                                user_id: str | None = None, now: datetime | None = None) -> list[str] | None:
        # The distinct audiences alone, on grant_live or client_revoked (their first key); a
        # user's families through their live grants (user_subject), since no index leads with a
        # family's user. A family that names none is one null among them. Live families alone:
        # unrevoked, their refresh token unexpired.
        if user_id is not None:
            grant_ids = await self._user_grant_ids(user_id)
            where: dict[str, Any] = {"grant_id": {"$in": grant_ids}}
        else:
            where = {"grant_id": grant_id} if grant_id is not None else {"client_id": client_id}
        together = await self._audiences({**where, "revoked_at": None,
                                          "expires_at": {"$gt": stored(now or datetime.now(UTC))}})
        if None in together:
            return None
        return sorted(resource for resource in together if isinstance(resource, str))

    @guarded()
    async def _user_grant_ids(self, user_id: str) -> list[str]:
        return [doc["_id"] for doc in await self.grants.find({"user_id": user_id, "revoked_at": None},
                                                              {"_id": 1}).to_list(None)]

    @guarded()
    async def _audiences(self, where: dict[str, Any]) -> list[str | None]:
        cursor = self.families.aggregate([
            {"$match": where},
            {"$project": {"_id": 0, "resource": {"$ifNull": ["$audience", [None]]}}},
            {"$unwind": "$resource"},
            {"$group": {"_id": "$resource"}},
        ])
        if inspect.isawaitable(cursor):  # PyMongo's aggregate is a coroutine; Motor-style ones are not
            cursor = await cursor
        return [doc["_id"] for doc in await cursor.to_list(None)]

    @guarded()
    async def list_families(self, grant_id: str) -> list[Family]:
        live = {"grant_id": grant_id, "revoked_at": None}
        documents = await self.credentials.listing("families", lambda: self.families.find(live).sort(
            [("created_at", ASCENDING), ("_id", ASCENDING)]).to_list(None))
        return [family for family in map(FAMILIES.record, documents) if family.revoked_at is None]

