"""Who may act as an administrator with a bearer token: an admin user whose access token
carries the ``admin`` scope. One rule for every door that opens to it (introspection by
bearer, the admin API)."""

from __future__ import annotations

from tokensvc.oauth import scopes
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import AccessDenied, InsufficientScope
from tokensvc.records import Token, User


async def require_admin(ctx: OAuthContext, token: Token, refusal: str) -> User:
    """The admin user ``token`` acts for: AccessDenied (``refusal``) for a node installation or
    a user who is not an admin, InsufficientScope without the ``admin`` scope."""
    user = await ctx.store.get_user(token.user_id) if token.user_id is not None else None
    if user is None or not user.admin:
        raise AccessDenied(refusal)
    if not scopes.satisfies(token.scopes, scopes.ADMIN):
        raise InsufficientScope(scopes.ADMIN)
    return user
