"""A socket's re-check of what it stands on: one at a time, never one lost.

A WebSocket stands on records another process may change: a token's socket on its family,
grant, user and client, a revocation feed reader on its client. Each announcement of a change
(:mod:`tokensvc.oauth.events`) asks the socket to check again, and a check reads the store.
Announcements come in bursts (one removal writes several records, a relay that resumes
announces everything), so at most one check runs at a time. An announcement that arrives
while one runs is not dropped: that check may have read the store before the change landed,
so exactly one more runs after it, however many arrived meanwhile. A check that fails (the
store away) is logged and the socket kept, as a token's socket is: the relay announces again,
to every listener, once the store is back.

A socket subscribes only once it has read what it stands on (its handshake authenticated it),
so a change in between is not announced to it: :meth:`Recheck.stand_on` asks the announcements
whether one came since the socket's mark, and if so checks before the socket says its first
word (``ready``, ``welcome``). A handshake no announcement touched reads nothing more.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tokensvc.oauth.events import RevocationEvents
from tokensvc.storage.base import Revocation

log = logging.getLogger(__name__)


class Recheck:
    """Runs ``check`` on :meth:`request`: at once when none is running, else once more after
    the running one. A failure of ``check`` is logged (``failure``, the warning's text), never
    raised."""

    def __init__(self, check: Callable[[], Awaitable[None]], failure: str) -> None:
        self._check = check
        self._failure = failure
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def request(self) -> None:
        """Something the socket stands on may have changed: check (again)."""
        if self._task is not None:
            self._again = True
        else:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stand_on(self, events: RevocationEvents, keys: list[Revocation], mark: int) -> None:
        """Subscribe :meth:`request` to ``keys``, which the socket read after ``mark``
        (:meth:`RevocationEvents.mark`); when any was announced since, return only once a check
        has run (it closes the socket when what it read no longer holds)."""
        if events.subscribe(keys, self.request, since=mark):
            self.request()
            assert self._task is not None
            await self._task

    async def _run(self) -> None:
        try:
            while True:
                self._again = False
                try:
                    await self._check()
                except Exception:
                    log.warning(self._failure, exc_info=True)
                if not self._again:
                    return
        finally:
            self._task = None
