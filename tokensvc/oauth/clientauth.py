"""Client authentication at the token endpoints (RFC 6749 §2.3.1).

``client_secret_basic`` (HTTP Basic), ``client_secret_post`` (secret in the body) for
confidential clients; ``none`` (client_id only) for public clients, which rely on PKCE.
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote_plus

from tokensvc import logs
from tokensvc.errors import ValidationFailed
from tokensvc.oauth import hashing
from tokensvc.oauth.errors import InvalidClient, InvalidRequest, UnauthorizedClient
from tokensvc.ratelimit import Attempt, TooManyFailures
from tokensvc.records import Client

if TYPE_CHECKING:  # the context's metadata names this module's methods
    from tokensvc.oauth.context import OAuthContext

BASIC, POST, NONE = "client_secret_basic", "client_secret_post", "none"
AUTH_METHODS = (BASIC, POST, NONE)


@dataclass(slots=True)
class ClientRequest:
    """What a token-endpoint request says about its caller: the ``Authorization`` header, the
    body's ``client_id`` and ``client_secret``, and the address it came from."""

    authorization: str | None
    client_id: str | None
    client_secret: str | None
    address: str
    endpoint: str = ""
    _parsed: tuple[ClientCredentials | None, Exception | None] | None = field(default=None, repr=False)

    def names_a_client(self) -> bool:
        """Every token-endpoint call carries ``client_id``, in the body or in Basic credentials."""
        return self.client_id is not None or _is_basic(self.authorization)

    def credentials(self) -> ClientCredentials | None:
        """The credentials the request carries (parsed once), or None when it names no client;
        InvalidClient / InvalidRequest when they are malformed."""
        if self._parsed is None:
            try:
                self._parsed = (credentials(self.authorization, self.client_id, self.client_secret), None)
            except (InvalidClient, InvalidRequest) as exc:
                self._parsed = (None, exc)
        creds, error = self._parsed
        if error is not None:
            raise error
        return creds


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
    return unquote_plus(client_id), unquote_plus(secret)


def credentials(authorization: str | None, client_id: str | None,
                client_secret: str | None) -> ClientCredentials | None:
    """The credentials a token-endpoint request carries, or None when it names no client."""
    if _is_basic(authorization):
        assert authorization is not None
        basic_id, basic_secret = parse_basic(authorization)
        if client_secret is not None:
            raise InvalidRequest("Use one client authentication method, not Basic and client_secret both")
        if client_id is not None and client_id != basic_id:
            raise InvalidClient("client_id differs from the Basic credentials", basic=True)
        return ClientCredentials(basic_id, basic_secret, BASIC)
    if client_id is None:
        return None
    return ClientCredentials(client_id, client_secret, POST if client_secret is not None else NONE)


def named_client_id(request: ClientRequest) -> str | None:
    """The client id a request names (body or Basic), for the access log; None if none."""
    try:
        creds = request.credentials()
    except (InvalidClient, InvalidRequest):
        return request.client_id
    return creds.client_id if creds is not None else None


def require_client(request: ClientRequest) -> None:
    """Every token-endpoint call carries ``client_id`` (the spec), in the body or in Basic
    credentials: one that names no client is refused as a missing field (422)."""
    if not request.names_a_client():
        raise ValidationFailed.missing("body", "client_id")


def _is_basic(authorization: str | None) -> bool:
    return authorization is not None and authorization[:6].lower() == "basic "


async def authenticate_grant_client(ctx: OAuthContext, request: ClientRequest) -> Client:
    """The client a request for tokens (code exchange, refresh, RFC 7009 revocation) proves: a
    resource server proves itself too (a wrong secret counts as a failure) and is then told it
    may use none of them."""
    client = await authenticate_request(ctx, request)
    if client.resource_server:
        raise UnauthorizedClient("A resource server may introspect and read the revocation feed, nothing else")
    return client


async def authenticate_request(ctx: OAuthContext, request: ClientRequest) -> Client:
    """The client a token-endpoint request proves, under the failure limits, or InvalidClient.

    The credentials are checked first (a digest, in constant time). A failure is counted
    against the address and the client id, audited and counted in the metrics; past a limit
    the answer to a failure is TooManyFailures (429) instead of 401. A right secret of high
    entropy (:func:`guessable`: one the service generated, or a hand-set one as long) and a
    public client's ``client_id`` (nothing to guess) are never refused by a limit: guessing one
    gains nothing from the limit, and refusing the right one would let anyone sharing the
    address lock the client out. Only a right secret shorter than that is answered 429 too
    while its key is over the limit, so that the answer tells a guesser nothing.
    """
    require_client(request)
    limits = ctx.limits
    try:
        creds = request.credentials()
    except InvalidClient:
        await _failed(ctx, limits.client_attempt(None, request.address), None, request)
        raise
    assert creds is not None  # it names a client
    attempt = limits.client_attempt(creds.client_id, request.address)
    client = await ctx.store.get_client(creds.client_id)
    try:
        proven = verify(client, creds)
    except InvalidClient:
        await _failed(ctx, attempt, creds.client_id, request)
        raise
    if not guessable(proven, creds):
        return proven
    try:
        await limits.check(attempt)
    except TooManyFailures:
        ctx.metrics.refused_by_limit("client_auth")
        raise
    return proven


def guessable(client: Client, creds: ClientCredentials) -> bool:
    """Whether the right secret ``creds`` proved ``client`` with could have been guessed within
    any number of attempts the limits allow: a confidential client's secret shorter than a
    generated one (256 random bits, :data:`hashing.SECRET_LENGTH` characters), as an operator
    may set by hand in the configuration. A public client has no secret to guess, however it
    names itself: ``client_id`` alone, or HTTP Basic with an empty secret (``Basic
    base64("node-agent:")``, requests-oauthlib's way for a public client)."""
    secret = creds.client_secret
    return client.confidential and secret is not None and len(secret) < hashing.SECRET_LENGTH


async def _failed(ctx: OAuthContext, attempt: Attempt, client_id: str | None, request: ClientRequest) -> None:
    """Count and audit a failed authentication; TooManyFailures past a limit."""
    _audit_failure(client_id, request)
    ctx.metrics.failed_client_auth()
    try:
        await ctx.limits.failed(attempt)
    except TooManyFailures:
        ctx.metrics.refused_by_limit("client_auth")
        raise


def _audit_failure(client_id: str | None, request: ClientRequest) -> None:
    logs.audit("client_auth", {"client_id": client_id, "remote_ip": request.address, "endpoint": request.endpoint,
                               "outcome": "failure"}, logging.WARNING, "client authentication failed")


def verify(client: Client | None, creds: ClientCredentials) -> Client:
    """``client`` if ``creds`` prove it (the one their client_id names); else InvalidClient (401)."""
    basic = creds.method == BASIC
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
