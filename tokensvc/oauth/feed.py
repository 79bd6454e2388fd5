"""The revocation feed: for every revocation this process hears of, what a resource server's
cache of introspection answers must drop, numbered.

Every revocation this process makes, and through its relay (:func:`tokensvc.oauth.events.relay`)
every one another process sharing the store makes, becomes one message naming the identifier a
cache keys its entries on, as introspection returns it (:func:`cache_keys`): a token family's
``family_id``, a grant's ``grant_id``, a client's ``client_id`` (some of what its tokens may
do was withdrawn), or a user's ``sub`` (likewise: demoted from administrator, or removed).
Never a token, nor any hash a token is looked up under: the family's key in the store is the
hash of its secret, so the feed names it by a one-way function of that key
(:func:`family_label`). Web sessions are no bearer tokens and are not announced.

Each message carries a sequence number of this process's stream. A reader that reconnects names
the stream and the last number it saw: when the bounded buffer still holds everything after it,
the missed messages are sent again; otherwise (another process, a restart, too long away) it is
told to flush. A relay interruption, which may have missed revocations, is a ``flush`` too.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokensvc.oauth import hashing
from tokensvc.oauth.events import RevocationEvents
from tokensvc.records import Token
from tokensvc.storage.base import CLIENT, FAMILY, GRANT, SUBJECT, Revocation

log = logging.getLogger(__name__)

REPLAY = 4096  # messages kept for readers that reconnect
# The close code of a reader whose credentials no longer prove a client that may read the feed.
CLOSE_CREDENTIALS = 4403
# What each kind of revocation names, by the introspection member a cache keys on.
NAMED = {FAMILY: "family_id", GRANT: "grant_id", CLIENT: "client_id", SUBJECT: "sub"}

Message = dict[str, Any]
Reader = Callable[[Message], None]


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

    def __init__(self, events: RevocationEvents, replay: int = REPLAY) -> None:
        self.stream = secrets.token_urlsafe(12)  # a new stream per process: its numbers are its own
        self.seq = 0
        self._recent: deque[Message] = deque(maxlen=replay)
        self._readers: set[Reader] = set()
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
        for reader in list(self._readers):
            try:
                reader(message)
            except Exception:  # one broken reader must not keep the message from the others
                log.exception("revocation feed reader failed")

    def open(self, reader: Reader, stream: str | None = None, after: int | None = None) -> Opening:
        """Add ``reader``; it resumes after message ``after`` of ``stream`` when this process's
        buffer still holds every message since, else it must flush what it holds."""
        oldest = self._recent[0]["seq"] if self._recent else self.seq + 1
        resumed = stream == self.stream and after is not None and oldest - 1 <= after <= self.seq
        missed = [message for message in self._recent if resumed and message["seq"] > (after or 0)]
        self._readers.add(reader)
        return Opening({"type": "ready", "stream": self.stream, "seq": self.seq, "resumed": resumed}, missed)

    def close(self, reader: Reader) -> None:
        self._readers.discard(reader)

    @property
    def readers(self) -> int:
        return len(self._readers)
