"""The credentials of the MongoDB store: authorization codes, token families and web sessions,
each keyed by a hash of its secret and found in either format of the hash (hashes.py). How
one is read, written and listed while a document may be moving to its packed key, and what a
sweep of them revoked (:class:`Credentials`, which the authorizations and the sessions share)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pymongo

from tokensvc.storage.mongo import format as store_format
from tokensvc.storage.mongo import hashes
from tokensvc.storage.mongo.connection import Connection
from tokensvc.storage.mongo.retry import RUN_AGAIN

R = TypeVar("R")

KINDS = ("codes", "families", "sessions")  # the collections of the credentials


def missed(result: Any) -> bool:
    """Whether a single-document write changed nothing (None, or no match)."""
    return result is None or getattr(result, "matched_count", 1) == 0


class Credentials:
    """The credentials' collections on the store's connection: each call here runs within an
    operation of the store (``retry.guarded``), in its session and budget."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.collections = {name: connection.db[name] for name in KINDS}

    async def one(self, collection: str, match: dict[str, Any]) -> dict[str, Any] | None:
        """The document of one credential, never a frozen original on its own (hashes.settled)."""
        found = self.collections[collection].find
        return hashes.merged(collection, await hashes.settled(self.connection.db, collection,
                                                              lambda: found(match).limit(2).to_list(2)))

    async def write_one(self, collection: str, key: str, write: Callable[[], Coroutine[Any, Any, R]]) -> R:
        """A single-document write on the credential keyed by ``key`` (its filter skips a frozen
        document): one that found nothing because its document is being moved finishes the
        move, and runs again on the copy."""
        result = await write()
        if missed(result):
            with pymongo.timeout(self.connection.budget):  # a read: the server stops at the budget too
                frozen = await self.collections[collection].find_one(hashes.frozen(key))
            if frozen is not None:
                await hashes.finish(self.connection.db, collection, frozen)
                result = await write()
        return result

    async def listing(self, collection: str,
                      read: Callable[[], Awaitable[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
        """A listing's documents, one per credential, none of them a frozen original: one the
        listing met, or the original of a copy it met (while the conversion to packed hashes
        runs, a sweep may have revoked an original whose copy the listing's filter took as
        live), has its move finished and the listing is read again (hashes.settled). Nothing
        to look for before the conversion starts (the compatibility version below it) or once
        it is done."""
        state = self.connection.format

        async def with_originals() -> list[dict[str, Any]]:
            documents = await read()
            if state.compatibility >= hashes.PACKED_FROM and not state.done(store_format.PACKED_HASHES.name):
                copies = [hashes.unpacked(doc["_id"]) for doc in documents if isinstance(doc["_id"], bytes)]
                if copies:
                    documents = documents + await self.collections[collection].find(
                        {"_id": {"$in": copies}, hashes.MOVING: {"$ne": None}}).to_list(None)
            return documents

        return hashes.merged_all(collection, await hashes.settled(self.connection.db, collection, with_originals))

    async def swept(self, result: Any, collection: str, match: dict[str, Any]) -> int:
        """What a sweep revoked. Run again after an attempt that failed (a reply lost after the
        server applied it), its own ``modified_count`` says 0 and the announcement of what it
        revoked would be skipped: then it is what the store holds revoked at the sweep's ``now``."""
        if not RUN_AGAIN.get():
            return int(result.modified_count)
        with pymongo.timeout(self.connection.budget):  # a read: the server stops at the budget too
            return int(await self.collections[collection].count_documents(match))
