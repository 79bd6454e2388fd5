"""Who a public-API request acts as: the subject behind a bearer token or a web session.

A bearer token acts for its user or its node installation with the token's scopes; a web
session acts for its user with ``read write``. The two kinds of subject are never mixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokensvc.oauth import bearer, scopes, sessions
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import InsufficientScope
from tokensvc.records import Session, Subject, Token

SESSION_SCOPES = ("read", "write")


@dataclass(slots=True)
class Principal:
    subject: Subject
    scopes: list[str]
    client_id: str | None = None
    token: Token | None = None  # bearer-authenticated
    session: Session | None = None  # cookie-authenticated

    @property
    def via_cookie(self) -> bool:
        return self.session is not None

    def require(self, scope: str) -> None:
        """InsufficientScope (403) unless the principal's scopes satisfy ``scope``."""
        if not scopes.satisfies(self.scopes, scope):
            raise InsufficientScope(scope)


async def from_bearer(ctx: OAuthContext, token: str | None) -> Principal | None:
    record = await bearer.active_access_token(ctx, token)
    if record is None:
        return None
    return Principal(record.subject, list(record.scopes), record.client_id, token=record)


async def from_session(ctx: OAuthContext, session_id: str | None) -> Principal | None:
    found = await sessions.resolve(ctx, session_id)
    if found is None:
        return None
    session, user = found
    return Principal(Subject(user_id=user.user_id), list(SESSION_SCOPES), session=session)


async def describe(ctx: OAuthContext, principal: Principal) -> dict:
    """Who ``principal`` acts for: the ``/v1/me`` body, and the WebSocket's welcome."""
    subject = principal.subject
    body = {"subjectType": subject.kind, "id": subject.id, "clientId": principal.client_id,
            "scopes": principal.scopes}
    if subject.user_id is not None:
        user = await ctx.store.get_user(subject.user_id)
        body["username"] = user.username if user else None
    else:
        installation = await ctx.store.get_installation(subject.id)
        body["name"] = installation.name if installation else subject.id
    return body


async def still_valid(ctx: OAuthContext, principal: Principal) -> bool:
    """Re-check the credential behind a long-lived connection (a WebSocket)."""
    now = ctx.clock()
    if principal.token is not None:
        current, grant = await ctx.store.get_token_and_grant(principal.token.token_hash)
        return current is not None and current.in_force(grant, now)
    if principal.session is not None:
        current_session = await ctx.store.get_session(principal.session.session_hash)
        return current_session is not None and current_session.expires_at > now
    return False
