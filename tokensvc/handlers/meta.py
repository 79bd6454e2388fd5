"""Discovery and health: RFC 8414 metadata, ``/healthz`` and ``/readyz``."""

from __future__ import annotations

from tokensvc import __version__, schemas
from tokensvc.config import STORE_RETRY_AFTER_SECONDS
from tokensvc.errors import NotFound, NotReady
from tokensvc.handlers.edge.json_handler import JsonHandler
from tokensvc.openapi import document as openapi
from tokensvc.telemetry.metrics import CONTENT_TYPE, AddressRule


class MetadataHandler(JsonHandler):
    """``GET /.well-known/oauth-authorization-server``."""

    async def get(self) -> None:
        # Made from the configuration, never the store: discovery answers while it is down.
        self.send_json(schemas.metadata.dump(self.ctx.metadata), headers={"Cache-Control": "public, max-age=300"})


class HealthHandler(JsonHandler):
    """``GET /healthz``: the process answers, and says which release it runs (a rolling
    upgrade is watched by it: docs/guide/operations.md, Upgrading)."""

    async def get(self) -> None:
        self.send_json({"status": "ok", "version": __version__})


class ReadyHandler(JsonHandler):
    """``GET /readyz``: start-up has prepared the store (indexes, seeding), and it answers
    (:mod:`..readiness`: a short, shared ping, with a grace through an election, and what the
    driver knows of the deployment); 503 otherwise, saying why."""

    async def get(self) -> None:
        reason = await self.edge.readiness.unready()
        if reason is not None:
            raise NotReady(reason, STORE_RETRY_AFTER_SECONDS)
        self.send_json({"status": "ok"})


class MetricsHandler(JsonHandler):
    """``GET /metrics``: the Prometheus text exposition, to callers in ``metrics.allow``; to
    anyone else, and when ``metrics.enabled`` is off, the 404 of a path that is not there."""

    async def get(self) -> None:
        settings = self.config.metrics
        if not settings.enabled or not AddressRule(settings.allow).allows(self.request.remote_ip):
            raise NotFound(f"No resource at {self.request.path}")
        self.send(200, self.edge.metrics.render(), CONTENT_TYPE, {"Cache-Control": "no-store"})


class OpenAPIHandler(JsonHandler):
    """``GET /openapi.json``: the OpenAPI 3.1 document of the route table, built once per application."""

    async def get(self) -> None:
        if self.edge.openapi_document is None:
            self.edge.openapi_document = openapi.render(self.edge.routes, self.config.base_url,
                                                        auth_url=self.config.auth_url,
                                                        session_cookie=self.config.session_cookie).encode("utf-8")
        self.send(200, self.edge.openapi_document, "application/json")
