"""Change streams on :class:`primary.ReplicaSet`, as a server serves them.

Every document a write changes makes one change event, shaped as MongoDB 8 shapes it: ``_id``
(the resume token), ``operationType``, ``clusterTime`` (the write's own optime), ``wallTime``,
``ns``, ``documentKey``, and by its kind:

- ``insert`` (an insert, or an upsert that made its document) and ``replace`` (a replacement,
  an update without operators): ``fullDocument``, the document as the write left it;
- ``update``: ``updateDescription`` with ``updatedFields``, ``removedFields`` and
  ``truncatedArrays`` as the server's delta says them: for an update with operators, the paths
  its operators name (``$set`` of ``a.b`` is ``a.b``; of a field that did not exist, from the
  first new part of its path), a field set to the value it had left out, ``$unset`` in
  ``removedFields``, an array ``$push`` appended to as one field per new element (``a.3``), any
  other array change as the whole array; for a pipeline update, what differs between the two
  versions of the document, field by field;
- ``delete`` (a delete, a ``findAndModify`` that removes, a pass of the TTL monitor):
  ``documentKey`` alone.

An event is delivered only once the majority commit point has reached it (a stream never
tells of a write a failover can roll back); a stream opened without a resume token starts at
the commit point. ``aggregate`` with ``$changeStream`` opens a cursor on a collection, a
database or (``allChangesForCluster``) the whole set, whose ``getMore`` waits (up to its
``maxTimeMS``, the stream's await time) for the events of what it watches, and runs each through
the stream's own pipeline as the server does: the stages a change stream allows (``$match``,
``$project``, ``$addFields``, ``$set``, ``$unset``, ``$replaceRoot``, ``$replaceWith``,
``$redact``; any other is ``IllegalOperation``, 20, at once), an event they filter out never
sent, what they project the whole of what is sent, and one whose ``_id`` they removed or changed
ending the stream (``ChangeStreamFatalError``, 280). Resume tokens and ``postBatchResumeToken``;
history older than :attr:`oldest` is lost (286). What else a real stream meets, on the test's
command:

- :meth:`invalidate`: an ``invalidate`` event (the watched database dropped or renamed), with
  which the server closes the cursor;
- :meth:`close`: the server closes every open stream's cursor: its next ``getMore`` answers
  with cursor id 0 and no events (as after a kill or a resharding).

A step-down interrupts writes only: a stream's ``getMore`` goes on on the member, now a
secondary, as a real one's does (a secondary serves change streams). A stream lives on the
member it was opened on: a ``getMore`` elsewhere, or after its member was restarted, is
``CursorNotFound`` (43), which the driver resumes from.
"""

from __future__ import annotations

import bisect
import copy
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import mongomock
from bson import Timestamp

# The stages a change stream's pipeline may hold after $changeStream (the server's allowlist).
ALLOWED_STAGES = frozenset({"$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot", "$replaceWith",
                            "$redact", "$changeStreamSplitLargeEvent"})
ILLEGAL_OPERATION, CHANGE_STREAM_FATAL, HISTORY_LOST, CURSOR_NOT_FOUND = 20, 280, 286, 43
# Update operators whose change the server's delta names by the path they name.
_SCALAR = frozenset({"$set", "$inc", "$mul", "$min", "$max", "$currentDate"})
_ARRAY = frozenset({"$push", "$addToSet", "$pull", "$pullAll", "$pop"})
_MISSING = object()


@dataclass
class Stream:
    member: int
    pipeline: list[dict[str, Any]]  # the stages after $changeStream
    database: str | None  # what it watches: a database (None: the whole cluster)
    collection: str | None  # and in it, one collection (None: every one)
    position: int  # the sequence number of the last event handed out
    closed: bool = False  # the server closed it: the next getMore says so (cursor id 0)
    invalidated: bool = False  # an invalidate was handed out: closed after it


