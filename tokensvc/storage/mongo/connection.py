"""What every part of the MongoDB store shares: its :class:`Connection` to the database.

The store is made of parts, one per job (the package's docstring lists them). Each holds the
store's one connection, and every operation of each runs on it (``retry.guarded``): the
driver's client, the database in the current operation's causally consistent session, the
causal clock, the driver calls the store waits for, the deployment as the driver last saw it,
who hears what the store tells, the operations' budgets, and where the store's format stands
for this process (what it writes now).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from pymongo import ReadPreference, WriteConcern
from pymongo.read_concern import ReadConcern

from tokensvc.storage.base import StorageError, StoreObserver
from tokensvc.storage.mongo import format as store_format
from tokensvc.storage.mongo import hashes, topology
from tokensvc.storage.mongo.calls import Calls
from tokensvc.storage.mongo.causal import CausalClock, SessionedDatabase
from tokensvc.storage.mongo.mapping import as_is

BUILD_TIMEOUT_MS = 30 * 60 * 1000  # index builds at start-up: a new index on a large collection takes long
# How long closing the store may take, whatever the server does: within the supervisor's margin
# past the drain (supervisor.STOP_MARGIN), with room for the process to leave.
CLOSE_SECONDS = 5.0


class Connection:
    """The store's way to its database, and what every operation on it shares."""

    def __init__(self, client: Any, database: str, *, timeout_ms: int = 15_000,
                 build_timeout_ms: int = BUILD_TIMEOUT_MS, causal: bool = False) -> None:
        """``client`` is a ``pymongo.AsyncMongoClient`` (or an API-compatible stand-in in tests).
        ``timeout_ms`` is every operation's budget, retries included; ``build_timeout_ms`` that
        of the start-up, whose index builds may take long on a large collection.

        Whatever the URI says, every write waits for a journaled majority (an acknowledged
        code consumption, rotation or revocation survives a failover) and every read goes to
        the primary at majority read concern (a decision made on a read never rests on a
        write a failover can roll back). ``causal`` (a real client's sessions): every
        operation runs in a causally consistent session advanced by :class:`CausalClock`, so
        a read also never misses a write acknowledged before it, even just after an election.
        """
        self.client = client
        raw = client.get_database(database, write_concern=WriteConcern("majority", j=True, wtimeout=timeout_ms),
                                  read_preference=ReadPreference.PRIMARY, read_concern=ReadConcern("majority"))
        # The store holds the database only through the accessor that runs every collection
        # call in the current operation's session (none without ``causal``).
        self.db = SessionedDatabase(raw)
        self.clock = CausalClock() if causal else None
        self.budget, self.build_budget = timeout_ms / 1000, build_timeout_ms / 1000
        self.stop_budget = min(self.budget, CLOSE_SECONDS / 2)  # the stop's one write (its entry marked stopped)
        self.observer = StoreObserver()
        # The deployment as the driver last saw it; a member changing its state is counted.
        self.topology = topology.Topology(lambda: self.observer.topology_changed())
        self.calls = Calls()  # the driver calls the store waits for, and those it stopped waiting for
        # What stamps a revocation's mark again once the call of a write the store stopped
        # waiting for ends (stamps.py; the store sets it).
        self.restamp_later: Callable[[tuple[str, dict[str, Any], str, datetime]], None] | None = None
        self.replica_set = True  # whether the server is a replica-set member (check_primary asks)
        # The formats this release knows, and where the store stands: what is written follows
        # its compatibility version, read at start-up and followed by the process's heartbeat
        # (writing). Until it is read, the oldest format this release reads stands for it.
        self.history = store_format.HISTORY
        self._format: store_format.StoreFormat | None = None
        self.refusal: str | None = None  # why this process no longer serves from the store (a heartbeat's)
        # A serving process's store (tokensvc serve: registered among the running processes,
        # processes.py), which reads the format at start-up; else a command line's.
        self.serving = False

    @property
    def format(self) -> store_format.StoreFormat:
        return self._format or store_format.StoreFormat(self.history.oldest, self.history.oldest)

    @format.setter
    def format(self, state: store_format.StoreFormat) -> None:
        self._format = state

    async def writing(self) -> Callable[[Any], Any]:
        """How a hash is written now: what every release allowed to run reads, by the store's
        compatibility version. Nothing is written before it is known: a serving process reads
        it at start-up, after registering (processes.py), and answers 503 until then, or once a
        heartbeat found a compatibility version it cannot write (it is stopping); a command
        line's store reads it at its first write."""
        if self.refusal is not None:
            raise StorageError(f"this process no longer serves from the store: {self.refusal}")
        if self._format is None:
            if self.serving:
                raise StorageError("start-up has not read the store's format yet")
            state = await store_format.read(self.db)
            if state is None:
                raise StorageError("the store has no format document yet: start tokensvc serve once")
            self._format = state
        return hashes.packed if self._format.compatibility >= hashes.PACKED_FROM else as_is

    def unwritable(self) -> str | None:
        """Why no write can succeed now, as far as the driver knows (topology.py); None."""
        return self.topology.unwritable()

    async def check_primary(self) -> None:
        """:class:`StorageError` unless the server takes writes; whether it is a replica-set
        member is noted (an index build's quorum)."""
        hello = await self.db.command("hello")
        self.replica_set = "setName" in hello
        if not hello.get("isWritablePrimary", hello.get("ismaster")):
            # directConnection=true to a secondary would serve reads and fail every write:
            # not ready until the URI reaches a primary (start-up keeps trying, /readyz is 503).
            state = "secondary" if hello.get("secondary") else "not in a primary state"
            raise StorageError(topology.not_primary(hello.get("me", "the configured address"), state))
