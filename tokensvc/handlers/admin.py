"""The admin API, on a listener of its own (``[admin]``): operators manage clients, users,
installations, grants, sessions and tokens of a running service, on any backend.

Every call but the index is authenticated by an administrator's bearer token, under the
failure limits (:mod:`tokensvc.oauth.adminauth`), and writes an audit line naming the user and
the client (never the token). Handlers parse, call :class:`tokensvc.admin.operator.Operator` and
answer its JSON.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from typing import Any

from tokensvc import jsontext, schemas
from tokensvc.admin.actions import MAX_PAGE
from tokensvc.admin.operator import Operator
from tokensvc.bootstrap import CLI_CLIENT
from tokensvc.config import listen_url
from tokensvc.errors import ValidationFailed
from tokensvc.handlers.edge.headers import PRIVATE_HEADERS
from tokensvc.handlers.edge.json_handler import JsonHandler
from tokensvc.oauth import adminauth
from tokensvc.openapi import document as openapi
from tokensvc.telemetry import logs

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
        """The JSON body (an empty one is ``{}``); 422 when it is not JSON, is nested deeper
        than :data:`tokensvc.jsontext.MAX_DEPTH` (never parsed then), or holds a lone surrogate
        in a string (before any schema sees it)."""
        if not self.request.body:
            return {}
        try:
            return jsontext.loads(self.request.body)
        except jsontext.TooDeep as exc:
            raise ValidationFailed([{"loc": ["body"], "msg": f"Invalid JSON: {exc}", "type": "json_invalid",
                                     "input": None, "ctx": {"max_depth": exc.max_depth}}]) from None
        except jsontext.LoneSurrogate as exc:
            raise ValidationFailed([{"loc": ["body"], "msg": f"Invalid JSON: {exc}", "type": "json_invalid",
                                     "input": None, "ctx": {}}]) from None
        except ValueError:  # UnicodeDecodeError too
            raise ValidationFailed([{"loc": ["body"], "msg": "Invalid JSON", "type": "json_invalid",
                                     "input": None, "ctx": {}}]) from None

    def _parse_body(self) -> None:
        """A JSON body is read by :meth:`body`, not as a form."""

    def limit(self) -> int | None:
        """The listing's ``limit``: 1 to :data:`~tokensvc.admin.actions.MAX_PAGE`, as the document says."""
        raw = self.get_query("limit")
        if raw is None:
            return None
        if not DIGITS.fullmatch(raw):  # str.isdigit takes "²", which int() does not
            raise ValidationFailed.one(["query", "limit"], "Input should be a valid integer", "int_parsing", raw)
        limit = int(raw)
        if limit < 1:
            raise ValidationFailed([{"loc": ["query", "limit"], "msg": "Input should be greater than or equal to 1",
                                     "type": "greater_than_equal", "input": raw, "ctx": {"ge": 1}}])
        if limit > MAX_PAGE:
            raise ValidationFailed([{"loc": ["query", "limit"], "msg": f"Input should be less than or equal to "
                                     f"{MAX_PAGE}", "type": "less_than_equal", "input": raw, "ctx": {"le": MAX_PAGE}}])
        return limit

    def get_query(self, name: str) -> str | None:
        values = self.request.query_arguments.get(name)
        return values[-1].decode("utf-8", "replace") if values else None

    async def authorize_operator(self) -> None:
        """The caller must be an administrator (:func:`tokensvc.oauth.adminauth.authenticate`)."""
        caller = await adminauth.authenticate(self.ctx, adminauth.AdminRequest(
            self.request.headers.get("Authorization"), self.request.remote_ip or "-", self.request.method or "",
            self.route.path))
        self.operator_name, self.log_client_id = caller.username, caller.client_id


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
        self.send_json(await self.operator.rotate_secret(client_id, self.body()))


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
    path_schema = schemas.session_id_path  # a session's id as /v1/me/sessions/{session_id} takes it

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


class PlanHandler(AdminEndpoint):
    """``POST /admin/plan``: what applying a desired state would do (``tokensvc apply``),
    checked whole; nothing is written."""

    @operator_call
    async def post(self) -> None:
        self.send_json(await self.operator.plan(self.body(), self.operator_name, self.log_client_id))


class AdminOpenAPIHandler(AdminEndpoint):
    """``GET /openapi.json`` of the admin listener: the admin API's own document."""

    async def get(self) -> None:
        if self.edge.openapi_document is None:
            url = listen_url(self.config.admin.host, self.config.admin.port)
            self.edge.openapi_document = openapi.render(self.edge.routes, url, admin=True,
                                                        kinds=self.config.installation_kinds).encode()
        self.send(200, self.edge.openapi_document, "application/json")
