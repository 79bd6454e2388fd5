"""Successor pairs derived from the refresh token they succeed, so that presentations of one
token that arrive together all get one answer.

Two tabs, an app and its own retry, a proxy repeating a POST: the same refresh token arrives
several times within moments. One presentation rotates the family; the others must not get a
pair of their own (a 200 carrying a pair a concurrent request then kills), nor be taken for
reuse. So the pair a rotation issues is not random but derived: its access token and the
random part of its refresh token are HMACs, under a server key, of the presented refresh
token and the new pair's serial number in the family. A presentation that finds its token
rotated out within :data:`CONCURRENT_SECONDS` of its successor's issue, before that successor
was used, recomputes the successor and, when the store holds exactly its hashes, answers it
again: no write, and no token kept in the clear anywhere.

What the key protects: the successor of a refresh token is computable only with the key *and*
that token; whoever holds the token may refresh anyway, so the key adds no power to a thief
of a token, and the key alone gives nothing. It lives only in the configuration
(``tokens.successor_keys``, or derived from ``cookie_secret``), never in the store, which
holds its id beside the pair it derived (``Family.key_id``).

Rotating the key: every key listed recomputes the pairs it derived; the first derives new
ones. A pair whose key is gone (or a pair a release without derivation issued, random, whose
stale serial and key id recompute to something else) is simply not recognised: the
presentation falls back to the grace rules, as before this existed. Nothing breaks for longer
than the seconds of the window.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

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


def key_from_cookie_secret(cookie_secret: str) -> str:
    """The one key used when none is configured: every process sharing the cookie secret
    (as they must) derives the same."""
    return _b64(hmac.new(cookie_secret.encode("utf-8"), _FROM_COOKIE_SECRET, hashlib.sha256).digest())


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def derive(key: bytes, presented: str, serial: int) -> tuple[str, str]:
    """The successor of the refresh token ``presented`` numbered ``serial``: its access token
    and the random part of its refresh token, 43 URL-safe characters each (256 bits), as a
    random pair's are."""
    seed = hmac.new(key, _DERIVE + presented.encode("utf-8") + b"\x00" + str(serial).encode("ascii"),
                    hashlib.sha256).digest()
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

    def get(self, wanted: str | None) -> bytes | None:
        """The key named ``wanted``, or None (not configured here, or no key: a random pair)."""
        return next((key for identifier, key in self.keys if identifier == wanted), None)
