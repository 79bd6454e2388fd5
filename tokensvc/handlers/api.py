"""The public API's own endpoints: ``/v1/me`` and the user's connected apps."""

from __future__ import annotations

import tornado.web

from tokensvc import schemas
from tokensvc.handlers.auth import AuthMixin, requires
from tokensvc.handlers.base import BaseHandler
from tokensvc.handlers.common import SECURITY_HEADERS, NotFound
from tokensvc.handlers.endpoint import Endpoint
from tokensvc.oauth import connected_apps, revocation
from tokensvc.oauth.principal import Principal


API_HEADERS = {**SECURITY_HEADERS, "Cache-Control": "no-store"}  # private to the caller


class ApiEndpoint(AuthMixin, Endpoint):
    """A JSON endpoint under ``/v1/`` (bearer token, or the session cookie on safe methods)."""

    default_headers = API_HEADERS


class ApiHandler(AuthMixin, BaseHandler):
    """A ``/v1/`` change that also takes the session cookie: Tornado checks its XSRF token."""

    default_headers = API_HEADERS

    def check_same_origin(self) -> None:
        tornado.web.RequestHandler.check_xsrf_cookie(self)


async def describe(handler: AuthMixin, principal: Principal) -> dict:
    """The ``/v1/me`` body (also the basis of the WebSocket welcome)."""
    subject = principal.subject
    body = {"subjectType": subject.kind, "id": subject.id, "clientId": principal.client_id,
            "scopes": principal.scopes}
    if subject.user_id is not None:
        user = await handler.ctx.store.get_user(subject.user_id)
        body["username"] = user.username if user else None
    else:
        installation = await handler.ctx.store.get_installation(subject.id)
        body["name"] = installation.name if installation else subject.id
    return body


class MeHandler(ApiEndpoint):
    """``GET /v1/me`` (read)."""

    @requires("read")
    async def get(self) -> None:
        self.send_json(schemas.fast_dump(schemas.me, await describe(self, self.principal)))


class ConnectedAppsHandler(ApiEndpoint):
    """``GET /v1/me/connected-apps`` (read): the clients holding an active grant of this user."""

    @requires("read")
    async def get(self) -> None:
        principal = self.require_user()
        self.send_json(schemas.connected_apps.dump(await connected_apps.list_connected(self.ctx, principal.subject)))


class ConnectedAppHandler(ApiHandler):
    """``DELETE /v1/me/connected-apps/{client_id}`` (connected-apps:write): revoke that grant."""

    @requires("connected-apps:write")
    async def delete(self, client_id: str) -> None:
        principal = self.require_user()
        self.load_client_id(client_id)
        if not await revocation.revoke_connected_app(self.ctx, principal.subject, client_id):
            raise NotFound(f"No active grant for client {client_id!r}")
        self.set_status(204)
        self.finish()
