"""In-process announcements of revocations.

Open WebSocket connections subscribe here so that a revoked token, grant or session
closes its socket at once instead of at the socket's next periodic check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

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
