"""Bearer tokens (RFC 6750): the token a request presents, whether it is live (its record
stands: :func:`live`, what revocation acts on), and whether it is in force: live, with a scope
in force now (:func:`in_force`, :mod:`tokensvc.oauth.privileges`)."""

from __future__ import annotations

import hmac

from tokensvc.oauth import hashing, privileges, tokens
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.privileges import Authority
from tokensvc.oauth.successors import CONCURRENT_SECONDS
from tokensvc.records import Family, Grant, Token


def from_authorization(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (RFC 6750 §2.1), or None."""
    if not header or header[:7].lower() != "bearer ":
        return None
    token = header[7:].strip()
    return token or None


MAX_TOKEN_LENGTH = 512  # ours are 43 or 66 characters; anything far longer is not worth a digest


async def in_force(ctx: OAuthContext, token: str | None) -> Authority | None:
    """The presented token, if it is in force: live (:func:`live`) with a scope still in force
    (:func:`privileges.authority`). None for anything else. One store round trip for the token,
    one each for its client and its user, and for an access token's first presentation within
    the grace period one more write: from then on its pair is no longer a lost reply's
    (:meth:`Family.replaceable`)."""
    found = await live(ctx, token)
    return None if found is None else await privileges.authority(ctx, found)


async def live(ctx: OAuthContext, token: str | None) -> Token | None:
    """The presented token's record, if it still stands, whatever is in force now: the current
    access or refresh token of an unrevoked family whose grant still stands behind it,
    unexpired (and, for an access token, not revoked alone). What a revocation finds: a token
    whose every scope is out of force (its client narrowed) can still be given up."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    if tokens.is_refresh_format(token):
        parsed = tokens.parse_refresh(token)
        if parsed is None:
            return None
        family, grant = await ctx.store.get_family(parsed[0])
        if family is None or not hmac.compare_digest(parsed[1], family.refresh_hash):
            return None
        return _standing(ctx, family, grant, family.refresh())
    return await _access(ctx, hashing.digest(token))


async def family_member(ctx: OAuthContext, token: str) -> Token | None:
    """A refresh token of a family, current or rotated out (it carries the family's secret),
    as the family's current refresh token; None when no family has it."""
    parsed = tokens.parse_refresh(token)
    if parsed is None:
        return None
    family, _ = await ctx.store.get_family(parsed[0])
    return None if family is None else family.refresh()


async def active_access_token(ctx: OAuthContext, token: str | None) -> Authority | None:
    """The presented access token if it is in force, else None (refresh tokens authorize no request)."""
    if not token or len(token) > MAX_TOKEN_LENGTH or tokens.is_refresh_format(token):
        return None
    found = await _access(ctx, hashing.digest(token))
    return None if found is None else await privileges.authority(ctx, found)


async def _access(ctx: OAuthContext, access_hash: str) -> Token | None:
    family, grant = await ctx.store.find_access(access_hash)
    if family is None or family.access_revoked_at is not None:
        return None
    found = _standing(ctx, family, grant, family.access())
    # The first use of a pair ends both the grace of a lost reply and the window in which its
    # predecessor's presentations get it again; once both have passed, nothing reads the mark.
    window = max(ctx.tokens.refresh_grace_seconds, CONCURRENT_SECONDS)
    if found is not None and family.replaceable(window, ctx.clock()):
        await ctx.store.mark_access_used(family.family_id, access_hash, ctx.clock())
    return found


def _standing(ctx: OAuthContext, family: Family, grant: Grant | None, token: Token) -> Token | None:
    return token if family.stands(grant) and token.expires_at > ctx.clock() else None
