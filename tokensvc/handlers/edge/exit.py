"""The one exit: every response leaves through the :class:`Exit` of its request.

The lifecycle makes one per request, once the request is in. A JSON route's handler, and the
lifecycle answering a request itself (a 405, a 413, an unknown host), hand it a whole answer
(:meth:`Exit.send`), which the response writer puts on the wire in one block. A
``RequestHandler`` route (a page, a static file, the WebSocket's handshake) writes through it
as through Tornado's connection: it *is* the request's connection to Tornado's
``RequestHandler`` (:meth:`Exit.write_headers`, :meth:`Exit.write`, :meth:`Exit.finish`), and
passes on to the real one.

Whichever way, here and nowhere else a response gets what every response carries:

- the security headers of its route's output format (a route's own, or an answer's, win);
- ``X-Request-ID``, the request's id;
- ``Date``, made once a second;
- never a ``Server`` header (the service does not name its software to anyone who asks);
- for a HEAD, the headers its GET would have, ``Content-Length`` included, and no body;

and, as the response ends, its access line and its count in the request metrics
(:meth:`Edge.finished`). A failure is rendered here too (:meth:`Exit.render`: the
one renderer of each output format, :meth:`Edge.render`), in the route's shape:
JSON, or a page.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tornado.template
import tornado.web
from tornado.concurrent import Future
from tornado.httputil import HTTPConnection, HTTPHeaders, HTTPServerRequest, RequestStartLine, ResponseStartLine
from tornado.iostream import IOStream

from tokensvc import errors
from tokensvc.config import STORE_RETRY_AFTER_SECONDS, Settings
from tokensvc.errors import HTTPAnswer, reason_phrase
from tokensvc.handlers.edge.access_log import log_access, redact
from tokensvc.handlers.edge.guards import Hosts
from tokensvc.handlers.edge.headers import PAGE_HEADERS, safe_location
from tokensvc.handlers.edge.inputs import HTML, JSON
from tokensvc.handlers.edge.proxies import ClientAddress
from tokensvc.handlers.edge.readiness import Readiness
from tokensvc.handlers.edge.response_writer import http_date, write_response
from tokensvc.handlers.edge.routes import STANDARD_METHODS, Route
from tokensvc.oauth.context import OAuthContext
from tokensvc.storage.base import StorageError, StoreFault
from tokensvc.telemetry.metrics import Metrics

if TYPE_CHECKING:
    from tokensvc.handlers.edge.inputs import RequestInput

log = logging.getLogger("tokensvc.handlers.exit")  # the name its lines carry: what log filters select


class Exit(HTTPConnection):
    """One request's way out. ``connection`` is Tornado's (``HTTP1Connection``); every byte
    goes through its public ``write_headers``, ``write`` and ``finish``."""

    def __init__(self, edge: Edge, route: Route, request: HTTPServerRequest, request_id: str) -> None:
        assert request.connection is not None
        self.edge, self.route, self.request = edge, route, request
        self.connection: HTTPConnection = request.connection
        # What the exit adds to every response, whichever way it leaves (the request id), and
        # whether the response has a body: a HEAD has its GET's headers and none.
        self.carried = (("X-Request-ID", request_id),)
        self.bodiless = request.method == "HEAD"
        self.handler: RequestInput | None = None  # the handler serving it, which names the client
        self.error: str | None = None  # the error code of a rendered failure
        self.status = 0

    # -- a whole answer -------------------------------------------------------------------

    def send(self, status: int, base: Mapping[str, str], extra: Mapping[str, str], body: bytes,
             cookies: Iterable[str] = ()) -> None:
        """Write the whole response and end it: the header set ``base`` (a route's constant
        one), ``extra`` over it, ``Set-Cookie`` lines."""
        if status == 204:
            body = b""
        lines = [*(("Set-Cookie", cookie) for cookie in cookies), *self.carried]
        if status != 204:
            lines.append(("Content-Length", str(len(body))))
        write_response(self.connection, self.request, status, base, extra, lines, b"" if self.bodiless else body)
        self._ended(status)

    def render(self, exc: BaseException) -> tuple[int, Mapping[str, str], dict[str, str], bytes]:
        """``(status, base, extra, body)`` of the answer to ``exc``, in the route's format."""
        answer = answer_for(exc)
        self.error = answer.error_code
        handler = self.route.handler
        return self.edge.render(answer, handler.output, handler.default_headers, self.request)

    def answer(self, exc: BaseException) -> None:
        """Render the answer to ``exc`` and send it."""
        status, base, extra, body = self.render(exc)
        self.send(status, base, extra, body)

    # -- a RequestHandler's answer, as Tornado writes it ----------------------------------

    def write_headers(self, start_line: RequestStartLine | ResponseStartLine, headers: HTTPHeaders,
                      chunk: bytes | None = None) -> Future[None]:
        assert isinstance(start_line, ResponseStartLine)
        self.status = start_line.code
        for name, value in self.route.handler.default_headers.items():
            if name not in headers:
                headers[name] = value
        if "Server" in headers:
            del headers["Server"]
        for name, value in self.carried:
            headers[name] = value
        headers["Date"] = http_date()[0]
        return self.connection.write_headers(start_line, headers, None if self.bodiless else chunk)

    def write(self, chunk: bytes) -> Future[None]:
        if self.bodiless:
            done: Future[None] = Future()
            done.set_result(None)
            return done
        return self.connection.write(chunk)

    def finish(self) -> None:
        self.connection.finish()
        self._ended(self.status)

    def set_close_callback(self, callback: object) -> None:
        self.connection.set_close_callback(callback)  # type: ignore[attr-defined]

    def detach(self) -> IOStream:
        """The stream, for the WebSocket that the handshake opened."""
        return self.connection.detach()  # type: ignore[attr-defined]

    # ----------------------------------------------------------------------------------------

    def _ended(self, status: int) -> None:
        handler = self.handler
        self.edge.finished(self.request, self.route.path, status,
                           handler.logged_client_id() if handler is not None else None, self.error)


