"""Announcements of revocations, to the open WebSockets of this process.

An open WebSocket subscribes under the keys it stands on (its token's family and grant, or
its web session and user), so that a revocation closes it at once and no other socket is
disturbed. What this process revokes it announces itself, naming what changed
(:class:`~tokensvc.storage.base.Revocation`); what another process sharing the store revokes
reaches it through :func:`relay`, one per process, which follows the store's revocation feed.

A socket reads what it stands on (authenticates) before it can subscribe, and a change landing
in between would reach no one: so it takes a :meth:`~RevocationEvents.mark` before it reads, and
its subscription answers whether any of its keys was announced since. Only then does it need to
read again; a handshake nothing touched costs no second read. The answer is right because an
announcement always follows the write it announces: a change the read missed landed after it,
so after the mark, and is either among the announcements remembered since or heard by the
subscription. The last :data:`REMEMBERED` are kept; a mark older than those is answered yes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from itertools import islice

from tokensvc.storage.base import Housekeeping, Revocation, StorageError, StoreFault

log = logging.getLogger(__name__)

Listener = Callable[[], None]
Watcher = Callable[[Revocation | None], None]  # None: anything may have been revoked
REMEMBERED = 256  # announcements a subscription may ask about: far more than land during a handshake


class RevocationEvents:
    def __init__(self) -> None:
        self._listeners: dict[Revocation, set[Listener]] = defaultdict(set)
        self._watchers: list[Watcher] = []
        self._announced = 0  # announcements so far (a mark is one of these counts)
        self._recent: deque[Revocation | None] = deque(maxlen=REMEMBERED)  # None: anything

    def watch(self, watcher: Watcher) -> None:
        """Hear of every revocation (the revocation feed, :mod:`tokensvc.oauth.feed`)."""
        self._watchers.append(watcher)

    def mark(self) -> int:
        """Where the announcements stand: taken before reading what a subscription will stand on."""
        return self._announced

    def subscribe(self, keys: Iterable[Revocation], listener: Listener, since: int | None = None) -> bool:
        """``listener`` hears every later announcement of ``keys``. Returns whether any of them
        was announced (or anything may have been revoked) after the mark ``since``: what the
        subscriber read before may not hold any more, so it checks again."""
        keys = list(keys)
        for key in keys:
            self._listeners[key].add(listener)
        if since is None:
            return False
        missed = self._announced - since
        if missed > len(self._recent):  # forgotten: any of them may have been one of these keys
            return True
        return any(heard is None or heard in keys for heard in islice(reversed(self._recent), missed))

    def unsubscribe(self, keys: Iterable[Revocation], listener: Listener) -> None:
        for key in keys:
            listeners = self._listeners.get(key)
            if listeners is not None:
                listeners.discard(listener)
                if not listeners:
                    del self._listeners[key]

    def publish(self, revocation: Revocation) -> None:
        """``revocation`` happened: the listeners standing on it re-check."""
        self._remember(revocation)
        self._notify(list(self._listeners.get(revocation, ())))
        self._tell(revocation)

    def publish_all(self) -> None:
        """Anything may have been revoked (the feed was interrupted): every listener re-checks."""
        self._remember(None)
        self._notify({listener for listeners in self._listeners.values() for listener in listeners})
        self._tell(None)

    def _remember(self, revocation: Revocation | None) -> None:
        self._announced += 1
        self._recent.append(revocation)

    def _tell(self, revocation: Revocation | None) -> None:
        for watcher in self._watchers:
            try:
                watcher(revocation)
            except Exception:  # a broken watcher must not break revocation
                log.exception("revocation watcher failed")

    @staticmethod
    def _notify(listeners: Iterable[Listener]) -> None:
        for listener in listeners:
            try:
                listener()
            except Exception:  # a broken listener must not break revocation
                log.exception("revocation listener failed")


async def relay(store: Housekeeping, events: RevocationEvents, retry_seconds: float = 1.0) -> None:
    """Hand every revocation any process makes to this process's listeners, until cancelled.

    After an interruption (the store away) every listener re-checks once, for whatever was
    revoked meanwhile. The feed is opened again at most once every ``retry_seconds``: at once
    after an attempt that lasted longer (one that waited the store's budget for a server that
    takes writes), so that while the store is away an attempt is always waiting for it and the
    feed follows it as soon as it is back; sooner when the store says it may answer again
    (:meth:`~tokensvc.storage.base.Store.reachable`). Returns at once for a store only one
    process uses.
    """
    loop = asyncio.get_running_loop()
    while True:
        began = loop.time()
        try:
            async for revocation in store.revocation_feed():
                events.publish(revocation)
            return
        except (StorageError, StoreFault) as exc:
            pause = max(0.0, began + retry_seconds - loop.time())
            log.warning("revocation feed interrupted (%s); resuming %s", exc,
                        f"in {pause:.1f}s" if pause else "at once")
        if pause:
            await store.reachable(pause)
        events.publish_all()
