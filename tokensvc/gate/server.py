"""The gate as an HTTP server (Tornado): one check endpoint per proxy, each reading the original
request where that proxy puts it, and health and readiness.

- ``/auth/nginx``: nginx ``auth_request``; the original request in ``X-Original-URI`` and
  ``X-Original-Method``, which the location of the subrequest must set (``proxy_set_header``),
  so that a client's own never reach the gate. Without ``X-Original-URI`` the check fails (500):
  the gate cannot know which rule holds.
- ``/auth/traefik``: Traefik's ForwardAuth; ``X-Forwarded-Uri`` and ``X-Forwarded-Method``,
  which Traefik sets itself (keep ``trustForwardHeader`` false).
- ``/auth/envoy/...``: Envoy's HTTP ext_authz with ``path_prefix: /auth/envoy``; the original
  path follows the prefix, and the check's method is the original's.
- ``/healthz``: 200 while the process serves. ``/readyz``: 200 once the revocation feed is open
  and current, 503 before and while it is down (checks are answered meanwhile, within the
  verifier's ``offline_ttl``); its body holds the verifier's counts (checks, cache hits,
  introspections, the feed's revocations and flushes) and the answers cached.

Each endpoint reads only its own proxy's headers: a header of another proxy's convention that a
client sent is never taken for the original request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web

from tokensvc.gate.gate import Decision, Gate
from tokensvc.gate.settings import GateSettings
from tokensvc.resource import Verifier

log = logging.getLogger("tokensvc.gate")
ENVOY_PREFIX = "/auth/envoy"


class _Check(tornado.web.RequestHandler):
    """A forward-auth check; its subclasses say where the original request is."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

    def initialize(self, gate: Gate) -> None:
        self.gate = gate

    def original(self) -> tuple[str, str] | None:
        """The original request's method and path, or None when the proxy did not say."""
        raise NotImplementedError

    async def get(self, *args: Any) -> None:
        original = self.original()
        if original is None:
            log.error("a check at %s without the original request's headers: see the gate's proxy examples",
                      self.request.path)
            self._answer(Decision(500, {"Cache-Control": "no-store"},
                                  b'{"detail": "the proxy did not pass the original request"}'))
            return
        method, path = original
        self._answer(await self.gate.decide(method, path, self.request.headers.get("Authorization")))

    head = post = put = patch = delete = options = get

    def _answer(self, decision: Decision) -> None:
        self.set_status(decision.status)
        self.set_header("Content-Type", "application/json")
        for name, value in decision.headers.items():
            self.set_header(name, value)
        if self.request.method != "HEAD":
            self.write(decision.body)

    def check_xsrf_cookie(self) -> None:
        """A check carries no cookie of the gate's: there is nothing to forge."""


class NginxCheck(_Check):
    def original(self) -> tuple[str, str] | None:
        uri = self.request.headers.get("X-Original-URI")
        return None if uri is None else (self.request.headers.get("X-Original-Method", "GET"), uri)


class TraefikCheck(_Check):
    def original(self) -> tuple[str, str] | None:
        uri = self.request.headers.get("X-Forwarded-Uri")
        return None if uri is None else (self.request.headers.get("X-Forwarded-Method", "GET"), uri)


class EnvoyCheck(_Check):
    def original(self) -> tuple[str, str] | None:
        return self.request.method or "GET", self.request.path[len(ENVOY_PREFIX):] or "/"


class Health(tornado.web.RequestHandler):
    def get(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.write({"status": "ok"})


class Ready(tornado.web.RequestHandler):
    def initialize(self, gate: Gate) -> None:
        self.gate = gate

    def get(self) -> None:
        self.set_header("Cache-Control", "no-store")
        verifier = self.gate.verifier
        if not verifier.feed_up:
            self.set_status(503)
        self.write({"status": "ready" if verifier.feed_up else "the revocation feed is not open and current yet",
                    "counts": dataclasses.asdict(verifier.counts), "cached": verifier.cached})


def _logged(handler: tornado.web.RequestHandler) -> None:
    """Tornado's access line only for a failure of the gate's own (5xx): a line per check would
    cost more than the check."""
    if handler.get_status() >= 500:
        log.warning("%d %s %s", handler.get_status(), handler.request.method, handler.request.path)


def make_app(gate: Gate) -> tornado.web.Application:
    given = {"gate": gate}
    return tornado.web.Application([
        (r"/auth/nginx", NginxCheck, given),
        (r"/auth/traefik", TraefikCheck, given),
        (ENVOY_PREFIX + r"(/.*)?", EnvoyCheck, given),
        (r"/healthz", Health),
        (r"/readyz", Ready, given),
    ], log_function=_logged)


def bind(settings: GateSettings) -> list[socket.socket]:
    return tornado.netutil.bind_sockets(settings.port, settings.host)


async def serve(settings: GateSettings, sockets: list[socket.socket]) -> None:
    """Run the gate on ``sockets`` until SIGINT or SIGTERM: the verifier started (its feed
    followed from now on), then closed once the server stops."""
    verifier = Verifier(settings.verifier_settings())
    gate = Gate(settings, verifier)
    await verifier.start()
    server = tornado.httpserver.HTTPServer(make_app(gate), idle_connection_timeout=60)
    server.add_sockets(sockets)
    log.info("tokensvc gate listening on %s:%d (tokensvc: %s, client %s)", settings.host, settings.port,
             settings.tokensvc_url, settings.client_id)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.stop()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.close_all_connections(), 2)
    await verifier.close()
    log.info("tokensvc gate stopped")
