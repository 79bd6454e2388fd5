"""The verifier: a resource server's check of a bearer token at local speed, revoked everywhere
within a second.

A token is introspected once (RFC 7662) and the answer cached; the revocation feed stays open
beside it and drops the answers each revocation names. What cannot be an access token tokensvc
issued (every one is 43 or 86 URL-safe characters: :data:`~tokensvc.oauth.hashing.ACCESS_TOKEN`) is
not active, refused without a round trip. :class:`Verifier` is the facade over four rooms, each
of one job:

- :mod:`.cache`: the answers, bounded, never past the token's ``exp`` nor, while the feed is
  down, ``offline_ttl`` past the last moment each was known current;
- :mod:`.introspection`: the calls to tokensvc, shared per token and bounded against a flood of
  made-up tokens, and tokensvc's clock as its answers tell it;
- :mod:`.feed`: the revocation feed, followed in order, resumed where it stood, flushed on
  anything it does not understand;
- :mod:`.watches`: open connections, ended when their token's authorization does.

Its collaborators are given to its constructor: the monotonic ``clock`` every lifetime runs on,
the ``wall`` clock ``exp`` is judged by, the ``introspector`` that asks tokensvc, the ``cache``
the answers are kept in, and ``connect``, which opens the feed's WebSocket. Their defaults are
what a resource server runs; a test replaces one to answer as it needs.

The feed's life and the watched connections ended unconfirmed are logged under this module's
name (``tokensvc.resource.verifier``), never a token nor a secret, and counted in
:class:`Counts`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tornado.websocket import websocket_connect

from tokensvc.oauth.hashing import ACCESS_TOKEN, ACCESS_TOKEN_LENGTHS
from tokensvc.resource.bearer import Authorized, bearer_token, masked_query, query_token
from tokensvc.resource.cache import AnswerCache, token_key
from tokensvc.resource.errors import InvalidToken, Unavailable
from tokensvc.resource.feed import Connect, FeedFollower
from tokensvc.resource.introspection import Introspections, Introspector
from tokensvc.resource.settings import Counts, Settings
from tokensvc.resource.watches import Watch, Watches

__all__ = ["NOT_ACTIVE", "Authorized", "Counts", "Settings", "Verifier", "Watch", "bearer_token", "masked_query",
           "query_token"]

NOT_ACTIVE = "The access token is not active"
NOT_MEANT = "The access token is not meant for this API"


class Verifier:
    """Checks bearer tokens for one resource server; one per process, used within one event
    loop. :meth:`start` opens the feed (within a running event loop), :meth:`close` ends it.

    ``introspector``: an :class:`~tokensvc.resource.introspection.Introspector` (by default one
    of ``settings``, judging ``exp`` by ``wall``); ``cache``: an
    :class:`~tokensvc.resource.cache.AnswerCache` (by default one of ``settings`` on ``clock``);
    ``connect``: opens the feed's WebSocket (Tornado's ``websocket_connect``)."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, introspector: Introspector | None = None,
                 cache: AnswerCache | None = None, connect: Connect = websocket_connect) -> None:
        self.settings = settings
        self.counts = Counts()
        self._closed = False
        self._cache = AnswerCache(settings, clock) if cache is None else cache
        self._introspections = Introspections(settings, introspector or Introspector(settings, wall=wall),
                                              self._cache, clock, self.counts)
        self._feed = FeedFollower(settings, clock, self.counts, revoked=self._revoked, flushed=self._flushed,
                                  went_down=self._went_down, connect=connect)
        self._watches = Watches(settings, clock, self._cache, self._introspections, self._feed)
        self.connected = self._feed.connected  # set while the feed is open and current

    # -- the check: the hot path ----------------------------------------------------------------

    async def check(self, token: str | None, scope: str | None = None) -> Authorized:
        """The token's authorization, or :class:`InvalidToken` (401), :class:`InsufficientScope`
        (403) or :class:`Unavailable` (503, tokensvc unreachable while nothing current is known)."""
        if not token:
            raise InvalidToken(None)
        if self._closed:  # nothing vouches for a cached answer any more, and nothing may ask
            raise Unavailable("The verifier is closed")
        self.counts.checks += 1
        if len(token) not in ACCESS_TOKEN_LENGTHS:  # none tokensvc issued (and not worth a digest): no round trip
            raise InvalidToken(NOT_ACTIVE)
        key = token_key(token)
        entry = self._cache.get(key, self._feed.down_since)
        if entry is None:
            # Its alphabet too, but only here: a token cached had the form (a fifth of a hit's CPU).
            if not ACCESS_TOKEN.fullmatch(token):
                raise InvalidToken(NOT_ACTIVE)
            entry = await self._introspections.ask(key, token, self._introspections.checks)
        else:
            self.counts.hits += 1
        if entry.answer is None:
            raise InvalidToken(NOT_ACTIVE)
        if not self._meant_for_this_api(entry.answer.get("aud")):
            raise InvalidToken(NOT_MEANT)
        authorized = Authorized(entry.answer)
        if scope is not None:
            authorized.require(scope)
        return authorized

    def _meant_for_this_api(self, aud: object) -> bool:
        """Whether a token whose introspection says ``aud`` (RFC 7662: a string or a list of
        them; absent: every API) may be used here: one that names an audience must name
        ``settings.audience``, when set; one that names none is taken unless
        ``settings.require_audience``."""
        settings = self.settings
        if aud is None:
            return not settings.require_audience
        if settings.audience is None:
            return True  # tokensvc's introspection answered it active for this API's client
        return settings.audience == aud or (isinstance(aud, list) and settings.audience in aud)

    @property
    def cached(self) -> int:
        """The answers cached, active and inactive."""
        return len(self._cache)

    # -- watching a connection ------------------------------------------------------------------

    def watch(self, token: str, authorized: Authorized, on_end: Callable[[], None],
              scope: str | None = None) -> Watch:
        """Call ``on_end`` once when the authorization of ``token`` (``authorized``, as
        :meth:`check` found it) ends: revoked (the feed names it), expired, no longer holding
        ``scope``, or no longer confirmable (the feed down past ``offline_ttl`` and tokensvc not
        answering). Call the :class:`Watch` returned to stop watching (when the connection
        closes)."""
        return self._watches.watch(token, authorized, on_end, scope)

    @property
    def reverifying(self) -> int:
        """The watched connections whose token is being asked again (after a flush, a narrowing,
        ``max_ttl``, or while the feed is down)."""
        return self._watches.reverifying

    # -- the feed -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the revocation feed (and keep it open) in the background."""
        self._feed.start()

    async def close(self) -> None:
        """Stop: the feed closed, every task ended, and every check from now on is 503 (a
        request still in flight at shutdown is neither served from a cache nothing keeps
        current any more nor given a new HTTP client)."""
        self._closed = True
        self._feed.stop_vouching()
        self._cache.clear()
        await self._feed.close()
        self._watches.cancel()
        self._introspections.cancel()
        self._introspections.introspector.close()

    @property
    def feed_up(self) -> bool:
        """Whether the feed is open and current (every message it missed is in)."""
        return self._feed.down_since is None

    @property
    def alive_at(self) -> float:
        """The feed's last sign of life while current (a message or a pong), on the clock."""
        return self._feed.alive

    @property
    def following(self) -> bool:
        """Whether the feed is being followed: :meth:`start` ran, and :meth:`close` has not."""
        return self._feed.following

    # -- what the feed tells -------------------------------------------------------------------

    def _revoked(self, named: tuple[str, str]) -> None:
        self._cache.revoke(named)
        self._watches.revoked(named)

    def _flushed(self) -> None:
        self._cache.flush()
        self._watches.flushed()

    def _went_down(self) -> None:
        self._watches.feed_down()
