"""The request body limit: a body over 64 KiB gets 413, whatever its size or framing.

Tornado's HTTP server enforces its own ``max_body_size`` by answering a bare 400 and closing
the connection before any handler is asked. So every route lifts that limit for its request
(:func:`count_body_here`) and counts the body itself: a ``JsonHandler`` as its data arrives,
a page (or any other ``RequestHandler``) through :class:`LimitedBody`, which the application
puts in front of Tornado's own delegate. Bytes past the limit are read and dropped, never
kept (the server's body timeout bounds how long that may take), and the route then answers
413 in its own shape.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import tornado.httputil
import tornado.web
from tornado.httputil import HTTPServerRequest

from tokensvc.handlers.access_log import request_id_for
from tokensvc.logs import REQUEST_ID

MAX_BODY_BYTES = 64 * 1024
TOO_LARGE = "Request Entity Too Large"


def count_body_here(request: HTTPServerRequest) -> None:
    """Lift the connection's own body limit for ``request``: the route counts instead."""
    connection = request.connection
    if connection is not None and hasattr(connection, "set_max_body_size"):
        connection.set_max_body_size(sys.maxsize)


def too_large() -> tornado.web.HTTPError:
    return tornado.web.HTTPError(413, reason=TOO_LARGE)


class LimitedBody(tornado.httputil.HTTPMessageDelegate):
    """Tornado's delegate for a ``RequestHandler`` route, with the body limit in front.

    ``refusal`` makes the delegate that answers instead when the body is over the limit.
    """

    def __init__(self, request: HTTPServerRequest, inner: tornado.httputil.HTTPMessageDelegate,
                 refusal: Callable[[], tornado.httputil.HTTPMessageDelegate]) -> None:
        self.request, self.inner, self.refusal = request, inner, refusal
        self.size = 0

    def headers_received(self, start_line: Any, headers: tornado.httputil.HTTPHeaders) -> Any:
        count_body_here(self.request)
        return self.inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Any:
        self.size += len(chunk)
        if self.size <= MAX_BODY_BYTES:
            return self.inner.data_received(chunk)
        return None

    def finish(self) -> None:
        # The request's id, for the handler (its X-Request-ID) and every line it logs: set for
        # this call only, the handler's own Task copies it, the connection's context keeps none.
        token = REQUEST_ID.set(request_id_for(self.request))
        try:
            if self.size <= MAX_BODY_BYTES:
                self.inner.finish()
            else:
                self.inner.on_connection_close()  # drops what it had buffered
                self.refusal().finish()
        finally:
            REQUEST_ID.reset(token)

    def on_connection_close(self) -> None:
        self.inner.on_connection_close()
