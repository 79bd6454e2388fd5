"""What one revocation feed reader may cost the process, and how the feed is watched: the caps
on readers per client and per process (refused before the upgrade, in JSON, with Retry-After),
the server's ping (a reader that answers none is closed), the bound on what a reader has not
taken (a reader that stops reading is closed, 1008, and the others get every message), the
metrics and logs of all of it, and a graceful stop that closes every reader with 1012."""

from __future__ import annotations

import asyncio
import base64
import signal
import socket
import struct
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from helpers import DEADLINE, PARTNER_SECRET, WEBAPP_SECRET, basic, eventually, make_config
from service import start_service
from test_feed import connect, next_message, notes_api, refusal
from test_operating import sample, scrape
from tornado import gen
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from tokensvc.oauth.events import RevocationEvents
from tokensvc.oauth.feed import (
    CLOSE_CREDENTIALS,
    CLOSE_RESTART,
    CLOSE_TOO_SLOW,
    ReaderCaps,
    RevocationFeed,
)
from tokensvc.storage.base import GRANT, Revocation

CAPPED = make_config(feed={"max_readers": 3, "max_readers_per_client": 2})
PINGED = make_config(feed={"ping_seconds": 1, "ping_timeout_seconds": 1})
BOUNDED = make_config(feed={"max_unsent_bytes": 64 * 1024})
PING, CLOSE = 0x9, 0x8


