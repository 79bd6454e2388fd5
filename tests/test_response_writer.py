"""The response writer (handlers/response_writer.py) against Tornado's own ``write_headers``:
the same headers and body on the wire, keep-alive and ``Connection: close`` as Tornado keeps
them, whatever the request (HTTP/1.1 or 1.0, GET, HEAD, 204, an error, a cookie, CORS)."""

from __future__ import annotations

import asyncio
import re

import pytest
from helpers import SKY_REDIRECT, WEBAPP_SECRET, basic, make_config

from tokensvc.handlers import response_writer

pytestmark = pytest.mark.gen_test

CONFIG = make_config()
SKY_ORIGIN = "/".join(SKY_REDIRECT.split("/")[:3])  # a public client's origin: CORS answers it


async def exchange(port: int, *requests: bytes) -> list[tuple[str, dict[str, list[str]], bytes]]:
    """Send ``requests`` on one connection; each response's status line, headers and body
    (read by its Content-Length), then whether the server keeps the connection open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers = []
    try:
        for request in requests:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status, *lines = head.decode("latin1").split("\r\n")[:-2]
            headers: dict[str, list[str]] = {}
            for line in lines:
                name, value = line.split(": ", 1)
                headers.setdefault(name.lower(), []).append(value)
            length = 0 if " 204 " in status or request.startswith(b"HEAD") else int(headers["content-length"][0])
            answers.append((status, headers, await reader.readexactly(length)))
        answers.append(("open" if await still_served(reader, writer) else "closed", {}, b""))
    finally:
        writer.close()
    return answers


async def still_served(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether the server goes on serving the connection: another request, sent after the
    answers, is answered (kept alive) or meets the connection's end (closed). Nothing is
    waited for a fixed time: the server does one or the other."""
    try:
        writer.write(request("GET", "/healthz"))
        await writer.drain()
        return (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
    except (asyncio.IncompleteReadError, ConnectionError):  # the end, or a reset of the closed socket
        return False


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
    fast = await exchange(port, *requests)
    with monkeypatch.context() as patch:  # every response through Tornado's write_headers
        patch.setattr(response_writer, "HTTP1Connection", type(None))
        tornado_way = await exchange(port, *requests)
    return fast, tornado_way


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


@pytest.mark.parametrize("config", [CONFIG])
async def test_connection_close_and_http_1_0_end_as_tornado_ends_them(http_server, http_port, monkeypatch, config):
    closing = request("GET", "/oauth/clients/webapp", Connection="close")
    fast, tornado_way = await both_ways(http_port, monkeypatch, closing)
    assert comparable(fast) == comparable(tornado_way)
    assert fast[0][1]["connection"] == ["close"] and fast[-1][0] == "closed"
    old = request("GET", "/oauth/clients/webapp", "HTTP/1.0", Connection="keep-alive")
    fast, tornado_way = await both_ways(http_port, monkeypatch, old, old)
    assert comparable(fast) == comparable(tornado_way) and fast[0][1]["connection"] == ["Keep-Alive"]


def test_a_header_that_would_split_the_block_is_refused():
    with pytest.raises(ValueError, match="RFC 9110"):
        response_writer.header_lines([("X-Test", "a\r\nSet-Cookie: planted=1")])
    with pytest.raises(ValueError, match="RFC 9110"):
        response_writer.header_lines([("X-Test", "a\nb")])
    assert response_writer.header_lines([("A", "1"), ("B", "2")]) == b"A: 1\r\nB: 2\r\n"
    with pytest.raises(ValueError, match="RFC 9110"):
        response_writer.header_lines([("X-Test\r\nX-Other", "1")])


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

    for patched in (False, True):
        with monkeypatch.context() as patch:
            patch.setattr(HealthHandler, "get", slow)
            if patched:  # and the same through Tornado's write_headers
                patch.setattr(response_writer, "HTTP1Connection", type(None))
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


def test_header_sets_made_per_call_are_encoded_but_never_kept():
    constant = {"X-A": "1"}
    assert response_writer.constant_lines(constant) is response_writer.constant_lines(constant)
    for index in range(3 * response_writer.MAX_HEADER_SETS):
        assert response_writer.constant_lines({"X-B": str(index)}) == f"X-B: {index}\r\n".encode()
    assert len(response_writer._blocks) <= response_writer.MAX_HEADER_SETS
