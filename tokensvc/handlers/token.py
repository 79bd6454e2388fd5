"""The token endpoints: code exchange, refresh, introspection and revocation, and sign-out."""

from __future__ import annotations

from tokensvc import schemas
from tokensvc.identifiers import ID
from tokensvc.handlers.errors import ValidationFailed
from tokensvc.handlers.json_api import TOKEN_HEADERS, JsonHandler
from tokensvc.oauth import bearer, clientauth, grants, introspection, revocation, sessions
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.errors import InvalidRequest


class TokenEndpoint(JsonHandler):
    """A token endpoint: its responses are never cached (RFC 6749 §5.1)."""

    default_headers = TOKEN_HEADERS

    def caller(self, form: dict[str, str]) -> ClientRequest:
        """The client a request names; a request that names none is 422 (the spec: every
        token-endpoint call carries ``client_id``)."""
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

    def named_caller(self, form: dict[str, str]) -> ClientRequest:
        caller = self.caller(form)
        if not caller.names_a_client():
            raise ValidationFailed([schemas.missing_detail("body", "client_id")])
        return caller

    def send_tokens(self, response: grants.TokenResponse) -> None:
        self.send_json(schemas.fast_dump(schemas.token_response, response))


class TokenHandler(TokenEndpoint):
    """``POST /oauth/token``: authorization code + PKCE, the only grant type."""

    async def post(self) -> None:
        form = self.form(schemas.token_request)
        grants.check_grant_type(form.get("grant_type"))
        data = self.load(schemas.token_request, form)
        self.send_tokens(await grants.token_for_code(self.ctx, self.named_caller(form), data["code"],
                                                     data["redirect_uri"], data.get("code_verifier")))


class RefreshHandler(TokenEndpoint):
    """``POST /oauth/token/refresh``: refresh-token rotation."""

    async def post(self) -> None:
        form = self.form(schemas.refresh_request)
        data = self.load(schemas.refresh_request, form)
        self.send_tokens(await grants.token_for_refresh(self.ctx, self.named_caller(form), data["refresh_token"],
                                                        data.get("scope")))


class IntrospectHandler(TokenEndpoint):
    """``POST /oauth/token/introspect`` (RFC 7662)."""

    async def post(self) -> None:
        form = self.form(schemas.token_action)
        data = self.load(schemas.token_action, form)
        caller = self.caller(form)
        if bearer.from_authorization(caller.authorization) is None and not caller.names_a_client():
            raise ValidationFailed([schemas.missing_detail("body", "client_id")])
        await introspection.authorize_caller(self.ctx, caller)
        body = await introspection.introspect(self.ctx, data["token"])
        self.send_json(schemas.fast_dump(schemas.introspection_response, body))


class RevokeHandler(TokenEndpoint):
    """``POST /oauth/token/revoke`` (RFC 7009): a client revokes a token issued to it."""

    async def post(self) -> None:
        form = self.form(schemas.token_action)
        data = self.load(schemas.token_action, form)
        await revocation.revoke_for_client(self.ctx, self.named_caller(form), data["token"])
        self.send_json({})


class GrantRevokeHandler(TokenEndpoint):
    """``POST /oauth/revoke``: the caller cuts its own access, the whole grant. Always 200."""

    max_body = None  # the body is never read, and the answer is 200 whatever the input

    async def post(self) -> None:
        presented = bearer.from_authorization(self.request.headers.get("Authorization"))
        try:
            token = self.query(schemas.optional_token_query).get("token")
        except InvalidRequest:  # whatever the input, this endpoint answers 200
            token = None
        for candidate in dict.fromkeys(t for t in (presented, token) if t):
            await revocation.revoke_grant_of(self.ctx, candidate)
        self.send_json({})


class SignOutHandler(TokenEndpoint):
    """``POST /oauth/sign-out``: end the web session, and revoke ``token`` when given. The
    session cookie is its authority, so a request that carries it needs an XSRF token."""

    takes_session = True

    async def post(self) -> None:
        data = self.load(schemas.optional_token_query, self.query(schemas.optional_token_query), "query")
        await sessions.end(self.ctx, self.raw_session_id())
        self.clear_cookie(self.config.session_cookie)
        if data.get("token"):
            await revocation.revoke_token(self.ctx, data["token"], None)
        self.send_json({})
