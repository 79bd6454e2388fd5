"""A socket's re-check of what it stands on: one at a time, never one lost.

A WebSocket stands on records another process may change: a token's socket on its family,
grant, user and client, a revocation feed reader on its client. Each announcement of a change
(:mod:`tokensvc.oauth.events`) asks the socket to check again, and a check reads the store.
Announcements come in bursts (one removal writes several records, a relay that resumes
announces everything), so at most one check runs at a time. An announcement that arrives
while one runs is not dropped: that check may have read the store before the change landed,
so exactly one more runs after it, however many arrived meanwhile. A check that fails is logged
(the store away, which is expected, in one line with no traceback) and the socket kept, as a
token's socket is, and it runs again :data:`RETRY_SECONDS` later, or as soon as the store says
it may answer again (``pause``: the store's ``reachable``, which ends at a member that takes
writes seen again or a newly elected primary), until one succeeds or the socket closes
(:meth:`Recheck.stop`): the relay announces again to every listener when it resumes, but a
relay whose own stream survived the outage (on another member, or following the new primary
where it stood) has nothing to resume, and the change the failed check missed would otherwise
go unheard while the socket lives, or be heard up to a second after the store's return.

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
from tokensvc.storage.base import Revocation, StorageError

log = logging.getLogger("tokensvc.handlers.recheck")  # the name its lines carry: what log filters select

RETRY_SECONDS = 1.0  # a failed check runs again this long after, at the latest

Pause = Callable[[float], Awaitable[None]]  # waits at most its seconds (Store.reachable)


class Recheck:
    """Runs ``check`` on :meth:`request`: at once when none is running, else once more after
    the running one. A failure of ``check`` is logged (``failure``, the warning's text), never
    raised, and ``check`` runs again once ``pause`` (:data:`RETRY_SECONDS`) has passed."""

    def __init__(self, check: Callable[[], Awaitable[None]], failure: str, pause: Pause = asyncio.sleep) -> None:
        self._check = check
        self._failure = failure
        self._pause = pause
        self._task: asyncio.Task[None] | None = None
        self._retry: asyncio.Task[None] | None = None
        self._stopped = False
        self._failing = False  # the last check failed: the next failure is not logged again
        self._again = False

    def request(self) -> None:
        """Something the socket stands on may have changed: check (again)."""
        if self._stopped:
            return
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
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

    def stop(self) -> None:
        """The socket closed: no check runs again on its own, and no request starts one."""
        self._stopped = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    async def _run(self) -> None:
        failed = False
        try:
            while True:
                self._again = False
                try:
                    await self._check()
                    failed = self._failing = False
                except StorageError as exc:  # the store away: expected, one line
                    if not self._failing:  # once per outage, not at every retry
                        log.warning("%s: %s", self._failure, exc)
                    failed = self._failing = True
                except Exception:
                    if not self._failing:
                        log.warning(self._failure, exc_info=True)
                    failed = self._failing = True
                if not self._again:
                    break
        finally:
            self._task = None
        if failed and not self._stopped:
            self._retry = asyncio.get_running_loop().create_task(self._later())

    async def _later(self) -> None:
        """The check after a failed one: :data:`RETRY_SECONDS` later, or as soon as the store
        may answer again (a request meanwhile cancels it, and checks at once)."""
        await self._pause(RETRY_SECONDS)
        self._retry = None
        self.request()
