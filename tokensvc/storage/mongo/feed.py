"""The revocation feed of the MongoDB store: a change stream on the watched collections, resumed
where it left off, or, where the deployment has none, polling their revocation fields.

Each mark is written with its audience, in the same write (:func:`marked`): the field
``mark_audience`` holds the resources the tokens it may touch are meant for (``audience``, a
list; null: every reader) and the time of the mark it goes with (``at``). A relay reads it with the
mark, from the change stream (the update set both) or the document a poll reads, and hands it on
with the revocation, so that every process's revocation feed tells the resource servers it
concerns alone. A mark whose audience is missing, or whose ``at`` is not the mark's time (the
previous release, which knows nothing of it, wrote the mark; a re-stamp, stamps.py, wrote it
again), is heard as every reader's: a revocation missed is a hole, one heard too often a
disclosure only."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import pymongo
from pymongo.errors import OperationFailure, PyMongoError

from tokensvc.storage.base import (
    CLIENT,
    CLIENT_MARKS,
    FAMILY,
    GRANT,
    SESSION,
    SUBJECT,
    Revocation,
    StorageError,
)
from tokensvc.storage.base import MARK_AUDIENCE as BASE_MARK_AUDIENCE
from tokensvc.storage.mongo import hashes
from tokensvc.storage.mongo.calls import Elected, Left
from tokensvc.storage.mongo.mapping import as_utc as _utc
from tokensvc.storage.mongo.retry import guarded, translate

if TYPE_CHECKING:
    from tokensvc.storage.mongo.connection import Connection

log = logging.getLogger(__name__)

# The collections whose writes are revocations: the fields that, set to a time (by an update,
# or in a document inserted with it), revoke something, and what each names.
WATCHED: dict[str, dict[str, str]] = {
    "families": {"revoked_at": FAMILY, "access_revoked_at": FAMILY},
    "grants": {"revoked_at": GRANT},
    "sessions": {"ended_at": SESSION},
    # Some of what its tokens may do withdrawn (CLIENT); what its feed readers proved (CREDENTIALS).
    "clients": {field: kind for kind, field in CLIENT_MARKS.items()},
    "users": {"narrowed_at": SUBJECT},  # some of what the user's tokens may do: demoted, or being removed
    # A client's removal, marked once it is recorded (mark_removal): the client's document is
    # deleted moments later, the mark is kept a day.
    "removed_clients": {"removed_at": CLIENT},
}
# The one collection whose inserted documents are revocations: a removal's first mark is an
# upsert that makes its document. Elsewhere an insert is a new record or a copy (the move of
# a revoked family or an ended session to format 2, storage/mongo/hashes.py), never a revocation.
INSERTED = "removed_clients"
# "$changeStream is only supported on replica sets", and kin: poll instead.
NO_CHANGE_STREAMS = frozenset({40573, 40324, 136})
POLL_SECONDS = 0.5
STREAM_WAIT_MS = 1000  # how long one getMore of the change stream waits for events
# The change stream's resume point is gone: ChangeStreamHistoryLost, InvalidResumeToken,
# ChangeStreamFatalError.
HISTORY_LOST = frozenset({286, 260, 280})
# How far behind the poller's clock a writer's may run (the hosts kept on NTP). A poll reads back
# the store's budget and this before its last one (poll_overlap).
CLOCK_SKEW = timedelta(seconds=5)
# The field beside each mark that says its audience (the module's docstring).
MARK_AUDIENCE = "mark_audience"


def marked(at: datetime, audience: list[str] | tuple[str, ...] | None) -> dict[str, Any]:
    """The field a write sets beside a mark it stamps ``at``: the mark's ``audience`` (None:
    every reader)."""
    return {MARK_AUDIENCE: {"at": at, "audience": None if audience is None else list(audience)}}


def marked_own(at: datetime) -> dict[str, Any]:
    """The field an update with an aggregation pipeline sets beside a mark it stamps ``at`` on
    each family it matches: that family's own audience (its ``audience``; null, or none written:
    every reader). One write marks many families, each told to its own readers alone."""
    return {MARK_AUDIENCE: {"at": at, "audience": {"$ifNull": ["$audience", None]}}}


def with_mark(fields: dict[str, Any]) -> dict[str, Any]:
    """A client's or a user's fields as a write sets them: the audience of its mark
    (base.MARK_AUDIENCE, given with ``narrowed_at``) as :func:`marked` writes it. A mark given
    without one is every reader's."""
    fields = dict(fields)
    audience = fields.pop(BASE_MARK_AUDIENCE, None)
    if fields.get("narrowed_at") is not None:
        fields.update(marked(fields["narrowed_at"], audience))
    return fields


