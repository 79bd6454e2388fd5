"""Proof Key for Code Exchange (RFC 7636), the S256 method only (RFC 9700 §2.1.1)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

S256 = "S256"

# RFC 7636 §4.1 / §4.2: 43 to 128 characters of the unreserved set.
_VERIFIER = re.compile(r"^[A-Za-z0-9._~-]{43,128}$")
# A S256 challenge is BASE64URL(SHA256(verifier)) without padding: exactly 43 characters.
_CHALLENGE = re.compile(r"^[A-Za-z0-9_-]{43}$")


def s256(verifier: str) -> str:
    """The S256 code challenge of ``verifier`` (RFC 7636 §4.2)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def is_valid_verifier(verifier: str) -> bool:
    return bool(_VERIFIER.fullmatch(verifier))


def is_valid_challenge(challenge: str) -> bool:
    return bool(_CHALLENGE.fullmatch(challenge))


def verify(verifier: str, challenge: str, method: str = S256) -> bool:
    """True when ``verifier`` matches the stored challenge; compared in constant time."""
    if method != S256 or not is_valid_verifier(verifier):
        return False
    return hmac.compare_digest(s256(verifier), challenge)
