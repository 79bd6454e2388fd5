"""What every protocol operation needs: the store, the token lifetimes, a clock, a place to
announce revocations (open WebSockets listen there), the brute-force limits, the server's
own metadata, where it reports what it counts, and the keys successor pairs are derived with.
The composition root makes it from the settings (:func:`tokensvc.bootstrap.make_context`):
nothing here reads the configuration or imports a metrics library."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from tokensvc.oauth.events import RevocationEvents
from tokensvc.oauth.feed import ReaderCaps, RevocationFeed
from tokensvc.oauth.metrics import ProtocolMetrics
from tokensvc.oauth.origins import BrowserOrigins
from tokensvc.oauth.successors import SuccessorKeys
from tokensvc.ratelimit import FailureLimits
from tokensvc.records import utcnow
from tokensvc.storage.base import Store


class TokenPolicy(Protocol):
    """The lifetimes (seconds) the protocol works with: the ``[tokens]`` settings."""

    @property
    def access_ttl(self) -> int: ...

    @property
    def refresh_ttl(self) -> int: ...

    @property
    def installation_refresh_ttl(self) -> int: ...

    @property
    def code_ttl(self) -> int: ...

    @property
    def session_ttl(self) -> int: ...

    @property
    def refresh_grace_seconds(self) -> int: ...


@dataclass(slots=True)
class OAuthContext:
    store: Store
    tokens: TokenPolicy
    issuer: str
    limits: FailureLimits
    metadata: dict[str, Any]  # RFC 8414, see oauth.metadata
    metrics: ProtocolMetrics  # the service's metrics (GET /metrics)
    clock: Callable[[], datetime] = utcnow
    events: RevocationEvents = field(default_factory=lambda: RevocationEvents())
    origins: BrowserOrigins = field(default_factory=BrowserOrigins)  # CORS
    # The keys successor pairs are derived with (oauth/successors.py); a context made without
    # the settings gets one of its own.
    successors: SuccessorKeys = field(default_factory=lambda: SuccessorKeys.of([secrets.token_urlsafe(32)]))
    # The revocation feed resource servers read (GET /oauth/revocations): every announcement above.
    feed: RevocationFeed = field(init=False)
    # How many readers the feed admits (the [feed] settings).
    feed_caps: ReaderCaps = field(default_factory=ReaderCaps)

    def __post_init__(self) -> None:
        self.feed = RevocationFeed(self.events, self.metrics, self.feed_caps)
