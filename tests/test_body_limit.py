"""The body limit: any body over 64 KiB gets 413 in the route's own shape, whatever its
size or framing (Content-Length or chunked), and is never kept."""

from __future__ import annotations

import socket

import pytest
import requests
from helpers import json_of
from service import start_service

LIMIT = 64 * 1024
TWO_MIB = 2 * 1024 * 1024


def chunked(total: int, piece: int = 16 * 1024):
    """A body_producer: Tornado's client then sends the body chunked, with no length."""
    async def produce(write):
        sent = 0
        while sent < total:
            n = min(piece, total - sent)
            await write(b"x" * n)
            sent += n
    return produce


async def post(http_client, url, *, body=None, producer=None, headers=None):
    return await http_client.fetch(url, method="POST", raise_error=False, body=body, body_producer=producer,
                                   headers=headers or {}, request_timeout=60)


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("size", [LIMIT + 1, TWO_MIB])
async def test_a_json_route_answers_413_with_detail(http_client, base_url, framing, size):
    if framing == "length":
        response = await post(http_client, base_url + "/oauth/token", body=b"x" * size)
    else:
        response = await post(http_client, base_url + "/oauth/token", producer=chunked(size))
    assert response.code == 413, response.body
    assert response.headers["Content-Type"] == "application/json"
    assert json_of(response) == {"detail": "Request Entity Too Large"}


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_a_page_answers_413_before_its_xsrf_check(http_client, base_url, framing):
    # No XSRF token at all: the size is what is wrong first, so 413 (not 403), as an HTML page.
    if framing == "length":
        response = await post(http_client, base_url + "/login", body=b"username=" + b"x" * TWO_MIB)
    else:
        response = await post(http_client, base_url + "/login", producer=chunked(TWO_MIB))
    assert response.code == 413, response.body
    assert response.headers["Content-Type"].startswith("text/html")
    assert b"Request Entity Too Large" in response.body


@pytest.mark.gen_test
async def test_a_body_at_the_limit_is_read(http_client, base_url):
    body = b"grant_type=x&pad=" + b"x" * (LIMIT - len(b"grant_type=x&pad="))
    response = await post(http_client, base_url + "/oauth/token", body=body)
    assert response.code == 400 and json_of(response)["error"] == "unsupported_grant_type"


@pytest.mark.gen_test(timeout=60)
async def test_a_route_that_ignores_its_body_ignores_any_size(http_client, base_url):
    response = await post(http_client, base_url + "/oauth/revoke", producer=chunked(TWO_MIB))
    assert response.code == 200 and json_of(response) == {}


def raw_request(port: int, head: bytes, body_pieces) -> bytes:
    """Send a ``Connection: close`` request and read until the server closes. The sending side
    stays open, as an HTTP client's does: Tornado ends a connection whose peer half-closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head)
        for piece in body_pieces:
            conn.sendall(piece)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.mark.process
def test_the_running_server_answers_413_past_its_own_limit(tmp_path):
    """Through ``tokensvc serve``: Tornado's own limit would answer a bare 400 and close."""
    service = start_service(tmp_path)
    try:
        port = int(service.base.rsplit(":", 1)[1])
        piece = b"x" * 65536
        head = (b"POST /oauth/token HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\n")
        by_length = raw_request(port, head + b"Content-Length: %d\r\n\r\n" % (4 * TWO_MIB), [piece] * 128)
        framed = [b"%x\r\n%s\r\n" % (len(piece), piece)] * 128 + [b"0\r\n\r\n"]
        by_chunks = raw_request(port, head + b"Transfer-Encoding: chunked\r\n\r\n", framed)
        for answer in (by_length, by_chunks):
            assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
            assert answer.endswith(b'{"detail":"Request Entity Too Large"}')
        assert requests.get(service.base + "/healthz", timeout=5).status_code == 200
    finally:
        output = service.stop()
    assert "Traceback" not in output and "Malformed HTTP message" not in output
