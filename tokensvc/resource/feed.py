"""Following the revocation feed (``GET /oauth/revocations``): :class:`FeedFollower` keeps it
open, says whether it vouches for the cache, and passes on each revocation and flush it hears.

A reconnecting feed resumes after the last message it *processed*: the ``ready`` of a resumed
stream names the stream's newest message, and the feed is current again only once every message
up to that one is in; a connection cut before the replay is resumed from the same point again.
A feed that cannot resume is a flush, and so is a ``ready`` that claims to resume behind what was
processed. Each connection starts with its ``ready`` and every message after it is numbered one
past the last: anything else (a message before the ``ready``, a frame a middlebox lost, repeated
or reordered, a second ``ready``) breaks the connection, which is resumed after the last message
processed; one before the ``ready`` flushes too (nothing on that connection can be trusted).

A message the follower does not understand (a type it does not know, a revocation naming
anything but the identifiers introspection returns or naming one by anything but a non-empty
string, a ``ready`` with a member it does not know or a ``resumed`` neither true nor false) is a
flush, with a warning logged once: a newer tokensvc is never trusted to mean nothing.

The follower pings the feed every ``ping_seconds / 2``; a feed that falls silent without closing
(a stalled proxy) is taken for down once nothing came for ``ping_seconds``, and reconnected at
once (its close handshake is not waited for); its silence counts from its last sign of life (a
message or a pong), not from that moment. The feed's life is logged, never a token nor a secret:
connected, resumed, flushed (WARNING), closed, broken or unreachable with the reason (WARNING,
with the wait before reconnecting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, websocket_connect

from tokensvc import jsontext
from tokensvc.resource.cache import KEYS
from tokensvc.resource.settings import Counts, Settings, basic_authorization

log = logging.getLogger("tokensvc.resource.verifier")  # the one logger docs/guide/resource-servers.md names

MESSAGE_FIELDS = frozenset(("type", "seq"))  # what every numbered feed message carries besides
READY_FIELDS = frozenset(("type", "stream", "seq", "resumed"))  # what a ready carries

Connect = Callable[[HTTPRequest], Awaitable[WebSocketClientConnection]]


class _ConnectionBroken(Exception):
    """The feed's connection broke its order (why, for the log): it is given up and resumed."""


def _close_when_connected(connecting: asyncio.Future[WebSocketClientConnection]) -> None:
    """A feed connection given up during its handshake (the follower closed): closed when the
    handshake completes, never left open."""
    if not connecting.cancelled() and connecting.exception() is None:
        connecting.result().close()


