"""The request lifecycle: the one way every request goes through the service.

Every route (a JSON endpoint, a page, the WebSocket upgrade, a static file, ``/metrics``, the
OpenAPI document, and the 404 of a path no route matches) is entered through a
:class:`Lifecycle`, the HTTP message delegate the application hands each request to. In order:

1. the request gets its id (``X-Request-ID``: the caller's when well-formed, else a new one),
   which every line logged while it is served names;
2. the route's method table (:func:`methods_of`): any other method is 405 with ``Allow``; HEAD
   is served wherever GET is;
3. the body is counted here, not by Tornado (whose own limit answers a bare 400 before any
   route is asked): past the route's limit the answer is 413 in the route's shape;
4. the route's handler runs, through one of two thin adapters: :class:`.json_api.JsonHandler`
   for the JSON routes, :class:`.web.WebHandler` (Tornado's ``RequestHandler``) for pages, the
   socket and static files. Before an unsafe request is served, :func:`check_xsrf` decides
   whether it must prove it came from this service's pages, and checks it;
5. a failure becomes an :class:`~tokensvc.errors.HTTPAnswer` (:func:`answer_for`), rendered
   once per output format (:meth:`Edge.render`: JSON or an HTML page), with the format's
   security headers;
6. :meth:`Edge.finished` writes the access line and counts the request in the metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import tornado.httputil
import tornado.template
import tornado.web
from tornado.httputil import HTTPHeaders, HTTPServerRequest

from tokensvc import errors
from tokensvc.config import STORE_RETRY_AFTER_SECONDS, Settings
from tokensvc.errors import HTTPAnswer, reason_phrase
from tokensvc.handlers import xsrf
from tokensvc.handlers.access_log import log_access, redact
from tokensvc.handlers.headers import PAGE_HEADERS, safe_location
from tokensvc.handlers.inputs import RequestInput
from tokensvc.handlers.proxies import ClientAddress
from tokensvc.handlers.readiness import Readiness
from tokensvc.handlers.response_writer import write_response
from tokensvc.identifiers import is_loopback
from tokensvc.logs import REQUEST_ID
from tokensvc.metrics import Metrics
from tokensvc.oauth.context import OAuthContext
from tokensvc.storage.base import StorageError, StoreFault

log = logging.getLogger(__name__)

STANDARD_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_BODY_BYTES = 64 * 1024
JSON, HTML = "json", "html"  # the two output formats


def dumps(body: Any) -> str:
    """A response body as compact JSON, non-ASCII characters kept as they are."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


# -- routes and their method tables ---------------------------------------------------------


def methods_of(handler: type) -> frozenset[str]:
    """The methods ``handler`` answers: those it defines, and HEAD wherever GET is."""
    unimplemented = tornado.web.RequestHandler.get
    found = {method for method in STANDARD_METHODS
             if callable(defined := getattr(handler, method.lower(), None)) and defined is not unimplemented}
    if "GET" in found:
        found.add("HEAD")
    if getattr(handler, "cors", False):  # the preflight (handlers/cors.py)
        found.add("OPTIONS")
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class Route:
    """One entry of the route table."""

    path: str  # as the OpenAPI document writes it ({name}: one path segment); the metrics' label
    handler: type[RequestInput]
    methods: frozenset[str]
    parameters: tuple[str, ...] = field(init=False)  # the names of its {name} segments, in order

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", tuple(re.findall(r"\{([^}]+)\}", self.path)))

    @classmethod
    def of(cls, path: str, handler: type[RequestInput]) -> Route:
        return cls(path, handler, methods_of(handler))

    @property
    def pattern(self) -> str:
        """The route's regular expression: the path as written, each ``{name}`` one segment."""
        return "".join("([^/]*)" if part.startswith("{") else re.escape(part)
                       for part in re.split(r"(\{[^}]+\})", self.path)) + "$"

    @property
    def allow(self) -> str:
        return ", ".join(sorted(self.methods))


UNMATCHED = "(unmatched)"  # the metrics' route label of a request no route matched


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


# -- XSRF: the one decision ---------------------------------------------------------------------


def check_xsrf(handler: RequestInput) -> None:
    """Every unsafe request that the session cookie may authorize must prove it came from this
    service's own pages: on a page, always (a sign-in form too: login CSRF); on a JSON route,
    when it carries the cookie. A request to a route where an ``Authorization`` header takes
    the cookie's place (``bearer_replaces_cookie``: the ``/v1`` API's bearer tokens)
    authenticates by that header: the one exemption. Any other route that acts on the cookie
    (sign-out) asks for the token whatever else the request carries. Routes that never read the
    cookie (``reads_session = False``) are not asked.

    The proof is twofold. Where the browser says where the request comes from
    (``Sec-Fetch-Site``, ``Origin``), it must be this service's own origin: a sibling subdomain
    or a page on plain http that planted a cookie is another origin. And the request repeats
    the XSRF token (:mod:`.xsrf`), signed for its session."""
    request = handler.request
    if request.method not in UNSAFE_METHODS or not handler.reads_session:
        return
    config = handler.config
    if handler.output != HTML and (("Authorization" in request.headers and handler.bearer_replaces_cookie)
                                   or config.session_cookie not in request.cookies):
        return
    if not _from_own_origin(request, config):
        raise errors.XsrfFailed()
    sent = [value for value in request.body_arguments.get(xsrf.FIELD, []) if value]  # empty: absent
    submitted = sent[-1].decode("ascii", "replace") if sent else request.headers.get(xsrf.HEADER)
    if not xsrf.matches(request, config.xsrf_cookie, config.cookie_secret, handler.raw_session_id(), submitted):
        raise errors.XsrfFailed()


