"""Who a public-API request acts as: the subject behind a bearer token or a web session.

A bearer token acts for its user or its node installation with the token's scopes in force
now (:mod:`tokensvc.oauth.privileges`); a web session acts for its user with ``read write``.
The two kinds of subject are never mixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tokensvc.oauth import bearer, privileges, scopes, sessions
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import InsufficientScope
from tokensvc.records import Session, Subject, Token, User
from tokensvc.storage.base import CLIENT, FAMILY, GRANT, SESSION, USER, Revocation

SESSION_SCOPES = ("read", "write")


@dataclass(slots=True)
class Principal:
    subject: Subject
    scopes: list[str]
    client_id: str | None = None
    token: Token | None = None  # bearer-authenticated
    session: Session | None = None  # cookie-authenticated
    user: User | None = None  # the user it acts for, as read when it was authenticated
    first_party: bool = False  # the token's client is first-party (the service's own apps)

    @property
    def via_cookie(self) -> bool:
        return self.session is not None

    @property
    def expires_at(self) -> datetime:
        """When the token or the session it stands on expires."""
        stands_on = self.token or self.session
        assert stands_on is not None
        return stands_on.expires_at

    def require(self, scope: str) -> None:
        """InsufficientScope (403) unless the principal's scopes satisfy ``scope``."""
        if not scopes.satisfies(self.scopes, scope):
            raise InsufficientScope(scope)

    def require_own(self, scope: str) -> None:
        """For what the user sees of their account beyond their identity (where they are
        signed in, which apps they connected): the user themselves (the account page's
        cookie) or one of the service's own apps (a first-party client) with ``read``; any
        other app only with ``scope`` itself, named in its token (``read`` does not cover it).
        InsufficientScope (403) naming ``scope`` otherwise."""
        if self.via_cookie or self.first_party:
            self.require(scopes.READ)
        elif scope not in self.scopes:
            raise InsufficientScope(scope)


async def from_bearer(ctx: OAuthContext, token: str | None) -> Principal | None:
    found = await bearer.active_access_token(ctx, token)
    if found is None:
        return None
    record = found.token
    return Principal(record.subject, list(record.scopes), record.client_id, token=record, user=found.user,
                     first_party=found.client.first_party)


async def from_session(ctx: OAuthContext, session_id: str | None) -> Principal | None:
    found = await sessions.resolve(ctx, session_id)
    if found is None:
        return None
    session, user = found
    return Principal(Subject(user_id=user.user_id), list(SESSION_SCOPES), session=session, user=user)


async def describe(ctx: OAuthContext, principal: Principal) -> dict:
    """Who ``principal`` acts for: the ``/v1/me`` body, and the WebSocket's welcome."""
    subject = principal.subject
    body = {"subjectType": subject.kind, "id": subject.id, "clientId": principal.client_id,
            "scopes": principal.scopes}
    if subject.user_id is not None:
        user = principal.user or await ctx.store.get_user(subject.user_id)
        body["username"] = user.username if user else None
    else:
        installation = await ctx.store.get_installation(subject.id)
        body["name"] = installation.name if installation else subject.id
    return body


def stands_on(principal: Principal) -> list[Revocation]:
    """What a long-lived connection of ``principal`` stands on: a revocation of any of these
    makes it re-check (:func:`still_valid`)."""
    if principal.token is not None:
        token = principal.token
        return [Revocation(FAMILY, token.family_id), Revocation(GRANT, token.grant_id),
                Revocation(CLIENT, token.client_id)]
    assert principal.session is not None
    return [Revocation(SESSION, principal.session.session_hash), Revocation(USER, principal.session.user_id)]


async def still_valid(ctx: OAuthContext, principal: Principal) -> bool:
    """Re-check the credential behind a long-lived connection (a WebSocket).

    A connection opened with an access token stands on the token's family: a refresh that
    replaces the token is no revocation, while revoking the family, its grant, or that access
    token alone ends it, and so does ``read`` no longer being in force (its client narrowed,
    which is announced under the client, or removed). One opened with a session stands on the
    session.
    """
    now = ctx.clock()
    token = principal.token
    if token is not None:
        family, grant = await ctx.store.get_family(token.family_id)
        if family is None or not family.stands(grant) or token.expires_at <= now:
            return False
        if family.access_hash == token.token_hash and family.access_revoked_at is not None:
            return False
        found = await privileges.authority(ctx, token)
        return found is not None and scopes.satisfies(found.token.scopes, scopes.READ)
    if principal.session is not None:
        current_session = await ctx.store.get_session(principal.session.session_hash)
        return current_session is not None and current_session.expires_at > now
    return False
