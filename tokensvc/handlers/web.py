"""The ``RequestHandler`` adapter: pages, the WebSocket upgrade and static files are Tornado
``RequestHandler``s, entered through the request lifecycle (:mod:`.lifecycle`) like every route.

What a :class:`WebHandler` adds to Tornado's is only the wiring to the lifecycle: the format's
security headers and the request id on every response, HEAD wherever GET is, the lifecycle's
XSRF decision in Tornado's own hook, and every error rendered by the lifecycle's renderer.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, ClassVar

import tornado.web

from tokensvc.handlers.headers import PAGE_HEADERS, STATIC_HEADERS, safe_location
from tokensvc.handlers.inputs import RequestInput
from tokensvc.handlers.lifecycle import HTML, MAX_BODY_BYTES, UNMATCHED, Edge, answer_for, check_xsrf, log_failure
from tokensvc.logs import REQUEST_ID


class WebHandler(RequestInput, tornado.web.RequestHandler):
    """A ``RequestHandler`` route. Subclasses define ``get``/``post``; ``edge`` and ``route``
    come from the route table."""

    default_headers: ClassVar[dict[str, str]] = PAGE_HEADERS
    output: ClassVar[str] = HTML
    max_body: ClassVar[int | None] = MAX_BODY_BYTES
    reads_session: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # HEAD is answered wherever GET is: GET's status and headers, no body (RFC 9110 §9.3.2;
        # Tornado drops the body of a HEAD response).
        if cls.head is tornado.web.RequestHandler.head and cls.get is not tornado.web.RequestHandler.get:
            cls.head = cls.get

    def initialize(self, edge: Edge, route: str = UNMATCHED) -> None:
        self.edge, self.ctx, self.config = edge, edge.ctx, edge.config
        self.route = route  # the route's pattern, for the metrics
        self.log_client_id: str | None = None
        self.log_error: str | None = None

    def set_default_headers(self) -> None:
        for name, value in self.default_headers.items():
            self.set_header(name, value)
        self.set_header("X-Request-ID", REQUEST_ID.get() or "")

    def static_url(self, path: str, include_host: bool | None = None, **kwargs: Any) -> str:
        """The versioned URL of one of the pages' own files (``/static/...``)."""
        return self.edge.static_url(path)

    def check_xsrf_cookie(self) -> None:
        """Tornado's hook before every unsafe method: the lifecycle's one XSRF decision."""
        check_xsrf(self)

    def redirect(self, url: str, permanent: bool = False, status: int | None = None) -> None:
        """Every Location is checked first (:func:`.headers.safe_location`)."""
        super().redirect(safe_location(url), permanent, status)

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        log_failure(self.request, value, self.edge.metrics, (typ, value, tb))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        answer = answer_for(exc if exc is not None else tornado.web.HTTPError(status_code))
        self.log_error = answer.error_code
        status, base, extra, body = self.edge.render(answer, self.output, self.default_headers, self.request)
        self.set_status(status)
        for name, value in {**base, **extra}.items():
            self.set_header(name, value)
        self.finish(body)


def log_request(handler: tornado.web.RequestHandler) -> None:
    """The application's ``log_function``: a ``RequestHandler`` route is answered."""
    if isinstance(handler, WebHandler):
        handler.edge.finished(handler.request, handler.route, handler.get_status(), handler.log_client_id,
                              handler.log_error)


class StaticFiles(WebHandler, tornado.web.StaticFileHandler):
    """``/static/{path}`` and ``/favicon.ico``: Tornado's static files."""

    default_headers = STATIC_HEADERS

    def initialize(self, path: str, edge: Edge, route: str = UNMATCHED) -> None:  # type: ignore[override]
        WebHandler.initialize(self, edge, route)
        tornado.web.StaticFileHandler.initialize(self, path)

    async def get(self, path: str | None = None, include_body: bool = True) -> None:
        """A route without a ``{path}`` (``/favicon.ico``) serves the file of its own name."""
        await super().get(path or self.request.path.lstrip("/"), include_body)

    def head(self, path: str | None = None) -> Awaitable[None]:
        return self.get(path, include_body=False)
