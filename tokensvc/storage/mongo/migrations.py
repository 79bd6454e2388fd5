"""Migrations: the rows of earlier formats rewritten, in bounded batches, beside live traffic.

A migration (declared in ``storage/mongo/format.py``, implemented here in :data:`STEPS`) passes over
its collections in ``_id`` order. Each document's conversion is one store operation, with its
own budget (``storage.timeout_ms``) and retries: a slow server slows the pass, it does not cut
a batch of moves in half. A batch ends after :data:`BATCH` documents or :data:`BATCH_SECONDS`,
whichever comes first; after each one the pass records where it stands in the format document
(``progress``: the collection, and a lower bound of the last key, never the key itself, which is
a hash) and adds the rows it converted to the store-wide count (``$inc``: passes running at once
add up, none overwrites another's; a row is counted by the pass that deleted its original, so a
row a request moved itself, or one whose move's reply was lost, may go uncounted, and none is
counted twice). A pass that stops (a crash, Ctrl+C, a lost primary) resumes
there; the count is what ``tokensvc storage status`` and the metric
``tokensvc_store_migration_rows`` show. Each row's conversion is idempotent and safe beside live
writes and beside another pass doing the same, so two ``tokensvc storage migrate`` commands, or
one beside the processes' background migration, only share the work; a pass that finds the
migration recorded done by another stops there.

A pass is started only once every running process writes what the migration's output is (the
compatibility version it runs from; :func:`wait_for_processes`, and the background's own
check): then no row of the old form can appear behind it. It ends by counting what is left in
the old form through the ``_id`` index; a row found there (written by a process that had not yet
followed the compatibility version) makes another pass.

While the service runs, the processes migrate in the background: one at a time (a lease in
the format document, renewed every batch), with a pause between batches, as soon as the
compatibility version allows a migration that is not done. A done migration is not taken on
trust: every heartbeat each process counts the rows still in the old form (through the ``_id``
index), and rows found there (a release that cannot read the store wrote them: 0.9.0 started
against the rules) are reported (a warning and ``tokensvc_store_old_format_rows``) and
converted. So are the connections of such a release (``tokensvc_store_old_release_connections``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from pymongo import ASCENDING, ReturnDocument

from tokensvc.records import utcnow
from tokensvc.storage.base import StorageError, StoreFault
from tokensvc.storage.mongo import format as store_format
from tokensvc.storage.mongo import hashes, processes
from tokensvc.storage.mongo.connection import Connection
from tokensvc.storage.mongo.indexes import Indexes
from tokensvc.storage.mongo.retry import ONCE, READ, RERUN, guarded

log = logging.getLogger(__name__)

BATCH = 500  # documents per batch at most
BATCH_SECONDS = 5.0  # and at most this long: progress, checkpoints and the lease's renewal come this often
BACKGROUND_PAUSE_SECONDS = 0.05  # between the background's batches, so live traffic comes first
LEASE_SECONDS = 60  # a background migrator that stops renewing its lease leaves it to another after this


class Maintained(Protocol):
    """What a migration runs on: the MongoDB store (or its lifecycle, which runs the background's
    migrations), as its connection and its indexes."""

    @property
    def connection(self) -> Connection: ...

    @property
    def indexes(self) -> Indexes: ...


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

Progress = Callable[[str, str, int], None]  # (migration, collection, rows converted so far, store-wide)


class NotYet(Exception):
    """A migration cannot run yet, or its pass cannot count yet: the message says why."""


class Stopped(Exception):
    """A pass stopped before its end (the store did not answer within one document's budget):
    what it had done is recorded, and the next pass resumes there."""

    def __init__(self, name: str, rows: int, cause: Exception) -> None:
        super().__init__(f"migration {name} stopped with {rows} rows converted store-wide ({cause}); it resumes "
                         "where it stood: run tokensvc storage migrate (the running service also resumes it in "
                         "the background)")
        self.rows = rows


@guarded(READ)
async def laggards(store: Maintained, runs_from: int) -> list[processes.Seen]:
    """The running processes that do not write format ``runs_from`` yet, leaving out those
    whose heartbeat has lapsed twice: dead, or cut off from the store."""
    return [seen for seen in await processes.running(store.connection)
            if (seen.writes is None or seen.writes < runs_from) and not seen.lapsed()]


async def wait_for_processes(store: Maintained, runs_from: int, seconds: float) -> None:
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


async def run(store: Maintained, name: str, progress: Progress | None = None, pause: float = 0.0,
              still_mine: Callable[[], Awaitable[bool]] | None = None) -> int:
    """Run the migration ``name`` to its end (resuming where a pass stopped), record it done,
    and return the rows it has converted, store-wide (every pass's). ``still_mine``: asked
    before converting each batch (the background's lease); False stops the pass where it is.
    On a migration recorded done, a pass converts what is left in the old form (rows written
    since by a release that should not run), counted in the done record. :class:`Stopped`
    when the store fails."""
    step = STEPS[name]
    state = await format_state(store)
    again = state.done(name)
    where = None if again else state.progress.get(name)
    kinds = KINDS[:1] if again else KINDS  # what is left after a done migration has a hex key
    total = int(((state.migrations if again else state.progress).get(name) or {}).get("rows", 0))
    while True:
        for collection, kind in _order(step, kinds, where):
            after = _resume(where, collection, kind)
            while True:
                batch = await migration_batch(store, collection, kind, after)
                if not batch:
                    break
                if still_mine is not None and not await still_mine():
                    return total
                moved, last, failed = await _convert(store, step, collection, batch)
                if last is not None:
                    try:
                        recorded = await migration_checkpoint(store, name, collection, kind, last, moved, again)
                    except StorageError as exc:
                        raise Stopped(name, total, failed or exc) from None
                    if recorded is None:  # another pass recorded it done meanwhile: this one stops
                        return int((await format_state(store)).migrations[name].get("rows", 0))
                    if recorded != total and progress is not None:
                        progress(name, collection, recorded)
                    total = recorded
                    after = {"$gt": last}
                if failed is not None:
                    raise Stopped(name, total, failed) from None
                if pause:
                    await asyncio.sleep(pause)
        left = await migration_left(store, step)
        if not left:
            break
        log.warning("%s: %d rows still to convert after a pass (written meanwhile): another pass", name, left)
        where = None
    return total if again else await migration_done(store, name)


KINDS = ("string", "binData")  # a pass's two halves: the hex keys (moved), then the packed ones (checked)


def _order(step: Step, kinds: tuple[str, ...], where: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The (collection, key kind) of a pass, from where it stood."""
    order = [(collection, kind) for collection in step.collections for kind in kinds]
    if where is None or (where.get("collection"), where.get("kind")) not in order:
        return order
    return order[order.index((where["collection"], where["kind"])):]


def _resume(where: dict[str, Any] | None, collection: str, kind: str) -> dict[str, Any] | None:
    """Where a pass resumes in (collection, kind): from the recorded bound on."""
    if where is not None and where.get("collection") == collection and where.get("kind") == kind \
            and where.get("after") is not None:
        return {"$gte": where["after"]}
    return None


def lower_bound(key: Any) -> Any:
    """What the progress record keeps of the last key converted: a bound at or below it that
    is not the key (a hash of a secret), so a resumed pass re-reads a few converted rows at
    most. A hex key's first 8 characters; a packed one's first 4 bytes, then zeros (MongoDB
    orders binary keys by length first)."""
    if isinstance(key, bytes):
        return key[:4] + bytes(max(0, len(key) - 4))
    return key[:8] if isinstance(key, str) else key


async def _convert(store: Maintained, step: Step, collection: str,
                   batch: list[dict[str, Any]]) -> tuple[int, Any, Exception | None]:
    """Convert a batch's documents one at a time, each its own store operation, for at most
    :data:`BATCH_SECONDS`: (rows this call converted, the last key done, what stopped it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BATCH_SECONDS
    moved, last = 0, None
    for document in batch:
        try:
            moved += await migration_convert(store, step, collection, document)
        except (StorageError, StoreFault) as exc:
            return moved, last, exc
        last = document["_id"]
        if loop.time() >= deadline:
            break
    return moved, last, None


@guarded(READ)
async def format_state(store: Maintained) -> store_format.StoreFormat:
    state = await store_format.read(store.connection.db)
    if state is None:
        raise NotYet("the store has no format document yet: start tokensvc serve once")
    return state


@guarded(READ)
async def migration_batch(store: Maintained, collection: str, kind: str,
                          after: dict[str, Any] | None) -> list[dict[str, Any]]:
    documents = store.connection.db[collection]
    cursor = documents.find({"_id": {"$type": kind, **(after or {})}}).sort("_id", ASCENDING).limit(BATCH)
    return await cursor.to_list(BATCH)


@guarded(RERUN)
async def migration_convert(store: Maintained, step: Step, collection: str, document: dict[str, Any]) -> bool:
    """One document's conversion: its own budget and retries (it is idempotent)."""
    return await step.convert(store.connection.db, collection, document)


@guarded(ONCE)
async def migration_checkpoint(store: Maintained, name: str, collection: str, kind: str, last: Any, rows: int,
                               again: bool) -> int | None:
    """Record where the pass stands and add ``rows`` to the store-wide count (once: ``$inc``
    under the driver's deduplicated retry, never run again by the store); the count, or None
    when the migration was recorded done meanwhile (the pass stops: another finished it)."""
    meta = store.connection.db[store_format.COLLECTION]
    if again:
        found = await meta.find_one_and_update({"_id": store_format.KEY}, {"$inc": {f"migrations.{name}.rows": rows}},
                                               projection={"migrations": 1}, return_document=ReturnDocument.AFTER)
        return int(found["migrations"][name]["rows"])
    found = await meta.find_one_and_update(
        {"_id": store_format.KEY, f"migrations.{name}": {"$exists": False}},
        {"$set": {f"progress.{name}.collection": collection, f"progress.{name}.kind": kind,
                  f"progress.{name}.after": lower_bound(last), f"progress.{name}.updated_at": utcnow()},
         "$inc": {f"progress.{name}.rows": rows}},
        projection={"progress": 1}, return_document=ReturnDocument.AFTER)
    return None if found is None else int(found["progress"][name]["rows"])


@guarded(READ)
async def migration_left(store: Maintained, step: Step) -> int:
    return sum([await store.connection.db[collection].count_documents(step.left) for collection in step.collections])


@guarded(RERUN)
async def migration_done(store: Maintained, name: str) -> int:
    """Record the migration done, with the store-wide count, once (a second pass that gets
    here finds it recorded, and changes nothing); the count."""
    state = await store_format.read(store.connection.db)
    rows = int(((state.progress if state else {}).get(name) or {}).get("rows", 0))
    release = store.connection.history.release
    await store.connection.db[store_format.COLLECTION].update_one(
        {"_id": store_format.KEY, f"migrations.{name}": {"$exists": False}},
        {"$set": {f"migrations.{name}": {"done_at": utcnow(), "rows": rows, "release": release}},
         "$unset": {f"progress.{name}": ""}})
    return int((await format_state(store)).migrations[name].get("rows", 0))


# -- in the background of the running service ------------------------------------------------------


@guarded(RERUN)
async def migration_lease(store: Maintained, owner: str) -> bool:
    """Take or renew the background migration's lease: one process migrates at a time."""
    now = utcnow()
    taken = await store.connection.db[store_format.COLLECTION].find_one_and_update(
        {"_id": store_format.KEY, "$or": [{"lease": None}, {"lease.owner": owner}, {"lease.until": {"$lt": now}}]},
        {"$set": {"lease": {"owner": owner, "until": now + timedelta(seconds=LEASE_SECONDS)}}},
        projection={"_id": 1}, return_document=ReturnDocument.AFTER)
    return taken is not None


@guarded(RERUN)
async def migration_release(store: Maintained, owner: str) -> None:
    await store.connection.db[store_format.COLLECTION].update_one({"_id": store_format.KEY, "lease.owner": owner},
                                                       {"$set": {"lease": None}})


async def in_background(store: Maintained, owner: str, every: float) -> None:
    """Until cancelled: every ``every`` seconds, look for what a release that cannot read the
    store leaves behind (:func:`watch`), and run what the compatibility version allows and is
    not done, or the rows of the old form behind a done migration, when every running process
    already writes its output and no other process holds the lease."""
    while True:
        await asyncio.sleep(every)
        state = store.connection.format
        for migration in store.connection.history.migrations:
            if migration.runs_from > state.compatibility:
                continue
            try:
                if state.done(migration.name) and not await _written_behind(store, migration):
                    continue
                if await laggards(store, migration.runs_from) or not await migration_lease(store, owner):
                    continue
                log.info("migrating in the background: %s", migration.summary)
                rows = await run(store, migration.name, pause=BACKGROUND_PAUSE_SECONDS,
                                 still_mine=lambda: migration_lease(store, owner))
                log.info("migration %s done: %d rows converted, store-wide", migration.name, rows)
                await migration_release(store, owner)
            except (StorageError, StoreFault, NotYet, Stopped) as exc:
                log.warning("background migration %s interrupted (%s): it resumes there", migration.name, exc)
        try:
            await watch(store)
        except (StorageError, StoreFault) as exc:
            log.warning("could not look for processes of releases that cannot read the store (%s)", exc)


async def _written_behind(store: Maintained, migration: store_format.Migration) -> int:
    """Rows still in the old form behind the done migration ``migration`` (0 when none): a
    release that cannot read the store wrote them since. Reported, and converted next."""
    left = await migration_left(store, STEPS[migration.name])
    store.connection.observer.old_format_rows(left)
    if left:
        log.warning("%d rows of an older format were written after migration %s was done: a process of a release "
                    "that cannot read this store (0.9.0) is writing to it; find it and stop it (tokensvc storage "
                    "status). They are converted now", left, migration.name)
    return left


async def watch(store: Maintained) -> None:
    """Report the connections of releases that cannot read the store's compatibility version
    (0.9.0 after finalize): a warning each time, and the metric. Nothing to look for before a
    finalize, when every release that may connect reads it."""
    if store.connection.format.compatibility <= store_format.FORMATS[0].version:
        return
    made_again = await indexes_followed(store)
    if made_again:
        log.warning("index %s was made again since finalize, by a process of a release that cannot read this store "
                    "(0.9.0, started with its tripwire dropped): dropped again, and the tripwire made; find that "
                    "process and stop it", ", ".join(made_again))
    found = await old_releases(store)
    if found is None:
        return
    store.connection.observer.old_release_connections(len(found))
    if found:
        log.warning("tokensvc %s is connected from %s, and cannot read this store (its compatibility version is %d): "
                    "it answers every credential issued since as unknown, and what it writes is at odds with "
                    "every other process: stop it", found[0].name, ", ".join(sorted({seen.where for seen in found})),
                    store.connection.format.compatibility)


@guarded(RERUN)
async def indexes_followed(store: Maintained) -> list[str]:
    return await store.indexes.follow()


@guarded(READ)
async def old_releases(store: Maintained) -> list[processes.Seen] | None:
    """The connections of releases that cannot read the store's compatibility version; None
    when the server does not say."""
    connections = await processes.connected(store.connection, quiet=True)
    if connections is None:
        return None
    return [seen for seen in connections if seen.reads < store.connection.format.compatibility]
