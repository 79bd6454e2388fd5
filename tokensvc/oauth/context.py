"""What every protocol operation needs: the store, the token lifetimes, a clock, a place to
announce revocations (open WebSockets listen there), the brute-force limits, the server's
own metadata, and the metrics it counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tokensvc.config import LimitSettings, Settings, TokenSettings
from tokensvc.metrics import Metrics
from tokensvc.oauth.events import RevocationEvents
from tokensvc.oauth.metadata import server_metadata
from tokensvc.ratelimit import FailureLimits, SharedFailureCounts
from tokensvc.records import utcnow
from tokensvc.storage.base import Store


@dataclass(slots=True)
class OAuthContext:
    store: Store
    tokens: TokenSettings
    issuer: str
    clock: Callable[[], datetime] = utcnow
    events: RevocationEvents = field(default_factory=lambda: RevocationEvents())
    limits: FailureLimits = field(default_factory=lambda: FailureLimits(LimitSettings()))
    metadata: dict[str, Any] = field(default_factory=dict)  # RFC 8414, see oauth.metadata
    metrics: Metrics = field(default_factory=Metrics)  # GET /metrics

    @classmethod
    def from_settings(cls, settings: Settings, store: Store, **overrides: object) -> OAuthContext:
        """The context the configuration describes (``clock`` and others may be overridden)."""
        shared = store if isinstance(store, SharedFailureCounts) else None  # MongoDB: one count for all processes
        values: dict[str, object] = dict(store=store, tokens=settings.tokens, issuer=settings.base_url,
                                         limits=FailureLimits(settings.limits, shared=shared),
                                         metadata=server_metadata(settings))
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
