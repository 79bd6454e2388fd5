"""The refusals of a resource server (RFC 6750 §3): each knows its status, its
``WWW-Authenticate`` challenge and its JSON body, so every adapter renders them alike."""

from __future__ import annotations

from typing import Any


class Refusal(Exception):
    """A request the resource server does not serve."""

    status = 401
    error: str | None = None

    def __init__(self, description: str | None = None) -> None:
        super().__init__(description or "")
        self.description = description

    def challenge(self, realm: str) -> str:
        parts = [f'realm="{realm}"']
        if self.error:
            parts.append(f'error="{self.error}"')
            if self.description:
                parts.append(f'error_description="{_quoted(self.description)}"')
        parts.extend(self.extra_challenge())
        return "Bearer " + ", ".join(parts)

    def extra_challenge(self) -> list[str]:
        return []

    def headers(self, realm: str) -> dict[str, str]:
        return {"WWW-Authenticate": self.challenge(realm), "Cache-Control": "no-store"}

    def body(self) -> dict[str, Any]:
        if self.error is None:  # no credentials at all: no error code, as the challenge (RFC 6750 §3.1)
            return {"error_description": "A bearer token is required"}
        body: dict[str, Any] = {"error": self.error}
        if self.description:
            body["error_description"] = self.description
        return body


class InvalidToken(Refusal):
    """401: no token, or one that is not an active access token (``invalid_token``; without a
    token the challenge names no error, RFC 6750 §3.1)."""

    def __init__(self, description: str | None) -> None:
        super().__init__(description)
        self.error = "invalid_token" if description else None


class InsufficientScope(Refusal):
    """403 ``insufficient_scope``, naming the scope needed."""

    status = 403
    error = "insufficient_scope"

    def __init__(self, scope: str) -> None:
        super().__init__(f"The token lacks the scope {scope}")
        self.scope = scope

    def extra_challenge(self) -> list[str]:
        return [f'scope="{_quoted(self.scope)}"']

    def body(self) -> dict[str, Any]:
        return {**super().body(), "scope": self.scope}


class Unavailable(Refusal):
    """503: the token could not be checked (tokensvc unreachable while nothing current is
    known): refused, never let through."""

    status = 503
    error = "temporarily_unavailable"

    def challenge(self, realm: str) -> str:
        return f'Bearer realm="{realm}"'

    def headers(self, realm: str) -> dict[str, str]:
        return {"Retry-After": "1", "Cache-Control": "no-store"}


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
