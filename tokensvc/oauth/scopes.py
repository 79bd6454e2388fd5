"""Scopes: parsing (RFC 6749 §3.3) and the satisfaction rule of the public API.

Scopes are free strings. A token satisfies scope ``S`` if it holds ``S``; ``write``
satisfies ``read`` and every ``<resource>:<action>``; ``read`` satisfies every
``<resource>:read``.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokensvc.identifiers import scope_problem

READ, WRITE, ADMIN = "read", "write", "admin"

def is_valid_scope_token(token: str) -> bool:
    return scope_problem(token) is None


def parse(scope: str | None) -> list[str] | None:
    """Split a space-delimited scope string into unique tokens, keeping their order.

    Returns None for an absent or empty value. Raises ValueError on a malformed token.
    """
    if scope is None or not scope.strip():
        return None
    tokens = [token for token in scope.split(" ") if token]
    for token in tokens:
        if not is_valid_scope_token(token):
            raise ValueError(f"malformed scope token {token!r}")
    return list(dict.fromkeys(tokens))


def render(scopes: Iterable[str]) -> str:
    return " ".join(scopes)


def satisfies(held: Iterable[str], needed: str) -> bool:
    """True when a token holding ``held`` may do what ``needed`` names."""
    held = set(held)
    if needed in held:
        return True
    resource, sep, action = needed.partition(":")
    if needed == READ:
        return WRITE in held
    if sep and resource and action:
        if WRITE in held:
            return True
        return action == READ and READ in held
    return False
