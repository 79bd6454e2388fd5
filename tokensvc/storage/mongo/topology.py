"""The MongoDB deployment as the driver sees it while the service runs: its pool, server and
topology events, handed to the store's observer (the metrics), and what they say about
whether writes can succeed.

The driver monitors every member (streaming ``hello``: a member's change of state reaches it at
once) and publishes each new view of the deployment. A directly connected member
(``directConnection=true``, a topology of one server) that is not, or no longer, a writable
primary would serve reads and fail every write for as long as it stays so: no wait mends it.
:meth:`Topology.unwritable` says so from the latest view, without a round trip, so that
``/readyz`` answers 503 saying why and writes fail at once instead of after their whole budget;
when the member is primary again, the next view says so and the process serves again. A
replica set without a primary (an election) is no such case: requests wait for the new
primary within their budget.

A primary that crashes, or that a partition cuts off, says nothing: it answers no command and
closes no connection, so what waits on it would wait its whole budget. When the driver learns
of a new primary (the other members' streaming ``hello`` say so at once), the reads and
idempotent writes still waiting are abandoned and run again, on the new primary
(:meth:`Topology.abandoned`: the store stops waiting for them, never cancelling the driver,
storage/mongo/calls.py).

The driver publishes its topology's events from a queue it empties once a second; its
heartbeats' at once. A heartbeat from a member that says it is a new primary makes the store
take the driver's own view at once (:meth:`Topology.primary_heard`), not up to a second later.

A store that could not be reached at start-up is tried again as soon as the driver sees a
member that takes writes, or a newly elected primary (:meth:`Topology.writable`), not only at
the next step of the start-up's back-off; so are the revocation relay's change stream and a
socket's re-check that failed meanwhile (``Store.reachable``). The relay's change stream, which
stands on the primary that opened it, follows a new primary at once (storage/mongo/feed.py).
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


# After a heartbeat from a new primary, how often and how many times the store looks at the
# driver's view for it: the driver takes the answer in right after it publishes it.
LOOK_SECONDS = 0.01
LOOKS = 50


def not_primary(address: str, state: str) -> str:
    """The one line that says a member takes no writes, and what to do."""
    return f"MongoDB at {address} is not a writable primary ({state}): {DIRECT_ADVICE}"


class Topology:
    """The latest view of the deployment the driver published, and the store's operations that
    an election abandons (:meth:`abandoned`)."""

    def __init__(self) -> None:
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


class DriverEvents(monitoring.ConnectionPoolListener, monitoring.ServerListener, monitoring.TopologyListener,
                   monitoring.ServerHeartbeatListener):
    """The driver's events: pool and server changes to the store's observer, each new view of
    the topology to the store's :class:`Topology`.

    The driver publishes its topology's and servers' events from a queue it empties once a
    second (``pymongo.common.EVENTS_QUEUE_FREQUENCY``), its heartbeats' at once. So a new view
    is taken from the driver itself (``topology_description``, its view now) whenever an event
    says something changed, and a heartbeat from a member that says it is a primary the store
    does not know makes the store look at once (:meth:`Topology.primary_heard`): an election
    reached the relay and the reads waiting on a crashed primary up to a second late."""

    def __init__(self) -> None:
        self.connection: Observed | None = None

    def connection_checked_out(self, event: monitoring.ConnectionCheckedOutEvent) -> None:
        if self.connection is not None:
            self.connection.observer.pool_checked_out(event.duration or 0.0)

    def connection_checked_in(self, event: monitoring.ConnectionCheckedInEvent) -> None:
        if self.connection is not None:
            self.connection.observer.pool_checked_in()

    def description_changed(self, event: Any) -> None:
        """A server's description changed (ServerListener), or the topology's (TopologyListener):
        both interfaces name their method so."""
        if self.connection is None:
            return
        if isinstance(event, monitoring.TopologyDescriptionChangedEvent):
            self.connection.topology.description = self._now()  # newer than the event's, if anything
        elif event.previous_description.server_type != event.new_description.server_type:
            self.connection.observer.topology_changed()

    def succeeded(self, event: monitoring.ServerHeartbeatSucceededEvent) -> None:
        """A member answered the driver's monitor (ServerHeartbeatListener)."""
        reply = event.reply
        if self.connection is not None and reply.is_writable and reply.election_id is not None:
            self.connection.topology.primary_heard((event.connection_id, reply.election_id), self._now)

    def _now(self) -> Any:
        """The driver's view of the deployment now."""
        assert self.connection is not None
        return self.connection.client.topology_description

    # The rest of the four interfaces: nothing to count.
    def started(self, event: Any) -> None: ...
    def failed(self, event: Any) -> None: ...
    def pool_created(self, event: Any) -> None: ...
    def pool_ready(self, event: Any) -> None: ...
    def pool_cleared(self, event: Any) -> None: ...
    def pool_closed(self, event: Any) -> None: ...
    def connection_created(self, event: Any) -> None: ...
    def connection_ready(self, event: Any) -> None: ...
    def connection_closed(self, event: Any) -> None: ...
    def connection_check_out_started(self, event: Any) -> None: ...
    def connection_check_out_failed(self, event: Any) -> None: ...
    def opened(self, event: Any) -> None: ...
    def closed(self, event: Any) -> None: ...
