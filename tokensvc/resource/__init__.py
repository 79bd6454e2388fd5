"""Protecting an API with tokensvc: check bearer tokens at local speed, revoked within a second.

``tokensvc.resource`` imports Tornado (its HTTP and WebSocket clients) and nothing else of the
service: no storage driver, no schema library. :class:`Verifier` introspects a token once,
caches the answer and keeps the revocation feed open (:mod:`.verifier`); the adapters are
:mod:`tokensvc.resource.tornado` (a ``RequestHandler`` mixin, ``@requires``, and a WebSocket
handler that closes when its token is revoked), :mod:`tokensvc.resource.asgi` (a middleware
for Starlette or any ASGI application, HTTP and WebSocket) and :mod:`tokensvc.resource.starlette`
(an ``AuthenticationBackend``, so that Starlette's ``requires`` guards each route; it imports
Starlette, which the package does not require).
"""

from tokensvc.resource.bearer import Authorized, bearer_token
from tokensvc.resource.errors import InsufficientScope, InvalidToken, Refusal, Unavailable
from tokensvc.resource.settings import Settings
from tokensvc.resource.verifier import Verifier

__all__ = ["Authorized", "InsufficientScope", "InvalidToken", "Refusal", "Settings", "Unavailable", "Verifier",
           "bearer_token"]
