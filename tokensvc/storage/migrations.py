"""Migrations: the rows of earlier formats rewritten, in bounded batches, beside live traffic.

A migration (declared in ``storage/format.py``, implemented here in :data:`STEPS`) passes over
its collections in ``_id`` order, one batch of :data:`BATCH` documents at a time, each batch
one store operation with its own budget and retries. After every batch it records where it
stands in the format document (``progress``), so a pass that stops (a crash, Ctrl+C, a lost
primary) resumes there; its rows-converted count is what ``tokensvc storage status`` and the
metric ``tokensvc_store_migration_rows`` show. Each row's conversion is idempotent and safe
beside live writes and beside another pass doing the same, so two ``tokensvc storage
migrate`` commands, or one beside the processes' background migration, only share the work.

A pass is started only once every running process writes what the migration's output is (the
compatibility version it runs from; :func:`wait_for_processes`, and the background's own
check): then no row of the old form can appear behind it. It ends
by counting what is left in the old form through the ``_id`` index; a row found there (written
by a process that had not yet followed the compatibility version) makes another pass.

While the service runs, the processes migrate in the background: one at a time (a lease in
the format document, renewed every batch), with a pause between batches, as soon as the
compatibility version allows a migration that is not done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pymongo import ASCENDING, ReturnDocument

from tokensvc.records import utcnow
from tokensvc.storage import format as store_format
from tokensvc.storage import hashes, processes
from tokensvc.storage.base import StorageError, StoreFault
from tokensvc.storage.mongo import READ, RERUN, MongoStore, guarded

log = logging.getLogger(__name__)

BATCH = 500  # documents per batch: one bounded operation
BACKGROUND_PAUSE_SECONDS = 0.05  # between the background's batches, so live traffic comes first
LEASE_SECONDS = 60  # a background migrator that stops renewing its lease leaves it to another after this


@dataclass(frozen=True, slots=True)
class Step:
    """How a migration rewrites one document: ``convert(db, collection, document) -> bool``
    (True when it rewrote it), over ``collections``; ``left`` is the filter, served by the
    ``_id`` index, of what still needs it (counted at the end of a pass)."""

    collections: tuple[str, ...]
    convert: Callable[[Any, str, dict[str, Any]], Awaitable[bool]]
    left: dict[str, Any]


async def _pack(db: Any, collection: str, document: dict[str, Any]) -> bool:
    """A code, session or family to format 2: moved to its packed key if it has the hex one,
    else its other hashes packed in place (unless a write changed them meanwhile)."""
    if hashes.in_format_2(collection, document):
        return False
    if isinstance(document["_id"], str):
        return await hashes.move(db, collection, document, utcnow())
    fields = {field: document.get(field) for field in hashes.HASHED[collection][1:]}
    result = await db[collection].update_one({"_id": document["_id"], **fields},
                                             {"$set": {field: hashes.packed(value) for field, value in fields.items()}})
    return bool(result.modified_count)


STEPS: dict[str, Step] = {
    store_format.PACKED_HASHES.name: Step(("codes", "sessions", "families"), _pack, {"_id": {"$type": "string"}}),
}

Progress = Callable[[str, str, int], None]  # (migration, collection, rows converted so far)


class NotYet(Exception):
    """A migration cannot run yet, or its pass cannot count yet: the message says why."""


@guarded(READ)
async def laggards(store: MongoStore, runs_from: int) -> list[processes.Seen]:
    """The running processes that do not write format ``runs_from`` yet."""
    return [seen for seen in await processes.running(store) if seen.writes is None or seen.writes < runs_from]


async def wait_for_processes(store: MongoStore, runs_from: int, seconds: float) -> None:
    """Wait (at most ``seconds``) until every running process writes format ``runs_from``."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        behind = await laggards(store, runs_from)
        if not behind:
            return
        if asyncio.get_running_loop().time() >= deadline:
            raise NotYet("these processes do not write format " + str(runs_from) + " yet: "
                         + ", ".join(f"{seen.name} at {seen.where}" for seen in behind)
                         + "; they follow the store within one heartbeat: try again, or stop them")
        await asyncio.sleep(0.2)


async def run(store: MongoStore, name: str, progress: Progress | None = None, pause: float = 0.0,
              still_mine: Callable[[], Awaitable[bool]] | None = None) -> int:
    """Run the migration ``name`` to its end (resuming where a pass stopped), record it done,
    and return the rows it converted. ``still_mine``: asked before converting each batch (the
    background's lease); False stops the pass where it is."""
    step = STEPS[name]
    state = await format_state(store)
    converted = int(state.progress.get(name, {}).get("rows", 0))
    while True:
        for collection, kind in _order(step, state.progress.get(name)):
            after = _resume(state.progress.get(name), collection, kind)
            while True:
                batch = await migration_batch(store, collection, kind, after)
                if not batch:
                    break
                if still_mine is not None and not await still_mine():
                    return converted
                converted += await migration_convert(store, step, collection, batch)
                after = batch[-1]["_id"]
                await migration_checkpoint(store, name, collection, kind, after, converted)
                if progress is not None:
                    progress(name, collection, converted)
                if pause:
                    await asyncio.sleep(pause)
        left = await migration_left(store, step)
        if not left:
            break
        log.warning("%s: %d rows still to convert after a pass (written meanwhile): another pass", name, left)
        state = await migration_restart(store, name, converted)
    await migration_done(store, name, converted)
    return converted


