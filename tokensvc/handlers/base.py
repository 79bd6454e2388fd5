"""Handlers on ``tornado.web.RequestHandler``: pages, the cookie-authenticated changes that
need Tornado's XSRF check, and the fallback 404. The JSON API is in :mod:`.endpoint`; both
read input and render errors through :mod:`.common`."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import tornado.web

from tokensvc.config import Settings
from tokensvc.handlers.common import (EXPECTED, MAX_BODY_BYTES, SECURITY_HEADERS, TOKEN_HEADERS, RequestInput,
                                      dumps, error_response)
from tokensvc.oauth import sessions
from tokensvc.oauth.context import OAuthContext
from tokensvc.records import Session, User
from tokensvc.storage.base import StorageError

log = logging.getLogger(__name__)


class BaseHandler(RequestInput, tornado.web.RequestHandler):
    """Errors as JSON by default; :class:`PageHandler` renders HTML instead."""

    ctx: OAuthContext
    config: Settings

    def initialize(self, ctx: OAuthContext, config: Settings) -> None:
        self.ctx = ctx
        self.config = config
        self._session: tuple[Session, User] | None | bool = False

    default_headers: dict[str, str] = SECURITY_HEADERS

    def set_default_headers(self) -> None:
        # Constant, known-good values: stored directly rather than through set_header(),
        # whose per-value checks cost a measurable share of a token request.
        self._headers.update(self.default_headers)

    def prepare(self) -> None:
        if len(self.request.body) > MAX_BODY_BYTES:
            raise tornado.web.HTTPError(413, reason="Request Entity Too Large")

    # Not on every unsafe request: bearer-authenticated calls carry no XSRF token. Where the
    # session cookie is the authority (pages, sign-out, ApiHandler), the check is made.
    def check_xsrf_cookie(self) -> None:
        return None

    def head(self, *args: Any, **kwargs: Any) -> Any:
        """HEAD is answered wherever GET is: GET's status and headers, no body (RFC 9110
        §9.3.2; Tornado drops the body of a HEAD response). Where there is no GET, 405."""
        return self.get(*args, **kwargs)

    # -- sessions -------------------------------------------------------------------

    async def session(self) -> tuple[Session, User] | None:
        """The web session named by the signed session cookie, looked up once per request."""
        if self._session is False:
            self._session = await sessions.resolve(self.ctx, self.raw_session_id())
        return self._session  # type: ignore[return-value]

    # -- output ---------------------------------------------------------------------

    def send_json(self, body: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(dumps(body))

    def log_exception(self, typ, value, tb) -> None:  # type: ignore[override]
        if isinstance(value, StorageError):
            log.warning("store unavailable: %s %s: %s", self.request.method, self.request.path, value)
        elif not isinstance(value, EXPECTED):
            super().log_exception(typ, value, tb)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        status, body, headers = error_response(exc, status_code)
        self.set_status(status)
        for name, value in headers.items():
            self.set_header(name, value)
        self.render_error(status, body)

    def render_error(self, status: int, body: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(dumps(body))


class TokenEndpointHandler(BaseHandler):
    """Token endpoints: responses are never cached (RFC 6749 §5.1)."""

    default_headers = TOKEN_HEADERS


def page_csp(form_action: Iterable[str] = (), img_src: Iterable[str] = ()) -> str:
    """A page's Content-Security-Policy: only this origin, plus the sources a page names.

    ``form-action`` also governs the redirects that follow a form post (browsers check every
    hop), so a page whose form leads on to a client's redirect_uri names that origin;
    ``img-src`` names a client's logo.
    """
    forms = " ".join(dict.fromkeys(["'self'", *form_action]))
    images = " ".join(dict.fromkeys(["'self'", *img_src]))
    return (f"default-src 'none'; style-src 'self'; img-src {images}; form-action {forms}; "
            "frame-ancestors 'none'; base-uri 'none'")


def csp_source(url: str) -> str | None:
    """The narrowest CSP source expression that matches ``url`` (None if it cannot be one).

    A private-use scheme (RFC 8252 §7.1) is a scheme source; http(s) URLs keep their path
    when it holds nothing a source expression cannot (CSP3 §2.3.1), else their origin.
    """
    parts = urlsplit(url)
    if not parts.scheme:
        return None
    if parts.scheme not in ("http", "https"):
        return f"{parts.scheme}:"
    if not parts.netloc or not _SOURCE_HOST.fullmatch(parts.netloc):
        return None
    origin = f"{parts.scheme}://{parts.netloc}"
    if parts.path and not parts.query and _SOURCE_PATH.fullmatch(parts.path):
        return origin + parts.path
    return origin


_SOURCE_HOST = re.compile(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?")
_SOURCE_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+=:@/%-]*")


class PageHandler(BaseHandler):
    """HTML pages: XSRF-checked forms, a strict CSP, errors as an error page."""

    default_headers = {**BaseHandler.default_headers, "Content-Security-Policy": page_csp(),
                       "Cache-Control": "no-store"}

    def allow_sources(self, form_action: Iterable[str | None] = (), img_src: Iterable[str | None] = ()) -> None:
        """Widen this response's CSP by the given URLs (each as :func:`csp_source` makes it)."""
        forms = [source for url in form_action if url and (source := csp_source(url))]
        images = [source for url in img_src if url and (source := csp_source(url))]
        self.set_header("Content-Security-Policy", page_csp(forms, images))

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
