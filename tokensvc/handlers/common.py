"""What both kinds of handler share: reading input, the one map from exceptions to error
responses, and the access-log line.

Two kinds of handler serve tokensvc: :mod:`tokensvc.handlers.endpoint` (the JSON API, on
Tornado's HTTP layer) and :mod:`tokensvc.handlers.base` (pages, cookie-authenticated changes
and the WebSocket, on ``tornado.web.RequestHandler``). Both read requests and render errors
through this module, so an endpoint behaves the same whichever kind serves it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from json.encoder import c_encode_basestring, c_make_encoder  # type: ignore[attr-defined]
from typing import Any
from urllib.parse import parse_qsl, urlencode

import tornado.httputil
import tornado.web
from marshmallow import Schema, ValidationError

from tokensvc import logs, schemas
from tokensvc.config import Settings
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import InsufficientScope, InvalidClient, InvalidRequest, InvalidToken, OAuthError
from tokensvc.ratelimit import TooManyFailures
from tokensvc.storage.base import StorageError

MAX_BODY_BYTES = 64 * 1024
JSON_CSP = "default-src 'none'; frame-ancestors 'none'"
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": JSON_CSP,
}
# RFC 6749 §5.1: token responses, and anything else private to the caller, are never cached.
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
TOKEN_HEADERS = {**SECURITY_HEADERS, **NO_STORE}
STORE_DOWN = "The token store is not answering; try again shortly."

REDACTED_PARAMETERS = frozenset({"token", "access_token", "code", "refresh_token", "client_secret",
                                 "code_verifier", "password", "state"})


class ValidationFailed(Exception):
    """Input failed field validation: rendered as 422 HTTPValidationError."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__("validation failed")
        self.detail = detail


class NotFound(Exception):
    """Unknown resource: rendered as 404 ``{"detail"}``."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


# Failures that are answers, not faults: they get their response and no traceback in the log.
EXPECTED = (OAuthError, ValidationFailed, NotFound, StorageError, TooManyFailures, tornado.web.HTTPError)


def _compact_json() -> Callable[[Any], str]:
    """``json.dumps(body, separators=(",", ":"), ensure_ascii=False)``, built once.

    ``JSONEncoder.encode`` makes a new C encoder object on every call, which cost as much
    as encoding a token response itself. A response body is a tree of plain values, so
    one C encoder, made here without the cycle check, serves every response.
    """
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
    if c_make_encoder is None:  # an interpreter without the C accelerator
        return encoder.encode
    encode = c_make_encoder(None, encoder.default, c_encode_basestring, None, ":", ",", False, False, True)
    return lambda body: "".join(encode(body, 0))


dumps = _compact_json()


def error_response(exc: BaseException | None, status_code: int = 500) -> tuple[int, Any, dict[str, str]]:
    """(status, JSON body, headers) for an error; the single map from exceptions to shapes."""
    if isinstance(exc, OAuthError):
        headers = {}
        if isinstance(exc, InvalidClient) and exc.basic:
            headers["WWW-Authenticate"] = 'Basic realm="tokensvc", charset="UTF-8"'
        elif isinstance(exc, InvalidToken):
            headers["WWW-Authenticate"] = 'Bearer realm="tokensvc", error="invalid_token"'
        elif isinstance(exc, InsufficientScope):
            headers["WWW-Authenticate"] = f'Bearer realm="tokensvc", error="insufficient_scope", scope="{exc.scope}"'
        return exc.status_code, exc.body(), headers
    if isinstance(exc, ValidationFailed):
        return 422, {"detail": exc.detail}, {}
    if isinstance(exc, TooManyFailures):
        return 429, {"error": "too_many_requests", "error_description":
                     f"Too many failed attempts; try again in {exc.retry_after} seconds."}, \
            {"Retry-After": str(exc.retry_after)}
    if isinstance(exc, NotFound):
        return 404, {"detail": exc.detail}, {}
    if isinstance(exc, StorageError):
        return 503, {"detail": STORE_DOWN}, {"Retry-After": "5"}
    if isinstance(exc, tornado.web.HTTPError):
        status_code = exc.status_code
        return status_code, {"detail": exc.reason or reason_phrase(status_code)}, {}
    if status_code < 500:
        return status_code, {"detail": reason_phrase(status_code)}, {}
    return 500, {"detail": "Internal server error"}, {}


def reason_phrase(status: int) -> str:
    return tornado.httputil.responses.get(status, "Unknown")


# -- input --------------------------------------------------------------------------


class RequestInput:
    """Reading a request, for handlers with ``request``, ``ctx`` and ``config``."""

    request: tornado.httputil.HTTPServerRequest
    ctx: OAuthContext
    config: Settings

    def form(self, schema: Schema) -> dict[str, str]:
        """The form-encoded body's parameters that ``schema`` knows, as single values.

        Empty values count as absent and unknown parameters are ignored (RFC 6749 §3.1); a
        known one sent twice is ``invalid_request`` (§3.2).
        """
        return single_values(self.request.body_arguments, schema)

    def query(self, schema: Schema) -> dict[str, str]:
        return single_values(self.request.query_arguments, schema)

    @staticmethod
    def load(schema: Schema, data: dict[str, Any], location: str = "body") -> dict[str, Any]:
        try:
            return schemas.fast_load(schema, data)
        except ValidationError as exc:
            raise ValidationFailed(schemas.validation_detail(exc, location, data, schema)) from None

    def load_client_id(self, client_id: str) -> str:
        """Validate a ``{client_id}`` path parameter (an empty one is missing, not malformed)."""
        self.load(schemas.client_id_path, {"client_id": client_id} if client_id else {}, "path")
        return client_id

    def raw_session_id(self) -> str | None:
        """The session id in the signed session cookie, if there is a valid one."""
        morsel = self.request.cookies.get(self.config.session_cookie)
        if morsel is None:
            return None
        raw = tornado.web.decode_signed_value(self.config.cookie_secret, self.config.session_cookie,
                                              morsel.value, max_age_days=self.cookie_days())
        return raw.decode("ascii", "replace") if raw else None

    def cookie_days(self) -> float:
        return self.config.tokens.session_ttl / 86400


def single_values(arguments: dict[str, list[bytes]], schema: Schema) -> dict[str, str]:
    known = schema.fields
    values: dict[str, str] = {}
    for name, raw in arguments.items():
        if name not in known:
            continue
        present = [item for item in raw if item]
        if not present:
            continue
        if len(present) > 1:
            raise InvalidRequest(f"Parameter '{name}' is repeated")
        try:
            values[name] = present[0].decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"Parameter '{name}' is not valid UTF-8") from None
    return values


# -- access log -----------------------------------------------------------------------


def redact(uri: str) -> str:
    """``uri`` with the value of every secret-bearing query parameter replaced by ``***``."""
    path, sep, query = uri.partition("?")
    if not sep:
        return uri
    pairs = parse_qsl(query, keep_blank_values=True)
    return path + "?" + urlencode([(key, "***" if key in REDACTED_PARAMETERS else value) for key, value in pairs],
                                  safe="*/:")


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
