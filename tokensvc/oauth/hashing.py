"""Secrets: minting, SHA-256 digests for lookup, constant-time comparison, password KDF.

Tokens, codes, client secrets and session ids carry 256 bits from :mod:`secrets`, so a
plain SHA-256 digest is enough to store them (they cannot be guessed); passwords are
low-entropy and get scrypt (RFC 7914) with a per-password salt.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
import secrets

TOKEN_BYTES = 32  # 256 bits
SECRET_LENGTH = 43  # the characters of new_secret(): the length of every token and generated secret
# Every access token tokensvc issues (and every release before issued): new_secret()'s form, which
# the successor of a rotation (successors.derive) has too, followed by its routing part of as many
# characters (oauth/tokens.py) or, as 0.10.0 issued it, alone. A resource server refuses anything
# else without asking (tokensvc.resource): a new form of access token must be taught to it first.
ACCESS_TOKEN = re.compile(r"[A-Za-z0-9_-]{43}(?:[A-Za-z0-9_-]{43})?")
ACCESS_TOKEN_LENGTHS = (SECRET_LENGTH, 2 * SECRET_LENGTH)

# scrypt cost: about 16 MiB and a few tens of milliseconds per hash on a current core.
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1


def new_secret() -> str:
    """A fresh URL-safe random secret (43 characters, 256 bits)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def digest(secret: str) -> str:
    """The SHA-256 hex digest a secret is stored and looked up under."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def matches(secret: str, stored_digest: str) -> bool:
    """Constant-time check of a presented secret against its stored digest."""
    return hmac.compare_digest(digest(secret), stored_digest)


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    salt = salt or secrets.token_bytes(16)
    key = hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=32
    )
    b64 = lambda raw: base64.b64encode(raw).decode("ascii")  # noqa: E731
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${b64(salt)}${b64(key)}"


def verify_password(password: str, password_hash: str) -> bool:
    try:
        scheme, n, r, p, salt, key = password_hash.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(key)
        actual = hashlib.scrypt(
            password.encode("utf-8"), salt=base64.b64decode(salt),
            n=int(n), r=int(r), p=int(p), dklen=len(expected),
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


@functools.cache
def dummy_password_hash() -> str:
    """A hash to verify against when the username is unknown, so that a wrong username
    costs as much time as a wrong password (no user enumeration by timing)."""
    return hash_password(secrets.token_urlsafe(16))
