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
(:meth:`.lifecycle.Edge.finished`). A failure is rendered here too (:meth:`Exit.render`: the
one renderer of each output format, :meth:`.lifecycle.Edge.render`), in the route's shape:
JSON, or a page.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import tornado.web
from tornado.concurrent import Future
from tornado.httputil import HTTPConnection, HTTPHeaders, HTTPServerRequest, RequestStartLine, ResponseStartLine
from tornado.iostream import IOStream

from tokensvc import errors
from tokensvc.config import STORE_RETRY_AFTER_SECONDS
from tokensvc.errors import HTTPAnswer, reason_phrase
from tokensvc.handlers.edge.access_log import redact
from tokensvc.handlers.edge.response_writer import http_date, write_response
from tokensvc.storage.base import StorageError, StoreFault
from tokensvc.telemetry.metrics import Metrics

if TYPE_CHECKING:
    from tokensvc.handlers.edge.inputs import RequestInput
    from tokensvc.handlers.edge.lifecycle import Edge
    from tokensvc.handlers.edge.routes import Route

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