class Streams:
    def __init__(self, rs: Any) -> None:
        self.rs = rs
        self.events: list[dict[str, Any]] = []  # in the order of their optimes
        self.streams: dict[int, Stream] = {}
        self.oldest = 0  # change events before this sequence number are lost (286)

    # -- the test's side

    def lose_history(self) -> None:
        """Every change event so far falls off the oplog: resuming from any point before now is 286."""
        with self.rs.lock:
            self.oldest = len(self.events) + 1

    def invalidate(self) -> None:
        """The watched database is dropped or renamed: an oplog entry of its own (delivered, as
        every event, once majority-committed)."""
        with self.rs.lock:
            optime = self.rs.tick()
            self.events.append({"_seq": len(self.events) + 1, "_optime": optime, "operationType": "invalidate",
                                "clusterTime": Timestamp(1_700_000_000, optime), "wallTime": _now()})
            self.rs.lock.notify_all()

    def close(self) -> None:
        with self.rs.lock:
            for stream in self.streams.values():
                stream.closed = True
            self.rs.lock.notify_all()

    def visible(self) -> int:
        """How many events the majority commit point has reached (under the set's lock)."""
        return bisect.bisect_right(self.events, self.rs.committed, key=lambda event: event["_optime"])

    # -- the server's side

    def record(self, database: str, collection: str, _id: Any, before: dict[str, Any] | None,
               after: dict[str, Any] | None, update: Any, optime: int) -> None:
        """The change event of one document a write changed, at the write's ``optime`` (under
        the set's lock, by the write)."""
        if before is None:
            kind = "insert"
        elif after is None:
            kind = "delete"
        elif isinstance(update, dict) and not any(key.startswith("$") for key in update):
            kind = "replace"
        else:
            kind = "update"
        event: dict[str, Any] = {"_seq": len(self.events) + 1, "_optime": optime, "operationType": kind,
                                 "clusterTime": Timestamp(1_700_000_000, optime), "wallTime": _now()}
        if kind in ("insert", "replace"):
            event["fullDocument"] = copy.deepcopy(after)
        event.update(ns={"db": database, "coll": collection}, documentKey={"_id": _id})
        if kind == "update":
            assert after is not None
            event["updateDescription"] = describe(update, before, after)
        self.events.append(event)
        self.rs.lock.notify_all()

    def rolled_back(self) -> None:
        """The events past the commit point are gone with the writes that made them (under the
        set's lock): no stream was handed them, none will be."""
        del self.events[self.visible():]

    def open(self, member: int, doc: dict[str, Any], pipeline: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.rs.change_streams:
            return {"ok": 0, "code": 40573, "errmsg": "The $changeStream stage is only supported on replica sets"}
        stages = pipeline[1:]
        for stage in stages:
            name = next(iter(stage))
            if name not in ALLOWED_STAGES:
                return {"ok": 0, "code": ILLEGAL_OPERATION, "codeName": "IllegalOperation",
                        "errmsg": f"{name} is not permitted in a $changeStream pipeline"}
        options = pipeline[0]["$changeStream"]
        with self.rs.lock:
            position = self.visible()  # from now: the newest majority-committed write
            resume = options.get("resumeAfter") or options.get("startAfter")
            if resume is not None:
                position = int(resume["_data"], 16)
                if position < self.oldest:
                    return {"ok": 0, "code": HISTORY_LOST, "codeName": "ChangeStreamHistoryLost",
                            "errmsg": "Resume of change stream was not possible, as the resume point may no longer "
                                      "be in the oplog"}
                if position > self.visible():
                    return {"ok": 0, "code": CHANGE_STREAM_FATAL, "codeName": "ChangeStreamFatalError",
                            "errmsg": "cannot resume stream; the resume token was not found"}
            cursor_id = next(self.rs.executor._cursor_ids)
            watched = None if options.get("allChangesForCluster") else doc["$db"]
            collection = doc["aggregate"] if isinstance(doc["aggregate"], str) else None
            self.streams[cursor_id] = Stream(member, [copy.deepcopy(stage) for stage in stages], watched, collection,
                                             position)
        return {"ok": 1, "cursor": {"id": cursor_id, "ns": f"{doc['$db']}.$cmd.aggregate", "firstBatch": [],
                                    "postBatchResumeToken": self.token(position)}}

    @staticmethod
    def token(position: int) -> dict[str, str]:
        return {"_data": f"{position:016x}"}

    def is_stream(self, cursor_id: int) -> bool:
        with self.rs.lock:
            return cursor_id in self.streams

    def more(self, member: int, doc: dict[str, Any]) -> dict[str, Any]:
        """A getMore: the majority-committed events after the stream's position that its
        pipeline lets through, or none once its await time is up."""
        deadline = time.monotonic() + min(doc.get("maxTimeMS", 1000), 1000) / 1000
        with self.rs.lock:
            stream = self.streams.get(doc["getMore"])
            if stream is not None and stream.member != member:
                stream = None  # a cursor lives on the member that opened it
            batch: list[dict[str, Any]] = []
            while stream is not None and not stream.closed and not stream.invalidated:
                visible = self.visible()
                fresh = self.events[stream.position:visible]
                for event in fresh:
                    sent = self._through(stream.pipeline, event) if _watches(stream, event) else []
                    if isinstance(sent, str):  # the pipeline changed the resume token: the stream ends
                        del self.streams[doc["getMore"]]
                        return {"ok": 0, "code": CHANGE_STREAM_FATAL, "codeName": "ChangeStreamFatalError",
                                "errmsg": sent}
                    batch.extend(sent)
                    stream.position = event["_seq"]
                    if event["operationType"] == "invalidate":  # the stream ends with it, whatever its $match
                        stream.invalidated = True
                        break
                if batch or stream.invalidated or time.monotonic() >= deadline or self.rs.stopped:
                    break
                self.rs.lock.wait(max(0.0, deadline - time.monotonic()))
            if stream is None:
                return {"ok": 0, "code": CURSOR_NOT_FOUND, "codeName": "CursorNotFound",
                        "errmsg": f"cursor id {doc['getMore']} not found"}
            cursor_id = doc["getMore"]
            if stream.closed or stream.invalidated:  # the invalidate goes out with the cursor's end
                del self.streams[cursor_id]
                cursor_id = 0
            return {"ok": 1, "cursor": {"id": cursor_id, "ns": f"{doc['$db']}.{doc['collection']}",
                                        "nextBatch": batch, "postBatchResumeToken": self.token(stream.position)}}

    def kill(self, cursor_ids: list[int]) -> None:
        for cursor_id in cursor_ids:
            self.streams.pop(cursor_id, None)

    def kill_member(self, member: int) -> None:
        """The member's process is gone: so are the streams opened on it."""
        for cursor_id in [key for key, stream in self.streams.items() if stream.member == member]:
            del self.streams[cursor_id]

    def _through(self, stages: list[dict[str, Any]], event: dict[str, Any]) -> list[dict[str, Any]] | str:
        """What the stream sends of ``event``: nothing, or the event as its stages leave it; a
        message when they removed or changed its resume token."""
        public = {"_id": self.token(event["_seq"]),
                  **{key: value for key, value in event.items() if not key.startswith("_")}}
        stages = [stage for stage in stages if "$changeStreamSplitLargeEvent" not in stage]
        if not stages:
            return [copy.deepcopy(public)]
        scratch = mongomock.MongoClient()["scratch"]["events"]
        scratch.insert_one(copy.deepcopy(public))
        sent = list(scratch.aggregate(copy.deepcopy(stages)))
        for out in sent:
            if out.get("_id") != public["_id"]:
                return ("Encountered an event whose _id field, which contains the resume token, was modified by the "
                        "pipeline. Modifying the _id field of an event makes it impossible to resume the stream from "
                        f"that point. Only transformations that retain the unmodified _id field are allowed. Expected: "
                        f"{{_id: {public['_id']}}} but found: {{_id: {out.get('_id')}}}")
        return sent


def _watches(stream: Stream, event: dict[str, Any]) -> bool:
    """Whether ``event`` is in what ``stream`` watches (an invalidate reaches every stream)."""
    ns = event.get("ns")
    return ns is None or ((stream.database is None or ns["db"] == stream.database)
                          and (stream.collection is None or ns["coll"] == stream.collection))


def describe(update: Any, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """An update event's ``updateDescription``, as the server's delta of the write says it."""
    updated: dict[str, Any] = {}
    removed: list[str] = []
    truncated: list[dict[str, Any]] = []
    by_paths = isinstance(update, dict) and all(
        operator in _SCALAR | _ARRAY | {"$unset", "$rename", "$setOnInsert"} for operator in update) and not any(
        part.startswith("$") for fields in update.values() for path in fields for part in path.split("."))
    if not by_paths:  # a pipeline update (or a positional path): the two versions compared
        _diff(before, after, "", updated, removed, truncated)
        return {"updatedFields": updated, "removedFields": removed, "truncatedArrays": truncated}
    for operator, fields in update.items():
        for path, operand in fields.items():
            if operator == "$setOnInsert":
                continue  # only when the upsert inserts, which is an insert event
            if operator in ("$unset", "$rename"):
                if _at(before, path) is not _MISSING:
                    removed.append(path)
                if operator == "$rename" and _at(after, operand) is not _MISSING:
                    updated[_created(before, operand)] = _at(after, _created(before, operand))
                continue
            old, new = _at(before, path), _at(after, path)
            if new is _MISSING or (old is not _MISSING and _same(old, new)):
                continue  # a field set to the value it had: no change, none told
            if old is _MISSING:
                reported = _created(before, path)
                updated[reported] = _at(after, reported)
            elif (operator == "$push" and isinstance(old, list) and isinstance(new, list) and len(new) > len(old)
                  and _same(new[:len(old)], old)):
                updated.update({f"{path}.{index}": new[index] for index in range(len(old), len(new))})
            else:
                updated[path] = new
    return {"updatedFields": updated, "removedFields": removed, "truncatedArrays": truncated}


def _diff(before: Any, after: Any, prefix: str, updated: dict[str, Any], removed: list[str],
          truncated: list[dict[str, Any]]) -> None:
    for key in before:
        if key not in after:
            removed.append(prefix + key)
    for key, new in after.items():
        old = before.get(key, _MISSING)
        if old is not _MISSING and _same(old, new):
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            _diff(old, new, f"{prefix}{key}.", updated, removed, truncated)
        elif isinstance(old, list) and isinstance(new, list):
            for index, item in enumerate(new):
                if index >= len(old) or not _same(old[index], item):
                    updated[f"{prefix}{key}.{index}"] = item
            if len(new) < len(old):
                truncated.append({"field": prefix + key, "newSize": len(new)})
        else:
            updated[prefix + key] = new


def _at(document: Any, path: str) -> Any:
    value = document
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _created(before: dict[str, Any], path: str) -> str:
    """The path a delta names for a field set where ``before`` had none: up to its first new part."""
    parts = path.split(".")
    for end in range(1, len(parts) + 1):
        if _at(before, ".".join(parts[:end])) is _MISSING:
            return ".".join(parts[:end])
    return path


def _same(old: Any, new: Any) -> bool:
    """Equal as BSON values are (of one type: 1 and 1.0 differ)."""
    if type(old) is not type(new):
        return False
    if isinstance(old, dict):
        return list(old) == list(new) and all(_same(old[key], new[key]) for key in old)
    if isinstance(old, list):
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(old, new, strict=True))
    return bool(old == new)


def _now() -> datetime:
    """The wall clock as BSON carries it: UTC, to the millisecond."""
    now = datetime.now(UTC).replace(tzinfo=None)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)
