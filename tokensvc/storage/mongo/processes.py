"""Who uses the MongoDB store, and of which release: what ``tokensvc storage finalize`` must
know before it raises the compatibility version, and what ``tokensvc storage status`` shows.

**Registered processes.** Every ``tokensvc serve`` process (release 0.10.0 and later) has an
entry in the collection ``processes``: its release, the newest format it reads, the format it
writes now, its host and pid, and its heartbeat. It is made when the process opens the store,
before it reads the format document (so a finalize either sees the process or the process sees
the finalize), and renewed every ``storage.heartbeat_seconds``; each heartbeat reads the format
document again, so a process follows a raised compatibility version within one heartbeat and
says so in its entry (``writes``). A process that stops marks its entry stopped; one that dies
stops renewing it, and counts as running for :data:`MISSED_BEATS` heartbeats after its last.
Entries are kept a day after their last heartbeat (a TTL index), the history ``status`` shows.
Clocks are assumed to agree within a heartbeat (NTP).

**Connections.** Release 0.9.0 predates the registry. Its processes are found by their
connections: every tokensvc process names its release to MongoDB in the handshake's
``appName`` (0.9.0 says ``tokensvc``; later releases ``tokensvc/<release>``), and
``$currentOp`` lists the connections of the user running it with their ``appName`` and client
address; on a replica set no privilege beyond ``readWrite`` is needed for one's own user. A
connection names no database (the server gives one only for the operation it executes), and
one server may hold the stores of several deployments, so a connection counts only while it
executes an operation in this store's database: every serving process keeps a change stream
open on its database (its revocation relay), asked for more as soon as it answers, so it is
listed that way nearly all the time (with access control too: it runs on an authenticated
connection). For the instant between two requests, :func:`connected` looks again while a 0.9.0
connection is listed that no operation places (docs/reference/store-format.md, "Finding older processes"). The limits:
processes connecting as another database user are not seen; through ``mongos`` (which lists the
shards' operations, not its clients), on a standalone server (no change streams: 0.9.0 polls
now and then instead) and where the server refuses ``$currentOp`` the check gives no answer
(None), and finalize needs the operator's word (``--previous-release-stopped``). The backstop
is the tripwire finalize leaves (``storage/mongo/format.py``): a 0.9.0 process started after it stops
at start-up (having answered, from the old format, what reached it while it was starting: it
is not ready then); one that ran through the finalize unseen is found afterwards by what it
writes (``storage/mongo/migrations.py``) and by its connections.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, timedelta
from typing import Any

from pymongo.errors import OperationFailure

from tokensvc.records import utcnow
from tokensvc.storage.base import StorageError, StoreFault
from tokensvc.storage.mongo import format as store_format
from tokensvc.storage.mongo.connection import Connection
from tokensvc.storage.mongo.indexes import Indexes

log = logging.getLogger(__name__)

COLLECTION = "processes"
MISSED_BEATS = 3  # heartbeats a process may miss and still count as running
LAPSED_BEATS = 2  # heartbeats missed after which a migration no longer waits for a process to follow
APP_NAME = re.compile(r"tokensvc(?:/(\S+))?")  # the appName of a tokensvc process: its release after a slash
SAMPLES = 3  # looks at the server's operations while a 0.9.0 connection is listed that none places
SAMPLE_SECONDS = 1.5  # over this long: more than one wait of a change stream's request (STREAM_WAIT_MS)


def release_name(release: str | None) -> str:
    """How the storage commands name a release (None: one that does not name itself)."""
    return release or "0.9.0 or earlier"


@dataclass(frozen=True, slots=True)
class Seen:
    """A process (registered) or a connection of a release, as the storage commands see it."""

    release: str | None  # None: a release that does not name itself (0.9.0)
    where: str  # host:pid of a registered process; the client address of a connection
    reads: int  # the newest format it reads
    writes: int | None = None  # the format a registered process writes now
    seen_at: Any = None  # a registered process's last heartbeat
    heartbeat_seconds: int = 0  # a registered process's

    @property
    def name(self) -> str:
        return release_name(self.release)

    def lapsed(self) -> bool:
        """Whether a registered process has missed two heartbeats in a row: it is dead, or cut
        off from the store (and then writes nothing either). Still counted as running (three)."""
        if self.seen_at is None:
            return False
        return self.seen_at + timedelta(seconds=LAPSED_BEATS * self.heartbeat_seconds) < utcnow()


class Registration:
    """This process's entry among the running processes, and its heartbeat."""

    def __init__(self, heartbeat_seconds: int) -> None:
        self.heartbeat_seconds = heartbeat_seconds
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.announced = False

    def _entry(self, connection: Connection, **extra: Any) -> dict[str, Any]:
        return {"release": connection.history.release, "reads": connection.history.newest,
                "heartbeat_seconds": self.heartbeat_seconds, "seen_at": utcnow(), **extra}

    async def announce(self, connection: Connection) -> None:
        """The entry made (at open, before the format is read): the process counts as running."""
        await connection.db[COLLECTION].update_one({"_id": self.id}, {"$set": self._entry(
            connection, host=socket.gethostname(), pid=os.getpid(), started_at=utcnow(), stopped_at=None,
            writes=None)}, upsert=True)
        self.announced = True

    async def beat(self, connection: Connection, indexes: Indexes) -> None:
        """Follow the store's format (a raised compatibility version is written from now on),
        then renew the entry, saying which format this process writes. A compatibility version
        this release cannot write (a later release finalized) is :class:`StoreFault`, with the
        line a start would print: the process stops serving (not ready, nothing written) and
        stops, as it would refuse to start."""
        state = await store_format.read(connection.db)
        refusal = None if state is None else connection.history.refusal(state)
        if refusal is not None:
            connection.refusal = refusal  # the store is no longer prepared (not ready), and writes nothing
            raise StoreFault(refusal)
        if state is not None and state.compatibility != connection.format.compatibility:
            log.info("the store's compatibility version is now %d (was %d): writing format %d",
                     state.compatibility, connection.format.compatibility, state.compatibility)
            connection.format = state
            await indexes.follow()
        elif state is not None:
            connection.format = state
        await connection.db[COLLECTION].update_one({"_id": self.id}, {"$set": self._entry(
            connection, writes=connection.format.compatibility)})

    async def stopped(self, connection: Connection) -> None:
        await connection.db[COLLECTION].update_one({"_id": self.id}, {"$set": {"stopped_at": utcnow()}})

    async def run(self, connection: Connection, heartbeat: Callable[[], Awaitable[None]]) -> None:
        """Beat (``heartbeat``: the store's operation, :meth:`beat` with its own budget and
        backoff) every ``heartbeat_seconds`` until cancelled, or until the store's format refuses
        this release (:class:`StoreFault`, raised: the process stops); a missed beat is logged
        and the next one tried."""
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            try:
                await heartbeat()
            except (StorageError, StoreFault) as exc:
                if connection.refusal is not None:
                    raise
                log.warning("heartbeat missed (%s); the storage commands count this process as running for "
                            "%d heartbeats after its last", exc, MISSED_BEATS)


