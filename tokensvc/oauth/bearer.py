"""Bearer tokens (RFC 6750): finding the active access token a request presents."""

from __future__ import annotations

from tokensvc.oauth import hashing
from tokensvc.oauth.context import OAuthContext
from tokensvc.records import ACCESS, Token


def from_authorization(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (RFC 6750 §2.1), or None."""
    if not header or header[:7].lower() != "bearer ":
        return None
    token = header[7:].strip()
    return token or None


MAX_TOKEN_LENGTH = 512  # ours are 43 characters; anything far longer is not worth a digest


async def lookup(ctx: OAuthContext, token: str | None) -> Token | None:
    """The stored record of a presented token (any kind, any state), or None."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    return await ctx.store.get_token(hashing.digest(token))


async def in_force(ctx: OAuthContext, token: str | None) -> Token | None:
    """The stored record of a presented token if it is in force (active, and its grant
    still stands behind it: :meth:`Token.in_force`), else None. One store round trip."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    record, grant = await ctx.store.get_token_and_grant(hashing.digest(token))
    if record is None or not record.in_force(grant, ctx.clock()):
        return None
    return record


async def active_access_token(ctx: OAuthContext, token: str | None) -> Token | None:
    """The stored access token if it is in force, else None."""
    record = await in_force(ctx, token)
    if record is None or record.token_type != ACCESS:
        return None
    return record