def audience_of(document: dict[str, Any], field: str) -> tuple[str, ...] | None:
    """The audience ``document`` (an update's fields, or a document read) gives the mark in
    ``field``: None (every reader) unless it was written with it."""
    mark = document.get(MARK_AUDIENCE)
    if not isinstance(mark, dict) or not isinstance(document.get(field), datetime):
        return None
    at = mark.get("at")
    audience = mark.get("audience")
    if not isinstance(at, datetime) or _utc(at) != _utc(document[field]) or not isinstance(audience, list):
        return None
    return tuple(resource for resource in audience if isinstance(resource, str))


class _NoChangeStreams(Exception):
    pass


class MongoRevocationFeed:
    """The revocation feed, a part of :class:`~tokensvc.storage.mongo.store.MongoStore` on the
    store's one :class:`~tokensvc.storage.mongo.connection.Connection` (its database, its calls,
    its clock, its budget and observer), as the registry and the authorizations are. It keeps
    what is its own: whether the deployment offers change streams, and where the stream stands."""

    def __init__(self, connection: Connection, *, change_streams: bool = True) -> None:
        self.connection = connection
        # False: polling (a deployment without change streams, found at the first try; a
        # stand-in client in tests, which has none).
        self.change_streams = change_streams
        self.resume_token: Any = None  # where the change stream stands (the server's postBatchResumeToken)

    # -- revocations across processes

    async def revocation_feed(self, poll_seconds: float = POLL_SECONDS) -> AsyncIterator[Revocation]:
        """Yields each revocation any process makes: from a change stream on the watched
        collections (resumed where it left off), or, where the deployment has none (a
        standalone server), by polling their revocation fields every ``poll_seconds``."""
        if self.change_streams:
            try:
                async for revocation in self._changes():
                    self.connection.observer.feed_event()
                    yield revocation
            except _NoChangeStreams:
                log.warning("MongoDB offers no change streams (not a replica set): polling for revocations")
                self.change_streams = False
            except BaseException:
                self.connection.observer.feed("interrupted")
                raise
        self.connection.observer.feed("polling")
        async for revocation in self._poll(poll_seconds):
            self.connection.observer.feed_event()
            yield revocation

    async def _changes(self) -> AsyncIterator[Revocation]:
        """The change stream, asked for more every :data:`STREAM_WAIT_MS` at most: quiet is no
        error, and the resume token (the server's ``postBatchResumeToken``) is kept after every
        answer, events or none. It reports ``stream`` once it is open, and ends in a
        :class:`StorageError` (``events.relay`` opens it again, and every socket re-checks once)
        when the server closes it (a cursor id 0), when an answer does not come within the
        watchdog (:data:`STREAM_WAIT_MS` and the budget: a ``getMore`` that hangs is left to the
        driver's socket timeout, never cancelled, and the stream closed once it ends), and when
        the server can no longer resume it (the oplog rolled past it: 286, 260, 280; or the
        stream was invalidated): then it starts again from now.

        A stream stands on the primary that opened it. When the driver learns that another
        primary was elected, the stream waits no more on the old one (a primary that crashed
        or was cut off answers nothing, and the watchdog would hear nothing for seconds): it is
        opened again at once on the new one, where it stood (:meth:`Topology.abandoned`). That
        misses nothing, as the driver's own resume misses nothing: the old stream told only of
        majority-committed writes, which the new primary holds, so no socket re-checks. A
        stream that had no resume point yet (it was to follow from now) is interrupted instead,
        and every socket re-checks."""
        watchdog = STREAM_WAIT_MS / 1000 + self.connection.budget
        fields = sorted({field for revoking in WATCHED.values() for field in revoking})
        # Where a change says a mark was set: an update's fields, or the document an insert
        # made in INSERTED alone (an upsert that made it: a removal's first mark).
        updated = [f"updateDescription.updatedFields.{field}" for field in fields]
        inserted = [f"fullDocument.{field}" for field in WATCHED[INSERTED]]
        audiences = [f"updateDescription.updatedFields.{MARK_AUDIENCE}", f"fullDocument.{MARK_AUDIENCE}"]
        pipeline = [
            {"$match": {"operationType": {"$in": ["insert", "update", "invalidate"]},
                        "$or": [{"operationType": "invalidate"},
                                {"operationType": "update", "ns.coll": {"$in": list(WATCHED)},
                                 "$or": [{path: {"$type": "date"}} for path in updated]},
                                {"operationType": "insert", "ns.coll": INSERTED,
                                 "$or": [{path: {"$type": "date"}} for path in inserted]}]}},
            # Which of the watched fields the write set (one document may carry two marks), and
            # the audience it set with them.
            {"$project": {"ns": 1, "documentKey": 1, "operationType": 1, "clusterTime": 1,
                          **dict.fromkeys(updated + inserted + audiences, 1)}},
        ]
        try:
            while True:
                try:
                    async with contextlib.aclosing(self._follow(pipeline, watchdog)) as following:
                        async for revocation in following:
                            yield revocation
                except Elected:
                    if self.resume_token is None:
                        raise StorageError("another primary was elected before the change stream had a resume "
                                           "point; following from now") from None
                    log.info("another MongoDB primary was elected: the change stream follows it where it stood")
        except OperationFailure as exc:
            if exc.code in NO_CHANGE_STREAMS:
                raise _NoChangeStreams() from None
            if exc.code in HISTORY_LOST:
                self.resume_token = None  # from now on: what happened meanwhile, every socket re-checks
                raise StorageError(f"the change stream cannot resume ({exc.code}); following from now") from None
            raise translate(exc) from None
        except PyMongoError as exc:
            raise translate(exc) from None

    async def _follow(self, pipeline: list[Any], watchdog: float) -> AsyncGenerator[Revocation, None]:
        """One change stream, opened where the feed stands, followed until it ends: in a
        :class:`StorageError` as :meth:`_changes` says, or in :class:`Elected` when another
        primary is elected while it waits on the old one."""
        asking: asyncio.Task[Any] | None = None
        opening = self.connection.calls.start(self._watch(pipeline))
        try:
            stream = await self._within(opening, watchdog)
        except BaseException:  # not waited for any more: the stream it opens, if it does, is closed
            opening.add_done_callback(self._opened_too_late)
            raise
        try:
            self.resume_token = stream.resume_token  # where it stands, before any answer
            self.connection.observer.feed("stream")
            while stream.alive:
                asking = self.connection.calls.start(stream.try_next())
                change = await self._within(asking, watchdog)
                self.resume_token = stream.resume_token
                if change is None:
                    continue
                if self.connection.clock is not None:
                    # The re-check this event causes reads at or after the revocation.
                    self.connection.clock.seen(change.get("clusterTime"))
                if change["operationType"] == "invalidate":
                    self.resume_token = None
                    raise StorageError("the change stream was invalidated; following from now")
                for revocation in _revocations(change):
                    yield revocation
        finally:
            self._close_stream(stream, asking)
        raise StorageError("the server closed the change stream; opening it again where it stood")

    async def _watch(self, pipeline: list[Any]) -> Any:
        stream = self.connection.db.watch(pipeline, resume_after=self.resume_token, max_await_time_ms=STREAM_WAIT_MS)
        if inspect.isawaitable(stream):  # PyMongo's watch is a coroutine; Motor-style ones are not
            stream = await stream
        return stream

    async def _within(self, call: asyncio.Task[Any], watchdog: float) -> Any:
        """The answer of a call on the change stream within the watchdog, or until another
        primary is elected (:class:`Elected`), never cancelling it (storage/mongo/calls.py): one
        that does not come is left to the driver's own socket timeout, and the stream is opened
        again."""
        try:
            return await self.connection.calls.wait(call, watchdog, self.connection.topology.abandoned())
        except Elected:
            raise
        except Left:
            raise StorageError(f"the change stream did not answer within {watchdog:g} s; opening it again where it "
                               "stood") from None

    def _opened_too_late(self, opening: asyncio.Task[Any]) -> None:
        if not opening.cancelled() and opening.exception() is None:
            self._close_stream(opening.result(), None)

    def _close_stream(self, stream: Any, asking: asyncio.Task[Any] | None) -> None:
        """Close ``stream`` (its cursor killed on the server) once its request in flight, if
        any, has ended: in the background, never cancelling either (the store's close lets it
        end)."""
        async def close() -> None:
            if asking is not None and not asking.done():
                await asyncio.wait({asking})
            with contextlib.suppress(PyMongoError), pymongo.timeout(self.connection.budget):
                await stream.close()

        self.connection.calls.leave(self.connection.calls.start(close()))

    async def _poll(self, poll_seconds: float) -> AsyncIterator[Revocation]:
        overlap = poll_overlap(self.connection)
        since = datetime.now(UTC)
        seen: dict[tuple[str, str, str], datetime] = {}
        while True:
            await asyncio.sleep(poll_seconds)
            now = datetime.now(UTC)
            for collection, revoking in WATCHED.items():
                for field, kind in revoking.items():
                    for document in await self._revoked_since(collection, field, since - overlap):
                        key, at = (collection, document["_id"], field), _utc(document[field])
                        # Seen at another time: marked again (a user demoted twice within the
                        # overlap, a grant revoked again after a new consent) is announced again.
                        # What was seen already is not announced twice.
                        if seen.get(key) != at:
                            seen[key] = at
                            yield Revocation(kind, hashes.unpacked(document["_id"]), audience_of(document, field))
            since = now
            seen = {key: at for key, at in seen.items() if at > since - 2 * overlap}

    @guarded()
    async def _revoked_since(self, collection: str, field: str, since: datetime) -> list[dict[str, Any]]:
        return await self.connection.db[collection].find({field: {"$gt": since}},
                                                         {field: 1, MARK_AUDIENCE: 1}).to_list(None)


