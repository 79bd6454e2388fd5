"""Whether this instance should take traffic (``GET /readyz``), asked of the store cheaply.

A probe every second or two from every load balancer must not cost a full operation's budget,
and a primary election (seconds without a primary, while requests wait within their budget
and then retry) must not take every instance out of rotation at once: that would turn a
failover's latency into a whole outage. So the store is pinged with a short timeout at most
once per :data:`CHECK_SECONDS` (concurrent probes share the one ping), and an instance whose
store answered within the last :data:`GRACE_SECONDS` stays ready. What the store's driver
already knows without asking counts at once: a member that takes no writes and will not until
the deployment changes makes the instance unready, saying so, until it is primary again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from tokensvc.storage.base import StorageError, Store, StoreFault

CHECK_SECONDS = 1.0  # a probe's answer is reused this long
PING_SECONDS = 1.0  # how long one ping may take
GRACE_SECONDS = 30.0  # ready this long after the store last answered (an election lasts ~10 s)


class Readiness:
    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.clock = store, clock
        self.answered_at: float | None = None  # when the store last answered a ping
        self.checked_at: float | None = None
        self._ping: asyncio.Future[None] | None = None

    async def unready(self) -> str | None:
        """Why this instance should take no traffic now; None when it should: the store was
        prepared, its driver knows no reason that writes cannot succeed (a directly connected
        member that is no primary, storage/mongo/topology.py), and it answered within the grace."""
        if not self.store.prepared:
            return "start-up has not prepared the store yet"
        reason = self.store.unwritable()
        if reason is not None:
            return reason
        now = self.clock()
        if self.checked_at is None or now - self.checked_at >= CHECK_SECONDS:
            if self._ping is None or self._ping.done():
                self._ping = asyncio.ensure_future(self._check())
            await asyncio.shield(self._ping)
        if self.answered_at is None or self.clock() - self.answered_at >= GRACE_SECONDS:
            return f"the store has not answered a ping for {GRACE_SECONDS:g} s"
        return None

    async def _check(self) -> None:
        try:
            await asyncio.wait_for(self.store.ping(), PING_SECONDS)
            self.answered_at = self.clock()
        except (StorageError, StoreFault, TimeoutError):
            pass
        finally:
            self.checked_at = self.clock()
