"""The MongoDB deployment as the driver sees it while the service runs: its pool and its
members' heartbeats, handed to the store's observer (the metrics), and what the driver's view
says about whether writes can succeed.

The driver monitors every member (streaming ``hello``: a member's change of state reaches it at
once). A directly connected member (``directConnection=true``, a topology of one server) that
is not, or no longer, a writable primary would serve reads and fail every write for as long as
it stays so: no wait mends it. :meth:`Topology.unwritable` says so from the latest view,
without a round trip, so that ``/readyz`` answers 503 saying why and writes fail at once
instead of after their whole budget; when the member is primary again, the next view says so
and the process serves again. A replica set without a primary (an election) is no such case:
requests wait for the new primary within their budget.

A primary that crashes, or that a partition cuts off, says nothing: it answers no command and
closes no connection, so what waits on it would wait its whole budget. When the driver learns
of a new primary (the other members' streaming ``hello`` say so at once), the reads and
idempotent writes still waiting are abandoned and run again, on the new primary
(:meth:`Topology.abandoned`: the store stops waiting for them, never cancelling the driver,
storage/mongo/calls.py), and the revocation relay's change stream follows it
(storage/mongo/feed.py).

The store takes the driver's view itself (``topology_description``, the view now) whenever a
heartbeat, failed or not, or a cleared pool says it may have changed, and never listens to the
driver's server and topology events. PyMongo's asyncio driver queues those for listeners in a
queue of 100, which a task on the same event loop empties once a second, and puts into it
blocking: more than 100 changes within a second (an outage under load) blocked the process's
event loop for good. Heartbeats and the pool's events are published at once, unqueued; a new
primary's heartbeat is followed until the driver's view shows it (:meth:`Topology.primary_heard`).

A store that could not be reached at start-up is tried again as soon as the driver sees a
member that takes writes, or a newly elected primary (:meth:`Topology.writable`), not only at
the next step of the start-up's back-off; so are the revocation relay's change stream and a
socket's re-check that failed meanwhile (``Store.reachable``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from pymongo import monitoring
from pymongo.server_type import SERVER_TYPE
from pymongo.topology_description import TOPOLOGY_TYPE

from tokensvc.storage.base import StoreObserver
from tokensvc.storage.mongo import calls

# How the driver names a member's state, in an operator's words.
_STATES = {"RSSecondary": "secondary", "RSArbiter": "arbiter", "RSGhost": "not in a replica-set state yet",
           "RSOther": "neither primary nor secondary", "Unknown": "unknown"}
DIRECT_ADVICE = "point storage.mongodb_uri at the replica set (replicaSet=..., no directConnection=true)"


# After a heartbeat, how soon the store looks again at the driver's view (the driver takes the
# answer in right after it publishes it), and how many times at most it looks for a new
# primary a heartbeat named.
LOOK_SECONDS = 0.01
LOOKS = 50


def not_primary(address: str, state: str) -> str:
    """The one line that says a member takes no writes, and what to do."""
    return f"MongoDB at {address} is not a writable primary ({state}): {DIRECT_ADVICE}"


class Topology:
    """The latest view of the deployment the driver published, and the store's operations that
    an election abandons (:meth:`abandoned`)."""

    def __init__(self, server_changed: Callable[[], None] | None = None) -> None:
        self._server_changed = server_changed  # a member changed its state (the metric)
        self._description: Any = None
        # The primary the driver knew last (its address and election id), kept while it knows
        # none: the crashed primary is often marked unknown before the others elect a new one
        # (a new connection's handshake to it timed out), and what waits on it waits all the same.
        self._primary: tuple[Any, Any] | None = None
        self.elections: set[asyncio.Future[Any]] = set()  # the waits an election abandons (calls.Calls.wait)
        self._writable: asyncio.Future[None] | None = None  # done when a member takes writes again

    @property
    def description(self) -> Any:
        return self._description

    @description.setter
    def description(self, new: Any) -> None:
        old, self._description = self._description, new
        if old is not None and new is not None and self._server_changed is not None:
            before = old.server_descriptions()
            for address, server in new.server_descriptions().items():
                if address in before and before[address].server_type != server.server_type:
                    self._server_changed()
        before, now = self._primary, _primary(new)
        elected = before is not None and now is not None and now != before
        if now is not None:
            self._primary = now
        if elected:
            for waiter in list(self.elections):
                waiter.get_loop().call_soon_threadsafe(calls.wake, waiter, calls.ELECTED)
        if _takes_writes(new) and (not _takes_writes(old) or elected):
            _finish(self._writable)
            self._writable = None

    def abandoned(self) -> set[asyncio.Future[Any]]:
        """The waits abandoned when another primary than the one the driver knew last is
        elected (each woken with :data:`calls.ELECTED`), whether or not it knew none in between:
        what waits on the old one may never come (a primary that crashed or was cut off answers
        nothing, and no connection of it is closed, so the wait would last the whole budget).
        Only for what may simply run again (a read, an idempotent write, the relay's change
        stream, opened again where it stood): a single-document write in flight may have
        applied, and the driver's own retry on the new primary is what runs it once."""
        return self.elections

    def follow(self, now: Callable[[], Any]) -> None:
        """Something may have changed (a heartbeat, a cleared pool): take the driver's view
        (``now()``) at once and once more a moment later, when the driver has taken the change
        in (it publishes a heartbeat just before)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not the asyncio driver's own task
            return
        loop.call_soon(self._take, now)
        loop.call_later(LOOK_SECONDS, self._take, now)

    def _take(self, now: Callable[[], Any]) -> None:
        self.description = now()

    def primary_heard(self, primary: tuple[Any, Any], now: Callable[[], Any]) -> None:
        """A member answered the driver's monitor that it is the primary (``primary``: its
        address and election id). One the store does not know is an election, and any primary
        is the store back when it saw none: the driver's view (``now()``) shows it as soon as
        the driver has taken that answer in, right after it published it, and the store takes
        that view then, looking again every :data:`LOOK_SECONDS` for at most :data:`LOOKS`
        looks (a member that only believes it is primary never shows)."""
        if primary == self._primary and _takes_writes(self._description):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not the asyncio driver's monitor: its queued events say it
            return
        loop.call_soon(self._look, primary, now, LOOKS)

    def _look(self, primary: tuple[Any, Any], now: Callable[[], Any], looks: int) -> None:
        if primary == self._primary and _takes_writes(self._description):
            return  # the driver's events said it meanwhile
        description = now()
        if description.topology_type == TOPOLOGY_TYPE.Single:
            return  # a member connected directly: its events say it
        elected = _primary(description)
        if elected is not None and (elected != self._primary or not _takes_writes(self._description)):
            self.description = description
        elif looks > 1:
            asyncio.get_running_loop().call_later(LOOK_SECONDS, self._look, primary, now, looks - 1)

    def writable(self) -> asyncio.Future[None]:
        """Done when the driver next sees a member that takes writes, having seen none, or
        another primary than the one it knew: what failed for want of one may succeed now."""
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()
        return self._writable

    def unwritable(self) -> str | None:
        """Why no write can succeed now, when only a change of the deployment mends it (a
        directly connected member that is not a writable primary); None otherwise."""
        description = self.description
        if description is None or description.topology_type != TOPOLOGY_TYPE.Single:
            return None
        known = description.known_servers
        if not known or known[0].is_writable:
            return None
        server = known[0]
        host, port = server.address
        return not_primary(f"{host}:{port}", _STATES.get(server.server_type_name, server.server_type_name))


def _finish(future: asyncio.Future[None] | None) -> None:
    """``future`` done, from the driver's events (which may come from another thread)."""
    if future is not None:
        future.get_loop().call_soon_threadsafe(calls.wake, future)


