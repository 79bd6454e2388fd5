"""Causally consistent sessions for the MongoDB store: the clock every new session is advanced
by, and the one way to the database, whose collections run each call in the current
operation's session (so no direct collection access can skip it)."""

from __future__ import annotations

import contextvars
from typing import Any

# The causally consistent session of the operation running in this task (retry.guarded starts it).
CAUSAL_SESSION: contextvars.ContextVar[Any] = contextvars.ContextVar("tokensvc_mongo_session", default=None)
# The collection methods that take a session.
SESSIONED = frozenset({"find", "find_one", "find_one_and_update", "find_one_and_delete", "find_one_and_replace",
                       "insert_one", "insert_many", "update_one", "update_many", "replace_one", "delete_one",
                       "delete_many", "count_documents", "aggregate", "bulk_write", "distinct"})


class SessionedCollection:
    """A collection whose calls run in the current operation's session, when there is one."""

    __slots__ = ("_collection",)

    def __init__(self, collection: Any) -> None:
        self._collection = collection

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._collection, name)
        if name not in SESSIONED:
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            session = CAUSAL_SESSION.get()
            if session is not None:
                kwargs["session"] = session
            return attribute(*args, **kwargs)

        return call


class SessionedDatabase:
    """The database, its collections :class:`SessionedCollection`: the one way the store, the storage
    commands, the migrations and the process registry reach a collection, so none of them can
    read or write outside the current operation's session. Commands that read no record
    (``hello``, ``ping``, ``collMod``) and the change stream, which outlives any operation,
    go to the database as they are."""

    __slots__ = ("_db",)

    def __init__(self, db: Any) -> None:
        self._db = db

    def __getitem__(self, name: str) -> SessionedCollection:
        return SessionedCollection(self._db[name])

    def get_collection(self, name: str) -> SessionedCollection:
        return self[name]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


class CausalClock:
    """The latest cluster and operation time this process has seen, handed to each new
    session (so a read waits for every write acknowledged before it, whichever request made
    it) and taken back from it when it ends.

    Only an operation that succeeded gives back its operation time: a failed one's session may
    hold the time of a write the server applied but could not replicate (its write concern
    failed), which the majority may never reach; every later read would wait on it and fail
    while replication lags. The cluster time (gossip, which no read waits on) is always taken."""

    __slots__ = ("cluster_time", "operation_time")

    def __init__(self) -> None:
        self.cluster_time: dict[str, Any] | None = None
        self.operation_time: Any = None

    def start(self, client: Any) -> Any:
        session = client.start_session(causal_consistency=True)
        if self.cluster_time is not None:
            session.advance_cluster_time(self.cluster_time)
        if self.operation_time is not None:
            session.advance_operation_time(self.operation_time)
        return session

    def seen(self, operation_time: Any, cluster_time: dict[str, Any] | None = None) -> None:
        if operation_time is not None and (self.operation_time is None or operation_time > self.operation_time):
            self.operation_time = operation_time
        if cluster_time is not None and (self.cluster_time is None
                                         or cluster_time["clusterTime"] > self.cluster_time["clusterTime"]):
            self.cluster_time = cluster_time

    async def end(self, session: Any, acknowledged: bool) -> None:
        self.seen(session.operation_time if acknowledged else None, session.cluster_time)
        await session.end_session()

    async def abandon(self, session: Any) -> None:
        """End the session of a call the store stopped waiting for (storage/mongo/calls.py),
        which goes on in the driver: nothing is sent with it from now on (the driver checks
        that a session has not ended as it writes each command, after it has a server and a
        connection), so a write the store answered 503 for is never sent after that answer.
        Its server session is thrown away, not pooled, as the driver does after a network
        error: a command of the call may still be on the server with its id. Its cluster time
        is taken, its operation time is not (nothing of the call was acknowledged)."""
        server_session = getattr(session, "_server_session", None)
        if server_session is not None:
            server_session.mark_dirty()
        await self.end(session, acknowledged=False)