async def running(connection: Connection) -> list[Seen]:
    """The registered processes that have not stopped and whose last heartbeat is recent."""
    now = utcnow()
    found = []
    for entry in await connection.db[COLLECTION].find({"stopped_at": None}).to_list(None):
        seen_at = _seen_at(entry)
        if _alive(entry, now):
            found.append(Seen(entry.get("release"), f"{entry.get('host')}:{entry.get('pid')}", entry.get("reads", 1),
                              entry.get("writes"), seen_at, entry.get("heartbeat_seconds", 10)))
    return found


def _seen_at(entry: dict[str, Any]) -> Any:
    return entry["seen_at"] if entry["seen_at"].tzinfo else entry["seen_at"].replace(tzinfo=UTC)


def _alive(entry: dict[str, Any], now: Any) -> bool:
    """Whether a registered process that has not stopped counts as running at ``now``."""
    return bool(_seen_at(entry) + timedelta(seconds=MISSED_BEATS * entry.get("heartbeat_seconds", 10)) >= now)


# The deployment's settings a process says in its entry (``settings``: a later field, which
# 0.10.0 neither writes nor reads): those every instance of one store must share.
SETTINGS_FIELD = "settings"
SETTINGS_FILTER = {"stopped_at": None, SETTINGS_FIELD: {"$exists": True}}


