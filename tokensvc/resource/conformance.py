"""A conformance run for a client of the revocation feed, in any language
(docs/reference/feed.md).

    python -m tokensvc.resource.conformance --api http://127.0.0.1:9000/notes [--port 8765]

The script plays tokensvc: it serves ``POST /oauth/token/introspect`` and the feed, ``GET
/oauth/revocations``, on ``--host``/``--port``, for the credentials ``--client-id`` and
``--client-secret``. Start the API under test with the script's address as tokensvc's base URL and
those credentials; the script waits for its feed to connect. Then it sends ``GET --api`` with
tokens of its own (``Authorization: Bearer``): a 2xx answer is taken for "allowed", a 401 for
"refused". Each scenario makes a token inactive at introspection and then says so on the feed (or
breaks the feed as a network or a restart would); the API passes when it refuses the token within
``--within`` seconds (1 by default: the feed's promise), which it can only do by dropping its
cached answer and asking again. One line per scenario; the exit code is 0 when every one passed.

The scenarios: the feed is opened with HTTP Basic and no resume point; an answer is cached (one
introspection for three checks); a revocation naming each of ``family_id``, ``grant_id``,
``client_id`` and ``sub`` drops what it names; ``flush`` drops everything; a close with 1012 is
resumed from the last message processed (``?stream=&after=``) and what was missed meanwhile is
replayed; a ``ready`` with ``resumed: false`` drops everything; a message out of sequence breaks
the connection, which resumes from the last message processed; a message of a type the client
does not know drops everything; pings are answered; a close with 4403 is followed by a new
connection with the client's credentials; a cached answer is not used past its token's ``exp``;
a feed down (its handshake refused) for longer than the client's offline bound (``--offline-bound``,
30 seconds as ``tokensvc.resource`` keeps it) leaves no cached answer in use; a feed that falls
silent without closing (no message, no pong) is taken for down within ``--silence`` seconds (the
feed's ``ping_seconds``, 10) and resumed, and what it missed is replayed; a resume from behind
what the stand-in still keeps is answered ``resumed: false`` on the same stream, and drops
everything.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

import tornado.httpserver
import tornado.netutil
import tornado.web
import tornado.websocket
from tornado.httpclient import AsyncHTTPClient

CONNECT_SECONDS = 30.0  # how long the API under test has to open the feed, at the start and after a close
# Beyond the silence it waited out, what a client that took a silent feed for down may take to be
# connected again: its first retry's wait (a second, jittered down) and a handshake.
RECONNECT_SLACK = 2.0


@dataclass
class Connection:
    """One connection of the client to the stand-in's feed."""

    socket: FeedSocket
    stream: str | None
    after: int | None
    authorization: str
    pongs: int = 0


