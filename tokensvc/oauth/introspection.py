"""Token introspection (RFC 7662), open to resource servers, to confidential first-party clients
and to admin users holding the ``admin`` scope; and who may read the revocation feed.

An active token's answer carries, beside RFC 7662's members, the identifiers a cache of answers
keys its entries on (``family_id``, ``grant_id``; ``client_id`` and ``sub`` are RFC 7662's),
which the revocation feed names when they are revoked (:mod:`tokensvc.oauth.feed`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tokensvc.oauth import bearer, clientauth, feed, scopes
from tokensvc.oauth.administrators import require_admin
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import AccessDenied, InvalidClient
from tokensvc.oauth.privileges import Authority
from tokensvc.records import ACCESS, REFRESH, Client

NOT_ALLOWED = "Introspection is open to resource servers, first-party confidential clients and administrators"
TOKEN_TYPES = {ACCESS: "access_token", REFRESH: "refresh_token"}


async def authorize_caller(ctx: OAuthContext, request: ClientRequest) -> Client | None:
    """Introspection is open to a resource server or a confidential first-party client (its
    secret, body or Basic) and to an admin user's bearer token carrying ``admin``. Every call
    names its client (the interface: every token-endpoint call carries ``client_id``), a bearer
    call the client its token was issued to. Anyone else: 422 for a call that names no client,
    401 for credentials that prove nothing, 403 for a caller who is not allowed. The client that
    proved its secret (None for an administrator's bearer token): what it may be told depends
    on which APIs it serves (:func:`introspect`)."""
    presented = bearer.from_authorization(request.authorization)
    if presented is not None:
        clientauth.require_client(request)
        token = await bearer.active_access_token(ctx, presented)
        if token is None:
            raise InvalidClient("The bearer token is not active")
        if request.client_id != token.token.client_id:
            raise InvalidClient("client_id is not the client the bearer token was issued to")
        check_bearer_caller(token)
        return None
    return await authorize_client(ctx, request)


@dataclass(slots=True, frozen=True)
class Reader:
    """A client that may read the revocation feed, and until when the secret it proved proves
    it: the expiry of its previous secret when it proved that one; None for its current secret,
    which holds until it is changed (and the change is announced)."""

    client: Client
    until: datetime | None = None


async def authorize_client(ctx: OAuthContext, request: ClientRequest) -> Client:
    """A client that proves its secret and may introspect."""
    return (await authorize_reader(ctx, request)).client


async def authorize_reader(ctx: OAuthContext, request: ClientRequest) -> Reader:
    """A client that proves its secret and may introspect: the one way to read the revocation
    feed (``GET /oauth/revocations``, HTTP Basic)."""
    proof = await clientauth.prove(ctx, request)
    client = proof.client
    if not client.confidential:  # it tried Basic (the feed takes nothing else): challenged to again
        raise InvalidClient("Introspection needs client authentication", basic=True)
    check_client_caller(client)
    return Reader(client, proof.previous.expires_at if proof.previous else None)


async def still_a_reader(ctx: OAuthContext, request: ClientRequest) -> Reader | None:
    """The reader again, when the credentials a feed reader proved at its handshake still prove
    a client that may read the feed (asked when its client changes: removed, its secret rotated,
    its right withdrawn): its secret, or the previous one while a rotation keeps that in force,
    and then until that one's time is up (a rotation that kept the reader's secret as the
    previous one gives it an end). None when they prove nothing. No new attempt: nothing is
    counted against a limit nor audited."""
    creds = request.credentials()
    assert creds is not None  # it was proven at the handshake
    client = await ctx.store.get_client(creds.client_id)
    previous = await ctx.store.get_previous_secret(creds.client_id) if client is not None else None
    try:
        proven = clientauth.verify(client, creds, previous, ctx.clock())
        check_client_caller(proven)
    except (InvalidClient, AccessDenied):
        return None
    used = clientauth.proven_by_previous(proven, creds, previous)
    return Reader(proven, used.expires_at if used else None)


def check_client_caller(client: Client) -> None:
    """A client may introspect (and read the revocation feed) when it is confidential (it proved
    a secret) and a resource server or first-party."""
    if not (client.confidential and (client.resource_server or client.first_party)):
        raise AccessDenied(NOT_ALLOWED)


def check_bearer_caller(token: Authority) -> None:
    """A bearer caller must be an admin user whose token carries the ``admin`` scope in force."""
    require_admin(token, NOT_ALLOWED)


async def introspect_for(ctx: OAuthContext, token: str, caller: Client | None) -> dict[str, Any]:
    """:func:`introspect`, as ``caller`` may be told it (None: an administrator's token): a token
    bound to an audience (RFC 8707) is ``active: false`` to a resource server that serves none
    of it, which must not take it, nor learn whose it is."""
    body = await introspect(ctx, token)
    audience = body.get("aud")
    if (audience is not None and caller is not None and caller.resource_server
            and not any(resource in audience for resource in caller.resources or [])):
        return {"active": False}
    return body


async def introspect(ctx: OAuthContext, token: str) -> dict[str, Any]:
    """The RFC 7662 §2.2 response for ``token``: its metadata with the scopes in force now
    (:mod:`tokensvc.oauth.privileges`), or only ``active: false`` (for a token with none). A
    token bound to an audience (RFC 8707) says so (``aud``)."""
    found = await bearer.in_force(ctx, token)
    if found is None:
        return {"active": False}  # a new dict each time: the caller may add to its answer
    record = found.token
    body: dict[str, Any] = {
        "active": True,
        "scope": scopes.render(record.scopes),
        "client_id": record.client_id,
        "token_type": TOKEN_TYPES[record.token_type],
        "exp": int(record.expires_at.timestamp()),
        "iat": int(record.issued_at.timestamp()),
        "iss": ctx.issuer,
        **feed.cache_keys(record),
    }
    if record.audience is not None:
        body["aud"] = list(record.audience)
    if found.user is not None:
        body.update(sub=record.user_id, subject_type="user", username=found.user.username)
    else:
        body.update(sub=record.installation_id, subject_type="installation",
                    installation_id=record.installation_id)
    return body
