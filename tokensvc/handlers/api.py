"""The public API's own endpoints: ``/v1/me`` and the user's connected apps."""

from __future__ import annotations

from tokensvc import schemas
from tokensvc.handlers.auth import AuthMixin, requires
from tokensvc.handlers.errors import NotFound
from tokensvc.handlers.json_api import PRIVATE_HEADERS, JsonHandler
from tokensvc.oauth import connected_apps, revocation
from tokensvc.oauth.principal import Principal


class ApiEndpoint(AuthMixin, JsonHandler):
    """A ``/v1/`` endpoint: a bearer token or the session cookie; its answers are private."""

    default_headers = PRIVATE_HEADERS
    takes_session = True


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


class ConnectedAppHandler(ApiEndpoint):
    """``DELETE /v1/me/connected-apps/{client_id}`` (connected-apps:write): revoke that grant."""

    @requires("connected-apps:write")
    async def delete(self, client_id: str) -> None:
        principal = self.require_user()
        self.load_client_id(client_id)
        if not await revocation.revoke_connected_app(self.ctx, principal.subject, client_id):
            raise NotFound(f"No active grant for client {client_id!r}")
        self.send(204, b"", None)
