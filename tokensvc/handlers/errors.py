"""Errors as HTTP responses.

Every error the service answers with owns its response, as Authlib's errors do:
``status_code``, ``body()`` and ``headers()``. The protocol errors (:mod:`tokensvc.oauth.errors`)
and the limiter's 429 (:class:`tokensvc.ratelimit.TooManyFailures`) are defined where they are
raised; the two that only the web layer raises are here. :func:`response_for` is the one
place any exception becomes ``(status, body, headers)``; each base renders that once, as JSON
(:mod:`.json_api`, the WebSocket refusal too) or as an error page (:mod:`.page`). Two kinds of
exception own no response, because their layers know nothing of HTTP: a store that does not
answer is 503, and Tornado's ``HTTPError`` keeps its status.
"""

from __future__ import annotations

import logging
from typing import Any

import tornado.httputil
import tornado.web

from tokensvc.config import STORE_RETRY_AFTER_SECONDS
from tokensvc.handlers.access_log import redact
from tokensvc.metrics import Metrics
from tokensvc.oauth.errors import OAuthError
from tokensvc.ratelimit import TooManyFailures
from tokensvc.storage.base import StorageError, StoreFault

log = logging.getLogger(__name__)

STORE_DOWN = "The token store is not answering; try again shortly."
STORE_FAULT = "The token store refused the operation; the operator has been told."

class ValidationFailed(Exception):
    """Input failed field validation: 422 HTTPValidationError."""

    status_code = 422

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__("validation failed")
        self.detail = detail

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail}

    def headers(self) -> dict[str, str]:
        return {}


class NotFound(Exception):
    """Unknown resource: 404 ``{"detail"}``."""

    status_code = 404

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def body(self) -> dict[str, str]:
        return {"detail": self.detail}

    def headers(self) -> dict[str, str]:
        return {}


# Failures that are answers, not faults: they get their response and no traceback in the log.
EXPECTED = (OAuthError, ValidationFailed, NotFound, TooManyFailures, StorageError, tornado.web.HTTPError)


def response_for(exc: BaseException | None) -> tuple[int, Any, dict[str, str]]:
    """(status, JSON body, headers) for any exception; 500 for one that is not an answer."""
    if isinstance(exc, (OAuthError, ValidationFailed, NotFound, TooManyFailures)):
        return exc.status_code, exc.body(), exc.headers()
    if isinstance(exc, StorageError):
        return 503, {"detail": STORE_DOWN}, {"Retry-After": str(STORE_RETRY_AFTER_SECONDS)}
    if isinstance(exc, StoreFault):  # no Retry-After: retrying will not help
        return 500, {"detail": STORE_FAULT}, {}
    if isinstance(exc, tornado.web.HTTPError):
        return exc.status_code, {"detail": exc.reason or reason_phrase(exc.status_code)}, {}
    return 500, {"detail": "Internal server error"}, {}


def log_failure(request: tornado.httputil.HTTPServerRequest, exc: BaseException,
                exc_info: Any = None, *, metrics: Metrics | None = None) -> None:
    """The log line of a failure, for both bases: a store that is away is a warning, a fault a
    traceback with the URI redacted (never tornado's own line, which prints it raw); answers
    (EXPECTED) are the access line's business. Store failures are counted in ``metrics``."""
    if isinstance(exc, StorageError):
        log.warning("store unavailable: %s %s: %s", request.method, request.path, exc)
        if metrics is not None:
            metrics.store_errors.labels("unavailable").inc()
    elif isinstance(exc, StoreFault):
        log.error("store fault: %s %s: %s", request.method, request.path, exc)
        if metrics is not None:
            metrics.store_errors.labels("refused").inc()
    elif not isinstance(exc, EXPECTED):
        log.error("Uncaught exception %s %s", request.method, redact(request.uri or ""), exc_info=exc_info or exc)


def reason_phrase(status: int) -> str:
    return tornado.httputil.responses.get(status, "Unknown")
