"""Announcements of revocations, to the open WebSockets of this process.

Open WebSocket connections subscribe here so that a revoked token, grant or session closes
its socket at once. What this process revokes it announces itself; what another process
sharing the store revokes reaches it through :func:`relay`, one per process, which follows
the store's revocation feed (on MongoDB a change stream, or a poll of one counter).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tokensvc.storage.base import StorageError, Store, StoreFault

log = logging.getLogger(__name__)

Listener = Callable[[], None]


class RevocationEvents:
    def __init__(self) -> None:
        self._listeners: set[Listener] = set()

    def subscribe(self, listener: Listener) -> None:
        self._listeners.add(listener)

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.discard(listener)

    def revoked(self) -> None:
        """Something was revoked: every listener re-checks the credential it stands on."""
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a broken listener must not break revocation
                log.exception("revocation listener failed")


async def relay(store: Store, events: RevocationEvents, retry_seconds: float = 1.0) -> None:
    """Hand every revocation any process makes to this process's listeners, until cancelled.

    After an interruption (the store away) every listener re-checks once, for whatever was
    revoked meanwhile. Returns at once for a store only one process uses.
    """
    while True:
        try:
            async for _ in store.revocation_feed():
                events.revoked()
            return
        except (StorageError, StoreFault) as exc:
            log.warning("revocation feed interrupted (%s); resuming in %.0fs", exc, retry_seconds)
        await asyncio.sleep(retry_seconds)
        events.revoked()
