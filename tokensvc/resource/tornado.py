"""The Tornado adapter: an ``Application`` that masks a query token in every request, a
``RequestHandler`` mixin and ``@requires(scope)``, and a WebSocket handler base that closes its
connection (4401) when its token is revoked.

The application's settings hold the verifier under ``tokensvc_verifier``. A WebSocket's token
rides in its query (``?access_token=``; RFC 6750 §2.3: only where no header can carry it, so
only :class:`RevocableWebSocket` takes it), and whatever names the request writes its URI:
Tornado's access log (a refusal at WARNING, which reaches stderr even where logging was never
configured), its line of an uncaught exception (the request's repr), an application's own
``log_function``. So :class:`Application` takes the token out of every request as it is routed,
before any handler is made (a path no handler serves, its 404, a handler of any kind), and
leaves ``access_token=***`` in its place (``uri``, ``query``, the query's arguments: the
request's public attributes, as the ASGI middleware masks its scope); the token taken is kept
beside the request for the mixin. In a plain ``tornado.web.Application`` the mixin masks its own
requests as its handler is made, and no other request is masked.
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import tornado.escape
import tornado.httputil
import tornado.web
import tornado.websocket

from tokensvc.resource.bearer import Authorized, bearer_token, masked_query, query_token
from tokensvc.resource.errors import Refusal
from tokensvc.resource.started import ensure_feed_open
from tokensvc.resource.verifier import Verifier

CLOSE_REVOKED = 4401

# The token each masked request held in its query, for the mixin that may take it (a WebSocket):
# kept beside the request, never in it, and gone with it.
_query_tokens: weakref.WeakKeyDictionary[tornado.httputil.HTTPServerRequest, str] = weakref.WeakKeyDictionary()


class Application(tornado.web.Application):
    """A ``tornado.web.Application`` whose every request has a query ``access_token`` masked
    as it is routed, before any handler (or the 404 of a path none serves) is made."""

    # Typed as the public Router.find_handler is (Application narrows it to a private class).
    def find_handler(self, request: tornado.httputil.HTTPServerRequest,  # type: ignore[override]
                     **kwargs: Any) -> tornado.httputil.HTTPMessageDelegate:
        _take_query_token(request)
        return super().find_handler(request, **kwargs)


def _take_query_token(request: tornado.httputil.HTTPServerRequest) -> None:
    """Mask ``request``'s query token (a request masked already is left as it is), keeping the
    token beside it."""
    masked = masked_query(request.query)
    if masked == request.query:
        return
    token = query_token(request.query)
    if token is not None:
        _query_tokens[request] = token
    _mask_query_token(request, masked)


class BearerAuthMixin(tornado.web.RequestHandler):
    """Sets ``self.authorized`` from the request's bearer token; a refusal is answered here
    (401/403/503, RFC 6750 JSON with ``WWW-Authenticate``) and ends the request."""

    authorized: Authorized | None = None
    accept_query_token = False  # WebSockets: browsers cannot set headers (RFC 6750 §2.3)
    _query_token: str | None = None

    def __init__(self, application: tornado.web.Application, request: tornado.httputil.HTTPServerRequest,
                 **kwargs: Any) -> None:
        _take_query_token(request)  # taken out whether accepted here or not (a plain Application)
        self._query_token = _query_tokens.get(request)
        super().__init__(application, request, **kwargs)

    @property
    def verifier(self) -> Verifier:
        return self.settings["tokensvc_verifier"]

    def presented_token(self) -> str | None:
        token = bearer_token(self.request.headers.get("Authorization"))
        if token is None and self.accept_query_token:
            token = self._query_token
        return token

    async def authorize(self, scope: str | None = None) -> Authorized:
        await ensure_feed_open(self.verifier)  # on the first request, if the application did not
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

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        refusal = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(refusal, Refusal):  # raised by the handler itself (authorized.require)
            self.refuse(refusal)
        else:
            super().write_error(status_code, **kwargs)


def _mask_query_token(request: tornado.httputil.HTTPServerRequest, masked: str) -> None:
    """``request`` with its query replaced by ``masked`` (:func:`masked_query`) wherever the
    request holds it: its URI, query and arguments."""
    request.query = masked
    request.uri = f"{request.path}?{masked}"
    request.query_arguments = tornado.escape.parse_qs_bytes(masked, keep_blank_values=True)
    request.arguments = {name: list(values) for name, values in request.query_arguments.items()}
    for name, values in request.body_arguments.items():  # as Tornado merges them
        request.arguments.setdefault(name, []).extend(values)


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
