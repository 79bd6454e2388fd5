"""Which web origins may call the token endpoints and the public API from a browser (CORS).

A browser app is a public client: its pages are served from the origin of its redirect URI,
or from an origin the operator registered for it (``allowed_origins``). The set is read from
the registry and kept for a short while, so that a request from a browser costs a lookup in a
set, and a client registered in another process is allowed within that while.

The decision never waits on a store that is away: a read that fails keeps the set read last
(none before the first read) and is tried again a second later. A request that carries nothing
to act on (``POST /oauth/revoke`` without a token) is answered whatever the store does, and a
browser app reads the answers it could read before the outage.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tokensvc.storage.base import Registry, StorageError

TTL_SECONDS = 30.0
RETRY_SECONDS = 1.0  # after a failed read


class BrowserOrigins:
    def __init__(self, ttl: float = TTL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.clock = ttl, clock
        self._origins: frozenset[str] = frozenset()
        self._until = float("-inf")

    async def allows(self, registry: Registry, origin: str) -> bool:
        """Whether ``origin`` (as a browser sends it in ``Origin``) is one of a client's."""
        if self.clock() >= self._until:
            try:
                clients = await registry.list_clients()
            except StorageError:  # the last set read stands (none before the first)
                self._until = self.clock() + RETRY_SECONDS
            else:
                self._origins = frozenset(origin for client in clients for origin in client.browser_origins)
                self._until = self.clock() + self.ttl
        return origin.lower() in self._origins

    def forget(self) -> None:
        """Read the registry again at the next request (a client was changed here)."""
        self._until = float("-inf")
