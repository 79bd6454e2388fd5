"""A one-member replica set on the wire: mockupdb answers as its primary, executes every
command against a mongomock database, records what the driver sent, and plays scripted
faults. The real ``AsyncMongoClient`` talks to it as to a MongoDB 8 server.

What a real server does that the tests rely on, emulated here:

- the handshake of a current replica-set primary (``hello``: ``setName``, ``hosts``,
  ``maxWireVersion`` 25, ``logicalSessionTimeoutMinutes``, so the driver uses sessions and
  retryable writes);
- retryable-write deduplication: a write retried with the ``lsid`` and ``txnNumber`` it was
  first sent with is answered with the first reply, never applied twice;
- the cluster's logical clock: every reply carries ``operationTime`` and ``$clusterTime``
  (a write advances them), so the driver's causally consistent sessions send
  ``afterClusterTime``; change events carry the ``clusterTime`` of their write;
- change streams: ``aggregate`` with ``$changeStream`` opens a cursor whose ``getMore`` waits
  (up to its ``maxTimeMS``) for update events matching the stream's ``$match``, with resume
  tokens and ``postBatchResumeToken``; history older than :attr:`oldest` is lost (286);
- ``$currentOp`` with ``idleConnections``: every open connection, with the ``appName`` and
  client metadata its handshake sent and its client address (refused, as a server that will
  not say, when :attr:`current_op` is False).

mockupdb runs one thread per connection but calls handlers under one lock, so a ``getMore``
that waits is answered from a thread of its own and never holds other connections up.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import mongomock
from bson import ObjectId, Timestamp
from mockupdb import MockupDB, Request
from pymongo import ReturnDocument

BUDGET_MS = 2000  # storage.timeout_ms of the wire tests: short, so faults end quickly
WRITES = frozenset({"insert", "update", "delete", "findAndModify", "createIndexes", "collMod", "dropIndexes"})
HANDSHAKE = frozenset({"hello", "ismaster", "isMaster"})


@dataclass
class Fault:
    """What to do instead of (or after) executing a matching command.

    ``action``: ``"hangup"`` (close the connection before executing), ``"hangup_after"``
    (execute, then close: a lost reply), ``"error"`` (answer ``code`` with ``labels``, not
    executing), ``"write_concern_error"`` (execute, then answer with a writeConcernError),
    ``"delay"`` (wait ``seconds``, then execute). ``times`` matching commands get it.
    """

    command: str
    action: str
    collection: str | None = None
    code: int = 0
    labels: tuple[str, ...] = ()
    seconds: float = 0.0
    times: int = 1
    when: Callable[[dict[str, Any]], bool] | None = None
    hits: int = 0

    def matches(self, name: str, doc: dict[str, Any]) -> bool:
        if self.hits >= self.times or name != self.command:
            return False
        if self.collection is not None and doc.get(name) != self.collection:
            return False
        return self.when is None or self.when(doc)


@dataclass
class _Stream:
    match: dict[str, Any]
    position: int  # the sequence number of the last event handed out


@dataclass
class Primary:
    """The server: ``uri`` for the driver; ``commands`` as received; ``faults`` to play."""

    writable: bool = True
    change_streams: bool = True  # False: a standalone server, which has none
    server: MockupDB = field(init=False)
    db: Any = field(init=False)
    commands: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    oldest: int = 0  # change events before this sequence number are lost (286)
    current_op: bool = True  # False: $currentOp is refused (Unauthorized)

    def __post_init__(self) -> None:
        self.db = mongomock.MongoClient()
        self._lock = threading.RLock()
        self._events: list[dict[str, Any]] = []
        self._arrived = threading.Condition(self._lock)
        self._streams: dict[int, _Stream] = {}
        self._cursor_ids = itertools.count(1000)
        self._replies: dict[tuple[bytes, int], dict[str, Any]] = {}
        self._connections: dict[Any, dict[str, Any]] = {}  # socket -> what its handshake said
        self.clock = 1  # the cluster time's increment: every applied write advances it
        self.server = MockupDB(auto_ismaster=False)
        self.server.autoresponds(self._handle)

    # -- the test's side

    def start(self) -> Primary:
        self.server.run()
        return self

    def stop(self) -> None:
        """Close every socket at once. mockupdb's own stop joins its accept thread, which waits
        up to a second in select(); its threads are daemons, so nothing is left behind."""
        with self._lock:
            self._arrived.notify_all()
        server = self.server
        server._stopped = True
        server._listening_sock.close()
        for sock in list(server._server_socks):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    @property
    def address(self) -> str:
        return f"localhost:{self.server.port}"

    def uri(self, **options: str) -> str:
        query = "&".join(f"{key}={value}" for key, value in {"replicaSet": "rs0", **options}.items())
        return f"mongodb://{self.address}/?{query}"

    def script(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def sent(self, name: str, collection: str | None = None) -> list[dict[str, Any]]:
        """The commands named ``name`` received so far (on ``collection``)."""
        with self._lock:
            return [doc for command, doc in self.commands
                    if command == name and (collection is None or doc.get(name) == collection)]

    def forget(self) -> None:
        with self._lock:
            self.commands.clear()

    def lose_history(self) -> None:
        """Every change event so far falls off the oplog: resuming from any point before now is 286."""
        with self._lock:
            self.oldest = len(self._events) + 1

    # -- the server's side

    def _handle(self, request: Request) -> bool:
        name = request.command_name
        doc = dict(request.doc)
        if name in HANDSHAKE:
            if "client" in doc:  # a connection's first hello names the application
                with self._lock:
                    self._connections[request._client] = {
                        "appName": doc["client"].get("application", {}).get("name"),
                        "clientMetadata": doc["client"], "client": f"127.0.0.1:{request.client_port}"}
            return self._hello(request)
        with self._lock:
            self.commands.append((name, copy.deepcopy(doc)))
            fault = next((fault for fault in self.faults if fault.matches(name, doc)), None)
            if fault is not None:
                fault.hits += 1
        if fault is not None and fault.action == "hangup":
            return request.hangup()
        if fault is not None and fault.action == "error":
            return request.replies(ok=0, errmsg=f"scripted fault {fault.code}", code=fault.code,
                                   errorLabels=list(fault.labels))
        if fault is not None and fault.action == "delay":
            # Waited out in a thread of its own: mockupdb calls handlers under one lock.
            threading.Thread(target=self._answer_later, args=(request, name, doc, fault), daemon=True).start()
            return True
        if name == "getMore" and doc["getMore"] in self._streams:
            threading.Thread(target=self._stream_more, args=(request, doc), daemon=True).start()
            return True
        return self._answer(request, name, doc, fault)

    def _answer_later(self, request: Request, name: str, doc: dict[str, Any], fault: Fault) -> None:
        time.sleep(fault.seconds)
        self._answer(request, name, doc, fault)

    def _answer(self, request: Request, name: str, doc: dict[str, Any], fault: Fault | None) -> bool:
        if name in WRITES and not self.writable:
            return request.replies(ok=0, errmsg="not primary", code=10107, errorLabels=["RetryableWriteError"])
        key = self._retry_key(doc) if name in WRITES else None
        with self._lock:
            if key is not None and key in self._replies:
                reply = self._replies[key]  # a retried write: the first answer, applied once
            else:
                try:
                    reply = getattr(self, "_" + name, self._unknown)(doc)
                except mongomock.OperationFailure as exc:
                    reply = {"ok": 0, "errmsg": str(exc), "code": exc.code or 2}
                except Exception as exc:  # a gap of this stand-in: an answer, never a hung driver
                    reply = {"ok": 0, "errmsg": f"{type(exc).__name__}: {exc}", "code": 1}
                if name in WRITES and reply.get("ok"):
                    self.clock += 1
                reply = {**reply, **self.times()}
                if key is not None:
                    self._replies[key] = reply
        try:
            if fault is not None and fault.action == "hangup_after":
                return request.hangup()
            if fault is not None and fault.action == "write_concern_error":
                reply = {**reply, "writeConcernError": {"code": fault.code, "errmsg": "scripted write concern error"}}
                if fault.labels:
                    reply["errorLabels"] = list(fault.labels)
            return request.replies(reply)
        except OSError:  # the client went away meanwhile (it gave up waiting)
            return True

    def times(self) -> dict[str, Any]:
        """The cluster time of the last write, as a server reports it."""
        now = Timestamp(1_700_000_000, self.clock)
        return {"operationTime": now, "$clusterTime": {"clusterTime": now, "signature": {
            "hash": b"\0" * 20, "keyId": 0}}}

    def _hello(self, request: Request) -> bool:
        return request.replies(
            ok=1, isWritablePrimary=self.writable, ismaster=self.writable, secondary=not self.writable,
            setName="rs0", hosts=[self.address], me=self.address,
            **({"primary": self.address} if self.writable else {}),
            setVersion=1, electionId=ObjectId("7fffffff0000000000000001"), maxWireVersion=25, minWireVersion=0,
            logicalSessionTimeoutMinutes=30, maxBsonObjectSize=16 * 1024 * 1024, maxMessageSizeBytes=48_000_000,
            maxWriteBatchSize=100_000, localTime=datetime.now(), connectionId=1)

    @staticmethod
    def _retry_key(doc: dict[str, Any]) -> tuple[bytes, int] | None:
        if "txnNumber" not in doc or "lsid" not in doc:
            return None
        return bytes(doc["lsid"]["id"]), int(doc["txnNumber"])

    def _collection(self, doc: dict[str, Any], name: str) -> Any:
        return self.db[doc["$db"]][doc[name]]

    @staticmethod
    def _unknown(doc: dict[str, Any]) -> dict[str, Any]:
        return {"ok": 0, "errmsg": f"no such command: {next(iter(doc))}", "code": 59}

    # -- commands

    def _ping(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {"ok": 1}

    def _buildInfo(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {"ok": 1, "version": "8.0.4", "versionArray": [8, 0, 4, 0]}

    def _endSessions(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {"ok": 1}

    def _killCursors(self, doc: dict[str, Any]) -> dict[str, Any]:
        for cursor_id in doc.get("cursors", []):
            self._streams.pop(cursor_id, None)
        return {"ok": 1, "cursorsKilled": doc.get("cursors", [])}

    def _insert(self, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self._collection(doc, "insert")
        n, errors = 0, []
        for index, document in enumerate(doc.get("documents", [])):
            try:
                collection.insert_one(document)
                n += 1
            except mongomock.DuplicateKeyError as exc:
                errors.append({"index": index, "code": 11000, "errmsg": str(exc)})
                if doc.get("ordered", True):
                    break
        return {"ok": 1, "n": n, **({"writeErrors": errors} if errors else {})}

    def _update(self, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self._collection(doc, "update")
        matched = modified = 0
        upserted, errors = [], []
        for index, spec in enumerate(doc.get("updates", [])):
            query, change = spec.get("q", {}), spec["u"]
            before = {d["_id"]: d for d in collection.find(query)}
            try:
                if any(key.startswith("$") for key in change):
                    method = collection.update_many if spec.get("multi") else collection.update_one
                    result = method(query, change, upsert=spec.get("upsert", False))
                else:
                    result = collection.replace_one(query, change, upsert=spec.get("upsert", False))
            except mongomock.DuplicateKeyError as exc:
                errors.append({"index": index, "code": 11000, "errmsg": str(exc)})
                break
            matched += result.matched_count
            modified += result.modified_count
            if result.upserted_id is not None:
                upserted.append({"index": index, "_id": result.upserted_id})
            self._record_updates(doc["$db"], doc["update"], before)
        reply: dict[str, Any] = {"ok": 1, "n": matched + len(upserted), "nModified": modified}
        if upserted:
            reply["upserted"] = upserted
        if errors:
            reply["writeErrors"] = errors
        return reply

    def _delete(self, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self._collection(doc, "delete")
        n = 0
        for spec in doc.get("deletes", []):
            method = collection.delete_one if spec.get("limit") == 1 else collection.delete_many
            n += method(spec.get("q", {})).deleted_count
        return {"ok": 1, "n": n}

    def _find(self, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self._collection(doc, "find")
        cursor = collection.find(doc.get("filter", {}), doc.get("projection"))
        if doc.get("sort"):
            cursor = cursor.sort(list(doc["sort"].items()))
        if doc.get("skip"):
            cursor = cursor.skip(doc["skip"])
        if doc.get("limit"):
            cursor = cursor.limit(abs(doc["limit"]))
        return {"ok": 1, "cursor": {"id": 0, "ns": f"{doc['$db']}.{doc['find']}", "firstBatch": list(cursor)}}

    def _count(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {"ok": 1, "n": self._collection(doc, "count").count_documents(doc.get("query", {}))}

    def _findAndModify(self, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self._collection(doc, "findAndModify")
        query, sort = doc.get("query", {}), list((doc.get("sort") or {}).items()) or None
        before_doc = collection.find_one(query, sort=sort)
        if doc.get("remove"):
            value = collection.find_one_and_delete(query, projection=doc.get("fields"), sort=sort)
            return {"ok": 1, "lastErrorObject": {"n": int(value is not None)}, "value": value}
        change = doc["update"]
        after = ReturnDocument.AFTER if doc.get("new") else ReturnDocument.BEFORE
        try:
            if any(key.startswith("$") for key in change):
                value = collection.find_one_and_update(query, change, projection=doc.get("fields"), sort=sort,
                                                       upsert=doc.get("upsert", False), return_document=after)
            else:
                value = collection.find_one_and_replace(query, change, projection=doc.get("fields"), sort=sort,
                                                        upsert=doc.get("upsert", False), return_document=after)
        except mongomock.DuplicateKeyError as exc:
            return {"ok": 0, "code": 11000, "errmsg": str(exc)}
        if before_doc is not None:
            self._record_updates(doc["$db"], doc["findAndModify"], {before_doc["_id"]: before_doc})
        return {"ok": 1, "lastErrorObject": {"n": int(before_doc is not None or doc.get("upsert", False)),
                                             "updatedExisting": before_doc is not None}, "value": value}

    def _aggregate(self, doc: dict[str, Any]) -> dict[str, Any]:
        pipeline = doc.get("pipeline", [])
        if pipeline and "$changeStream" in pipeline[0]:
            return self._open_stream(doc, pipeline)
        if pipeline and "$currentOp" in pipeline[0]:
            return self._current_op(doc, pipeline)
        name = doc["aggregate"]
        ns = f"{doc['$db']}.{name}"
        return {"ok": 1, "cursor": {"id": 0, "ns": ns, "firstBatch": list(self._collection(doc, "aggregate")
                                                                           .aggregate(pipeline))}}

    def _createIndexes(self, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self._collection(doc, "createIndexes")
        existing = collection.index_information()
        for index in doc.get("indexes", []):
            options = {key: value for key, value in index.items() if key not in ("key", "name")}
            same_keys = [name for name, info in existing.items()
                         if list(info["key"]) == list(index["key"].items()) and name != index["name"]]
            if same_keys:
                return {"ok": 0, "code": 85, "errmsg": f"Index already exists with a different name: {same_keys[0]}"}
            have = existing.get(index["name"])
            if have is not None:
                have_options = {key: value for key, value in have.items() if key not in ("key", "v", "ns")}
                if list(have["key"]) != list(index["key"].items()) or have_options != options:
                    return {"ok": 0, "code": 85, "errmsg": f"Index already exists with different options: "
                                                          f"{index['name']}"}
                continue
            collection.create_index(list(index["key"].items()), name=index["name"], **options)
        return {"ok": 1, "createdCollectionAutomatically": False, "numIndexesBefore": len(existing),
                "numIndexesAfter": len(collection.index_information())}

    def _listIndexes(self, doc: dict[str, Any]) -> dict[str, Any]:
        indexes = [{"v": 2, "key": dict(info["key"]), "name": name,
                    **{key: value for key, value in info.items() if key not in ("key", "v", "ns")}}
                   for name, info in self._collection(doc, "listIndexes").index_information().items()]
        return {"ok": 1, "cursor": {"id": 0, "ns": f"{doc['$db']}.{doc['listIndexes']}", "firstBatch": indexes}}

    def _dropIndexes(self, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self._collection(doc, "dropIndexes")
        if doc["index"] not in collection.index_information():
            return {"ok": 0, "code": 27, "codeName": "IndexNotFound", "errmsg": f"index not found: {doc['index']}"}
        collection.drop_index(doc["index"])
        return {"ok": 1}

    def _collMod(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {"ok": 1}

    def _current_op(self, doc: dict[str, Any], pipeline: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.current_op:
            return {"ok": 0, "code": 13, "codeName": "Unauthorized", "errmsg": "not authorized on admin to execute "
                                                                              "command { aggregate: 1 }"}
        connections = [{"type": "idleConnection", "active": False, **info}
                       for sock, info in self._connections.items() if sock.fileno() != -1]
        scratch = mongomock.MongoClient()["scratch"]["operations"]
        if connections:
            scratch.insert_many(connections)
        return {"ok": 1, "cursor": {"id": 0, "ns": "admin.$cmd.aggregate",
                                    "firstBatch": list(scratch.aggregate([{"$project": {"_id": 0, "type": 1,
                                                                                         "active": 1, "appName": 1,
                                                                                         "clientMetadata": 1,
                                                                                         "client": 1}},
                                                                           *pipeline[1:]]))}}

    # -- change streams

    def _record_updates(self, database: str, collection_name: str, before: dict[Any, dict[str, Any]]) -> None:
        """An ``update`` change event for each document of ``before`` that the write changed."""
        collection = self.db[database][collection_name]
        for _id, old in before.items():
            new = collection.find_one({"_id": _id})
            if new is None or new == old:
                continue
            updated = {key: value for key, value in new.items() if old.get(key, object()) != value}
            self._events.append({"_seq": len(self._events) + 1, "operationType": "update",
                                 "clusterTime": Timestamp(1_700_000_000, self.clock + 1),
                                 "ns": {"db": database, "coll": collection_name}, "documentKey": {"_id": _id},
                                 "updateDescription": {"updatedFields": updated, "removedFields": []}})
        self._arrived.notify_all()

    def _open_stream(self, doc: dict[str, Any], pipeline: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.change_streams:
            return {"ok": 0, "code": 40573, "errmsg": "The $changeStream stage is only supported on replica sets"}
        options = pipeline[0]["$changeStream"]
        position = len(self._events)
        resume = options.get("resumeAfter") or options.get("startAfter")
        if resume is not None:
            position = int(resume["_data"], 16)
            if position < self.oldest:
                return {"ok": 0, "code": 286, "codeName": "ChangeStreamHistoryLost",
                        "errmsg": "Resume of change stream was not possible, as the resume point may no longer "
                                  "be in the oplog"}
        match = next((stage["$match"] for stage in pipeline[1:] if "$match" in stage), {})
        cursor_id = next(self._cursor_ids)
        self._streams[cursor_id] = _Stream(match, position)
        return {"ok": 1, "cursor": {"id": cursor_id, "ns": f"{doc['$db']}.$cmd.aggregate", "firstBatch": [],
                                    "postBatchResumeToken": self._token(position)}}

    @staticmethod
    def _token(position: int) -> dict[str, str]:
        return {"_data": f"{position:016x}"}

    def _stream_more(self, request: Request, doc: dict[str, Any]) -> None:
        deadline = time.monotonic() + min(doc.get("maxTimeMS", 1000), 1000) / 1000
        with self._lock:
            stream = self._streams.get(doc["getMore"])
            batch: list[dict[str, Any]] = []
            while stream is not None:
                scratch = mongomock.MongoClient()["scratch"]["events"]
                fresh = [event for event in self._events[stream.position:]]
                if fresh:
                    scratch.insert_many([copy.deepcopy(event) for event in fresh])
                    batch = [self._event(event) for event in scratch.find(stream.match).sort("_seq", 1)]
                    stream.position = fresh[-1]["_seq"]
                if batch or time.monotonic() >= deadline:
                    break
                self._arrived.wait(max(0.0, deadline - time.monotonic()))
            position = stream.position if stream is not None else 0
        with contextlib.suppress(OSError):  # the client may have gone away meanwhile
            request.replies({"ok": 1, "cursor": {"id": doc["getMore"], "ns": f"{doc['$db']}.{doc['collection']}",
                                                 "nextBatch": batch, "postBatchResumeToken": self._token(position)}})

    def _event(self, event: dict[str, Any]) -> dict[str, Any]:
        public = {key: value for key, value in event.items() if key != "_seq"}
        return {"_id": self._token(event["_seq"]), **public}


def wire_settings(primary: Primary, **overrides: Any) -> Any:
    """The storage settings of a service on ``primary``."""
    from tokensvc.config import StorageSettings

    return StorageSettings(**{"backend": "mongodb", "mongodb_uri": primary.uri(), "database": "tokensvc",
                              "timeout_ms": BUDGET_MS, **overrides})