# -- failures as answers ------------------------------------------------------------------------


def answer_for(exc: BaseException) -> HTTPAnswer:
    """The answer to any failure: an :class:`HTTPAnswer` is its own; a store that does not
    answer is 503 with ``Retry-After``, one that refuses for good 500 without it; Tornado's
    own ``HTTPError`` keeps its status; anything else is 500."""
    if isinstance(exc, HTTPAnswer):
        return exc
    if isinstance(exc, StorageError):
        return errors.StoreUnavailable(STORE_RETRY_AFTER_SECONDS)
    if isinstance(exc, StoreFault):
        return errors.StoreRefused()
    if isinstance(exc, tornado.web.HTTPError):
        return errors.Detail(exc.reason or reason_phrase(exc.status_code), exc.status_code)
    return errors.InternalError()


def log_failure(request: HTTPServerRequest, exc: BaseException, metrics: Metrics,
                exc_info: Any = None) -> None:
    """The log line of a failure: a store that is away is a warning, a fault a traceback with
    the URI redacted (never Tornado's own line, which prints it raw); answers are the access
    line's business. Store failures are counted."""
    if isinstance(exc, StorageError):
        log.warning("store unavailable: %s %s: %s", request.method, request.path, exc)
        metrics.store_errors.labels("unavailable").inc()
    elif isinstance(exc, StoreFault):
        log.error("store fault: %s %s: %s", request.method, request.path, exc)
        metrics.store_errors.labels("refused").inc()
    elif not isinstance(exc, (HTTPAnswer, tornado.web.HTTPError)):
        log.error("Uncaught exception %s %s", request.method, redact(request.uri or ""), exc_info=exc_info or exc)


# -- the answer's JSON text ---------------------------------------------------------------------


_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(body: Any) -> str:
    """A response body as compact JSON, non-ASCII characters kept as they are. A body holding
    a lone surrogate (no text, which UTF-8 does not encode) is written all in ASCII, escapes
    and all: an answer must encode whatever it echoes, or no answer is sent."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(body, separators=(",", ":")) if _SURROGATE.search(text) else text


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
