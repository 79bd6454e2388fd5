"""The ``RequestHandler`` adapter: pages, the WebSocket upgrade and static files are Tornado
``RequestHandler``s, entered through the request lifecycle (:mod:`.lifecycle`) like every route.

What a :class:`WebHandler` adds to Tornado's is only the wiring to the lifecycle: it writes
through the request's exit (:mod:`.exit`, which gives every response its format's security
headers, the request id and ``Date``, and writes its access line), HEAD is served by GET, the
lifecycle's XSRF decision runs in Tornado's own hook, and every error is rendered by the exit's
renderer.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import tornado.web

from tokensvc.handlers.edge.exit import Exit, log_failure
from tokensvc.handlers.edge.guards import check_xsrf
from tokensvc.handlers.edge.headers import PAGE_HEADERS, STATIC_HEADERS, safe_location
from tokensvc.handlers.edge.inputs import HTML, RequestInput
from tokensvc.handlers.edge.lifecycle import MAX_BODY_BYTES
from tokensvc.handlers.edge.routes import handler_method


class WebHandler(RequestInput, tornado.web.RequestHandler):
    """A ``RequestHandler`` route. Subclasses define ``get``/``post``."""

    default_headers: ClassVar[dict[str, str]] = PAGE_HEADERS
    output: ClassVar[str] = HTML
    max_body: ClassVar[int | None] = MAX_BODY_BYTES
    reads_session: ClassVar[bool] = True

    def initialize(self) -> None:
        # The lifecycle made the request's connection its exit: everything this handler
        # writes leaves through it.
        self.exit = cast(Exit, self.request.connection)
        assert isinstance(self.exit, Exit), "a WebHandler is served through the request lifecycle"
        self.exit.handler = self
        self.edge, self.route = self.exit.edge, self.exit.route
        self.ctx, self.config = self.edge.ctx, self.edge.config
        self.log_client_id = None

    def head(self, *args: Any, **kwargs: Any) -> Any:
        """HEAD is served by GET (the route's method table has HEAD only where it has GET); the
        exit sends its headers and no body."""
        return getattr(self, handler_method("HEAD"))(*args, **kwargs)

    def compute_etag(self) -> str | None:
        """No validator: pages are never cached (``no-store``); static files have their own."""
        return None

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
        status, base, extra, body = self.exit.render(exc if exc is not None else tornado.web.HTTPError(status_code))
        self.set_status(status)
        for name, value in {**base, **extra}.items():
            self.set_header(name, value)
        self.finish(body)


class StaticFiles(WebHandler, tornado.web.StaticFileHandler):
    """``/static/{path}`` and ``/favicon.ico``: Tornado's static files, with their validator
    (``Etag``, ``Last-Modified``) for a browser's conditional requests."""

    default_headers = STATIC_HEADERS
    compute_etag = tornado.web.StaticFileHandler.compute_etag

    def initialize(self, path: str) -> None:  # type: ignore[override]
        WebHandler.initialize(self)
        tornado.web.StaticFileHandler.initialize(self, path)

    async def get(self, path: str | None = None, include_body: bool = True) -> None:
        """A route without a ``{path}`` (``/favicon.ico``) serves the file of its own name."""
        await super().get(path or self.request.path.lstrip("/"), include_body)
