"""A replica set on the wire: one mockupdb server per member, answering as MongoDB 8 does,
every command executed on one mongomock data set (``commands.py``, ``streams.py``), what the
driver sent recorded, scripted faults played. The real ``AsyncMongoClient`` talks to it as to
a replica set.

What a real server does that the tests rely on, emulated here:

- the handshake of a current replica-set member (``hello``: ``setName``, ``hosts``, ``primary``,
  ``electionId`` and ``setVersion`` on the primary, ``maxWireVersion`` 25 unless told otherwise,
  ``logicalSessionTimeoutMinutes``), and the streaming protocol: an awaitable ``hello``
  (``topologyVersion``, ``maxAwaitTimeMS``) answers at once when the member's state changes, so
  the driver learns of a step-down or an election as it happens;
- roles: a write on a member that is not primary is ``NotWritablePrimary`` (10107, labelled
  ``RetryableWriteError``), a read asking for the primary is ``NotPrimaryNoSecondaryOk`` (13435);
- elections (:meth:`ReplicaSet.step_down`): the primary steps down, the writes it is executing
  are interrupted (``InterruptedDueToReplStateChange``, 11602, labelled), and after a scripted
  delay another member is elected with a new term (``electionId``); a crash
  (:meth:`ReplicaSet.crash`): the primary answers nothing more and closes nothing, as a host
  that lost power or a partition does, while the others elect a new one;
- commands run concurrently, one thread each: a slow one holds up nobody else, a
  multi-document write lets others run between its documents, and :class:`Fault` ``"race"``
  makes chosen writes read the same state before any of them commits, as concurrent writes on
  a real server do (the losers are retried by the server, or meet a write conflict, 112, or a
  unique-index race, 11000, as scripted);
- retryable-write deduplication as a server keeps it, per session (``lsid``): a write with the
  session's newest ``txnNumber`` runs only the statements the session has not executed yet
  (each document of an insert, each spec of an update or a delete, a ``findAndModify``: those
  that wrote something), the others answered from what they did, with their write concern
  waited for again; one with an older ``txnNumber`` is ``TransactionTooOld`` (225); a session
  runs one write at a time. The record lives with the data (a server's
  ``config.transactions``): a retry on another member finds it, and a rollback takes it back;
- the cluster's logical clock and the majority commit point: every document a write changes
  is an oplog entry with its own optime; every reply carries ``operationTime`` and
  ``$clusterTime``; a majority write waits for the commit point up to its ``wtimeout`` and then
  answers the ``writeConcernError`` a server sends (code 64 with ``errInfo.wtimeout``), applied
  all the same; a majority read answers from the majority snapshot (the data as the commit
  point left it: what the secondaries have not acknowledged yet is not in it), and one with
  ``afterClusterTime`` first waits for the commit point to reach it; a change stream tells of a
  write once the commit point has reached it; :attr:`ReplicaSet.lagging` holds the commit
  point back, :meth:`ReplicaSet.catch_up` lets it go;
- rollback: a member elected while the commit point lags behind the writes its predecessor
  applied never had them; they are rolled back (the data, their change events, their
  retryable-write records), as the old primary does when it rejoins the set, closing every
  client connection as it enters rollback;
- ``maxTimeMS``: a command whose wait (a delay, an ``afterClusterTime``) outlasts it answers
  ``MaxTimeMSExpired`` (50);
- ``find`` and ``aggregate`` in batches with ``getMore``, ``CursorNotFound`` (43) for a cursor
  that is gone; cursors survive a step-down (since 4.2 a server interrupts only writes) and die
  with their member's process (:meth:`ReplicaSet.set_down`); change streams as ``streams.py``
  says;
- the TTL monitor, on the test's command (:meth:`ReplicaSet.expire`): a pass deletes what a
  TTL index says has expired, as a delete the oplog and the change streams see;
- index builds with ``commitQuorum``: the default (``votingMembers``) waits while a member is
  down, ``majority`` builds once a majority is up;
- ``$currentOp`` with ``idleConnections``: every open connection, with the ``appName`` and
  client metadata its handshake sent and its client address; one executing a command is
  ``active`` and names its namespace (``ns``: the database, then the collection, ``$cmd.aggregate``
  for a change stream on a whole database) and the command, as a server lists an operation; an
  idle one names no database (refused, as a server that will not say, when
  :attr:`ReplicaSet.current_op` is False); authentication refused when
  :attr:`ReplicaSet.auth_fails`.

What it does not, and why, is in ``README.md`` beside this module.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import mongomock
from bson import ObjectId, Timestamp
from commands import Commands
from mockupdb import MockupDB, Request
from streams import Streams

BUDGET_MS = 2000  # storage.timeout_ms of the wire tests: short, so faults end quickly
WRITES = frozenset({"insert", "update", "delete", "findAndModify", "createIndexes", "collMod", "dropIndexes"})
READS = frozenset({"find", "aggregate", "count", "distinct", "listIndexes", "listCollections"})
HANDSHAKE = frozenset({"hello", "ismaster", "isMaster"})
# Writes that change no document but are an oplog entry of their own all the same.
CATALOG_WRITES = frozenset({"createIndexes", "collMod", "dropIndexes"})
NOT_WRITABLE_PRIMARY, NOT_PRIMARY_NO_SECONDARY_OK, INTERRUPTED_BY_STEP_DOWN = 10107, 13435, 11602
TRANSACTION_TOO_OLD = 225


def _client_port(request: Request) -> int:
    """The client's TCP port; 0 once its connection is gone. (mockupdb's own raises in its server
    thread when a test resets the connections under a request: a restart, a rollback.)"""
    with contextlib.suppress(OSError):
        address = request._client.getpeername()
        if isinstance(address, tuple):
            return int(address[1])
    return 0


Request.client_port = property(_client_port)  # type: ignore[assignment]


@dataclass
class Fault:
    """What to do instead of (or after) executing a matching command.

    ``action``: ``"hangup"`` (close the connection before executing), ``"hangup_after"``
    (execute, then close: a lost reply), ``"error"`` (answer ``code`` with ``labels``, not
    executing), ``"write_concern_error"`` (execute, then answer the ``writeConcernError`` a
    server sends for ``code``: 64, a wtimeout, with ``errInfo.wtimeout``), ``"delay"`` (wait
    ``seconds``, within the command's ``maxTimeMS``, then execute), ``"hold"`` (wait until
    :meth:`ReplicaSet.release`, within the command's ``maxTimeMS``, then execute), ``"race"`` (the ``times``
    matching writes each read the state, then commit one after the other: a loser whose
    documents changed meanwhile is retried by the server when ``code`` is 0, else answered
    ``code`` with ``labels``: 112, a write conflict; 11000, a unique-index race of an upsert).
    ``times`` matching commands get it.
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
    gate: threading.Barrier | None = None  # a race: every racer reads before any commits
    serial: threading.Lock | None = None  # a race: then they commit one at a time
    released: bool = False  # a hold: ReplicaSet.release lets it go on

    def matches(self, name: str, doc: dict[str, Any]) -> bool:
        if self.hits >= self.times or name != self.command:
            return False
        if self.collection is not None and doc.get(name) != self.collection:
            return False
        return self.when is None or self.when(doc)


