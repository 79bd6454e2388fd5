"""The gate's decision, with no web framework: a forward-auth check's original request (its
method and path) and its bearer token in, a status and the headers for the proxy out.

A token in force with the scope its request needs is allowed (200) with what the proxy passes
upstream: ``X-Auth-Subject``, ``X-Auth-Scope``, ``X-Auth-Client-Id`` and, for a node
installation's token, ``X-Auth-Installation-Id``. Anything else is refused as RFC 6750 says
(:mod:`tokensvc.resource.errors`): 401 with the ``Bearer`` challenge, 403 ``insufficient_scope``
naming the scope, 503 when tokensvc could not be asked and nothing current is known. The check
is the verifier's (:meth:`tokensvc.resource.Verifier.check`): a cached answer costs no round
trip, and the revocation feed drops it within a second of a revocation.

The gate reads nothing of the request it is asked about but its method, its path and its
``Authorization`` header: an ``X-Auth-*`` header the client sent is never read, and the proxy
must overwrite it on the way upstream (the examples in ``deploy/`` do).
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import unquote

from tokensvc.gate.settings import GateSettings
from tokensvc.resource import Refusal, Verifier, bearer_token

SUBJECT, SCOPE, CLIENT_ID = "X-Auth-Subject", "X-Auth-Scope", "X-Auth-Client-Id"
INSTALLATION_ID = "X-Auth-Installation-Id"
HEADERS = (SUBJECT, SCOPE, CLIENT_ID, INSTALLATION_ID)


@dataclass(slots=True, frozen=True)
class Decision:
    """What the gate answers a check: its status, its headers, its JSON body."""

    status: int
    headers: dict[str, str]
    body: bytes


ALLOWED_BODY = b'{"allowed": true}'


def normalized(path: str) -> str:
    """``path`` as a proxy routes it: the query dropped, percent-decoding undone, dot segments
    resolved and repeated slashes merged (as nginx does before it picks a location), so that
    ``/public/../admin`` is judged as ``/admin``."""
    path = unquote(path.partition("?")[0].partition("#")[0], errors="replace")
    if not path.startswith("/"):
        path = "/" + path
    trailing = path.endswith("/") and path != "/"
    resolved = posixpath.normpath(path)
    if resolved.startswith("//"):  # normpath keeps a leading double slash (POSIX)
        resolved = "/" + resolved.lstrip("/")
    return resolved + "/" if trailing and resolved != "/" else resolved


# What a path may hold for the gate to judge it: what an API behind the proxy could route
# otherwise is refused, not judged (a ``;`` parameter Tomcat and Spring drop, a backslash some
# servers take for a slash, an escaped ``%`` decoded twice, a raw ``#``).
_AMBIGUOUS = re.compile(r"[;\\#]|%25|%5c|%3b|%23", re.IGNORECASE)


def ambiguous(path: str) -> bool:
    """Whether ``path`` (before its query) holds what an API may route otherwise than the
    gate judges it."""
    return bool(_AMBIGUOUS.search(path.partition("?")[0]))


class Gate:
    """Decides forward-auth checks with one :class:`Verifier` and the required scopes of
    :class:`GateSettings`."""

    def __init__(self, settings: GateSettings, verifier: Verifier) -> None:
        self.settings = settings
        self.verifier = verifier

    async def decide(self, method: str, path: str, authorization: str | None) -> Decision:
        """The answer to a check of the request ``method path`` carrying ``authorization``."""
        if ambiguous(path):
            body = {"error": "invalid_request",
                    "error_description": "the path holds ;, \\, # or an escaped %: refused, not judged"}
            return Decision(403, {}, json.dumps(body).encode())
        scope = self.settings.required_scope(method.upper(), normalized(path))
        try:
            authorized = await self.verifier.check(bearer_token(authorization), scope or None)
        except Refusal as refusal:
            return Decision(refusal.status, refusal.headers(self.settings.realm),
                            json.dumps(refusal.body()).encode())
        answer = authorized.answer
        headers = {"Cache-Control": "no-store", SUBJECT: str(answer.get("sub") or ""),
                   SCOPE: str(answer.get("scope") or ""), CLIENT_ID: str(answer.get("client_id") or "")}
        if authorized.installation_id:
            headers[INSTALLATION_ID] = str(authorized.installation_id)
        return Decision(200, headers, ALLOWED_BODY)
