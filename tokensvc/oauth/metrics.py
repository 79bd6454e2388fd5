"""What the protocol counts as it decides, as an interface: tokens issued, families and access
tokens revoked, reuse detected, failed authentications, requests refused by a limit.

The protocol layer imports no metrics library: it reports through :class:`ProtocolMetrics`,
which the composition root (``tokensvc.bootstrap.make_context``) fills with the service's
Prometheus metrics (``tokensvc.telemetry.metrics.Metrics``).
"""

from __future__ import annotations

from typing import Protocol


class ProtocolMetrics(Protocol):
    def issued(self, grant: str) -> None:
        """A token pair issued, by the grant that issued it (``authorization_code``, ``refresh_token``)."""

    def revoked_families(self, reason: str, count: int = 1) -> None:
        """``count`` token families revoked, for ``reason`` (reuse, a grant revoked, ...)."""

    def revoked_access_token(self) -> None:
        """An access token revoked alone by its client (RFC 7009)."""

    def reused_code(self) -> None:
        """A redeemed authorization code presented again (its family revoked)."""

    def reused_refresh_token(self) -> None:
        """A rotated-out refresh token presented again (its family revoked)."""

    def failed_client_auth(self) -> None:
        """A client authentication failed."""

    def failed_login(self) -> None:
        """A sign-in failed."""

    def failed_confirmation(self) -> None:
        """A confirmation code presented with an authorization code was not its page's (or the
        code had had its presentations)."""

    def refused_by_limit(self, kind: str) -> None:
        """A request refused by a failure limit (429): ``login``, ``client_auth``, ``admin``,
        ``confirmation``."""

    def feed_sent(self, count: int) -> None:
        """One revocation feed message handed to ``count`` readers."""

    def feed_opened(self, resumed: bool) -> None:
        """A revocation feed reader opened: ``resumed`` where it left off, or told to flush."""
