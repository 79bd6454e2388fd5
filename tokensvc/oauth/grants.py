"""The token endpoint's grants: authorization code with PKCE (RFC 6749 §4.1.3, RFC 7636
§4.5-4.6) and refresh-token rotation with reuse detection (RFC 6749 §6, RFC 9700 §4.14.2).

Order of work, for both grants: validate, **store the new token pair, then win the one
atomic step** (``consume_code`` / ``rotate_refresh_token``). A store that fails before
the atomic step leaves the code or refresh token as it was, so the client may simply
retry; a pair whose atomic step is lost is revoked at once, and a pair written without a
response reaching anyone is unusable (its secrets were never disclosed). Once the atomic
step is won the response is sent, even if a concurrent revocation (reuse detection of a
racing replay) has already swept the new pair: of N concurrent presentations exactly one
succeeds and the grant is left consistent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from tokensvc import logs
from tokensvc.oauth import clientauth, hashing, pkce, scopes
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import InvalidGrant, InvalidScope, UnsupportedGrantType
from tokensvc.records import ACCESS, REFRESH, AuthorizationCode, Client, Grant, Subject, Token


@dataclass(slots=True)
class TokenResponse:
    access_token: str
    refresh_token: str
    expires_in: int
    scope: str
    token_type: str = "Bearer"


@dataclass(slots=True)
class _Pair:
    """A minted access + refresh pair: the secrets for the response, the records to store."""

    access: str
    refresh: str
    records: list[Token]


def _audit(event: str, outcome: str, client_id: str, subject: Subject, **fields: object) -> None:
    logs.audit(event, {"client_id": client_id, "subject": subject.id, "subject_type": subject.kind,
                       "outcome": outcome, **fields},
               logging.WARNING if outcome == "grant_revoked" else logging.INFO)


# -- the token endpoints ----------------------------------------------------------------

def check_grant_type(grant_type: str | None) -> None:
    """``POST /oauth/token`` serves ``authorization_code`` only; checked before anything else.
    Refresh lives at ``/oauth/token/refresh`` (the spec), so a ``refresh_token`` grant here is
    told where to go."""
    if grant_type is not None and grant_type != "authorization_code":
        raise UnsupportedGrantType("Only grant_type=authorization_code is supported here; "
                                   "refresh at /oauth/token/refresh")


async def token_for_code(ctx: OAuthContext, caller: ClientRequest, code: str, redirect_uri: str,
                         code_verifier: str | None) -> TokenResponse:
    """``POST /oauth/token``: authenticate the client, then exchange its code."""
    client = await clientauth.authenticate_request(ctx, caller)
    return await exchange_code(ctx, client, code, redirect_uri, code_verifier)


async def token_for_refresh(ctx: OAuthContext, caller: ClientRequest, refresh_token: str,
                            scope: str | None) -> TokenResponse:
    """``POST /oauth/token/refresh``: authenticate the client, then rotate its refresh token."""
    client = await clientauth.authenticate_request(ctx, caller)
    return await refresh(ctx, client, refresh_token, scope)


# -- authorization code ----------------------------------------------------------------

async def exchange_code(ctx: OAuthContext, client: Client, code: str, redirect_uri: str,
                        code_verifier: str | None) -> TokenResponse:
    store, now = ctx.store, ctx.clock()
    code_hash = hashing.digest(code)
    record = await store.get_code(code_hash)
    if record is None:
        raise InvalidGrant("Unknown authorization code")
    if record.consumed_at is not None:
        await _spent(ctx, record)
    try:
        _check_code(record, client, redirect_uri, code_verifier, now)
    except InvalidGrant:
        # A failed check spends the code, so a verifier cannot be guessed by retrying; it is
        # no redemption, so presenting the code again revokes nothing.
        await store.consume_code(code_hash, now, failed=True)
        raise
    grant = await store.find_grant(client.client_id, record.subject)
    if grant is None or not grant.stands_behind(record.generation):
        raise InvalidGrant("The authorization was revoked")
    pair = _mint(ctx, client, grant, record.scopes, parent_hash=None, now=now)
    await store.add_tokens(pair.records)
    if await store.consume_code(code_hash, now) is None:
        # Another presentation of this code won the race: this pair is void, and if that one
        # redeemed the code, this is a replay.
        await _revoke_pair(ctx, pair)
        await _spent(ctx, await store.get_code(code_hash) or record)
    await _sweep_if_grant_revoked(ctx, grant, pair)
    _audit("token_issued", "success", client.client_id, record.subject, grant="authorization_code")
    ctx.metrics.tokens_issued.labels("authorization_code").inc()
    return _response(ctx, pair, record.scopes)


def _check_code(record: AuthorizationCode, client: Client, redirect_uri: str, code_verifier: str | None,
                now: datetime) -> None:
    if record.client_id != client.client_id:
        raise InvalidGrant("The authorization code was issued to another client")
    if record.redirect_uri != redirect_uri:
        raise InvalidGrant("redirect_uri does not match the authorization request")
    if record.expires_at <= now:
        raise InvalidGrant("The authorization code has expired")
    if not code_verifier:
        raise InvalidGrant("code_verifier is required (PKCE)")
    if not pkce.verify(code_verifier, record.code_challenge, record.code_challenge_method):
        raise InvalidGrant("PKCE verification failed")


async def _spent(ctx: OAuthContext, record: AuthorizationCode) -> None:
    """A consumed code presented again: a replay when it was redeemed; merely dead when a
    failed check spent it (whoever holds a leaked code must not be able to cut the user off)."""
    if record.spent_by_failure:
        raise InvalidGrant("The authorization code is no longer valid")
    await _code_replayed(ctx, record)


async def _code_replayed(ctx: OAuthContext, record: AuthorizationCode) -> None:
    """RFC 6749 §4.1.2: a code used twice revokes what it was first exchanged for."""
    grant = await ctx.store.find_grant(record.client_id, record.subject)
    revoked = await revoke_grant(ctx, grant, "code_reuse") if grant is not None else 0
    _audit("code_reuse", "grant_revoked", record.client_id, record.subject, tokens_revoked=revoked)
    ctx.metrics.code_reuse.inc()
    raise InvalidGrant("The authorization code was already used")


# -- refresh ----------------------------------------------------------------------------

async def refresh(ctx: OAuthContext, client: Client, refresh_token: str, scope: str | None = None) -> TokenResponse:
    """Rotate ``refresh_token``. ``scope`` may narrow the new pair (RFC 6749 §6), never widen it."""
    store, now = ctx.store, ctx.clock()
    token_hash = hashing.digest(refresh_token)
    old = await store.get_token(token_hash)
    # Bound to its client (RFC 6749 §6): another client's token is simply unknown here.
    if old is None or old.token_type != REFRESH or old.client_id != client.client_id:
        raise InvalidGrant("Unknown refresh token")
    if old.revoked_at is not None:
        raise InvalidGrant("The refresh token is revoked")
    if old.rotated_at is not None:
        return await _rotated_presented(ctx, client, old, now)
    if old.expires_at <= now:
        raise InvalidGrant("The refresh token has expired")
    grant = await store.get_grant(old.grant_id)
    if grant is None or not grant.stands_behind(old.generation):
        raise InvalidGrant("The authorization was revoked")
    granted = _narrowed(old.scopes, scope)
    pair = _mint(ctx, client, grant, granted, parent_hash=token_hash, now=now)
    await store.add_tokens(pair.records)
    if await store.rotate_refresh_token(token_hash, client.client_id, now) is None:
        # Lost the race to a concurrent rotation or revocation: this pair is void.
        await _revoke_pair(ctx, pair)
        current = await store.get_token(token_hash)
        if current is not None and current.rotated_at is not None and current.revoked_at is None:
            return await _rotated_presented(ctx, client, current, now)
        raise InvalidGrant("The refresh token is no longer valid")
    await _sweep_if_grant_revoked(ctx, grant, pair)
    _audit("token_refreshed", "success", client.client_id, old.subject)
    ctx.metrics.tokens_issued.labels("refresh_token").inc()
    return _response(ctx, pair, granted)


def _narrowed(held: list[str], scope: str | None) -> list[str]:
    """The scopes a refresh asks for: all it holds when omitted, else a subset of them."""
    try:
        asked = scopes.parse(scope)
    except ValueError as exc:
        raise InvalidScope(str(exc)) from None
    if asked is None:
        return list(held)
    beyond = [item for item in asked if item not in held]
    if beyond:
        raise InvalidScope("A refresh cannot widen the scope: " + " ".join(beyond))
    return asked


async def _rotated_presented(ctx: OAuthContext, client: Client, rotated: Token, now: datetime) -> TokenResponse:
    """A rotated-out refresh token came back: a retry within the grace period, or reuse."""
    granted = await _grace_retry(ctx, client, rotated, now)
    if granted is not None:
        return granted
    grant = await ctx.store.get_grant(rotated.grant_id)
    revoked = await revoke_grant(ctx, grant, "refresh_reuse") if grant is not None else 0
    _audit("refresh_reuse", "grant_revoked", client.client_id, rotated.subject, tokens_revoked=revoked)
    ctx.metrics.refresh_reuse.inc()
    raise InvalidGrant("The refresh token was already used")


async def _grace_retry(ctx: OAuthContext, client: Client, rotated: Token, now: datetime) -> TokenResponse | None:
    """``tokens.refresh_grace_seconds``: a client whose refresh response was lost may present
    the token it rotated out most recently once more, within the grace period.

    It gets a fresh pair, and the pair that rotation issued (which it never received) is
    revoked, so one live chain remains. The rotation's refresh token is claimed with the
    same atomic step as a rotation: if it was used meanwhile, the claim fails and the
    presentation is reuse. An older generation, or a retry after the grace, is reuse.
    """
    grace = ctx.tokens.refresh_grace_seconds
    if grace <= 0 or rotated.rotated_at is None or now - rotated.rotated_at > timedelta(seconds=grace):
        return None
    store = ctx.store
    child = await store.find_child_refresh(rotated.token_hash)
    if child is None or child.revoked_at is not None or child.rotated_at is not None:
        return None
    grant = await store.get_grant(rotated.grant_id)
    if grant is None or not grant.stands_behind(rotated.generation):
        return None
    pair = _mint(ctx, client, grant, rotated.scopes, parent_hash=rotated.token_hash, now=now)
    await store.add_tokens(pair.records)
    if await store.rotate_refresh_token(child.token_hash, client.client_id, now) is None:
        await _revoke_pair(ctx, pair)
        return None
    # The lost pair (the child just claimed and its access token), and any earlier retry's.
    await store.revoke_children(rotated.token_hash, now, keep=[token.token_hash for token in pair.records])
    ctx.events.revoked()
    await _sweep_if_grant_revoked(ctx, grant, pair)
    _audit("token_refreshed", "success", client.client_id, rotated.subject, retry_within_grace=True)
    ctx.metrics.tokens_issued.labels("refresh_token").inc()
    return _response(ctx, pair, rotated.scopes)


# -- minting ----------------------------------------------------------------------------

def _mint(ctx: OAuthContext, client: Client, grant: Grant, granted: list[str], parent_hash: str | None,
          now: datetime) -> _Pair:
    tokens = ctx.tokens
    user_id, installation_id = grant.user_id, grant.installation_id
    refresh_ttl = tokens.installation_refresh_ttl if installation_id is not None else tokens.refresh_ttl
    access, refresh_token = hashing.new_secret(), hashing.new_secret()

    def token(secret: str, token_type: str, ttl: int) -> Token:
        return Token(token_hash=hashing.digest(secret), token_type=token_type, client_id=client.client_id,
                     grant_id=grant.grant_id, scopes=list(granted), issued_at=now,
                     expires_at=now + timedelta(seconds=ttl), user_id=user_id, installation_id=installation_id,
                     parent_hash=parent_hash, generation=grant.generation)

    return _Pair(access, refresh_token, [token(access, ACCESS, tokens.access_ttl),
                                         token(refresh_token, REFRESH, refresh_ttl)])


async def _revoke_pair(ctx: OAuthContext, pair: _Pair) -> None:
    now = ctx.clock()
    for token in pair.records:
        await ctx.store.revoke_token(token.token_hash, now)


async def _sweep_if_grant_revoked(ctx: OAuthContext, grant: Grant, pair: _Pair) -> None:
    """A revocation of the grant that raced this minting either swept the new pair or is
    seen here (the grant is marked before its tokens are swept)."""
    current = await ctx.store.get_grant(grant.grant_id)
    if current is None or not current.stands_behind(grant.generation):
        await _revoke_pair(ctx, pair)


def _response(ctx: OAuthContext, pair: _Pair, granted: list[str]) -> TokenResponse:
    return TokenResponse(pair.access, pair.refresh, ctx.tokens.access_ttl, scopes.render(granted))


async def revoke_grant(ctx: OAuthContext, grant: Grant, reason: str) -> int:
    """Revoke a grant and every token of it, and tell open sockets. ``reason`` labels the
    count in ``tokensvc_tokens_revoked_total``."""
    count = await ctx.store.revoke_grant(grant.grant_id, ctx.clock())
    ctx.metrics.tokens_revoked.labels(reason).inc(count)
    ctx.events.revoked()
    return count
