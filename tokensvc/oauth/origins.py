"""Which web origins may call the token endpoints and the public API from a browser (CORS).

A browser app is a public client: its pages are served from the origin of its redirect URI,
or from an origin the operator registered for it (``allowed_origins``). The set is read from
the registry and kept for a short while, so that a request from a browser costs a lookup in a
set, and a client registered in another process is allowed within that while.

The decision never waits on a store that is away. One read at a time is in flight, shared by
every decision that needs it; a decision waits for it at most ``WAIT_SECONDS`` (a store that
answers does so in milliseconds, so a client registered a moment ago is seen) and otherwise
answers from the set read last (none before the first read) while the read goes on. Once a
read has failed or outlasted that wait, the store counts as away: decisions stop waiting until
a read succeeds, and a failed read is tried again a second later. A request that carries nothing
to act on (``POST /oauth/revoke`` without a token) is answered whatever the store does, and a
browser app reads the answers it could read before the outage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from tokensvc.storage.base import Registry, StorageError

TTL_SECONDS = 30.0
RETRY_SECONDS = 1.0  # after a failed read
WAIT_SECONDS = 0.25  # the longest a decision waits for a read in flight


class BrowserOrigins:
    def __init__(self, ttl: float = TTL_SECONDS, clock: Callable[[], float] = time.monotonic,
                 wait: float = WAIT_SECONDS) -> None:
        self.ttl, self.clock, self.wait = ttl, clock, wait
        self._origins: frozenset[str] = frozenset()
        self._until = float("-inf")
        self._reading: asyncio.Future[None] | None = None
        self._away = False  # the last read failed, or outlasted a decision's wait
        self._changes = 0  # forget() calls: a read begun before one is read again

    async def allows(self, registry: Registry, origin: str) -> bool:
        """Whether ``origin`` (as a browser sends it in ``Origin``) is one of a client's."""
        if self._reading is None and self.clock() >= self._until:
            self._reading = asyncio.ensure_future(self._read(registry))
        if self._reading is not None and not self._away:
            try:
                await asyncio.wait_for(asyncio.shield(self._reading), self.wait)
            except TimeoutError:
                self._away = True
        return origin.lower() in self._origins

    async def _read(self, registry: Registry) -> None:
        changes = self._changes
        try:
            clients = await registry.list_clients()
        except StorageError:  # the last set read stands (none before the first)
            self._until, self._away = self.clock() + RETRY_SECONDS, True
        else:
            self._origins = frozenset(origin for client in clients for origin in client.browser_origins)
            self._until, self._away = self.clock() + self.ttl, False
            if changes != self._changes:  # a client changed while it was read
                self._until = float("-inf")
        finally:
            self._reading = None

    def forget(self) -> None:
        """Read the registry again at the next request (a client was changed here)."""
        self._until = float("-inf")
        self._changes += 1
