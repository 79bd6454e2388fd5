"""Client authentication at the token endpoints (RFC 6749 §2.3.1).

``client_secret_basic`` (HTTP Basic), ``client_secret_post`` (secret in the body) for
confidential clients; ``none`` (client_id only) for public clients, which rely on PKCE.

A confidential client's secret may have a predecessor still in force (a rotation that kept it,
:class:`~tokensvc.records.PreviousSecret`): a presented secret is compared with both, each in
constant time, whichever matches; a use of the old one is recorded and audited (at most once
per :data:`PREVIOUS_USE_NOTED_EVERY`), its expiry audited by whoever forgets it
(:func:`expire_previous_secrets`).
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING
from urllib.parse import unquote_plus

from tokensvc.errors import ValidationFailed
from tokensvc.oauth import hashing
from tokensvc.oauth.errors import InvalidClient, InvalidRequest, UnauthorizedClient
from tokensvc.ratelimit import Attempt, TooManyFailures
from tokensvc.records import Client, PreviousSecret, utcnow
from tokensvc.storage.base import Registry
from tokensvc.telemetry import logs

if TYPE_CHECKING:  # the context's metadata names this module's methods
    from tokensvc.oauth.context import OAuthContext

BASIC, POST, NONE = "client_secret_basic", "client_secret_post", "none"
AUTH_METHODS = (BASIC, POST, NONE)
# A use of a previous secret is recorded (its last_used_at) and audited at most this often:
# one write and one line a minute however busy the client, never one per request.
PREVIOUS_USE_NOTED_EVERY = 60.0
_NO_DIGEST = "0" * 64  # compared with when there is no previous secret, so that each path costs the same


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


@dataclass(slots=True, frozen=True)
class Proof:
    """A client proven, and the previous secret it was proven with (None: its current secret)."""

    client: Client
    previous: PreviousSecret | None = None


async def authenticate_request(ctx: OAuthContext, request: ClientRequest) -> Client:
    """The client a token-endpoint request proves (:func:`prove`)."""
    return (await prove(ctx, request)).client


async def prove(ctx: OAuthContext, request: ClientRequest) -> Proof:
    """The client a token-endpoint request proves, under the failure limits, or InvalidClient;
    with the previous secret it proved, when it was that one (a feed reader holds only until
    that secret's time is up).

    The credentials are checked first (a digest, in constant time). A failure is counted
    against the address and the client id, audited and counted in the metrics; past a limit
    the answer to a failure is TooManyFailures (429) instead of 401. What a limit may refuse is
    decided by what the store holds, never by what the request presents (:func:`guessable`):
    a right secret the service generated, and a public client's ``client_id`` (nothing to
    guess), are never refused, since guessing one gains nothing from the limit and refusing the
    right one would let anyone sharing the address lock the client out; a right secret set by
    hand, however long, is answered 429 too while its key is over the limit, exactly as a wrong
    one is, so that the answer tells a guesser nothing.

    A failure counts toward the address's limit only when it could be a guess at a secret a
    limit protects (:func:`guarded`): failures under an id no client has, under a public
    client, or at a client whose secrets were all generated, are counted in a group of their
    own, limited alike (429 past it), and never refuse a client whose secret was set by hand.
    """
    require_client(request)
    limits = ctx.limits
    try:
        creds = request.credentials()
    except InvalidClient:
        await _failed(ctx, limits.client_attempt(None, request.address, guarded=False), None, request)
        raise
    assert creds is not None  # it names a client
    # The client and its previous secret in one read, which a store several processes share
    # may answer from what this process read less than a second ago (Registry.client_record):
    # the right secret, the old one and a wrong one take the same steps.
    record = await ctx.store.client_record(creds.client_id)
    client = record.client if record is not None else None
    previous = None
    if record is not None and record.client.secret_hash is not None and creds.client_secret is not None:
        previous = record.previous
    now = ctx.clock()
    attempt = limits.client_attempt(creds.client_id, request.address, guarded=guarded(client, previous, now))
    try:
        proven = verify(client, creds, previous, now)
    except InvalidClient:
        await _failed(ctx, attempt, creds.client_id, request)
        raise
    used = proven_by_previous(proven, creds, previous)
    if guessable(proven, used):
        try:
            await limits.check(attempt)
        except TooManyFailures:
            ctx.metrics.refused_by_limit("client_auth")
            raise
    if used is not None:
        await _previous_used(ctx, used, request, now)  # proven, and not by its current secret
    return Proof(proven, used)


def proven_by_previous(client: Client, creds: ClientCredentials,
                       previous: PreviousSecret | None) -> PreviousSecret | None:
    """``previous`` when it is what ``creds`` proved ``client`` with (:func:`verify` said they
    prove it), not its current secret; else None."""
    if previous is None or hashing.matches(creds.client_secret or "", client.secret_hash or ""):
        return None
    return previous


def guessable(client: Client, previous: PreviousSecret | None = None) -> bool:
    """Whether the right secret that proved ``client`` could have been guessed within any
    number of attempts the limits allow, as the store knows it: a confidential client's secret
    is one the service generated (256 random bits) only when the store records it so
    (:attr:`Client.secret_generated`; ``previous``, when the client proved itself with the
    secret a rotation kept, :attr:`PreviousSecret.generated`). Anything else was set by hand
    and may be predictable, whatever its length. A public client has no secret to guess,
    however it names itself: ``client_id`` alone, or HTTP Basic with an empty secret (``Basic
    base64("node-agent:")``, requests-oauthlib's way for a public client)."""
    if not client.confidential:
        return False
    return not (previous.generated if previous is not None else client.secret_generated)


def guarded(client: Client | None, previous: PreviousSecret | None, now: datetime) -> bool:
    """Whether a failure under ``client`` could be a guess at a secret the limits protect: one
    set by hand, its current one or the previous one a rotation keeps in force. An id no client
    has, a public client and a client whose secrets were all generated hold none."""
    if client is None or not client.confidential:
        return False
    kept = previous is not None and previous.in_force(client, now)
    return guessable(client) or (kept and guessable(client, previous))


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


def verify(client: Client | None, creds: ClientCredentials, previous: PreviousSecret | None = None,
           now: datetime | None = None) -> Client:
    """``client`` if ``creds`` prove it (the one their client_id names) with its secret, or with
    ``previous`` while that is in force; else InvalidClient (401). Both secrets are compared,
    each in constant time, whichever matches."""
    basic = creds.method == BASIC
    if client is None:
        # Spend a digest anyway so an unknown id and a wrong secret take the same time.
        hashing.matches(creds.client_secret or "", _NO_DIGEST)
        raise InvalidClient("Client authentication failed", basic=basic)
    if client.secret_hash is None:
        if creds.client_secret:  # a public client has no secret to present
            raise InvalidClient("Client authentication failed", basic=basic)
        return client
    if not creds.client_secret:  # an empty secret proves no confidential client, whatever digest is stored
        raise InvalidClient("Client authentication failed", basic=basic)
    in_force = previous is not None and previous.in_force(client, now or utcnow())
    current = hashing.matches(creds.client_secret, client.secret_hash)
    old = hashing.matches(creds.client_secret, previous.secret_hash if in_force and previous else _NO_DIGEST)
    if not (current | old):
        raise InvalidClient("Client authentication failed", basic=basic)
    return client


async def _previous_used(ctx: OAuthContext, previous: PreviousSecret, request: ClientRequest, now: datetime) -> None:
    """A client proved itself with its previous secret: recorded, and audited as still in use
    by the one process that recorded it (at most once per :data:`PREVIOUS_USE_NOTED_EVERY`)."""
    if await ctx.store.note_previous_secret_use(previous.client_id, now, PREVIOUS_USE_NOTED_EVERY):
        logs.audit("client_previous_secret_used",
                   {"client_id": previous.client_id, "remote_ip": request.address, "endpoint": request.endpoint,
                    "expires_at": previous.expires_at.isoformat(), "outcome": "still_in_use"},
                   logging.WARNING, "a client authenticated with its previous secret, which expires at "
                                    f"{previous.expires_at.isoformat()}")


async def expire_previous_secrets(store: Registry, now: datetime) -> int:
    """Forget the previous secrets whose time is up, auditing each once (whichever process
    forgets it): when it was last used, or that it never was since the rotation. The count."""
    count = 0
    # One at a time, each told as soon as the store answers it: a failure midway loses no line.
    while (previous := await store.expire_previous_secret(now)) is not None:
        last = previous.last_used_at.isoformat() if previous.last_used_at else None
        logs.audit("client_previous_secret_expired",
                   {"client_id": previous.client_id, "rotated_at": previous.rotated_at.isoformat(),
                    "last_used_at": last, "outcome": "expired"},
                   logging.INFO, f"a client's previous secret expired (last used: {last or 'never'})")
        count += 1
    return count
