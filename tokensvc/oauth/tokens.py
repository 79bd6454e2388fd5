"""Minting tokens, and the refresh token's format.

An access token is 256 bits (43 URL-safe characters), random for the pair an exchange issues
and derived for a rotation's (``oauth/successors.py``: an HMAC under a server key, unpredictable
without it). A refresh token is ``<family secret>.<256 such bits>``. The family secret is the
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
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from tokensvc.oauth import hashing
from tokensvc.records import Pair

SEPARATOR = "."
FAMILY_SECRET_BYTES = 16
_REFRESH = re.compile(r"[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}")


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
         salt: str | None = None) -> Minted:
    """A new pair of the family whose secret is ``secret``: random, or ``derived`` (its access
    token and the random part of its refresh token, :func:`tokensvc.oauth.successors.derive`),
    numbered ``serial`` in the family and derived with the key ``key_id`` and ``salt``."""
    access, tail = derived or (hashing.new_secret(), hashing.new_secret())
    refresh = f"{secret}{SEPARATOR}{tail}"
    return Minted(access, refresh, Pair(hashing.digest(access), hashing.digest(refresh), list(scopes), now,
                                        now + timedelta(seconds=refresh_ttl), now + timedelta(seconds=access_ttl),
                                        serial, key_id, salt))
