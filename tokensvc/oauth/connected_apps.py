"""A user's connected apps: the clients that hold an active grant of theirs.

Read by ``GET /v1/me/connected-apps`` and the account page; withdrawn by
:func:`tokensvc.oauth.revocation.revoke_connected_app`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tokensvc.oauth.context import OAuthContext
from tokensvc.records import Subject


@dataclass(slots=True)
class ConnectedApp:
    client_id: str
    name: str
    logo_url: str | None
    scopes: list[str]
    granted_at: datetime


async def list_connected(ctx: OAuthContext, subject: Subject) -> list[ConnectedApp]:
    """The subject's active grants joined with their clients (one query for each side);
    a grant whose client was removed is left out."""
    grants = await ctx.store.list_grants(subject)
    if not grants:
        return []
    clients = {client.client_id: client for client in await ctx.store.list_clients()}
    return [ConnectedApp(client.client_id, client.name, client.logo_url, grant.scopes, grant.created_at)
            for grant in grants if (client := clients.get(grant.client_id)) is not None]
