"""The response writer: a whole answer (a JSON route's, or one the lifecycle gives itself)
written on Tornado's connection through its public interface, as one block of bytes.

Tornado's ``HTTP1Connection.write_headers`` formats, encodes and checks each header line on
every response; a JSON route's headers are mostly the same on every answer (its security and
caching headers). Here they are encoded and checked once per header set, the ``Date`` line
is formatted once a second, the lines that vary (a cookie, CORS, an error's ``Allow`` or
``WWW-Authenticate``) are checked in one pass, and the status line, headers and body go to
the connection's ``write`` in one block, which its ``finish`` then ends: whatever Tornado
keeps about a response in flight (its pending write, the connection's end after it) stays
Tornado's own.

Every header line is held to RFC 9110's rules, as ``tornado.httputil.HTTPHeaders`` holds a
header it is given: a name is a token, a value visible characters with inner spaces and tabs
only (no NUL, no CR or LF, nothing to split the header block).

``HTTP1Connection.write`` takes a block that begins with its own status line and headers when
``write_headers`` was not called for the response (its documented, if deprecated, form); so
only an HTTP/1.1 request the connection keeps alive is written so, the answer then needing no
``Connection`` header. Anything else (HTTP/1.0, ``Connection: close``, another connection
class) goes through ``write_headers``, which says how the connection ends.
``tests/test_response_writer.py`` checks that both ways put the same bytes on the wire, on the
oldest and the newest Tornado the package allows (``make test``).

Measured with ``bench/inprocess.py`` (docs/performance.md, "The JSON adapter and the response
writer").
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping

import tornado.httputil
from tornado.http1connection import HTTP1Connection
from tornado.httputil import HTTPConnection, HTTPHeaders, HTTPServerRequest, ResponseStartLine

from tokensvc.errors import reason_phrase

# RFC 9110 §5.1 and §5.5: a field name is a token; a field value is runs of visible
# characters (obs-text included) with spaces and tabs only between them. A line is
# ``name: value`` and CRLF. (Possessive: nothing is tried twice.)
_VISIBLE = rb"[\x21-\x7e\x80-\xff]++"
FIELD_LINES = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]++: (?:" + _VISIBLE + rb"(?:[ \t]++" + _VISIBLE
                         + rb")*+)?\r\n)*+")

# The encoded lines of each header set, by identity: route header sets are module constants.
_blocks: dict[int, tuple[Mapping[str, str], bytes]] = {}
MAX_HEADER_SETS = 32
_date: list = [0, "", b""]  # the second, its Date value, and its Date line


def header_lines(headers: Iterable[tuple[str, str]]) -> bytes:
    """``Name: value`` lines, refused (ValueError) unless every one is a field line RFC 9110
    allows: nothing that could split the header block, or that a client may refuse."""
    try:
        lines = [f"{name}: {value}\r\n".encode("latin1") for name, value in headers]
    except UnicodeEncodeError as exc:
        raise ValueError(f"a header that is not Latin-1: {exc.object!r}") from None
    block = b"".join(lines)
    # Every line of the block a field line, and as many lines as headers: none split in two.
    if FIELD_LINES.fullmatch(block) is None or block.count(b"\n") != len(lines):
        raise ValueError(f"a header name or value RFC 9110 does not allow: {block!r}")
    return block


def constant_lines(headers: Mapping[str, str]) -> bytes:
    """The encoded lines of a header set that does not change (a route's), made and checked
    once."""
    cached = _blocks.get(id(headers))
    if cached is None or cached[0] is not headers:
        if len(_blocks) >= MAX_HEADER_SETS:  # a set made per call: encoded, never kept
            return header_lines(headers.items())
        cached = _blocks[id(headers)] = (headers, header_lines(headers.items()))
    return cached[1]


def http_date() -> tuple[str, bytes]:
    """Now as a ``Date`` value (RFC 9110 §5.6.7), and its header line; made once a second."""
    now = int(time.time())
    if _date[0] != now:
        value = tornado.httputil.format_timestamp(now)
        _date[:] = now, value, f"Date: {value}\r\n".encode()
    return _date[1], _date[2]


def in_one_block(connection: HTTPConnection | None, request: HTTPServerRequest) -> bool:
    """Whether the answer to ``request`` is written as one block: an HTTP/1.1 request that
    Tornado's HTTP/1 connection keeps alive (its rule: a ``Connection`` header other than
    ``close``, on a server that keeps connections alive)."""
    if type(connection) is not HTTP1Connection or request.version != "HTTP/1.1" or connection.params.no_keep_alive:
        return False
    headers = request.headers  # asked with "in" first: a missing name costs HTTPHeaders.get a KeyError
    return "Connection" not in headers or headers["Connection"].lower() != "close"


def write_response(connection: HTTPConnection, request: HTTPServerRequest, status: int, base: Mapping[str, str],
                   extra: Mapping[str, str], lines: Iterable[tuple[str, str]], body: bytes) -> None:
    """Write a whole response to ``request`` on ``connection`` and end it: the header set
    ``base`` (a route's constant one), ``extra`` over it (a name in both is ``extra``'s), the
    header ``lines`` (``Set-Cookie``, and what every response carries), ``Date`` and ``body``.
    What every response carries, and what a HEAD's body is, are the request's exit's to say
    (:mod:`.exit`); here they are written."""
    varying = [*extra.items(), *lines]
    if not in_one_block(connection, request):
        _write_with_tornado(connection, status, base, varying, body)
        return
    constant = (header_lines([(name, value) for name, value in base.items() if name not in extra])
                if not extra.keys().isdisjoint(base) else constant_lines(base))
    connection.write(b"".join((b"HTTP/1.1 %d %s\r\n" % (status, reason_phrase(status).encode("latin1")), constant,
                               header_lines(varying), http_date()[1], b"\r\n", body)))
    connection.finish()


def _write_with_tornado(connection: HTTPConnection, status: int, base: Mapping[str, str],
                        varying: list[tuple[str, str]], body: bytes) -> None:
    constant_lines(base)
    header_lines(varying)  # held to the same rules, whichever way it leaves
    headers = HTTPHeaders(base)
    for name, value in varying:
        if name in base:
            headers[name] = value
        else:
            headers.add(name, value)
    headers["Date"] = http_date()[0]
    connection.write_headers(ResponseStartLine("HTTP/1.1", status, reason_phrase(status)), headers, body or None)
    connection.finish()
