"""The JSON base: every JSON route is a :class:`JsonHandler`, served from Tornado's HTTP layer.

A ``JsonHandler`` is a ``tornado.httputil.HTTPMessageDelegate`` that Tornado's ``Application``
routes to: it gets the request Tornado's HTTP server has parsed, reads the body, runs one
method and writes one response through the connection's public ``write_headers`` and
``finish``. Routing, connection handling, keep-alive and ``xheaders`` stay Tornado's.

Why not ``RequestHandler``: measured with ``make bench``, its per-request machinery (an
asyncio Task per request, output transforms, flush and finish futures, per-header
validation) costs about 40 % of a hello world, more than all of the OAuth work of an
introspection, and the targets (introspection and ``/v1/me`` at 0.90 of the hello world)
leave no room for it.

What every JSON route gets here, in one place: method dispatch (405 with ``Allow``; HEAD
wherever GET is), the 64 KiB body limit (413), the XSRF rule for routes that take the
session cookie (:mod:`.xsrf`), the security headers, one rendering of every error
(:func:`.errors.response_for`), and the access line.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import sys
import time
import types
from collections.abc import Coroutine
from http.cookies import SimpleCookie
from typing import Any, ClassVar

import tornado.httputil
import tornado.routing
import tornado.web
from tornado.httputil import HTTPHeaders, HTTPServerRequest, ResponseStartLine

from tokensvc.config import Settings
from tokensvc.handlers import xsrf
from tokensvc.handlers.access_log import log_access, request_id_for
from tokensvc.handlers.body_limit import MAX_BODY_BYTES, count_body_here, too_large
from tokensvc.handlers.errors import NotFound, log_failure, reason_phrase, response_for
from tokensvc.handlers.inputs import RequestInput
from tokensvc.logs import REQUEST_ID
from tokensvc.oauth.context import OAuthContext


HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
UNMATCHED = "(unmatched)"  # the metrics' route label of a request no route matched
JSON_CSP = "default-src 'none'; frame-ancestors 'none'"
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": JSON_CSP,
}
# RFC 6749 §5.1: token responses, and anything else private to the caller, are never cached.
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
TOKEN_HEADERS = {**SECURITY_HEADERS, **NO_STORE}
PRIVATE_HEADERS = {**SECURITY_HEADERS, "Cache-Control": "no-store"}


def dumps(body: Any) -> str:
    """A response body as compact JSON, non-ASCII characters kept as they are."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


