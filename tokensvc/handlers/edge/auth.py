"""One authentication layer for public-API handlers: bearer token, session cookie, and for
WebSockets also the ``access_token`` query parameter (RFC 6750 §2.3)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from tokensvc.oauth import bearer
from tokensvc.oauth import principal as principals
from tokensvc.oauth.errors import AccessDenied, InvalidToken
from tokensvc.oauth.principal import Principal


class AuthMixin:
    """For handlers with ``request``, ``ctx`` and ``config`` (a JsonHandler or the WebSocket).
    Sets ``self.principal``."""

    principal: Principal | None = None
    log_client_id: str | None  # the client the access line names
    accept_query_token = False  # only WebSockets, where browsers cannot set headers
    bearer_replaces_cookie = True  # with an Authorization header, the cookie is never read

    async def authenticate(self: Any) -> Principal:
        header = self.request.headers.get("Authorization")
        presented = bearer.from_authorization(header)
        if presented is None and self.accept_query_token:
            presented = self.get_query_argument("access_token", None)
        if presented is not None or header:
            found = await principals.from_bearer(self.ctx, presented)
            if found is None:
                raise InvalidToken("The access token is missing, expired, revoked or malformed")
            return found
        # The cookie is ambient authority: the base has checked an unsafe request's XSRF token.
        found = await principals.from_session(self.ctx, self.raw_session_id())
        if found is None:
            raise InvalidToken("Authentication required: a bearer token or a session")
        return found

    def authenticated(self) -> Principal:
        """The principal :func:`requires` authenticated."""
        assert self.principal is not None
        return self.principal

    def require_user(self) -> Principal:
        """The principal, if it acts for a user (node installations have no connected apps)."""
        principal = self.authenticated()
        if principal.subject.user_id is None:
            raise AccessDenied("Connected apps belong to users; node-installation tokens cannot use them")
        return principal


def requires(scope: str) -> Callable[[Callable[..., Awaitable[None]]], Callable[..., Awaitable[None]]]:
    """Authenticate the request and require ``scope`` before the handler method runs."""

    def decorate(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        @functools.wraps(method)
        async def wrapper(self: AuthMixin, *args: Any, **kwargs: Any) -> None:
            self.principal = await self.authenticate()
            self.principal.require(scope)
            self.log_client_id = self.principal.client_id
            await method(self, *args, **kwargs)

        return wrapper

    return decorate
