"""The access log: one line per request, with every secret-bearing query value redacted, and
the request ids that tie a request's lines together."""

from __future__ import annotations

import logging
import os
import re
from urllib.parse import parse_qsl, urlencode

import tornado.httputil

from tokensvc import logs

PATH_LIMIT = 2048  # characters of a path and query in an access line


def redact(uri: str) -> str:
    """``uri`` with the value of every secret-bearing query parameter replaced by ``***``, also
    inside another parameter's value that is itself a URI with a query (``next=/oauth/authorize?...``)."""
    path, sep, query = uri.partition("?")
    if not sep:
        return uri
    pairs = parse_qsl(query, keep_blank_values=True)
    return path + "?" + urlencode([(key, "***" if key in logs.SECRET_PARAMETERS else redact(value) if "?" in value
                                   else value) for key, value in pairs], safe="*/:")


_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def request_id_for(request: tornado.httputil.HTTPServerRequest) -> str:
    """The request's ``X-Request-ID`` when it is 1-64 characters of ``[A-Za-z0-9._-]``
    (a proxy's or a client's, to follow a request across services); otherwise a new one."""
    incoming = request.headers.get("X-Request-ID")
    if incoming is not None and _REQUEST_ID.fullmatch(incoming):
        return incoming
    return os.urandom(8).hex()


def log_access(status: int, request: tornado.httputil.HTTPServerRequest, client_id: str | None,
               error: str | None = None) -> None:
    """One access-log line per request, query secrets redacted: remote address, status,
    method, path, milliseconds, the client (if any) and, on a 4xx/5xx, the OAuth error code.
    The time and the request id come with every line (:mod:`tokensvc.logs`)."""
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    if not logs.access_log.isEnabledFor(level):
        return
    elapsed_ms = 1000.0 * request.request_time()
    path = logs.clip(redact(request.uri or ""), PATH_LIMIT)
    method = logs.clip(request.method or "", 16)
    client_id = logs.clip(client_id) if client_id else None
    message = f"{request.remote_ip} {status} {method} {path} {elapsed_ms:.2f}ms"
    if client_id:
        message += f" client_id={client_id}"
    if error:
        message += f" error={error}"
    logs.write(logs.access_log, level, message, "access", {
        "remote_ip": request.remote_ip, "status": status, "method": method, "path": path,
        "ms": round(elapsed_ms, 2), "client_id": client_id, "error": error})
