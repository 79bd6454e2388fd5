"""The OpenAPI 3.1 document of every HTTP endpoint, built by apispec from the marshmallow
schemas (the operations are listed here; every body schema comes from ``schemas.py``).

The paths and methods come from the route table: a route whose methods are not all described
here, or a description of a route that does not exist, stops the build. ``tokensvc openapi``
prints it; ``docs/openapi.json`` is a checked-in copy that a test keeps current; the service
serves it at ``GET /openapi.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Protocol

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin

from tokensvc import __version__, admin_schemas, schemas


class Route(Protocol):
    """An entry of the route table (``tokensvc.handlers.lifecycle.Route``)."""

    @property
    def path(self) -> str: ...

    @property
    def methods(self) -> frozenset[str]: ...

FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
HTML = "text/html"


def _json(schema: str, description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description,
                                "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}
    if headers:
        response["headers"] = headers
    return response


def _html(description: str) -> dict[str, Any]:
    return {"description": description, "content": {HTML: {"schema": {"type": "string"}}}}


def _redirect(description: str) -> dict[str, Any]:
    return {"description": description, "headers": {"Location": {"schema": {"type": "string"}}}}


RETRY_AFTER = {"Retry-After": {"schema": {"type": "string"}, "description": "Seconds to wait"}}
INVALID = _json("HTTPValidationError", "A field failed validation")
OAUTH_400 = _json("OAuthError", "OAuth protocol failure (RFC 6749 §5.2)")
CLIENT_401 = _json("OAuthError", "Client authentication failed (invalid_client)",
                   {"WWW-Authenticate": {"schema": {"type": "string"}}})
BEARER_401 = _json("OAuthError", "No valid bearer token or session (invalid_token)",
                   {"WWW-Authenticate": {"schema": {"type": "string"}}})
FORBIDDEN = _json("OAuthError", "Authenticated, but not allowed (insufficient_scope / access_denied)")
TOO_LARGE = _json("Detail", "Request body over 64 KiB")
TOO_MANY = _json("OAuthError", "Too many failed authentications (too_many_requests)", RETRY_AFTER)
UNAVAILABLE = _json("Detail", "The store does not answer", RETRY_AFTER)
NOT_FOUND = _json("Detail", "No such resource")
NO_STORE = {"Cache-Control": {"schema": {"type": "string", "enum": ["no-store"]}},
            "Pragma": {"schema": {"type": "string", "enum": ["no-cache"]}}}


def _form(schema: str) -> dict[str, Any]:
    return {"required": True, "content": {FORM: {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _token_endpoint(summary: str, request: str, ok: dict[str, Any], *, auth: bool = True,
                    extra: dict[str, Any] | None = None) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": ok, "400": OAUTH_400, "413": TOO_LARGE, "422": INVALID,
                                 "503": UNAVAILABLE}
    if auth:
        responses.update({"401": CLIENT_401, "429": TOO_MANY})
    responses.update(extra or {})
    return {"post": {"summary": summary, "requestBody": _form(request), "responses": responses,
                     "security": [{}, {"clientBasic": []}]}}


CORS_PREFLIGHT = {
    "summary": "CORS preflight of a browser app: the origins of public clients' redirect URIs and of "
               "clients' allowed_origins get Access-Control-Allow-Origin; never Allow-Credentials",
    "responses": {"204": {"description": "Preflight answered", "headers": {
        name: {"schema": {"type": "string"}} for name in ("Access-Control-Allow-Origin", "Access-Control-Allow-Methods",
                                                          "Access-Control-Allow-Headers", "Access-Control-Max-Age",
                                                          "Vary")}}}}


def build(routes: Iterable[Route], base_url: str, *, admin: bool = False) -> dict[str, Any]:
    """The document of ``routes`` (the route table, ``tokensvc.app.ROUTES``, or with ``admin``
    the admin listener's, ``tokensvc.app.ADMIN_ROUTES``) of a service reached at ``base_url``."""
    spec = APISpec(
        title="tokensvc admin API" if admin else "tokensvc", version=__version__, openapi_version="3.1.0",
        plugins=[MarshmallowPlugin()],
        info={"description": "The operators' API of tokensvc, on its own listener ([admin]): an admin user's "
                             "access token with the admin scope." if admin
              else "OAuth 2.0 authorization and token service (OAuth API 2.0.0)."},
        servers=[{"url": base_url}],
    )
    for name, schema in (
        ("TokenRequest", schemas.TokenRequestSchema), ("RefreshRequest", schemas.RefreshRequestSchema),
        ("TokenActionRequest", schemas.TokenActionSchema), ("LoginForm", schemas.LoginFormSchema),
        ("TokenResponse", schemas.TokenResponseSchema), ("IntrospectionResponse", schemas.IntrospectionResponseSchema),
        ("OAuthClient", schemas.OAuthClientSchema), ("OAuthError", schemas.OAuthErrorSchema),
        ("Detail", schemas.DetailSchema), ("HTTPValidationError", schemas.HTTPValidationErrorSchema),
        ("Empty", schemas.EmptySchema), ("Metadata", schemas.MetadataSchema), ("Me", schemas.MeSchema),
        ("ConnectedApp", schemas.ConnectedAppSchema), ("Status", schemas.StatusSchema),
        ("Health", schemas.HealthSchema),
        ("Session", schemas.SessionSchema),
    ):
        spec.components.schema(name, schema=schema)
    spec.components.security_scheme("clientBasic", {"type": "http", "scheme": "basic"})
    spec.components.security_scheme("bearer", {"type": "http", "scheme": "bearer"})

    if admin:
        for name, admin_schema in admin_schemas.COMPONENTS.items():
            spec.components.schema(name, schema=admin_schema)
    operations = _admin_operations() if admin else _operations()
    for route in routes:
        documented = operations.pop(route.path, {})
        served = {method.lower() for method in route.methods if method != "HEAD"}
        if "options" in served and "options" not in documented:
            documented = {**documented, "options": CORS_PREFLIGHT}
        if set(documented) != served:
            raise ValueError(f"{route.path}: served {sorted(served)}, documented {sorted(documented)}")
        spec.path(route.path, operations=documented)
    if operations:
        raise ValueError(f"documented but not routed: {sorted(operations)}")
    return spec.to_dict()


def _operations() -> dict[str, dict[str, Any]]:
    """What each route's methods take and answer, by path."""
    ops: dict[str, dict[str, Any]] = {}
    token_ok = _json("TokenResponse", "Tokens issued", NO_STORE)
    ops["/oauth/token"] = (_token_endpoint(
        "Exchange an authorization code (PKCE) for tokens", "TokenRequest", token_ok))
    ops["/oauth/token/refresh"] = (_token_endpoint(
        "Rotate a refresh token", "RefreshRequest", token_ok))
    ops["/oauth/token/introspect"] = (_token_endpoint(
        "Introspect a token (RFC 7662)", "TokenActionRequest", _json("IntrospectionResponse", "Token metadata"),
        extra={"403": FORBIDDEN}))
    ops["/oauth/token/revoke"] = (_token_endpoint(
        "Revoke a token (RFC 7009)", "TokenActionRequest", _json("Empty", "Revoked, or nothing to revoke")))

    token_query = {"name": "token", "in": "query", "required": False, "schema": {"type": "string"}}
    ops["/oauth/revoke"] = ({"post": {
        "summary": "Revoke the whole grant of the presented token (when it is in force)", "parameters": [token_query],
        "security": [{}, {"bearer": []}],
        "responses": {"200": _json("Empty", "Always"), "503": UNAVAILABLE}}})
    ops["/oauth/sign-out"] = ({"post": {
        "summary": "End the web session; revoke `token` when given and in force", "parameters": [token_query],
        "responses": {"200": _json("Empty", "Signed out"), "400": OAUTH_400,
                      "403": _json("Detail", "Session cookie without XSRF"),
                      "413": TOO_LARGE, "422": INVALID, "503": UNAVAILABLE}}})
    ops["/oauth/clients"] = ({"get": {
        "summary": "Every registered client",
        "responses": {"200": {"description": "The clients", "content": {JSON: {"schema": {
            "type": "array", "items": {"$ref": "#/components/schemas/OAuthClient"}}}}}, "503": UNAVAILABLE}}})
    client_id = {"name": "client_id", "in": "path", "required": True, "schema": {"type": "string"}}
    ops["/oauth/clients/{client_id}"] = ({"get": {
        "summary": "One registered client", "parameters": [client_id],
        "responses": {"200": _json("OAuthClient", "The client"), "404": NOT_FOUND, "422": INVALID,
                      "503": UNAVAILABLE}}})

    authorize_parameters = [
        {"name": name, "in": "query", "required": False, "schema": {"type": "string"}}
        for name in ("response_type", "client_id", "redirect_uri", "scope", "state", "code_challenge",
                     "code_challenge_method", "installation_id")]
    ops["/oauth/authorize"] = ({"get": {
        "summary": "Authorization request (RFC 6749 §4.1.1, PKCE S256 required)",
        "parameters": authorize_parameters,
        "responses": {"200": _html("Consent page"), "302": _redirect("To the client (code or error) or to sign-in"),
                      "400": _html("Unknown client or unregistered redirect_uri: never redirected"),
                      "503": _html("The store does not answer")}},
        "post": {
        "summary": "The consent page's answer (form: the request's parameters, decision=allow|deny, _xsrf)",
        "requestBody": {"required": True, "content": {FORM: {"schema": {"type": "object"}}}},
        "responses": {"200": _html("Consent page again (no decision)"),
                      "302": _redirect("To the client: a code (allow) or access_denied (deny); or to sign-in"),
                      "400": _html("Unknown client or unregistered redirect_uri: never redirected"),
                      "403": _html("No valid XSRF token"), "413": _html("Body too large"),
                      "503": _html("The store does not answer")}}})
    ops["/login"] = ({
        "get": {"summary": "Sign-in page",
                "parameters": [{"name": "next", "in": "query", "required": False, "schema": {"type": "string"}}],
                "responses": {"200": _html("The form")}},
        "post": {"summary": "Sign in (form: username, password, next, _xsrf): sets the session cookie",
                 "requestBody": _form("LoginForm"),
                 "responses": {"302": _redirect("Signed in: on to next (a same-site path)"),
                               "400": _html("The form again: a field is missing"),
                               "401": _html("The form again: wrong username or password"),
                               "403": _html("No valid XSRF token"), "413": _html("Body too large"),
                               "429": _html("The form again: too many failed attempts"),
                               "503": _html("The store does not answer")}},
    })
    ops["/"] = {"get": {"summary": "Home page: who is signed in, and where the endpoints are",
                        "responses": {"200": _html("The page"), "503": _html("The store does not answer")}}}
    ops["/logout"] = {
        "get": {"summary": "The signed-out page (or, signed in, a sign-out button)",
                "responses": {"200": _html("The page")}},
        "post": {"summary": "The pages' sign-out button (form: _xsrf, and next to sign in again there)",
                 "responses": {"303": _redirect("To the signed-out page, or to sign-in (next)"),
                               "403": _html("No valid XSRF token"), "413": _html("Body too large"),
                               "503": _html("The store does not answer")}}}
    ops["/account"] = {
        "get": {"summary": "The signed-in user's page: connected apps (Remove), paired installations (Unpair), "
                           "sessions (sign out), sign-out; ?remove= and ?unpair= ask for confirmation",
                "responses": {"200": _html("The page"), "303": _redirect("Signed out: to sign-in, then back"),
                              "503": _html("The store does not answer")}},
        "post": {"summary": "A button of the account page (form: action=remove|unpair|end-session|end-others, "
                            "client_id, installation_id or session_id, _xsrf)",
                 "responses": {"303": _redirect("Back to the account page, saying what happened; or to sign-in"),
                               "403": _html("No valid XSRF token; or an installation one may not unpair"),
                               "413": _html("Body too large"), "422": _html("A field is not valid"),
                               "503": _html("The store does not answer")}},
    }
    bearer_security: list[dict[str, list[str]]] = [{"bearer": []}]
    ops["/v1/me"] = ({"get": {
        "summary": "Who the token or session acts for (scope read)", "security": bearer_security,
        "responses": {"200": _json("Me", "The subject"), "401": BEARER_401, "403": FORBIDDEN,
                      "503": UNAVAILABLE}}})
    ops["/v1/me/connected-apps"] = ({"get": {
        "summary": "Clients holding an active grant of this user (scope read: the session cookie or a first-party "
                   "client's token; a third-party client's token needs connected-apps:read itself)",
        "security": bearer_security,
        "responses": {"200": {"description": "The apps", "content": {JSON: {"schema": {
            "type": "array", "items": {"$ref": "#/components/schemas/ConnectedApp"}}}}},
            "401": BEARER_401, "403": FORBIDDEN, "503": UNAVAILABLE}}})
    ops["/v1/me/connected-apps/{client_id}"] = ({"delete": {
        "summary": "Revoke the grant of a client and all its tokens (scope connected-apps:write)",
        "security": bearer_security, "parameters": [client_id],
        "responses": {"204": {"description": "Revoked"}, "401": BEARER_401, "403": FORBIDDEN, "404": NOT_FOUND,
                      "422": INVALID, "503": UNAVAILABLE}}})
    session_id = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
    ops["/v1/me/sessions"] = {"get": {
        "summary": "Where the user is signed in: browser, address, when; the current one marked (scope read: the "
                   "session cookie or a first-party client's token; a third-party client's token needs sessions:read "
                   "itself)",
        "security": bearer_security,
        "responses": {"200": {"description": "The sessions", "content": {JSON: {"schema": {
            "type": "array", "items": {"$ref": "#/components/schemas/Session"}}}}},
            "401": BEARER_401, "403": FORBIDDEN, "503": UNAVAILABLE}}}
    ops["/v1/me/sessions/{session_id}"] = {"delete": {
        "summary": "Sign one of the user's sessions out (scope sessions:write; write covers it)",
        "security": bearer_security, "parameters": [session_id],
        "responses": {"204": {"description": "Signed out"}, "401": BEARER_401, "403": FORBIDDEN,
                      "404": NOT_FOUND, "422": INVALID, "503": UNAVAILABLE}}}
    ops["/v1/ws"] = {"get": {
        "summary": "WebSocket (scope read): the token as access_token, in Authorization, or the session cookie. "
                   "Sends a welcome, echoes text, closes with 4401 when its authorization ends",
        "security": [{"bearer": []}],
        "parameters": [{"name": "access_token", "in": "query", "required": False, "schema": {"type": "string"}}],
        "responses": {"101": {"description": "Upgraded to a WebSocket"},
                      "400": {"description": "Not a WebSocket upgrade request"},
                      "401": BEARER_401, "403": FORBIDDEN, "503": UNAVAILABLE}}}
    ops["/.well-known/oauth-authorization-server"] = ({"get": {
        "summary": "Authorization server metadata (RFC 8414)",
        "responses": {"200": _json("Metadata", "Metadata, made from the configuration (never 503)")}}})
    ops["/healthz"] = ({"get": {"summary": "The process is alive, and the release it runs",
                                "responses": {"200": _json("Health", "Alive")}}})
    ops["/readyz"] = ({"get": {"summary": "The store answers",
                                             "responses": {"200": _json("Status", "Ready"), "503": UNAVAILABLE}}})
    ops["/metrics"] = ({"get": {
        "summary": "Prometheus metrics (text exposition), to callers in metrics.allow",
        "responses": {"200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                      "404": NOT_FOUND}}})
    ops["/openapi.json"] = ({"get": {"summary": "This document",
                                                   "responses": {"200": {"description": "OpenAPI 3.1"}}}})
    return ops


def render(routes: Iterable[Route], base_url: str, *, admin: bool = False) -> str:
    return json.dumps(build(routes, base_url, admin=admin), indent=2, sort_keys=True) + "\n"


def _admin_operations() -> dict[str, dict[str, Any]]:
    """The admin API's routes: what each method takes and answers."""
    sec: list[dict[str, list[str]]] = [{"bearer": []}]
    refused = {"401": BEARER_401, "403": FORBIDDEN, "429": TOO_MANY, "503": UNAVAILABLE}
    conflict = _json("Detail", "Already there")

    def op(summary: str, ok: dict[str, Any], *, body: str | None = None, extra: dict[str, Any] | None = None,
           parameters: list[dict[str, Any]] | None = None, status: str = "200") -> dict[str, Any]:
        operation: dict[str, Any] = {"summary": summary, "security": sec, "tags": ["admin"],
                                     "responses": {status: ok, **refused, "422": INVALID, **(extra or {})}}
        if body:
            operation["requestBody"] = {"required": True, "content": {JSON: {"schema": {
                "$ref": f"#/components/schemas/{body}"}}}}
        if parameters:
            operation["parameters"] = parameters
        return operation

    def path(name: str) -> dict[str, Any]:
        return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}

    def query(name: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "schema": {"type": "string"}}

    def page(item: str) -> dict[str, Any]:
        return {"description": "A page", "content": {JSON: {"schema": {"type": "object", "properties": {
            "items": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}},
            "next": {"type": ["string", "null"]}}}}}}

    def listed(item: str) -> dict[str, Any]:
        return {"description": "The list", "content": {JSON: {"schema": {
            "type": "array", "items": {"$ref": f"#/components/schemas/{item}"}}}}}

    done = {"description": "Done", "content": {JSON: {"schema": {"type": "object"}}}}
    paging = [query("limit"), query("cursor")]
    missing = {"404": NOT_FOUND}
    return {
        "/admin": {"get": {"summary": "Where to get an admin's token (tokensvc login starts here)", "responses": {
            "200": {"description": "The service's token endpoints and the CLI's client"}}}},
        "/admin/clients": {
            "get": op("Registered clients, a page at a time", page("AdminClient"), parameters=paging),
            "post": op("Register a client (a generated id); its secret once", _json("AdminClient", "Registered"),
                       body="ClientBody", extra={"409": conflict}, status="201")},
        "/admin/clients/{client_id}": {
            "get": op("One client", _json("AdminClient", "The client"), parameters=[path("client_id")], extra=missing),
            "put": op("Create or replace a client (idempotent)", _json("AdminClient", "Replaced; 201 created"),
                      body="ClientBody", parameters=[path("client_id")],
                      extra={"201": _json("AdminClient", "Created")}),
            "patch": op("Change some of a client's fields", _json("AdminClient", "Changed"), body="ClientPatch",
                        parameters=[path("client_id")], extra=missing),
            "delete": op("Remove a client at once, then revoke its grants in bulk", done,
                         parameters=[path("client_id")], extra=missing)},
        "/admin/clients/{client_id}/secret": {"post": op("A new secret, returned once", done,
                                                         parameters=[path("client_id")], extra=missing)},
        "/admin/users": {
            "get": op("Users, a page at a time", page("AdminUser"), parameters=paging),
            "post": op("Add a user (the password rule applies)", _json("AdminUser", "Added"), body="UserBody",
                       extra={"409": conflict}, status="201")},
        "/admin/users/{username}": {
            "get": op("One user", _json("AdminUser", "The user"), parameters=[path("username")], extra=missing),
            "patch": op("Make a user an admin, or not", _json("AdminUser", "Changed"), body="UserPatch",
                        parameters=[path("username")], extra=missing),
            "delete": op("Remove a user, revoking their grants and ending their sessions", done,
                         parameters=[path("username")], extra=missing)},
        "/admin/users/{username}/password": {"put": op(
            "Set a password: ends the user's sessions, revokes their grants unless keepGrants", done,
            body="PasswordBody", parameters=[path("username")], extra=missing)},
        "/admin/users/{username}/sessions": {
            "get": op("A user's sessions", listed("AdminSession"), parameters=[path("username")], extra=missing),
            "delete": op("End every session of a user", done, parameters=[path("username")], extra=missing)},
        "/admin/users/{username}/sessions/{session_id}": {"delete": op(
            "End one session of a user", done, parameters=[path("username"), path("session_id")], extra=missing)},
        "/admin/installations": {"get": op("Installations, a page at a time", page("AdminInstallation"),
                                           parameters=paging)},
        "/admin/installations/{installation_id}": {
            "get": op("One installation", _json("AdminInstallation", "The installation"),
                      parameters=[path("installation_id")], extra=missing),
            "put": op("Create or replace an installation (operators by username)",
                      _json("AdminInstallation", "Replaced; 201 created"), body="InstallationBody",
                      parameters=[path("installation_id")],
                      extra={"201": _json("AdminInstallation", "Created")}),
            "delete": op("Remove an installation, revoking its grants", done, parameters=[path("installation_id")],
                         extra=missing)},
        "/admin/grants": {"get": op("The live grants of a user (username) and/or a client (clientId)",
                                    page("Grant"), parameters=[query("username"), query("clientId"), *paging])},
        "/admin/grants/{grant_id}": {"delete": op("Revoke a grant and all its tokens", done,
                                                  parameters=[path("grant_id")], extra=missing)},
        "/admin/tokens/revoke": {"post": op("Revoke a token by its value", done, body="TokenBody")},
        "/admin/tokens/introspect": {"post": op("What introspection says of a token",
                                                _json("IntrospectionResponse", "RFC 7662"), body="TokenBody")},
        "/admin/purge": {"post": op("Delete expired codes, tokens and sessions", done)},
        "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1"}}}},
    }
