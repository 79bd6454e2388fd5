"""What this process read of the store lately, kept for at most a bound: the clients client
authentication weighs (:meth:`MongoRegistry.client_record`), read on every token-endpoint
request and every introspection and changed seldom.

An entry is answered for :data:`~tokensvc.storage.base.CACHE_SECONDS` after the read that
made it began, never longer, whatever is heard or missed meanwhile. Before that it is dropped
by every write of this process that may change it (the registry's own writes) and by every
announcement the relay hears of another process's (the store's revocation feed names the
client: narrowed, removed, or what its feed readers proved changed), and the whole cache by an
interruption of the feed. A read that began before a drop is not kept: it may have read the
record as it was before the change that caused the drop (:meth:`Recent.began`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from tokensvc.storage.base import CACHE_SECONDS

V = TypeVar("V")

MAX_ENTRIES = 10_000  # more clients than a deployment registers: past it the oldest go


class Recent(Generic[V]):
    """Values by key, each answered until its bound runs out or a drop names it."""

    def __init__(self, seconds: float = CACHE_SECONDS, clock: Callable[[], float] = time.monotonic,
                 max_entries: int = MAX_ENTRIES) -> None:
        self.seconds, self.clock, self.max_entries = seconds, clock, max_entries
        self._entries: dict[str, tuple[float, V]] = {}
        self._drops = 0  # drops so far: a read that began before one may not be kept

    def get(self, key: str) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        until, value = entry
        if self.clock() >= until:
            del self._entries[key]
            return None
        return value

    def began(self) -> tuple[float, int]:
        """Where a read that will be kept begins: its moment, and the drops so far."""
        return self.clock(), self._drops

    def keep(self, key: str, value: V, began: tuple[float, int]) -> None:
        """Keep what a read that began at ``began`` found, unless something was dropped since."""
        at, drops = began
        if drops != self._drops:
            return
        if len(self._entries) >= self.max_entries:
            for old in list(self._entries)[: self.max_entries // 10 or 1]:
                del self._entries[old]
        self._entries[key] = (at + self.seconds, value)

    def drop(self, key: str) -> None:
        self._drops += 1
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._drops += 1
        self._entries.clear()