class JsonHandler(RequestInput, tornado.httputil.HTTPMessageDelegate):
    """One request to a JSON route. Subclasses define ``async def get/post/delete``.

    Path groups of the route arrive as the method's arguments, decoded as UTF-8.
    """

    default_headers: ClassVar[dict[str, str]] = SECURITY_HEADERS
    # Larger bodies get 413 (:mod:`.body_limit`); None: the route ignores any body it is sent.
    max_body: ClassVar[int | None] = MAX_BODY_BYTES
    # Whether the session cookie may authorize this route; an unsafe request that carries it
    # then needs an XSRF token (xsrf.required decides).
    takes_session: ClassVar[bool] = False
    methods: ClassVar[frozenset[str]] = frozenset()  # filled in for each subclass

    def __init__(self, request: HTTPServerRequest, ctx: OAuthContext, config: Settings,
                 path_args: list[bytes], route: str = UNMATCHED) -> None:
        self.request = request
        self.ctx = ctx
        self.config = config
        self.path_args = path_args
        self.route = route  # the route's pattern, for the metrics
        self.request_id = ""
        self.log_client_id: str | None = None
        self.log_error: str | None = None
        self.cookies: SimpleCookie | None = None  # cookies this response sets or clears
        self._chunks: list[bytes] = []
        self._size = 0
        self._status = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        methods = {m for m in HTTP_METHODS if callable(getattr(cls, m.lower(), None))}
        if "GET" in methods:  # HEAD is answered wherever GET is (RFC 9110 §9.3.2)
            methods.add("HEAD")
        cls.methods = frozenset(methods)

    @classmethod
    def target(cls, ctx: OAuthContext, config: Settings, route: str = UNMATCHED) -> tornado.routing.Router:
        """The target to put in the application's route table for ``route`` (its pattern)."""
        return _Route(cls, ctx, config, route)

    # -- HTTPMessageDelegate ------------------------------------------------------------

    def headers_received(self, start_line: Any, headers: HTTPHeaders) -> None:
        """The router has built ``self.request`` from them; the body is counted here."""
        count_body_here(self.request)

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self.max_body is not None and self._size <= self.max_body:
            self._chunks.append(chunk)

    def finish(self) -> None:
        start_eagerly(self._serve())

    def on_connection_close(self) -> None:
        self._chunks = []

    # -- serving ------------------------------------------------------------------------

    async def _serve(self) -> None:
        # This coroutine runs in a context of its own (start_eagerly): the id reaches every
        # line logged while the request is served.
        self.request_id = request_id_for(self.request)
        REQUEST_ID.set(self.request_id)
        try:
            method = self.request.method or ""
            if method not in self.methods:
                raise tornado.web.HTTPError(405)
            if self._size and self.max_body is not None:
                self._read_body()
            if xsrf.required(self.request, page=False, takes_session=self.takes_session,
                             session_cookie=self.config.session_cookie):
                xsrf.check(self.request, self.config.xsrf_cookie, self.config.cookie_secret, self.raw_session_id(),
                           self.request.headers.get(xsrf.HEADER))
            await getattr(self, "get" if method == "HEAD" else method.lower())(*self._decoded_path_args())
            if not self._status:
                raise RuntimeError(f"{type(self).__name__}.{method.lower()} sent no response")
        except Exception as exc:  # every failure becomes a response in the documented shape
            self._fail(exc)

    def _read_body(self) -> None:
        if self._size > self.max_body:  # type: ignore[operator]
            raise too_large()
        request = self.request
        request.body = b"".join(self._chunks)
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
        log_failure(self.request, exc, metrics=self.ctx.metrics)
        status, body, headers = response_for(exc)
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            self.log_error = body["error"]
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
        headers = HTTPHeaders(self.default_headers)
        if extra:
            headers.update(extra)
        for morsel in (self.cookies or {}).values():
            headers.add("Set-Cookie", morsel.OutputString())
        headers["Date"] = tornado.httputil.format_timestamp(time.time())
        headers["X-Request-ID"] = self.request_id
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
        connection.write_headers(ResponseStartLine("HTTP/1.1", status, reason_phrase(status)), headers, body or None)
        connection.finish()
        log_access(status, self.request, self.logged_client_id(), self.log_error)
        self.ctx.metrics.request(self.route, self.request.method or "", status, self.request.request_time())

    def logged_client_id(self) -> str | None:
        """The client the access line names."""
        return self.log_client_id

    def clear_cookie(self, name: str) -> None:
        """Tell the browser to drop cookie ``name`` (path ``/``)."""
        if self.cookies is None:
            self.cookies = SimpleCookie()
        self.cookies[name] = ""
        self.cookies[name].update({"path": "/", "max-age": "0", "expires": "Thu, 01 Jan 1970 00:00:00 GMT"})


class NotFoundHandler(JsonHandler):
    """Every path no route matches: 404 ``{"detail"}``, whatever the method."""

    async def get(self, *_: str) -> None:
        raise NotFound(f"No resource at {self.request.path}")

    post = put = patch = delete = options = get


class _Route(tornado.routing.Router):
    """Route-table target that makes a :class:`JsonHandler` for each request it matches."""

    def __init__(self, handler: type[JsonHandler], ctx: OAuthContext, config: Settings, route: str) -> None:
        self.handler, self.ctx, self.config, self.route = handler, ctx, config, route

    def find_handler(self, request: HTTPServerRequest, **kwargs: Any) -> JsonHandler:
        return self.handler(request, self.ctx, self.config, kwargs.get("path_args") or [], self.route)


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
    # Every step in one context, as a Task's are: a context variable set before the first
    # wait and reset after it (PyMongo's operation timeout does this) stays valid.
    context = contextvars.copy_context()
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration:
        return None
    task = asyncio.get_running_loop().create_task(_resume(coro, waiting_on), context=context)
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
