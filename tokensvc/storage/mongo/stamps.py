"""Revocation marks that landed late, stamped again (:class:`Stamps`).

A polling relay (feed.py) reads back the store's budget and the clocks' skew before its last
poll (``poll_overlap``), so it hears a mark whose time is at most that old when it lands. A write
the store stopped waiting for (its budget ran out: 503) is never cancelled (calls.py): the server
may still apply it, later than that, with the time read before it. Two things stamp such a mark
again with the time of a new write, so that every relay hears it:

* the store itself, when the driver's call it stopped waiting for ends (:meth:`Stamps.later`,
  from ``retry.guarded``'s ``stamps``): the mark this call wrote, if it is still the one there;
* a revocation asked again (the client's retry after its 503) that finds the mark there already
  and older than a poll reads back (:meth:`Stamps.late`): whichever write put it there.

Neither reaches a mark older than :data:`LATE` (a revocation of long ago re-presented), nor one
written with another time: the time is a mark's alone, nothing else reads it as the moment of
the revocation to within seconds."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

from tokensvc.records import utcnow
from tokensvc.storage.mongo.connection import Connection
from tokensvc.storage.mongo.feed import CLOCK_SKEW
from tokensvc.storage.mongo.retry import guarded

log = logging.getLogger(__name__)

# How far back a revocation asked again looks for a mark that landed late: well beyond any
# write's budget and the driver's own timeouts, well short of a revocation of long ago.
LATE = timedelta(minutes=10)

# Where a write stamps its mark: (collection, the filter of its documents, the field, its time).
Stamped = tuple[str, dict[str, Any], str, datetime]


class Stamps:
    """Marks stamped again on the store's connection (a part of the store)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        # How far back a poll reads (feed.poll_overlap): the budget and the clocks' skew.
        self.overlap = timedelta(seconds=connection.budget) + CLOCK_SKEW
        self._pending: set[asyncio.Task[Any]] = set()
        connection.restamp_later = self.later

    def later(self, stamped: Stamped) -> None:
        """The driver's call of a write the store stopped waiting for ended: the mark it wrote,
        if that is still the one there, stamped with the time now (in the background; a failure
        is logged, the mark is as it was)."""
        task = asyncio.get_running_loop().create_task(self._again(stamped))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _again(self, stamped: Stamped) -> None:
        collection, match, field, at = stamped
        try:
            if await self._restamp(collection, match, field, at):
                log.info("a revocation written after its request was answered (503) was stamped again")
        except Exception as exc:  # the store away again: the client's retry stamps it (late)
            log.warning("could not stamp again a revocation written late: %s", exc)

    @guarded()
    async def _restamp(self, collection: str, match: dict[str, Any], field: str, at: datetime) -> int:
        result = await self.connection.db[collection].update_many({**match, field: at}, {"$set": {field: utcnow()}})
        return int(result.modified_count)

    async def late(self, collection: str, match: dict[str, Any], field: str, now: datetime) -> int:
        """A revocation asked again at ``now`` found its mark there already: stamp it ``now`` when
        it is older than a poll reads back, and not older than :data:`LATE`; how many were."""
        return await self._restamp_late(collection, match, field, now)

    @guarded()
    async def _restamp_late(self, collection: str, match: dict[str, Any], field: str, now: datetime) -> int:
        result = await self.connection.db[collection].update_many(
            {**match, field: {"$lt": now - self.overlap, "$gte": now - LATE}}, {"$set": {field: now}})
        return int(result.modified_count)
