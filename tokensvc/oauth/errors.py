"""OAuth 2.0 error responses (RFC 6749 §4.1.2.1 and §5.2, RFC 6750 §3.1, RFC 7009 §2.2.1).

Each error is a small :class:`~tokensvc.errors.HTTPAnswer` that owns its response, as Authlib's
do: ``status_code``, ``body()`` (the RFC 6749 §5.2 JSON object) and ``headers()`` (the RFC 6750
§3 / RFC 7235 challenges). The web layer renders one as JSON or as an error page; an error to
deliver to a client's verified redirect_uri is a :class:`RedirectError`. The protocol layer
only raises them.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from tokensvc.errors import HTTPAnswer, Redirect

REALM = "tokensvc"
# RFC 6749 §5.2 (and §4.1.2.1): error_description = 1*( %x20-21 / %x23-5B / %x5D-7E ).
_OUTSIDE_DESCRIPTION = re.compile(r"[^\x20-\x21\x23-\x5b\x5d-\x7e]")


def description_text(text: str) -> str:
    """``text`` as an ``error_description`` may hold it: every other character (a quote, a
    backslash, a control, anything beyond ASCII that a request echoed) percent-encoded as UTF-8,
    so what is said stays readable and nothing steps outside the grammar."""
    return _OUTSIDE_DESCRIPTION.sub(lambda found: quote(found.group(), safe=""), text)


class OAuthError(HTTPAnswer):
    """Base of every protocol error. ``description`` is safe to show to the client."""

    error = "invalid_request"
    status_code = 400

    def __init__(self, description: str | None = None, *, status_code: int | None = None) -> None:
        super().__init__(description or self.error)
        self.description = description_text(description) if description else description
        if status_code is not None:
            self.status_code = status_code

    def body(self) -> dict[str, str]:
        body = {"error": self.error}
        if self.description:
            body["error_description"] = self.description
        return body

    def headers(self) -> dict[str, str]:
        return {}


class InvalidRequest(OAuthError):
    """RFC 6749 §5.2: a required parameter is missing, repeated or malformed."""

    error = "invalid_request"


class InvalidClient(OAuthError):
    """RFC 6749 §5.2: client authentication failed. 401; ``basic`` asks for a Basic challenge."""

    error = "invalid_client"
    status_code = 401

    def __init__(self, description: str | None = None, *, basic: bool = False) -> None:
        super().__init__(description)
        self.basic = basic

    def headers(self) -> dict[str, str]:
        # RFC 6749 §5.2: a client that tried Basic is challenged to try it again.
        return {"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'} if self.basic else {}


class InvalidGrant(OAuthError):
    """RFC 6749 §5.2: the code or refresh token is invalid, expired, revoked or not this client's."""

    error = "invalid_grant"


class UnauthorizedClient(OAuthError):
    """RFC 6749 §5.2: the client may not use this grant (a resource server uses none)."""

    error = "unauthorized_client"


class UnsupportedGrantType(OAuthError):
    """RFC 6749 §5.2: only ``authorization_code`` is served by the token endpoint."""

    error = "unsupported_grant_type"


class UnsupportedResponseType(OAuthError):
    """RFC 6749 §4.1.2.1: only ``response_type=code``."""

    error = "unsupported_response_type"


class InvalidTarget(OAuthError):
    """RFC 8707 §2: a resource that is malformed, unknown, or not among those granted."""

    error = "invalid_target"


class InvalidScope(OAuthError):
    """RFC 6749 §4.1.2.1 / §5.2: a scope outside what the client may ask for."""

    error = "invalid_scope"


class AccessDenied(OAuthError):
    """RFC 6749 §4.1.2.1: the user (or policy) refused the request. 403 outside redirects."""

    error = "access_denied"
    status_code = 403


class InvalidToken(OAuthError):
    """RFC 6750 §3.1: the bearer token is missing, expired, revoked or malformed."""

    error = "invalid_token"
    status_code = 401

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": f'Bearer realm="{REALM}", error="invalid_token"'}


class InsufficientScope(OAuthError):
    """RFC 6750 §3.1: the bearer token lacks the scope the endpoint needs."""

    error = "insufficient_scope"
    status_code = 403

    def __init__(self, scope: str, description: str | None = None) -> None:
        super().__init__(description or f"The token lacks the '{scope}' scope")
        self.scope = scope

    def body(self) -> dict[str, str]:
        return {"error": self.error, "error_description": self.description or "", "scope": self.scope}

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": f'Bearer realm="{REALM}", error="insufficient_scope", scope="{self.scope}"'}


class RedirectUnverified(HTTPAnswer):
    """The authorization request cannot be answered by a redirect (RFC 6749 §4.1.2.1, first paragraph):
    the client is unknown or the redirect_uri is not one of its registered addresses. 400, shown
    on a page, never sent to the unverified address."""

    status_code = 400

    def __init__(self, description: str, words: str | None = None) -> None:
        super().__init__(description)
        self.description = description_text(description)  # the RFC's terms, for the client's developer (JSON)
        self.words = words  # the same in plain words, for the person who followed the link (a page)

    def body(self) -> dict[str, str]:
        return {"error": "invalid_request", "error_description": self.description}

    @property
    def title(self) -> str:
        return "This request cannot be completed"

    @property
    def message(self) -> str:
        return self.words or self.description


def redirect_to(redirect_uri: str, params: dict[str, str | None]) -> str:
    """``redirect_uri`` with ``params`` added to its query, keeping the query it had."""
    parts = urlsplit(redirect_uri)
    query = parse_qsl(parts.query, keep_blank_values=True)
    query.extend((key, value) for key, value in params.items() if value is not None)
    return urlunsplit(parts._replace(query=urlencode(query)))


class RedirectError(Redirect):
    """An OAuth error delivered by redirect to a verified redirect_uri (RFC 6749 §4.1.2.1), with
    ``state`` and the issuer (RFC 9207)."""

    def __init__(self, error: OAuthError, redirect_uri: str, state: str | None, issuer: str) -> None:
        super().__init__(redirect_to(redirect_uri, {**error.body(), "state": state, "iss": issuer}))
        self.error = error

    @property
    def error_code(self) -> str:
        return self.error.error