def _revocations(change: dict[str, Any]) -> list[Revocation]:
    """What a write the change stream reported revokes: one announcement for each kind its
    collection names by a field the update set to a time, or the document inserted in
    :data:`INSERTED` holds (a family's two marks are one). Any other insert revokes nothing."""
    if change["operationType"] == "insert":
        updated = change.get("fullDocument") or {} if change["ns"]["coll"] == INSERTED else {}
    else:
        updated = change.get("updateDescription", {}).get("updatedFields") or {}
    revoking = WATCHED[change["ns"]["coll"]]
    kinds: dict[str, str] = {}  # each kind announced once, with the audience of its first mark set
    for field, kind in revoking.items():
        if isinstance(updated.get(field), datetime):
            kinds.setdefault(kind, field)
    return [Revocation(kind, hashes.unpacked(change["documentKey"]["_id"]), audience_of(updated, field))
            for kind, field in kinds.items()]


class Budgeted(Protocol):
    """What holds the store's budget: its connection, or the store."""

    @property
    def budget(self) -> float: ...


def poll_overlap(store: Budgeted) -> timedelta:
    """How far a poll reads back before its last one. A mark carries the time its writer read
    just before the operation that writes it (each write reads its own: a removal's batches, a
    grant's families after the grant), and that operation lands within the store's budget
    (``storage.timeout_ms``, its retries included: a write retried while a new primary is
    elected lands seconds after its time), on a host whose clock may run :data:`CLOCK_SKEW`
    behind the poller's. A shorter overlap missed such a mark for good. A write the store
    stopped waiting for (its 503) may land later still: its mark is stamped again when its call
    ends, or by the revocation asked again (stamps.py)."""
    return timedelta(seconds=store.budget) + CLOCK_SKEW
