"""The access log: one line per request, with every secret-bearing query value redacted.

Every request writes one, so its cost is paid by every request (docs/performance.md has the
figures). The line is made at a fixed cost where the service's own handler is its only
destination and the format is text (``logs.write``'s direct way): the parts that do not
change from one request of a route to the next (the level and logger, the status, the method,
the route's path) are made once and kept; the time comes from the logs' clock, formatted at
most once per millisecond; the line is one string, encoded once, and added to the handler's
buffer, which writes the lines of a loop iteration in one go. Only what a request supplied
(the address, the method, the path, the client id) could need escaping: the line is checked
once for anything unprintable (``str.isprintable``), and only such a line is made the
general way, by the formatter, which escapes it. Every other case (JSON lines, a test's capture, a handler an
embedding program added) takes the general way. Both ways write the same line
(``tests/test_access_log.py``).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import quote

import tornado.httputil

from tokensvc.telemetry import logs, redaction

PATH_LIMIT = 2048  # characters of a path and query in an access line
METHOD_LIMIT = 16
MAX_KEPT = 512  # constant parts kept (route, method and status): a table far larger than any service's


def redact(uri: str) -> str:
    """``uri`` with the value of every secret-bearing query parameter replaced by ``***``: a
    parameter whose name is a secret's however it is written, and any value holding what a
    secret of the service looks like (:mod:`tokensvc.telemetry.redaction`); also inside another
    parameter's value that is itself a URI with a query or a query (``next=/oauth/authorize?...``).
    Every other part of the query is kept as it came."""
    path, sep, query = uri.partition("?")
    if not sep:
        return uri
    return path + "?" + _redact_query(query, NESTED_QUERIES)


NESTED_QUERIES = 4  # queries within a value, within a value ... redacted pair by pair; deeper ones withheld whole
_SEPARATOR = re.compile(r"([&;])")  # ';' too: a parser that takes it for a separator reads a name after it


def _redact_query(query: str, nested: int) -> str:
    parts = _SEPARATOR.split(query)
    for index in range(0, len(parts), 2):
        name, equals, value = parts[index].partition("=")
        if not equals:
            continue
        if redaction.secret_name(name):
            parts[index] = name + "=***"
            continue
        plain = redaction.decoded(value)
        if "=" in plain:  # a URI with a query, or a query, as a value: redacted pair by pair
            inner_path, sep, inner_query = plain.partition("?") if "?" in plain else ("", "", plain)
            clean = _redact_query(inner_query, nested - 1) if nested else "***"
            if clean != inner_query:
                parts[index] = f"{name}={quote(inner_path + sep + clean, safe='*/:')}"
        elif redaction.secret_shaped(plain):
            parts[index] = name + "=***"
    return "".join(parts)


def level_of(status: int) -> int:
    return logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR


# The text line's constant parts: after the time, "Z INFO tokensvc.access: " by level, and
# " 200 POST /oauth/token " by (status, method, route) for a request to a route's own path.
_HEADS = {level: f"Z {logging.getLevelName(level)} {logs.access_log.name}: "
          for level in (logging.INFO, logging.WARNING, logging.ERROR)}
_middles: dict[tuple[int, str, str], str] = {}


def log_access(status: int, request: tornado.httputil.HTTPServerRequest, client_id: str | None,
               error: str | None = None, route: str | None = None, seconds: float | None = None) -> None:
    """One access-log line per request, query secrets redacted: remote address, status,
    method, path, milliseconds, the client (if any) and, on a 4xx/5xx, the OAuth error code.
    The time and the request id come with every line (:mod:`tokensvc.telemetry.logs`). ``route`` is the
    route's path (a request to it exactly, the usual case, reuses its line's middle);
    ``seconds`` the time the request took, when the caller has it."""
    level = level_of(status)
    logger = logs.access_log
    if not logger.isEnabledFor(level):
        return
    elapsed_ms = 1000.0 * (request.request_time() if seconds is None else seconds)
    uri = request.uri or ""
    method = request.method or ""
    if uri == route:  # the route's own path, no query: nothing to redact or cut
        middle = _middles.get((status, method, uri))
        if middle is None:
            middle = f" {status} {logs.clip(method, METHOD_LIMIT)} {uri} "
            if len(_middles) < MAX_KEPT:
                _middles[(status, method, uri)] = middle
        path = uri
    else:
        path = logs.clip(redact(uri), PATH_LIMIT)
        middle = f" {status} {logs.clip(method, METHOD_LIMIT)} {path} "
    client_id = logs.clip(client_id) if client_id else None
    message = f"{request.remote_ip}{middle}{elapsed_ms:.2f}ms"
    if client_id:
        message += f" client_id={client_id}"
    if error:
        message += f" error={error}"
    handler = logs.sole_service_handler(logger, level)
    if handler is not None and type(handler.formatter) is logs.TextFormatter and message.isprintable():
        # The direct way, for a line with nothing to escape: what TextFormatter.line writes.
        request_id = logs.REQUEST_ID.get()
        tail = f" request_id={request_id}\n" if request_id is not None else "\n"
        handler.append(f"{logs.CLOCK.stamp(logs.now())}{_HEADS[level]}{message}{tail}".encode())
        return
    method = logs.clip(method, METHOD_LIMIT)
    logs.write(logger, level, message, "access", {
        "remote_ip": request.remote_ip, "status": status, "method": method, "path": path,
        "ms": round(elapsed_ms, 2), "client_id": client_id, "error": error})
