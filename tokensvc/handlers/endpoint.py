"""JSON endpoints served from Tornado's HTTP layer (``tornado.httputil.HTTPMessageDelegate``).

The JSON API (token endpoints, clients, ``/v1/me``, discovery and health) does not go
through ``tornado.web.RequestHandler``: measured with ``make bench``, RequestHandler's
per-request machinery (an asyncio Task per request, output transforms, flush and finish
futures, per-header validation) costs about 40 % of a hello world, more than all of the OAuth
work of an introspection. An :class:`Endpoint` gets the request Tornado's HTTP server has
already parsed, reads the body, runs one method and writes one response; the routing,
connection handling, keep-alive and ``xheaders`` stay Tornado's. Pages, the WebSocket and
the cookie-authenticated changes that need XSRF checks stay on ``tornado.web``
(:mod:`tokensvc.handlers.base`). Both kinds render errors and log through
:mod:`tokensvc.handlers.common`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import types
from collections.abc import Coroutine
from typing import Any, ClassVar

import tornado.httputil
import tornado.routing
import tornado.web
from tornado.httputil import HTTPHeaders, HTTPServerRequest, ResponseStartLine

from tokensvc.config import Settings
from tokensvc.handlers.common import (EXPECTED, MAX_BODY_BYTES, SECURITY_HEADERS, RequestInput, dumps,
                                      error_response, log_access, reason_phrase)
from tokensvc.oauth.context import OAuthContext
from tokensvc.storage.base import StorageError

log = logging.getLogger(__name__)

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


class Endpoint(RequestInput, tornado.httputil.HTTPMessageDelegate):
    """One request to a JSON endpoint. Subclasses define ``async def get/post/delete``.

    Path groups of the route arrive as the method's arguments, decoded as UTF-8.
    """

    default_headers: ClassVar[dict[str, str]] = SECURITY_HEADERS
    max_body: ClassVar[int | None] = MAX_BODY_BYTES  # larger bodies get 413
    methods: ClassVar[frozenset[str]] = frozenset()  # filled in for each subclass

    def __init__(self, request: HTTPServerRequest, ctx: OAuthContext, config: Settings,
                 path_args: list[bytes]) -> None:
        self.request = request
        self.ctx = ctx
        self.config = config
        self.path_args = path_args
        self.log_client_id: str | None = None
        self._chunks: list[bytes] = []
        self._status = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        methods = {m for m in HTTP_METHODS if callable(getattr(cls, m.lower(), None))}
        if "GET" in methods:  # HEAD is answered wherever GET is (RFC 9110 §9.3.2)
            methods.add("HEAD")
        cls.methods = frozenset(methods)

    @classmethod
    def route(cls, ctx: OAuthContext, config: Settings) -> tornado.routing.Router:
        """The target to put in the application's route table."""
        return _EndpointRoute(cls, ctx, config)

    # -- HTTPMessageDelegate ------------------------------------------------------------

    def headers_received(self, start_line: Any, headers: HTTPHeaders) -> None:
        """Nothing to do: the router has built ``self.request`` from them."""

    def data_received(self, chunk: bytes) -> None:
        self._chunks.append(chunk)

    def finish(self) -> None:
        start_eagerly(self._serve())

    def on_connection_close(self) -> None:
        self._chunks = []

    # -- serving ------------------------------------------------------------------------

    async def _serve(self) -> None:
        try:
            method = self.request.method or ""
            if method not in self.methods:
                raise tornado.web.HTTPError(405)
            if self._chunks:
                self._read_body()
            await getattr(self, "get" if method == "HEAD" else method.lower())(*self._decoded_path_args())
            if not self._status:
                raise RuntimeError(f"{type(self).__name__}.{method.lower()} sent no response")
        except Exception as exc:  # every failure becomes a response in the documented shape
            self._fail(exc)

    def _read_body(self) -> None:
        request = self.request
        request.body = b"".join(self._chunks)
        if self.max_body is not None and len(request.body) > self.max_body:
            raise tornado.web.HTTPError(413, reason="Request Entity Too Large")
        try:
            tornado.httputil.parse_body_arguments(request.headers.get("Content-Type", ""), request.body,
                                                  request.body_arguments, request.files, request.headers)
        except tornado.httputil.HTTPInputError:
            raise tornado.web.HTTPError(400) from None

    def _decoded_path_args(self) -> list[str]:
        try:
            return [arg.decode("utf-8") for arg in self.path_args]
        except UnicodeDecodeError:
            raise tornado.web.HTTPError(400, reason="Invalid unicode in the path") from None

    def _fail(self, exc: Exception) -> None:
        if isinstance(exc, StorageError):
            log.warning("store unavailable: %s %s: %s", self.request.method, self.request.path, exc)
        elif not isinstance(exc, EXPECTED):
            log.error("Uncaught exception %s %s", self.request.method, self.request.path, exc_info=exc)
        status, body, headers = error_response(exc)
        if status == 405:
            headers["Allow"] = ", ".join(sorted(self.methods))
        self.send_json(body, status, headers)

    def send_json(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.send(status, dumps(body).encode("utf-8"), "application/json", headers)

    def send(self, status: int, body: bytes, content_type: str | None, extra: dict[str, str] | None = None) -> None:
        """Write the whole response and end the request (once; later calls are ignored)."""
        if self._status:
            return
        self._status = status
        headers = ResponseHeaders(self.default_headers)
        if extra:
            headers.update(extra)
        headers["Date"] = http_date()
        if status == 204:
            body = b""
        else:
            headers["Content-Length"] = str(len(body))
            if content_type:
                headers["Content-Type"] = content_type
        connection = self.request.connection
        assert connection is not None
        if self.request.method == "HEAD":  # the headers a GET would have, and no body
            body = b""
        connection.write_headers(ResponseStartLine("HTTP/1.1", status, reason_phrase(status)),
                                 headers,  # type: ignore[arg-type]  # (see ResponseHeaders)
                                 body or None)
        connection.finish()
        log_access(status, self.request, self.log_client_id)

    def check_same_origin(self) -> None:
        # Endpoints take the session cookie only on safe methods: cookie-authenticated changes
        # are RequestHandlers (handlers.api.ApiHandler), where Tornado checks the XSRF token.
        raise tornado.web.HTTPError(403, reason="Cookie authentication is not accepted for this method")


class ResponseHeaders(dict[str, str]):
    """A response's headers, as ``HTTP1Connection.write_headers`` reads them.

    Tornado's ``HTTPHeaders`` normalises the case of every name it is given and keeps a list
    of values per name, for headers parsed off the wire; building one for a token response's
    nine headers cost about 7 µs, 2 % of a code exchange in ``make bench``. An endpoint writes
    each header once under its canonical name, and the connection only tests a name with
    ``in``, reads and sets single values and iterates ``get_all()``, which a dict does
    (``tests/test_endpoint.py`` covers the headers the connection adds itself).
    """

    def get_all(self) -> Any:
        return self.items()


class _EndpointRoute(tornado.routing.Router):
    """Route-table target that makes an :class:`Endpoint` for each request it matches."""

    def __init__(self, endpoint: type[Endpoint], ctx: OAuthContext, config: Settings) -> None:
        self.endpoint, self.ctx, self.config = endpoint, ctx, config

    def find_handler(self, request: HTTPServerRequest, **kwargs: Any) -> Endpoint:
        return self.endpoint(request, self.ctx, self.config, kwargs.get("path_args") or [])


_date_second = 0
_date_text = ""


def http_date() -> str:
    """The Date header (RFC 9110 §6.6.1), formatted once per second."""
    global _date_second, _date_text
    now = int(time.time())
    if now != _date_second:
        _date_second, _date_text = now, tornado.httputil.format_timestamp(now)
    return _date_text


# -- running a request's coroutine ------------------------------------------------------


def start_eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Future[Any] | None:
    """Run ``coro`` at once, up to its first real wait; the rest, if any, in an asyncio Task
    (returned; None when ``coro`` finished without waiting).

    On the memory backend a request never waits, so it is served without creating and
    scheduling a Task (about 15 % of a token request). With MongoDB the first store call
    waits and the request goes on in a Task as usual. This is Python 3.12's eager task
    start, which 3.12 and later provide themselves.
    """
    if EAGER_TASKS:
        task = asyncio.Task(coro, loop=asyncio.get_running_loop(), eager_start=True)  # type: ignore[call-arg]
        return None if task.done() else task
    try:
        waiting_on = coro.send(None)
    except StopIteration:
        return None
    task = asyncio.ensure_future(_resume(coro, waiting_on))
    # A Task cancelled before its first step never reaches the coroutine: close it then, so
    # that its ``finally`` blocks run at once rather than whenever it is collected.
    task.add_done_callback(lambda _: coro.close())
    return task


EAGER_TASKS = sys.version_info >= (3, 12)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, None], waiting_on: Any) -> Any:
    """Go on with a started coroutine: hand what it waits on to the Task driving this
    generator, and pass each result (or exception) back in, until the coroutine returns."""
    while True:
        try:
            result = yield waiting_on
        except BaseException as exc:  # noqa: BLE001 - cancellation goes to the coroutine, as in a Task
            step, value = coro.throw, exc
        else:
            step, value = coro.send, result
        try:
            waiting_on = step(value)
        except StopIteration as stop:
            return stop.value