def _from_own_origin(request: HTTPServerRequest, config: Settings) -> bool:
    """Whether the browser says the request comes from the service's own origin, or says
    nothing at all (not a browser: the token decides). ``Sec-Fetch-Site`` first; else
    ``Origin``, which the service's pages send as their own (``Referrer-Policy: same-origin``):
    ``Origin: null`` (a sandboxed frame, a ``data:`` page, a page under no-referrer) says
    nothing of where the request comes from and is refused."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("Origin")
    return origin is None or origin in own_origins(config)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
HOST_FREE = ("/healthz", "/readyz")  # what a load balancer's probe asks by the instance's own address


def allowed_hosts(config: Settings) -> frozenset[str] | None:
    """The host names a request may name (None: any): those of the public URLs and
    ``server.allowed_hosts``, and the loopback names where a public URL is on loopback."""
    if "*" in config.server.allowed_hosts:
        return None
    names = {urlsplit(url).hostname or "" for url in (config.base_url, config.auth_url)}
    names.update(host.lower().strip("[]") for host in config.server.allowed_hosts)
    if names & {"localhost", "127.0.0.1", "::1"} or any(is_loopback(name) for name in names):
        names.update(LOOPBACK_NAMES)
    return frozenset(names)


def own_origins(config: Settings) -> frozenset[str]:
    """The service's public origins (scheme, host and port of ``base_url`` and ``auth_url``)."""
    return frozenset(_origin(url) for url in (config.base_url, config.auth_url))


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


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


# -- what every route shares ---------------------------------------------------------------------


class Edge:
    """What every route shares: the protocol context, the settings, the metrics, the route
    table, and the one renderer of each output format."""

    def __init__(self, ctx: OAuthContext, config: Settings, routes: list[Route], template_path: Path,
                 static_settings: dict[str, Any], static_files: type[tornado.web.StaticFileHandler]) -> None:
        if not isinstance(ctx.metrics, Metrics):  # the protocol sees an interface; the edge needs the registry
            raise TypeError("a service's context reports to its Metrics (bootstrap.make_context)")
        self.ctx, self.config, self.metrics = ctx, config, ctx.metrics
        self.routes = routes  # the route table
        self.templates = tornado.template.Loader(str(template_path))
        self.hosts = allowed_hosts(config)
        proxy = config.proxy
        self.client_address = ClientAddress(config.xheaders, proxy.trusted_hops, proxy.trusted_networks,
                                            proxy.real_ip_header)
        self._static_settings, self._static_files = static_settings, static_files
        self.in_flight = 0  # requests whose body is in and whose answer is not yet written
        self.readiness = Readiness(ctx.store)
        # This application's OpenAPI document, built at its first request: its server URL is
        # this application's own (two applications in one process publish their own).
        self.openapi_document: bytes | None = None

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
        """The request is answered: its access line, and its count in the metrics."""
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
    def __call__(self, edge: Edge, route: Route, request: HTTPServerRequest, request_id: str,
                 path_args: list[bytes]) -> None: ...


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
            refusal = self._refusal()
            if refusal is not None:
                if self.inner is not None:
                    self.inner.on_connection_close()  # drops what it had buffered
                self._answer(refusal, request_id)
            elif self.inner is not None:
                self.inner.finish()
            else:
                if self.chunks:
                    self.request.body = b"".join(self.chunks)
                assert self.start is not None
                self.start(self.edge, self.route, self.request, request_id, self.path_args)
        finally:
            REQUEST_ID.reset(token)

    def on_connection_close(self) -> None:
        self.chunks = []
        if self.inner is not None:
            self.inner.on_connection_close()

    def _refusal(self) -> HTTPAnswer | None:
        hosts = self.edge.hosts
        if hosts is not None and self.request.host_name.strip("[]") not in hosts \
                and self.route.path not in HOST_FREE:
            return errors.BadRequest("Unknown host: this service answers to its configured names only")
        if self.request.method not in self.route.methods:
            return errors.MethodNotAllowed(self.route.methods)
        if self.limit is not None and self.size > self.limit:
            return errors.BodyTooLarge()
        return None

    def _answer(self, answer: HTTPAnswer, request_id: str) -> None:
        handler = self.route.handler
        status, base, extra, body = self.edge.render(answer, handler.output, handler.default_headers, self.request)
        write_response(self.request, status, base, extra, body, request_id)
        self.edge.finished(self.request, self.route.path, status, None, answer.error_code)
