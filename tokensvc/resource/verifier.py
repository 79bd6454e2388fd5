"""The verifier: a resource server's check of a bearer token at local speed, revoked everywhere
within a second.

A token is introspected once (RFC 7662, with the resource server's client credentials, through
an HTTP client of the verifier's own) and the answer cached: a bounded LRU, an active answer
never past the token's ``exp`` (nor ``max_ttl``), an inactive one ``negative_ttl`` seconds in a
bounded table of its own (junk tokens never evict a good answer). ``exp`` is judged by
whichever of tokensvc's clock and this host's says it comes first (fail closed, whichever is
wrong): tokensvc's is this host's plus the offset the last introspection's ``Date`` header gave
(at most: the header is in whole seconds; an answer without a ``Date`` it can read gives none),
and a lifetime once known runs on the monotonic clock, so a clock set back or a suspended host
cannot stretch it. What cannot be an access token tokensvc issued (every one is 43 URL-safe
characters: :data:`ACCESS_TOKEN`), or what it refuses as malformed (400, 422), is not active:
refused without (another) round trip.

Anyone may present tokens, so what a flood of made-up ones can take is bounded: checks have at
most ``introspection_concurrency`` introspections in flight and ``introspection_queue`` more
waiting; past that a check of a token not cached fails at once (:class:`Unavailable`) rather
than queueing. Watched connections are asked again on places of their own
(``reverify_concurrency``), which checks never take, and the HTTP client has a connection for
every place, so nothing queues in it.

The revocation feed (``GET /oauth/revocations``) stays open beside it and drops the entries each
revocation names, by the identifiers introspection returned (``family_id``, ``grant_id``,
``client_id``, ``sub``). Concurrent checks of one token share one introspection (a caller that
goes away leaves it running for the others), and an answer a revocation overtook on its way is
asked again, never cached. A message the verifier does not understand (a type it does not
know, a revocation naming anything but those identifiers or naming one by anything but a
non-empty string, a ``ready`` with a member it does not know or a ``resumed`` neither true nor
false) drops every cached answer, as a ``flush`` does, with a warning logged once: a newer
tokensvc is never trusted to mean nothing.

A reconnecting feed resumes after the last message it *processed*: the ``ready`` of a resumed
stream names the stream's newest message, and the cache is current again only once every
message up to that one is in; a connection cut before the replay is resumed from the same point
again. A feed that cannot resume is a flush, and so is a ``ready`` that claims to resume behind
what was processed. Each connection starts with its ``ready`` and every message after it is
numbered one past the last: anything else (a message before the ``ready``, a frame a middlebox
lost, repeated or reordered, a second ``ready``) breaks the connection, which is resumed after
the last message processed; one before the ``ready`` flushes too (nothing on that connection
can be trusted).

While the feed is down (not yet open, reconnecting, catching up), nothing tells the cache of a
revocation: an answer is used only within ``offline_ttl`` seconds of the last moment it was
known current (the feed's last sign of life, a message or a pong, or the introspection,
whichever is later); past that the token is introspected again, and when tokensvc does not
answer either the check fails closed (:class:`Unavailable`). The verifier pings the feed every
``ping_seconds / 2``; a feed that falls silent without closing (a stalled proxy) is taken for
down once nothing came for ``ping_seconds``, and reconnected at once (its close handshake is
not waited for); its silence counts from its last sign of life, not from that moment.

Watched connections (:meth:`Verifier.watch`) end when a revocation names their token's family
or grant, or at its ``exp``; a flush, a narrowed client or user, the feed down past
``offline_ttl``, or ``max_ttl`` after its answer's introspection has each token asked again through
the cache and the shared introspection, at most ``reverify_concurrency`` at a time (a larger
batch spread over ``reverify_spread`` seconds) and one at a time per connection (asked again
during one, it runs once more after it). A token tokensvc says is inactive (or no longer
holding the connection's scope) ends its connections; tokensvc not answering is no revocation:
it is asked again until ``offline_ttl`` past the moment the authorization was last known
current, and only then does the connection end (fail closed).

The feed's life is logged, never a token nor a secret: connected, resumed, flushed (WARNING),
closed, broken or unreachable with the reason (WARNING, with the wait before reconnecting); so
are the watched connections ended unconfirmed (WARNING, one line a round with their number);
and counted in :class:`Counts`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import hashlib
import logging
import random
import re
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, websocket_connect

from tokensvc import jsontext, redaction
from tokensvc.oauth.hashing import ACCESS_TOKEN, SECRET_LENGTH
from tokensvc.oauth.scopes import satisfies
from tokensvc.resource.errors import InsufficientScope, InvalidToken, Unavailable

log = logging.getLogger(__name__)

KEYS = ("family_id", "grant_id", "client_id", "sub")  # what a feed message names, as introspection does
# What a message names when some of what the tokens may do was withdrawn (a client narrowed, a
# user demoted), rather than the tokens ended: a watched connection asks again what is left.
NARROWED = ("client_id", "sub")
RECENT = 1024  # revocations remembered, to tell an introspection that one overtook it
NOT_ACTIVE = "The access token is not active"
MESSAGE_FIELDS = frozenset(("type", "seq"))  # what every numbered feed message carries besides
READY_FIELDS = frozenset(("type", "stream", "seq", "resumed"))  # what a ready carries


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (RFC 6750 §2.1), else None."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def query_token(query: str) -> str | None:
    """The ``access_token`` of ``query`` as Tornado's ``get_query_argument`` reads it (the last
    one given, percent-decoded, whitespace stripped), else None: one reading for every adapter."""
    values = parse_qs(query, keep_blank_values=True).get("access_token")
    return values[-1].strip() if values else None


def masked_query(query: str) -> str:
    """``query`` with the value of ``access_token`` (a WebSocket's token, RFC 6750 §2.3)
    replaced by ``***``: what a log may hold of a query. The name counts as any parser may read
    it (:func:`tokensvc.redaction.names`: ``access%5Ftoken``, ``ACCESS_TOKEN``,
    ``access_token+``, ``access_token%00``, ``access.token``, ``access_token[]``,
    ``x[access_token]``); every other part is kept byte
    for byte (the other names a log withholds may be the application's own: ``code`` and
    ``state`` at its OAuth callback)."""
    if query.isascii() and "%" not in query and "token" not in query.lower():
        return query
    parts = re.split(r"([&;])", query)  # ';' too: a parser that takes it as a separator sees a name there
    for index in range(0, len(parts), 2):
        if redaction.names(parts[index].partition("=")[0], "access_token"):
            parts[index] = "access_token=***"
    return "".join(parts)


def _key(token: str) -> bytes:
    """What the cache keys a token's answer on: never the token itself."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(slots=True, frozen=True)
class Authorized:
    """An access token in force: its introspection answer."""

    answer: dict[str, Any]

    @property
    def scopes(self) -> list[str]:
        return str(self.answer.get("scope") or "").split()

    @property
    def subject(self) -> str | None:
        return self.answer.get("sub")

    @property
    def client_id(self) -> str | None:
        return self.answer.get("client_id")

    def has(self, scope: str) -> bool:
        """Whether the token may do what ``scope`` names (``write`` covers ``read`` and every
        ``<resource>:<action>``, ``read`` every ``<resource>:read``)."""
        return satisfies(self.scopes, scope)

    def require(self, scope: str) -> None:
        if not self.has(scope):
            raise InsufficientScope(scope)


@dataclass(slots=True)
class _Entry:
    answer: dict[str, Any] | None  # None: not active
    expires: float  # monotonic
    verified: float  # monotonic: when the answer was known current


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

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")  # the endpoints' paths are joined to it


@dataclass(slots=True, eq=False)
class _Watch:
    token: str
    authorized: Authorized
    required: str | None
    on_end: Callable[[], None]
    confirmed: float  # on the clock: when the authorization was last known current
    ended: bool = False
    timer: asyncio.TimerHandle | None = None  # its token's exp, or max_ttl: asked again then
    reverifying: bool = False  # one re-verification at a time
    again: bool = False  # asked for during it: once more after it


def _close_connected(connecting: asyncio.Future[WebSocketClientConnection]) -> None:
    """A feed connection given up during its handshake (the verifier closed): closed when the
    handshake completes, never left open."""
    if not connecting.cancelled() and connecting.exception() is None:
        connecting.result().close()


class _Broken(Exception):
    """The feed's connection broke its order (why, for the log): it is given up and resumed."""


class _Lane:
    """Introspections of one kind, one per token shared by whoever asks: at most ``limit`` in
    flight and, when ``queue`` is given, that many more waiting for a place; past that a new
    one is refused at once (:class:`Unavailable`) rather than queued."""

    def __init__(self, limit: int, queue: int | None = None) -> None:
        self._places = asyncio.Semaphore(limit)
        self._bound = None if queue is None else limit + queue
        self.inflight: dict[bytes, asyncio.Future[_Entry]] = {}  # in flight and waiting

    def join(self, key: bytes, introspect: Callable[[], Awaitable[_Entry]]) -> asyncio.Future[_Entry]:
        task = self.inflight.get(key)
        if task is None:
            if self._bound is not None and len(self.inflight) >= self._bound:
                raise Unavailable("Too many tokens are being introspected at once")
            task = asyncio.ensure_future(self._run(introspect))
            self.inflight[key] = task
            task.add_done_callback(lambda done: self._settled(key, done))
        return task

    async def _run(self, introspect: Callable[[], Awaitable[_Entry]]) -> _Entry:
        async with self._places:
            return await introspect()

    def _settled(self, key: bytes, task: asyncio.Future[_Entry]) -> None:
        if self.inflight.get(key) is task:
            del self.inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning when every caller went away


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


class Verifier:
    """Checks bearer tokens for one resource server; one per process, used within one event
    loop. :meth:`start` opens the feed (within a running event loop), :meth:`close` ends it."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock, self._wall = clock, wall
        self._cache: OrderedDict[bytes, _Entry] = OrderedDict()
        self._negative: OrderedDict[bytes, _Entry] = OrderedDict()  # inactive answers
        self._index: dict[tuple[str, str], set[bytes]] = {}
        self._checks = _Lane(settings.introspection_concurrency, settings.introspection_queue)
        self._reverifies = _Lane(settings.reverify_concurrency)  # never starved by checks
        self._generation = 0  # counts the feed's revocations and flushes
        self._recent: deque[tuple[int, tuple[str, str] | None]] = deque(maxlen=RECENT)
        self._offset = 0.0  # tokensvc's clock minus this host's, at most (the last Date heard)
        self._closed = False
        self._down_since: float | None = clock()  # the feed is down until its first ready
        self._alive = self._down_since  # the feed's last sign of life while current: a message or a pong
        self._heard_at = 0.0  # time.monotonic() of the feed's last message or pong: its silence
        self._stream: str | None = None
        self._seq = 0  # the last message processed: where a reconnection resumes
        self._catching_up_to = 0  # the feed is current once _seq reaches this
        self._task: asyncio.Task[None] | None = None
        self._connection: WebSocketClientConnection | None = None
        self._http: AsyncHTTPClient | None = None
        self._watches: set[_Watch] = set()
        self._reverifying = 0  # watches with a re-verification in flight
        self._unconfirmed = 0  # of them, ended unconfirmed since the last were logged
        self._tasks: set[asyncio.Future[Any]] = set()
        self._confirming = False  # the watches are confirmed while the feed is down
        self._warned: set[str] = set()  # messages not understood, warned of once each
        self.counts = Counts()
        self.connected = asyncio.Event()  # set while the feed is open and current
        secret = f"{quote(settings.client_id, safe='')}:{quote(settings.client_secret, safe='')}"
        self._basic = "Basic " + base64.b64encode(secret.encode()).decode()

    # -- the check --------------------------------------------------------------------------

    async def check(self, token: str | None, scope: str | None = None) -> Authorized:
        """The token's authorization, or :class:`InvalidToken` (401), :class:`InsufficientScope`
        (403) or :class:`Unavailable` (503, tokensvc unreachable while nothing current is known)."""
        if not token:
            raise InvalidToken(None)
        if self._closed:  # nothing vouches for a cached answer any more, and nothing may ask
            raise Unavailable("The verifier is closed")
        self.counts.checks += 1
        if len(token) != SECRET_LENGTH:  # none tokensvc issued (and not worth a digest): no round trip
            raise InvalidToken(NOT_ACTIVE)
        key = _key(token)
        entry = self._cached(key)
        if entry is None:
            # Its alphabet too, but only here: a token cached had the form (a fifth of a hit's CPU).
            if not ACCESS_TOKEN.fullmatch(token):
                raise InvalidToken(NOT_ACTIVE)
            entry = await self._introspect_shared(key, token, self._checks)
        else:
            self.counts.hits += 1
        if entry.answer is None:
            raise InvalidToken(NOT_ACTIVE)
        authorized = Authorized(entry.answer)
        if scope is not None:
            authorized.require(scope)
        return authorized

    def _cached(self, key: bytes) -> _Entry | None:
        table = self._cache
        entry = table.get(key)
        if entry is None:
            table = self._negative
            entry = table.get(key)
            if entry is None:
                return None
        now = self._clock()
        stale = self._down_since is not None and now - max(entry.verified, self._down_since) > self.settings.offline_ttl
        if now >= entry.expires or stale:
            self._drop(key)
            return None
        table.move_to_end(key)
        return entry

    async def _introspect_shared(self, key: bytes, token: str, lane: _Lane) -> _Entry:
        """The token's answer, from one introspection at a time per token and ``lane`` whoever
        asks: it runs as a task of its own, so a caller cancelled (its client went away) leaves
        it running for the others."""
        return await asyncio.shield(lane.join(key, lambda: self._introspect_current(key, token)))

    async def _introspect_current(self, key: bytes, token: str) -> _Entry:
        """An answer no revocation overtook: asked again when one named it on its way."""
        for _ in range(3):
            generation, asked = self._generation, self._clock()
            answer = await self._introspect(token)
            overtaken = self._overtaken(generation, answer)
            if overtaken is None:  # too much happened meanwhile to tell: used once, not cached
                return self._entry(answer, asked)
            if not overtaken:
                entry = self._entry(answer, asked)
                self._store(key, entry)
                return entry
        raise Unavailable("Revocations keep overtaking the introspection of this token")

    def _overtaken(self, generation: int, answer: dict[str, Any] | None) -> bool | None:
        """Whether a revocation since ``generation`` names ``answer``; None when the record of
        revocations no longer reaches back that far."""
        if generation == self._generation:
            return False
        if not self._recent or self._recent[0][0] > generation + 1:
            return None
        names = {(name, answer[name]) for name in KEYS if answer and name in answer}
        return any(named is None or named in names for number, named in self._recent if number > generation)

    def _entry(self, answer: dict[str, Any] | None, asked: float) -> _Entry:
        settings, now = self.settings, self._clock()
        if answer is None:
            return _Entry(None, now + settings.negative_ttl, asked)
        return _Entry(answer, now + min(self._left(answer), settings.max_ttl), asked)

    def _left(self, answer: dict[str, Any]) -> float:
        """Seconds until the token's ``exp`` by tokensvc's clock or this host's, whichever says
        fewer: a ``Date`` in the past (a clock, or a proxy, gone wrong) stretches nothing."""
        return float(answer.get("exp", 0)) - (self._wall() + max(self._offset, 0.0))

    def _client(self) -> AsyncHTTPClient:
        """The verifier's own HTTP client: the application's requests through the loop's shared
        one never queue behind its introspections, nor they behind the application's."""
        if self._http is None:
            settings = self.settings  # a connection for every place: none waits in the client's queue
            self._http = AsyncHTTPClient(force_instance=True, max_clients=settings.introspection_concurrency
                                         + settings.reverify_concurrency)
        return self._http

    async def _introspect(self, token: str) -> dict[str, Any] | None:
        """The answer for an active access token, None for anything else."""
        self.counts.introspections += 1
        request = HTTPRequest(self.settings.base_url + "/oauth/token/introspect", method="POST",
                              body=urlencode({"token": token, "token_type_hint": "access_token"}),
                              headers={"Authorization": self._basic, "Accept": "application/json"},
                              request_timeout=self.settings.timeout, connect_timeout=self.settings.timeout)
        sent = self._wall()
        try:
            response = await self._client().fetch(request)
            answer = jsontext.loads(response.body)
        except HTTPClientError as exc:  # an answer other than 200, or none (599)
            if exc.code in (400, 422):  # the token itself refused (too long, malformed): none tokensvc issued
                return None
            if exc.code in (401, 403):
                log.error("introspection refused (%s): check the resource server's client credentials", exc.code)
            raise Unavailable(f"The token service could not introspect ({exc.code})") from None
        except (TimeoutError, OSError, ValueError) as exc:
            raise Unavailable(f"The token service did not answer ({type(exc).__name__})") from None
        self._heard_date(response.headers.get("Date"), sent)
        if not isinstance(answer, dict) or answer.get("active") is not True:
            return None
        if answer.get("token_type", "access_token") != "access_token":
            return None  # a refresh token is never a bearer token
        return answer

    def _heard_date(self, date: str | None, sent: float) -> None:
        """tokensvc's clock, from its answer's ``Date``: stamped after ``sent`` (this host's
        clock), in whole seconds, so its clock is at most ``Date + 1 - sent`` ahead of ours."""
        try:
            stamped = email.utils.parsedate_to_datetime(date).timestamp()  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            self._offset = 0.0  # none heard: an offset heard before is no longer known to hold
            return
        self._offset = stamped + 1 - sent

    # -- the cache ----------------------------------------------------------------------------

    def _store(self, key: bytes, entry: _Entry) -> None:
        if entry.expires <= self._clock():
            return
        self._drop(key)
        table, bound = (self._cache, self.settings.max_entries) if entry.answer else (
            self._negative, self.settings.max_negative)
        table[key] = entry
        for name in KEYS:
            if entry.answer and name in entry.answer:
                self._index.setdefault((name, entry.answer[name]), set()).add(key)
        while len(table) > bound:
            self._drop(next(iter(table)))

    def _drop(self, key: bytes) -> None:
        self._negative.pop(key, None)
        entry = self._cache.pop(key, None)
        if entry is None or entry.answer is None:
            return
        for name in KEYS:
            if name in entry.answer:
                keys = self._index.get((name, entry.answer[name]))
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._index[(name, entry.answer[name])]

    def _forget(self) -> None:
        """Every answer dropped, active and inactive, with the index on them."""
        self._cache.clear()
        self._negative.clear()
        self._index.clear()

    def _flush(self) -> None:
        self._generation += 1
        self._recent.append((self._generation, None))
        self._forget()
        self.counts.flushes += 1
        self._recheck_watches(None)

    def _revoked(self, named: tuple[str, str]) -> None:
        self._generation += 1
        self._recent.append((self._generation, named))
        for key in list(self._index.get(named, ())):
            self._drop(key)
        self.counts.revocations += 1
        self._recheck_watches(named)

    @property
    def cached(self) -> int:
        """The answers cached, active and inactive."""
        return len(self._cache) + len(self._negative)

    # -- watching a connection ----------------------------------------------------------------

    def watch(self, token: str, authorized: Authorized, on_end: Callable[[], None],
              scope: str | None = None) -> Callable[[], None]:
        """Call ``on_end`` once when the authorization of ``token`` (``authorized``, as
        :meth:`check` found it) ends: revoked (the feed names it), expired, no longer holding
        ``scope``, or no longer confirmable (the feed down past ``offline_ttl`` and tokensvc not
        answering). The function returned stops the watch (call it when the connection closes)."""
        entry = self._cache.get(_key(token))
        watch = _Watch(token, authorized, scope, on_end, self._known_current(entry))
        self._watches.add(watch)
        self._arm(watch, entry)
        if self._down_since is not None and not self._confirming:
            self._spawn(self._confirm_watches_while_down())

        def stop() -> None:  # ended without on_end: nothing of it runs again
            watch.ended = True
            if watch.timer is not None:
                watch.timer.cancel()
            self._watches.discard(watch)
        return stop

    def _arm(self, watch: _Watch, entry: _Entry | None = None) -> None:
        """The watch is due at its token's ``exp``, or when the answer it stands on (``entry``;
        none: one just asked) leaves the cache, ``max_ttl`` after its introspection, if that
        comes first: an authorization is held no longer than a cached answer without being
        asked again."""
        if watch.timer is not None:
            watch.timer.cancel()
        if watch.ended:
            return
        held = self.settings.max_ttl if entry is None else entry.expires - self._clock()
        due = max(0.0, min(self._left(watch.authorized.answer), held))
        watch.timer = asyncio.get_running_loop().call_later(due, self._due, watch)

    def _due(self, watch: _Watch) -> None:
        if self._left(watch.authorized.answer) <= 0:
            self._end(watch)
        else:
            self._reverify_soon(watch)

    def _end(self, watch: _Watch) -> None:
        if not watch.ended:
            watch.ended = True
            if watch.timer is not None:
                watch.timer.cancel()
            self._watches.discard(watch)
            try:
                watch.on_end()
            except Exception:
                log.exception("a watch's on_end failed")

    def _recheck_watches(self, named: tuple[str, str] | None) -> None:
        """A flush asks again for every watched token; a revocation ends those whose family or
        grant it names, and asks again for those of a narrowed client or user (what is left?)."""
        watches = [watch for watch in self._watches
                   if named is None or watch.authorized.answer.get(named[0]) == named[1]]
        if named is None or named[0] in NARROWED:
            self._reverify_all(watches)
        else:
            for watch in watches:
                self._end(watch)

    def _reverify_all(self, watches: Iterable[_Watch]) -> None:
        watches = list(watches)
        spread = self.settings.reverify_spread if len(watches) > self.settings.reverify_concurrency else 0.0
        for watch in watches:
            self._reverify_soon(watch, spread)

    def _reverify_soon(self, watch: _Watch, spread: float = 0.0) -> None:
        """At most one re-verification of ``watch`` in flight, however many flushes ask for
        one: asked during one, it runs once more after it (what it found may predate the ask)."""
        if watch.reverifying:
            watch.again = True
        else:
            watch.reverifying = True
            self._reverifying += 1
            self._spawn(self._reverify_while_asked(watch, spread))

    async def _reverify_while_asked(self, watch: _Watch, spread: float) -> None:
        try:
            while True:
                watch.again = False
                await self._reverify(watch, spread)
                if not watch.again:
                    return
                spread = 0.0
        finally:
            watch.reverifying = False
            self._reverifying -= 1
            if not self._reverifying and self._unconfirmed:  # a round over: one line, however many ended
                log.warning("%d watched connection(s) ended: tokensvc could not confirm their tokens within "
                            "offline_ttl", self._unconfirmed)
                self._unconfirmed = 0

    async def _reverify(self, watch: _Watch, spread: float = 0.0) -> None:
        """Whether the watched token still holds what its connection stands on: through the
        cache and the introspection its other connections share, ``reverify_concurrency`` at a
        time, after a random wait within ``spread``. tokensvc not answering is no revocation:
        asked again until ``offline_ttl`` past the moment the authorization was last known
        current (the feed up: now), then the watch ends (fail closed)."""
        down = self._down_since
        since = self._clock() if down is None else max(watch.confirmed, down)
        if spread:
            await asyncio.sleep(random.uniform(0, spread))
        key, wait = _key(watch.token), self.settings.retry_seconds
        while True:
            if watch.ended:
                return
            try:
                entry = self._cached(key) or await self._introspect_shared(key, watch.token, self._reverifies)
                break
            except Unavailable:
                left = since + self.settings.offline_ttl - self._clock()
                if left <= 0:
                    self._unconfirmed += 1  # logged once for them all, when the round is over
                    self._end(watch)
                    return
                await asyncio.sleep(min(left, wait * (0.5 + random.random() / 2)))
                wait = min(wait * 2, 30.0)
        answer = entry.answer
        if answer is None or (watch.required and not satisfies(str(answer.get("scope", "")).split(), watch.required)):
            self._end(watch)
        else:
            watch.confirmed = self._known_current(entry)
            self._arm(watch, entry)

    def _known_current(self, entry: _Entry | None) -> float:
        """When ``entry``'s answer was last known current: now while the feed is up; else when
        it was introspected or the feed last vouched, whichever is later (now, with no entry:
        the answer was just asked)."""
        down = self._down_since
        return self._clock() if down is None or entry is None else max(entry.verified, down)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the feed -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the revocation feed (and keep it open) in the background."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._follow())

    async def close(self) -> None:
        """Stop: the feed closed, every task ended, and every check from now on is 503 (a
        request still in flight at shutdown is neither served from a cache nothing keeps
        current any more nor given a new HTTP client)."""
        self._closed = True
        if self._down_since is None:
            self._down_since = self._clock()
        self.connected.clear()
        self._forget()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for task in [*self._tasks, *self._checks.inflight.values(), *self._reverifies.inflight.values()]:
            task.cancel()
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._http is not None:
            self._http.close()
            self._http = None

    @property
    def feed_up(self) -> bool:
        return self._down_since is None

    @property
    def alive_at(self) -> float:
        """The feed's last sign of life while current (a message or a pong), on the clock."""
        return self._alive

    async def _follow(self) -> None:
        wait = self.settings.retry_seconds
        while True:
            try:
                ended = await self._read_feed()
                wait = self.settings.retry_seconds
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # refused, unreachable, broken: down, and try again
                ended = f"unavailable ({exc})"
            self._went_down()
            pause = wait * (0.5 + random.random() / 2)
            log.warning("revocation feed %s; reconnecting in %.1fs", ended, pause)
            await asyncio.sleep(pause)
            wait = min(wait * 2, 30.0)

    def _went_down(self) -> None:
        if self._down_since is None:
            self._down_since = self._alive  # silent since then, however late that was noticed
            if not self._confirming:
                self._spawn(self._confirm_watches_while_down())
        self.connected.clear()
        self._connection = None

    async def _confirm_watches_while_down(self) -> None:
        """While the feed is down, every ``offline_ttl`` each watched connection's token is
        asked again (the feed cannot say it was revoked); one that is not confirmed ends."""
        self._confirming = True
        try:
            while self._down_since is not None and self._watches:
                await asyncio.sleep(self.settings.offline_ttl)
                if self._down_since is not None:
                    self._reverify_all(self._watches)
        finally:
            self._confirming = False

    async def _read_feed(self) -> str:
        """Follow one connection of the feed until it ends: what ended it, for the log."""
        query = f"?stream={self._stream}&after={self._seq}" if self._stream else ""
        url = self.settings.base_url.replace("http", "ws", 1) + "/oauth/revocations" + query
        request = HTTPRequest(url, headers={"Authorization": self._basic}, connect_timeout=self.settings.timeout,
                              request_timeout=self.settings.timeout)
        connecting = asyncio.ensure_future(websocket_connect(request))
        try:  # shielded: a handshake that completes after close() is still there to be closed
            self._connection = connection = await asyncio.shield(connecting)
        except asyncio.CancelledError:
            connecting.add_done_callback(_close_connected)
            raise
        connection.on_pong = self._pong  # type: ignore[method-assign,assignment]
        self.counts.connects += 1
        self._heard_at = time.monotonic()
        silent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pinging = asyncio.ensure_future(self._ping(connection, silent))
        opened = False  # its ready came
        try:
            while True:
                reading = asyncio.ensure_future(connection.read_message())
                await asyncio.wait((reading, silent), return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():  # taken for down now: its close handshake is not waited for
                    return f"silent for {self.settings.ping_seconds:g}s"
                raw = reading.result()
                if raw is None:
                    return f"closed (code {connection.close_code}, {connection.close_reason or 'no reason'})"
                try:
                    (self._heard if opened else self._opened)(jsontext.loads(raw))
                except _Broken as broken:
                    return str(broken)
                opened = True
        finally:
            pinging.cancel()
            connection.close()

    async def _ping(self, connection: WebSocketClientConnection, silent: asyncio.Future[None]) -> None:
        """A ping every ``ping_seconds / 2``; ``silent`` once nothing (a message, a pong) came
        for ``ping_seconds``."""
        ping = self.settings.ping_seconds
        while True:
            try:
                connection.ping()
            except WebSocketClosedError:  # the read sees the end
                return
            await asyncio.sleep(min(ping / 2, self._heard_at + ping - time.monotonic()))
            if time.monotonic() - self._heard_at >= ping:
                silent.set_result(None)
                return

    def _pong(self, _data: bytes) -> None:
        self._heard_at = time.monotonic()
        self._sign_of_life()

    def _opened(self, message: dict[str, Any]) -> None:
        """A connection's first message, which must be its ``ready``: anything before it means
        the stream cannot be trusted (what it missed is unknown), so every answer is dropped."""
        self._heard_at = time.monotonic()
        if message.get("type") != "ready":
            log.warning("revocation feed: a message before ready: every cached answer dropped")
            self._flush()
            raise _Broken("sent a message before ready")
        self._ready(message)
        self._processed()

    def _heard(self, message: dict[str, Any]) -> None:
        """A numbered message: the one after the last processed, or the connection is broken
        (a frame lost or repeated on the way) and resumed after the last processed."""
        self._heard_at = time.monotonic()
        kind, seq = message.get("type"), message.get("seq")
        if kind == "ready":
            raise _Broken("sent a second ready")
        if type(seq) is not int or seq != self._seq + 1:
            raise _Broken(f"out of sequence (message {str(seq)[:20]} after {self._seq})")
        self.counts.messages += 1
        if kind == "flush":
            log.warning("revocation feed: flush (revocations may have been missed): every cached answer dropped")
            self._flush()
        elif kind == "revoked":
            self._revocation(message)
        else:
            self._not_understood(f"a message of type {str(kind)[:40]!r}")
        self._seq = seq  # processed: a reconnection resumes after it
        self._processed()

    def _processed(self) -> None:
        if self._down_since is not None and self._seq >= self._catching_up_to:
            self._down_since = None  # every message it missed is in: current again
            self.connected.set()
        self._sign_of_life()

    def _ready(self, message: dict[str, Any]) -> None:
        stream, newest, resumed = message.get("stream"), message.get("seq"), message.get("resumed")
        if not isinstance(stream, str) or not stream or type(newest) is not int or newest < 0:
            self._not_understood("a ready without a stream and a number")
            raise _Broken("sent a ready without a stream and a number")
        unknown = sorted(str(name)[:40] for name in message.keys() - READY_FIELDS)
        if unknown or type(resumed) is not bool:  # resumed how far? Unknown: as if not at all
            self._not_understood("a ready with " + (", ".join(unknown) or f"resumed {str(resumed)[:20]!r}"))
            self._seq = newest
        elif resumed and stream == self._stream and newest >= self._seq:
            # The messages after self._seq follow: it moves as each is processed.
            self.counts.resumes += 1
            log.info("revocation feed resumed after message %d (%d to replay)", self._seq, newest - self._seq)
        else:
            if self._stream is None:
                log.info("revocation feed connected")
            elif resumed:  # behind what was processed, or another stream's: what it resumes is unknown
                log.warning("revocation feed resumed behind message %d (at %d): every cached answer dropped",
                            self._seq, newest)
            else:
                log.warning("revocation feed could not resume (tokensvc restarted, or too much was missed): "
                            "every cached answer dropped")
            self._flush()
            self._seq = newest
        self._stream, self._catching_up_to = stream, newest

    def _revocation(self, message: dict[str, Any]) -> None:
        unknown = sorted(str(name)[:40] for name in message.keys() - MESSAGE_FIELDS - set(KEYS))
        named = [(name, message[name]) for name in KEYS if name in message]
        if unknown or not named:
            self._not_understood("a revocation naming " + (", ".join(unknown) or "nothing"))
            return
        odd = [name for name, value in named if not isinstance(value, str) or not value]
        if odd:  # what would it match? Nothing cached: so it drops everything
            self._not_understood(f"a revocation whose {odd[0]} is no identifier")
            return
        for each in named:
            self._revoked(each)

    def _not_understood(self, what: str) -> None:
        """A message this library does not know (a newer tokensvc?): whatever it revoked is
        dropped with everything else; a warning once for each kind."""
        if what not in self._warned:
            self._warned.add(what)
            log.warning("revocation feed: %s, not understood: every cached answer dropped "
                        "(is tokensvc.resource older than tokensvc?)", what)
        self._flush()

    def _sign_of_life(self) -> None:
        if self._down_since is None:  # a feed still catching up vouches for nothing yet
            self._alive = self._clock()
