"""The MongoDB store's life (:class:`Lifecycle`): its start-up (the server checked, the store's
format read, the indexes made), its upkeep while the service runs (the process's heartbeat,
the migrations in the background), its health and expiry, and its stop."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import pymongo
from pymongo.errors import PyMongoError

from tokensvc.records import utcnow
from tokensvc.storage.base import CODE_RETENTION_SECONDS, StorageError, StoreFault
from tokensvc.storage.mongo import calls, migrations, processes
from tokensvc.storage.mongo import format as store_format
from tokensvc.storage.mongo.connection import CLOSE_SECONDS, Connection
from tokensvc.storage.mongo.indexes import Indexes
from tokensvc.storage.mongo.retry import guarded

log = logging.getLogger(__name__)

CLOSE_MARGIN_SECONDS = 2.5  # the driver's close gives up on the server this much sooner, then closes the rest


class Lifecycle:
    """Start-up, upkeep, health, expiry and stop of the store on its connection. A serving
    process's store (``tokensvc serve``) has a :attr:`registration` among the running processes
    (processes.py); a command line's has none."""

    def __init__(self, connection: Connection, indexes: Indexes) -> None:
        self.connection, self.indexes = connection, indexes
        self._registration: processes.Registration | None = None

    @property
    def registration(self) -> processes.Registration | None:
        """This process's entry among the running processes (None: a command line's store)."""
        return self._registration

    @registration.setter
    def registration(self, registration: processes.Registration | None) -> None:
        self._registration = registration
        self.connection.serving = registration is not None

    @guarded(budget="build_budget")
    async def open(self) -> None:
        """Check that the server takes writes and that this release can read the store's format
        (:class:`StoreFault` naming the release it needs otherwise), then make every index
        (:meth:`Indexes.make`); then the store records this release's format as made."""
        connection = self.connection
        await connection.check_primary()
        if self.registration is not None:  # before the format is read: see processes.py
            await self.registration.announce(connection)
        now = utcnow()
        state = await store_format.recorded(connection.db, connection.history, now)
        refusal = connection.history.refusal(state)
        if refusal is not None:
            raise StoreFault(refusal)
        connection.format = state
        await self.indexes.make()
        connection.format = await store_format.expanded(connection.db, connection.history, now)
        self.tell_format()
        if self.registration is not None:
            await self.registration.beat(connection, self.indexes)

    @guarded()
    async def heartbeat(self) -> None:
        """Follow the store's format and renew this process's entry (processes.py)."""
        if self.registration is not None:
            await self.registration.beat(self.connection, self.indexes)
            self.tell_format()

    def tell_format(self) -> None:
        """The store's format as this process last read it, to the observer (the metrics)."""
        state, history = self.connection.format, self.connection.history
        self.connection.observer.format_seen(state.format, state.compatibility, {
            migration.name: (int((state.migrations.get(migration.name) or state.progress.get(migration.name)
                                  or {}).get("rows", 0)), state.done(migration.name))
            for migration in history.migrations})

    async def upkeep(self) -> None:
        """While the service runs: the heartbeat, and the migrations the compatibility version
        allows, in the background (migrations.py); nothing for a command line's store."""
        if self.registration is None:
            return
        work = [asyncio.ensure_future(self.registration.run(self.connection, self.heartbeat)), asyncio.ensure_future(
            migrations.in_background(self, self.registration.id, self.registration.heartbeat_seconds))]
        try:
            await asyncio.gather(*work)
        finally:  # the heartbeat stopped (the store's format refuses this release): so does the rest
            for task in work:
                task.cancel()

    async def close(self) -> None:
        """Mark this process's entry stopped, close the client, and let the calls the store
        stopped waiting for end: within :data:`CLOSE_SECONDS` whatever the server does (a stop
        is bounded: the supervisor kills a worker that outlasts its drain by a margin), never
        cancelling the driver (calls.py). The client's close ends its sessions on the server,
        within what is left (``pymongo.timeout``: no server selection waits the whole budget for
        a server that is gone)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_SECONDS
        if self.registration is not None and self.registration.announced:
            with contextlib.suppress(StorageError, StoreFault):
                await self._mark_stopped()

        async def close_client() -> None:
            # The driver's own deadline, a moment before the store stops waiting: it ends the
            # close itself (its ending of the sessions gives up; the rest takes no server).
            with pymongo.timeout(max(deadline - loop.time() - CLOSE_MARGIN_SECONDS, 0.001)):
                result = self.connection.client.close()
                if inspect.isawaitable(result):
                    await result

        waited = self.connection.calls
        closing = waited.start(close_client())
        with contextlib.suppress(calls.Left, PyMongoError):
            await waited.wait(closing, deadline - loop.time())
        left = await waited.settle(deadline - loop.time())  # the close among them, if it is not done
        if left:
            log.warning("the MongoDB client did not close within %g s (%d calls still running): stopping anyway",
                        CLOSE_SECONDS, left)

    async def deployment_settings(self, settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """This process's ``settings`` recorded in its entry, and the running processes' that
        differ (processes.disagreeing); nothing for a command line's store."""
        if self.registration is None:  # no serving process's store: it says nothing for one
            return {}
        await self._declare_settings(dict(settings))
        return processes.disagreeing(await self._running_settings(), self.registration.id, dict(settings))

    @guarded()
    async def _declare_settings(self, settings: dict[str, Any]) -> None:
        assert self.registration is not None
        await self.connection.db[processes.COLLECTION].update_one({"_id": self.registration.id},
                                                                  {"$set": {processes.SETTINGS_FIELD: settings}})

    @guarded()
    async def _running_settings(self) -> list[dict[str, Any]]:
        return await self.connection.db[processes.COLLECTION].find(processes.SETTINGS_FILTER).to_list(None)

    @guarded(budget="stop_budget")
    async def _mark_stopped(self) -> None:
        if self.registration is not None:
            await self.registration.stopped(self.connection)

    async def reachable(self, seconds: float) -> None:
        """Wait ``seconds``, or less: until the driver sees a member that takes writes again."""
        await asyncio.wait({self.connection.topology.writable()}, timeout=seconds)

    @guarded()
    async def ping(self) -> None:
        await self.connection.db.command("ping")

    @guarded()
    async def purge_expired(self, now: datetime) -> dict[str, int]:
        db = self.connection.db
        # The TTL index keeps every code the retention past its expiry; here an unconsumed one
        # (nothing to detect a replay of) goes at once.
        counts = {"codes": (await db["codes"].delete_many({"$or": [
            {"consumed_at": None, "expires_at": {"$lte": now}},
            {"expires_at": {"$lte": now - timedelta(seconds=CODE_RETENTION_SECONDS)}},
        ]})).deleted_count}
        for name in ("families", "sessions"):
            counts[name] = (await db[name].delete_many({"expires_at": {"$lte": now}})).deleted_count
        return counts
