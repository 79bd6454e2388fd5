"""The admin API, on a listener of its own (``[admin]``): operators manage clients, users,
installations, grants, sessions and tokens of a running service, on any backend.

Every call but the index carries ``Authorization: Bearer <access token>`` of an admin user,
holding the ``admin`` scope (the spec: every integration uses an OAuth-issued token); no token
or a dead one is 401, anyone else 403, and failed attempts count against the caller's address.
Every call writes an audit line naming the user and the client (never the token). Handlers
parse, call :class:`tokensvc.operator.Operator` and answer its JSON.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from tokensvc import logs, openapi
from tokensvc.bootstrap import CLI_CLIENT
from tokensvc.config import listen_url
from tokensvc.errors import ValidationFailed
from tokensvc.handlers.headers import PRIVATE_HEADERS
from tokensvc.handlers.json_api import JsonHandler
from tokensvc.oauth import bearer
from tokensvc.oauth.administrators import require_admin
from tokensvc.oauth.errors import AccessDenied, InsufficientScope, InvalidToken
from tokensvc.operator import Operator
from tokensvc.ratelimit import TooManyFailures

DIGITS = re.compile(r"[0-9]+")


class AdminEndpoint(JsonHandler):
    """An admin API route: bearer tokens only (never a cookie), answers private."""

    default_headers = PRIVATE_HEADERS
    reads_session = False
    operator_name: str | None = None

    @property
    def operator(self) -> Operator:
        return Operator(self.ctx, self.config)

    def body(self) -> Any:
        """The JSON body (an empty one is ``{}``); 422 when it is not JSON."""
        if not self.request.body:
            return {}
        try:
            return json.loads(self.request.body)
        except (ValueError, UnicodeDecodeError):
            raise ValidationFailed([{"loc": ["body"], "msg": "Invalid JSON", "type": "json_invalid",
                                     "input": None, "ctx": {}}]) from None

    def _parse_body(self) -> None:
        """A JSON body is read by :meth:`body`, not as a form."""

    def limit(self) -> int | None:
        raw = self.get_query("limit")
        if raw is None:
            return None
        if not DIGITS.fullmatch(raw):  # str.isdigit takes "²", which int() does not
            raise ValidationFailed.one(["query", "limit"], "Input should be a valid integer", "int_parsing", raw)
        return int(raw)

    def get_query(self, name: str) -> str | None:
        values = self.request.query_arguments.get(name)
        return values[-1].decode("utf-8", "replace") if values else None

    async def authorize_operator(self) -> None:
        """The caller must be an admin user with a token carrying ``admin``. Unknown and dead
        tokens count against the caller's address, are audited and counted; past the limit
        they are answered 429. A token in force (256 random bits: guessing one gains nothing
        from a limit) is never refused by it, whoever else shares the address."""
        limits = self.ctx.limits
        attempt = limits.admin_attempt(self.request.remote_ip or "-")
        try:
            presented = bearer.from_authorization(self.request.headers.get("Authorization"))
            token = await bearer.active_access_token(self.ctx, presented) if presented else None
            if token is None:
                self._refused("invalid_token")
                await limits.failed(attempt)  # TooManyFailures once past the limit
                raise InvalidToken("An admin's access token is needed (tokensvc login)")
            try:
                user = require_admin(token, "The admin API is for administrators")
            except (AccessDenied, InsufficientScope) as refused:
                self._refused(refused.error)
                raise
        except TooManyFailures:
            self.ctx.metrics.refused_by_limit("admin")
            raise
        self.operator_name, self.log_client_id = user.username, token.token.client_id

    def _refused(self, reason: str) -> None:
        logs.audit("admin_call", {"method": self.request.method, "route": self.route.path, "outcome": "refused",
                                  "reason": reason, "remote_ip": self.request.remote_ip},
                   logging.WARNING, "admin call refused")


def operator_call(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Authorize the operator, run the call, audit it."""

    @functools.wraps(method)
    async def wrapper(self: AdminEndpoint, *args: Any) -> None:
        await self.authorize_operator()
        await method(self, *args)
        logs.audit("admin_call", {"username": self.operator_name, "client_id": self.log_client_id,
                                  "method": self.request.method, "route": self.route.path, "outcome": "success"},
                   message="admin call")

    return wrapper


class IndexHandler(AdminEndpoint):
    """``GET /admin``: where to get an admin's token (``tokensvc login`` starts here)."""

    async def get(self) -> None:
        metadata = self.ctx.metadata
        self.send_json({"issuer": metadata["issuer"], "authorizationEndpoint": metadata["authorization_endpoint"],
                        "tokenEndpoint": metadata["token_endpoint"],
                        "cliClientId": CLI_CLIENT.client_id if self.config.admin.cli_client else None})


