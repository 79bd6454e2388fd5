"""The one exit (handlers/edge/exit.py): whatever answers a request (a JSON route, the lifecycle
itself, a page, a static file, the WebSocket's handshake or its refusal), the response carries
what every response carries, from one place, and is counted once: its request id, ``Date``, the
security headers of its format, no ``Server``; a HEAD gets its GET's headers and no body; one
access line and one count in the request metrics each."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from helpers import WEBAPP_REDIRECT, exchange, json_of

from tokensvc.handlers.edge import exit as exit_module
from tokensvc.telemetry import logs

HANDSHAKE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
             "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
STYLE = "/static/style.css"

# What answers it, and how: (method, path, headers, body, status).
KINDS = {
    "a JSON route's answer": ("GET", "/oauth/clients/webapp", {}, "", 200),
    "a JSON route's failure": ("GET", "/oauth/clients/nobody", {}, "", 404),
    "a JSON route's CORS preflight": ("OPTIONS", "/oauth/token", {"Origin": "http://127.0.0.1:9000",
                                                                  "Access-Control-Request-Method": "POST"}, "", 204),
    "the lifecycle's 404": ("GET", "/nothing/here", {}, "", 404),
    "the lifecycle's 405": ("DELETE", "/healthz", {}, "", 405),
    "the lifecycle's 413": ("POST", "/oauth/token", {"Content-Type": "application/x-www-form-urlencoded"},
                            "x=" + "y" * 70_000, 413),
    "the lifecycle's unknown host": ("GET", "/oauth/clients/webapp", {"Host": "rebound.example"}, "", 400),
    "a page": ("GET", "/login", {}, "", 200),
    "a page's redirect": ("GET", "/account", {}, "", 303),
    "a page's error": ("GET", "/oauth/authorize?client_id=nobody", {}, "", 400),
    "a page's XSRF refusal": ("POST", "/logout", {"Content-Type": "application/x-www-form-urlencoded"}, "a=1", 403),
    "a static file": ("GET", STYLE, {}, "", 200),
    "a static file not there": ("GET", "/static/nothing.css", {}, "", 404),
    "a WebSocket handshake refused": ("GET", "/v1/ws", {}, "", 400),
    "a WebSocket of another version": ("GET", "/v1/ws", {**HANDSHAKE, "Sec-WebSocket-Version": "8"}, "", 426),
    "a WebSocket without a token": ("GET", "/v1/ws", HANDSHAKE, "", 401),
}


async def answer(port: int, method: str, path: str, headers: dict[str, str], body: str = ""):
    """The status, headers (names in lower case, every value) and body of one request's answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        fields = {"Host": "127.0.0.1", **headers, **({"Content-Length": str(len(body))} if body else {})}
        writer.write((f"{method} {path} HTTP/1.1\r\n" + "".join(f"{name}: {value}\r\n" for name, value in
                                                                fields.items()) + "\r\n" + body).encode())
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin1").split("\r\n")[:-2]
        received: dict[str, list[str]] = {}
        for line in head[1:]:
            name, value = line.split(": ", 1)
            received.setdefault(name.lower(), []).append(value)
        status = int(head[0].split(" ")[1])
        length = 0 if method == "HEAD" or status in (101, 204, 304) else int(received["content-length"][0])
        return status, received, await reader.readexactly(length)
    finally:
        writer.close()


def carries_what_every_response_carries(status: int, headers: dict[str, list[str]], request_id: str) -> None:
    assert headers["x-request-id"] == [request_id], headers
    assert len(headers["date"]) == 1
    assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", headers["date"][0])
    assert "server" not in headers
    assert headers["x-content-type-options"] == ["nosniff"] and headers["x-frame-options"] == ["DENY"]
    assert len(headers["content-security-policy"]) == 1
    assert "frame-ancestors 'none'" in headers["content-security-policy"][0]
    assert len(headers["referrer-policy"]) == 1
    if status not in (101, 204, 304):
        assert len(headers["content-length"]) == 1 and len(headers["content-type"]) == 1


class AccessLines(logging.Handler):
    """The access lines, each with the id of the request it was written for."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str | None, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((logs.REQUEST_ID.get(), record.getMessage()))

    def of(self, request_id: str) -> list[str]:
        return [line for named, line in self.lines if named == request_id]


@pytest.fixture
def access():
    lines = AccessLines()
    level = logs.access_log.level
    logs.access_log.addHandler(lines)
    logs.access_log.setLevel(logging.INFO)
    yield lines
    logs.access_log.removeHandler(lines)
    logs.access_log.setLevel(level)


def requests_counted(ctx) -> float:
    """The request metrics' count of every request so far."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in ctx.metrics.render().decode().splitlines()
               if line.startswith("tokensvc_http_requests_total{"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.gen_test
async def test_every_response_leaves_through_one_exit(http_server, http_port, access, ctx, kind):
    method, path, headers, body, expected = KINDS[kind]
    counted = requests_counted(ctx)
    request_id = "exit-" + re.sub(r"[^a-z0-9]+", "-", kind)
    status, received, _ = await answer(http_port, method, path, {**headers, "X-Request-ID": request_id}, body)
    assert status == expected
    carries_what_every_response_carries(status, received, request_id)
    assert ("etag" in received) == (path == STYLE)  # a static file's validator; nothing else has one
    [line] = access.of(request_id)
    assert f" {status} {method} " in line
    assert requests_counted(ctx) == counted + 1
    if method != "GET":
        return
    # HEAD: the headers its GET has (the values that vary by request aside), and no body.
    status_of_head, of_head, nothing = await answer(http_port, "HEAD", path, {**headers, "X-Request-ID": "head"})
    assert status_of_head == status and nothing == b""
    carries_what_every_response_carries(status_of_head, of_head, "head")
    assert of_head.keys() == received.keys() and of_head.get("content-length") == received.get("content-length")
    assert len(access.of("head")) == 1 and requests_counted(ctx) == counted + 2


@pytest.mark.gen_test
async def test_a_static_file_revalidated_leaves_through_the_exit(http_server, http_port):
    _, first, _ = await answer(http_port, "GET", STYLE, {})
    status, headers, _ = await answer(http_port, "GET", STYLE, {"If-None-Match": first["etag"][0],
                                                                "X-Request-ID": "revalidated"})
    assert status == 304
    carries_what_every_response_carries(status, headers, "revalidated")


@pytest.mark.gen_test
async def test_an_opened_websocket_leaves_through_the_exit(browser, http_client, base_url, http_port, access, ctx):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, scope="read")
    token = json_of(await exchange(http_client, base_url, code))["access_token"]
    counted = requests_counted(ctx)
    status, headers, _ = await answer(http_port, "GET", f"/v1/ws?access_token={token}",
                                      {**HANDSHAKE, "X-Request-ID": "opened"})
    assert status == 101
    carries_what_every_response_carries(status, headers, "opened")
    assert len(access.of("opened")) == 1 and requests_counted(ctx) == counted + 1


def test_the_access_line_and_the_metrics_have_one_call_site():
    """Edge.finished is called from the exit only (the lifecycle's mechanisms stay where they
    are; where a response ends is the exit's business)."""
    import pathlib

    import tokensvc

    callers = [path.name for path in pathlib.Path(tokensvc.__file__).parent.rglob("*.py")
               if ".finished(" in path.read_text()]
    assert callers == [pathlib.Path(exit_module.__file__).name]
