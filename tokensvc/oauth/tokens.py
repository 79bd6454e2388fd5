"""Minting tokens, and their formats.

An access token is its random part, 256 bits (43 URL-safe characters), random for the pair an
exchange issues and derived for a rotation's (``oauth/successors.py``: an HMAC under a server
key, unpredictable without it), then its routing part (43 more): its family's id enciphered
under a server key (:func:`route`), so that its lookup names the family's shard key beside the
token's hash (docs/operations.md, Beyond one replica set). The routing part discloses nothing to
whoever holds the token, a resource server included: not the family's id, which is the hash its
refresh token is looked up under, and nothing two tokens of one family share (each is
enciphered with a pad drawn from the token's own random part). It grants nothing either: the
token is found only where its whole hash is stored, so a routing part taken from another token
names a family that does not hold it. An access token of the old shape (43 characters, as 0.10.0
issued) has no routing part and is found by its hash alone. The format is no API: clients hold
access tokens as opaque strings.

A refresh token is ``<family secret>.<256 such bits>``. The family secret is the
same in every refresh token of a family (:class:`tokensvc.records.Family`), and the family's
record is found under its hash: so a rotated-out refresh token is recognised as its family's
without a record of its own (reuse detection stays complete while a family keeps one record
however often it refreshes), and a token that is not the family's current one is refused.

The family secret is derived from the authorization code *and* its PKCE verifier. A repeated
exchange of the same code finds the family it started (to revoke it); and whoever saw
only the code (in a browser's history, a log, a Referer) cannot compute it, so cannot forge a
"rotated-out" token that would revoke the family. Every secret is stored only as its SHA-256.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from tokensvc.oauth import hashing
from tokensvc.records import Pair

SEPARATOR = "."
FAMILY_SECRET_BYTES = 16
_REFRESH = re.compile(r"[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}")
ROUTED_LENGTH = hashing.ACCESS_TOKEN_LENGTHS[1]  # an access token with its routing part
_ROUTE = b"tokensvc route\x00"
_FAMILY_ID_BYTES = 32  # a family's id is a SHA-256 hex digest
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def family_secret(code: str, verifier: str) -> str:
    """The family secret of the tokens a code's redemption issues (128 bits, 22 characters)."""
    mac = hmac.new(code.encode("utf-8"), b"tokensvc family\x00" + verifier.encode("utf-8"), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()[:FAMILY_SECRET_BYTES]).rstrip(b"=").decode("ascii")


def family_id(secret: str) -> str:
    """The key of the family record: the hash of its secret."""
    return hashing.digest(secret)


def parse_refresh(token: str) -> tuple[str, str] | None:
    """``(family_id, token_hash)`` of a token in the refresh format, else None."""
    if len(token) != 66 or not _REFRESH.fullmatch(token):
        return None
    return family_id(token[:22]), hashing.digest(token)


def _pad(key: bytes, random_part: str) -> int:
    """The one-time pad of a token's routing part: an HMAC of its random part under ``key``."""
    return int.from_bytes(hmac.digest(key, _ROUTE + random_part.encode("ascii"), "sha256"))


def route(key: bytes, family_id: str, random_part: str) -> str:
    """The routing part of the access token whose random part is ``random_part``, of the family
    ``family_id``: the family's id enciphered under ``key`` (43 URL-safe characters)."""
    raw = (int(family_id, 16) ^ _pad(key, random_part)).to_bytes(_FAMILY_ID_BYTES)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def routes(keys: Iterable[bytes], token: str) -> tuple[str, ...]:
    """The family ids the routing part of ``token`` stands for under each key, one of which
    enciphered it (the lookup names them all: a key being retired still routes what it
    enciphered); () for a token of another shape, found by its hash alone."""
    if len(token) != ROUTED_LENGTH or not hashing.ACCESS_TOKEN.fullmatch(token):
        return ()
    random_part, routing = token[:hashing.SECRET_LENGTH], token[hashing.SECRET_LENGTH:]
    enciphered = int.from_bytes(binascii.a2b_base64(routing.encode("ascii").translate(_FROM_URLSAFE) + b"="))
    found = tuple(format(enciphered ^ _pad(key, random_part), "064x") for key in keys)
    return found if len(found) == 1 else tuple(dict.fromkeys(found))


def is_refresh_format(token: str) -> bool:
    return SEPARATOR in token


@dataclass(slots=True, frozen=True)
class Minted:
    """A new access + refresh pair: the secrets for the response, the record for the store."""

    access_token: str
    refresh_token: str
    pair: Pair


def mint(secret: str, scopes: list[str], now: datetime, access_ttl: int, refresh_ttl: int, *,
         derived: tuple[str, str] | None = None, serial: int = 0, key_id: str | None = None,
         salt: str | None = None, routing_key: bytes | None = None) -> Minted:
    """A new pair of the family whose secret is ``secret``: random, or ``derived`` (the random
    part of its access token and of its refresh token, :func:`tokensvc.oauth.successors.derive`),
    numbered ``serial`` in the family and derived with the key ``key_id`` and ``salt``; its
    access token carries its routing part enciphered under ``routing_key`` (without one, the
    old shape)."""
    access, tail = derived or (hashing.new_secret(), hashing.new_secret())
    if routing_key is not None:
        access += route(routing_key, family_id(secret), access)
    refresh = f"{secret}{SEPARATOR}{tail}"
    return Minted(access, refresh, Pair(hashing.digest(access), hashing.digest(refresh), list(scopes), now,
                                        now + timedelta(seconds=refresh_ttl), now + timedelta(seconds=access_ttl),
                                        serial, key_id, salt))
