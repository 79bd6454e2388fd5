"""``GET /oauth/revocations``: the revocation feed (:mod:`tokensvc.oauth.feed`) as a WebSocket.

A client that may introspect authenticates with HTTP Basic (a WebSocket has no body); every
refusal (400, 401, 403, 422, 426, 429, 503) is answered before the upgrade, in JSON. After a
``ready`` message the socket carries the feed's messages; what the reader sends is ignored.

The reader stands on its client (as a token's socket stands on what it was issued under):
when the client changes in any process (removed, its secret rotated, its right to read
withdrawn), the socket asks whether the credentials it proved still hold, and closes with
:data:`CLOSE_CREDENTIALS` when they do not. It also asks every :data:`RECHECK_SECONDS`: a
removal reaches other processes as the write that precedes the deletion, which a relay that
polls (no change streams) may never see.
"""

from __future__ import annotations

from typing import Any

import tornado.ioloop
import tornado.websocket

from tokensvc import schemas
from tokensvc.errors import Forbidden
from tokensvc.handlers.guards import from_own_origin
from tokensvc.handlers.headers import JSON_HEADERS
from tokensvc.handlers.lifecycle import JSON, dumps
from tokensvc.handlers.recheck import Recheck
from tokensvc.handlers.web import WebHandler
from tokensvc.handlers.ws import check_handshake
from tokensvc.oauth import introspection
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.errors import InvalidClient
from tokensvc.oauth.feed import CLOSE_CREDENTIALS, Message
from tokensvc.storage.base import CLIENT, Revocation

RECHECK_SECONDS = 30.0


class RevocationFeedSocket(WebHandler, tornado.websocket.WebSocketHandler):
    """One reader of the feed: the process's messages from ``ready`` on (and those it missed)."""

    default_headers = JSON_HEADERS
    output = JSON
    reads_session = False
    _stands_on: list[Revocation] = []
    _recheck: Recheck
    _every: tornado.ioloop.PeriodicCallback | None = None

    async def get(self, *args: Any, **kwargs: Any) -> None:
        authorization = self.request.headers.get("Authorization")
        if authorization is None or authorization[:6].lower() != "basic ":
            raise InvalidClient("The revocation feed needs the client's id and secret in HTTP Basic", basic=True)
        check_handshake(self.request)
        query = self.load(schemas.feed_query, self.query(schemas.feed_query), "query")
        self._stream = query.get("stream")
        self._after = int(query["after"]) if "after" in query else None
        self._caller = ClientRequest(authorization, None, None, self.request.remote_ip or "-", self.request.path)
        client = await introspection.authorize_client(self.ctx, self._caller)
        self.log_client_id = client.client_id
        self._stands_on = [Revocation(CLIENT, client.client_id)]
        # Resource servers send neither Sec-Fetch-Site nor Origin. A browser page elsewhere must
        # not ride on Basic credentials its browser remembers; refused in JSON here, before
        # Tornado's own check (which answers in plain text).
        if not from_own_origin(self.request, self.config):
            raise Forbidden("The revocation feed does not serve pages of other origins")
        await super().get(*args, **kwargs)

    def check_origin(self, origin: str) -> bool:
        """Decided before the upgrade, in :meth:`get`."""
        return True

    def open(self, *args: Any, **kwargs: Any) -> None:
        self._recheck = Recheck(self._check, "could not re-check a revocation feed reader's credentials")
        self.ctx.events.subscribe(self._stands_on, self._recheck.request)
        self._every = tornado.ioloop.PeriodicCallback(self._recheck.request, RECHECK_SECONDS * 1000, jitter=0.1)
        self._every.start()
        opening = self.ctx.feed.open(self._send, self._stream, self._after)
        for message in (opening.ready, *opening.missed):
            self._send(message)

    def on_message(self, message: str | bytes) -> None:
        """The reader has nothing to say; whatever it sends is ignored."""

    def on_close(self) -> None:
        self.ctx.feed.close(self._send)
        if self._every is not None:
            self.ctx.events.unsubscribe(self._stands_on, self._recheck.request)
            self._every.stop()

    async def _check(self) -> None:
        if not await introspection.still_a_reader(self.ctx, self._caller):
            self.close(CLOSE_CREDENTIALS, "the client's credentials no longer hold")

    def _send(self, message: Message) -> None:
        try:
            self.write_message(dumps(message))
        except tornado.websocket.WebSocketClosedError:
            self.ctx.feed.close(self._send)
