"""``GET /oauth/revocations``: the revocation feed (:mod:`tokensvc.oauth.feed`) as a WebSocket.

A client that may introspect authenticates with HTTP Basic (a WebSocket has no body); every
refusal (400, 401, 403, 422, 426, 429, 503) is answered before the upgrade, in JSON. After a
``ready`` message the socket carries the feed's messages; what the reader sends is ignored.

The reader stands on its client's credentials (as a token's socket stands on what it was issued
under): when what it proved changes in any process (the client removed, its secret rotated, its
right to read withdrawn: :data:`~tokensvc.storage.base.CREDENTIALS`), the socket asks whether
the credentials it proved still hold, and closes with :data:`CLOSE_CREDENTIALS` when they do
not; a change between its handshake's authentication and its subscription is asked about
before ``ready`` (:meth:`.Recheck.stand_on`), so no reader is told ``ready`` on credentials that
no longer hold. It also asks every :data:`RECHECK_SECONDS`: a removal reaches other processes
as the write that precedes the deletion, which a relay that polls (no change streams) may never
see, and a process of 0.9.0 marks none of its changes. A reader that proved its client with the
previous secret a rotation kept (at its handshake, or since: a rotation that kept the reader's
secret as the previous one) is closed with :data:`CLOSE_CREDENTIALS` when that secret's time is
up, at its expiry, not at the next check.

What one reader may cost the process is bounded (the ``[feed]`` settings): a seat among the
process's readers and its client's, taken before the upgrade (past either cap: 429 or 503,
``Retry-After``); a ping every ``ping_seconds``, and a reader that has not answered within
``ping_timeout_seconds`` is closed (:data:`CLOSE_PING_TIMEOUT`, counted and logged); and the
messages it has not yet taken off its socket, past ``max_unsent_bytes``, close it
(:data:`CLOSE_TOO_SLOW`). A message is queued on each socket and never awaited, so a slow reader
delays no other. The handler runs the ping's deadline itself: Tornado's own ping timeout closes
the connection with no public sign that it did (its ``close_code`` and ``close_reason`` are the
peer's, None here as for a reader that dropped its connection), so ``on_close`` could not count it.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import Future
from collections import deque
from datetime import datetime
from typing import Any

import tornado.ioloop
import tornado.websocket

from tokensvc import schemas
from tokensvc.errors import FeedFull, Forbidden, HTTPAnswer
from tokensvc.handlers.edge.exit import dumps
from tokensvc.handlers.edge.guards import from_own_origin
from tokensvc.handlers.edge.headers import JSON_HEADERS
from tokensvc.handlers.edge.inputs import JSON
from tokensvc.handlers.edge.recheck import Recheck
from tokensvc.handlers.edge.web_handler import WebHandler
from tokensvc.handlers.ws import check_handshake
from tokensvc.oauth import feed, introspection
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.errors import InvalidClient
from tokensvc.oauth.feed import (
    CLIENT_CAP,
    CLOSE_CREDENTIALS,
    CLOSE_PING_TIMEOUT,
    CLOSE_RESTART,
    CLOSE_TOO_SLOW,
    PROCESS_CAP,
    STOPPING,
    Message,
)
from tokensvc.storage.base import CREDENTIALS, Revocation

log = logging.getLogger(__name__)

RECHECK_SECONDS = 30.0
RETRY_AFTER_SECONDS = 5  # what a reader refused a seat is asked to wait
# A refused seat's answer: the client's own cap is 429; the process's is 503, as is a process
# that stops (another process may have room).
REFUSED = {CLIENT_CAP: (429, "This client has as many revocation feed readers open here as it may"),
           PROCESS_CAP: (503, "This process serves as many revocation feed readers as it may; connect again"),
           STOPPING: (503, "This process is stopping; connect again")}


class RevocationFeedSocket(WebHandler, tornado.websocket.WebSocketHandler):
    """One reader of the feed: the process's messages from ``ready`` on (and those it missed)."""

    default_headers = JSON_HEADERS
    output = JSON
    reads_session = False
    _stands_on: list[Revocation] = []
    _every: tornado.ioloop.PeriodicCallback | None = None
    _pinging: asyncio.Task[None] | None = None
    _ponged = False
    _unsent_bytes = 0  # of live messages queued on the socket and not yet written to it
    _until: datetime | None = None  # when the previous secret the reader proved expires
    _expiry: object | None = None  # the loop's timeout that closes the reader then

    def initialize(self) -> None:
        super().initialize()
        self._recheck = Recheck(self._check, "could not re-check a revocation feed reader's credentials",
                                self.ctx.store.reachable)

    async def get(self, *args: Any, **kwargs: Any) -> None:
        authorization = self.request.headers.get("Authorization")
        if authorization is None or authorization[:6].lower() != "basic ":
            raise InvalidClient("The revocation feed needs the client's id and secret in HTTP Basic", basic=True)
        check_handshake(self.request)
        query = self.load(schemas.feed_query, self.query(schemas.feed_query), "query")
        self._stream = query.get("stream")
        self._after = int(query["after"]) if "after" in query else None
        self._caller = ClientRequest(authorization, None, None, self.request.remote_ip or "-", self.request.path)
        self._mark = self.ctx.events.mark()  # before the credentials are read (Recheck.stand_on)
        try:
            reader = await introspection.authorize_reader(self.ctx, self._caller)
        except HTTPAnswer as answer:
            if answer.status_code == 403:  # a client that proved its secret, without the right
                self.edge.metrics.feed_refusals.labels("not_a_reader").inc()
            raise
        self.log_client_id = client_id = reader.client.client_id
        self._until = reader.until
        self._serves = feed.serves(reader.client)
        self._owner = feed.owner(reader.client)
        self._stands_on = [Revocation(CREDENTIALS, client_id)]
        # Resource servers send neither Sec-Fetch-Site nor Origin. A browser page elsewhere must
        # not ride on Basic credentials its browser remembers; refused in JSON here, before
        # Tornado's own check (which answers in plain text).
        if not from_own_origin(self.request, self.config):
            raise Forbidden("The revocation feed does not serve pages of other origins")
        seats = self.ctx.feed.seats
        refusal = seats.take(client_id)
        if refusal is not None:
            self.edge.metrics.feed_refusals.labels(refusal).inc()
            log.warning("revocation feed: a reader of client %s refused (%s: %d of its own, %d in all open)",
                        client_id, refusal, seats.of(client_id), seats.taken)
            status, detail = REFUSED[refusal]
            raise FeedFull(refusal, detail, RETRY_AFTER_SECONDS, status)
        try:  # returns once the connection has ended (Tornado reads its frames until then)
            await super().get(*args, **kwargs)
        finally:
            seats.give_back(client_id)

    def check_origin(self, origin: str) -> bool:
        """Decided before the upgrade, in :meth:`get`."""
        return True

    @property
    def ping_interval(self) -> float:
        """None of Tornado's pings: :meth:`_keep_pinging` sends them."""
        return 0.0

    async def open(self, *args: Any, **kwargs: Any) -> None:
        self._ends_at(self._until)  # first: a check while it subscribes may give it another end
        await self._recheck.stand_on(self.ctx.events, self._stands_on, self._mark)
        if self.ws_connection is None:  # closed meanwhile: its credentials no longer hold, or it left
            self._ends_at(None)
            return
        self._unsent: deque[tuple[Future[None], int]] = deque()
        self._bound = self.config.feed.max_unsent_bytes
        self.edge.metrics.feed_readers.inc()
        self._every = tornado.ioloop.PeriodicCallback(self._recheck.request, RECHECK_SECONDS * 1000, jitter=0.1)
        self._every.start()
        self._pinging = asyncio.create_task(self._keep_pinging())
        opening = self.ctx.feed.open(self._send, self._stream, self._after, end=self._restart, serves=self._serves,
                                     owner=self._owner)
        # The opening (at most the feed's replay buffer) is not counted against the bound.
        for message in (opening.ready, *opening.missed):
            written = self._write(dumps(message).encode("utf-8"))
            if written is not None:
                self._unsent.append((written, 0))

    def on_message(self, message: str | bytes) -> None:
        """The reader has nothing to say; whatever it sends is ignored."""

    def on_pong(self, data: bytes) -> None:
        self._ponged = True

    def on_close(self) -> None:
        self._ends_at(None)
        self.ctx.feed.close(self._send)
        self.ctx.events.unsubscribe(self._stands_on, self._recheck.request)
        self._recheck.stop()
        if self._pinging is not None:
            self._pinging.cancel()
        if self._every is not None:
            for written, _ in self._unsent:  # ended with the socket: their errors are no news
                written.add_done_callback(_retrieved)
            self.edge.metrics.feed_readers.dec()
            self._every.stop()

    async def _keep_pinging(self) -> None:
        """A ping every ``ping_seconds``; a reader that has answered none within
        ``ping_timeout_seconds`` of it is closed."""
        interval, timeout = self.config.feed.ping_seconds, self.config.feed.ping_timeout_seconds
        await asyncio.sleep(interval)
        while True:
            self._ponged = False
            try:
                self.ping()
            except tornado.websocket.WebSocketClosedError:  # closed meanwhile: on_close ends this
                return
            await asyncio.sleep(timeout)
            if not self._ponged:
                self.edge.metrics.feed_closed.labels("ping_timeout").inc()
                log.warning("revocation feed: a reader of client %s closed (%d): no pong within %d s of a ping",
                            self.log_client_id, CLOSE_PING_TIMEOUT, timeout)
                self._end(CLOSE_PING_TIMEOUT, "ping timed out")
                return
            await asyncio.sleep(interval - timeout)

    async def _check(self) -> None:
        reader = await introspection.still_a_reader(self.ctx, self._caller)
        if reader is None:
            self.edge.metrics.feed_refusals.labels("credentials").inc()
            log.warning("revocation feed: a reader of client %s closed (%d): its credentials no longer hold",
                        self.log_client_id, CLOSE_CREDENTIALS)
            self._end(CLOSE_CREDENTIALS, "the client's credentials no longer hold")
        elif self.ws_connection is not None and feed.serves(reader.client) != self._serves:
            # Its resources changed: it reconnects, to read the revocations of what it serves now.
            self.edge.metrics.feed_closed.labels("restart").inc()
            log.info("revocation feed: a reader of client %s closed (%d): the resources it serves changed",
                     self.log_client_id, CLOSE_RESTART)
            self._end(CLOSE_RESTART, "the resources this client serves changed: connect again")
        elif self.ws_connection is not None:
            self._ends_at(reader.until)

    def _ends_at(self, until: datetime | None) -> None:
        """Close the reader at ``until`` (the previous secret it proved expires then), or at no
        set time (None)."""
        loop = tornado.ioloop.IOLoop.current()
        if self._expiry is not None:
            loop.remove_timeout(self._expiry)
            self._expiry = None
        if until is not None:
            remaining = (until - self.ctx.clock()).total_seconds()
            self._expiry = loop.call_later(max(0.0, remaining), self._expired)

    def _expired(self) -> None:
        self._expiry = None
        if self.ws_connection is None:
            return
        self.edge.metrics.feed_refusals.labels("credentials").inc()
        log.warning("revocation feed: a reader of client %s closed (%d): the previous secret it proved expired",
                    self.log_client_id, CLOSE_CREDENTIALS)
        self._end(CLOSE_CREDENTIALS, "the client's previous secret expired")

    def _send(self, message: Message) -> None:
        """A live message: queued on the socket, never awaited; past the bound of what the
        reader has not taken, it is closed."""
        data = _encoded(message)
        written = self._write(data)
        if written is None:
            return
        # What the socket has not written yet: its writes complete in order, so the oldest
        # come off the front as they are done (no callback per write on the fan-out's path).
        unsent = self._unsent
        unsent.append((written, len(data)))
        self._unsent_bytes += len(data)
        while unsent and unsent[0][0].done():
            done, size = unsent.popleft()
            self._unsent_bytes -= size
            _retrieved(done)
        if self._unsent_bytes > self._bound:
            self.edge.metrics.feed_closed.labels("too_slow").inc()
            log.warning("revocation feed: a reader of client %s closed (%d): over %d bytes not yet taken",
                        self.log_client_id, CLOSE_TOO_SLOW, self.config.feed.max_unsent_bytes)
            self._end(CLOSE_TOO_SLOW, "too slow: messages not taken")

    def _write(self, data: bytes) -> Future[None] | None:
        try:
            return self.write_message(data)
        except tornado.websocket.WebSocketClosedError:
            self.ctx.feed.close(self._send)
            return None

    def _restart(self) -> None:
        self.edge.metrics.feed_closed.labels("restart").inc()
        self._end(CLOSE_RESTART, "the service is restarting: connect again")

    def _end(self, code: int, reason: str) -> None:
        """No message after this one; the socket closed with ``code``."""
        self.ctx.feed.close(self._send)
        self.close(code, reason)


def _retrieved(written: Future[None]) -> None:
    """A write's outcome taken (a socket closed meanwhile is no news: the reader is closed)."""
    if not written.cancelled():
        written.exception()


_last: tuple[Message | None, bytes] = (None, b"")


def _encoded(message: Message) -> bytes:
    """``message`` as the socket sends it, encoded once for all the readers of one fan-out:
    the feed hands every reader the same message in one pass (kept until the next)."""
    global _last
    if _last[0] is not message:
        _last = (message, dumps(message).encode("utf-8"))
    return _last[1]
