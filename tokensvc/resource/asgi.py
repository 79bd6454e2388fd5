"""The ASGI adapter: a middleware for Starlette or any ASGI application.

HTTP: a request without an authorized bearer token is answered here (401/403/503, RFC 6750 JSON
with ``WWW-Authenticate``); otherwise the application runs with ``scope["auth"]`` set to the
:class:`Authorized` (Starlette: ``request.auth``), and an :class:`InsufficientScope` it raises
before answering (``request.auth.require("write")``) becomes the 403. WebSocket: the token from
``Authorization`` or ``?access_token=``; refused, the handshake is closed (1008) before it is
accepted; accepted, the connection is closed with 4401 when the token is revoked, and the
application then receives ``websocket.disconnect``. Every HTTP and WebSocket scope it passes
on, exempt paths included, has an ``access_token`` of its query masked in place
(``access_token=***``, however the name was escaped): the server's access log (uvicorn's) writes
the query the scope holds once the application answered.
Lifespan: the verifier's feed is opened at start-up and closed at shutdown; under a server that
runs no lifespan, on the first request (:mod:`.started`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from tokensvc.resource.bearer import Authorized, bearer_token, take_query_token
from tokensvc.resource.errors import InsufficientScope, Refusal
from tokensvc.resource.started import ensure_feed_open
from tokensvc.resource.verifier import Verifier

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

CLOSE_REVOKED = 4401
CLOSE_POLICY = 1008


class BearerAuthMiddleware:
    def __init__(self, app: App, verifier: Verifier, *, scope: str | None = None,
                 exempt: tuple[str, ...] = ()) -> None:
        """``scope``: what every request's token must hold; ``exempt``: paths served without
        a token (a health check)."""
        self.app, self.verifier, self.required, self.exempt = app, verifier, scope, exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self.app(scope, self._lifespan(receive), send)
        elif kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
        else:
            query_token = take_query_token(scope)  # before anything answers: the server logs the scope
            if scope.get("path") in self.exempt:
                await self.app(scope, receive, send)
            elif kind == "http":  # a token in an HTTP query is never taken (RFC 6750 §2.3), only masked
                await self._http(scope, receive, send)
            else:
                await self._websocket(scope, receive, send, query_token)

    def _lifespan(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await ensure_feed_open(self.verifier)
            elif message["type"] == "lifespan.shutdown":
                await self.verifier.close()
            return message
        return wrapped

    async def _authorize(self, scope: Scope, query_token: str | None) -> tuple[str | None, Authorized]:
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        token = bearer_token(headers.get("authorization")) or query_token
        await ensure_feed_open(self.verifier)  # a server that runs no lifespan
        return token, await self.verifier.check(token, self.required)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            _, scope["auth"] = await self._authorize(scope, None)
        except Refusal as refusal:
            await self._refuse(send, refusal)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except InsufficientScope as refusal:
            if started:
                raise
            await self._refuse(send, refusal)

    async def _refuse(self, send: Send, refusal: Refusal) -> None:
        body = json.dumps(refusal.body()).encode()
        headers = [(name.lower().encode("latin-1"), value.encode("latin-1"))
                   for name, value in refusal.headers(self.verifier.settings.realm).items()]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _websocket(self, scope: Scope, receive: Receive, send: Send, query_token: str | None) -> None:
        try:
            token, scope["auth"] = await self._authorize(scope, query_token)
        except Refusal:
            first = await receive()  # websocket.connect, answered with a refusal before acceptance
            if first["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": CLOSE_POLICY})
            return
        assert token is not None
        ended = asyncio.Event()
        stop = self.verifier.watch(token, scope["auth"], ended.set, self.required)
        closed = False

        async def closing_send(message: Message) -> None:
            nonlocal closed
            closed = closed or message["type"] == "websocket.close"
            if not closed or message["type"] == "websocket.close":
                await send(message)

        async def revocable_receive() -> Message:
            if ended.is_set():
                return {"type": "websocket.disconnect", "code": CLOSE_REVOKED}
            receiving = asyncio.ensure_future(receive())
            ending = asyncio.ensure_future(ended.wait())
            done, _ = await asyncio.wait({receiving, ending}, return_when=asyncio.FIRST_COMPLETED)
            if receiving in done:
                ending.cancel()
                return receiving.result()
            receiving.cancel()
            return {"type": "websocket.disconnect", "code": CLOSE_REVOKED}

        async def close_when_ended() -> None:
            await ended.wait()
            if not closed:
                await closing_send({"type": "websocket.close", "code": CLOSE_REVOKED})

        closer = asyncio.ensure_future(close_when_ended())
        try:
            await self.app(scope, revocable_receive, closing_send)
        finally:
            stop()
            closer.cancel()
