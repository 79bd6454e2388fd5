"""tokensvc.resource.starlette: Starlette's AuthenticationMiddleware with the verifier as its
backend, so that ``starlette.authentication.requires`` guards each route by the token's scopes
(the service's rule), refusals answered as RFC 6750 says, against the service over real HTTP
and its real revocation feed."""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers import DEADLINE, eventually
from test_api import installation_token
from test_resource import asgi_call, http_scope, revoke, started, verifier_for
from test_ws import tokens

from tokensvc.resource.asgi import BearerAuthMiddleware
from tokensvc.resource.bearer import QUERY_TOKEN


def guarded_app(verifier):
    """A Starlette application whose routes each ask for a scope of their own, or none."""
    from starlette.applications import Starlette
    from starlette.authentication import requires
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route, WebSocketRoute

    from tokensvc.resource.starlette import EXCEPTION_HANDLERS, authentication

    def who(request):
        user = request.user
        return {"subject": user.subject, "client_id": user.client_id, "scope": user.scope,
                "installation_id": user.installation_id, "scopes": list(request.auth.scopes),
                "identity": user.identity}

    @requires("read")
    async def notes(request):
        return JSONResponse(who(request))

    @requires("write")
    async def save(request):
        return JSONResponse({"saved": True})

    @requires("observations:read")
    async def observations(request):
        return JSONResponse(who(request))

    async def admin(request):
        request.user.authorized.require("admin")  # the route's own check
        return JSONResponse({"admin": True})

    async def healthz(request):
        return PlainTextResponse(f"ok {request.user.is_authenticated}")

    async def live(websocket):
        await websocket.accept()
        await websocket.send_text("hello " + str(websocket.auth.subject))
        while (await websocket.receive())["type"] != "websocket.disconnect":
            pass

    return Starlette(routes=[Route("/notes", notes), Route("/notes", save, methods=["POST"]),
                             Route("/observations", observations), Route("/admin", admin),
                             Route("/healthz", healthz),
                             WebSocketRoute("/live", live, middleware=[Middleware(BearerAuthMiddleware,
                                                                                  verifier=verifier, scope="read")])],
                     middleware=[authentication(verifier)], exception_handlers=EXCEPTION_HANDLERS)


async def answered(app, path, token=None, method="GET", query=b""):
    """The status, headers and JSON (or text) body ``app`` answers the request with."""
    scope = {**http_scope(path, token), "method": method, "query_string": query}
    sent = await asgi_call(app, scope, [{"type": "http.request", "body": b""}])
    headers = {name.decode(): value.decode() for name, value in sent[0]["headers"]}
    body = sent[1]["body"]
    return sent[0]["status"], headers, (json.loads(body) if headers["content-type"] == "application/json"
                                        else body.decode())


@pytest.mark.gen_test(timeout=90)
async def test_requires_guards_each_route_by_the_tokens_scopes(browser, http_client, base_url):
    """``requires`` per route, judged by the service's rule (``read`` opens
    ``observations:read``); without a token a guarded route is 401 with RFC 6750's bare challenge
    and an unguarded one serves the anonymous user; a token lacking the route's scope is 403
    ``insufficient_scope`` naming it, by ``requires`` or the route's own ``require``."""
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = verifier_for(base_url)
    app = guarded_app(verifier)
    try:
        status, headers, body = await answered(app, "/notes")
        assert (status, headers["www-authenticate"], body) == (401, 'Bearer realm="api"', {
            "error_description": "A bearer token is required"})  # RFC 6750 §3.1: no error without a token
        assert headers["cache-control"] == "no-store"
        status, _, body = await answered(app, "/healthz")
        assert (status, body) == (200, "ok False")  # an unguarded route serves the anonymous user
        status, _, body = await answered(app, "/notes", access)
        assert status == 200 and body["scope"] == "read" and body["scopes"] == ["read"]
        assert body["client_id"] == "webapp" and body["subject"] and body["identity"] == body["subject"]
        assert body["installation_id"] is None
        assert (await answered(app, "/observations", access))[0] == 200  # read covers observations:read
        status, headers, body = await answered(app, "/notes", access, method="POST")
        assert (status, body) == (403, {"error": "insufficient_scope", "error_description":
                                        "The token lacks the scope write", "scope": "write"})
        assert headers["www-authenticate"] == ('Bearer realm="api", error="insufficient_scope", '
                                               'error_description="The token lacks the scope write", scope="write"')
        status, headers, body = await answered(app, "/admin", access)
        assert (status, body["scope"]) == (403, "admin") and 'scope="admin"' in headers["www-authenticate"]
        assert (await answered(app, "/healthz", access))[2] == "ok True"
    finally:
        await verifier.close()  # the backend opened its feed on the first request


