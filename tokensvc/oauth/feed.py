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

A resource server reads the feed **by audience** (RFC 8707): it hears the revocations of tokens
meant for one of its resources and of tokens that name none, in a stream of its own (a *view*,
one per resource server and set of resources, numbered on its own), since introspection answers
it ``active: false`` for every other token, so it can have cached nothing else. A view is kept
:data:`VIEW_IDLE_SECONDS` after its last reader leaves, for one that resumes; a resource server
that serves the same resources later (a URI given to another) starts a stream of its own. Every revocation carries
the audience of the tokens it may touch (:attr:`Revocation.audience`): a family its own; a
grant, a client or a user their families' together, read on the revocation's write path; the
same through another process's relay, which reads it beside the mark in the store. One whose
audience is unknown (a mark of an older release, an interruption's ``flush``) reaches every
reader: a revocation missed is a hole, one heard too often a disclosure only. Every other
reader (a first-party client, which introspection answers for every token) reads every
revocation, in the process's main stream.

A message reaches every reader in one pass that awaits none of them (each reader only queues
it). What a reader may hold is bounded: :class:`Seats` counts the readers per client and in all,
taken before the upgrade; a graceful stop ends every reader (:meth:`RevocationFeed.end_all`),
and the feed admits none after it.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokensvc.oauth import hashing
from tokensvc.oauth.events import RevocationEvents
from tokensvc.oauth.metrics import ProtocolMetrics
from tokensvc.records import Client, Token
from tokensvc.storage.base import CLIENT, FAMILY, GRANT, SUBJECT, Revocation

log = logging.getLogger(__name__)

REPLAY = 4096  # messages kept for readers that reconnect
# How long a resource server's view outlives its last reader, for a reader that reconnects to
# resume in: then it is dropped, with the messages it kept.
VIEW_IDLE_SECONDS = 300.0
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


def serves(client: Client) -> list[str] | None:
    """What a reader of ``client`` reads: a resource server's resources (the revocations of
    tokens meant for them, and of tokens that name none), or None: every revocation."""
    return list(client.resources or []) if client.resource_server else None


def owner(client: Client) -> str:
    """Whose view a resource server's reader reads: its client id and registration, so that a
    resource server registered under another id, or again under the same one, never resumes
    the stream of the one that served its resources before."""
    return f"{client.client_id} {client.created_at.isoformat() if client.created_at else '-'}"


def family_label(family_id: str) -> str:
    """The family's public identifier: a one-way function of its key in the store (which is
    itself the hash of the family's secret), so that neither is ever published."""
    return hashing.digest("tokensvc family label\x00" + family_id)[:32]


def cache_keys(token: Token) -> dict[str, str]:
    """The identifiers introspection returns for ``token``, which the feed names."""
    return {"family_id": family_label(token.family_id), "grant_id": token.grant_id, "client_id": token.client_id}


ViewKey = tuple[str | None, frozenset[str]]  # a resource server's (owner) and its resources


class _View:
    """A stream of the feed: its id, its numbers, the messages kept for readers that resume,
    and its readers. ``serves``: the resources of the resource server reading it (None: every
    revocation); ``key``: whose view it is, with them. ``idle_since``: when its last reader
    left (None: it has one)."""

    def __init__(self, serves: frozenset[str] | None, replay: int, key: ViewKey | None = None) -> None:
        self.serves = serves
        self.key = key
        self.stream = secrets.token_urlsafe(12)  # a new stream per view and process: its numbers are its own
        self.seq = 0
        self.recent: deque[Message] = deque(maxlen=replay)
        self.readers: dict[Reader, End | None] = {}
        self.idle_since: float | None = None

    def hears(self, audience: tuple[str, ...] | None) -> bool:
        return self.serves is None or audience is None or not self.serves.isdisjoint(audience)


@dataclass(slots=True, frozen=True)
class Opening:
    """What a reader that connects is told first, and the messages it missed (when resumed)."""

    ready: Message
    missed: list[Message]


class RevocationFeed:
    """This process's numbered stream of revocation messages, and its readers."""

    def __init__(self, events: RevocationEvents, metrics: ProtocolMetrics | None = None,
                 caps: ReaderCaps | None = None, replay: int = REPLAY, *,
                 clock: Callable[[], float] = time.monotonic, idle_seconds: float = VIEW_IDLE_SECONDS) -> None:
        self._main = _View(None, replay)  # every revocation
        self._replay = replay
        # By the resource server reading each and its resources: a stream is one resource
        # server's own, never resumed by another that serves the same resources later.
        self._views: dict[ViewKey, _View] = {}
        self._clock = clock
        self._idle_seconds = idle_seconds
        self._of: dict[Reader, _View] = {}
        self.seats = Seats(caps or ReaderCaps())
        self._metrics = metrics
        events.watch(self._heard)

    @property
    def stream(self) -> str:
        """The main stream's id (every revocation)."""
        return self._main.stream

    @stream.setter
    def stream(self, stream: str) -> None:
        self._main.stream = stream

    @property
    def seq(self) -> int:
        """The main stream's last number."""
        return self._main.seq

    @property
    def _recent(self) -> deque[Message]:
        return self._main.recent

    @property
    def _readers(self) -> dict[Reader, End | None]:
        return {reader: end for view in (self._main, *self._views.values()) for reader, end in view.readers.items()}

    def _heard(self, revocation: Revocation | None) -> None:
        if revocation is None:
            self._send({"type": "flush"}, None)
        elif revocation.kind in NAMED:
            key = family_label(revocation.key) if revocation.kind == FAMILY else revocation.key
            self._send({"type": "revoked", NAMED[revocation.kind]: key}, revocation.audience)

    def _send(self, body: Message, audience: tuple[str, ...] | None = None) -> None:
        sent = 0
        for view in (self._main, *self._views.values()):
            if view.hears(audience):
                sent += self._send_in(view, body)
        if self._metrics is not None and sent:
            self._metrics.feed_sent(sent)

    @staticmethod
    def _send_in(view: _View, body: Message) -> int:
        view.seq += 1
        message = {**body, "seq": view.seq}
        view.recent.append(message)
        readers = list(view.readers)
        for reader in readers:
            try:
                reader(message)
            except Exception:  # one broken reader must not keep the message from the others
                log.exception("revocation feed reader failed")
        return len(readers)

    def open(self, reader: Reader, stream: str | None = None, after: int | None = None,
             end: End | None = None, serves: list[str] | None = None, owner: str | None = None) -> Opening:
        """Add ``reader``; it resumes after message ``after`` of ``stream`` when this process's
        buffer still holds every message since, else it must flush what it holds. ``end`` is
        called when the process stops (:meth:`end_all`). ``serves``: a resource server's
        resources, whose view it reads (None: every revocation, the main stream), that of the
        resource server ``owner`` (:func:`owner`) alone."""
        self._drop_idle()
        view = self._main if serves is None else self._view((owner, frozenset(serves)))
        view.idle_since = None
        oldest = view.recent[0]["seq"] if view.recent else view.seq + 1
        resumed = stream == view.stream and after is not None and oldest - 1 <= after <= view.seq
        missed = [message for message in view.recent if resumed and message["seq"] > (after or 0)]
        view.readers[reader] = end
        self._of[reader] = view
        if self._metrics is not None:
            self._metrics.feed_opened(resumed)
        return Opening({"type": "ready", "stream": view.stream, "seq": view.seq, "resumed": resumed}, missed)

    def _view(self, key: ViewKey) -> _View:
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = _View(key[1], self._replay, key)
        return view

    def close(self, reader: Reader) -> None:
        view = self._of.pop(reader, None)
        if view is not None:
            view.readers.pop(reader, None)
            if not view.readers and view is not self._main:
                view.idle_since = self._clock()
                if not view.recent:  # nothing to resume: none kept
                    del self._views[view.key]  # type: ignore[arg-type]
        self._drop_idle()

    def _drop_idle(self) -> None:
        """Drop every view without a reader for :data:`VIEW_IDLE_SECONDS` (a reader that comes
        back later flushes): views do not pile up as resource servers come and go."""
        now = self._clock()
        for key, view in list(self._views.items()):
            if not view.readers and view.idle_since is not None and now - view.idle_since >= self._idle_seconds:
                del self._views[key]

    @property
    def views(self) -> int:
        """How many streams resource servers read, or may resume (the main stream aside)."""
        return len(self._views)

    def end_all(self) -> int:
        """The process stops: admit no reader from now on, and tell each open one to go (its
        ``end``). Returns how many were told."""
        self.seats.stopping = True
        ends = [end for view in (self._main, *self._views.values()) for end in view.readers.values()
                if end is not None]
        for end in ends:
            try:
                end()
            except Exception:  # one broken reader must not keep the others open
                log.exception("revocation feed reader failed to end")
        return len(ends)

    @property
    def readers(self) -> int:
        return len(self._of)
