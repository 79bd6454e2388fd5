"""The access log: one line per request, with every secret-bearing query value redacted."""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlencode

import tornado.httputil

from tokensvc import logs



def redact(uri: str) -> str:
    """``uri`` with the value of every secret-bearing query parameter replaced by ``***``, also
    inside another parameter's value that is itself a URI with a query (``next=/oauth/authorize?...``)."""
    path, sep, query = uri.partition("?")
    if not sep:
        return uri
    pairs = parse_qsl(query, keep_blank_values=True)
    return path + "?" + urlencode([(key, "***" if key in logs.SECRET_PARAMETERS else redact(value) if "?" in value
                                   else value) for key, value in pairs], safe="*/:")


def log_access(status: int, request: tornado.httputil.HTTPServerRequest, client_id: str | None) -> None:
    """One access-log line per request, query secrets redacted."""
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    if not logs.access_log.isEnabledFor(level):
        return
    elapsed_ms = 1000.0 * request.request_time()
    path = redact(request.uri or "")
    message = f"{status} {request.method} {path} {elapsed_ms:.2f}ms"
    if client_id:
        message += f" client_id={client_id}"
    logs.write(logs.access_log, level, message, "access", {
        "status": status, "method": request.method, "path": path, "ms": round(elapsed_ms, 2),
        "client_id": client_id, "remote_ip": request.remote_ip})
