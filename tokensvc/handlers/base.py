"""What every handler shares: injected context, input parsing, and the one place where every
error shape of the service is rendered (``write_error``)."""

from __future__ import annotations

import json
import logging
from typing import Any

import tornado.web
from marshmallow import Schema, ValidationError

from tokensvc import schemas
from tokensvc.config import Settings
from tokensvc.oauth import sessions
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import InsufficientScope, InvalidClient, InvalidRequest, InvalidToken, OAuthError
from tokensvc.ratelimit import TooManyFailures
from tokensvc.records import Session, User
from tokensvc.storage.base import StorageError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
JSON_CSP = "default-src 'none'; frame-ancestors 'none'"


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


_EXPECTED = (OAuthError, ValidationFailed, NotFound, StorageError, TooManyFailures, tornado.web.HTTPError)


def dumps(body: Any) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


class BaseHandler(tornado.web.RequestHandler):
    """JSON endpoints by default; :class:`PageHandler` renders HTML instead."""

    ctx: OAuthContext
    config: Settings

    def initialize(self, ctx: OAuthContext, config: Settings) -> None:
        self.ctx = ctx
        self.config = config
        self._session: tuple[Session, User] | None | bool = False

    default_headers: dict[str, str] = {
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Content-Security-Policy": JSON_CSP,
    }

    def set_default_headers(self) -> None:
        # Constant, known-good values: stored directly rather than through set_header(),
        # whose per-value checks cost a measurable share of a token request.
        self._headers.update(self.default_headers)

    def prepare(self) -> None:
        if len(self.request.body) > MAX_BODY_BYTES:
            raise tornado.web.HTTPError(413, reason="Request Entity Too Large")

    # JSON endpoints authenticate with client credentials or bearer tokens, never with
    # ambient cookies, so the form XSRF check does not apply to them.
    def check_xsrf_cookie(self) -> None:
        return None

    # -- input --------------------------------------------------------------------

    def form(self, schema: Schema) -> dict[str, str]:
        """The form-encoded body's parameters that ``schema`` knows, as single values.

        Empty values count as absent and unknown parameters are ignored (RFC 6749 §3.1); a
        known one sent twice is ``invalid_request`` (§3.2).
        """
        return self._single_values(self.request.body_arguments, schema)

    def query(self, schema: Schema) -> dict[str, str]:
        return self._single_values(self.request.query_arguments, schema)

    @staticmethod
    def _single_values(arguments: dict[str, list[bytes]], schema: Schema) -> dict[str, str]:
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

    # -- sessions -------------------------------------------------------------------

    async def session(self) -> tuple[Session, User] | None:
        """The web session named by the signed session cookie, looked up once per request."""
        if self._session is False:
            self._session = await sessions.resolve(self.ctx, self.raw_session_id())
        return self._session  # type: ignore[return-value]

    def _cookie_days(self) -> float:
        return self.config.tokens.session_ttl / 86400

    def raw_session_id(self) -> str | None:
        raw = self.get_signed_cookie(self.config.session_cookie, max_age_days=self._cookie_days())
        return raw.decode("ascii", "replace") if raw else None

    # -- output ---------------------------------------------------------------------

    def send_json(self, body: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(dumps(body))

    def log_exception(self, typ, value, tb) -> None:  # type: ignore[override]
        if isinstance(value, StorageError):
            log.warning("store unavailable: %s %s: %s", self.request.method, self.request.path, value)
        elif not isinstance(value, _EXPECTED):
            super().log_exception(typ, value, tb)

    def error_response(self, status_code: int, exc: BaseException | None) -> tuple[int, Any, dict[str, str]]:
        """(status, JSON body, headers) for an error; the single map from exceptions to shapes."""
        if isinstance(exc, OAuthError):
            headers = {}
            if isinstance(exc, InvalidClient) and exc.basic:
                headers["WWW-Authenticate"] = 'Basic realm="tokensvc", charset="UTF-8"'
            elif isinstance(exc, InvalidToken):
                headers["WWW-Authenticate"] = 'Bearer realm="tokensvc", error="invalid_token"'
            elif isinstance(exc, InsufficientScope):
                headers["WWW-Authenticate"] = (
                    f'Bearer realm="tokensvc", error="insufficient_scope", scope="{exc.scope}"')
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
            return 503, {"detail": "The token store is not answering; try again shortly."}, {"Retry-After": "5"}
        if isinstance(exc, tornado.web.HTTPError):
            return exc.status_code, {"detail": exc.reason or self._reason}, {}
        if status_code < 500:
            return status_code, {"detail": self._reason}, {}
        return 500, {"detail": "Internal server error"}, {}

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        status, body, headers = self.error_response(status_code, exc)
        self.set_status(status)
        for name, value in headers.items():
            self.set_header(name, value)
        self.render_error(status, body)

    def render_error(self, status: int, body: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(dumps(body))


class TokenEndpointHandler(BaseHandler):
    """Token endpoints: responses are never cached (RFC 6749 §5.1)."""

    default_headers = {**BaseHandler.default_headers, "Cache-Control": "no-store", "Pragma": "no-cache"}


class PageHandler(BaseHandler):
    """HTML pages: XSRF-checked forms, a strict CSP, errors as an error page."""

    page_csp = ("default-src 'none'; style-src 'self'; img-src 'self' https: data:; "
                "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
    default_headers = {**BaseHandler.default_headers, "Content-Security-Policy": page_csp,
                       "Cache-Control": "no-store"}

    def check_xsrf_cookie(self) -> None:
        tornado.web.RequestHandler.check_xsrf_cookie(self)

    def render_error(self, status: int, body: Any) -> None:
        if isinstance(body, dict) and isinstance(body.get("detail"), str):
            message = body["detail"]
        elif isinstance(body, dict) and "error_description" in body:
            message = body["error_description"]
        elif status == 422:
            message = "Some of the information sent was not valid."
        else:
            message = "Something went wrong."
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.render("error.html", title=self._reason, message=message, status=status)

    def get_template_namespace(self) -> dict[str, Any]:
        namespace = super().get_template_namespace()
        namespace["service_name"] = self.config.service_name
        return namespace
