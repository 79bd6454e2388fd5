"""``GET /v1/ws``: an authenticated WebSocket that closes (4401) when its authorization ends.

The token comes from the ``access_token`` query parameter, the ``Authorization`` header, or
the session cookie; without a valid one the upgrade is refused with a plain HTTP 401.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import tornado.ioloop
import tornado.websocket

from tokensvc import schemas
from tokensvc.handlers.auth import AuthMixin
from tokensvc.handlers.headers import JSON_HEADERS
from tokensvc.handlers.lifecycle import JSON, Edge, dumps
from tokensvc.handlers.web import WebHandler
from tokensvc.oauth import principal as principals

log = logging.getLogger(__name__)

CLOSE_REVOKED = 4401


class EchoSocket(AuthMixin, WebHandler, tornado.websocket.WebSocketHandler):
    """The socket. A refused upgrade is answered in the JSON API's shape and headers."""

    default_headers = JSON_HEADERS
    output = JSON
    accept_query_token = True

    def initialize(self, edge: Edge, route: str = "/v1/ws") -> None:
        super().initialize(edge, route)
        self.opened = False
        self._timers: list[Any] = []
        self._checking = False
        self._stands_on: list[Any] = []

    async def get(self, *args: Any, **kwargs: Any) -> None:
        # A failure here (401, 403, 503) is rendered by the lifecycle, before any upgrade.
        self.principal = await self.authenticate()
        self.principal.require("read")
        self.log_client_id = self.principal.client_id
        await super().get(*args, **kwargs)

    def check_origin(self, origin: str) -> bool:
        # A bearer token is explicit; a cookie is ambient and only trusted from our own origin.
        if self.principal is not None and not self.principal.via_cookie:
            return True
        return super().check_origin(origin)

    async def open(self, *args: Any, **kwargs: Any) -> None:
        principal = self.principal
        assert principal is not None
        # Revocations reach the socket as announcements (oauth.events), from this process and,
        # through the process's one relay, from every other: no socket polls on its own.
        self._stands_on = principals.stands_on(principal)
        self.ctx.events.subscribe(self._stands_on, self._on_revocation)
        self.opened = True
        self.ctx.metrics.websockets_open.inc()
        loop = tornado.ioloop.IOLoop.current()
        remaining = (principal.expires_at - self.ctx.clock()).total_seconds()
        self._timers.append(loop.call_at(loop.time() + max(0.0, remaining), self._close_revoked))
        me = await principals.describe(self.ctx, principal)
        welcome = {"type": "welcome", "subjectType": me["subjectType"], "id": me["id"], "scopes": me["scopes"]}
        self.write_message(dumps(schemas.welcome.dump(welcome)))

    def on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        self.write_message(json.dumps({"type": "echo", "data": message}))

    def on_close(self) -> None:
        self.ctx.events.unsubscribe(self._stands_on, self._on_revocation)
        if self.opened:
            self.opened = False
            self.ctx.metrics.websockets_open.dec()
        loop = tornado.ioloop.IOLoop.current()
        for timer in self._timers:
            loop.remove_timeout(timer)
        self._timers.clear()

    def _on_revocation(self) -> None:
        self._spawn_check()

    def _spawn_check(self) -> None:
        if not self._checking:
            self._checking = True
            tornado.ioloop.IOLoop.current().add_callback(self._check)

    async def _check(self) -> None:
        try:
            if self.principal is not None and not await principals.still_valid(self.ctx, self.principal):
                self._close_revoked()
        except Exception:  # the store is away: keep the socket; the relay re-checks all once it is back
            log.warning("could not re-check a WebSocket's authorization", exc_info=True)
        finally:
            self._checking = False

    def _close_revoked(self) -> None:
        if self.ws_connection is not None:
            self.close(CLOSE_REVOKED, "authorization revoked or expired")
