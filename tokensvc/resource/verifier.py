"""The verifier: a resource server's check of a bearer token at local speed, revoked everywhere
within a second.

A token is introspected once (RFC 7662, with the resource server's client credentials) and the
answer cached: a bounded LRU, an active answer never past the token's ``exp`` (nor ``max_ttl``),
an inactive one ``negative_ttl`` seconds. The revocation feed (``GET /oauth/revocations``) stays
open beside it and drops the entries each revocation names, by the identifiers introspection
returned (``family_id``, ``grant_id``, ``client_id``, ``sub``). Concurrent checks of one token
share one introspection, and an answer a revocation overtook on its way is asked again, never
cached.

While the feed is down (not yet open, reconnecting), nothing tells the cache of a revocation: an
answer is used only within ``offline_ttl`` seconds of the last moment it was known current (the
feed's last sign of life, a message or a pong, or the introspection, whichever is later); past
that the token is introspected again, and when tokensvc does not answer either the check fails
closed (:class:`Unavailable`). A feed that falls silent without closing (a stalled proxy) is
taken for down once a ping goes unanswered ``ping_seconds``; its silence counts from its last
sign of life, not from that moment.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import random
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote_plus, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from tokensvc.oauth.scopes import satisfies
from tokensvc.resource.errors import InsufficientScope, InvalidToken, Unavailable

log = logging.getLogger(__name__)

KEYS = ("family_id", "grant_id", "client_id", "sub")  # what a feed message names, as introspection does
# What a message names when some of what the tokens may do was withdrawn (a client narrowed, a
# user demoted), rather than the tokens ended: a watched connection asks again what is left.
NARROWED = ("client_id", "sub")
RECENT = 1024  # revocations remembered, to tell an introspection that one overtook it


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (RFC 6750 §2.1), else None."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def masked_query(query: str) -> str:
    """``query`` with the value of ``access_token`` (a WebSocket's token, RFC 6750 §2.3)
    replaced by ``***``: what a log may hold of a query. The name counts as a parser decodes it
    (``access%5Ftoken``, ``access%5ftoken``, ``access_token+``), in any case; every other part
    is kept byte for byte."""
    if "%" not in query and "token" not in query.lower():
        return query
    parts = re.split(r"([&;])", query)  # ';' too: a parser that takes it as a separator sees a name there
    for index in range(0, len(parts), 2):
        if unquote_plus(parts[index].partition("=")[0]).strip().lower() == "access_token":
            parts[index] = "access_token=***"
    return "".join(parts)


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
    max_ttl: float = 3600.0  # an active answer is used at most this long, feed or not
    negative_ttl: float = 5.0  # an inactive answer
    offline_ttl: float = 30.0  # the bound of an answer's age while the feed is down
    timeout: float = 5.0  # introspection and the feed's handshake
    ping_seconds: float = 10.0  # the feed is taken for down when a ping has no answer within this
    retry_seconds: float = 1.0  # the first wait before reconnecting the feed (doubles up to 30 s)
    realm: str = "api"

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")  # the endpoints' paths are joined to it


@dataclass(slots=True, eq=False)
class _Watch:
    token: str
    authorized: Authorized
    required: str | None
    on_end: Callable[[], None]
    ended: bool = False


@dataclass(slots=True)
class Counts:
    """What the verifier did: checks, cache hits, introspections, feed messages."""

    checks: int = 0
    hits: int = 0
    introspections: int = 0
    revocations: int = 0
    flushes: int = 0
    connects: int = 0


class Verifier:
    """Checks bearer tokens for one resource server; one per process. :meth:`start` opens the
    feed (within a running event loop), :meth:`close` ends it."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock, self._wall = clock, wall
        self._cache: OrderedDict[bytes, _Entry] = OrderedDict()
        self._index: dict[tuple[str, str], set[bytes]] = {}
        self._inflight: dict[bytes, asyncio.Future[_Entry]] = {}
        self._generation = 0  # counts the feed's revocations and flushes
        self._recent: deque[tuple[int, tuple[str, str] | None]] = deque(maxlen=RECENT)
        self._down_since: float | None = clock()  # the feed is down until its first ready
        self._alive = self._down_since  # the feed's last sign of life while current: a message or a pong
        self._stream: str | None = None
        self._seq = 0
        self._catching_up_to = 0
        self._task: asyncio.Task[None] | None = None
        self._connection: WebSocketClientConnection | None = None
        self._watches: set[_Watch] = set()
        self._tasks: set[asyncio.Future[Any]] = set()
        self._confirming = False  # the watches are confirmed while the feed is down
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
        self.counts.checks += 1
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        entry = self._cached(key)
        if entry is None:
            entry = await self._introspect_shared(key, token)
        else:
            self.counts.hits += 1
        if entry.answer is None:
            raise InvalidToken("The access token is not active")
        authorized = Authorized(entry.answer)
        if scope is not None:
            authorized.require(scope)
        return authorized

    def _cached(self, key: bytes) -> _Entry | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        now = self._clock()
        stale = self._down_since is not None and now - max(entry.verified, self._down_since) > self.settings.offline_ttl
        if now >= entry.expires or stale:
            self._drop(key)
            return None
        self._cache.move_to_end(key)
        return entry

    async def _introspect_shared(self, key: bytes, token: str) -> _Entry:
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[_Entry] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            entry = await self._introspect_current(key, token)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when no one else waited
            raise
        finally:
            del self._inflight[key]
        future.set_result(entry)
        return entry

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
        left = float(answer.get("exp", 0)) - self._wall()
        return _Entry(answer, now + min(left, settings.max_ttl), asked)

    async def _introspect(self, token: str) -> dict[str, Any] | None:
        """The answer for an active access token, None for anything else."""
        self.counts.introspections += 1
        request = HTTPRequest(self.settings.base_url + "/oauth/token/introspect", method="POST",
                              body=urlencode({"token": token, "token_type_hint": "access_token"}),
                              headers={"Authorization": self._basic, "Accept": "application/json"},
                              request_timeout=self.settings.timeout, connect_timeout=self.settings.timeout)
        try:
            response = await AsyncHTTPClient().fetch(request)  # the loop's shared client
            answer = json.loads(response.body)
        except HTTPClientError as exc:  # an answer other than 200, or none (599)
            if exc.code in (401, 403):
                log.error("introspection refused (%s): check the resource server's client credentials", exc.code)
            raise Unavailable(f"The token service could not introspect ({exc.code})") from None
        except (TimeoutError, OSError, ValueError) as exc:
            raise Unavailable(f"The token service did not answer ({type(exc).__name__})") from None
        if not isinstance(answer, dict) or answer.get("active") is not True:
            return None
        if answer.get("token_type", "access_token") != "access_token":
            return None  # a refresh token is never a bearer token
        return answer

    # -- the cache ----------------------------------------------------------------------------

    def _store(self, key: bytes, entry: _Entry) -> None:
        if entry.expires <= self._clock():
            return
        self._drop(key)
        self._cache[key] = entry
        for name in KEYS:
            if entry.answer and name in entry.answer:
                self._index.setdefault((name, entry.answer[name]), set()).add(key)
        while len(self._cache) > self.settings.max_entries:
            self._drop(next(iter(self._cache)))

    def _drop(self, key: bytes) -> None:
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

    def _flush(self) -> None:
        self._generation += 1
        self._recent.append((self._generation, None))
        self._cache.clear()
        self._index.clear()
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
        return len(self._cache)

    # -- watching a connection ----------------------------------------------------------------

    def watch(self, token: str, authorized: Authorized, on_end: Callable[[], None],
              scope: str | None = None) -> Callable[[], None]:
        """Call ``on_end`` once when the authorization of ``token`` (``authorized``, as
        :meth:`check` found it) ends: revoked (the feed names it), expired, no longer holding
        ``scope``, or no longer confirmable (the feed down past ``offline_ttl`` and tokensvc not
        answering). The function returned stops the watch (call it when the connection closes)."""
        watch = _Watch(token, authorized, scope, on_end)
        self._watches.add(watch)
        loop = asyncio.get_running_loop()
        left = float(authorized.answer.get("exp", 0)) - self._wall()
        timer = loop.call_later(max(0.0, left), self._end, watch)
        if self._down_since is not None and not self._confirming:
            self._spawn(self._confirm_watches_while_down())

        def stop() -> None:
            timer.cancel()
            self._watches.discard(watch)
        return stop

    def _end(self, watch: _Watch) -> None:
        if not watch.ended:
            watch.ended = True
            self._watches.discard(watch)
            try:
                watch.on_end()
            except Exception:
                log.exception("a watch's on_end failed")

    def _recheck_watches(self, named: tuple[str, str] | None) -> None:
        """A flush asks again for every watched token; a revocation ends those whose family or
        grant it names, and asks again for those of a narrowed client or user (what is left?)."""
        for watch in list(self._watches):
            if named is not None and watch.authorized.answer.get(named[0]) != named[1]:
                continue
            if named is None or named[0] in NARROWED:
                self._spawn(self._reverify(watch))
            else:
                self._end(watch)

    async def _reverify(self, watch: _Watch) -> None:
        try:
            answer = await self._introspect(watch.token)
        except Unavailable:  # nothing confirms it any more: fail closed
            answer = None
        if answer is None or (watch.required and not satisfies(str(answer.get("scope", "")).split(), watch.required)):
            self._end(watch)

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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for task in list(self._tasks):
            task.cancel()
        if self._connection is not None:
            self._connection.close()
            self._connection = None

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
                await self._read_feed()
                wait = self.settings.retry_seconds
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # refused, unreachable, broken: down, and try again
                log.warning("revocation feed unavailable (%s); reconnecting in %.1fs", exc, wait)
            self._went_down()
            await asyncio.sleep(wait * (0.5 + random.random() / 2))
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
        introspected again (the feed cannot say it was revoked); one that is not confirmed ends."""
        self._confirming = True
        try:
            while self._down_since is not None and self._watches:
                await asyncio.sleep(self.settings.offline_ttl)
                if self._down_since is not None:
                    for watch in list(self._watches):
                        self._spawn(self._reverify(watch))
        finally:
            self._confirming = False

    async def _read_feed(self) -> None:
        query = f"?stream={self._stream}&after={self._seq}" if self._stream else ""
        url = self.settings.base_url.replace("http", "ws", 1) + "/oauth/revocations" + query
        request = HTTPRequest(url, headers={"Authorization": self._basic}, connect_timeout=self.settings.timeout,
                              request_timeout=self.settings.timeout)
        ping = self.settings.ping_seconds
        self._connection = connection = await websocket_connect(request, ping_interval=ping / 2, ping_timeout=ping / 2)
        connection.on_pong = self._sign_of_life  # type: ignore[method-assign,assignment]
        self.counts.connects += 1
        while True:
            raw = await connection.read_message()
            if raw is None:
                return
            self._heard(json.loads(raw))

    def _heard(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "ready":
            if not message.get("resumed"):
                self._flush()
            self._stream, self._seq = message["stream"], int(message["seq"])
            self._catching_up_to = int(message["seq"])
        else:
            self._seq = int(message.get("seq", self._seq))
            if kind == "flush":
                self._flush()
            elif kind == "revoked":
                for name in KEYS:
                    if name in message:
                        self._revoked((name, str(message[name])))
        if self._down_since is not None and self._seq >= self._catching_up_to:
            self._down_since = None  # every message it missed is in: current again
            self.connected.set()
        self._sign_of_life()

    def _sign_of_life(self, _pong: bytes = b"") -> None:
        if self._down_since is None:  # a feed still catching up vouches for nothing yet
            self._alive = self._clock()
