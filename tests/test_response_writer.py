"""The response writer (handlers/edge/response_writer.py) against Tornado's own ``write_headers``:
the same headers and body on the wire, keep-alive and ``Connection: close`` as Tornado keeps
them, whatever the request (HTTP/1.1 or 1.0, GET, HEAD, 204, an error, a cookie, CORS); a large
answer to a slow reader arrives whole however the connection ends; every header line is one
RFC 9110 allows.

Nothing here waits for a fixed time: whether a connection is kept is asked with a pipelined
request (answered, or met by the connection's end), and a slow reader reads once the answer
has been handed over."""

from __future__ import annotations

import asyncio
import re
import socket

import pytest
from helpers import SKY_REDIRECT, WEBAPP_SECRET, basic, make_config

from tokensvc.handlers.edge import response_writer

pytestmark = pytest.mark.gen_test

CONFIG = make_config()
SKY_ORIGIN = "/".join(SKY_REDIRECT.split("/")[:3])  # a public client's origin: CORS answers it


async def read_answer(reader: asyncio.StreamReader, head_only: bool = False) -> tuple[str, dict[str, list[str]], bytes]:
    """One response's status line, headers and body (read by its Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status, *lines = head.decode("latin1").split("\r\n")[:-2]
    headers: dict[str, list[str]] = {}
    for line in lines:
        name, value = line.split(": ", 1)
        headers.setdefault(name.lower(), []).append(value)
    length = 0 if " 204 " in status or head_only else int(headers["content-length"][0])
    return status, headers, await reader.readexactly(length)


async def still_served(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether the server goes on serving the connection: a request sent after the answers is
    answered (kept alive) or meets the connection's end (closed); the server does one or the
    other, so nothing is waited for a fixed time."""
    try:
        writer.write(request("GET", "/healthz"))
        await writer.drain()
        return (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
    except (asyncio.IncompleteReadError, ConnectionError):  # the end, or a reset of the closed socket
        return False


async def exchange(port: int, *requests: bytes) -> list[tuple[str, dict[str, list[str]], bytes]]:
    """Send ``requests`` on one connection; each response, then whether the server keeps the
    connection open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answers = []
        for sent in requests:
            writer.write(sent)
            answers.append(await read_answer(reader, sent.startswith(b"HEAD")))
        answers.append(("open" if await still_served(reader, writer) else "closed", {}, b""))
        return answers
    finally:
        writer.close()


def request(method: str, path: str, version: str = "HTTP/1.1", body: str = "", **headers: str) -> bytes:
    lines = [f"{method} {path} {version}", "Host: localhost"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    if body:
        lines += ["Content-Type: application/x-www-form-urlencoded", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


CASES = [
    request("GET", "/oauth/clients/webapp"),
    request("HEAD", "/oauth/clients/webapp"),
    request("GET", "/nothing"),  # a 404 of the lifecycle's own
    request("DELETE", "/healthz"),  # a 405 with Allow
    request("POST", "/oauth/token/introspect", body="token=nope", Authorization=basic("webapp", WEBAPP_SECRET)),
    request("POST", "/oauth/token/introspect", body="token=nope"),  # 401 with WWW-Authenticate
    request("OPTIONS", "/oauth/token", Origin=SKY_ORIGIN, Access_Control_Request_Method="POST"),  # 204
    request("GET", "/.well-known/oauth-authorization-server"),  # a header over the route's (Cache-Control)
]


async def both_ways(port: int, monkeypatch, *requests: bytes):
    in_one_block = await exchange(port, *requests)
    with monkeypatch.context() as patch:  # every response through Tornado's write_headers
        patch.setattr(response_writer, "in_one_block", lambda connection, request: False)
        through_write_headers = await exchange(port, *requests)
    return in_one_block, through_write_headers


def comparable(answers):
    return [(status, {name: values for name, values in headers.items() if name not in ("date", "x-request-id")},
             body) for status, headers, body in answers]


@pytest.mark.parametrize("config", [CONFIG])
async def test_every_answer_has_the_headers_and_body_tornado_would_write(http_server, http_port, monkeypatch, config):
    for case in CASES:
        fast, tornado_way = await both_ways(http_port, monkeypatch, case, case)
        assert comparable(fast) == comparable(tornado_way), case
        assert fast[-1][0] == "open"  # kept alive, as Tornado keeps it
        for _, headers, _ in fast[:-1]:
            assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", headers["date"][0])
            assert len(headers["x-request-id"]) == 1 and len(headers["date"]) == 1


# (request version, its Connection header, the answer's Connection header, whether the
# connection stays open): Tornado's keep-alive rules (RFC 9112 §9.3).
CONNECTION_CASES = {
    "HTTP/1.1 keep-alive": ("HTTP/1.1", None, None, True),
    "HTTP/1.1 Connection: close": ("HTTP/1.1", "close", "close", False),
    "HTTP/1.0": ("HTTP/1.0", None, None, False),
    "HTTP/1.0 Connection: keep-alive": ("HTTP/1.0", "keep-alive", "Keep-Alive", True),
}


@pytest.mark.parametrize("case", CONNECTION_CASES)
@pytest.mark.parametrize("config", [CONFIG])
async def test_the_connection_ends_as_tornado_ends_it(http_server, http_port, monkeypatch, config, case):
    version, connection, answered, kept = CONNECTION_CASES[case]
    sent = request("GET", "/oauth/clients/webapp", version, **({"Connection": connection} if connection else {}))
    fast, tornado_way = await both_ways(http_port, monkeypatch, sent)
    assert comparable(fast) == comparable(tornado_way)
    assert fast[0][1].get("connection") == ([answered] if answered else None)
    assert fast[-1][0] == ("open" if kept else "closed")


LARGE = bytes(range(256)) * (8 * 1024 * 1024 // 256)  # 8 MiB, more than any socket buffer holds


@pytest.mark.parametrize("case", CONNECTION_CASES)
@pytest.mark.parametrize("config", [CONFIG])
async def test_a_large_answer_to_a_slow_reader_arrives_whole(http_server, http_port, monkeypatch, config, case):
    """The answer is handed over (and the request ended) long before a reader that reads only
    then has it: the connection's end, where it ends, waits for the write."""
    from tokensvc.handlers.meta import HealthHandler

    version, connection, _, kept = CONNECTION_CASES[case]
    handed_over = asyncio.Event()

    async def large(self):
        self.send(200, LARGE, "application/octet-stream")
        handed_over.set()

    monkeypatch.setattr(HealthHandler, "get", large)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)  # a reader that takes little at a time
    sock.connect(("127.0.0.1", http_port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=64 * 1024)
    try:
        writer.write(request("GET", "/healthz", version, **({"Connection": connection} if connection else {})))
        await asyncio.wait_for(handed_over.wait(), 30)
        status, headers, body = await read_answer(reader)
        assert status.startswith("HTTP/1.1 200 ") and len(body) == len(LARGE) and body == LARGE
        monkeypatch.undo()
        assert await still_served(reader, writer) is kept
    finally:
        writer.close()


@pytest.mark.parametrize("config", [CONFIG])
async def test_a_client_gone_before_the_answer_is_no_error_and_the_server_serves_on(
        http_server, http_port, http_client, base_url, monkeypatch, caplog, config):
    from tokensvc.handlers.meta import HealthHandler

    answered, hung_up = asyncio.Event(), asyncio.Event()
    real = HealthHandler.get

    async def slow(self):
        await hung_up.wait()  # the client hangs up meanwhile
        await real(self)
        answered.set()

    for one_block in (True, False):  # and the same through Tornado's write_headers
        with monkeypatch.context() as patch:
            patch.setattr(HealthHandler, "get", slow)
            if not one_block:
                patch.setattr(response_writer, "in_one_block", lambda connection, request: False)
            answered.clear()
            hung_up.clear()
            reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
            writer.write(request("GET", "/healthz"))
            await writer.drain()
            writer.close()
            await writer.wait_closed()
            hung_up.set()
            await asyncio.wait_for(answered.wait(), 30)
        # Served after the hang-up: whatever the answer to the gone client left the server to
        # do (the write's end, an error) ran before this request was.
        assert (await http_client.fetch(base_url + "/healthz")).code == 200
    assert not [record for record in caplog.records if record.levelname in ("ERROR", "CRITICAL")]


@pytest.mark.parametrize("name,value", [
    ("X-Test", "a\r\nSet-Cookie: planted=1"),  # a line split in two
    ("X-Test", "a\nb"), ("X-Test", "a\rb"), ("X-Test\r\nX-Other", "1"),
    ("X-Test", "a\x00b"), ("X-Test", "\x7f"),  # NUL, DEL
    ("Bad Name", "1"), ("X:Colon", "1"), ("", "1"), ("X-Test(", "1"),  # not a token (RFC 9110 §5.6.2)
    ("X-Test", " leading"), ("X-Test", "trailing\t"),  # a value has no surrounding whitespace
    ("X-Test", "snowman \u2603"),  # not Latin-1: not a byte on the wire
])
def test_a_header_rfc_9110_does_not_allow_is_refused(name, value):
    with pytest.raises(ValueError, match="RFC 9110|Latin-1"):
        response_writer.header_lines([("X-Fine", "1"), (name, value)])


def test_a_header_rfc_9110_allows_is_written_as_given():
    headers = [("A", "1"), ("WWW-Authenticate", 'Bearer error="invalid_token", error_description="a: b"'),
               ("X-Empty", ""), ("X-Inner", "a \t b"), ("X-Obs-Text", "caf\xe9"), ("X~!#$%&'*+.^_`|", "ok")]
    assert response_writer.header_lines(headers) == b"".join(
        f"{name}: {value}\r\n".encode("latin1") for name, value in headers)


def test_a_constant_header_set_is_checked_and_encoded_once(monkeypatch):
    constant = {"X-A": "1"}
    made = []
    real = response_writer.header_lines
    monkeypatch.setattr(response_writer, "header_lines", lambda items: made.append(1) or real(items))
    assert response_writer.constant_lines(constant) is response_writer.constant_lines(constant)
    assert len(made) == 1
    with pytest.raises(ValueError, match="RFC 9110"):
        response_writer.constant_lines({"Bad Name": "1"})


def test_header_sets_made_per_call_are_encoded_but_never_kept():
    for index in range(3 * response_writer.MAX_HEADER_SETS):
        assert response_writer.constant_lines({"X-B": str(index)}) == f"X-B: {index}\r\n".encode()
    assert len(response_writer._blocks) <= response_writer.MAX_HEADER_SETS
