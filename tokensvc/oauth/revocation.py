"""Revocation: RFC 7009 for clients, the grant-wide revocation of ``/oauth/revoke``, a user
withdrawing an app, and the primitives every revoking path shares.

A revocation finds a token by its record: a live one (not expired, revoked, rotated out, nor
from an earlier generation of its grant; :func:`bearer.live`) is revoked whatever is in force
now, so a token whose every scope its client no longer lists is given up all the same (and
stays dead when the client is widened again). A token that is not live revokes nothing at
``/oauth/revoke`` and ``/oauth/sign-out`` (they still answer 200). At ``/oauth/token/revoke``
(RFC 7009) the client revokes only its own tokens: a live access token, alone; or any refresh
token of one of its families, current or rotated out, with its family (§2.1: the tokens of the
same authorization). So a revocation that races the client's own refresh takes the new pair
too, and no chain outlives it.

Every revocation that changed something is announced, naming what it changed
(:mod:`tokensvc.oauth.events`), so that the WebSockets standing on it re-check; one that
changed nothing announces nothing. Each carries the audience of the tokens it may touch (RFC
8707), in its announcement and in its marks: a family's own, as the revoking call read it; a
grant's, a client's or a user's, their families' together, read on the revocation's write path
(:meth:`~tokensvc.storage.base.Authorizations.families_audience`). The revocation feed tells it
to the resource servers those tokens may be meant for alone (:mod:`tokensvc.oauth.feed`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

from tokensvc.oauth import bearer, clientauth, privileges, tokens
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.context import OAuthContext
from tokensvc.records import ACCESS, DEFAULT_SCOPES, READER_FIELDS, Client, Subject
from tokensvc.storage.base import (
    CLIENT,
    CLIENT_MARKS,
    CREDENTIALS,
    FAMILY,
    GRANT,
    MARK_AUDIENCE,
    Authorizations,
    RegistryAndAuthorizations,
    Revocation,
    union,
)
from tokensvc.telemetry import logs

R = TypeVar("R")
Clock = Callable[[], datetime]  # the time of each write, read as it is made

# -- the primitives ---------------------------------------------------------------------

async def revoke_grant(ctx: OAuthContext, grant_id: str, reason: str) -> int:
    """Revoke a grant and every family of it; the number of families revoked. ``reason``
    labels the count in ``tokensvc_token_families_revoked_total``.

    The grant is marked first: from then on none of its tokens is in force, so a sweep that
    fails half-way leaves nothing usable. A family a code's exchange writes concurrently,
    after the sweep, is never in force either: every use reads the grant with the family
    (:meth:`~tokensvc.records.Family.stands`).
    """
    ended = await end_grant(ctx.store, grant_id, ctx.clock)
    if ended.marked or ended.count:
        ctx.metrics.revoked_families(reason, ended.count)
        ctx.events.publish(ended.revocation)
    return ended.count


@dataclass(slots=True, frozen=True)
class Ended:
    """What :func:`end_grant` did: whether the grant was live, the families it revoked, and the
    announcement of it (with the audience of the grant's families)."""

    marked: bool
    count: int
    revocation: Revocation


async def end_grant(store: Authorizations, grant_id: str, clock: Clock) -> Ended:
    """The store's part of revoking a grant: marked first, then its families swept, each write
    stamped with the time ``clock`` says as it is made (a polling relay reads the stamps back
    an operation's budget, not two), and carrying the audience of the grant's families. That
    audience is read before the mark, for the mark, and again after it, for the sweep and the
    announcement: a family an exchange wrote in between stood until the mark, and its audience
    is in the second read (none written after the mark ever stands). (Other processes hear of
    it from the store's feed.)"""
    before = await store.families_audience(grant_id=grant_id, now=clock())
    marked = await store.mark_grant_revoked(grant_id, clock(), before)
    after = union(before, await store.families_audience(grant_id=grant_id, now=clock()))
    swept = await store.revoke_grant_families(grant_id, clock())
    return Ended(marked, swept, Revocation(GRANT, grant_id, after))


async def end_chains_before_promotion(store: RegistryAndAuthorizations, user_id: str,
                                      clock: Clock) -> dict[str, Ended]:
    """Before a user is made an administrator (again): revoke every live grant of theirs that
    may carry ``admin`` (:func:`privileges.may_carry_admin`), so that no chain from before,
    nor a code on its way, ever holds ``admin`` in force. The grants revoked, with what each
    ended (:class:`Ended`). Done before the promotion is written: a failure leaves the user as
    they were, and the promotion, tried again, ends them then. Each write stamped as it is made
    (``clock``): there may be many."""
    ended = {}
    for grant in await store.list_grants(Subject(user_id=user_id)):
        if await privileges.may_carry_admin(store, grant):
            grant_ended = await end_grant(store, grant.grant_id, clock)
            if grant_ended.marked or grant_ended.count:
                ended[grant.grant_id] = grant_ended
    return ended


async def client_change(store: RegistryAndAuthorizations, before: Client, fields: Mapping[str, Any], clock: Clock,
                        write: Callable[[dict[str, Any]], Awaitable[R]]) -> tuple[R, list[Revocation]]:
    """Write a change of the client ``before`` that sets ``fields`` (``write(marks)``: with the
    marks to record in the same write, which every process's relay hears), and what it
    announces (for the caller to publish in this process):

    - a narrowing of its allowed_scopes withdraws some of what its tokens may do: marked
      ``narrowed_at``, announced under the client (:data:`CLIENT`: its tokens' sockets check
      again, and the revocation feed names the client to resource servers);
    - a change of what its feed readers proved (:data:`READER_FIELDS`: its secret, kind or
      first-party flag) withdraws nothing from its tokens: marked ``credentials_changed_at``,
      announced as :data:`CREDENTIALS` (its feed readers check their credentials again; the feed
      does not name it, so no resource server drops an answer for it).

    A narrowing holds at once at every use (:mod:`privileges`); here it is also withdrawn from
    what the client's grants, codes and families hold (:meth:`Store.withdraw_scopes`), so that
    a later widening gives the tokens issued before nothing back. Withdrawn before the write (a
    failure leaves the client as it was, and the change tried again withdraws then) and again
    after it, for what was issued in between; a failure of that second pass leaves only that
    moment's tokens to the check at use. The marks carry the time ``clock`` says once the first
    withdrawal is done (a sweep of a large client's tokens takes a while), as they are written."""
    allowed_scopes = fields.get("allowed_scopes", before.allowed_scopes)
    kept = list(DEFAULT_SCOPES) if allowed_scopes is None else allowed_scopes
    narrowed = any(scope not in kept for scope in before.scopes)
    credentials = any(name in fields and fields[name] != getattr(before, name) for name in READER_FIELDS)
    # What a narrowing may touch: its families' audiences, read before the write that marks it
    # (and again after it: marked_again).
    audience = await store.families_audience(client_id=before.client_id, now=clock()) if narrowed else None
    announced = [Revocation(kind, before.client_id, union(audience) if kind == CLIENT else None)
                 for kind, marked in ((CLIENT, narrowed), (CREDENTIALS, credentials)) if marked]
    if narrowed:
        await store.withdraw_scopes(before.client_id, kept)
    written = await write(client_marks(announced, clock()))
    if narrowed:
        await store.withdraw_scopes(before.client_id, kept)
        heard = await marked_again(audience, store.families_audience(client_id=before.client_id, now=clock()),
                                   lambda together: store.update_client(
                                       before.client_id, {CLIENT_MARKS[CLIENT]: clock(), MARK_AUDIENCE: together}))
        announced = [replace(revocation, audience=heard) if revocation.kind == CLIENT else revocation
                     for revocation in announced]
    return written, announced


async def marked_again(audience: list[str] | None, read_again: Awaitable[list[str] | None],
                       mark: Callable[[list[str] | None], Awaitable[Any]]) -> tuple[str, ...] | None:
    """What a client's or a user's mark, written with ``audience`` (its families', read before
    it), touches: that and what ``read_again`` reads after the mark, together. A family that an
    exchange wrote in between stood until the mark; when its audience is not in the mark's, the
    mark is written again with both (``mark``: a new mark, which every relay hears), so that a
    resource server its tokens were meant for hears it too. Rare: it takes a code exchanged in
    the moment between the read and the mark."""
    together = union(audience, await read_again)
    if together != union(audience):
        await mark(_listed(together))
    return together


def client_marks(announced: Iterable[Revocation], now: datetime) -> dict[str, Any]:
    """The client's fields that carry ``announced`` (:data:`CLIENT_MARKS`) to every process, set
    to ``now``, with the audience of its narrowing (:data:`MARK_AUDIENCE`, when it narrows)."""
    marks: dict[str, Any] = {}
    for revocation in announced:
        marks[CLIENT_MARKS[revocation.kind]] = now
        if revocation.kind == CLIENT:
            marks[MARK_AUDIENCE] = _listed(revocation.audience)
    return marks


async def revoke_family(ctx: OAuthContext, family_id: str, reason: str,
                        audience: list[str] | None = None) -> bool:
    """Revoke a family (its refresh and access token); True when it was unrevoked. ``audience``:
    the family's, where the caller read it (the feed tells it to those resource servers alone)."""
    if not await ctx.store.revoke_family(family_id, ctx.clock(), audience):
        return False
    ctx.metrics.revoked_families(reason)
    ctx.events.publish(Revocation(FAMILY, family_id, _audience(audience)))
    return True


def _audience(audience: list[str] | None) -> tuple[str, ...] | None:
    return None if audience is None else tuple(audience)


def _listed(audience: tuple[str, ...] | None) -> list[str] | None:
    return None if audience is None else list(audience)


# -- the endpoints ----------------------------------------------------------------------

async def revoke_for_client(ctx: OAuthContext, caller: ClientRequest, token: str) -> bool:
    """``POST /oauth/token/revoke``: authenticate the client, then revoke its token."""
    client = await clientauth.authenticate_grant_client(ctx, caller)
    return await revoke_token(ctx, token, client)


async def revoke_token(ctx: OAuthContext, token: str, client: Client | None) -> bool:
    """Revoke ``token``; with ``client`` (RFC 7009), only a token issued to that client, and a
    refresh token of its family whether current or rotated out; without (sign-out, an
    operator), only a live token, whatever is in force now. Anything else is a silent no-op
    (RFC 7009 §2.2)."""
    found = await bearer.live(ctx, token)
    if found is None and client is not None and tokens.is_refresh_format(token):
        found = await bearer.family_member(ctx, token)
    if found is None or (client is not None and found.client_id != client.client_id):
        return False
    if found.token_type == ACCESS:
        revoked = await ctx.store.revoke_access(found.family_id, found.token_hash, ctx.clock(), found.audience)
        if revoked:
            ctx.metrics.revoked_access_token()
            ctx.events.publish(Revocation(FAMILY, found.family_id, _audience(found.audience)))
    else:
        revoked = await revoke_family(ctx, found.family_id, "client", found.audience)
    logs.audit("token_revoked", {
        "client_id": found.client_id, "subject": found.subject.id, "token_type": found.token_type,
        "outcome": "revoked" if revoked else "already_revoked"})
    return revoked


async def revoke_grant_of(ctx: OAuthContext, token: str | None) -> bool:
    """Revoke the whole grant of ``token``, when it is live, whatever is in force now
    (``POST /oauth/revoke``)."""
    found = await bearer.live(ctx, token)
    if found is None:
        return False
    count = await revoke_grant(ctx, found.grant_id, "grant")
    logs.audit("grant_revoked", {
        "client_id": found.client_id, "subject": found.subject.id, "families_revoked": count, "outcome": "revoked"})
    return True


async def revoke_grants_of(ctx: OAuthContext, presented: list[str | None]) -> None:
    """``POST /oauth/revoke``: the whole grant of each presented token (the caller's bearer
    token, and ``token``) that is live."""
    for token in dict.fromkeys(token for token in presented if token):
        await revoke_grant_of(ctx, token)


async def revoke_connected_app(ctx: OAuthContext, subject: Subject, client_id: str) -> bool:
    """A user withdraws a client's access: its grant and every family of it. False when
    there is no active grant (``DELETE /v1/me/connected-apps/{client_id}``)."""
    grant = await ctx.store.find_grant(client_id, subject)
    if grant is None or grant.revoked_at is not None:
        return False
    count = await revoke_grant(ctx, grant.grant_id, "user")
    logs.audit("grant_revoked", {
        "client_id": client_id, "subject": subject.id, "families_revoked": count, "outcome": "revoked_by_user"},
        message="connected app removed")
    return True