def disagreeing(entries: list[dict[str, Any]], own_id: str, settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Of ``entries`` (the registry's, :data:`SETTINGS_FILTER`), the running processes but
    this one that say another value of any of ``settings``: by their entry's id
    (``host:pid:tag``), those values."""
    now = utcnow()
    found: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if entry["_id"] == own_id or not _alive(entry, now):
            continue
        theirs = entry.get(SETTINGS_FIELD) or {}
        differ = {name: theirs[name] for name, value in settings.items() if name in theirs and theirs[name] != value}
        if differ:
            found[str(entry["_id"])] = differ
    return found


async def recent(connection: Connection) -> list[dict[str, Any]]:
    """Every entry the registry still keeps (a day past its last heartbeat), newest first."""
    return await connection.db[COLLECTION].find({}).sort("seen_at", -1).to_list(None)


async def connected(connection: Connection, quiet: bool = False) -> list[Seen] | None:
    """The connections of tokensvc processes that concern this store, by release: those the
    server (``$currentOp``) lists executing an operation in this store's database (the change
    stream every serving process keeps open on it, asked for more at once each time it answers).
    A connection names no database while it is idle, so the connections of processes serving
    other databases of the server are not counted, nor this command's own (none executes
    anything while it asks). While the server lists a connection of a release without a
    registry entry (0.9.0) that no operation places, and none of this store's, it is asked
    again, :data:`SAMPLES` looks over :data:`SAMPLE_SECONDS` (longer than one wait of a change
    stream): a 0.9.0 process of this store caught between two requests of its stream is found
    at the next look.

    None when it cannot tell: a ``mongos`` (which lists the operations running on the shards,
    not the clients behind it), a server without change streams (a standalone, where 0.9.0 polls
    now and then instead of keeping a stream open), or a server that refuses (not authorized,
    no such stage); ``quiet``: without saying so (the background asks every heartbeat)."""
    hello = await connection.db.command("hello")
    if hello.get("msg") == "isdbgrid" or "setName" not in hello:
        return None
    found: dict[str, Seen] = {}
    for sample in range(SAMPLES):
        if sample:
            await asyncio.sleep(SAMPLE_SECONDS / (SAMPLES - 1))
        operations = await _operations(connection, quiet)
        if operations is None:
            return None
        unplaced = False
        for operation in operations:
            match = APP_NAME.fullmatch(operation.get("appName", ""))
            if match is None:
                continue
            release, client = match.group(1), operation.get("client", "?")
            if operation.get("active") and str(operation.get("ns", "")).partition(".")[0] == connection.db.name:
                found.setdefault(client, Seen(release, client, connection.history.newest_format_of(release)))
            elif release is None and client not in found:
                unplaced = True
        if not unplaced or any(seen.release is None for seen in found.values()):
            break  # nothing left to place, or 0.9.0 found here already: the answer is the same
    return list(found.values())


async def _operations(connection: Connection, quiet: bool) -> list[dict[str, Any]] | None:
    """What ``$currentOp`` lists of tokensvc's connections (idle ones too), or None when the
    server refuses."""
    try:
        cursor = connection.client.admin.aggregate([
            {"$currentOp": {"idleConnections": True}},
            {"$match": {"appName": {"$regex": "^tokensvc(/|$)"}}},
            {"$project": {"appName": 1, "client": 1, "active": 1, "ns": 1}},
        ])
        if asyncio.iscoroutine(cursor):  # PyMongo's aggregate is a coroutine
            cursor = await cursor
        return await cursor.to_list(None)
    except OperationFailure as exc:
        if not quiet:  # its code, never its whole answer (which carries the cluster time's signature)
            log.warning("the server does not list its connections ($currentOp: error %s %s)", exc.code,
                        (exc.details or {}).get("codeName", ""))
        return None
