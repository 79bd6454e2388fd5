"""The plain idioms the request's observability mechanisms are measured against
(``bench/inprocess.py --ab delegate plain-access-line``, and the others): each is the way the
service did it before, kept here for the A/B only.

- the access line through the formatter, for every request (``logs.write``, as JSON lines
  and a test's capture still are): the path redacted and cut, a fields dict, the message
  escaped by the formatter, the time formatted by it;
- the request metrics as ``prometheus_client`` children: a counter and a histogram of the
  request's label set, each with its lock;
- the request id from a ``getrandom`` system call (``os.urandom``);

and, for the revocation feed's fan-out (``--ab delegate unbounded-feed revoke-feed``), its
reader as it was before what a reader has not taken was bounded: each message queued on the
socket, nothing counted.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import tornado.websocket
from prometheus_client import CollectorRegistry, Counter, Histogram
from tornado.httputil import HTTPServerRequest

from tokensvc.handlers import feed
from tokensvc.handlers.edge import access_log
from tokensvc.handlers.edge.exit import dumps
from tokensvc.handlers.edge.routes import Route
from tokensvc.telemetry import logs, metrics


def log_access(status: int, request: HTTPServerRequest, client_id: str | None, error: str | None = None,
               route: str | None = None, seconds: float | None = None) -> None:
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    if not logs.access_log.isEnabledFor(level):
        return
    elapsed_ms = 1000.0 * (request.request_time() if seconds is None else seconds)
    path = logs.clip(access_log.redact(request.uri or ""), access_log.PATH_LIMIT)
    method = logs.clip(request.method or "", 16)
    client_id = logs.clip(client_id) if client_id else None
    message = f"{request.remote_ip} {status} {method} {path} {elapsed_ms:.2f}ms"
    if client_id:
        message += f" client_id={client_id}"
    if error:
        message += f" error={error}"
    logs.write(logs.access_log, level, message, "access", {
        "remote_ip": request.remote_ip, "status": status, "method": method, "path": path,
        "ms": round(elapsed_ms, 2), "client_id": client_id, "error": error})


class LibraryMetrics:
    """The request metrics as library children, one of each per label set seen."""

    def __init__(self) -> None:
        registry = CollectorRegistry()
        self.requests = Counter("tokensvc_http_requests_total", "HTTP requests answered, by route pattern",
                                ["method", "route", "status"], registry=registry)
        self.durations = Histogram("tokensvc_http_request_duration_seconds", "Time to answer a request",
                                   ["route"], buckets=metrics.DURATION_BUCKETS, registry=registry)
        self.counters: dict[tuple[str, str, int], Any] = {}
        self.histograms: dict[str, Any] = {}

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        counter = self.counters.get(key)
        if counter is None:
            counter = self.counters[key] = self.requests.labels(method, route, str(status))
        counter.inc()
        histogram = self.histograms.get(route)
        if histogram is None:
            histogram = self.histograms[route] = self.durations.labels(route)
        histogram.observe(seconds)


LIBRARY = LibraryMetrics()


def library_request(self: metrics.Metrics, route: str, method: str, status: int, seconds: float) -> None:
    LIBRARY.request(route, method, status, seconds)


_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def request_id_for(request: HTTPServerRequest) -> str:
    incoming = request.headers.get("X-Request-ID")
    if incoming is not None and _REQUEST_ID.fullmatch(incoming):
        return incoming
    return os.urandom(8).hex()


class UnboundedFeedSocket(feed.RevocationFeedSocket):
    """The feed's reader without the bound on what it has not taken."""

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.write_message(dumps(message))
        except tornado.websocket.WebSocketClosedError:
            self.ctx.feed.close(self._send)


def unbounded_feed_routes(routes: list[Route]) -> list[Route]:
    """``routes`` with the feed served by :class:`UnboundedFeedSocket`."""
    return [Route.of(route.path, UnboundedFeedSocket) if route.handler is feed.RevocationFeedSocket else route
            for route in routes]
