"""The token endpoints: code exchange, refresh, introspection and revocation."""

from __future__ import annotations

import logging

from tokensvc import logs, schemas
from tokensvc.handlers.errors import ValidationFailed
from tokensvc.handlers.json_api import TOKEN_HEADERS, JsonHandler
from tokensvc.oauth import bearer, clientauth, grants, introspection, revocation, sessions
from tokensvc.oauth.errors import InvalidClient, InvalidRequest, UnsupportedGrantType
from tokensvc.records import Client


class TokenEndpoint(JsonHandler):
    """A token endpoint: its responses are never cached (RFC 6749 §5.1)."""

    default_headers = TOKEN_HEADERS


class ClientAuthMixin:
    async def authenticate_client(self: TokenEndpoint, form: dict[str, str]) -> Client:
        brakes, address = self.ctx.brakes, self.request.remote_ip or "-"
        try:
            creds = clientauth.credentials(self.request.headers.get("Authorization"),
                                           form.get("client_id"), form.get("client_secret"))
        except InvalidClient:
            self.client_auth_failed(brakes.client_keys(None, address), None)
            raise
        if creds is None:
            raise ValidationFailed([schemas.missing_detail("body", "client_id")])
        self.log_client_id = creds.client_id
        keys = brakes.client_keys(creds.client_id, address)
        brakes.check(keys)
        try:
            return await clientauth.authenticate(self.ctx.store, creds)
        except InvalidClient:
            self.client_auth_failed(keys, creds.client_id)
            raise

    def client_auth_failed(self: TokenEndpoint, keys: list[tuple[str, int]], client_id: str | None) -> None:
        self.ctx.brakes.failed(keys)
        logs.audit("client_auth", {"client_id": client_id, "remote_ip": self.request.remote_ip,
                                   "endpoint": self.request.path, "outcome": "failure"},
                   logging.WARNING, "client authentication failed")

    def send_tokens(self: TokenEndpoint, response: grants.TokenResponse) -> None:
        self.send_json(schemas.fast_dump(schemas.token_response, response))


class TokenHandler(ClientAuthMixin, TokenEndpoint):
    """``POST /oauth/token``: authorization code + PKCE, the only grant type."""

    async def post(self) -> None:
        form = self.form(schemas.token_request)
        grant_type = form.get("grant_type")
        if grant_type is not None and grant_type != "authorization_code":
            raise UnsupportedGrantType("Only grant_type=authorization_code is supported here; "
                                       "refresh at /oauth/token/refresh")
        data = self.load(schemas.token_request, form)
        client = await self.authenticate_client(form)
        response = await grants.exchange_code(self.ctx, client, data["code"], data["redirect_uri"],
                                              data.get("code_verifier"))
        self.send_tokens(response)


class RefreshHandler(ClientAuthMixin, TokenEndpoint):
    """``POST /oauth/token/refresh``: refresh-token rotation."""

    async def post(self) -> None:
        form = self.form(schemas.refresh_request)
        data = self.load(schemas.refresh_request, form)
        client = await self.authenticate_client(form)
        self.send_tokens(await grants.refresh(self.ctx, client, data["refresh_token"], data.get("scope")))


class IntrospectHandler(ClientAuthMixin, TokenEndpoint):
    """``POST /oauth/token/introspect`` (RFC 7662)."""

    async def post(self) -> None:
        form = self.form(schemas.token_action)
        data = self.load(schemas.token_action, form)
        presented = bearer.from_authorization(self.request.headers.get("Authorization"))
        if presented is not None:
            token = await bearer.active_access_token(self.ctx, presented)
            if token is None:
                raise InvalidClient("The bearer token is not active")
            await introspection.check_bearer_caller(self.ctx, token)
        else:
            client = await self.authenticate_client(form)
            if not client.confidential:
                raise InvalidClient("Introspection needs client authentication")
            introspection.check_client_caller(client)
        body = await introspection.introspect(self.ctx, data["token"])
        self.send_json(schemas.fast_dump(schemas.introspection_response, body))


class RevokeHandler(ClientAuthMixin, TokenEndpoint):
    """``POST /oauth/token/revoke`` (RFC 7009): a client revokes a token issued to it."""

    async def post(self) -> None:
        form = self.form(schemas.token_action)
        data = self.load(schemas.token_action, form)
        client = await self.authenticate_client(form)
        await revocation.revoke_token(self.ctx, data["token"], client)
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
        session_id = self.raw_session_id()
        if session_id is not None:
            await sessions.end(self.ctx, session_id)
        self.clear_cookie(self.config.session_cookie)
        if data.get("token"):
            await revocation.revoke_token(self.ctx, data["token"], None)
        self.send_json({})
