"""Bearer tokens (RFC 6750): the token a request presents, whether it is live (its record
stands: :func:`live`, what revocation acts on), and whether it is in force: live, with a scope
in force now (:func:`in_force`, :mod:`tokensvc.oauth.privileges`)."""

from __future__ import annotations

import hmac
import logging
from datetime import datetime

from tokensvc.oauth import audience, hashing, privileges, successors, tokens
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.privileges import Authority
from tokensvc.records import Family, Grant, Token
from tokensvc.storage.base import Standing
from tokensvc.telemetry import logs

NOTHING = Standing(None)


def from_authorization(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (RFC 6750 §2.1), or None."""
    if not header or header[:7].lower() != "bearer ":
        return None
    token = header[7:].strip()
    return token or None


MAX_TOKEN_LENGTH = 512  # ours are 43, 66 or 86 characters; anything far longer is not worth a digest


async def in_force(ctx: OAuthContext, token: str | None) -> Authority | None:
    """The presented token, if it is in force: live (:func:`live`) with a scope still in force
    (:func:`privileges.authority`). None for anything else. One store round trip: the token's
    family read with its grant, its client and its user (:class:`Standing`); and for an access
    token's first presentation within the grace period or the window of concurrent
    presentations one more write: from then on its pair is no longer a lost reply's
    (:meth:`Family.replaceable`), nor given again. A rotated-out access token may cost one write
    too (:func:`_second_holder`)."""
    found, standing = await _live(ctx, token, holders=True)
    return None if found is None else await _authority(ctx, found, standing)


async def live(ctx: OAuthContext, token: str | None) -> Token | None:
    """The presented token's record, if it still stands, whatever is in force now: the current
    access or refresh token of an unrevoked family whose grant still stands behind it,
    unexpired (and, for an access token, not revoked alone). What a revocation finds: a token
    whose every scope is out of force (its client narrowed) can still be given up. Its family
    and grant are read, nothing else."""
    return (await _live(ctx, token, holders=False))[0]


async def _live(ctx: OAuthContext, token: str | None, *, holders: bool) -> tuple[Token | None, Standing]:
    """The token's record if it stands, and what the store read with it: with ``holders``, its
    client and user too (:meth:`~tokensvc.storage.base.RegistryAndAuthorizations.family_standing`)."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        return None, NOTHING
    if tokens.is_refresh_format(token):
        parsed = tokens.parse_refresh(token)
        if parsed is None:
            return None, NOTHING
        standing = (await ctx.store.family_standing(parsed[0]) if holders
                    else Standing(*await ctx.store.get_family(parsed[0])))
        family = standing.family
        if family is None:
            return None, standing
        if not hmac.compare_digest(parsed[1], family.refresh_hash):
            if family.previous_hash is not None and hmac.compare_digest(parsed[1], family.previous_hash):
                await _second_holder(ctx, family, family.expires_at)
            return None, standing
        return _standing(ctx, family, standing.grant, family.refresh()), standing
    return await _access(ctx, token, holders=holders)


async def _authority(ctx: OAuthContext, token: Token, standing: Standing) -> Authority | None:
    return await privileges.authority(ctx, token, holders=privileges.Holders(standing.client, standing.user))


async def family_member(ctx: OAuthContext, token: str) -> Token | None:
    """A refresh token of a family, current or rotated out (it carries the family's secret),
    as the family's current refresh token; None when no family has it."""
    parsed = tokens.parse_refresh(token)
    if parsed is None:
        return None
    family, _ = await ctx.store.get_family(parsed[0])
    return None if family is None else family.refresh()


async def active_access_token(ctx: OAuthContext, token: str | None) -> Authority | None:
    """The presented access token if it is in force at tokensvc's own API (the ``/v1`` API, the
    admin API, an administrator's introspection), else None: refresh tokens authorize no
    request, and a token bound to other APIs only (RFC 8707) none here."""
    if not token or len(token) > MAX_TOKEN_LENGTH or tokens.is_refresh_format(token):
        return None
    found, standing = await _access(ctx, token, holders=True)
    if found is None or not audience.for_tokensvc(ctx, found):
        return None
    return await _authority(ctx, found, standing)


async def _access(ctx: OAuthContext, token: str, *, holders: bool) -> tuple[Token | None, Standing]:
    """The access token's record if it stands, found by its hash and the family ids its routing
    part names (its family's shard key; none for a token of the old shape, found by its hash
    alone)."""
    access_hash = hashing.digest(token)
    family_ids = tokens.routes(ctx.successors.every, token)
    standing = (await ctx.store.access_standing(access_hash, family_ids) if holders
                else Standing(*await ctx.store.find_access(access_hash, family_ids)))
    family, grant = standing.family, standing.grant
    if family is None:
        return None, standing
    now = ctx.clock()
    if not hmac.compare_digest(family.access_hash, access_hash):
        await _second_holder(ctx, family, family.previous_access_expires_at)
        return None, standing
    if family.access_revoked_at is not None:
        return None, standing
    found = _standing(ctx, family, grant, family.access())
    # The first use of a pair ends both the grace of a lost reply and the window in which its
    # predecessor's presentations get it again; once both have passed, nothing reads the mark.
    if found is not None and (family.replaceable(ctx.tokens.refresh_grace_seconds, now)
                              or successors.concurrent(family.issued_at, now)):
        await ctx.store.mark_access_used(family.family_id, access_hash, now)
    return found, standing


async def _second_holder(ctx: OAuthContext, family: Family, in_force_until: datetime | None) -> None:
    """A token of the pair the family's last rotation replaced (its access token, or its refresh
    token anywhere but at the refresh endpoint), presented while it would still be in force
    (until ``in_force_until``): whoever presents it did not get the pair that replaced it, so
    someone else rotated it (a thief, then the client whose access token that killed; or a tab
    the other one left behind). From then no presentation of a rotated-out refresh token of the
    family gets a successor again (the grace rules decide), so the client's next refresh
    reveals a thief's rotation instead of receiving its pair. The token authorizes nothing."""
    now = ctx.clock()
    if (family.second_holder_at is None and family.revoked_at is None
            and in_force_until is not None and in_force_until > now
            and await ctx.store.mark_second_holder(family.family_id, now)):
        logs.audit("second_holder", {"client_id": family.client_id, "subject": family.subject.id,
                                     "subject_type": family.subject.kind, "outcome": "window_closed"},
                   logging.INFO, "a token of a rotated-out pair presented")


def _standing(ctx: OAuthContext, family: Family, grant: Grant | None, token: Token) -> Token | None:
    return token if family.stands(grant) and token.expires_at > ctx.clock() else None