def _takes_writes(description: Any) -> bool:
    return description is not None and any(server.is_writable for server in description.known_servers)


def _primary(description: Any) -> tuple[Any, Any] | None:
    """The primary of a replica set's description, as its address and election id; None."""
    if description is None or description.topology_type == TOPOLOGY_TYPE.Single:
        return None
    for server in description.server_descriptions().values():
        if server.server_type == SERVER_TYPE.RSPrimary:
            return server.address, server.election_id
    return None


class Observed(Protocol):
    """What the driver's events reach (the store's connection): who hears what the store tells,
    and its view of the deployment."""

    observer: StoreObserver
    topology: Topology
    client: Any


class DriverEvents(monitoring.ConnectionPoolListener, monitoring.ServerHeartbeatListener):
    """The driver's pool and heartbeat events, all published at once: the pool's use to the
    store's observer, and after each heartbeat or cleared pool the driver's view to the store's
    :class:`Topology`. Never a server or topology listener (the module's docstring says why)."""

    def __init__(self) -> None:
        self.connection: Observed | None = None

    def connection_checked_out(self, event: monitoring.ConnectionCheckedOutEvent) -> None:
        if self.connection is not None:
            self.connection.observer.pool_checked_out(event.duration or 0.0)

    def connection_checked_in(self, event: monitoring.ConnectionCheckedInEvent) -> None:
        if self.connection is not None:
            self.connection.observer.pool_checked_in()

    def pool_cleared(self, event: monitoring.PoolClearedEvent) -> None:
        """An operation met a network error: the driver marked the member unknown."""
        if self.connection is not None:
            self.connection.topology.follow(self._now)

    def succeeded(self, event: monitoring.ServerHeartbeatSucceededEvent) -> None:
        """A member answered the driver's monitor (ServerHeartbeatListener)."""
        if self.connection is None:
            return
        reply = event.reply
        if reply.is_writable and reply.election_id is not None:
            self.connection.topology.primary_heard((event.connection_id, reply.election_id), self._now)
        self.connection.topology.follow(self._now)

    def failed(self, event: monitoring.ServerHeartbeatFailedEvent) -> None:
        if self.connection is not None:
            self.connection.topology.follow(self._now)

    def _now(self) -> Any:
        """The driver's view of the deployment now."""
        assert self.connection is not None
        return self.connection.client.topology_description

    # The rest of the two interfaces: nothing to count.
    def started(self, event: Any) -> None: ...
    def pool_created(self, event: Any) -> None: ...
    def pool_ready(self, event: Any) -> None: ...
    def pool_closed(self, event: Any) -> None: ...
    def connection_created(self, event: Any) -> None: ...
    def connection_ready(self, event: Any) -> None: ...
    def connection_closed(self, event: Any) -> None: ...
    def connection_check_out_started(self, event: Any) -> None: ...
    def connection_check_out_failed(self, event: Any) -> None: ...
