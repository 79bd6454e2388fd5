"""How the MongoDB store holds a hash of a secret, in either of its formats, and how one
credential's document moves from the first to the second beside live traffic.

Records hold a SHA-256 digest as 64 hex characters. Store format 1 (release 0.9.0) stores it
so; format 2 stores its 32 bytes (:func:`packed`), half the size in the document and in every
index on it. The hashes are the key (``_id``) of codes, sessions and families, and the fields
:data:`HASHED` names. Until every format-1 row is gone, lookups find a hash in either form
(:func:`either`), and what a process writes follows the store's compatibility version
(``storage/mongo/format.py``).

**Moving a document.** A key cannot change in place (``_id`` is immutable), so a format-1
document becomes format 2 as a copy under its packed key, and the original goes. Without a
multi-document transaction (a standalone server has none) that takes care:

1. the original is *frozen* (:data:`MOVING` set, atomically, with every hash it holds as hex,
   so its copy takes no unique key of it). No single-document write of the store changes a
   frozen document: each one's filter skips it, and one that found nothing because of it
   finishes the move first (:func:`finish`) and runs again, on the copy;
2. the copy is inserted, never over a copy already there (which may have been written since);
3. the original is deleted, on the condition that it is as the mover last saw it. What can
   still change a frozen document is a sweep (a revocation's ``update_many``, or a narrowed
   client's withdrawal of scopes), and only the fields of :data:`SWEPT`, from unset to set, and
   ``scopes`` (of :data:`NARROWED`), to fewer: before deleting, the mover hands each of them to
   the copy, and a delete that misses because a sweep came meanwhile reads the original again.

A frozen original is never an answer on its own: once its copy exists, writes land on the copy
only (a rotation, a revocation), while the original still holds the hashes it had when it was
frozen, so a lookup by a rotated-out access token would find the original alone and take it for
live. A read that meets a frozen document finishes its move (the copy gets any revocation the
original alone carries, and loses any scope it lost) and reads again (:func:`settled`), whatever
field it looked up by. Anyone may finish a move (the migration, another one running beside it,
or a request that met a frozen document): every step is idempotent, so a mover that dies
half-way (Ctrl+C, ``kill -9``, its budget running out) leaves nothing a later one cannot
complete.

**Twins.** A family's key is derived from its code and verifier, so a code redeemed twice
writes the same key twice: the key's uniqueness is what makes the second redemption fail. With
two formats the two keys differ, so every family written while the conversion is unfinished
also holds its id's 32 bytes in :data:`GUARD`, under a unique index: two redemptions in
different formats at once collide there (``MongoAuthorizations.create_family`` also looks for
the other format's key before writing, for families written without the guard: by 0.9.0). A twin that
exists anyway (a process of 0.9.0 started against the rules) is never deleted silently: a move
that meets one revokes both, as a code used twice, and a read that finds both takes them as
revoked (:func:`merged`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from tokensvc.storage.base import StorageError

log = logging.getLogger(__name__)

_DIGEST = re.compile(r"[0-9a-f]{64}")
PACKED_FROM = 2  # the store format from which hashes are written packed

# The hash fields of each collection's documents, the key first.
HASHED: dict[str, tuple[str, ...]] = {
    "codes": ("_id", "family_id"),
    "families": ("_id", "refresh_hash", "access_hash", "previous_hash", "previous_access_hash"),
    "sessions": ("_id",),
}
# The fields a sweep (``update_many``) sets, from null to a time: the only change a frozen
# document may still take.
SWEPT: dict[str, tuple[str, ...]] = {"codes": (), "families": ("revoked_at",), "sessions": ("ended_at",)}
# The collections whose ``scopes`` a sweep may narrow (``withdraw_scopes``): never widened.
NARROWED = frozenset({"codes", "families"})
MOVING = "_moving"  # set on a frozen original: when its move began
# A family's id as its 32 bytes, whatever its key's format: unique (the index family_key), so one
# family per id while keys of both formats are written. Never on a copy (its original holds it).
GUARD = "family_key"
ATTEMPTS = 8  # reads or moves that keep meeting live writes give up after this many, for the next try
NOT_FROZEN: dict[str, Any] = {MOVING: None}  # in the filter of every single-document write


def is_digest(value: Any) -> bool:
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def packed(value: Any) -> Any:
    """A SHA-256 hex digest as its 32 bytes (format 2); anything else as given."""
    return bytes.fromhex(value) if is_digest(value) else value


def unpacked(value: Any) -> Any:
    """A hash as the records hold it (hex), from either format."""
    return value.hex() if isinstance(value, bytes) else value


def forms(value: Any) -> list[Any]:
    """The values the hash ``value`` (hex) may be stored as: packed and hex."""
    return [bytes.fromhex(value), value] if is_digest(value) else [value]


def either(value: Any) -> Any:
    """A filter value that finds the hash ``value`` (hex) stored in either format."""
    return {"$in": [bytes.fromhex(value), value]} if is_digest(value) else value


def merged(collection: str, documents: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The one document of a credential among what a lookup found (:func:`settled`: none of
    them frozen). Two are twins, a family written in each format: the packed one, revoked (a
    code used twice revokes what it was exchanged for), with every revocation either carries
    and only the scopes both hold."""
    if len(documents) < 2:
        return documents[0] if documents else None
    live = min(documents, key=lambda doc: (doc.get(MOVING) is not None, not isinstance(doc["_id"], bytes)))
    for other in documents:
        for field in SWEPT[collection]:
            if live.get(field) is None and other.get(field) is not None:
                live[field] = other[field]
        if collection in NARROWED:
            live["scopes"] = [scope for scope in live.get("scopes") or [] if scope in (other.get("scopes") or [])]
    if collection == "families" and sum(doc.get(MOVING) is None for doc in documents) > 1 \
            and live.get("revoked_at") is None:
        live["revoked_at"] = max(doc["created_at"] for doc in documents)
    return live