@pytest.mark.gen_test(timeout=90)
async def test_a_token_not_in_force_is_refused_before_any_route_as_rfc_6750_says(browser, http_client, base_url):
    """A token that is not active is 401 ``invalid_token`` whatever the route; once revoked, a
    token is refused as soon as the feed (opened by the first request) names it; tokensvc
    away, a token that cannot be checked is 503 with Retry-After, never let through."""
    access = (await tokens(browser, http_client, base_url, scope="read write"))["access_token"]
    verifier = verifier_for(base_url, offline_ttl=3600)
    app = guarded_app(verifier)
    try:
        for path in ("/notes", "/healthz"):
            status, headers, body = await answered(app, path, "x" * 43)
            assert (status, body) == (401, {"error": "invalid_token",
                                            "error_description": "The access token is not active"}), path
            assert headers["www-authenticate"] == ('Bearer realm="api", error="invalid_token", '
                                                   'error_description="The access token is not active"')
        assert (await answered(app, "/notes", access, method="POST"))[2] == {"saved": True}
        await asyncio.wait_for(verifier.connected.wait(), DEADLINE)
        await revoke(http_client, base_url, access)
        await eventually(lambda: verifier.counts.revocations == 1, DEADLINE, what="the feed naming the token")
        assert (await answered(app, "/notes", access))[0] == 401
    finally:
        await verifier.close()
    away = verifier_for("http://127.0.0.1:9", timeout=2)
    try:
        status, headers, body = await answered(guarded_app(away), "/notes", "a" * 43)
        assert (status, headers["retry-after"], body["error"]) == (503, "1", "temporarily_unavailable")
    finally:
        await away.close()


@pytest.mark.gen_test(timeout=90)
async def test_the_user_of_an_installations_token_names_the_installation(browser, http_client, base_url):
    access = await installation_token(browser, http_client, base_url)
    verifier = verifier_for(base_url)
    try:
        status, _, body = await answered(guarded_app(verifier), "/notes", access)
        assert status == 200 and body["installation_id"] == "backyard-scope" == body["subject"]
        assert body["client_id"] == "node-agent"
    finally:
        await verifier.close()


@pytest.mark.gen_test(timeout=90)
async def test_a_query_token_is_masked_in_every_scope_and_a_websocket_route_still_takes_it(browser, http_client,
                                                                                          base_url):
    """The backend masks ``access_token`` in every scope's query (the server's access log writes
    it) and never takes it for HTTP (RFC 6750 §2.3); a WebSocket route guarded by the ASGI
    middleware still takes it, and its socket closes with 4401 when the token is revoked."""
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = await started(verifier_for(base_url))
    app = guarded_app(verifier)
    try:
        scope = {**http_scope("/notes"), "query_string": f"x=1&access%5Ftoken={access}".encode()}
        sent = await asgi_call(app, scope, [{"type": "http.request", "body": b""}])
        assert sent[0]["status"] == 401  # not taken from an HTTP query
        assert scope["query_string"] == b"x=1&access_token=***" and QUERY_TOKEN not in scope
        scope = {**http_scope("/live"), "type": "websocket", "query_string": f"access_token={access}".encode()}
        queue: asyncio.Queue = asyncio.Queue()
        queue.put_nowait({"type": "websocket.connect"})
        sent = []

        async def send(message):
            sent.append(message)

        running = asyncio.ensure_future(app(scope, queue.get, send))
        await eventually(lambda: len(sent) == 2, DEADLINE, what="the socket accepted")
        assert sent[1]["text"].startswith("hello ") and scope["query_string"] == b"access_token=***"
        await revoke(http_client, base_url, access)
        await asyncio.wait_for(running, DEADLINE)
        assert sent[-1] == {"type": "websocket.close", "code": 4401}
        refused = {**scope, "query_string": b"access_token=" + b"n" * 43}
        refused.pop(QUERY_TOKEN)
        assert await asgi_call(app, refused, [{"type": "websocket.connect"}]) == [
            {"type": "websocket.close", "code": 1008}]
    finally:
        await verifier.close()
