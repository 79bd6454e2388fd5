"""Change streams on :class:`primary.ReplicaSet`, as a server serves them.

``aggregate`` with ``$changeStream`` opens a cursor whose ``getMore`` waits (up to its
``maxTimeMS``, the stream's await time) for events matching the stream's ``$match``, with
resume tokens and ``postBatchResumeToken``. History older than :attr:`oldest` is lost (286).
What else a real stream meets, on the test's command:

- :meth:`invalidate`: an ``invalidate`` event (the watched database dropped or renamed), with
  which the server closes the cursor;
- :meth:`close`: the server closes every open stream's cursor: its next ``getMore`` answers
  with cursor id 0 and no events (as after a kill or a resharding).

A step-down interrupts writes only: a stream's ``getMore`` goes on on the member, now a
secondary, as a real one's does.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import mongomock
from bson import Timestamp


@dataclass
class Stream:
    member: int
    match: dict[str, Any]
    position: int  # the sequence number of the last event handed out
    closed: bool = False  # the server closed it: the next getMore says so (cursor id 0)
    invalidated: bool = False  # an invalidate was handed out: closed after it


class Streams:
    def __init__(self, rs: Any) -> None:
        self.rs = rs
        self.events: list[dict[str, Any]] = []
        self.streams: dict[int, Stream] = {}
        self.oldest = 0  # change events before this sequence number are lost (286)

    # -- the test's side

    def lose_history(self) -> None:
        """Every change event so far falls off the oplog: resuming from any point before now is 286."""
        with self.rs.lock:
            self.oldest = len(self.events) + 1

    def invalidate(self) -> None:
        with self.rs.lock:
            self.events.append({"_seq": len(self.events) + 1, "operationType": "invalidate",
                                "clusterTime": Timestamp(1_700_000_000, self.rs.clock)})
            self.rs.lock.notify_all()

    def close(self) -> None:
        with self.rs.lock:
            for stream in self.streams.values():
                stream.closed = True
            self.rs.lock.notify_all()

    # -- the server's side

    def record_updates(self, database: str, collection_name: str, before: dict[Any, dict[str, Any]]) -> None:
        """An ``update`` change event for each document of ``before`` that a write changed (under
        the set's lock, by the write)."""
        collection = self.rs.data[database][collection_name]
        for _id, old in before.items():
            new = collection.find_one({"_id": _id})
            if new is None or new == old:
                continue
            updated = {key: value for key, value in new.items() if old.get(key, object()) != value}
            self.events.append({"_seq": len(self.events) + 1, "operationType": "update",
                                "clusterTime": Timestamp(1_700_000_000, self.rs.clock + 1),
                                "ns": {"db": database, "coll": collection_name}, "documentKey": {"_id": _id},
                                "updateDescription": {"updatedFields": updated, "removedFields": []}})
        self.rs.lock.notify_all()

    def record_insert(self, database: str, collection_name: str, _id: Any) -> None:
        """An ``insert`` change event for the document a write made (an insert's or an upsert's,
        under the set's lock, by the write), the whole document in ``fullDocument`` as a server
        sends it."""
        document = self.rs.data[database][collection_name].find_one({"_id": _id})
        self.events.append({"_seq": len(self.events) + 1, "operationType": "insert",
                            "clusterTime": Timestamp(1_700_000_000, self.rs.clock + 1),
                            "ns": {"db": database, "coll": collection_name}, "documentKey": {"_id": _id},
                            "fullDocument": document})
        self.rs.lock.notify_all()

    def open(self, member: int, doc: dict[str, Any], pipeline: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.rs.change_streams:
            return {"ok": 0, "code": 40573, "errmsg": "The $changeStream stage is only supported on replica sets"}
        options = pipeline[0]["$changeStream"]
        with self.rs.lock:
            position = len(self.events)
            resume = options.get("resumeAfter") or options.get("startAfter")
            if resume is not None:
                position = int(resume["_data"], 16)
                if position < self.oldest:
                    return {"ok": 0, "code": 286, "codeName": "ChangeStreamHistoryLost",
                            "errmsg": "Resume of change stream was not possible, as the resume point may no longer "
                                      "be in the oplog"}
            match = next((stage["$match"] for stage in pipeline[1:] if "$match" in stage), {})
            cursor_id = next(self.rs.executor._cursor_ids)
            self.streams[cursor_id] = Stream(member, match, position)
        return {"ok": 1, "cursor": {"id": cursor_id, "ns": f"{doc['$db']}.$cmd.aggregate", "firstBatch": [],
                                    "postBatchResumeToken": self.token(position)}}

    @staticmethod
    def token(position: int) -> dict[str, str]:
        return {"_data": f"{position:016x}"}

    def is_stream(self, cursor_id: int) -> bool:
        with self.rs.lock:
            return cursor_id in self.streams

    def more(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A getMore: the events after the stream's position, or none once its await time is up."""
        deadline = time.monotonic() + min(doc.get("maxTimeMS", 1000), 1000) / 1000
        with self.rs.lock:
            stream = self.streams.get(doc["getMore"])
            batch: list[dict[str, Any]] = []
            while stream is not None and not stream.closed and not stream.invalidated:
                scratch = mongomock.MongoClient()["scratch"]["events"]
                fresh = self.events[stream.position:]
                if fresh:
                    scratch.insert_many([copy.deepcopy(event) for event in fresh])
                    batch = [self._event(event) for event in scratch.find(stream.match).sort("_seq", 1)]
                    stream.position = fresh[-1]["_seq"]
                    stream.invalidated = any(event["operationType"] == "invalidate" for event in batch)
                if batch or time.monotonic() >= deadline or self.rs.stopped:
                    break
                self.rs.lock.wait(max(0.0, deadline - time.monotonic()))
            if stream is None:
                return {"ok": 0, "code": 43, "codeName": "CursorNotFound", "errmsg": f"cursor id {doc['getMore']} "
                                                                                     "not found"}
            cursor_id = doc["getMore"]
            if stream.closed or stream.invalidated:  # the invalidate goes out with the cursor's end
                del self.streams[cursor_id]
                cursor_id = 0
            return {"ok": 1, "cursor": {"id": cursor_id, "ns": f"{doc['$db']}.{doc['collection']}",
                                        "nextBatch": batch, "postBatchResumeToken": self.token(stream.position)}}

    def kill(self, cursor_ids: list[int]) -> None:
        for cursor_id in cursor_ids:
            self.streams.pop(cursor_id, None)

    def _event(self, event: dict[str, Any]) -> dict[str, Any]:
        public = {key: value for key, value in event.items() if key != "_seq"}
        return {"_id": self.token(event["_seq"]), **public}
