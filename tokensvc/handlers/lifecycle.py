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
4. the route's handler runs, through one of two thin adapters: :class:`.json_api.JsonHandler`
   for the JSON routes, :class:`.web.WebHandler` (Tornado's ``RequestHandler``) for pages, the
   socket and static files. Before an unsafe request is served, :func:`.guards.check_xsrf`
   decides whether it must prove it came from this service's pages, and checks it;
5. the answer leaves through the request's :class:`~.exit.Exit`, the one exit: a failure
   rendered there as an :class:`~tokensvc.errors.HTTPAnswer` once per output format
   (:meth:`Edge.render`: JSON or an HTML page); every response given what every response
   carries (the format's security headers, the request id, ``Date``); its access line written
   and its metrics counted as it ends (:meth:`Edge.finished`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import tornado.httputil
import tornado.template
import tornado.web
from tornado.httputil import HTTPHeaders, HTTPServerRequest

from tokensvc import errors
from tokensvc.config import Settings
from tokensvc.errors import HTTPAnswer
from tokensvc.handlers.access_log import log_access
from tokensvc.handlers.exit import Exit
from tokensvc.handlers.guards import Hosts
from tokensvc.handlers.headers import PAGE_HEADERS, safe_location
from tokensvc.handlers.inputs import HTML, JSON
from tokensvc.handlers.proxies import ClientAddress
from tokensvc.handlers.readiness import Readiness
from tokensvc.handlers.routes import STANDARD_METHODS, Route
from tokensvc.logs import REQUEST_ID
from tokensvc.metrics import Metrics
from tokensvc.oauth.context import OAuthContext

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
# A request's target (path and query), and its header fields together, each at most 64 KiB:
# past that the answer is 414 or 431 in the route's shape. Tornado reads a request's head up to
# READ_HEAD_BYTES (the listeners' max_header_size) so that one a little over still gets that
# answer; a head beyond it is no HTTP request a client sends, and its connection is closed.
MAX_TARGET_BYTES = 64 * 1024
MAX_HEADER_FIELD_BYTES = 64 * 1024
READ_HEAD_BYTES = 1024 * 1024


_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(body: Any) -> str:
    """A response body as compact JSON, non-ASCII characters kept as they are. A body holding
    a lone surrogate (no text, which UTF-8 does not encode) is written all in ASCII, escapes
    and all: an answer must encode whatever it echoes, or no answer is sent."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(body, separators=(",", ":")) if _SURROGATE.search(text) else text


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


# -- what every route shares ---------------------------------------------------------------------


class Edge:
    """What every route shares: the protocol context, the settings, the metrics, the route
    table, and the one renderer of each output format; ``admin``: the admin listener's."""

    def __init__(self, ctx: OAuthContext, config: Settings, routes: list[Route], template_path: Path,
                 static_settings: dict[str, Any], static_files: type[tornado.web.StaticFileHandler],
                 admin: bool = False) -> None:
        if not isinstance(ctx.metrics, Metrics):  # the protocol sees an interface; the edge needs the registry
            raise TypeError("a service's context reports to its Metrics (bootstrap.make_context)")
        self.ctx, self.config, self.metrics = ctx, config, ctx.metrics
        self.routes = routes  # the route table
        self.templates = tornado.template.Loader(str(template_path))
        self.hosts = Hosts(config, admin=admin)  # the admin listener answers its own address too
        proxy = config.proxy
        self.client_address = ClientAddress(config.xheaders, proxy.trusted_hops, proxy.trusted_networks,
                                            proxy.real_ip_header)
        self._static_settings, self._static_files = static_settings, static_files
        self.in_flight = 0  # requests whose body is in and whose answer is not yet written
        # The open WebSockets of GET /v1/ws, each with what tells it to go (a graceful stop:
        # :meth:`end_sockets`); ``stopping`` from then on, when a socket opening is told at once.
        self.sockets: dict[object, Callable[[], None]] = {}
        self.stopping = False
        self.readiness = Readiness(ctx.store)
        # This application's OpenAPI document, built at its first request: its server URL is
        # this application's own (two applications in one process publish their own).
        self.openapi_document: bytes | None = None

    def end_sockets(self) -> int:
        """The process stops: tell each open WebSocket to go (1012, service restart: its
        client reconnects to another process), and each one opening from now on as it opens.
        How many were told."""
        self.stopping = True
        ends = list(self.sockets.values())
        for end in ends:
            try:
                end()
            except Exception:  # one broken socket must not keep the others open
                log.exception("a WebSocket failed to end")
        return len(ends)

    async def drained(self, poll_seconds: float = 0.05) -> None:
        """Return once no request is in flight (a graceful stop waits for it, with a deadline)."""
        while self.in_flight > 0:
            await asyncio.sleep(poll_seconds)

    def static_url(self, path: str) -> str:
        return self._static_files.make_static_url(self._static_settings, path)

    def page(self, template: str, **namespace: Any) -> bytes:
        """A page made from ``template``, outside any handler (the error page)."""
        return self.templates.load(template).generate(static_url=self.static_url,
                                                      service_name=self.config.service_name, **namespace)

    def render(self, answer: HTTPAnswer, output: str, headers: dict[str, str],
               request: HTTPServerRequest | None = None) -> tuple[int, dict[str, str], dict[str, str], bytes]:
        """``(status, base, extra, body)`` of ``answer`` in ``output``: the route's ``headers``
        (or the pages' ones) as ``base``, and over them ``extra``, the answer's own.
        A browser that navigated to a JSON route's address (the 404 of a mistyped one, a 405, a
        5xx) gets the error page rather than JSON; an API caller keeps its JSON."""
        status = answer.status_code
        if output == JSON and request is not None and (status in (404, 405) or status >= 500) and navigation(request):
            output, headers = HTML, PAGE_HEADERS
        extra = answer.headers()
        if "Location" in extra:
            extra["Location"] = safe_location(extra["Location"])
        body = answer.body()
        if body is None:
            return status, headers, extra, b""
        if output == HTML:
            extra["Content-Type"] = "text/html; charset=UTF-8"
            return status, headers, extra, self.page("error.html", title=answer.title, message=answer.message,
                                                     status=status)
        extra["Content-Type"] = "application/json"
        return status, headers, extra, dumps(body).encode("utf-8")

    def finished(self, request: HTTPServerRequest, route: str, status: int, client_id: str | None,
                 error: str | None) -> None:
        """The request is answered (its exit calls this as the response ends): its access line,
        and its count in the metrics."""
        self.in_flight = max(0, self.in_flight - 1)
        seconds = request.request_time()
        log_access(status, request, client_id, error, route, seconds)
        method = request.method if request.method in STANDARD_METHODS else "other"
        self.metrics.request(route, method, status, seconds)


def navigation(request: HTTPServerRequest) -> bool:
    """Whether a browser is opening ``request``'s address as a page (not an app's fetch): a
    GET whose ``Accept`` ranks ``text/html`` above JSON by their q-values (RFC 9110 §12.5.1)."""
    headers = request.headers
    if request.method not in ("GET", "HEAD") or headers.get("Sec-Fetch-Mode", "navigate") != "navigate":
        return False
    accept = headers.get("Accept", "")
    return quality(accept, "text/html") > quality(accept, "application/json")


def quality(accept: str, media_type: str) -> float:
    """The q-value ``accept`` gives ``media_type``: that of its most specific matching range
    (``type/subtype`` over ``type/*`` over ``*/*``); 0 when none matches."""
    kind = media_type.split("/", 1)[0]
    best, found = -1, 0.0
    for item in accept.split(","):
        media_range, *parameters = (part.strip() for part in item.split(";"))
        media_range = media_range.lower()
        specificity = {media_type: 2, f"{kind}/*": 1, "*/*": 0}.get(media_range, -1)
        if specificity <= best:
            continue
        q = 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    q = 0.0
        best, found = specificity, q
    return found


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
