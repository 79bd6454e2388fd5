"""The answer cache: what introspection said of each token, within bounds, and dropped when the
feed names it.

Active answers sit in a bounded LRU, each until its token's ``exp`` (nor ``max_ttl``); inactive
ones ``negative_ttl`` seconds in a bounded table of their own, so junk tokens never evict a good
answer. A lifetime once known runs on the monotonic clock, so a clock set back or a suspended
host cannot stretch it. Answers are keyed by a digest of the token, never the token, and indexed
by the identifiers introspection returned (:data:`KEYS`), which a revocation names. While the
feed is down an answer is used only within ``offline_ttl`` of the last moment it was known
current: its introspection, or the feed's last sign of life (a message or a pong), whichever is
later. Past that the token is introspected again, and when tokensvc does not answer either the
check fails closed (:class:`~tokensvc.resource.errors.Unavailable`).

The cache also remembers the last revocations and flushes it heard (:meth:`AnswerCache.overtaken`),
so that an introspection a revocation overtook on its way is asked again, never cached.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokensvc.resource.settings import Settings

KEYS = ("family_id", "grant_id", "client_id", "sub")  # what a feed message names, as introspection does
RECENT = 1024  # revocations remembered, to tell an introspection that one overtook it


def token_key(token: str) -> bytes:
    """What the cache keys a token's answer on: never the token itself."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(slots=True)
class Entry:
    """A token's answer as the cache holds it."""

    answer: dict[str, Any] | None  # None: not active
    expires: float  # monotonic
    verified: float  # monotonic: when the answer was known current


class AnswerCache:
    """The answers of one verifier, on its monotonic ``clock``. Used within one event loop."""

    def __init__(self, settings: Settings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self._clock = clock
        self._active: OrderedDict[bytes, Entry] = OrderedDict()
        self._inactive: OrderedDict[bytes, Entry] = OrderedDict()
        self._index: dict[tuple[str, str], set[bytes]] = {}
        self._generation = 0  # counts the revocations and flushes heard
        self._recent: deque[tuple[int, tuple[str, str] | None]] = deque(maxlen=RECENT)

    def __len__(self) -> int:
        """The answers cached, active and inactive."""
        return len(self._active) + len(self._inactive)

    def get(self, key: bytes, down_since: float | None) -> Entry | None:
        """The answer cached under ``key`` while it may still be used (``down_since``: when the
        feed went down, None while it is up and current), as the most recently used; else None,
        and an answer past its use is dropped. A check's hot path: nothing else is done here."""
        table = self._active
        entry = table.get(key)
        if entry is None:
            table = self._inactive
            entry = table.get(key)
            if entry is None:
                return None
        now = self._clock()
        stale = down_since is not None and now - max(entry.verified, down_since) > self.settings.offline_ttl
        if now >= entry.expires or stale:
            self._drop(key)
            return None
        table.move_to_end(key)
        return entry

    def peek(self, key: bytes) -> Entry | None:
        """The active answer cached under ``key``, as it is: neither judged nor moved."""
        return self._active.get(key)

    def store(self, key: bytes, entry: Entry) -> None:
        """Cache ``entry`` (unless already expired), the least recently used going past the
        bound of its table."""
        if entry.expires <= self._clock():
            return
        self._drop(key)
        table, bound = (self._active, self.settings.max_entries) if entry.answer else (
            self._inactive, self.settings.max_negative)
        table[key] = entry
        for name in KEYS:
            if entry.answer and name in entry.answer:
                self._index.setdefault((name, entry.answer[name]), set()).add(key)
        while len(table) > bound:
            self._drop(next(iter(table)))

    def revoke(self, named: tuple[str, str]) -> list[bytes]:
        """Drop every answer naming ``named`` (an identifier of :data:`KEYS` and its value), and
        remember the revocation: the keys dropped."""
        self._generation += 1
        self._recent.append((self._generation, named))
        dropped = list(self._index.get(named, ()))
        for key in dropped:
            self._drop(key)
        return dropped

    def flush(self) -> None:
        """Drop every answer, and remember the flush (it names every answer)."""
        self._generation += 1
        self._recent.append((self._generation, None))
        self.clear()

    def clear(self) -> None:
        """Every answer dropped, active and inactive, with the index on them."""
        self._active.clear()
        self._inactive.clear()
        self._index.clear()

    @property
    def generation(self) -> int:
        """How many revocations and flushes were heard: taken before an introspection, for
        :meth:`overtaken` after it."""
        return self._generation

    def overtaken(self, generation: int, answer: dict[str, Any] | None) -> bool | None:
        """Whether a revocation heard since ``generation`` names ``answer``; None when the record
        of revocations no longer reaches back that far."""
        if generation == self._generation:
            return False
        if not self._recent or self._recent[0][0] > generation + 1:
            return None
        names = {(name, answer[name]) for name in KEYS if answer and name in answer}
        return any(named is None or named in names for number, named in self._recent if number > generation)

    def _drop(self, key: bytes) -> None:
        self._inactive.pop(key, None)
        entry = self._active.pop(key, None)
        if entry is None or entry.answer is None:
            return
        for name in KEYS:
            if name in entry.answer:
                keys = self._index.get((name, entry.answer[name]))
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._index[(name, entry.answer[name])]