@dataclass(eq=False)
class Op:
    """A command a member is executing."""

    member: Member
    name: str
    deadline: float | None  # from maxTimeMS
    interrupted: bool = False  # its member stepped down under it (writes)
    connection: Any = None  # the socket it came on
    ns: str = ""  # the database, then the collection (as $currentOp names it)
    optime: int | None = None  # the optime of the last document it changed
    # A retryable write: its session's record of the statements of its txnNumber executed so
    # far (statement -> (optime, what it did)), which the write reads and adds to.
    executed: dict[int, tuple[int, dict[str, Any]]] | None = None


@dataclass(eq=False)
class Undo:
    """A document a write changed past the commit point, as it was before (None: the write made it)."""

    optime: int
    member: int  # the primary that applied it
    database: str
    collection: str
    _id: Any
    before: dict[str, Any] | None


@dataclass(eq=False)
class TxnSession:
    """A server session's retryable-write state (a server's ``config.transactions`` entry)."""

    txn: int = -1  # the newest txnNumber begun on it
    executed: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # checked out by one write at a time


class Member:
    """One mongod: a mockupdb server of its own, its role from the set's state."""

    def __init__(self, rs: ReplicaSet, index: int) -> None:
        self.rs, self.index = rs, index
        self.process_id = ObjectId()
        self.counter = 0  # topologyVersion.counter: raised at every change of this member's state
        self.down = False  # unreachable: every connection is closed at once
        self.silent = False  # crashed, or cut off: it answers nothing, and closes nothing
        self.server = MockupDB(auto_ismaster=False)
        self.server.autoresponds(self._handle)

    @property
    def address(self) -> str:
        return f"localhost:{self.server.port}"

    @property
    def is_primary(self) -> bool:
        return self.rs.primary == self.index

    def _handle(self, request: Request) -> bool:
        """Called by mockupdb under its one lock: the command runs in a thread of its own."""
        if self.down or self.rs.stopped:
            with contextlib.suppress(OSError):  # the client's end may be gone already (a reset)
                request.hangup()
            return True
        if self.silent:
            return True  # never answered: the client waits on an open connection
        name = request.command_name
        doc = dict(request.doc)
        if name in HANDSHAKE:
            if "client" in doc:  # a connection's first hello names the application
                with self.rs.lock:
                    self.rs.connections[request._client] = {
                        "appName": doc["client"].get("application", {}).get("name"),
                        "clientMetadata": doc["client"], "client": f"127.0.0.1:{request.client_port}"}
            if "topologyVersion" in doc and "maxAwaitTimeMS" in doc:
                threading.Thread(target=self._awaitable_hello, args=(request, doc), daemon=True).start()
                return True
            return self._hello(request)
        with self.rs.lock:
            self.rs.commands.append((name, copy.deepcopy(doc)))
            fault = next((fault for fault in self.rs.faults if fault.matches(name, doc)), None)
            if fault is not None:
                fault.hits += 1
        if fault is not None and fault.action == "hangup":
            return request.hangup()
        if fault is not None and fault.action == "error":
            return request.replies(ok=0, errmsg=f"scripted fault {fault.code}", code=fault.code,
                                   errorLabels=list(fault.labels))
        threading.Thread(target=self.rs.run, args=(self, request, name, doc, fault), daemon=True).start()
        return True

    def _hello(self, request: Request) -> bool:
        with contextlib.suppress(OSError):
            request.replies(self.hello())
        return True

    def _awaitable_hello(self, request: Request, doc: dict[str, Any]) -> None:
        """The streaming protocol: answer when this member's state changes, or at maxAwaitTimeMS."""
        seen = doc["topologyVersion"]
        deadline = time.monotonic() + doc["maxAwaitTimeMS"] / 1000
        with self.rs.lock:
            while (seen.get("processId") == self.process_id and seen.get("counter") == self.counter
                   and not self.rs.stopped and not self.down and time.monotonic() < deadline):
                self.rs.lock.wait(deadline - time.monotonic())
            while self.silent and not self.rs.stopped:  # a crashed member never answers
                self.rs.lock.wait(1.0)
        if self.down or self.rs.stopped:
            with contextlib.suppress(OSError):
                request.hangup()
            return
        self._hello(request)

    def hello(self) -> dict[str, Any]:
        rs = self.rs
        with rs.lock:
            primary = rs.primary
            is_primary = primary == self.index
            reply = dict(
                ok=1, isWritablePrimary=is_primary, ismaster=is_primary, secondary=not is_primary,
                setName="rs0", hosts=[member.address for member in rs.members], me=self.address, setVersion=1,
                topologyVersion={"processId": self.process_id, "counter": self.counter},
                maxWireVersion=rs.max_wire_version, minWireVersion=0, logicalSessionTimeoutMinutes=30,
                maxBsonObjectSize=16 * 1024 * 1024, maxMessageSizeBytes=48_000_000, maxWriteBatchSize=100_000,
                localTime=datetime.now(), connectionId=1, **rs.times(rs.committed))
            if primary is not None:
                reply["primary"] = rs.members[primary].address
            if is_primary:
                reply["electionId"] = ObjectId(f"7fffffff{rs.term:016x}")
        return reply


