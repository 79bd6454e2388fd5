"""A user's connected apps and paired installations: what the account page and
``GET /v1/me/connected-apps`` show, and what a user may withdraw (an installation is paired
while its node software holds a live grant).

An app's scopes are what is in force: those of its grant (the latest consent) and every scope a
live token of it still carries (an earlier, broader consent's refresh token keeps its scopes
until it is revoked or expires), so a narrower consent never hides what an older token can do;
and of those, only what the privileges rule leaves in force now (:mod:`.privileges`: the
client's current ``allowed_scopes``, ``admin`` for an administrator alone).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

from tokensvc.oauth import privileges
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import AccessDenied
from tokensvc.oauth.revocation import revoke_grant
from tokensvc.records import Installation, Subject, User
from tokensvc.telemetry import logs


@dataclass(slots=True)
class ConnectedApp:
    client_id: str
    name: str
    logo_url: str | None
    scopes: list[str]
    granted_at: datetime


async def list_connected(ctx: OAuthContext, subject: Subject) -> list[ConnectedApp]:
    """The subject's active grants joined with their clients, each with the scopes in force; a
    grant whose client was removed is left out."""
    grants = await ctx.store.list_grants(subject)
    if not grants:
        return []
    # The grants' own clients, not the whole registry.
    wanted = sorted({grant.client_id for grant in grants})
    clients = dict(zip(wanted, await asyncio.gather(*(ctx.store.get_client(client_id) for client_id in wanted)),
                       strict=True))
    now = ctx.clock()
    apps = []
    for grant in grants:
        client = clients.get(grant.client_id)
        if client is None:
            continue
        in_force = dict.fromkeys(grant.scopes)
        for family in await ctx.store.list_families(grant.grant_id):
            if family.stands(grant) and family.expires_at > now:
                in_force.update(dict.fromkeys(family.scopes))
        now_in_force = await privileges.in_force(ctx, client.client_id, subject, list(in_force), client)
        apps.append(ConnectedApp(client.client_id, client.name, client.logo_url, now_in_force.scopes,
                                 grant.created_at))
    return apps


def operates(user: User, installation: Installation) -> bool:
    """Whether ``user`` may pair and unpair ``installation``: an operator of it, or an admin."""
    return user.admin or user.user_id in installation.operators


async def paired_installations(ctx: OAuthContext, user: User) -> list[Installation]:
    """The installations of the account page: those the user operates (every one for an
    admin) that are paired, their node software holding a live grant. One never paired, or
    unpaired since, is not there."""
    operated = [inst for inst in await ctx.store.list_installations() if operates(user, inst)]
    grants = await asyncio.gather(*(ctx.store.list_grants(Subject(installation_id=inst.installation_id))
                                    for inst in operated))
    return [inst for inst, live in zip(operated, grants, strict=True) if live]


async def unpair(ctx: OAuthContext, user: User, installation_id: str) -> int:
    """Revoke every grant (and token) of an installation the user operates (or any, for an
    admin): the node software must be paired again. The families revoked; AccessDenied for an
    installation the user may not unpair."""
    installation = await ctx.store.get_installation(installation_id) if len(installation_id) <= 128 else None
    if installation is None or not operates(user, installation):
        raise AccessDenied("You may not unpair this installation")
    revoked = 0
    for grant in await ctx.store.list_grants(Subject(installation_id=installation_id)):
        revoked += await revoke_grant(ctx, grant.grant_id, "user")
    logs.audit("installation_unpaired", {"subject": installation_id, "by": user.user_id, "families_revoked": revoked,
                                         "outcome": "revoked"}, message="installation unpaired")
    return revoked
