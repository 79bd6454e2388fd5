"""The revocation feed: for every revocation this process hears of, what a resource server's
cache of introspection answers must drop, numbered.

Every revocation this process makes, and through its relay (:func:`tokensvc.oauth.events.relay`)
every one another process sharing the store makes, becomes one message naming the identifier a
cache keys its entries on, as introspection returns it (:func:`cache_keys`): a token family's
``family_id``, a grant's ``grant_id``, a client's ``client_id`` (some of what its tokens may
do was withdrawn: its scopes narrowed, its removal), or a user's ``sub`` (likewise: demoted from
administrator, or removed). A change of what a client's feed readers proved (its secret rotated,
its kind or first-party flag changed: ``CREDENTIALS``) is heard by those readers alone and never
named: no token of the client loses anything, and a resource server that dropped every answer
for the client's tokens would ask again for each of them (a routine rotation of a large client
would be a wave of introspections). Never a token, nor any hash a token is looked up under: the
family's key in the store is the hash of its secret, so the feed names it by a one-way function
of that key (:func:`family_label`). Web sessions are no bearer tokens and are not announced.

Each message carries a sequence number of this process's stream. A reader that reconnects names
the stream and the last number it saw: when the bounded buffer still holds everything after it,
the missed messages are sent again; otherwise (another process, a restart, too long away) it is
told to flush. A relay interruption, which may have missed revocations, is a ``flush`` too.

A message reaches every reader in one pass that awaits none of them (each reader only queues
it). What a reader may hold is bounded: :class:`Seats` counts the readers per client and in all,
taken before the upgrade; a graceful stop ends every reader (:meth:`RevocationFeed.end_all`),
and the feed admits none after it.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokensvc.oauth import hashing
from tokensvc.oauth.events import RevocationEvents
from tokensvc.oauth.metrics import ProtocolMetrics
from tokensvc.records import Token
from tokensvc.storage.base import CLIENT, FAMILY, GRANT, SUBJECT, Revocation

log = logging.getLogger(__name__)

REPLAY = 4096  # messages kept for readers that reconnect
# The close code of a reader whose credentials no longer prove a client that may read the feed.
CLOSE_CREDENTIALS = 4403
# The close code of a reader that does not keep up (its unsent messages over the bound): RFC
# 6455's policy violation. It reconnects and resumes, or flushes.
CLOSE_TOO_SLOW = 1008
# The close code of a reader that answered no ping in time ("ping timed out", as Tornado's own
# ping timeout closed it): a normal closure, the reader being gone or stuck.
CLOSE_PING_TIMEOUT = 1000
# The close code of every reader when the process stops (RFC 6455's "service restart", IANA
# registry): reconnect, to another process.
CLOSE_RESTART = 1012
# Why a reader is refused a seat (the metrics' and the answer's reason).
CLIENT_CAP, PROCESS_CAP, STOPPING = "client_cap", "process_cap", "stopping"
# What each kind of revocation names, by the introspection member a cache keys on; the others
# (SESSION, USER, CREDENTIALS) end nothing a cache of introspection answers holds.
NAMED = {FAMILY: "family_id", GRANT: "grant_id", CLIENT: "client_id", SUBJECT: "sub"}

Message = dict[str, Any]
Reader = Callable[[Message], None]
End = Callable[[], None]  # how a reader is told the process stops


@dataclass(slots=True, frozen=True)
class ReaderCaps:
    """How many readers this process admits: in all, and of one client."""

    per_process: int = 1000
    per_client: int = 100


class Seats:
    """The readers admitted, per client and in all. A seat is taken before the upgrade (so a
    refusal is an answer, not a closed socket) and given back when the connection ends."""

    def __init__(self, caps: ReaderCaps) -> None:
        self.caps = caps
        self.taken = 0
        self.stopping = False
        self._by_client: Counter[str] = Counter()

    def take(self, client_id: str) -> str | None:
        """A seat for a reader of ``client_id``; or, without one, why not (:data:`CLIENT_CAP`,
        :data:`PROCESS_CAP`, :data:`STOPPING`)."""
        if self.stopping:
            return STOPPING
        if self.taken >= self.caps.per_process:
            return PROCESS_CAP
        if self._by_client[client_id] >= self.caps.per_client:
            return CLIENT_CAP
        self.taken += 1
        self._by_client[client_id] += 1
        return None

    def give_back(self, client_id: str) -> None:
        self.taken -= 1
        self._by_client[client_id] -= 1
        if not self._by_client[client_id]:
            del self._by_client[client_id]

    def of(self, client_id: str) -> int:
        return self._by_client[client_id]


def family_label(family_id: str) -> str:
    """The family's public identifier: a one-way function of its key in the store (which is
    itself the hash of the family's secret), so that neither is ever published."""
    return hashing.digest("tokensvc family label\x00" + family_id)[:32]