@dataclass
class StandIn:
    """tokensvc as the client under test sees it: introspection and the feed, both scripted."""

    client_id: str
    client_secret: str
    stream: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    seq: int = 0
    sent: list[dict[str, Any]] = field(default_factory=list)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)  # the active tokens
    asked: dict[str, int] = field(default_factory=dict)
    connections: list[Connection] = field(default_factory=list)
    refused_credentials: int = 0
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    oldest: int = 1  # the first message still kept: a resume from before it is not resumed
    down: bool = False  # every handshake refused (503), as a tokensvc out of reach would be

    def authorized(self, header: str | None) -> bool:
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return (unquote(user), unquote(password)) == (self.client_id, self.client_secret)

    @property
    def current(self) -> Connection | None:
        last = self.connections[-1] if self.connections else None
        return last if last is not None and last.socket.ws_connection is not None else None

    def token(self, lifetime: int = 3600) -> tuple[str, dict[str, Any]]:
        """A new active token and its introspection answer, every identifier its own, its
        ``exp`` ``lifetime`` seconds from now (less than a second more or less)."""
        token, n = secrets.token_urlsafe(32), len(self.answers)
        answer = {"active": True, "scope": "read write", "client_id": f"conformance-client-{n}",
                  "sub": f"conformance-user-{n}", "token_type": "access_token", "exp": int(time.time()) + lifetime,
                  "iat": int(time.time()), "family_id": secrets.token_hex(16), "grant_id": f"grant-{n}"}
        self.answers[token] = answer
        return token, answer

    def number(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` as the next message of the stream, kept for a reader that resumes."""
        self.seq += 1
        message = {**body, "seq": self.seq}
        self.sent.append(message)
        return message

    def send(self, body: dict[str, Any]) -> None:
        """The next message, to the client's connection (none now: it hears it when it resumes)."""
        message = self.number(body)
        if self.current is not None:
            self.current.socket.write_message(json.dumps(message))

    def opening(self, stream: str | None, after: int | None) -> list[dict[str, Any]]:
        resumed = stream == self.stream and after is not None and self.oldest - 1 <= after <= self.seq
        ready = {"type": "ready", "stream": self.stream, "seq": self.seq, "resumed": resumed}
        return [ready, *(message for message in self.sent if resumed and message["seq"] > (after or 0))]

    async def next_connection(self, seconds: float = CONNECT_SECONDS) -> Connection:
        """The client's next connection (once it has its ``ready``)."""
        count = len(self.connections)
        deadline = time.monotonic() + seconds
        while len(self.connections) == count or self.connections[-1].socket.ws_connection is None:
            if time.monotonic() > deadline:
                raise Failure(f"the client did not connect again within {seconds:g} s")
            await asyncio.sleep(0.01)
        return self.connections[-1]


class Failure(Exception):
    """A scenario the client under test failed, and why."""


class Introspection(tornado.web.RequestHandler):
    def initialize(self, stand_in: StandIn) -> None:
        self.stand_in = stand_in

    def check_xsrf_cookie(self) -> None:
        """A client authenticates with Basic: nothing to forge."""

    def post(self) -> None:
        self.set_header("Cache-Control", "no-store")
        if not self.stand_in.authorized(self.request.headers.get("Authorization")):
            self.stand_in.refused_credentials += 1
            self.set_status(401)
            self.set_header("WWW-Authenticate", 'Basic realm="tokensvc"')
            self.write({"error": "invalid_client"})
            return
        form = parse_qs(self.request.body.decode("latin-1"))
        token = (form.get("token") or [""])[0]
        self.stand_in.asked[token] = self.stand_in.asked.get(token, 0) + 1
        self.write(self.stand_in.answers.get(token, {"active": False}))


class FeedSocket(tornado.websocket.WebSocketHandler):
    def initialize(self, stand_in: StandIn) -> None:
        self.stand_in = stand_in
        self.connection: Connection | None = None
        # A stalled connection (a proxy that passes nothing on): no pong goes out. The scenario
        # that stalls it sends no message either.
        self.silent = False

    def get_websocket_protocol(self) -> tornado.websocket.WebSocketProtocol | None:
        protocol = super().get_websocket_protocol()
        if protocol is not None:
            answer = protocol._send_pong  # type: ignore[attr-defined]

            def pong(data: bytes) -> None:
                if not self.silent:
                    answer(data)

            protocol._send_pong = pong  # type: ignore[attr-defined]
        return protocol

    async def get(self, *args: Any, **kwargs: Any) -> None:
        if self.stand_in.down:
            self.set_status(503)
            self.set_header("Retry-After", "1")
            self.finish({"detail": "conformance: the feed is down", "reason": "stopping"})
            return
        if not self.stand_in.authorized(self.request.headers.get("Authorization")):
            self.stand_in.refused_credentials += 1
            self.set_status(401)
            self.set_header("WWW-Authenticate", 'Basic realm="tokensvc"')
            self.finish({"error": "invalid_client"})
            return
        await super().get(*args, **kwargs)

    def open(self, *args: Any, **kwargs: Any) -> None:
        stream = self.get_query_argument("stream", None)
        after = self.get_query_argument("after", None)
        self.connection = Connection(self, stream, int(after) if after and after.isdigit() else None,
                                     self.request.headers.get("Authorization", ""))
        for message in self.stand_in.opening(stream, self.connection.after):
            self.write_message(json.dumps(message))
        self.stand_in.connections.append(self.connection)
        self.stand_in.connected.set()

    def on_pong(self, data: bytes) -> None:
        if self.connection is not None:
            self.connection.pongs += 1

    def on_message(self, message: str | bytes) -> None:
        """The client has nothing to say."""


def make_app(stand_in: StandIn) -> tornado.web.Application:
    return tornado.web.Application([(r"/oauth/token/introspect", Introspection, {"stand_in": stand_in}),
                                    (r"/oauth/revocations", FeedSocket, {"stand_in": stand_in})])


# -- the scenarios -------------------------------------------------------------------------------


class Run:
    """The scenarios against one API under test."""

    def __init__(self, stand_in: StandIn, api: str, within: float, offline_bound: float = 30.0,
                 silence: float = 10.0) -> None:
        self.stand_in, self.api, self.within = stand_in, api, within
        self.offline_bound, self.silence = offline_bound, silence
        self.http = AsyncHTTPClient()

    async def status(self, token: str) -> int:
        answer = await self.http.fetch(self.api, headers={"Authorization": f"Bearer {token}"}, raise_error=False,
                                       request_timeout=10)
        return answer.code

    async def allowed(self, token: str) -> None:
        status = await self.status(token)
        if not 200 <= status < 300:
            raise Failure(f"an active token was answered {status}, not 2xx")

    async def cached(self) -> tuple[str, dict[str, Any]]:
        token, answer = self.stand_in.token()
        await self.allowed(token)
        return token, answer

    async def refused(self, token: str, what: str, within: float | None = None) -> None:
        """The token is refused (401) within ``within`` seconds (the run's, by default): its
        cached answer was dropped."""
        within = self.within if within is None else within
        started = time.monotonic()
        while True:
            status = await self.status(token)
            if status == 401:
                return
            if status not in range(200, 300):
                raise Failure(f"after {what}, the token was answered {status}, neither 2xx nor 401")
            if time.monotonic() - started > within:
                raise Failure(f"after {what}, the token was still allowed {within:g} s later")
            await asyncio.sleep(0.01)

    def inactive(self, token: str) -> None:
        del self.stand_in.answers[token]

    def current(self) -> Connection:
        current = self.stand_in.current
        if current is None:
            raise Failure("the client's feed was not open")
        return current

    # Each scenario: (its name, what it does).

    async def feed_opened(self) -> None:
        first = self.stand_in.connections[0]
        if not self.stand_in.authorized(first.authorization):
            raise Failure("the feed was not opened with the client's id and secret in HTTP Basic")
        if first.stream is not None or first.after is not None:
            raise Failure("the first connection named a resume point it cannot have")

    async def answers_cached(self) -> None:
        token, _ = self.stand_in.token()
        for _ in range(3):
            await self.allowed(token)
        if self.stand_in.asked.get(token) != 1:
            raise Failure(f"three checks of a token asked introspection {self.stand_in.asked.get(token)} times, "
                          "not once")

    def revoked_by(self, member: str) -> Callable[[], Awaitable[None]]:
        async def scenario() -> None:
            token, answer = await self.cached()
            self.inactive(token)
            self.stand_in.send({"type": "revoked", member: answer[member]})
            await self.refused(token, f"a revocation naming its {member}")
        return scenario

    async def flush(self) -> None:
        tokens = [(await self.cached())[0] for _ in range(2)]
        for token in tokens:
            self.inactive(token)
        self.stand_in.send({"type": "flush"})
        for token in tokens:
            await self.refused(token, "a flush")

    async def close_and_resume(self, code: int = 1012) -> Connection:
        """Close the client's connection with ``code``; a revocation is made meanwhile; the next
        connection must resume after the last message sent before the close."""
        before = self.stand_in.current
        if before is None:
            raise Failure("the client's feed was not open")
        last = self.stand_in.seq
        before.socket.close(code, "conformance: connect again")
        connection = await self.stand_in.next_connection()
        if not self.stand_in.authorized(connection.authorization):
            raise Failure(f"after a close with {code}, the client reconnected without its credentials")
        if (connection.stream, connection.after) != (self.stand_in.stream, last):
            raise Failure(f"after a close with {code}, the client resumed with stream={connection.stream} "
                          f"after={connection.after}, not the stream's last message ({last})")
        return connection

    async def resumed(self) -> None:
        token, answer = await self.cached()
        current = self.stand_in.current
        if current is None:
            raise Failure("the client's feed was not open")
        last = self.stand_in.seq
        # The revocation is made while the client is away: it must be replayed after the ready.
        current.socket.close(1012, "conformance: connect again")
        self.inactive(token)
        self.stand_in.number({"type": "revoked", "family_id": answer["family_id"]})
        connection = await self.stand_in.next_connection()
        if (connection.stream, connection.after) != (self.stand_in.stream, last):
            raise Failure(f"after a close with 1012, the client resumed with stream={connection.stream} "
                          f"after={connection.after}, not after message {last}")
        await self.refused(token, "a revocation replayed when it resumed")

    async def not_resumed(self) -> None:
        token, _ = await self.cached()
        self.inactive(token)
        self.stand_in.stream = secrets.token_urlsafe(12)  # a restarted tokensvc: a new stream
        self.stand_in.seq, self.stand_in.sent = 0, []
        current = self.stand_in.current
        if current is None:
            raise Failure("the client's feed was not open")
        current.socket.close(1012, "conformance: connect again")
        await self.stand_in.next_connection()
        await self.refused(token, "a ready with resumed: false")

    async def out_of_sequence(self) -> None:
        token, answer = await self.cached()
        current = self.stand_in.current
        if current is None:
            raise Failure("the client's feed was not open")
        last = self.stand_in.seq
        self.inactive(token)
        self.stand_in.number({"type": "revoked", "family_id": answer["family_id"]})  # lost on the way
        current.socket.write_message(json.dumps(self.stand_in.number({"type": "revoked", "grant_id": "unrelated"})))
        connection = await self.stand_in.next_connection()
        if connection.after != last:
            raise Failure(f"after a message out of sequence (message {last + 2} after {last}), the client resumed "
                          f"after {connection.after}, not after the last message it processed ({last})")
        await self.refused(token, "the message it missed, replayed")

    async def unknown_type(self) -> None:
        token, _ = await self.cached()
        self.inactive(token)
        self.stand_in.send({"type": "conformance-unknown", "what": "a message of a later tokensvc"})
        await self.refused(token, "a message of a type it does not know")

    async def pings(self) -> None:
        current = self.stand_in.current
        if current is None:
            raise Failure("the client's feed was not open")
        pongs = current.pongs
        current.socket.ping(b"conformance")
        deadline = time.monotonic() + max(self.within, 5.0)
        while current.pongs == pongs:
            if time.monotonic() > deadline:
                raise Failure("the client answered no ping")
            await asyncio.sleep(0.01)

    async def credentials_closed(self) -> None:
        current = self.stand_in.current
        if current is None:
            raise Failure("the client's feed was not open")
        current.socket.close(4403, "conformance: the client's credentials no longer hold")
        connection = await self.stand_in.next_connection()
        if not self.stand_in.authorized(connection.authorization):
            raise Failure("after a close with 4403, the client reconnected without its credentials")

    async def expiry(self) -> None:
        """An answer is cached until its token's ``exp``, not past it: after it, the token is
        asked about again (and is inactive by then). Nothing is said on the feed."""
        token, answer = self.stand_in.token(lifetime=2)
        await self.allowed(token)
        self.inactive(token)
        await asyncio.sleep(max(0.0, answer["exp"] - time.time()))
        await self.refused(token, "its exp")

    async def offline(self) -> None:
        """The feed goes down and stays down (every handshake refused with 503): once the
        client's offline bound has passed, no cached answer is used without asking again.
        Nothing is said on the feed; the token is inactive at introspection."""
        token, _ = await self.cached()
        current = self.current()
        self.inactive(token)
        self.stand_in.down = True
        try:
            current.socket.close(1012, "conformance: the feed is down")
            await self.refused(token, f"the feed down longer than the offline bound ({self.offline_bound:g} s)",
                               self.offline_bound + self.within)
        finally:
            self.stand_in.down = False
        await self.stand_in.next_connection(CONNECT_SECONDS + RECONNECT_SLACK)

    async def silent(self) -> None:
        """The connection stalls without closing (no message, no pong), and meanwhile the token
        is revoked: the client takes the feed for down within the silence it allows, connects
        again, resumes after the last message it processed, and hears the revocation replayed."""
        token, answer = await self.cached()
        current = self.current()
        last = self.stand_in.seq
        current.socket.silent = True
        try:
            self.inactive(token)
            self.stand_in.number({"type": "revoked", "family_id": answer["family_id"]})  # never sent on it
            try:
                connection = await self.stand_in.next_connection(self.silence + RECONNECT_SLACK)
            except Failure:
                raise Failure(f"a feed silent for {self.silence:g} s (no message, no pong) was not taken for down: "
                              f"the client did not connect again within {self.silence + RECONNECT_SLACK:g} s") from None
        finally:
            current.socket.silent = False
        if (connection.stream, connection.after) != (self.stand_in.stream, last):
            raise Failure(f"after a silent feed, the client resumed with stream={connection.stream} "
                          f"after={connection.after}, not after message {last}")
        await self.refused(token, "a revocation replayed after a silent feed")

    async def behind_the_buffer(self) -> None:
        """The client is away while more is revoked than the stand-in keeps: its resume point is
        behind the oldest message kept, so the ``ready`` on the same stream says ``resumed:
        false``, and the client drops every answer (the revocation of its token is among what
        was forgotten)."""
        token, _ = await self.cached()
        current = self.current()
        last = self.stand_in.seq
        current.socket.close(1012, "conformance: connect again")
        self.inactive(token)
        self.stand_in.number({"type": "revoked", "grant_id": "conformance-forgotten"})
        self.stand_in.oldest = self.stand_in.seq + 1  # everything after ``last`` forgotten
        connection = await self.stand_in.next_connection()
        if (connection.stream, connection.after) != (self.stand_in.stream, last):
            raise Failure(f"after a close with 1012, the client resumed with stream={connection.stream} "
                          f"after={connection.after}, not after message {last}")
        await self.refused(token, "a ready with resumed: false for a resume point behind the buffer")

    def scenarios(self) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
        return [("the feed opened with HTTP Basic, no resume point", self.feed_opened),
                ("an answer cached: one introspection for three checks", self.answers_cached),
                *((f"revoked naming {member}", self.revoked_by(member))
                  for member in ("family_id", "grant_id", "client_id", "sub")),
                ("flush drops every answer", self.flush),
                ("closed with 1012: resumed after the last message, the missed one replayed", self.resumed),
                ("ready with resumed: false drops every answer", self.not_resumed),
                ("a message out of sequence: resumed after the last one processed", self.out_of_sequence),
                ("a message of an unknown type drops every answer", self.unknown_type),
                ("pings answered", self.pings),
                ("closed with 4403: connected again with its credentials", self.credentials_closed),
                ("a cached answer is not used past its token's exp", self.expiry),
                ("the feed down longer than the offline bound: no cached answer used", self.offline),
                ("a silent feed (no message, no pong) taken for down and resumed", self.silent),
                ("a resume behind the buffer: resumed false on the same stream drops every answer",
                 self.behind_the_buffer)]


@dataclass(slots=True)
class Outcome:
    name: str
    passed: bool
    reason: str = ""


async def conform(stand_in: StandIn, api: str, within: float = 1.0,
                  say: Callable[[Outcome], None] = lambda outcome: None, *, offline_bound: float = 30.0,
                  silence: float = 10.0) -> list[Outcome]:
    """Every scenario against the API at ``api``, whose client reads ``stand_in``'s feed; each
    outcome also handed to ``say`` as it comes. A scenario that fails is followed by the next.
    ``offline_bound``: how long the client uses a cached answer while the feed is down;
    ``silence``: how long it lets the feed be silent before it takes it for down."""
    try:
        await asyncio.wait_for(stand_in.connected.wait(), CONNECT_SECONDS)
    except TimeoutError:
        outcome = Outcome("the feed opened", False, f"no connection to the feed within {CONNECT_SECONDS:g} s")
        say(outcome)
        return [outcome]
    run, outcomes = Run(stand_in, api, within, offline_bound, silence), []
    for name, scenario in run.scenarios():
        try:
            await scenario()
            outcome = Outcome(name, True)
        except Failure as failure:
            outcome = Outcome(name, False, str(failure))
        if stand_in.current is None:  # a failed scenario may leave the client away: wait for it
            with contextlib.suppress(Failure):
                await stand_in.next_connection()
        outcomes.append(outcome)
        say(outcome)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokensvc.resource.conformance",
                                     description="Test a revocation feed client (an API protected by it) "
                                                 "against a scripted tokensvc.")
    parser.add_argument("--api", required=True, help="a URL of the API under test that any active token may GET")
    parser.add_argument("--host", default="127.0.0.1", help="where the stand-in listens (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8765, help="its port (default: %(default)s)")
    parser.add_argument("--client-id", default="conformance-api", help="the credentials the API under test "
                                                                        "must present (default: %(default)s)")
    parser.add_argument("--client-secret", default="conformance-secret-0123456789abcdef")
    parser.add_argument("--within", type=float, default=1.0,
                        help="seconds a revocation may take to be refused (default: %(default)s)")
    parser.add_argument("--offline-bound", type=float, default=30.0,
                        help="seconds the API under test uses a cached answer while the feed is down "
                             "(default: %(default)s, tokensvc.resource's offline_ttl)")
    parser.add_argument("--silence", type=float, default=10.0,
                        help="seconds of a silent feed after which the API under test takes it for down "
                             "(default: %(default)s, the feed's ping_seconds)")
    args = parser.parse_args(argv)

    def say(outcome: Outcome) -> None:
        print(("ok    " if outcome.passed else "FAIL  ") + outcome.name + (f": {outcome.reason}" if outcome.reason
                                                                           else ""), flush=True)

    async def run() -> list[Outcome]:
        stand_in = StandIn(args.client_id, args.client_secret)
        server = tornado.httpserver.HTTPServer(make_app(stand_in))
        server.add_sockets(tornado.netutil.bind_sockets(args.port, args.host))
        print(f"tokensvc stand-in at http://{args.host}:{args.port} (client {args.client_id}); start the API "
              f"under test with it, waiting {CONNECT_SECONDS:g} s for its feed", flush=True)
        try:
            return await conform(stand_in, args.api, args.within, say, offline_bound=args.offline_bound,
                                 silence=args.silence)
        finally:
            server.stop()

    outcomes = asyncio.run(run())
    failed = [outcome for outcome in outcomes if not outcome.passed]
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
