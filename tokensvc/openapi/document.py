"""The OpenAPI 3.1 documents of the public listener and of the admin listener, built by apispec
from the marshmallow schemas (the operations are listed here and in :mod:`.openapi_admin`;
every body schema comes from ``schemas.py`` or ``admin/schemas.py``).

A document says what the service does, no more and no less: every constraint it enforces on an
input (patterns, lengths, enums, which parameters are required), every status and body shape it
answers, and how a caller authenticates. ``tests/test_fuzz.py`` holds it to that with
schemathesis. The paths and methods come from the route table: a route whose methods are not
all described here, or a description of a route that does not exist, stops the build.
``tokensvc openapi`` prints it; ``docs/openapi.json`` and ``docs/admin-openapi.json`` are
checked-in copies that a test keeps current; the service serves it at ``GET /openapi.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin

from tokensvc import __version__, identifiers, schemas
from tokensvc.admin import schemas as admin_schemas
from tokensvc.oauth.authorization import MAX_PARAMETER_LENGTH
from tokensvc.oauth.feed import CLOSE_CREDENTIALS, CLOSE_PING_TIMEOUT, CLOSE_RESTART, CLOSE_TOO_SLOW
from tokensvc.openapi import admin as openapi_admin
from tokensvc.openapi.parts import (
    BASIC_CHALLENGE,
    BEARER_401,
    CLIENT_401,
    FORBIDDEN,
    FORBIDDEN_OR_XSRF,
    FORM,
    HANDSHAKE_400,
    ID_PATTERN,
    INVALID,
    NO_STORE,
    NOT_FOUND,
    OAUTH_400,
    PAGE_503,
    RETRY_AFTER,
    TOO_LARGE,
    TOO_MANY,
    UNAVAILABLE,
    UPGRADE_426,
    WEBSOCKET_HANDSHAKE,
    client_id_path,
    form_body,
    html,
    json_answer,
    listed,
    one_of_shapes,
    parameter,
    redirect,
    ref,
    session_id_path,
)

OAUTH_API_VERSION = "2.0.0"  # the interface's label of the OAuth API
SESSION_COOKIE = "tokensvc_session"  # the demo's; the served document names the configured one


class Route(Protocol):
    """An entry of the route table (``tokensvc.handlers.edge.routes.Route``)."""

    @property
    def path(self) -> str: ...

    @property
    def methods(self) -> frozenset[str]: ...

def token_endpoint(summary: str, request: str, ok: dict[str, Any], *, auth: bool = True,
                   extra: dict[str, Any] | None = None,
                   security: tuple[str, ...] = ("clientBasic",)) -> dict[str, Any]:
    """A token endpoint's POST. Its ``security``: the empty alternative is a caller whose
    credentials are in the body (client_id, and client_secret for a confidential client), which
    no security scheme can state; then each of the schemes ``security`` names."""
    responses: dict[str, Any] = {"200": ok, "400": OAUTH_400, "413": TOO_LARGE, "422": INVALID, "503": UNAVAILABLE}
    if auth:
        responses.update({"401": CLIENT_401, "429": TOO_MANY})
    responses.update(extra or {})
    return {"post": {"summary": summary, "requestBody": form_body(request), "responses": responses,
                     "security": [{}, *({scheme: []} for scheme in security)]}}


CORS_PREFLIGHT: dict[str, Any] = {
    "summary": "CORS preflight of a browser app: the origins of public clients' redirect URIs and of "
               "clients' allowed_origins get Access-Control-Allow-Origin; never Allow-Credentials",
    "responses": {"204": {"description": "Preflight answered (without Access-Control-Allow-Origin to any other "
                                         "origin)", "headers": {
        name: {"schema": {"type": "string"}} for name in ("Access-Control-Allow-Origin", "Access-Control-Allow-Methods",
                                                          "Access-Control-Allow-Headers", "Access-Control-Max-Age",
                                                          "Vary")}}}}

GENERAL = ("Every path answers 405 with Allow to a method it does not have, HEAD wherever GET is, 404 "
           "{\"detail\"} where no route is, and 400 {\"detail\"} to a Host name the service is not configured "
           "for (only /healthz and /readyz answer any). A body over 64 KiB is 413 (but at /oauth/revoke, which "
           "never reads its body and answers 200); a path and query over 64 KiB are 414, and header fields over "
           "64 KiB together 431, each {\"detail\"} (a page's error page at a page); a request head over 1 MiB "
           "is no request a client sends, and its connection is closed unanswered. A browser that prefers "
           "text/html to JSON (by Accept's q-values) navigating to a JSON address gets the 404, 405 or 5xx as "
           "an HTML page.")


def build(routes: Iterable[Route], base_url: str, *, admin: bool = False, auth_url: str | None = None,
          session_cookie: str = SESSION_COOKIE, kinds: Sequence[str] = identifiers.DEFAULT_KINDS) -> dict[str, Any]:
    """The document of ``routes`` (the route table, ``tokensvc.app.ROUTES``, or with ``admin``
    the admin listener's, ``tokensvc.app.ADMIN_ROUTES``) of a service reached at ``base_url``,
    its pages at ``auth_url`` (default: ``base_url``), its web session in ``session_cookie``,
    its installations of the ``kinds`` configured."""
    spec = APISpec(
        title="tokensvc admin API" if admin else "tokensvc", version=__version__ if admin else OAUTH_API_VERSION,
        openapi_version="3.1.0", plugins=[MarshmallowPlugin()],
        info={"description": ("The operators' API of tokensvc, on its own listener ([admin]): an admin user's "
                              "access token with the admin scope. " if admin
                              else "OAuth 2.0 authorization and token service (OAuth API 2.0.0). ") + GENERAL},
        servers=[{"url": base_url, "description": "the admin listener" if admin else "base_url"}],
    )
    for name, schema in (
        ("TokenRequest", schemas.TokenRequestSchema), ("RefreshRequest", schemas.RefreshRequestSchema),
        ("TokenActionRequest", schemas.TokenActionSchema), ("IntrospectionRequest", schemas.IntrospectionRequestSchema),
        ("LoginForm", schemas.LoginFormSchema),
        ("TokenResponse", schemas.TokenResponseSchema), ("IntrospectionResponse", schemas.IntrospectionResponseSchema),
        ("OAuthClient", schemas.OAuthClientSchema), ("OAuthError", schemas.OAuthErrorSchema),
        ("Detail", schemas.DetailSchema), ("HTTPValidationError", schemas.HTTPValidationErrorSchema),
        ("Empty", schemas.EmptySchema), ("Metadata", schemas.MetadataSchema), ("Me", schemas.MeSchema),
        ("ConnectedApp", schemas.ConnectedAppSchema), ("Status", schemas.StatusSchema),
        ("NotReady", schemas.NotReadySchema), ("Health", schemas.HealthSchema),
        ("Session", schemas.SessionSchema), ("FeedReady", schemas.FeedReadySchema),
        ("FeedRevoked", schemas.FeedRevokedSchema), ("FeedFlush", schemas.FeedFlushSchema),
        ("FeedFull", schemas.FeedFullSchema),
    ):
        spec.components.schema(name, schema=schema)
    spec.components.security_scheme("bearer", {"type": "http", "scheme": "bearer",
                                               "description": "An access token (RFC 6750 §2.1)"})
    if admin:
        for name, admin_schema in admin_schemas.COMPONENTS.items():
            spec.components.schema(name, schema=admin_schema)
        operations = openapi_admin.operations()
    else:
        spec.components.security_scheme("clientBasic", {
            "type": "http", "scheme": "basic",
            "description": "client_secret_basic (RFC 6749 §2.3.1): the client id and secret, each form-urlencoded"})
        spec.components.security_scheme("session", {
            "type": "apiKey", "in": "cookie", "name": session_cookie,
            "description": "The web session the sign-in page sets (HttpOnly, SameSite=Lax). An unsafe request "
                           "that carries it must repeat the _xsrf cookie in X-XSRFToken (403 otherwise); a "
                           "WebSocket it authorizes must come from the service's own origin."})
        spec.components.security_scheme("accessTokenQuery", {
            "type": "apiKey", "in": "query", "name": "access_token",
            "description": "An access token in the query string: the WebSocket only, where browsers cannot set "
                           "headers (RFC 6750 §2.3)"})
        operations = _operations()
    pages_server = [{"url": auth_url or base_url, "description": "auth_url: the authorization service's pages"}]
    for route in routes:
        documented = operations.pop(route.path, {})
        served = {method.lower() for method in route.methods if method != "HEAD"}
        if "options" in served and "options" not in documented:
            preflight = CORS_PREFLIGHT if "{" not in route.path else {
                **CORS_PREFLIGHT, "responses": {**CORS_PREFLIGHT["responses"], "422": INVALID}}
            documented = {**documented, "options": preflight}
        path_parameters = documented.pop("parameters", None)
        if set(documented) != served:
            raise ValueError(f"{route.path}: served {sorted(served)}, documented {sorted(documented)}")
        spec.path(route.path, operations=documented, parameters=path_parameters)
    if operations:
        raise ValueError(f"documented but not routed: {sorted(operations)}")
    document = spec.to_dict()
    if admin:
        openapi_admin.add_rules(document["components"]["schemas"], kinds)
    else:
        _form_rules(document["components"]["schemas"])
        for path in PAGES:
            document["paths"][path]["servers"] = pages_server
    return document


FORMS_WITH_A_CLIENT = ("TokenRequest", "RefreshRequest", "TokenActionRequest", "IntrospectionRequest")
INTROSPECTION_CLIENT = (
    "Required on every call (the interface): the client's id; with an admin's bearer token (Authorization: "
    "Bearer, the admin scope), the client the token was issued to (401 for another). A client authenticating "
    "with HTTP Basic (clientBasic) carries it there instead; sent in both, they must be the same.")
PAGES = ("/oauth/authorize", "/login", "/logout", "/account", "/")  # served at auth_url


def _form_rules(components: dict[str, Any]) -> None:
    """What the form bodies' schemas cannot say by themselves: an empty value is an absent one
    (so a required field is at least one character), and every token-endpoint call names its
    client (in the body, or in HTTP Basic credentials)."""
    for name in FORMS_WITH_A_CLIENT:
        component = components[name]
        component["required"] = sorted({*component.get("required", []), "client_id"})
        component["properties"]["client_id"]["description"] = (
            "Required on every call (the interface): the client's id. A client authenticating with HTTP Basic "
            "(clientBasic) carries it there instead; sent in both, they must be the same.")
    components["IntrospectionRequest"]["properties"]["client_id"]["description"] = INTROSPECTION_CLIENT
    for name in (*FORMS_WITH_A_CLIENT, "LoginForm"):
        component = components[name]
        for field in component.get("required", []):
            component["properties"][field]["minLength"] = 1
    components["LoginForm"]["properties"]["_xsrf"] = XSRF_FIELD


XSRF_FIELD = {"type": "string", "description": (
    "The form's XSRF token: the _xsrf cookie's value, repeated here or in the X-XSRFToken header (403 "
    "without it, or from another origin; an empty value is absent)")}


def page_form(required: Iterable[str] = (), **properties: Any) -> dict[str, Any]:
    """A page's form body: its fields (those ``required`` at least one character, as an empty
    value is an absent one), and the XSRF token every page form carries."""
    required = sorted(required)
    for name in required:
        properties[name] = {"minLength": 1, **properties[name]}
    schema: dict[str, Any] = {"type": "object", "properties": {**properties, "_xsrf": XSRF_FIELD}}
    if required:
        schema["required"] = required
    return {"required": True, "content": {FORM: {"schema": schema}}}


def _operations() -> dict[str, dict[str, Any]]:
    """What each public route's methods take and answer, by path; ``parameters`` are the
    path's own (every method of it takes them)."""
    ops: dict[str, dict[str, Any]] = {}
    token_ok = json_answer("TokenResponse", "Tokens issued", NO_STORE)
    ops["/oauth/token"] = token_endpoint("Exchange an authorization code (PKCE) for tokens", "TokenRequest", token_ok)
    ops["/oauth/token/refresh"] = token_endpoint("Rotate a refresh token", "RefreshRequest", token_ok)
    ops["/oauth/token/introspect"] = token_endpoint(
        "Introspect a token (RFC 7662): a resource server or a first-party confidential client (its secret in HTTP "
        "Basic, clientBasic, "
        "or as client_secret in the body, which no security scheme can state), or an admin's bearer token with the "
        "admin scope (bearer)", "IntrospectionRequest",
        json_answer("IntrospectionResponse", "Token metadata", NO_STORE), extra={"403": FORBIDDEN},
        security=("clientBasic", "bearer"))
    ops["/oauth/token/revoke"] = token_endpoint("Revoke a token (RFC 7009)", "TokenActionRequest",
                                                json_answer("Empty", "Revoked, or nothing to revoke", NO_STORE))

    ops["/oauth/revoke"] = {"post": {
        "summary": "Revoke the whole grant of each presented token in force (the bearer token, and token); "
                   "the body is never read",
        "parameters": [parameter("token", "query", "Any value: one that is no token in force revokes nothing")],
        "security": [{}, {"bearer": []}],
        "responses": {"200": json_answer("Empty", "Always, but for the store being down with a token presented",
                                         NO_STORE),
                      "503": UNAVAILABLE}}}
    ops["/oauth/sign-out"] = {"post": {
        "summary": "End the web session; revoke token when given and in force",
        "parameters": [parameter("token", "query", maxLength=512)],
        "security": [{}, {"session": []}],
        "responses": {"200": json_answer("Empty", "Signed out", NO_STORE), "400": OAUTH_400,
                      "403": json_answer("Detail", "Session cookie without its XSRF token"),
                      "413": TOO_LARGE, "422": INVALID, "503": UNAVAILABLE}}}
    ops["/oauth/clients"] = {"get": {
        "summary": "Every registered client", "responses": {"200": listed("OAuthClient", "The clients"),
                                                            "503": UNAVAILABLE}}}
    ops["/oauth/clients/{client_id}"] = {"parameters": [client_id_path("")], "get": {
        "summary": "One registered client",
        "responses": {"200": json_answer("OAuthClient", "The client"), "404": NOT_FOUND, "422": INVALID,
                      "503": UNAVAILABLE}}}

    ops["/oauth/authorize"] = {"get": {
        "summary": "Authorization request (RFC 6749 §4.1.1, PKCE S256 required). An unregistered client or "
                   "redirect_uri is an error page, never a redirect; any other fault goes back to the client's "
                   "redirect_uri as error (RFC 6749 §4.1.2.1)",
        "parameters": _authorize_parameters(),
        "security": [{}, {"session": []}],
        "responses": {"200": html("Signed in: the consent page (third-party) or the pairing page (installation)"),
                      "302": redirect("To sign-in; or to the client with a code, or with an error"),
                      "400": html("No client, an unregistered one, or a redirect_uri it did not register (or a "
                                  "repeated client_id or redirect_uri): never redirected"),
                      "503": PAGE_503}},
        "post": {
        "summary": "The consent, pairing or one-click page's answer (the request's parameters again, decision, "
                   "_xsrf, _shown)",
        "requestBody": page_form([parameter["name"] for parameter in _authorize_parameters() if parameter["required"]],
                                 **{parameter["name"]: parameter["schema"] for parameter in _authorize_parameters()},
                                 decision={"type": "string", "enum": ["allow", "deny"]},
                                 _shown={"type": "string", "maxLength": 128, "description": (
                                     "When the page was shown, as its form says it (signed): an allow sooner than "
                                     "half a second after, or more than ten minutes after, is taken for none, and "
                                     "the page is shown again")}),
        "security": [{}, {"session": []}],
        "responses": {"200": html("The page again (no decision; an allow sooner than the page could be read, or "
                                  "long after it was shown; or the form had expired: 403)"),
                      "302": redirect("To the client: a code (allow) or access_denied (deny); or an error"),
                      "303": redirect("Not signed in: to sign-in"),
                      "400": html("Unknown client or unregistered redirect_uri: never redirected"),
                      "403": html("No valid XSRF token, or not from this service's origin"),
                      "413": html("Body too large"), "503": PAGE_503}}}
    ops["/login"] = {
        "get": {"summary": "Sign-in page",
                "parameters": [parameter("next", "query", "A same-site path to go on to (anything else: /)")],
                "responses": {"200": html("The form"), "503": PAGE_503}},
        "post": {"summary": "Sign in: sets the session cookie",
                 "requestBody": form_body("LoginForm"),
                 "responses": {"302": redirect("Signed in: on to next (a same-site path)"),
                               "400": html("The form again: a field is missing"),
                               "401": html("The form again: wrong username or password"),
                               "403": html("The form again: it had expired (no valid XSRF token)"),
                               "413": html("Body too large"),
                               "429": html("The form again: too many failed attempts", RETRY_AFTER),
                               "503": PAGE_503}},
    }
    ops["/"] = {"get": {"summary": "Home page: who is signed in, and where the endpoints are",
                        "security": [{}, {"session": []}],
                        "responses": {"200": html("The page"), "503": PAGE_503}}}
    ops["/logout"] = {
        "get": {"summary": "The signed-out page (or, signed in, a sign-out button)", "security": [{}, {"session": []}],
                "responses": {"200": html("The page"), "503": PAGE_503}},
        "post": {"summary": "The pages' sign-out button (and next: sign in again there)",
                 "requestBody": page_form(next={"type": "string"}), "security": [{}, {"session": []}],
                 "responses": {"303": redirect("To the signed-out page, or to sign-in (next)"),
                               "403": html("No valid XSRF token"), "413": html("Body too large"),
                               "503": PAGE_503}}}
    ops["/account"] = {
        "get": {"summary": "The signed-in user's page: connected apps (Remove), paired installations (Unpair), "
                           "sessions (sign out), sign-out",
                "parameters": [parameter("remove", "query", "A client id: ask to confirm its removal"),
                               parameter("unpair", "query", "An installation id: ask to confirm unpairing it")],
                "security": [{}, {"session": []}],
                "responses": {"200": html("The page"), "303": redirect("Signed out: to sign-in, then back"),
                              "503": PAGE_503}},
        "post": {"summary": "A button of the account page",
                 "requestBody": page_form(
                     ["action"], action={"type": "string", "enum": ["remove", "unpair", "end-session", "end-others"]},
                     client_id={"type": "string", "pattern": ID_PATTERN, "maxLength": 128},
                     installation_id={"type": "string", "pattern": ID_PATTERN, "maxLength": 128},
                     session_id={"type": "string", "maxLength": 64}),
                 "security": [{}, {"session": []}],
                 "responses": {"303": redirect("Back to the account page, saying what happened; or to sign-in"),
                               "403": html("No valid XSRF token; or an installation one may not unpair"),
                               "413": html("Body too large"), "422": html("A field is not valid"),
                               "503": PAGE_503}},
    }
    bearer_or_session: list[dict[str, list[str]]] = [{"bearer": []}, {"session": []}]
    ops["/v1/me"] = {"get": {
        "summary": "Who the token or session acts for (scope read)", "security": bearer_or_session,
        "responses": {"200": json_answer("Me", "The subject"), "401": BEARER_401, "403": FORBIDDEN,
                      "503": UNAVAILABLE}}}
    ops["/v1/me/connected-apps"] = {"get": {
        "summary": "Clients holding an active grant of this user (scope read: the session cookie or a first-party "
                   "client's token; a third-party client's token needs connected-apps:read itself; a user's, not "
                   "an installation's)",
        "security": bearer_or_session,
        "responses": {"200": listed("ConnectedApp", "The apps"), "401": BEARER_401, "403": FORBIDDEN,
                      "503": UNAVAILABLE}}}
    ops["/v1/me/connected-apps/{client_id}"] = {"parameters": [client_id_path("")], "delete": {
        "summary": "Revoke the grant of a client and all its tokens (scope connected-apps:write; write covers it)",
        "security": bearer_or_session,
        "responses": {"204": {"description": "Revoked"}, "401": BEARER_401, "403": FORBIDDEN_OR_XSRF,
                      "404": NOT_FOUND, "413": TOO_LARGE, "422": INVALID, "503": UNAVAILABLE}}}
    ops["/v1/me/sessions"] = {"get": {
        "summary": "Where the user is signed in: browser, address, when; the current one marked (scope read: the "
                   "session cookie or a first-party client's token; a third-party client's token needs sessions:read "
                   "itself)",
        "security": bearer_or_session,
        "responses": {"200": listed("Session", "The sessions"), "401": BEARER_401, "403": FORBIDDEN,
                      "503": UNAVAILABLE}}}
    ops["/v1/me/sessions/{session_id}"] = {
        "parameters": [session_id_path("As GET /v1/me/sessions names it")], "delete": {
            "summary": "Sign one of the user's sessions out (scope sessions:write; write covers it)",
            "security": bearer_or_session,
            "responses": {"204": {"description": "Signed out"}, "401": BEARER_401, "403": FORBIDDEN_OR_XSRF,
                          "404": NOT_FOUND, "413": TOO_LARGE, "422": INVALID, "503": UNAVAILABLE}}}
    ops["/oauth/revocations"] = {"get": {
        "summary": "The revocation feed (WebSocket): for a client that may introspect, in HTTP Basic. Sends a ready "
                   "message, then one message per revocation naming what a cache of introspection answers must "
                   "drop (never a token or its hash), each numbered on this process's stream. A reader that "
                   "reconnects passes stream and after: it gets the messages it missed, or resumed false (flush). "
                   "Refused before the upgrade, in JSON",
        "security": [{"clientBasic": []}],
        "parameters": [
            *WEBSOCKET_HANDSHAKE,
            parameter("stream", "query", "The stream of the last message seen (its ready message names it)",
                      pattern=schemas.FEED_STREAM.pattern, maxLength=16),
            parameter("after", "query", "The seq of the last message seen on that stream",
                      pattern=schemas.FEED_SEQ.pattern, maxLength=15)],
        "responses": {"101": {"description": "Upgraded to a WebSocket"},
                      "400": HANDSHAKE_400,
                      "401": json_answer("OAuthError", "No Basic client credentials, or wrong ones, or a public "
                                         "client's (invalid_client)", {"WWW-Authenticate": {
                                             **BASIC_CHALLENGE["WWW-Authenticate"], "required": True}}),
                      "403": json_answer(one_of_shapes("OAuthError", "Detail"), "A client that may not introspect "
                                         "(access_denied); or a page of another origin ({\"detail\"})"),
                      "422": INVALID, "426": UPGRADE_426,
                      "429": json_answer(one_of_shapes("OAuthError", "FeedFull"), "Too many failed authentications "
                                         "(too_many_requests); or the client has as many readers open in this "
                                         "process as feed.max_readers_per_client allows (FeedFull, reason "
                                         "client_cap)", RETRY_AFTER),
                      "503": json_answer(one_of_shapes("Detail", "FeedFull"), "The store does not answer; or the "
                                         "process has as many readers open as feed.max_readers allows, or is "
                                         "stopping (FeedFull, reason process_cap or stopping): connect again, "
                                         "another process may have room", RETRY_AFTER)},
        "x-websocket-messages": {
            "description": "Server to client, JSON text frames; the client sends nothing (a ping is answered, as "
                           "RFC 6455 asks). Cache keys: the introspection answer's family_id, grant_id, client_id "
                           "and sub. ready first (with the missed messages after it when resumed), then revoked "
                           "and flush, each with the next seq of the stream",
            "oneOf": [ref("FeedReady"), ref("FeedRevoked"), ref("FeedFlush")]},
        "x-websocket-close-codes": {
            str(CLOSE_PING_TIMEOUT): "\"ping timed out\": the reader answered no ping within "
                                     "feed.ping_timeout_seconds (a reader that answers is never closed for it)",
            str(CLOSE_TOO_SLOW): "The reader did not keep up: over feed.max_unsent_bytes of messages it had not "
                                 "taken. Reconnect with stream and after: resumed, or told to flush",
            str(CLOSE_RESTART): "The process is stopping (service restart): reconnect, to another process",
            str(CLOSE_CREDENTIALS): "The reader's credentials no longer prove a client that may read the feed "
                                    "(its client removed, its secret rotated, or made one that may not "
                                    "introspect): reconnect with the current ones"}}}
    ops["/v1/ws"] = {"get": {
        "summary": "WebSocket (scope read): the token in Authorization, as access_token, or the session cookie "
                   "(then only from the service's own origin). Sends a welcome, echoes text, closes with 4401 "
                   "when its authorization ends. Refused before the upgrade, in JSON",
        "security": [{"bearer": []}, {"accessTokenQuery": []}, {"session": []}],
        "parameters": WEBSOCKET_HANDSHAKE,
        "responses": {"101": {"description": "Upgraded to a WebSocket"},
                      "400": HANDSHAKE_400,
                      "401": BEARER_401,
                      "403": json_answer(one_of_shapes("OAuthError", "Detail"), "Without the read scope "
                                         "(insufficient_scope); or the session cookie from another origin "
                                         "({\"detail\"})"),
                      "426": UPGRADE_426,
                      "503": UNAVAILABLE}}}
    ops["/.well-known/oauth-authorization-server"] = {"get": {
        "summary": "Authorization server metadata (RFC 8414)",
        "responses": {"200": json_answer("Metadata", "Metadata, made from the configuration (never 503)")}}}
    ops["/healthz"] = {"get": {"summary": "The process is alive, and the release it runs",
                               "responses": {"200": json_answer("Health", "Alive")}}}
    ops["/readyz"] = {"get": {"summary": "The store answers",
                              "responses": {"200": json_answer("Status", "Ready"),
                                            "503": json_answer("NotReady", "Not ready, saying why", RETRY_AFTER)}}}
    ops["/metrics"] = {"get": {
        "summary": "Prometheus metrics (text exposition), to callers in metrics.allow",
        "responses": {"200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                      "404": NOT_FOUND}}}
    ops["/openapi.json"] = {"get": {"summary": "This document",
                                    "responses": {"200": json_answer({"type": "object"}, "OpenAPI 3.1")}}}
    return ops


def _authorize_parameters() -> list[dict[str, Any]]:
    """``GET /oauth/authorize``'s query: what is required, and what each may be."""
    longest = MAX_PARAMETER_LENGTH
    return [
        parameter("response_type", "query", required=True, enum=["code"]),
        parameter("client_id", "query", "A registered client", required=True, pattern=ID_PATTERN, maxLength=128),
        parameter("redirect_uri", "query", "One the client registered (a loopback one on any port)", required=True,
                  minLength=1, maxLength=longest),
        parameter("code_challenge", "query", "BASE64URL(SHA-256(code_verifier)) (RFC 7636 §4.2)", required=True,
                  pattern="^[A-Za-z0-9_-]{43}$"),
        parameter("code_challenge_method", "query", required=True, enum=["S256"]),
        parameter("scope", "query", "Space-separated, each one the client registered; absent: all of them",
                  maxLength=longest),
        parameter("state", "query", "Returned untouched", maxLength=longest),
        parameter("installation_id", "query", "Pair this node installation (the user must operate it)",
                  maxLength=longest),
        {"name": "resource", "in": "query", "required": False, "style": "form", "explode": True,
         "description": "RFC 8707 §2, repeatable: the APIs the tokens are meant for, each one a resource server "
                        "declares or tokensvc's own (base_url + /v1); else invalid_target. Absent: every API",
         "schema": {"type": "array", "maxItems": schemas.MAX_RESOURCES, "items": {
             "type": "string", "maxLength": identifiers.RESOURCE_MAX_LENGTH,
             "description": identifiers.RESOURCE_URI_RULE}}},
    ]


def render(routes: Iterable[Route], base_url: str, *, admin: bool = False, auth_url: str | None = None,
           session_cookie: str = SESSION_COOKIE, kinds: Sequence[str] = identifiers.DEFAULT_KINDS) -> str:
    return json.dumps(build(routes, base_url, admin=admin, auth_url=auth_url, session_cookie=session_cookie,
                            kinds=kinds), indent=2, sort_keys=True) + "\n"
