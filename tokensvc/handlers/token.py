"""The token endpoints: code exchange, refresh, introspection and revocation, and sign-out."""

from __future__ import annotations

from typing import Any

from tokensvc import schemas
from tokensvc.handlers.edge.headers import TOKEN_HEADERS
from tokensvc.handlers.edge.json_handler import JsonHandler
from tokensvc.identifiers import ID
from tokensvc.oauth import bearer, clientauth, grants, introspection, revocation, sessions
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.errors import InvalidRequest


class TokenEndpoint(JsonHandler):
    """A token endpoint: its responses are never cached (RFC 6749 §5.1), and the session
    cookie is no authority here."""

    default_headers = TOKEN_HEADERS
    reads_session = False

    def unparseable_body(self, reason: str) -> Exception:
        return InvalidRequest(f"The body could not be parsed: {reason}")

    def caller(self, form: dict[str, str]) -> ClientRequest:
        """What the request says about its client."""
        caller = ClientRequest(self.request.headers.get("Authorization"), form.get("client_id"),
                               form.get("client_secret"), self.request.remote_ip or "-", self.request.path)
        self.log_client_id = clientauth.named_client_id(caller)
        return caller

    def logged_client_id(self) -> str | None:
        """The client the request proved or named; for one that failed before its client was
        read, the well-formed client id it claims (Basic, or ``client_id`` in the body)."""
        if self.log_client_id is not None:
            return self.log_client_id
        claimed = self.request.body_arguments.get("client_id") or [b""]
        caller = ClientRequest(self.request.headers.get("Authorization"), claimed[0].decode("utf-8", "replace"),
                               None, "-", self.request.path)
        named = clientauth.named_client_id(caller)
        return named if named and ID.fullmatch(named) else None

    def resources(self) -> list[str]:
        """The ``resource`` parameters of the body (RFC 8707: repeatable), empty ones left out."""
        try:
            return [raw.decode("utf-8") for raw in self.request.body_arguments.get("resource", []) if raw]
        except UnicodeDecodeError:
            raise InvalidRequest("Parameter 'resource' is not valid UTF-8") from None

    def send_tokens(self, response: grants.TokenResponse) -> None:
        self.send_json(schemas.fast_dump(schemas.token_response, response))


class TokenHandler(TokenEndpoint):
    """``POST /oauth/token``: authorization code + PKCE, the only grant type."""

    cors = True

    async def post(self) -> None:
        form = self.form(schemas.token_request)
        grants.check_grant_type(form.get("grant_type"))
        data = self.load(schemas.token_request, form)
        self.send_tokens(await grants.token_for_code(self.ctx, self.caller(form), data["code"],
                                                     data["redirect_uri"], data.get("code_verifier"),
                                                     data.get("confirmation_code"), self.resources()))


class RefreshHandler(TokenEndpoint):
    """``POST /oauth/token/refresh``: refresh-token rotation."""

    cors = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # When the presentation arrived, before anything waits on the store (its origin, its
        # client): the window of concurrent presentations is judged by it.
        self.arrived = self.ctx.clock()

    async def post(self) -> None:
        form = self.form(schemas.refresh_request)
        data = self.load(schemas.refresh_request, form)
        self.send_tokens(await grants.token_for_refresh(self.ctx, self.caller(form), data["refresh_token"],
                                                        data.get("scope"), self.arrived, self.resources()))


class IntrospectHandler(TokenEndpoint):
    """``POST /oauth/token/introspect`` (RFC 7662)."""

    async def post(self) -> None:
        form = self.form(schemas.introspection_request)
        data = self.load(schemas.introspection_request, form)
        caller = await introspection.authorize_caller(self.ctx, self.caller(form))
        body = await introspection.introspect_for(self.ctx, data["token"], caller)
        self.send_json(schemas.fast_dump(schemas.introspection_response, body))


class RevokeHandler(TokenEndpoint):
    """``POST /oauth/token/revoke`` (RFC 7009): a client revokes a token issued to it."""

    cors = True

    async def post(self) -> None:
        form = self.form(schemas.token_action)
        data = self.load(schemas.token_action, form)
        await revocation.revoke_for_client(self.ctx, self.caller(form), data["token"])
        self.send_json({})


class GrantRevokeHandler(TokenEndpoint):
    """``POST /oauth/revoke``: the caller cuts its own access, the whole grant. Always 200."""

    cors = True

    max_body = None  # the body is never read, and the answer is 200 whatever the input

    async def post(self) -> None:
        presented = bearer.from_authorization(self.request.headers.get("Authorization"))
        try:
            token = self.query(schemas.optional_token_query).get("token")
        except InvalidRequest:  # whatever the input, this endpoint answers 200
            token = None
        await revocation.revoke_grants_of(self.ctx, [presented, token])
        self.send_json({})


class SignOutHandler(JsonHandler):
    """``POST /oauth/sign-out``: end the web session, and revoke ``token`` when given. The
    session cookie is its authority, so a request that carries it needs an XSRF token."""

    default_headers = TOKEN_HEADERS

    async def post(self) -> None:
        # Not a token endpoint: a fault of its query is the interface's HTTPValidationError.
        data = self.load(schemas.optional_token_query, self.query(schemas.optional_token_query, validation=True),
                         "query")
        await sessions.sign_out(self.ctx, self.raw_session_id(), data.get("token"))
        self.clear_cookie(self.config.session_cookie)
        self.send_json({})
