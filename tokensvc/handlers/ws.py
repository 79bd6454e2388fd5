"""``GET /v1/ws``: an authenticated WebSocket that closes (4401) when its authorization ends.

The token comes from the ``access_token`` query parameter, the ``Authorization`` header, or
the session cookie; without a valid one the upgrade is refused with a plain HTTP 401. Every
refusal (401, 403, a request that is no WebSocket handshake: 400, or of another version: 426,
a fault of the handshake's headers HTTPValidationError naming it) is an :class:`~tokensvc.errors.HTTPAnswer`
raised before Tornado's own checks are reached (they would answer in plain text), and rendered
by the request's exit in the JSON API's shape, as every other route's errors are.
"""

from __future__ import annotations

import json
import re
from typing import Any

import tornado.ioloop
import tornado.websocket
from tornado.httputil import HTTPServerRequest

from tokensvc import schemas
from tokensvc.errors import BadHandshake, BadRequest, UpgradeRequired
from tokensvc.handlers.edge.auth import AuthMixin
from tokensvc.handlers.edge.exit import dumps
from tokensvc.handlers.edge.guards import check_socket_origin
from tokensvc.handlers.edge.headers import JSON_HEADERS
from tokensvc.handlers.edge.inputs import JSON
from tokensvc.handlers.edge.recheck import Recheck
from tokensvc.handlers.edge.web_handler import WebHandler
from tokensvc.oauth import principal as principals
from tokensvc.oauth.feed import CLOSE_RESTART

CLOSE_REVOKED = 4401

VERSION = "13"  # RFC 6455, the one Tornado speaks
_KEY = re.compile(r"[A-Za-z0-9+/]{21}[AQgw]==")  # base64 of 16 bytes (RFC 6455 §4.2.1)


def check_handshake(request: HTTPServerRequest) -> None:
    """Refuse, as an answer, a request that is not a WebSocket opening handshake (400) or is
    one of another version (426, naming ours): every case in which Tornado's own checks would
    answer in plain text. A fault of the handshake's headers names the header
    (HTTPValidationError); a request that is not HTTP/1.1 with a Host says so in a ``{"detail"}``."""
    headers = request.headers
    # RFC 6455 §4.1: HTTP/1.1 at least, and a Host.
    if request.version != "HTTP/1.1" or not headers.get("Host"):
        raise BadRequest("Not a WebSocket handshake: an HTTP/1.1 request with a Host is needed")
    # Header values arrive without their surrounding whitespace; inside a list only spaces and
    # tabs separate (RFC 9110 §5.6.1). Exactly what docs/openapi.json's patterns say.
    upgrade = headers.get("Upgrade")
    if (upgrade or "").lower() != "websocket":
        raise BadHandshake("Upgrade", "Not a WebSocket handshake: Upgrade must be websocket", upgrade)
    connection = headers.get("Connection")
    if "upgrade" not in (token.strip(" \t").lower() for token in (connection or "").split(",")):
        raise BadHandshake("Connection", "Not a WebSocket handshake: Connection must include Upgrade", connection)
    if headers.get("Sec-WebSocket-Version") != VERSION:
        raise UpgradeRequired(VERSION, headers.get("Sec-WebSocket-Version"))
    key = headers.get("Sec-WebSocket-Key")
    if not _KEY.fullmatch(key or ""):
        raise BadHandshake("Sec-WebSocket-Key", "Not a WebSocket handshake: Sec-WebSocket-Key must be 16 bytes "
                           "in base64", key)


class EchoSocket(AuthMixin, WebHandler, tornado.websocket.WebSocketHandler):
    """The socket. A refused upgrade is answered in the JSON API's shape and headers."""

    default_headers = JSON_HEADERS
    output = JSON
    accept_query_token = True

    def initialize(self) -> None:
        super().initialize()
        self.opened = False
        self._timers: list[Any] = []
        self._recheck = Recheck(self._check, "could not re-check a WebSocket's authorization",
                                self.ctx.store.reachable)
        self._stands_on: list[Any] = []

    async def get(self, *args: Any, **kwargs: Any) -> None:
        # A failure here (400, 426, 401, 403, 503) is rendered by the lifecycle, before any
        # upgrade: the request's shape first, as every route checks its input before its caller.
        check_handshake(self.request)
        self._mark = self.ctx.events.mark()  # before the credential is read (Recheck.stand_on)
        self.principal = await self.authenticate()
        self.principal.require("read")
        self.log_client_id = self.principal.client_id
        check_socket_origin(self.request, self.config, self.principal.via_cookie)
        await super().get(*args, **kwargs)

    def check_origin(self, origin: str) -> bool:
        """Decided before the upgrade (:func:`.guards.check_socket_origin`), with every other
        origin decision of the service."""
        return True

    async def open(self, *args: Any, **kwargs: Any) -> None:
        principal = self.principal
        assert principal is not None
        # Revocations reach the socket as announcements (oauth.events), from this process and,
        # through the process's one relay, from every other: no socket polls on its own. One
        # between the handshake's authentication and this subscription is checked before the
        # welcome: none is sent on a credential that no longer holds.
        self.edge.sockets[self] = self._restart  # a graceful stop tells it to go
        if self.edge.stopping:
            self._restart()
            return
        self._stands_on = principals.stands_on(principal)
        await self._recheck.stand_on(self.ctx.events, self._stands_on, self._mark)
        if self.ws_connection is None:  # closed meanwhile: revoked, stopping, or the peer left
            return
        self.opened = True
        self.edge.metrics.websockets_open.inc()
        loop = tornado.ioloop.IOLoop.current()
        remaining = (principal.expires_at - self.ctx.clock()).total_seconds()
        self._timers.append(loop.call_at(loop.time() + max(0.0, remaining), self._close_revoked))
        me = await principals.describe(self.ctx, principal)
        if self.ws_connection is None:  # closed while it read (stopping, revoked, the peer left)
            return
        welcome = {"type": "welcome", "subjectType": me["subjectType"], "id": me["id"], "scopes": me["scopes"]}
        self.write_message(dumps(schemas.welcome.dump(welcome)))

    def on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        self.write_message(json.dumps({"type": "echo", "data": message}))

    def on_close(self) -> None:
        self.edge.sockets.pop(self, None)
        self.ctx.events.unsubscribe(self._stands_on, self._recheck.request)
        self._recheck.stop()
        if self.opened:
            self.opened = False
            self.edge.metrics.websockets_open.dec()
        loop = tornado.ioloop.IOLoop.current()
        for timer in self._timers:
            loop.remove_timeout(timer)
        self._timers.clear()

    async def _check(self) -> None:
        if self.principal is not None and not await principals.still_valid(self.ctx, self.principal):
            self._close_revoked()

    def _restart(self) -> None:
        if self.ws_connection is not None:
            self.close(CLOSE_RESTART, "the service is restarting: connect again")

    def _close_revoked(self) -> None:
        if self.ws_connection is not None:
            self.close(CLOSE_REVOKED, "authorization revoked or expired")
