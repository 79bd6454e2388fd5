"""Client authentication at the token endpoints (RFC 6749 §2.3.1).

``client_secret_basic`` (HTTP Basic), ``client_secret_post`` (secret in the body) for
confidential clients; ``none`` (client_id only) for public clients, which rely on PKCE.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from urllib.parse import unquote_plus

from tokensvc.oauth import hashing
from tokensvc.oauth.errors import InvalidClient, InvalidRequest
from tokensvc.records import Client
from tokensvc.storage.base import Store

BASIC, POST, NONE = "client_secret_basic", "client_secret_post", "none"
AUTH_METHODS = (BASIC, POST, NONE)


@dataclass(slots=True, frozen=True)
class ClientCredentials:
    client_id: str
    client_secret: str | None
    method: str


def parse_basic(authorization: str) -> tuple[str, str]:
    """Decode ``Basic base64(urlencode(id):urlencode(secret))``; InvalidClient when malformed."""
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidClient("Malformed Basic credentials", basic=True) from None
    client_id, sep, secret = decoded.partition(":")
    if not sep or not client_id:
        raise InvalidClient("Malformed Basic credentials", basic=True)
    # RFC 6749 §2.3.1: both parts are form-urlencoded before base64.
    return _form_decoded(client_id), _form_decoded(secret)


def _form_decoded(value: str) -> str:
    # Most ids and secrets have nothing encoded; unquote_plus costs a call chain per part.
    return unquote_plus(value) if "%" in value or "+" in value else value


def credentials(authorization: str | None, client_id: str | None, client_secret: str | None) -> ClientCredentials | None:
    """The credentials a token-endpoint request carries, or None when it names no client."""
    if authorization and authorization[:6].lower() == "basic ":
        basic_id, basic_secret = parse_basic(authorization)
        if client_secret is not None:
            raise InvalidRequest("Use one client authentication method, not Basic and client_secret both")
        if client_id is not None and client_id != basic_id:
            raise InvalidClient("client_id differs from the Basic credentials", basic=True)
        return ClientCredentials(basic_id, basic_secret, BASIC)
    if client_id is None:
        return None
    return ClientCredentials(client_id, client_secret, POST if client_secret is not None else NONE)


async def authenticate(store: Store, creds: ClientCredentials) -> Client:
    """The registered client the credentials prove, or InvalidClient (401)."""
    basic = creds.method == BASIC
    client = await store.get_client(creds.client_id)
    if client is None:
        # Spend a digest anyway so an unknown id and a wrong secret take the same time.
        hashing.matches(creds.client_secret or "", "0" * 64)
        raise InvalidClient("Client authentication failed", basic=basic)
    if client.secret_hash is None:
        if creds.client_secret:  # a public client has no secret to present
            raise InvalidClient("Client authentication failed", basic=basic)
        return client
    if creds.client_secret is None or not hashing.matches(creds.client_secret, client.secret_hash):
        raise InvalidClient("Client authentication failed", basic=basic)
    return client