def merged_all(collection: str, documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A listing's documents, one per credential (:func:`merged`), in the order first seen."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for document in documents:
        groups.setdefault(unpacked(document["_id"]), []).append(document)
    return [merged(collection, group) for group in groups.values()]  # type: ignore[misc]


def in_format_2(collection: str, document: dict[str, Any]) -> bool:
    """Whether every hash the document holds is packed."""
    return not any(is_digest(document.get(field)) for field in HASHED[collection])


async def move(db: Any, collection: str, document: dict[str, Any], now: datetime) -> bool:
    """Move a document whose key is still hex (``document`` as a pass read it) to its packed
    key: True when this call moved it, False when it was gone or another mover (or a request
    that met it) completed the move. Safe beside live writes and beside other movers."""
    source = db[collection]
    key = document["_id"]
    for _ in range(ATTEMPTS):  # each retry follows a live write that came between the read and the freeze
        if document.get(MOVING) is not None:
            return await finish(db, collection, document)
        held = {field: document.get(field) for field in HASHED[collection][1:]}
        frozen = await source.find_one_and_update(
            {"_id": key, **NOT_FROZEN, **held},
            {"$set": {MOVING: now, **{field: unpacked(value) for field, value in held.items()}}},
            return_document=ReturnDocument.AFTER)
        if frozen is not None:
            return await finish(db, collection, frozen)
        document = await source.find_one({"_id": key})
        if document is None:
            return False
    # Never the key in a message: it is a hash of a secret.
    raise StorageError(f"a document of {collection} changed under each of {ATTEMPTS} attempts to move it; "
                       "the next pass moves it")


async def finish(db: Any, collection: str, frozen: dict[str, Any]) -> bool:
    """Complete the move of the frozen document ``frozen``: its copy made if none is, the
    revocations it carries handed on, and it deleted once no sweep has changed it since. True
    when this call deleted it. A document already under the packed key that is not its copy
    (a twin) is not taken for one: both are revoked."""
    source = db[collection]
    copy = {field: value for field, value in frozen.items() if field not in (MOVING, GUARD)}
    for field in HASHED[collection]:
        copy[field] = packed(copy.get(field))
    try:
        await source.insert_one(copy)
    except DuplicateKeyError:  # made already by another mover, and live since: kept; unless a twin
        there = await source.find_one({"_id": copy["_id"]})
        if there is None:  # another unique key: the original stays, and says nothing of it (a hash)
            raise StorageError(f"the copy of a document of {collection} collides with another document on a "
                               "unique index: it stays in format 1") from None
        if _twins(collection, frozen, there):
            await _revoke_twins(source, frozen, copy["_id"])
            frozen = await source.find_one({"_id": frozen["_id"]}) or frozen
    while True:
        for field in SWEPT[collection]:
            if frozen.get(field) is not None:
                await source.update_one({"_id": copy["_id"], field: None}, {"$set": {field: frozen[field]}})
        unchanged = {field: frozen.get(field) for field in SWEPT[collection]}
        if collection in NARROWED:  # what the original lost, the copy loses (it only ever narrows since)
            await source.update_one({"_id": copy["_id"]}, {"$pull": {"scopes": {"$nin": frozen.get("scopes") or []}}})
            unchanged["scopes"] = frozen.get("scopes")
        gone = await source.delete_one({"_id": frozen["_id"], MOVING: frozen[MOVING], **unchanged})
        if gone.deleted_count:
            return True
        again = await source.find_one({"_id": frozen["_id"]})
        if again is None or again.get(MOVING) is None:
            return False  # deleted by another mover (or by expiry)
        frozen = again


def _twins(collection: str, original: dict[str, Any], there: dict[str, Any]) -> bool:
    """Whether ``there``, under the packed key of ``original``, was written on its own rather
    than copied from it: a copy has its original's creation time and never the guard."""
    return collection == "families" and (there.get(GUARD) is not None
                                         or there.get("created_at") != original.get("created_at"))


async def _revoke_twins(source: Any, original: dict[str, Any], key: bytes) -> None:
    now = datetime.now(UTC)
    await source.update_one({"_id": key, "revoked_at": None}, {"$set": {"revoked_at": now}})
    # A frozen original takes a sweep's field only: the revocation is that.
    await source.update_many({"_id": original["_id"], "revoked_at": None}, {"$set": {"revoked_at": now}})
    log.warning("a token family was written twice, once in each format (its code redeemed twice, by a process "
                "of a release that does not write the guard): both revoked, as a code used twice")


async def settled(db: Any, collection: str,
                  read: Callable[[], Awaitable[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """What ``read`` finds once none of it is frozen: each frozen document met has its move
    finished (as the collection holds it), and the read runs again, on the copies. A frozen
    original is never an answer: its copy may have been rotated or revoked since."""
    for _ in range(ATTEMPTS):
        documents = await read()
        met = [document["_id"] for document in documents if document.get(MOVING) is not None]
        if not met:
            return documents
        for key in met:
            original = await db[collection].find_one(frozen(key))
            if original is not None:
                await finish(db, collection, original)
    raise StorageError(f"a read of {collection} met documents being moved on each of {ATTEMPTS} attempts: try again")


def frozen(key: str) -> dict[str, Any]:
    """The filter of the document keyed by ``key`` (hex) if it is frozen: after a
    single-document write found nothing, whether that is because its move is under way (then
    :func:`finish` it, and write again, on the copy)."""
    return {"_id": key, MOVING: {"$ne": None}}
