"""The Tornado adapter: a ``RequestHandler`` mixin and ``@requires(scope)``, and a WebSocket
handler base that closes its connection (4401) when its token is revoked.

The application's settings hold the verifier under ``tokensvc_verifier``. A WebSocket's token
rides in its query (``?access_token=``), and Tornado writes the request's URI into its access
log (a refusal at WARNING, which reaches stderr even where logging was never configured) and
into its error lines: the mixin's handlers write the URI with that value masked instead.
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Awaitable, Callable
from typing import Any

import tornado.log
import tornado.web
import tornado.websocket

from tokensvc.resource.errors import Refusal
from tokensvc.resource.verifier import Authorized, Verifier, bearer_token, masked_query

CLOSE_REVOKED = 4401


class BearerAuthMixin(tornado.web.RequestHandler):
    """Sets ``self.authorized`` from the request's bearer token; a refusal is answered here
    (401/403/503, RFC 6750 JSON with ``WWW-Authenticate``) and ends the request."""

    authorized: Authorized | None = None
    accept_query_token = False  # WebSockets: browsers cannot set headers (RFC 6750 §2.3)

    @property
    def verifier(self) -> Verifier:
        return self.settings["tokensvc_verifier"]

    def presented_token(self) -> str | None:
        token = bearer_token(self.request.headers.get("Authorization"))
        if token is None and self.accept_query_token:
            token = self.get_query_argument("access_token", None)
        return token

    async def authorize(self, scope: str | None = None) -> Authorized:
        try:
            self.authorized = await self.verifier.check(self.presented_token(), scope)
        except Refusal as refusal:
            self.refuse(refusal)
            raise tornado.web.Finish() from None
        return self.authorized

    def refuse(self, refusal: Refusal) -> None:
        self.set_status(refusal.status)
        for name, value in refusal.headers(self.verifier.settings.realm).items():
            self.set_header(name, value)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(refusal.body()))

    def _request_summary(self) -> str:
        # What Tornado's access log and its error lines name the request by: never a token.
        path, sep, query = (self.request.uri or "").partition("?")
        return f"{self.request.method} {path}{sep}{masked_query(query)} ({self.request.remote_ip})"

    def log_exception(self, typ: type[BaseException] | None, value: BaseException | None,
                      tb: types.TracebackType | None) -> None:
        if isinstance(value, tornado.web.HTTPError):  # its line names the request by the summary
            super().log_exception(typ, value, tb)
        else:  # Tornado's own line adds the request's repr, URI and all
            tornado.log.app_log.error("Uncaught exception %s", self._request_summary(), exc_info=value)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        refusal = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(refusal, Refusal):  # raised by the handler itself (authorized.require)
            self.refuse(refusal)
        else:
            super().write_error(status_code, **kwargs)


Method = Callable[..., Awaitable[None]]


def requires(scope: str | None = None) -> Callable[[Method], Method]:
    """Authorize the request (holding ``scope``, when given) before the handler method runs."""

    def decorate(method: Method) -> Method:
        @functools.wraps(method)
        async def wrapper(self: BearerAuthMixin, *args: Any, **kwargs: Any) -> None:
            await self.authorize(scope)
            await method(self, *args, **kwargs)

        return wrapper

    return decorate


class RevocableWebSocket(BearerAuthMixin, tornado.websocket.WebSocketHandler):
    """A WebSocket opened with a bearer token (``Authorization`` or ``?access_token=``) holding
    ``required_scope``, refused before the upgrade otherwise, and closed with 4401 as soon as
    the token is revoked, expires or can no longer be confirmed. A subclass that overrides
    ``on_close`` calls ``super().on_close()``."""

    accept_query_token = True
    required_scope: str | None = None
    _stop_watch: Callable[[], None] | None = None
    _ended = False

    async def get(self, *args: Any, **kwargs: Any) -> None:
        authorized = await self.authorize(self.required_scope)
        token = self.presented_token()
        assert token is not None
        self._stop_watch = self.verifier.watch(token, authorized, self._authorization_ended, self.required_scope)
        await super().get(*args, **kwargs)
        if self.ws_connection is None:  # no WebSocket came of it (a refused handshake)
            self.on_close()
        elif self._ended:  # ended during the handshake
            self._authorization_ended()

    def _authorization_ended(self) -> None:
        self._ended = True
        if self.ws_connection is not None:
            self.close(CLOSE_REVOKED, "authorization revoked or expired")

    def on_close(self) -> None:
        if self._stop_watch is not None:
            self._stop_watch()
            self._stop_watch = None
