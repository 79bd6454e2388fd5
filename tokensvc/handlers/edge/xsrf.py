"""XSRF protection: the one rule for every cookie-authenticated unsafe request.

A token is ``<nonce>.<signature>``: the signature is an HMAC, under the cookie secret, of the
nonce and of the web session the token is for (none before sign-in); while the secret is
rotated (``cookie_secret`` a list), tokens are signed with its first key and any key verifies.
The token travels in the ``_xsrf`` cookie and is repeated by the request, in the ``_xsrf``
form field or the ``X-XSRFToken`` header (double submit). A pair of the attacker's choosing (a cookie planted
from a sibling subdomain or over plain http, and the same value in the form) fails the
signature; a token the service issued for someone else's session, or for none, fails once the
victim is signed in. Signing in issues a token for the new session.

Which requests must carry one is decided by the request lifecycle
(:func:`tokensvc.handlers.edge.guards.check_xsrf`), for every route.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence

from tornado.httputil import HTTPServerRequest

FIELD = "_xsrf"  # the cookie is Settings.xsrf_cookie: "_xsrf", "__Host-_xsrf" on https
HEADER = "X-XSRFToken"


def new_token(secret: str, session_id: str | None) -> str:
    nonce = secrets.token_urlsafe(16)
    return f"{nonce}.{_signature(secret, nonce, session_id)}"


def valid(secrets_: Sequence[str], token: str | None, session_id: str | None) -> bool:
    """Whether ``token`` is one this service issued for ``session_id``, under any of its keys."""
    if not token or len(token) > 128:
        return False
    nonce, _, signature = token.partition(".")
    return bool(nonce) and any(hmac.compare_digest(signature.encode(), _signature(secret, nonce, session_id).encode())
                               for secret in secrets_)


def _signature(secret: str, nonce: str, session_id: str | None) -> str:
    message = f"xsrf|{nonce}|{session_id or ''}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def matches(request: HTTPServerRequest, cookie_name: str, secrets_: Sequence[str], session_id: str | None,
            submitted: str | None) -> bool:
    """Whether the submitted token equals the XSRF cookie and is valid for the session."""
    morsel = request.cookies.get(cookie_name)
    cookie = morsel.value if morsel is not None else None
    # As bytes: compare_digest refuses str with characters beyond ASCII, which a form may send.
    if not submitted or cookie is None or not hmac.compare_digest(submitted.encode(), cookie.encode()):
        return False
    return valid(secrets_, submitted, session_id)
