"""Who may act as an administrator with a bearer token: an admin user whose access token
carries the ``admin`` scope. One rule for every door that opens to it (introspection by
bearer, the admin API)."""

from __future__ import annotations

from tokensvc.oauth import scopes
from tokensvc.oauth.errors import AccessDenied, InsufficientScope
from tokensvc.oauth.privileges import Authority
from tokensvc.records import User


def require_admin(authority: Authority, refusal: str) -> User:
    """The admin user a token acts for (``authority``: its scopes in force now, and its user
    as the store holds them now): AccessDenied (``refusal``) for a node installation or a user
    who is not an admin, InsufficientScope without the ``admin`` scope."""
    user = authority.user
    if user is None or not user.admin:
        raise AccessDenied(refusal)
    if not scopes.satisfies(authority.token.scopes, scopes.ADMIN):
        raise InsufficientScope(scopes.ADMIN)
    return user
