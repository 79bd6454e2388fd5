"""The Starlette adapter: an ``AuthenticationBackend`` for Starlette's ``AuthenticationMiddleware``,
so that ``starlette.authentication.requires("read")`` guards each route by the token's scopes.

An HTTP request's bearer token (the ``Authorization`` header alone: a query never carries one,
RFC 6750 §2.3) is checked by the verifier: in force, the request's ``auth`` is a
:class:`Credentials` of its scopes and its ``user`` a :class:`TokenUser`; without a token the
request goes on anonymous (``request.user.is_authenticated`` false), which a route without
``requires`` serves. A token that is not active, or that cannot be checked, is refused before
any route runs, by :func:`on_error`: 401 ``invalid_token`` or 503, RFC 6750's JSON and
``WWW-Authenticate``, as the ASGI middleware answers. ``requires`` judges scopes by the service's
rule (``write`` covers ``read`` and every ``<resource>:<action>``), and with :data:`EXCEPTION_HANDLERS`
its refusal is RFC 6750's too: 401 ``Bearer realm="api"`` without a token, 403
``insufficient_scope`` naming the scope it lacked.

Every scope's query has its ``access_token`` masked in place, as the ASGI middleware does (the
server's access log writes the scope). A WebSocket is not authenticated here: a socket must be
closed when its token is revoked, which only :class:`~tokensvc.resource.asgi.BearerAuthMiddleware`
on its route does (it takes the token this backend took out of the query). The feed is opened on
the first request unless the application started it; closing it at shutdown is the
application's (its lifespan).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
    UnauthenticatedUser,
)
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from tokensvc.oauth.scopes import satisfies
from tokensvc.resource.bearer import Authorized, bearer_token, take_query_token
from tokensvc.resource.errors import InsufficientScope, InvalidToken, Refusal
from tokensvc.resource.started import ensure_feed_open
from tokensvc.resource.verifier import Verifier


class Scopes(list[str]):
    """A token's scopes, as it holds them; ``in`` answers by the service's rule (``write`` covers
    ``read``), which is what ``requires`` asks. The first scope found missing is remembered, for
    the refusal to name it."""

    missing: str | None = None

    def __contains__(self, scope: object) -> bool:
        if isinstance(scope, str) and satisfies(self, scope):
            return True
        if self.missing is None:
            self.missing = str(scope)
        return False


class Credentials(AuthCredentials):
    """``request.auth``: the token's :class:`Scopes` (none without a token), and the realm its
    refusals name."""

    def __init__(self, scopes: Iterable[str] = (), realm: str = "api") -> None:
        super().__init__()
        self.scopes: Scopes = Scopes(scopes)
        self.realm = realm


class TokenUser(BaseUser):
    """``request.user`` for a token in force: who it speaks for and what it holds."""

    def __init__(self, authorized: Authorized) -> None:
        self.authorized = authorized  # the introspection answer: authorized.require("write") raises the 403

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def subject(self) -> str | None:
        """The user's id, or the node installation's."""
        return self.authorized.subject

    @property
    def client_id(self) -> str | None:
        return self.authorized.client_id

    @property
    def scope(self) -> str:
        """The token's scopes, space-separated as introspection gives them."""
        return " ".join(self.authorized.scopes)

    @property
    def installation_id(self) -> str | None:
        """The node installation the token was issued to; None for a user's token."""
        return self.authorized.installation_id

    @property
    def display_name(self) -> str:
        answer = self.authorized.answer
        return str(answer.get("username") or answer.get("installation_id") or answer.get("sub") or "")

    @property
    def identity(self) -> str:
        return self.authorized.subject or ""


class Refused(AuthenticationError):
    """A token refused before any route runs: the refusal, and the realm to name."""

    def __init__(self, refusal: Refusal, realm: str) -> None:
        super().__init__(str(refusal))
        self.refusal, self.realm = refusal, realm


class BearerBackend(AuthenticationBackend):
    """Checks each HTTP request's bearer token with ``verifier``."""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        take_query_token(conn.scope)  # masked before anything answers: the server logs the scope
        await ensure_feed_open(self.verifier)  # on the first request, if the application did not
        realm = self.verifier.settings.realm
        token = bearer_token(conn.headers.get("authorization")) if conn.scope["type"] == "http" else None
        if token is None:  # anonymous: a route without requires serves it
            return Credentials((), realm), UnauthenticatedUser()
        try:
            authorized = await self.verifier.check(token)
        except Refusal as refusal:
            raise Refused(refusal, realm) from None
        return Credentials(authorized.scopes, realm), TokenUser(authorized)


def refusal_response(refusal: Refusal, realm: str) -> Response:
    """The RFC 6750 answer to ``refusal``: its status, ``WWW-Authenticate`` and JSON body."""
    return JSONResponse(refusal.body(), status_code=refusal.status, headers=refusal.headers(realm))


def on_error(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    """``AuthenticationMiddleware``'s ``on_error``: a token refused answered as RFC 6750 says."""
    if isinstance(exc, Refused):
        return refusal_response(exc.refusal, exc.realm)
    return AuthenticationMiddleware.default_on_error(conn, exc)


def authentication(verifier: Verifier) -> Middleware:
    """The application's entry for ``Starlette(middleware=[...])``: ``AuthenticationMiddleware``
    with a :class:`BearerBackend` of ``verifier`` and :func:`on_error`."""
    return Middleware(AuthenticationMiddleware, backend=BearerBackend(verifier), on_error=on_error)


async def refused(request: Request, exc: Exception) -> Response:
    """An exception handler (:data:`EXCEPTION_HANDLERS`): a refusal ``requires`` raised (the
    scope it found missing) answered as RFC 6750 says, 401 without a token and 403
    ``insufficient_scope`` with one; a :class:`Refusal` the route raised
    (``request.user.authorized.require("write")``) likewise; any other ``HTTPException`` as
    Starlette answers it."""
    auth: Any = request.scope.get("auth")
    realm = auth.realm if isinstance(auth, Credentials) else "api"
    if isinstance(exc, Refusal):
        return refusal_response(exc, realm)
    assert isinstance(exc, HTTPException)
    missing = auth.scopes.missing if isinstance(auth, Credentials) else None
    if missing is not None and exc.status_code in (401, 403):
        authenticated = isinstance(request.scope.get("user"), TokenUser)
        return refusal_response(InsufficientScope(missing) if authenticated else InvalidToken(None), realm)
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=exc.headers)
    return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)


EXCEPTION_HANDLERS = {HTTPException: refused, Refusal: refused}  # Starlette(exception_handlers=...)