class ClientsHandler(AdminEndpoint):
    @operator_call
    async def get(self) -> None:
        self.send_json(await self.operator.list_clients(self.limit(), self.get_query("cursor")))

    @operator_call
    async def post(self) -> None:
        self.send_json(await self.operator.create_client(self.body()), 201)


class ClientHandler(AdminEndpoint):
    @operator_call
    async def get(self, client_id: str) -> None:
        self.send_json(await self.operator.get_client(client_id))

    @operator_call
    async def put(self, client_id: str) -> None:
        answer, created = await self.operator.put_client(client_id, self.body())
        self.send_json({**answer, "created": created}, 201 if created else 200)

    @operator_call
    async def patch(self, client_id: str) -> None:
        self.send_json(await self.operator.patch_client(client_id, self.body()))

    @operator_call
    async def delete(self, client_id: str) -> None:
        self.send_json(await self.operator.remove_client(client_id))


class ClientSecretHandler(AdminEndpoint):
    @operator_call
    async def post(self, client_id: str) -> None:
        self.send_json(await self.operator.rotate_secret(client_id))


class UsersHandler(AdminEndpoint):
    @operator_call
    async def get(self) -> None:
        self.send_json(await self.operator.list_users(self.limit(), self.get_query("cursor")))

    @operator_call
    async def post(self) -> None:
        self.send_json(await self.operator.create_user(self.body()), 201)


class UserHandler(AdminEndpoint):
    @operator_call
    async def get(self, username: str) -> None:
        self.send_json(await self.operator.get_user(username))

    @operator_call
    async def patch(self, username: str) -> None:
        self.send_json(await self.operator.patch_user(username, self.body()))

    @operator_call
    async def delete(self, username: str) -> None:
        self.send_json(await self.operator.remove_user(username))


class PasswordHandler(AdminEndpoint):
    @operator_call
    async def put(self, username: str) -> None:
        self.send_json(await self.operator.set_password(username, self.body()))


class UserSessionsHandler(AdminEndpoint):
    @operator_call
    async def get(self, username: str) -> None:
        self.send_json(await self.operator.list_sessions(username))

    @operator_call
    async def delete(self, username: str) -> None:
        self.send_json(await self.operator.end_sessions(username))


class UserSessionHandler(AdminEndpoint):
    @operator_call
    async def delete(self, username: str, session_id: str) -> None:
        self.send_json(await self.operator.end_session(username, session_id))


class InstallationsHandler(AdminEndpoint):
    @operator_call
    async def get(self) -> None:
        self.send_json(await self.operator.list_installations(self.limit(), self.get_query("cursor")))


class InstallationHandler(AdminEndpoint):
    @operator_call
    async def get(self, installation_id: str) -> None:
        self.send_json(await self.operator.get_installation(installation_id))

    @operator_call
    async def put(self, installation_id: str) -> None:
        answer, created = await self.operator.put_installation(installation_id, self.body())
        self.send_json({**answer, "created": created}, 201 if created else 200)

    @operator_call
    async def delete(self, installation_id: str) -> None:
        self.send_json(await self.operator.remove_installation(installation_id))


class GrantsHandler(AdminEndpoint):
    @operator_call
    async def get(self) -> None:
        self.send_json(await self.operator.list_grants(self.get_query("username"), self.get_query("clientId"),
                                                       self.limit(), self.get_query("cursor")))


class GrantHandler(AdminEndpoint):
    @operator_call
    async def delete(self, grant_id: str) -> None:
        self.send_json(await self.operator.revoke_grant(grant_id))


class TokenRevokeHandler(AdminEndpoint):
    @operator_call
    async def post(self) -> None:
        self.send_json(await self.operator.revoke_token(self.body()))


class TokenIntrospectHandler(AdminEndpoint):
    @operator_call
    async def post(self) -> None:
        self.send_json(await self.operator.introspect(self.body()))


class PurgeHandler(AdminEndpoint):
    @operator_call
    async def post(self) -> None:
        self.send_json(await self.operator.purge())


class AdminOpenAPIHandler(AdminEndpoint):
    """``GET /openapi.json`` of the admin listener: the admin API's own document."""

    async def get(self) -> None:
        if self.edge.openapi_document is None:
            url = listen_url(self.config.admin.host, self.config.admin.port)
            self.edge.openapi_document = openapi.render(self.edge.routes, url, admin=True).encode()
        self.send(200, self.edge.openapi_document, "application/json")
