"""Authorization server metadata (RFC 8414 §2), made once from the configuration.

It never reads the store, so discovery answers while the store is down. ``scopes_supported``
lists the service's own vocabulary and every scope the configuration gives a client; a
scope granted only to a client added later with the CLI is not advertised (RFC 8414 §2
lets a server leave scopes out).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tokensvc.oauth import clientauth, scopes

BASE_SCOPES = (scopes.READ, scopes.WRITE, scopes.ADMIN)


def server_metadata(base_url: str, auth_url: str, client_scopes: Iterable[Sequence[str] | None]) -> dict[str, Any]:
    """The metadata of a service at ``base_url`` (its authorization endpoint at ``auth_url``)
    whose configured clients may ask for ``client_scopes`` (None: the default, read)."""
    advertised = set(BASE_SCOPES)
    for allowed in client_scopes:
        advertised.update(allowed or [scopes.READ])
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
        # RFC 8707: `resource` at the authorization and token endpoints; tokensvc's own API is
        # the resource at base_url + /v1 (tokensvc.oauth.audience). Beyond RFC 8414 §2's list,
        # which allows more.
        "resource_indicators_supported": True,
        "service_documentation": f"{base_url}/",
    }
