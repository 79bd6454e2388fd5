"""Successor pairs derived from the refresh token they succeed, so that presentations of one
token that arrive together all get one answer.

Two tabs, an app and its own retry, a proxy repeating a POST: the same refresh token arrives
several times within moments. One presentation rotates the family; the others must not get a
pair of their own (a 200 carrying a pair a concurrent request then kills), nor be taken for
reuse. So the pair a rotation issues is not random but derived: its access token and the
random part of its refresh token are HMACs, under a server key, of the presented refresh
token, the new pair's serial number in the family and a random salt the rotation draws and
stores with the pair. A presentation that finds its token rotated out, having arrived within
:data:`CONCURRENT_SECONDS` of its successor's issue and before that successor was used,
recomputes the successor from the family's record and, when the store holds exactly its
hashes, answers it again: no write, and no token kept in the clear anywhere.

Every time is an arrival: a rotation issues its pair at the moment its request arrived, and a
presentation is judged by the moment it arrived, not by when the store answered it, so an
election or a slow majority write between the two changes nothing. An arrival stands for at
most :data:`HELD_SECONDS` (:func:`judged_at`). Processes compare each other's times: their
clocks must agree (NTP), to well under the window.

What the key protects: computing a successor takes the key, the token it succeeds *and* the
salt the store holds for the current pair. The key alone gives nothing; the key and a token
copied long ago do not give the pairs after it (each rotation's salt is new and lives only in
the store); whoever holds the current refresh token may refresh anyway. The key lives only in
the configuration (``tokens.successor_keys``, or derived from each key of a ``cookie_secret``
of 32 characters or more), never in the store, which holds its id beside the pair it derived
(``Family.key_id``).

Rotating the key: every key listed recomputes the pairs it derived; the first derives new
ones. A pair whose key is gone (or a pair a release without derivation issued, random, whose
stale serial, key id and salt recompute to something else) is simply not recognised: the
presentation falls back to the grace rules, as before this existed. Nothing breaks for longer
than the seconds of the window.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from tokensvc.identifiers import MIN_SECRET_LENGTH

# Presentations of a refresh token this close to its successor's issue (and before that
# successor was used) are taken as concurrent with the one that rotated it: they get the same
# pair. Requests sent together arrive within milliseconds; two seconds cover a proxy's or a
# client library's immediate repeat, and stay short for a thief acting later.
CONCURRENT_SECONDS = 2

_KEY_ID = b"tokensvc successor key id\x00"
_DERIVE = b"tokensvc successor\x00"
_FROM_COOKIE_SECRET = b"tokensvc successor key\x00"


def key_id(key: bytes) -> str:
    """How the store names a key: 16 hex digits of a hash, which says nothing of the key."""
    return hashlib.sha256(_KEY_ID + key).hexdigest()[:16]


# The shortest cookie secret a key is derived from when none is configured (the one length rule
# of a secret given by hand, outside demo mode). Every visitor gets a cookie signed with the
# cookie secret, on which a guess can be tested offline: a key derived from a short one would be
# no stronger than that guess.
MIN_COOKIE_SECRET = MIN_SECRET_LENGTH


def key_from_cookie_secret(cookie_secret: str) -> str:
    """The key one key of ``cookie_secret`` gives when none is configured: every process
    sharing the cookie secret (as they must) derives the same. An HMAC of a label of its own
    under the cookie secret, so it is no signature the service ever gives out (a signed
    cookie's message never starts so)."""
    return _b64(hmac.new(cookie_secret.encode("utf-8"), _FROM_COOKIE_SECRET, hashlib.sha256).digest())


def new_salt() -> str:
    """The random salt of one rotation's derivation (128 bits, 22 characters). It is no secret
    on its own, and no token: without the key it computes nothing."""
    return secrets.token_urlsafe(16)


# The longest a request's arrival stands for it: one the store keeps longer (a stalled
# process, a budget set beyond reason) is judged as if it had arrived this long before its
# decision. Twice the store's default budget (15 s): a request that waits out one operation's
# budget and is then answered keeps its arrival; short enough that a held request cannot carry
# an old moment into a window long after it.
HELD_SECONDS = 30


def judged_at(arrived: datetime, now: datetime) -> datetime:
    """The moment a request that arrived ``arrived`` is judged by, decided ``now``: its
    arrival, bounded by :data:`HELD_SECONDS` before its decision."""
    return max(arrived, now - timedelta(seconds=HELD_SECONDS))


def concurrent(issued_at: datetime, at: datetime) -> bool:
    """Whether something that arrived ``at`` is concurrent with the issue of a pair at
    ``issued_at``: the one notion of the window, for a presentation of the token it succeeded
    and for the first use of the pair (which, within it, is recorded)."""
    return (at - issued_at).total_seconds() <= CONCURRENT_SECONDS


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def derive(key: bytes, presented: str, serial: int, salt: str) -> tuple[str, str]:
    """The successor of the refresh token ``presented`` numbered ``serial``, salted with
    ``salt``: its access token and the random part of its refresh token, 43 URL-safe
    characters each (256 bits), as a random pair's are."""
    message = b"\x00".join((presented.encode("utf-8"), str(serial).encode("ascii"), salt.encode("ascii")))
    seed = hmac.new(key, _DERIVE + message, hashlib.sha256).digest()
    return (_b64(hmac.new(seed, b"access", hashlib.sha256).digest()),
            _b64(hmac.new(seed, b"refresh", hashlib.sha256).digest()))


@dataclass(frozen=True, slots=True)
class SuccessorKeys:
    """The configured keys, by id: the first derives, every one recomputes."""

    keys: tuple[tuple[str, bytes], ...]

    @classmethod
    def of(cls, secrets: Sequence[str]) -> SuccessorKeys:
        if not secrets:
            raise ValueError("at least one successor key is needed")
        return cls(tuple((key_id(raw), raw) for raw in (secret.encode("utf-8") for secret in secrets)))

    @property
    def deriving(self) -> tuple[str, bytes]:
        """The (id, key) new pairs are derived with."""
        return self.keys[0]

    @property
    def every(self) -> tuple[bytes, ...]:
        """Every key: what an access token's routing part may be enciphered under
        (:func:`tokensvc.oauth.tokens.routes`)."""
        return tuple(key for _, key in self.keys)

    def get(self, wanted: str | None) -> bytes | None:
        """The key named ``wanted``, or None (not configured here, or no key: a random pair)."""
        return next((key for identifier, key in self.keys if identifier == wanted), None)
