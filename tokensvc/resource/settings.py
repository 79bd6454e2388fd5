"""What a :class:`~tokensvc.resource.Verifier` is told (:class:`Settings`) and what it counts
(:class:`Counts`): shared by the verifier's rooms, which read the settings as they go (a setting
changed on a running verifier holds from its next use)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from urllib.parse import quote


@dataclass(slots=True)
class Settings:
    """How a :class:`Verifier` reaches tokensvc and what it caches."""

    base_url: str
    client_id: str
    client_secret: str
    max_entries: int = 10_000
    max_negative: int = 1_000  # inactive answers, kept apart from the active ones
    max_ttl: float = 3600.0  # an active answer is used at most this long, feed or not
    negative_ttl: float = 5.0  # an inactive answer
    offline_ttl: float = 30.0  # the bound of an answer's age while the feed is down
    timeout: float = 5.0  # introspection and the feed's handshake
    ping_seconds: float = 10.0  # the feed is taken for down when nothing came for this long
    retry_seconds: float = 1.0  # the first wait before reconnecting the feed (doubles up to 30 s)
    introspection_concurrency: int = 32  # checks' introspections in flight at once
    introspection_queue: int = 4096  # more of them waiting; past that a check fails at once (503)
    reverify_concurrency: int = 8  # watched connections' tokens asked again at once (places of their own)
    reverify_spread: float = 1.0  # a larger batch of them starts spread at random over this
    realm: str = "api"
    # The resource URI this API serves (RFC 8707), as its client declares it to tokensvc: a token
    # meant for other APIs only (its introspection's ``aud``) is refused (401 invalid_token).
    audience: str | None = None
    # Refuse a token that names no audience (one meant for every API) too.
    require_audience: bool = False

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")  # the endpoints' paths are joined to it


def basic_authorization(settings: Settings) -> str:
    """The ``Authorization`` header that authenticates the resource server to tokensvc, its
    introspection and its feed alike: HTTP Basic with the client id and secret form-encoded
    first (RFC 6749 §2.3.1)."""
    secret = f"{quote(settings.client_id, safe='')}:{quote(settings.client_secret, safe='')}"
    return "Basic " + base64.b64encode(secret.encode()).decode()


@dataclass(slots=True)
class Counts:
    """What the verifier did: checks, cache hits, introspections; and the feed's life: its
    connections, those that resumed, its numbered messages, the revocations they named, and the
    flushes (a feed that could not resume, a ``flush`` message, one not understood)."""

    checks: int = 0
    hits: int = 0
    introspections: int = 0
    revocations: int = 0
    flushes: int = 0
    connects: int = 0
    resumes: int = 0
    messages: int = 0