# Commands that belong to no request: a cursor's end, a session's (the driver's pool). A test
# counting what requests send leaves them out.
NOT_A_REQUEST = frozenset({"endSessions", "killCursors"})


@dataclass
class ReplicaSet:
    """The set: :meth:`uri` for the driver; ``commands`` as received; ``faults`` to play.
    ``size`` members, the first primary (none when ``writable`` is False: a set in which the
    one member the test reaches is a secondary)."""

    size: int = 1
    writable: bool = True
    change_streams: bool = True  # False: a standalone server, which has none
    current_op: bool = True  # False: $currentOp is refused (Unauthorized)
    batch_size: int = 101  # a find's or an aggregate's batch (101: a server's first batch)
    lagging: bool = False  # the secondaries acknowledge nothing: the majority commit point stays
    max_wire_version: int = 25  # MongoDB 8.0; 6 is 3.6, 8 is 4.2
    auth_fails: bool = False  # every authentication is refused (AuthenticationFailed, 18)
    commands: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.data = mongomock.MongoClient()
        self.lock = threading.Condition(threading.RLock())
        self.clock = 1  # the cluster time's increment: every applied write advances it
        self.committed = 1  # the majority commit point
        self.primary: int | None = 0 if self.writable else None
        self.term = 1
        self.stopped = False
        self.connections: dict[Any, dict[str, Any]] = {}  # socket -> what its handshake said
        self.members = [Member(self, index) for index in range(self.size)]
        self.streams = Streams(self)
        self.executor = Commands(self)
        self.sessions: dict[bytes, TxnSession] = {}  # lsid -> its retryable writes
        self.journal: list[Undo] = []  # every document changed past the commit point, in optime order
        self._ops: set[Op] = set()  # executing now
        self.refusals: list[tuple[str, int]] = []  # (command, code) of every error the set answered
        self.rollbacks = 0  # elections that rolled writes back
        self._op_ids = itertools.count()

    # -- the test's side

    def start(self) -> ReplicaSet:
        for member in self.members:
            member.server.run()
        return self

    def stop(self) -> None:
        """Close every socket at once. mockupdb's own stop joins its accept thread, which waits
        up to a second in select(); its threads are daemons, so nothing is left behind."""
        with self.lock:
            self.stopped = True
            self.lock.notify_all()
        for member in self.members:
            server = member.server
            server._stopped = True
            server._listening_sock.close()
            for sock in list(server._server_socks):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    @property
    def address(self) -> str:
        return self.members[0].address

    @property
    def db(self) -> Any:
        """The data, for a test to look at or arrange: every call under the set's lock."""
        return _Locked(self.data, self.lock)

    def uri(self, **options: str) -> str:
        hosts = self.address if options.get("directConnection") == "true" else ",".join(
            member.address for member in self.members)
        query = "&".join(f"{key}={value}" for key, value in {"replicaSet": "rs0", **options}.items())
        return f"mongodb://{hosts}/?{query}"

    def script(self, *faults: Fault) -> None:
        with self.lock:
            for fault in faults:
                if fault.action == "race":
                    fault.gate, fault.serial = threading.Barrier(fault.times, timeout=10), threading.Lock()
            self.faults.extend(faults)

    def release(self, fault: Fault) -> None:
        """The commands a ``"hold"`` fault holds go on."""
        with self.lock:
            fault.released = True
            self.lock.notify_all()

    def sent(self, name: str, collection: str | None = None) -> list[dict[str, Any]]:
        """The commands named ``name`` received so far (on ``collection``)."""
        with self.lock:
            return [doc for command, doc in self.commands
                    if command == name and (collection is None or doc.get(name) == collection)]

    def forget(self) -> None:
        with self.lock:
            self.commands.clear()

    def lose_history(self) -> None:
        self.streams.lose_history()

    def kill_cursors(self) -> None:
        """Every open (non-stream) cursor is gone (``killCursors`` by an operator, or the idle
        timeout): its next getMore is CursorNotFound."""
        with self.lock:
            self.executor.cursors.clear()

    def catch_up(self) -> None:
        """The secondaries acknowledge again: the commit point reaches the newest write."""
        with self.lock:
            self.lagging = False
            self._commit(self.clock)
            self.lock.notify_all()

    def expire(self, now: datetime | None = None) -> int:
        """One pass of the TTL monitor (a primary runs one every 60 s; here only when a test
        asks): every document whose TTL index's field holds a date (in an array, its earliest)
        at least ``expireAfterSeconds`` before ``now`` is deleted, each an oplog entry and a
        ``delete`` change event. None without a primary. How many it deleted."""
        now = (now or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None)
        deleted = 0
        with self.lock:
            if self.primary is None:
                return 0
            for database in self.data.list_database_names():
                for name in self.data[database].list_collection_names():
                    collection = self.data[database][name]
                    for index in collection.index_information().values():
                        if "expireAfterSeconds" not in index or len(index["key"]) != 1:
                            continue
                        path, after = index["key"][0][0], timedelta(seconds=index["expireAfterSeconds"])
                        for document in list(collection.find({path: {"$exists": True}})):
                            value = document
                            for part in path.split("."):
                                value = value.get(part) if isinstance(value, dict) else None
                            dates = [item for item in (value if isinstance(value, list) else [value])
                                     if isinstance(item, datetime)]
                            if dates and min(dates) + after <= now:
                                collection.delete_one({"_id": document["_id"]})
                                self.applied(None, database, name, document["_id"], document, None)
                                deleted += 1
        return deleted

    def step_down(self, elect: int | None = None, after: float | None = 0.0, announce: bool = True) -> threading.Event:
        """The primary steps down: it answers as a secondary, and the writes it is executing are
        interrupted. After ``after`` seconds (None: not until :meth:`elect`) member ``elect``
        (default: the next one) is elected with a new term; the event returned is set then.
        ``announce=False``: the driver's monitors learn of the step-down only from the election
        (as through a partition, or before their next heartbeat), so a command may still reach
        the old primary and be refused as not primary."""
        elected = threading.Event()
        with self.lock:
            old = self.primary
            self.primary = None
            for op in self._ops:
                if op.member.index == old and op.name in WRITES:
                    op.interrupted = True
            if announce:
                self._changed()
        target = elect if elect is not None else ((old or 0) + 1) % len(self.members)

        def election(delay: float) -> None:
            time.sleep(delay)  # the scripted delay: no primary meanwhile
            self.elect(target)
            elected.set()

        if after is not None:
            threading.Thread(target=election, args=(after,), daemon=True).start()
        return elected

    def crash(self, elect: int | None = None, after: float | None = 0.0) -> threading.Event:
        """The primary crashes, or is cut off by a partition: it answers nothing more (neither
        the commands it is executing nor any hello) and closes no connection, so the driver
        learns nothing from it; its connections wait until their own timeouts. The other
        members elect ``elect`` after ``after`` seconds, and the driver learns of it from them
        (their streaming hello answers at once). Unlike :meth:`set_down` (a killed process:
        every connection reset at once) or :meth:`step_down` (a clean step-down)."""
        with self.lock:
            self.members[self.primary if self.primary is not None else 0].silent = True
        return self.step_down(elect=elect, after=after, announce=False)

    def elect(self, index: int) -> None:
        """Member ``index`` is elected. The writes past the commit point that another member
        applied never reached it (the secondaries acknowledged none of them): they are rolled
        back."""
        with self.lock:
            self._roll_back(index)
            self.term += 1
            self.primary = index
            self._changed()

    def set_down(self, index: int, down: bool = True) -> None:
        """Member ``index``'s process is killed (every connection reset at once), or started
        again: a new process, without the cursors and change streams of the old one."""
        member = self.members[index]
        with self.lock:
            member.down = down
            if down:
                self.executor.kill_member(index)
                self.streams.kill_member(index)
                member.process_id = ObjectId()  # topologyVersion.processId: a restarted server's is new
            self._changed()
        if down:
            for sock in list(member.server._server_socks):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _changed(self) -> None:
        for member in self.members:
            member.counter += 1
        self.lock.notify_all()

    # -- the server's side

    def tick(self) -> int:
        """A new oplog entry (under the lock): its optime; the commit point follows it unless
        the secondaries lag."""
        self.clock += 1
        if not self.lagging:
            self._commit(self.clock)
        self.lock.notify_all()
        return self.clock

    def applied(self, op: Op | None, database: str, collection: str, _id: Any, before: dict[str, Any] | None,
                after: dict[str, Any] | None, update: Any = None) -> None:
        """One document a write changed (under the lock, by the write): its oplog entry, with
        its optime (the write's operation time, if it is its last), what a majority snapshot
        and a rollback need (the document as it was) while the commit point is behind it, and
        its change event."""
        optime = self.tick()
        if op is not None:
            op.optime = optime
        if optime > self.committed:
            member = op.member.index if op is not None else self.primary if self.primary is not None else -1
            self.journal.append(Undo(optime, member, database, collection, _id, copy.deepcopy(before)))
        self.streams.record(database, collection, _id, before, after, update, optime)

    def _commit(self, optime: int) -> None:
        """The commit point reaches ``optime`` (under the lock)."""
        self.committed = max(self.committed, optime)
        self.journal = [undo for undo in self.journal if undo.optime > self.committed]

    def snapshot(self, database: str) -> Any:
        """The database as a majority read sees it (under the lock): the newest data, less what
        the commit point has not reached (each such document as it was before)."""
        pending = [undo for undo in self.journal if undo.optime > self.committed and undo.database == database]
        if not pending:
            return self.data[database]
        scratch = mongomock.MongoClient()[database]
        for name in self.data[database].list_collection_names():
            documents = list(self.data[database][name].find())
            if documents:
                scratch[name].insert_many(documents)
        for undo in reversed(pending):
            scratch[undo.collection].delete_one({"_id": undo._id})
            if undo.before is not None:
                scratch[undo.collection].insert_one(copy.deepcopy(undo.before))
        return scratch

    def _roll_back(self, elected: int) -> None:
        """Member ``elected`` never had the writes past the commit point another member applied
        (under the lock): the data goes back to what it had, their change events (never
        delivered) and their retryable-write records with it, and the member that applied them
        closes every client connection as it enters rollback."""
        lost = [undo for undo in self.journal if undo.optime > self.committed and undo.member != elected]
        if not lost:
            return
        for undo in reversed(lost):
            collection = self.data[undo.database][undo.collection]
            collection.delete_one({"_id": undo._id})
            if undo.before is not None:
                collection.insert_one(copy.deepcopy(undo.before))
        gone = {undo.optime for undo in lost}
        self.journal = [undo for undo in self.journal if undo.optime not in gone]
        self.streams.rolled_back()
        for session in self.sessions.values():
            session.executed = {statement: done for statement, done in session.executed.items()
                                if done[0] not in gone}
        self.rollbacks += 1
        for index in {undo.member for undo in lost if undo.member >= 0}:  # a member in rollback closes
            for sock in list(self.members[index].server._server_socks):  # every client connection
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def times(self, operation_time: int | None = None) -> dict[str, Any]:
        """``operationTime`` (the operation's, else the newest write's) and ``$clusterTime``."""
        cluster = Timestamp(1_700_000_000, self.clock)
        return {"operationTime": Timestamp(1_700_000_000, self.clock if operation_time is None else operation_time),
                "$clusterTime": {"clusterTime": cluster, "signature": {"hash": b"\0" * 20, "keyId": 0}}}

    @staticmethod
    def interrupted_reply() -> dict[str, Any]:
        return {"ok": 0, "code": INTERRUPTED_BY_STEP_DOWN, "codeName": "InterruptedDueToReplStateChange",
                "errmsg": "operation was interrupted because of a step-down", "errorLabels": ["RetryableWriteError"]}

    def run(self, member: Member, request: Request, name: str, doc: dict[str, Any], fault: Fault | None) -> None:
        """Execute one command in its own thread, and answer (unless the client went away)."""
        max_time = doc.get("maxTimeMS") if name != "getMore" else None
        target = doc.get("collection") if name == "getMore" else doc.get(name)
        op = Op(member, name, time.monotonic() + max_time / 1000 if max_time else None, connection=request._client,
                ns=f"{doc.get('$db', 'admin')}.{target if isinstance(target, str) else '$cmd.' + name}")
        with self.lock:
            self._ops.add(op)
        try:
            reply = self._run(op, doc, fault)
        finally:
            with self.lock:
                self._ops.discard(op)
        if member.silent:
            return  # it crashed meanwhile: executed or not, no answer ever comes
        if reply is not None and (not reply.get("ok") or "writeConcernError" in reply):
            with self.lock:
                self.refusals.append((name, reply.get("code") or reply["writeConcernError"]["code"]))
        try:
            if reply is None or (fault is not None and fault.action == "hangup_after"):
                request.hangup()
            else:
                request.replies(reply)
        except OSError:  # the client went away meanwhile (it gave up waiting)
            pass

    def _run(self, op: Op, doc: dict[str, Any], fault: Fault | None) -> dict[str, Any] | None:
        name, member = op.name, op.member
        if fault is not None and fault.action == "delay" and not self._wait(op, lambda: False, fault.seconds):
            return self._waited_out(op)
        if fault is not None and fault.action == "hold" and not self._wait(op, lambda: fault.released):
            return self._waited_out(op)
        if name in WRITES and not member.is_primary:
            return {"ok": 0, "code": NOT_WRITABLE_PRIMARY, "codeName": "NotWritablePrimary",
                    "errmsg": "not primary", "errorLabels": ["RetryableWriteError"]}
        if name in READS and not member.is_primary and doc.get("$readPreference", {}).get("mode",
                                                                                         "primary") == "primary":
            return {"ok": 0, "code": NOT_PRIMARY_NO_SECONDARY_OK, "codeName": "NotPrimaryNoSecondaryOk",
                    "errmsg": "not primary and secondaryOk=false"}
        after = (doc.get("readConcern") or {}).get("afterClusterTime")
        if after is not None and not self._wait(op, lambda: self.committed >= after.inc):
            return self._waited_out(op)
        key = self._retry_key(doc) if name in WRITES else None
        if key is None:
            return self._execute(op, doc, fault)
        lsid, txn = key
        with self.lock:
            session = self.sessions.setdefault(lsid, TxnSession())
        with session.lock:  # one write at a time: a retry that arrives while the first runs waits for it
            with self.lock:
                if txn < session.txn:
                    return {"ok": 0, "code": TRANSACTION_TOO_OLD, "codeName": "TransactionTooOld",
                            "errmsg": f"Retryable write with txnNumber {txn} is prohibited on session "
                                      f"{uuid.UUID(bytes=lsid)} because a newer retryable write with txnNumber "
                                      f"{session.txn} has already started on this session."}
                if txn > session.txn:
                    session.txn, session.executed = txn, {}
                op.executed = session.executed
            return self._execute(op, doc, fault)

    def _waited_out(self, op: Op) -> dict[str, Any]:
        if op.interrupted:
            return self.interrupted_reply()
        return {"ok": 0, "code": 50, "codeName": "MaxTimeMSExpired", "errmsg": "operation exceeded time limit"}

    def _wait(self, op: Op, condition: Callable[[], bool], seconds: float | None = None) -> bool:
        """Wait until ``condition`` holds (``seconds`` at most), within the op's maxTimeMS and
        while it is not interrupted; whether it held (or the seconds passed)."""
        until = None if seconds is None else time.monotonic() + seconds
        with self.lock:
            while not condition():
                now = time.monotonic()
                if until is not None and now >= until:
                    return True
                if op.interrupted or self.stopped or (op.deadline is not None and now >= op.deadline):
                    return False
                limits = [limit for limit in (until, op.deadline) if limit is not None]
                self.lock.wait(min(limits) - now if limits else 0.5)
            return True

    def _execute(self, op: Op, doc: dict[str, Any], fault: Fault | None) -> dict[str, Any] | None:
        name = op.name
        if op.interrupted:
            return self.interrupted_reply()
        if fault is not None and fault.action == "race":
            assert fault.gate is not None and fault.serial is not None
            fault.gate.wait()
            seen = self.executor.matched(name, doc)
            fault.gate.wait()  # every racer has read; now they commit, one after the other
            with fault.serial:
                conflict = self._conflict(name, doc, seen, fault)
                reply = conflict or self._dispatch_safely(op, doc)
        else:
            reply = self._dispatch_safely(op, doc)
        operation_time = None
        with self.lock:
            if name in WRITES and reply.get("ok"):
                if op.optime is None and name in CATALOG_WRITES:
                    op.optime = self.tick()
                # A write that changed nothing (or a retry answered from its record) waits, as a
                # server's does, for the newest optime the member has.
                operation_time = op.optime if op.optime is not None else self.clock
            elif name in READS:
                operation_time = self.committed  # a majority read answers at the commit point
        reply = {**reply, **self.times(operation_time)}
        if name in WRITES and reply.get("ok"):
            reply = self._write_concern(op, doc, reply, operation_time, fault)
        return reply

    def _write_concern(self, op: Op, doc: dict[str, Any], reply: dict[str, Any], operation_time: int | None,
                       fault: Fault | None) -> dict[str, Any]:
        concern = doc.get("writeConcern") or {}
        if fault is not None and fault.action == "write_concern_error":
            return {**reply, **self.concern_error(fault.code or 64, concern, fault.labels)}
        if concern.get("w") != "majority" or operation_time is None:
            return reply
        wtimeout = concern.get("wtimeout") or None
        self._wait(op, lambda: self.committed >= operation_time, None if wtimeout is None else wtimeout / 1000)
        with self.lock:
            if self.committed >= operation_time:
                return reply
        if op.interrupted:  # stepped down while waiting: applied here, maybe never replicated
            return {**reply, **self.concern_error(189, concern, ("RetryableWriteError",))}
        return {**reply, **self.concern_error(64, concern, ())}

    @staticmethod
    def concern_error(code: int, concern: dict[str, Any], labels: tuple[str, ...]) -> dict[str, Any]:
        """A ``writeConcernError`` as a server sends it: the write applied, its concern not met."""
        info: dict[str, Any] = {"writeConcern": {**concern, "provenance": "clientSupplied"}}
        names = {64: "WriteConcernFailed", 91: "ShutdownInProgress", 189: "PrimarySteppedDown",
                 100: "UnsatisfiableWriteConcern"}
        message = "waiting for replication timed out" if code == 64 else f"write concern error {code}"
        if code == 64:
            info["wtimeout"] = True
        error = {"writeConcernError": {"code": code, "codeName": names.get(code, "UnknownError"), "errmsg": message,
                                       "errInfo": info}}
        return {**error, **({"errorLabels": list(labels)} if labels else {})}

    def _dispatch_safely(self, op: Op, doc: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._dispatch(op, doc)
        except mongomock.OperationFailure as exc:
            return {"ok": 0, "errmsg": str(exc), "code": exc.code or 2}
        except Exception as exc:  # a gap of this stand-in: an answer, never a hung driver
            return {"ok": 0, "errmsg": f"{type(exc).__name__}: {exc}", "code": 1}

    def _conflict(self, name: str, doc: dict[str, Any], seen: dict[Any, Any], fault: Fault) -> dict[str, Any] | None:
        """What a racer whose documents another racer changed since it read them gets: None
        when they did not change, or when the server retries it (``fault.code`` 0)."""
        if not fault.code or self.executor.matched(name, doc) == seen:
            return None
        if fault.code == 11000:
            return {"ok": 0, "code": 11000, "codeName": "DuplicateKey", "errmsg": "E11000 duplicate key error "
                                                                                 "(a concurrent upsert)"}
        return {"ok": 0, "code": fault.code, "codeName": "WriteConflict",
                "errmsg": "WriteConflict error: this operation conflicted with another operation. Please retry your "
                          "operation or multi-document transaction.", "errorLabels": list(fault.labels)}

    def _dispatch(self, op: Op, doc: dict[str, Any]) -> dict[str, Any] | None:
        name, member = op.name, op.member.index
        commands = self.executor
        if name in ("saslStart", "saslContinue", "authenticate"):
            if self.auth_fails:
                return {"ok": 0, "code": 18, "codeName": "AuthenticationFailed", "errmsg": "Authentication failed."}
            return {"ok": 0, "code": 2, "errmsg": "this stand-in authenticates nobody"}
        if name == "getMore":
            if self.streams.is_stream(doc["getMore"]):
                return self.streams.more(member, doc)
            with self.lock:
                return commands.get_more(member, doc)
        if name == "killCursors":
            with self.lock:
                commands.kill(doc.get("cursors", []))
                self.streams.kill(doc.get("cursors", []))
            return {"ok": 1, "cursorsKilled": doc.get("cursors", [])}
        if name == "aggregate":
            pipeline = doc.get("pipeline", [])
            if pipeline and "$changeStream" in pipeline[0]:
                return self.streams.open(member, doc, pipeline)
            if pipeline and "$currentOp" in pipeline[0]:
                return self._current_op(doc, pipeline)
            return commands.aggregate(member, doc)
        if name == "createIndexes":
            quorum = doc.get("commitQuorum", "votingMembers")
            needed = len(self.members) if quorum == "votingMembers" else len(self.members) // 2 + 1
            if not self._wait(op, lambda: sum(not m.down for m in self.members) >= needed):
                return self._waited_out(op)
            return commands.create_indexes(doc)
        simple = {"ping": lambda: {"ok": 1}, "endSessions": lambda: {"ok": 1},
                  "collMod": lambda: commands.coll_mod(doc),
                  "buildInfo": lambda: {"ok": 1, "version": "8.0.4", "versionArray": [8, 0, 4, 0]},
                  "find": lambda: commands.find(member, doc), "count": lambda: commands.count(doc),
                  "insert": lambda: commands.insert(op, doc), "update": lambda: commands.update(op, doc),
                  "delete": lambda: commands.delete(op, doc),
                  "findAndModify": lambda: commands.find_and_modify(op, doc),
                  "listIndexes": lambda: commands.list_indexes(doc), "dropIndexes": lambda: commands.drop_indexes(doc)}
        if name in simple:
            return simple[name]()
        return {"ok": 0, "errmsg": f"no such command: {name}", "code": 59}

    @staticmethod
    def _retry_key(doc: dict[str, Any]) -> tuple[bytes, int] | None:
        if "txnNumber" not in doc or "lsid" not in doc:
            return None
        return bytes(doc["lsid"]["id"]), int(doc["txnNumber"])

    def _current_op(self, doc: dict[str, Any], pipeline: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.current_op:
            return {"ok": 0, "code": 13, "codeName": "Unauthorized", "errmsg": "not authorized on admin to execute "
                                                                              "command { aggregate: 1 }"}
        with self.lock:
            executing = {op.connection: op for op in self._ops}
            connections = [{"type": "op", "active": True, "ns": executing[sock].ns,
                            "command": {executing[sock].name: 1}, **info} if sock in executing
                           else {"type": "idleConnection", "active": False, **info}
                           for sock, info in self.connections.items() if sock.fileno() != -1]
        scratch = mongomock.MongoClient()["scratch"]["operations"]
        if connections:
            scratch.insert_many(connections)
        projection = {"$project": {"_id": 0, "type": 1, "active": 1, "appName": 1, "clientMetadata": 1, "client": 1,
                                   "ns": 1, "command": 1}}
        return {"ok": 1, "cursor": {"id": 0, "ns": "admin.$cmd.aggregate",
                                    "firstBatch": list(scratch.aggregate([projection, *pipeline[1:]]))}}


class _Locked:
    """A mongomock client, database or collection whose every call runs under ``lock``; a
    cursor comes back as a list."""

    def __init__(self, target: Any, lock: Any) -> None:
        self._target, self._lock = target, lock

    def __getitem__(self, name: str) -> _Locked:
        return _Locked(self._target[name], self._lock)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                result = value(*args, **kwargs)
                return list(result) if isinstance(result, mongomock.collection.Cursor) else result

        return call


def wire_settings(primary: ReplicaSet, **overrides: Any) -> Any:
    """The storage settings of a service on ``primary``."""
    from tokensvc.config import StorageSettings

    return StorageSettings(**{"backend": "mongodb", "mongodb_uri": primary.uri(), "database": "tokensvc",
                              "timeout_ms": BUDGET_MS, **overrides})