class RawReader:
    """A feed reader on a bare socket: the handshake, and then only what the test does (it
    answers no ping, and reads only when asked)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, base_url: str, client_id: str = "webapp", secret: str = WEBAPP_SECRET,
                      receive_buffer: int | None = None) -> RawReader:
        address = urlsplit(base_url)
        sock = socket.socket()
        if receive_buffer is not None:  # before connecting: the window it offers stays small
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (address.hostname, address.port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        writer.write((f"GET /oauth/revocations HTTP/1.1\r\nHost: {address.netloc}\r\nUpgrade: websocket\r\n"
                      "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                      f"Sec-WebSocket-Key: {base64.b64encode(b'0123456789abcdef').decode()}\r\n"
                      f"Authorization: {basic(client_id, secret)}\r\n\r\n").encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE)
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer)

    async def frame(self) -> tuple[int, bytes]:
        """The next frame the server sent: its opcode and payload (a server masks nothing)."""
        head = await asyncio.wait_for(self.reader.readexactly(2), DEADLINE)
        length = head[1] & 0x7F
        if length == 126:
            length = struct.unpack("!H", await self.reader.readexactly(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", await self.reader.readexactly(8))[0]
        return head[0] & 0x0F, await asyncio.wait_for(self.reader.readexactly(length), DEADLINE)

    async def closed(self) -> bool:
        """Whether the server has closed the connection (whatever it sent before)."""
        while await asyncio.wait_for(self.reader.read(65536), DEADLINE):
            pass
        return True

    def close(self) -> None:
        self.writer.close()


async def read_until_closed(connection):
    while await gen.with_timeout(timedelta(seconds=DEADLINE), connection.read_message()) is not None:
        pass
    return connection.close_code


# -- the caps -------------------------------------------------------------------------------------


def test_the_settings_default_caps_are_the_feeds_own():
    """The settings import nothing of the protocol: their defaults repeat the feed's, and this
    holds them together (a context made without settings caps its readers as a service does)."""
    from tokensvc.config import FeedSettings

    assert (FeedSettings().max_readers, FeedSettings().max_readers_per_client) == (ReaderCaps().per_process,
                                                                                   ReaderCaps().per_client)


def test_seats_count_per_client_and_in_all_and_none_is_given_while_stopping():
    feed = RevocationFeed(RevocationEvents(), caps=ReaderCaps(per_process=3, per_client=2))
    seats = feed.seats
    assert [seats.take("a"), seats.take("a"), seats.take("a")] == [None, None, "client_cap"]
    assert [seats.take("b"), seats.take("b")] == [None, "process_cap"]
    seats.give_back("a")
    assert (seats.taken, seats.of("a"), seats.take("b")) == (2, 1, None)
    assert seats.take("c") == "process_cap"
    ended = []
    feed.open(lambda message: None, end=lambda: ended.append(1))
    feed.open(lambda message: None)  # one without an end is only dropped
    assert feed.end_all() == 1 and ended == [1]
    seats.give_back("b")
    assert seats.take("c") == "stopping"


@pytest.mark.parametrize("config", [CAPPED])
@pytest.mark.gen_test(timeout=90)
async def test_readers_past_a_cap_are_refused_before_the_upgrade_in_json(http_client, base_url, ctx, caplog):
    secret = await notes_api(ctx)
    first, second = await connect(base_url), await connect(base_url)
    for reader in (first, second):
        assert (await next_message(reader))["type"] == "ready"
    # The client's own cap: 429, which no upgrade preceded, with the reason and Retry-After.
    code, body, headers = await refusal(base_url, {"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert (code, body["reason"], headers["Retry-After"]) == (429, "client_cap", "5")
    assert "readers" in body["detail"]
    third = await connect(base_url, client_id="notes-api", secret=secret)
    await next_message(third)
    # The process's: 503 (another process may have room), to a client under its own cap too.
    code, body, headers = await refusal(base_url, {"Authorization": basic("notes-api", secret)})
    assert (code, body["reason"], headers["Retry-After"]) == (503, "process_cap", "5")
    assert ctx.feed.readers == 3 and ctx.feed.seats.taken == 3
    # A reader that goes gives its seat back: its client connects again.
    first.close()
    await eventually(lambda: ctx.feed.seats.taken == 2, DEADLINE, what="the seat given back")
    again = await connect(base_url)
    assert (await next_message(again))["type"] == "ready"
    exposition = await scrape(http_client, base_url)
    assert sample(exposition, "tokensvc_feed_refusals_total", reason="client_cap") == 1
    assert sample(exposition, "tokensvc_feed_refusals_total", reason="process_cap") == 1
    assert sample(exposition, "tokensvc_feed_readers") == 3
    logged = [record.getMessage() for record in caplog.records if "refused" in record.getMessage()]
    assert any("webapp" in line and "client_cap" in line for line in logged)
    assert not any(WEBAPP_SECRET in line or secret in line for line in caplog.text.splitlines())
    for reader in (second, third, again):
        reader.close()


def test_the_caps_and_bounds_are_settings_with_defaults_and_are_checked():
    from tokensvc.config import ConfigError

    feed = make_config().feed
    assert (feed.max_readers, feed.max_readers_per_client, feed.ping_seconds, feed.ping_timeout_seconds,
            feed.max_unsent_bytes) == (1000, 100, 20, 10, 1024 * 1024)
    for bad, named in (({"max_readers": 0}, "feed.max_readers"),
                       ({"max_readers": 10, "max_readers_per_client": 11}, "feed.max_readers_per_client"),
                       ({"ping_seconds": 5, "ping_timeout_seconds": 6}, "feed.ping_timeout_seconds"),
                       ({"max_unsent_bytes": 100}, "feed.max_unsent_bytes")):
        with pytest.raises(ConfigError, match=named):
            make_config(feed=bad)


# -- the ping ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [PINGED])
@pytest.mark.gen_test(timeout=90)
async def test_a_reader_that_answers_no_ping_is_closed_and_one_that_answers_stays(http_server, http_client, base_url,
                                                                                   ctx, caplog):
    answering = await connect(base_url)  # Tornado's client answers every ping
    await next_message(answering)
    gone = await RawReader.connect(base_url)  # drops its connection itself: not the ping's doing
    assert (await gone.frame())[0] == 0x1
    gone.close()
    silent = await RawReader.connect(base_url)
    frames = [await silent.frame()]
    while frames[-1][0] != CLOSE:
        frames.append(await silent.frame())
    assert [opcode for opcode, _ in frames] == [0x1, PING, CLOSE]
    assert struct.unpack("!H", frames[-1][1][:2])[0] == 1000 and frames[-1][1][2:] == b"ping timed out"
    # It answers the close no more than the ping: the connection is dropped all the same, and
    # its seat given back.
    assert await silent.closed()
    await eventually(lambda: ctx.feed.readers == 1 and ctx.feed.seats.taken == 1, DEADLINE,
                     what="the silent reader dropped")
    silent.close()
    # Pinged as often, the reader that answers is open still: it gets what comes next.
    ctx.events.publish(Revocation(GRANT, "g1"))
    assert (await next_message(answering))["grant_id"] == "g1"
    answering.close()  # closed by the reader: no more a timeout than the one that went away
    await eventually(lambda: ctx.feed.readers == 0, DEADLINE, what="the answering reader closed")
    # Counted and logged once, for the silent reader alone, naming its client and nothing secret.
    exposition = await scrape(http_client, base_url)
    assert sample(exposition, "tokensvc_feed_closed_total", reason="ping_timeout") == 1
    assert [record.getMessage() for record in caplog.records if "(1000)" in record.getMessage()] == [
        "revocation feed: a reader of client webapp closed (1000): no pong within 1 s of a ping"]
    assert [record.levelname for record in caplog.records if "(1000)" in record.getMessage()] == ["WARNING"]
    assert WEBAPP_SECRET not in caplog.text


# -- the bound on what a reader has not taken ----------------------------------------------------


@pytest.mark.parametrize("config", [BOUNDED])
@pytest.mark.gen_test(timeout=120)
async def test_a_reader_that_stops_reading_is_closed_and_the_others_get_every_message(http_client, base_url, ctx,
                                                                                      caplog):
    keeping_up = await connect(base_url)
    await next_message(keeping_up)
    stopped = await RawReader.connect(base_url, receive_buffer=4096)  # reads nothing after the handshake
    await eventually(lambda: ctx.feed.readers == 2, DEADLINE, what="both readers open")
    # Large messages, so that the kernel's buffers (megabytes) are soon full and what the
    # reader has not taken piles up in the process.
    filler = "x" * 16_000
    for n in range(2_000):
        ctx.events.publish(Revocation(GRANT, f"g{n}-{filler}"))
        # The other reader gets each message as it is published, however the stopped one stands.
        assert (await next_message(keeping_up))["grant_id"] == f"g{n}-{filler}"
        if ctx.feed.readers == 1:
            break
    else:
        pytest.fail("the reader that stopped reading was never closed")
    ctx.events.publish(Revocation(GRANT, "after"))
    assert (await next_message(keeping_up))["grant_id"] == "after"
    exposition = await scrape(http_client, base_url)
    assert sample(exposition, "tokensvc_feed_closed_total", reason="too_slow") == 1
    assert [record.getMessage() for record in caplog.records if "(1008)" in record.getMessage()] == [
        "revocation feed: a reader of client webapp closed (1008): over 65536 bytes not yet taken"]
    # Its close frame (1008) waits behind what it never read; it is dropped all the same.
    await eventually(lambda: ctx.feed.seats.taken == 1, DEADLINE, what="the stopped reader's seat given back")
    stopped.close()
    keeping_up.close()


@pytest.mark.parametrize("config", [BOUNDED])
@pytest.mark.gen_test(timeout=90)
async def test_a_slow_reader_is_told_why_it_was_closed(http_server, base_url, ctx):
    """A reader that is behind but still reading gets the close (1008) after what it missed,
    and may resume from the last message it read."""
    stopped = await RawReader.connect(base_url, receive_buffer=4096)
    await eventually(lambda: ctx.feed.readers == 1, DEADLINE, what="the reader open")
    filler = "y" * 16_000
    n = 0
    while ctx.feed.readers:
        ctx.events.publish(Revocation(GRANT, f"g{n}-{filler}"))
        n += 1
        assert n < 2_000, "the reader that stopped reading was never closed"
    opcode, payload = await stopped.frame()
    while opcode != CLOSE:
        opcode, payload = await stopped.frame()
    assert struct.unpack("!H", payload[:2])[0] == CLOSE_TOO_SLOW
    stopped.close()


# -- the metrics -------------------------------------------------------------------------------------


@pytest.mark.gen_test(timeout=90)
async def test_the_feed_s_metrics_count_readers_messages_openings_and_refusals(http_client, base_url, ctx, caplog):
    from tokensvc.admin import actions as admin

    secret = await notes_api(ctx)
    first = await connect(base_url)
    ready = await next_message(first)
    ctx.events.publish(Revocation(GRANT, "g1"))
    seen = await next_message(first)
    resumed = await connect(base_url, f"?stream={ready['stream']}&after={seen['seq']}")
    assert (await next_message(resumed))["resumed"] is True
    reader = await connect(base_url, client_id="notes-api", secret=secret)
    await next_message(reader)
    ctx.events.publish(Revocation(GRANT, "g2"))  # to three readers
    for connection in (first, resumed, reader):
        assert (await next_message(connection))["grant_id"] == "g2"
    exposition = await scrape(http_client, base_url)
    assert sample(exposition, "tokensvc_feed_readers") == 3
    assert sample(exposition, "tokensvc_feed_messages_sent_total") == 1 + 3
    assert sample(exposition, "tokensvc_feed_openings_total", outcome="flush") == 2
    assert sample(exposition, "tokensvc_feed_openings_total", outcome="resumed") == 1
    # A client without the right: refused before the upgrade, or closed (4403) once it loses it.
    code, _, _ = await refusal(base_url, {"Authorization": basic("partner", PARTNER_SECRET)})
    assert code == 403
    await admin.rotate_secret(ctx, "notes-api")
    assert await read_until_closed(reader) == CLOSE_CREDENTIALS
    await eventually(lambda: ctx.feed.readers == 2, DEADLINE, what="the reader dropped")
    exposition = await scrape(http_client, base_url)
    assert sample(exposition, "tokensvc_feed_refusals_total", reason="credentials") == 1
    assert sample(exposition, "tokensvc_feed_refusals_total", reason="not_a_reader") == 1
    closed = [record.getMessage() for record in caplog.records if "(4403)" in record.getMessage()]
    assert len(closed) == 1 and "notes-api" in closed[0] and secret not in caplog.text
    assert sample(exposition, "tokensvc_feed_readers") == 2
    first.close()
    resumed.close()
    await eventually(lambda: ctx.feed.readers == 0, DEADLINE, what="the readers dropped")
    assert sample(await scrape(http_client, base_url), "tokensvc_feed_readers") == 0


# -- a graceful stop ---------------------------------------------------------------------------------


@pytest.mark.process
def test_a_graceful_stop_closes_every_reader_with_1012(tmp_path):
    """SIGTERM: the process stops accepting and tells each feed reader to go (1012, service
    restart) before it drains, so that its resource servers reconnect to another process."""
    service = start_service(tmp_path).wait_ready()
    try:
        async def read_through_the_stop() -> int | None:
            url = service.base.replace("http://", "ws://") + "/oauth/revocations"
            connection = await websocket_connect(HTTPRequest(url, headers={
                "Authorization": basic("webapp", "e2e-webapp-secret-0123456789abcdef")}))
            assert (await next_message(connection))["type"] == "ready"
            service.process.send_signal(signal.SIGTERM)
            return await read_until_closed(connection)

        assert asyncio.run(read_through_the_stop()) == CLOSE_RESTART
    finally:
        output = service.stop()
    assert "1 revocation feed readers told to reconnect elsewhere" in output