class FeedFollower:
    """One verifier's reader of the feed, on its monotonic ``clock``. What the feed tells is
    passed on: ``revoked`` a revocation (an identifier of :data:`KEYS` and its value),
    ``flushed`` a flush (anything may have been revoked), ``went_down`` that it vouches for
    nothing now. ``connect`` opens a connection (Tornado's ``websocket_connect``)."""

    def __init__(self, settings: Settings, clock: Callable[[], float], counts: Counts, *,
                 revoked: Callable[[tuple[str, str]], None], flushed: Callable[[], None],
                 went_down: Callable[[], None], connect: Connect = websocket_connect) -> None:
        self.settings, self.counts = settings, counts
        self._clock, self._connect = clock, connect
        self._revoked, self._flushed, self._went_down = revoked, flushed, went_down
        self.down_since: float | None = clock()  # None while current; down until the first ready
        self.alive = self.down_since  # the last sign of life while current: a message or a pong
        self._heard_at = 0.0  # time.monotonic() of the last message or pong: the feed's silence
        self._stream: str | None = None
        self._seq = 0  # the last message processed: where a reconnection resumes
        self._catching_up_to = 0  # the feed is current once _seq reaches this
        self._task: asyncio.Task[None] | None = None
        self._connection: WebSocketClientConnection | None = None
        self._warned: set[str] = set()  # messages not understood, warned of once each
        self._authorization = basic_authorization(settings)
        self.connected = asyncio.Event()  # set while the feed is open and current

    @property
    def following(self) -> bool:
        """Whether the feed is being followed: started, and not closed since."""
        return self._task is not None

    def start(self) -> None:
        """Follow the feed (and keep following it) in the background, unless already."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._follow())

    def stop_vouching(self) -> None:
        """The feed vouches for nothing from now on (the verifier is closing)."""
        if self.down_since is None:
            self.down_since = self._clock()
        self.connected.clear()

    async def close(self) -> None:
        """Stop following: the task ended, the connection closed."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def _follow(self) -> None:
        wait = self.settings.retry_seconds
        while True:
            try:
                ended = await self._follow_connection()
                wait = self.settings.retry_seconds
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # refused, unreachable, broken: down, and try again
                ended = f"unavailable ({exc})"
            self._taken_down()
            pause = wait * (0.5 + random.random() / 2)
            log.warning("revocation feed %s; reconnecting in %.1fs", ended, pause)
            await asyncio.sleep(pause)
            wait = min(wait * 2, 30.0)

    def _taken_down(self) -> None:
        if self.down_since is None:
            self.down_since = self.alive  # silent since then, however late that was noticed
            self._went_down()
        self.connected.clear()
        self._connection = None

    async def _follow_connection(self) -> str:
        """Follow one connection of the feed until it ends: what ended it, for the log."""
        query = f"?stream={self._stream}&after={self._seq}" if self._stream else ""
        url = self.settings.base_url.replace("http", "ws", 1) + "/oauth/revocations" + query
        request = HTTPRequest(url, headers={"Authorization": self._authorization},
                              connect_timeout=self.settings.timeout, request_timeout=self.settings.timeout)
        connecting = asyncio.ensure_future(self._connect(request))
        try:  # shielded: a handshake that completes after close() is still there to be closed
            self._connection = connection = await asyncio.shield(connecting)
        except asyncio.CancelledError:
            connecting.add_done_callback(_close_when_connected)
            raise
        connection.on_pong = self._pong  # type: ignore[method-assign,assignment]
        self.counts.connects += 1
        self._heard_at = time.monotonic()
        silent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pinging = asyncio.ensure_future(self._ping(connection, silent))
        ready = False  # the connection's ready came
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
                    (self._numbered_message if ready else self._first_message)(jsontext.loads(raw))
                except _ConnectionBroken as broken:
                    return str(broken)
                ready = True
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

    def _first_message(self, message: dict[str, Any]) -> None:
        """A connection's first message, which must be its ``ready``: anything before it means
        the stream cannot be trusted (what it missed is unknown), so every answer is dropped."""
        self._heard_at = time.monotonic()
        if message.get("type") != "ready":
            log.warning("revocation feed: a message before ready: every cached answer dropped")
            self._flush()
            raise _ConnectionBroken("sent a message before ready")
        self._ready(message)
        self._message_processed()

    def _numbered_message(self, message: dict[str, Any]) -> None:
        """A numbered message: the one after the last processed, or the connection is broken
        (a frame lost or repeated on the way) and resumed after the last processed."""
        self._heard_at = time.monotonic()
        kind, seq = message.get("type"), message.get("seq")
        if kind == "ready":
            raise _ConnectionBroken("sent a second ready")
        if type(seq) is not int or seq != self._seq + 1:
            raise _ConnectionBroken(f"out of sequence (message {str(seq)[:20]} after {self._seq})")
        self.counts.messages += 1
        if kind == "flush":
            log.warning("revocation feed: flush (revocations may have been missed): every cached answer dropped")
            self._flush()
        elif kind == "revoked":
            self._revocation(message)
        else:
            self._not_understood(f"a message of type {str(kind)[:40]!r}")
        self._seq = seq  # processed: a reconnection resumes after it
        self._message_processed()

    def _message_processed(self) -> None:
        if self.down_since is not None and self._seq >= self._catching_up_to:
            self.down_since = None  # every message it missed is in: current again
            self.connected.set()
        self._sign_of_life()

    def _ready(self, message: dict[str, Any]) -> None:
        stream, newest, resumed = message.get("stream"), message.get("seq"), message.get("resumed")
        if not isinstance(stream, str) or not stream or type(newest) is not int or newest < 0:
            self._not_understood("a ready without a stream and a number")
            raise _ConnectionBroken("sent a ready without a stream and a number")
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
            self.counts.revocations += 1
            self._revoked(each)

    def _not_understood(self, what: str) -> None:
        """A message this library does not know (a newer tokensvc?): whatever it revoked is
        dropped with everything else; a warning once for each kind."""
        if what not in self._warned:
            self._warned.add(what)
            log.warning("revocation feed: %s, not understood: every cached answer dropped "
                        "(is tokensvc.resource older than tokensvc?)", what)
        self._flush()

    def _flush(self) -> None:
        self.counts.flushes += 1
        self._flushed()

    def _sign_of_life(self) -> None:
        if self.down_since is None:  # a feed still catching up vouches for nothing yet
            self.alive = self._clock()
