"""Who may call the admin API: an administrator's access token (RFC 6750 bearer), under the
failure limits; beside the token endpoints' client authentication (:mod:`.clientauth`).

Every call but the index carries ``Authorization: Bearer <access token>`` of an admin user,
holding the ``admin`` scope in force (:func:`.administrators.require_admin`; the interface:
every integration uses an OAuth-issued token). No token or a dead one is 401 and counts
against the caller's address, in a group of its own (a wrong admin token does not lock an
address out of ``/oauth/token``); past the limit it is 429. A token in force (256 random bits:
guessing one gains nothing from a limit) is never refused by the limit, whoever else shares
the address. Anyone else (not an admin, or without ``admin``) is 403. Every refusal is audited.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tokensvc.oauth import bearer
from tokensvc.oauth.administrators import require_admin
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import AccessDenied, InsufficientScope, InvalidToken
from tokensvc.ratelimit import TooManyFailures
from tokensvc.telemetry import logs

NOT_AN_ADMIN = "The admin API is for administrators"


@dataclass(slots=True, frozen=True)
class AdminRequest:
    """What an admin API call says about its caller: its ``Authorization`` header and address,
    and what it asks (its method and route, for the audit)."""

    authorization: str | None
    address: str
    method: str
    route: str


@dataclass(slots=True, frozen=True)
class AdminCaller:
    """An administrator, and the client whose token they called with."""

    username: str
    client_id: str


async def authenticate(ctx: OAuthContext, request: AdminRequest) -> AdminCaller:
    """The administrator an admin API call proves: InvalidToken (401) for no token in force,
    TooManyFailures (429) for one past the address's limit, AccessDenied or InsufficientScope
    (403) for a token of anyone else."""
    limits = ctx.limits
    attempt = limits.admin_attempt(request.address)
    try:
        presented = bearer.from_authorization(request.authorization)
        token = await bearer.active_access_token(ctx, presented) if presented else None
        if token is None:
            _refused(request, "invalid_token")
            await limits.failed(attempt)  # TooManyFailures once past the limit
            raise InvalidToken("An admin's access token is needed (tokensvc login)")
        try:
            user = require_admin(token, NOT_AN_ADMIN)
        except (AccessDenied, InsufficientScope) as refused:
            _refused(request, refused.error)
            raise
    except TooManyFailures:
        ctx.metrics.refused_by_limit("admin")
        raise
    return AdminCaller(user.username, token.token.client_id)


def _refused(request: AdminRequest, reason: str) -> None:
    logs.audit("admin_call", {"method": request.method, "route": request.route, "outcome": "refused",
                              "reason": reason, "remote_ip": request.address},
               logging.WARNING, "admin call refused")
