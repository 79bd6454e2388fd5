"""Authorization server metadata (RFC 8414 §2), made once from the configuration.

It never reads the store, so discovery answers while the store is down. ``scopes_supported``
lists the service's own vocabulary and every scope the configuration gives a client; a
scope granted only to a client added later with the CLI is not advertised (RFC 8414 §2
lets a server leave scopes out).
"""

from __future__ import annotations

from typing import Any

from tokensvc.config import Settings
from tokensvc.oauth import clientauth, scopes

BASE_SCOPES = (scopes.READ, scopes.WRITE, scopes.ADMIN)


def server_metadata(settings: Settings) -> dict[str, Any]:
    advertised = set(BASE_SCOPES)
    for client in settings.clients:
        advertised.update(client.allowed_scopes or [scopes.READ])
    base_url, auth_url = settings.base_url, settings.auth_url
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
        "scopes_supported": sorted(advertised),
        "authorization_response_iss_parameter_supported": True,
        "service_documentation": f"{base_url}/",
    }
