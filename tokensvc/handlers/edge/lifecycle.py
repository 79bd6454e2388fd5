"""The request lifecycle: the one way every request goes through the service.

Every route (a JSON endpoint, a page, the WebSocket upgrade, a static file, ``/metrics``, the
OpenAPI document, and the 404 of a path no route matches) is entered through a
:class:`Lifecycle`, the HTTP message delegate the application hands each request to, and left
through its :class:`~.exit.Exit`. In order:

1. the request gets its id (``X-Request-ID``: the caller's when well-formed, else a new one),
   which every line logged while it is served names;
2. the host it names (:class:`.guards.Hosts`) and the route's method table
   (:mod:`.routes`): any other method is 405 with ``Allow``; HEAD is served wherever GET is;
3. the body is counted here, not by Tornado (whose own limit answers a bare 400 before any
   route is asked): past the route's limit the answer is 413 in the route's shape;
4. the route's handler runs, through one of two thin adapters: :class:`.json_handler.JsonHandler`
   for the JSON routes, :class:`.web_handler.WebHandler` (Tornado's ``RequestHandler``) for pages, the
   socket and static files. Before an unsafe request is served, :func:`.guards.check_xsrf`
   decides whether it must prove it came from this service's pages, and checks it;
5. the answer leaves through the request's :class:`~.exit.Exit`, the one exit: a failure
   rendered there as an :class:`~tokensvc.errors.HTTPAnswer` once per output format
   (:meth:`.exit.Edge.render`: JSON or an HTML page); every response given what every response
   carries (the format's security headers, the request id, ``Date``); its access line written
   and its metrics counted as it ends (:meth:`.exit.Edge.finished`).
"""

from __future__ import annotations

import random
import re
import sys
from typing import Any, Protocol

import tornado.httputil
import tornado.template
import tornado.web
from tornado.httputil import HTTPHeaders, HTTPServerRequest

from tokensvc import errors
from tokensvc.errors import HTTPAnswer
from tokensvc.handlers.edge.exit import Edge, Exit
from tokensvc.handlers.edge.routes import Route
from tokensvc.telemetry.logs import REQUEST_ID

MAX_BODY_BYTES = 64 * 1024
# A request's target (path and query), and its header fields together, each at most 64 KiB:
# past that the answer is 414 or 431 in the route's shape. Tornado reads a request's head up to
# READ_HEAD_BYTES (the listeners' max_header_size) so that one a little over still gets that
# answer; a head beyond it is no HTTP request a client sends, and its connection is closed.
MAX_TARGET_BYTES = 64 * 1024
MAX_HEADER_FIELD_BYTES = 64 * 1024
READ_HEAD_BYTES = 1024 * 1024


# -- the request's id -------------------------------------------------------------------------

_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def request_id_for(request: HTTPServerRequest) -> str:
    """The request's ``X-Request-ID`` when it is 1-64 characters of ``[A-Za-z0-9._-]``
    (a proxy's or a client's, to follow a request across services); otherwise a new one: 64
    random bits as 16 hex digits. An id names a request, it guards nothing (a caller may send
    its own), so it comes from the process's pseudo-random generator (reseeded in each forked
    worker), not from a system call per request."""
    incoming = request.headers.get("X-Request-ID")
    if incoming is not None and _REQUEST_ID.fullmatch(incoming):
        return incoming
    return f"{random.getrandbits(64):016x}"


class Start(Protocol):
    def __call__(self, way_out: Exit, path_args: list[bytes]) -> None: ...


# -- the way in ------------------------------------------------------------------------------------


class Lifecycle(tornado.httputil.HTTPMessageDelegate):
    """One request, from its headers to its answer, whatever route it is for.

    ``inner`` is Tornado's delegate of a ``RequestHandler`` route (pages, the socket, static
    files); a JSON route has none: its body is kept here, and ``start`` serves it.
    """

    def __init__(self, edge: Edge, route: Route, request: HTTPServerRequest, path_args: list[bytes], *,
                 inner: tornado.httputil.HTTPMessageDelegate | None = None, start: Start | None = None) -> None:
        self.edge, self.route, self.request, self.path_args = edge, route, request, path_args
        self.inner, self.start = inner, start
        self.limit: int | None = route.handler.max_body
        self.size = 0
        self.chunks: list[bytes] = []

    def headers_received(self, start_line: Any, headers: HTTPHeaders) -> Any:
        # Tornado's own limit answers a bare 400 and closes the connection: the body is counted
        # here instead, the bytes past the limit read and dropped (the body timeout bounds that).
        connection = self.request.connection
        if connection is not None and hasattr(connection, "set_max_body_size"):
            connection.set_max_body_size(sys.maxsize)
        if self.inner is not None:
            return self.inner.headers_received(start_line, headers)
        return None

    def data_received(self, chunk: bytes) -> Any:
        self.size += len(chunk)
        if self.limit is None or self.size > self.limit:
            return None
        if self.inner is not None:
            return self.inner.data_received(chunk)
        self.chunks.append(chunk)
        return None

    def finish(self) -> None:
        """The whole request is in: answer it."""
        request = self.request
        request.remote_ip = self.edge.client_address(request)  # behind proxies: the client's, once
        request_id = request_id_for(request)
        # For this call only: the handler's Task (or the JSON route's coroutine) copies it, and
        # the connection's own context keeps none.
        token = REQUEST_ID.set(request_id)
        self.edge.in_flight += 1
        try:
            way_out = Exit(self.edge, self.route, request, request_id)
            refusal = self._refusal()
            if refusal is not None:
                if self.inner is not None:
                    self.inner.on_connection_close()  # drops what it had buffered
                way_out.answer(refusal)
            elif self.inner is not None:
                request.connection = way_out  # the RequestHandler writes through the exit
                self.inner.finish()
            else:
                if self.chunks:
                    request.body = b"".join(self.chunks)
                assert self.start is not None
                self.start(way_out, self.path_args)
        finally:
            REQUEST_ID.reset(token)

    def on_connection_close(self) -> None:
        self.chunks = []
        if self.inner is not None:
            self.inner.on_connection_close()

    def _refusal(self) -> HTTPAnswer | None:
        request = self.request
        if len(request.uri or "") > MAX_TARGET_BYTES:
            return errors.TooLarge(414, f"URI Too Long: a path and query of at most {MAX_TARGET_BYTES} bytes")
        if sum(len(name) + len(value) for name, value in request.headers.get_all()) > MAX_HEADER_FIELD_BYTES:
            return errors.TooLarge(431, f"Request Header Fields Too Large: at most {MAX_HEADER_FIELD_BYTES} bytes "
                                        "together")
        refusal = self.edge.hosts.refusal(self.request, self.route.path)
        if refusal is not None:
            return refusal
        if self.request.method not in self.route.methods:
            return errors.MethodNotAllowed(self.route.methods)
        if self.limit is not None and self.size > self.limit:
            return errors.TooLarge()
        return None
