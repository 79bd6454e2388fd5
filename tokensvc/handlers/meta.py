"""Discovery and health: RFC 8414 metadata, ``/healthz`` and ``/readyz``."""

from __future__ import annotations

from tokensvc import schemas
from tokensvc.handlers.base import BaseHandler
from tokensvc.handlers.common import NotFound
from tokensvc.handlers.endpoint import Endpoint
from tokensvc.oauth import clientauth


def metadata(base_url: str, auth_url: str, scopes: list[str]) -> dict:
    return {
        "issuer": base_url,
        "authorization_endpoint": f"{auth_url}/oauth/authorize",
        "token_endpoint": f"{base_url}/oauth/token",
        "introspection_endpoint": f"{base_url}/oauth/token/introspect",
        "revocation_endpoint": f"{base_url}/oauth/token/revoke",
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": list(clientauth.AUTH_METHODS),
        "introspection_endpoint_auth_methods_supported": [clientauth.BASIC, clientauth.POST],
        "revocation_endpoint_auth_methods_supported": list(clientauth.AUTH_METHODS),
        "scopes_supported": scopes,
        "authorization_response_iss_parameter_supported": True,
        "service_documentation": f"{base_url}/",
    }


class MetadataHandler(Endpoint):
    """``GET /.well-known/oauth-authorization-server``."""

    async def get(self) -> None:
        scopes = {"read", "write", "admin"}
        for client in await self.ctx.store.list_clients():
            scopes.update(client.scopes)
        body = metadata(self.config.base_url, self.config.auth_url, sorted(scopes))
        self.send_json(schemas.metadata.dump(body), headers={"Cache-Control": "public, max-age=300"})


class HealthHandler(Endpoint):
    """``GET /healthz``: the process answers."""

    async def get(self) -> None:
        self.send_json({"status": "ok"})


class ReadyHandler(Endpoint):
    """``GET /readyz``: the store answers a ping (503 otherwise)."""

    async def get(self) -> None:
        await self.ctx.store.ping()
        self.send_json({"status": "ok"})


class NotFoundHandler(BaseHandler):
    """Every unrouted path: 404 ``{"detail"}``."""

    def prepare(self) -> None:
        raise NotFound(f"No resource at {self.request.path}")


class OpenAPIHandler(Endpoint):
    """``GET /openapi.json``: the OpenAPI 3.1 document, built once."""

    document: bytes | None = None

    async def get(self) -> None:
        if OpenAPIHandler.document is None:
            from tokensvc.openapi import render

            OpenAPIHandler.document = render().encode("utf-8")
        self.send(200, OpenAPIHandler.document, "application/json")
