"""Revocation: RFC 7009 for clients, and the grant-wide revocation of ``/oauth/revoke``.

Revoking an access token revokes that token. Revoking a refresh token also revokes the
access tokens of its grant (RFC 7009 §2.1) and any refresh token that descends from it by
rotation, so that no chain outlives the token its holder revoked.
"""

from __future__ import annotations

from tokensvc import logs
from tokensvc.oauth import bearer, clientauth
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.grants import revoke_grant
from tokensvc.records import ACCESS, REFRESH, Client, Subject


async def revoke_for_client(ctx: OAuthContext, caller: ClientRequest, token: str) -> bool:
    """``POST /oauth/token/revoke``: authenticate the client, then revoke its token."""
    client = await clientauth.authenticate_request(ctx, caller)
    return await revoke_token(ctx, token, client)


async def revoke_token(ctx: OAuthContext, token: str, client: Client | None) -> bool:
    """Revoke ``token`` when it exists and (if ``client`` is given) was issued to that client.

    Unknown, foreign and already revoked tokens are a silent no-op (RFC 7009 §2.2).
    """
    record = await bearer.lookup(ctx, token)
    if record is None or (client is not None and record.client_id != client.client_id):
        return False
    store, now = ctx.store, ctx.clock()
    revoked = await store.revoke_token(record.token_hash, now)
    count = int(revoked)
    if record.token_type == REFRESH:
        count += await store.revoke_grant_tokens(record.grant_id, now, token_type=ACCESS)
        # Every descendant, not one line of them: a grace retry gives a token two children.
        parents = [record.token_hash]
        while parents:
            parent = parents.pop()
            count += await store.revoke_children(parent, now)
            parents += [child.token_hash for child in await store.list_children(parent) if child.token_type == REFRESH]
    ctx.metrics.tokens_revoked.labels("client").inc(count)
    ctx.events.revoked()
    logs.audit("token_revoked", {
        "client_id": record.client_id, "subject": record.subject.id, "token_type": record.token_type,
        "outcome": "revoked" if revoked else "already_revoked"})
    return revoked


async def revoke_grant_of(ctx: OAuthContext, token: str | None) -> bool:
    """Revoke the whole grant ``token`` belongs to (``POST /oauth/revoke``)."""
    record = await bearer.lookup(ctx, token)
    if record is None:
        return False
    grant = await ctx.store.get_grant(record.grant_id)
    if grant is None:
        await ctx.store.revoke_token(record.token_hash, ctx.clock())
        ctx.events.revoked()
        return True
    count = await revoke_grant(ctx, grant, "grant")
    logs.audit("grant_revoked", {
        "client_id": record.client_id, "subject": record.subject.id, "tokens_revoked": count, "outcome": "revoked"})
    return True


async def revoke_connected_app(ctx: OAuthContext, subject: Subject, client_id: str) -> bool:
    """A user withdraws a client's access: its grant and every token of it. False when there
    is no active grant (``DELETE /v1/me/connected-apps/{client_id}``)."""
    grant = await ctx.store.find_grant(client_id, subject)
    if grant is None or grant.revoked_at is not None:
        return False
    count = await revoke_grant(ctx, grant, "user")
    logs.audit("grant_revoked", {
        "client_id": client_id, "subject": subject.id, "tokens_revoked": count, "outcome": "revoked_by_user"},
        message="connected app removed")
    return True
