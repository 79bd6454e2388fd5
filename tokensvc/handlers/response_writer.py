"""The response writer: every JSON answer, and every answer the lifecycle gives itself, written
as one block of bytes.

Tornado's ``HTTP1Connection.write_headers`` formats, encodes and checks each header line for
CR/LF on every response; a JSON route's headers are mostly the same on every answer (its
security and caching headers). Here they are encoded and checked once per header set, the
``Date`` line is formatted once a second, the header lines that vary (a cookie, CORS, an error's
``Allow`` or ``WWW-Authenticate``) are checked in one pass, and the status line, headers and
body go out in one write.

The connection's own state is kept as ``write_headers`` and ``_format_chunk`` would leave it
(no chunking, nothing more expected of the body, the write pending), and the request is ended
by the connection's public ``finish``, so keep-alive, ``Connection: close`` and the next
request stay Tornado's. Only HTTP/1.1 requests on Tornado's ``HTTP1Connection`` take this way;
anything else (HTTP/1.0, another connection class) goes through ``write_headers`` as before.
``tests/test_response_writer.py`` checks that both ways put the same bytes on the wire.

Measured with ``bench/inprocess.py`` (docs/performance.md, "The response writer").
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import tornado.httputil
from tornado.concurrent import future_add_done_callback
from tornado.http1connection import HTTP1Connection
from tornado.httputil import HTTPHeaders, HTTPServerRequest, ResponseStartLine

from tokensvc.errors import reason_phrase

# The encoded lines of each header set, by identity: route header sets are module constants.
_blocks: dict[int, tuple[Mapping[str, str], bytes]] = {}
MAX_HEADER_SETS = 32
_date: list = [0, b""]  # the second, and its Date line


def header_lines(headers: Iterable[tuple[str, str]]) -> bytes:
    """``Name: value`` lines, refused if any would split the header block (CR or LF)."""
    lines = [f"{name}: {value}\r\n".encode("latin1") for name, value in headers]
    block = b"".join(lines)
    # Each line holds one CR and one LF, its own end: any other would split the block.
    if block.count(b"\r") != len(lines) or block.count(b"\n") != len(lines):
        raise ValueError(f"illegal characters (CR or LF) in a header: {block!r}")
    return block


def constant_lines(headers: Mapping[str, str]) -> bytes:
    """The encoded lines of a header set that does not change (a route's), made once."""
    cached = _blocks.get(id(headers))
    if cached is None or cached[0] is not headers:
        if len(_blocks) >= MAX_HEADER_SETS:  # a set made per call: encoded, never kept
            return header_lines(headers.items())
        cached = _blocks[id(headers)] = (headers, header_lines(headers.items()))
    return cached[1]


def date_line() -> bytes:
    now = int(time.time())
    if _date[0] != now:
        _date[0], _date[1] = now, f"Date: {tornado.httputil.format_timestamp(now)}\r\n".encode()
    return _date[1]


def write_response(request: HTTPServerRequest, status: int, base: Mapping[str, str], extra: Mapping[str, str],
                   body: bytes, request_id: str, cookies: Iterable[str] = ()) -> None:
    """Write a whole response on the request's connection: the header set ``base`` (a route's
    constant one), ``extra`` over it (a name in both is ``extra``'s), a ``Set-Cookie`` line
    for each of ``cookies``; a HEAD gets the headers a GET would, and no body."""
    if status == 204:
        body = b""
    varying = [*extra.items(), *(("Set-Cookie", cookie) for cookie in cookies), ("X-Request-ID", request_id)]
    if status != 204:
        varying.append(("Content-Length", str(len(body))))
    connection = request.connection
    assert connection is not None
    if type(connection) is not HTTP1Connection or request.version != "HTTP/1.1":
        _write_with_tornado(request, status, base, varying, body)
        return
    if connection._disconnect_on_finish:
        varying.append(("Connection", "close"))
    overridden = not extra.keys().isdisjoint(base)
    reason = reason_phrase(status)
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, reason.encode("latin1")),
             header_lines((name, value) for name, value in base.items() if name not in extra) if overridden
             else constant_lines(base), header_lines(varying), date_line(), b"\r\n"]
    if request.method != "HEAD":
        lines.append(body)
    # What write_headers(start_line, headers, body) leaves: nothing chunked, nothing more to
    # come of the body, the write pending; finish() then ends the request as Tornado does.
    connection._response_start_line = ResponseStartLine("HTTP/1.1", status, reason)
    connection._chunking_output = False
    connection._expected_content_remaining = 0
    if connection.stream.closed():
        # The client went away first: nothing to write, and the request ends as Tornado ends
        # it then (write_headers would not write either).
        connection._pending_write = None
    else:
        connection._pending_write = connection.stream.write(b"".join(lines))
        future_add_done_callback(connection._pending_write, connection._on_write_complete)
    connection.finish()


def _write_with_tornado(request: HTTPServerRequest, status: int, base: Mapping[str, str],
                        varying: list[tuple[str, str]], body: bytes) -> None:
    headers = HTTPHeaders(base)
    for name, value in varying:
        if name in base:
            headers[name] = value
        else:
            headers.add(name, value)
    headers["Date"] = tornado.httputil.format_timestamp(time.time())
    if request.method == "HEAD":
        body = b""
    connection = request.connection
    assert connection is not None
    connection.write_headers(ResponseStartLine("HTTP/1.1", status, reason_phrase(status)), headers, body or None)
    connection.finish()
