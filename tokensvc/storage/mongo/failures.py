"""The MongoDB store's failure counts (:class:`MongoFailureCounts`, the Store contract's
:class:`~tokensvc.storage.base.FailureCounts`): one document per group in ``failures``, its
window ended by a TTL index, which every process sharing the store counts in (ratelimit)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from tokensvc.storage.base import FailureCounts, StorageError
from tokensvc.storage.mongo.connection import Connection
from tokensvc.storage.mongo.mapping import as_utc
from tokensvc.storage.mongo.retry import guarded


class MongoFailureCounts(FailureCounts):
    """The failed attempts' counts shared by the processes."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.failures = connection.db["failures"]

    @guarded()
    async def count_attempt(self, group: str, counters: list[str], window_seconds: int) -> tuple[list[int], float]:
        now = datetime.now(UTC)
        for _ in range(3):
            counted = await self.failures.find_one_and_update(
                {"_id": group, "expires_at": {"$gt": now}}, {"$inc": {f"c.{name}": 1 for name in counters}},
                return_document=ReturnDocument.AFTER)
            if counted is not None:
                return [counted["c"][name] for name in counters], (as_utc(counted["expires_at"]) - now).total_seconds()
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
        return [found["c"].get(name, 0) for name in counters], (as_utc(found["expires_at"]) - now).total_seconds()

