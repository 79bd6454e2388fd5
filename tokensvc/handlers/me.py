"""The public API's own endpoints: ``/v1/me`` and the user's connected apps."""

from __future__ import annotations

from tokensvc import schemas
from tokensvc.errors import NotFound
from tokensvc.handlers.edge.auth import AuthMixin, requires
from tokensvc.handlers.edge.headers import PRIVATE_HEADERS
from tokensvc.handlers.edge.json_handler import JsonHandler
from tokensvc.oauth import connected_apps, revocation, sessions
from tokensvc.oauth import principal as principals


class ApiEndpoint(AuthMixin, JsonHandler):
    """A ``/v1/`` endpoint: a bearer token or the session cookie; its answers are private."""

    default_headers = PRIVATE_HEADERS
    cors = True  # browser apps with a bearer token; never the cookie across origins


class MeHandler(ApiEndpoint):
    """``GET /v1/me`` (read)."""

    @requires("read")
    async def get(self) -> None:
        self.send_json(schemas.fast_dump(schemas.me, await principals.describe(self.ctx, self.authenticated())))


class ConnectedAppsHandler(ApiEndpoint):
    """``GET /v1/me/connected-apps`` (read; a third-party app needs ``connected-apps:read``):
    the clients holding an active grant of this user."""

    @requires("read")
    async def get(self) -> None:
        principal = self.require_user()
        principal.require_own("connected-apps:read")
        self.send_json(schemas.connected_apps.dump(await connected_apps.list_connected(self.ctx, principal.subject)))


class ConnectedAppHandler(ApiEndpoint):
    """``DELETE /v1/me/connected-apps/{client_id}`` (connected-apps:write): revoke that grant."""

    path_schema = schemas.client_id_path

    @requires("connected-apps:write")
    async def delete(self, client_id: str) -> None:
        principal = self.require_user()
        if not await revocation.revoke_connected_app(self.ctx, principal.subject, client_id):
            raise NotFound(f"No active grant for client {client_id!r}")
        self.send(204, b"", None)


class SessionsHandler(ApiEndpoint):
    """``GET /v1/me/sessions`` (read; a third-party app needs ``sessions:read``): where the user
    is signed in (browsers and addresses), the current one marked."""

    @requires("read")
    async def get(self) -> None:
        principal = self.require_user()
        principal.require_own("sessions:read")
        user = principal.user
        current = principal.session.session_hash if principal.session else None
        listed = await sessions.list_sessions(self.ctx, user) if user else []
        self.send_json(schemas.user_sessions.dump([
            {"id": session.public_id, "browser": sessions.browser_of(session.user_agent),
             "userAgent": session.user_agent, "address": session.address, "signedInAt": session.created_at,
             "lastSeenAt": session.last_seen_at, "current": session.session_hash == current}
            for session in listed]))


class SessionHandler(ApiEndpoint):
    """``DELETE /v1/me/sessions/{id}`` (sessions:write, which write covers): sign that session
    out; 204, or 404 when there is none."""

    path_schema = schemas.session_id_path

    @requires("sessions:write")
    async def delete(self, session_id: str) -> None:
        principal = self.require_user()
        user = principal.user
        if user is None or not await sessions.end_one(self.ctx, user, session_id):
            raise NotFound(f"No session {session_id!r} of yours is signed in")
        self.send(204, b"", None)