KINDS = ("string", "binData")  # a pass's two halves: the hex keys (moved), then the packed ones (checked)


def _order(step: Step, where: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The (collection, key kind) of a pass, from where it stood."""
    order = [(collection, kind) for collection in step.collections for kind in KINDS]
    if where is None or (where.get("collection"), where.get("kind")) not in order:
        return order
    return order[order.index((where["collection"], where["kind"])):]


def _resume(where: dict[str, Any] | None, collection: str, kind: str) -> Any:
    if where is not None and where.get("collection") == collection and where.get("kind") == kind:
        return where.get("after")
    return None


@guarded(READ)
async def format_state(store: MongoStore) -> store_format.StoreFormat:
    state = await store_format.read(store.db)
    if state is None:
        raise NotYet("the store has no format document yet: start tokensvc serve once")
    return state


@guarded(READ)
async def migration_batch(store: MongoStore, collection: str, kind: str, after: Any) -> list[dict[str, Any]]:
    key: dict[str, Any] = {"$type": kind}
    if after is not None:
        key["$gt"] = after
    cursor = store.db[collection].find({"_id": key}).sort("_id", ASCENDING).limit(BATCH)
    return await cursor.to_list(BATCH)


@guarded(RERUN)
async def migration_convert(store: MongoStore, step: Step, collection: str, batch: list[dict[str, Any]]) -> int:
    return sum([await step.convert(store.db, collection, document) for document in batch])


@guarded(RERUN)
async def migration_checkpoint(store: MongoStore, name: str, collection: str, kind: str, after: Any, rows: int) -> None:
    await store.db[store_format.COLLECTION].update_one({"_id": store_format.KEY}, {"$set": {f"progress.{name}": {
        "collection": collection, "kind": kind, "after": after, "rows": rows, "updated_at": utcnow()}}})


@guarded(READ)
async def migration_left(store: MongoStore, step: Step) -> int:
    return sum([await store.db[collection].count_documents(step.left) for collection in step.collections])


@guarded(RERUN)
async def migration_restart(store: MongoStore, name: str, rows: int) -> store_format.StoreFormat:
    await store.db[store_format.COLLECTION].update_one({"_id": store_format.KEY},
                                                       {"$set": {f"progress.{name}": {"rows": rows}}})
    return await format_state(store)


@guarded(RERUN)
async def migration_done(store: MongoStore, name: str, rows: int) -> None:
    await store.db[store_format.COLLECTION].update_one({"_id": store_format.KEY}, {
        "$set": {f"migrations.{name}": {"done_at": utcnow(), "rows": rows, "release": store.history.release}},
        "$unset": {f"progress.{name}": ""}})


# -- in the background of the running service ------------------------------------------------------


@guarded(RERUN)
async def migration_lease(store: MongoStore, owner: str) -> bool:
    """Take or renew the background migration's lease: one process migrates at a time."""
    now = utcnow()
    taken = await store.db[store_format.COLLECTION].find_one_and_update(
        {"_id": store_format.KEY, "$or": [{"lease": None}, {"lease.owner": owner}, {"lease.until": {"$lt": now}}]},
        {"$set": {"lease": {"owner": owner, "until": now + timedelta(seconds=LEASE_SECONDS)}}},
        projection={"_id": 1}, return_document=ReturnDocument.AFTER)
    return taken is not None


@guarded(RERUN)
async def migration_release(store: MongoStore, owner: str) -> None:
    await store.db[store_format.COLLECTION].update_one({"_id": store_format.KEY, "lease.owner": owner},
                                                       {"$set": {"lease": None}})


async def in_background(store: MongoStore, owner: str, every: float) -> None:
    """Until cancelled: every ``every`` seconds, run what the compatibility version allows and
    is not done, when every running process already writes its output and no other process
    holds the lease."""
    while True:
        await asyncio.sleep(every)
        for migration in store.history.runnable(store.format):
            try:
                if await laggards(store, migration.runs_from) or not await migration_lease(store, owner):
                    continue
                log.info("migrating in the background: %s", migration.summary)
                rows = await run(store, migration.name, pause=BACKGROUND_PAUSE_SECONDS,
                                 still_mine=lambda: migration_lease(store, owner))
                log.info("migration %s: %d rows converted", migration.name, rows)
                await migration_release(store, owner)
            except (StorageError, StoreFault, NotYet) as exc:
                log.warning("background migration %s interrupted (%s): it resumes there", migration.name, exc)
