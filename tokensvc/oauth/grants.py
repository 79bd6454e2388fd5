"""The token endpoint's grants: authorization code with PKCE (RFC 6749 §4.1.3, RFC 7636
§4.5-4.6) and refresh-token rotation with reuse detection (RFC 6749 §6, RFC 9700 §4.14.2).

Every step that must happen once is one atomic store call (``consume_code``,
``rotate_refresh_token``). Tokens are minted, stored, and only then checked against their
grant: a revocation that raced the minting has either swept the new tokens or is seen
by that check, so no token outlives its grant.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from tokensvc.oauth import hashing, pkce, scopes
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import InvalidGrant
from tokensvc.records import ACCESS, REFRESH, Client, Grant, Subject, Token

log = logging.getLogger(__name__)
audit = logging.getLogger("tokensvc.audit")


@dataclass(slots=True)
class TokenResponse:
    access_token: str
    refresh_token: str
    expires_in: int
    scope: str
    token_type: str = "Bearer"
    subject: Subject | None = None


async def exchange_code(ctx: OAuthContext, client: Client, code: str, redirect_uri: str,
                        code_verifier: str | None) -> TokenResponse:
    store, now = ctx.store, ctx.clock()
    code_hash = hashing.digest(code)
    record = await store.consume_code(code_hash, now)
    if record is None:
        previous = await store.get_code(code_hash)
        if previous is not None:
            # RFC 6749 §4.1.2: a code used twice revokes what it was first exchanged for.
            grant = await store.find_grant(previous.client_id, previous.subject)
            revoked = await revoke_grant(ctx, grant) if grant is not None else 0
            audit.warning("authorization code reused; grant revoked", extra={"audit": {
                "event": "code_reuse", "client_id": previous.client_id, "subject": previous.subject.id,
                "tokens_revoked": revoked, "outcome": "grant_revoked"}})
            raise InvalidGrant("The authorization code was already used")
        raise InvalidGrant("Unknown authorization code")
    # The code is spent from here on, whatever the outcome: a wrong verifier cannot be retried.
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
    grant = await store.find_grant(client.client_id, record.subject)
    if grant is None or grant.revoked_at is not None:
        raise InvalidGrant("The authorization was revoked")
    response = await mint(ctx, client, grant, record.scopes, parent_hash=None)
    audit.info("token issued", extra={"audit": {
        "event": "token_issued", "client_id": client.client_id, "subject": record.subject.id,
        "subject_type": record.subject.kind, "grant": "authorization_code", "outcome": "success"}})
    return response


async def refresh(ctx: OAuthContext, client: Client, refresh_token: str) -> TokenResponse:
    store, now = ctx.store, ctx.clock()
    token_hash = hashing.digest(refresh_token)
    old = await store.rotate_refresh_token(token_hash, client.client_id, now)
    if old is None:
        current = await store.get_token(token_hash)
        # Bound to its client (RFC 6749 §6): another client's token is simply unknown here.
        if current is None or current.token_type != REFRESH or current.client_id != client.client_id:
            raise InvalidGrant("Unknown refresh token")
        if current.revoked_at is not None:
            raise InvalidGrant("The refresh token is revoked")
        if current.rotated_at is None:
            raise InvalidGrant("The refresh token has expired")
        granted = await _grace_retry(ctx, client, current, now)
        if granted is not None:
            return granted
        grant = await store.get_grant(current.grant_id)
        revoked = await revoke_grant(ctx, grant) if grant is not None else 0
        audit.warning("refresh token reused; grant revoked", extra={"audit": {
            "event": "refresh_reuse", "client_id": client.client_id, "subject": current.subject.id,
            "tokens_revoked": revoked, "outcome": "grant_revoked"}})
        raise InvalidGrant("The refresh token was already used")
    grant = await store.get_grant(old.grant_id)
    if grant is None or grant.revoked_at is not None:
        raise InvalidGrant("The authorization was revoked")
    response = await mint(ctx, client, grant, old.scopes, parent_hash=token_hash)
    audit.info("token refreshed", extra={"audit": {
        "event": "token_refreshed", "client_id": client.client_id, "subject": old.subject.id,
        "subject_type": old.subject.kind, "outcome": "success"}})
    return response


async def _grace_retry(ctx: OAuthContext, client: Client, rotated: Token, now) -> TokenResponse | None:
    """Hook for ``tokens.refresh_grace_seconds``; strict mode (0) never grants a retry."""
    return None


async def mint(ctx: OAuthContext, client: Client, grant: Grant, granted: list[str],
               parent_hash: str | None) -> TokenResponse:
    """Store a new access + refresh pair for ``grant`` and return the response carrying them."""
    now = ctx.clock()
    subject = grant.subject
    refresh_ttl = (ctx.tokens.installation_refresh_ttl if subject.installation_id is not None
                   else ctx.tokens.refresh_ttl)
    access, refresh_token = hashing.new_secret(), hashing.new_secret()
    common = dict(client_id=client.client_id, grant_id=grant.grant_id, scopes=list(granted), issued_at=now,
                  user_id=subject.user_id, installation_id=subject.installation_id, parent_hash=parent_hash)
    tokens = [
        Token(token_hash=hashing.digest(access), token_type=ACCESS,
              expires_at=now + timedelta(seconds=ctx.tokens.access_ttl), **common),
        Token(token_hash=hashing.digest(refresh_token), token_type=REFRESH,
              expires_at=now + timedelta(seconds=refresh_ttl), **common),
    ]
    await ctx.store.add_tokens(tokens)
    current = await ctx.store.get_grant(grant.grant_id)
    if current is None or current.revoked_at is not None:
        # The grant was revoked while we minted: these tokens go with it.
        for token in tokens:
            await ctx.store.revoke_token(token.token_hash, ctx.clock())
    return TokenResponse(access, refresh_token, ctx.tokens.access_ttl, scopes.render(granted), subject=subject)


async def revoke_grant(ctx: OAuthContext, grant: Grant) -> int:
    """Revoke a grant and every token of it, and tell open sockets."""
    count = await ctx.store.revoke_grant(grant.grant_id, ctx.clock())
    ctx.events.revoked()
    return count
