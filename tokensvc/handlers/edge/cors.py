"""CORS for browser apps (the Fetch standard's CORS protocol): the headers a route that lets
other origins call it (``cors = True``: the token endpoints and the ``/v1`` API) sends to an
allowed origin, and the answer to a preflight.

``Access-Control-Allow-Origin`` only ever echoes an allowed origin (never ``*``), every answer
of such a route varies by ``Origin``, and ``Access-Control-Allow-Credentials`` is never sent:
a browser app authenticates with its tokens, never with this service's cookies.
"""

from __future__ import annotations

from collections.abc import Iterable

ALLOW_HEADERS = "Authorization, Content-Type, X-Request-ID"
EXPOSE_HEADERS = "WWW-Authenticate, Retry-After, X-Request-ID"
MAX_AGE_SECONDS = 600
VARY = {"Vary": "Origin"}


def allowed(origin: str) -> dict[str, str]:
    """The headers of any answer to an allowed origin."""
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Expose-Headers": EXPOSE_HEADERS, **VARY}


def preflight(origin: str, methods: Iterable[str]) -> dict[str, str]:
    """The headers of a preflight's answer to an allowed origin."""
    return {**allowed(origin), "Access-Control-Allow-Methods": ", ".join(sorted(set(methods) - {"HEAD", "OPTIONS"})),
            "Access-Control-Allow-Headers": ALLOW_HEADERS, "Access-Control-Max-Age": str(MAX_AGE_SECONDS)}
