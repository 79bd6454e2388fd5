"""The bearer token as every adapter reads it: from the ``Authorization`` header (RFC 6750 §2.1)
or, a WebSocket's alone, from the query (§2.3), which is masked wherever a log may write it;
and what a token in force authorizes (:class:`Authorized`)."""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from tokensvc.oauth.scopes import satisfies
from tokensvc.resource.errors import InsufficientScope
from tokensvc.telemetry import redaction

# Where an ASGI scope keeps the WebSocket token taken out of its query, for a later layer that
# takes it again (the Starlette backend masks every scope; a WebSocket route's middleware checks
# the token): never in the query, which the server's access log writes.
QUERY_TOKEN = "tokensvc.query_token"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (RFC 6750 §2.1), else None."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def query_token(query: str) -> str | None:
    """The ``access_token`` of ``query`` as Tornado's ``get_query_argument`` reads it (the last
    one given, percent-decoded, whitespace stripped), else None: one reading for every adapter."""
    values = parse_qs(query, keep_blank_values=True).get("access_token")
    return values[-1].strip() if values else None


def masked_query(query: str) -> str:
    """``query`` with the value of ``access_token`` (a WebSocket's token, RFC 6750 §2.3)
    replaced by ``***``: what a log may hold of a query. The name counts as any parser may read
    it (:func:`tokensvc.telemetry.redaction.names`: ``access%5Ftoken``, ``ACCESS_TOKEN``,
    ``access_token+``, ``access_token%00``, ``access.token``, ``access_token[]``,
    ``x[access_token]``); every other part is kept byte
    for byte (the other names a log withholds may be the application's own: ``code`` and
    ``state`` at its OAuth callback)."""
    if query.isascii() and "%" not in query and "token" not in query.lower():
        return query
    parts = re.split(r"([&;])", query)  # ';' too: a parser that takes it as a separator sees a name there
    for index in range(0, len(parts), 2):
        if redaction.names(parts[index].partition("=")[0], "access_token"):
            parts[index] = "access_token=***"
    return "".join(parts)


def take_query_token(scope: MutableMapping[str, Any]) -> str | None:
    """The ``access_token`` of an ASGI scope's query, which is left masked in place (the
    server's access log writes the scope it passed on, after the application answered), whatever
    the request is and whether or not the token is used. Given more than once, the last one
    counts (as in tokensvc's own sockets and the Tornado adapter). A WebSocket's token is kept
    beside the query (:data:`QUERY_TOKEN`), so a layer after the one that masked it still takes
    it."""
    if QUERY_TOKEN in scope:
        return scope[QUERY_TOKEN]
    query = scope.get("query_string", b"").decode("latin-1")
    masked = masked_query(query)
    if masked == query:
        return None
    scope["query_string"] = masked.encode("latin-1")
    token = query_token(query)
    if scope.get("type") == "websocket":
        scope[QUERY_TOKEN] = token
    return token


@dataclass(slots=True, frozen=True)
class Authorized:
    """An access token in force: its introspection answer."""

    answer: dict[str, Any]

    @property
    def scopes(self) -> list[str]:
        return str(self.answer.get("scope") or "").split()

    @property
    def subject(self) -> str | None:
        return self.answer.get("sub")

    @property
    def client_id(self) -> str | None:
        return self.answer.get("client_id")

    @property
    def installation_id(self) -> str | None:
        """The node installation the token was issued to; None for a user's token."""
        return self.answer.get("installation_id")

    def has(self, scope: str) -> bool:
        """Whether the token may do what ``scope`` names (``write`` covers ``read`` and every
        ``<resource>:<action>``, ``read`` every ``<resource>:read``)."""
        return satisfies(self.scopes, scope)

    def require(self, scope: str) -> None:
        if not self.has(scope):
            raise InsufficientScope(scope)
