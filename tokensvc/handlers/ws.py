"""``GET /v1/ws``: an authenticated WebSocket that closes (4401) when its authorization ends.

The token comes from the ``access_token`` query parameter, the ``Authorization`` header, or
the session cookie; without a valid one the upgrade is refused with a plain HTTP 401.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import tornado.ioloop
import tornado.web
import tornado.websocket

from tokensvc import schemas
from tokensvc.config import Settings
from tokensvc.handlers.auth import AuthMixin
from tokensvc.handlers.errors import log_failure, response_for
from tokensvc.handlers.inputs import RequestInput
from tokensvc.handlers.json_api import SECURITY_HEADERS, dumps
from tokensvc.logs import REQUEST_ID
from tokensvc.oauth import principal as principals
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import OAuthError
from tokensvc.storage.base import StorageError, StoreFault

log = logging.getLogger(__name__)

CLOSE_REVOKED = 4401


class EchoSocket(AuthMixin, RequestInput, tornado.websocket.WebSocketHandler):
    accept_query_token = True
    SUPPORTED_METHODS = ("GET", "HEAD")  # anything else: 405 with Allow, before any other check

    def initialize(self, ctx: OAuthContext, config: Settings, route: str = "/v1/ws") -> None:
        self.ctx, self.config, self.route = ctx, config, route
        self.opened = False
        self.log_error: str | None = None
        self._timers: list[Any] = []
        self._checking = False
        self._stands_on: list[Any] = []

    async def get(self, *args: Any, **kwargs: Any) -> None:
        try:
            self.principal = await self.authenticate()
            self.principal.require("read")
        except (OAuthError, StorageError, StoreFault) as exc:
            return self._refuse(exc)
        self.log_client_id = self.principal.client_id
        await super().get(*args, **kwargs)

    async def head(self, *args: Any, **kwargs: Any) -> None:
        """What a GET without an upgrade gets (401, or 400 for the missing upgrade), no body."""
        await self.get(*args, **kwargs)

    def log_exception(self, typ, value, tb) -> None:  # type: ignore[override]
        log_failure(self.request, value, (typ, value, tb), metrics=self.ctx.metrics)  # the URI redacted

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Errors before the upgrade (a 405) in the JSON API's shape and headers."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        self._refuse(exc if exc is not None else tornado.web.HTTPError(status_code))

    def _refuse(self, exc: Exception) -> None:
        """No upgrade: the JSON error response, with the JSON API's security headers."""
        status, body, headers = response_for(exc)
        if status == 405:
            headers = {**headers, "Allow": ", ".join(sorted(self.SUPPORTED_METHODS))}
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            self.log_error = body["error"]
        self.set_status(status)
        for name, value in {**SECURITY_HEADERS, **headers, "Content-Type": "application/json",
                            "X-Request-ID": REQUEST_ID.get() or ""}.items():
            self.set_header(name, value)
        self.finish(dumps(body))

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
        expires_at = principal.token.expires_at if principal.token else principal.session.expires_at
        self._timers.append(loop.call_at(loop.time() + max(0.0, (expires_at - self.ctx.clock()).total_seconds()),
                                         self._close_revoked))
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