def cache_keys(token: Token) -> dict[str, str]:
    """The identifiers introspection returns for ``token``, which the feed names."""
    return {"family_id": family_label(token.family_id), "grant_id": token.grant_id, "client_id": token.client_id}


@dataclass(slots=True, frozen=True)
class Opening:
    """What a reader that connects is told first, and the messages it missed (when resumed)."""

    ready: Message
    missed: list[Message]


class RevocationFeed:
    """This process's numbered stream of revocation messages, and its readers."""

    def __init__(self, events: RevocationEvents, metrics: ProtocolMetrics | None = None,
                 caps: ReaderCaps | None = None, replay: int = REPLAY) -> None:
        self.stream = secrets.token_urlsafe(12)  # a new stream per process: its numbers are its own
        self.seq = 0
        self.seats = Seats(caps or ReaderCaps())
        self._metrics = metrics
        self._recent: deque[Message] = deque(maxlen=replay)
        self._readers: dict[Reader, End | None] = {}
        events.watch(self._heard)

    def _heard(self, revocation: Revocation | None) -> None:
        if revocation is None:
            self._send({"type": "flush"})
        elif revocation.kind in NAMED:
            key = family_label(revocation.key) if revocation.kind == FAMILY else revocation.key
            self._send({"type": "revoked", NAMED[revocation.kind]: key})

    def _send(self, body: Message) -> None:
        self.seq += 1
        message = {**body, "seq": self.seq}
        self._recent.append(message)
        readers = list(self._readers)
        for reader in readers:
            try:
                reader(message)
            except Exception:  # one broken reader must not keep the message from the others
                log.exception("revocation feed reader failed")
        if self._metrics is not None and readers:
            self._metrics.feed_sent(len(readers))

    def open(self, reader: Reader, stream: str | None = None, after: int | None = None,
             end: End | None = None) -> Opening:
        """Add ``reader``; it resumes after message ``after`` of ``stream`` when this process's
        buffer still holds every message since, else it must flush what it holds. ``end`` is
        called when the process stops (:meth:`end_all`)."""
        oldest = self._recent[0]["seq"] if self._recent else self.seq + 1
        resumed = stream == self.stream and after is not None and oldest - 1 <= after <= self.seq
        missed = [message for message in self._recent if resumed and message["seq"] > (after or 0)]
        self._readers[reader] = end
        if self._metrics is not None:
            self._metrics.feed_opened(resumed)
        return Opening({"type": "ready", "stream": self.stream, "seq": self.seq, "resumed": resumed}, missed)

    def close(self, reader: Reader) -> None:
        self._readers.pop(reader, None)

    def end_all(self) -> int:
        """The process stops: admit no reader from now on, and tell each open one to go (its
        ``end``). Returns how many were told."""
        self.seats.stopping = True
        ends = [end for end in self._readers.values() if end is not None]
        for end in ends:
            try:
                end()
            except Exception:  # one broken reader must not keep the others open
                log.exception("revocation feed reader failed to end")
        return len(ends)

    @property
    def readers(self) -> int:
        return len(self._readers)
