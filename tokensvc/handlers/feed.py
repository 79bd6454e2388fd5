"""``GET /oauth/revocations``: the revocation feed (:mod:`tokensvc.oauth.feed`) as a WebSocket.

A client that may introspect authenticates with HTTP Basic (a WebSocket has no body); every
refusal (400, 401, 403, 422, 426, 429, 503) is answered before the upgrade, in JSON. After a
``ready`` message the socket carries the feed's messages; what the reader sends is ignored.
"""

from __future__ import annotations

from typing import Any

import tornado.websocket

from tokensvc import schemas
from tokensvc.errors import Forbidden
from tokensvc.handlers.headers import JSON_HEADERS
from tokensvc.handlers.lifecycle import JSON, dumps
from tokensvc.handlers.web import WebHandler
from tokensvc.handlers.ws import check_handshake
from tokensvc.oauth import introspection
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.errors import InvalidClient
from tokensvc.oauth.feed import Message


class RevocationFeedSocket(WebHandler, tornado.websocket.WebSocketHandler):
    """One reader of the feed: the process's messages from ``ready`` on (and those it missed)."""

    default_headers = JSON_HEADERS
    output = JSON
    reads_session = False

    async def get(self, *args: Any, **kwargs: Any) -> None:
        authorization = self.request.headers.get("Authorization")
        if authorization is None or authorization[:6].lower() != "basic ":
            raise InvalidClient("The revocation feed needs the client's id and secret in HTTP Basic", basic=True)
        check_handshake(self.request)
        query = self.load(schemas.feed_query, self.query(schemas.feed_query), "query")
        self._stream = query.get("stream")
        self._after = int(query["after"]) if "after" in query else None
        caller = ClientRequest(authorization, None, None, self.request.remote_ip or "-", self.request.path)
        client = await introspection.authorize_client(self.ctx, caller)
        self.log_client_id = client.client_id
        await super().get(*args, **kwargs)

    def check_origin(self, origin: str) -> bool:
        # Resource servers send no Origin. A browser page elsewhere must not ride on Basic
        # credentials its browser remembers; refused as an answer the lifecycle renders.
        if super().check_origin(origin):
            return True
        raise Forbidden("The revocation feed does not serve pages of other origins")

    def open(self, *args: Any, **kwargs: Any) -> None:
        opening = self.ctx.feed.open(self._send, self._stream, self._after)
        for message in (opening.ready, *opening.missed):
            self._send(message)

    def on_message(self, message: str | bytes) -> None:
        """The reader has nothing to say; whatever it sends is ignored."""

    def on_close(self) -> None:
        self.ctx.feed.close(self._send)

    def _send(self, message: Message) -> None:
        try:
            self.write_message(dumps(message))
        except tornado.websocket.WebSocketClosedError:
            self.ctx.feed.close(self._send)
