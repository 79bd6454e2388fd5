"""The page base: every HTML page is a :class:`PageHandler` (``tornado.web.RequestHandler``).

Pages are forms and templates, which is what ``RequestHandler`` is for. Every page gets here:
the security headers and a strict Content-Security-Policy (widened per response only by what
the page shows or leads to), the 64 KiB body limit (:mod:`.body_limit`), HEAD wherever GET is, the XSRF rule
(:mod:`.xsrf`: every unsafe request to a page is checked, by Tornado's own hook), the web
session, and one error page for every error (:func:`.errors.response_for`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import tornado.web

from tokensvc.config import Settings
from tokensvc.handlers import xsrf
from tokensvc.handlers.body_limit import too_large
from tokensvc.handlers.errors import log_failure, response_for
from tokensvc.handlers.inputs import RequestInput
from tokensvc.handlers.json_api import SECURITY_HEADERS, UNMATCHED
from tokensvc.logs import REQUEST_ID
from tokensvc.oauth import sessions
from tokensvc.oauth.context import OAuthContext
from tokensvc.records import Session, User

log = logging.getLogger(__name__)


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


CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1: never in a Location


def safe_location(url: str) -> str:
    """``url`` if it can be sent as a ``Location``; ``/`` if it holds a control character."""
    if CONTROL.search(url):
        log.warning("refused a redirect to a location with a control character")
        return "/"
    return url


_SOURCE_HOST = re.compile(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?")
_SOURCE_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+=:@/%-]*")
PAGE_HEADERS = {**SECURITY_HEADERS, "Content-Security-Policy": page_csp(), "Cache-Control": "no-store"}


def defined_methods(cls: type[tornado.web.RequestHandler]) -> tuple[str, ...]:
    """The HTTP methods ``cls`` answers: those it defines, and HEAD wherever GET is."""
    methods = [m for m in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
               if getattr(cls, m.lower()) is not getattr(tornado.web.RequestHandler, m.lower())]
    return tuple(methods + ["HEAD"] if "GET" in methods else methods)


class PageHandler(RequestInput, tornado.web.RequestHandler):
    """An HTML page: XSRF-checked forms, a strict CSP, errors as an error page."""

    ctx: OAuthContext
    config: Settings

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Tornado answers 405 for any other method before anything else (the XSRF check too).
        super().__init_subclass__(**kwargs)
        cls.SUPPORTED_METHODS = defined_methods(cls)

    def initialize(self, ctx: OAuthContext, config: Settings, route: str = UNMATCHED) -> None:
        self.ctx = ctx
        self.config = config
        self.route = route  # the route's pattern, for the metrics
        self.log_error: str | None = None
        self._session: tuple[Session, User] | None | bool = False
        self._session_id = self.raw_session_id()

    def set_default_headers(self) -> None:
        for name, value in PAGE_HEADERS.items():
            self.set_header(name, value)
        self.set_header("X-Request-ID", REQUEST_ID.get() or "")

    def redirect(self, url: str, permanent: bool = False, status: int | None = None) -> None:
        """Every Location a page writes is checked first (:func:`safe_location`)."""
        super().redirect(safe_location(url), permanent, status)

    def head(self, *args: Any, **kwargs: Any) -> Any:
        """HEAD is answered wherever GET is: GET's status and headers, no body (RFC 9110
        §9.3.2; Tornado drops the body of a HEAD response). Where there is no GET, 405."""
        return self.get(*args, **kwargs)

    def allow_sources(self, form_action: Iterable[str | None] = (), img_src: Iterable[str | None] = ()) -> None:
        """Widen this response's CSP by the given URLs (each as :func:`csp_source` makes it)."""
        forms = [source for url in form_action if url and (source := csp_source(url))]
        images = [source for url in img_src if url and (source := csp_source(url))]
        self.set_header("Content-Security-Policy", page_csp(forms, images))

    # -- XSRF (tornado calls check_xsrf_cookie before every unsafe method) ----------------

    def check_xsrf_cookie(self) -> None:
        if xsrf.required(self.request, page=True, takes_session=True, session_cookie=self.config.session_cookie):
            submitted = self.get_body_argument(xsrf.FIELD, None) or self.request.headers.get(xsrf.HEADER)
            xsrf.check(self.request, self.config.xsrf_cookie, self.config.cookie_secret, self._session_id, submitted)

    @property
    def xsrf_token(self) -> bytes:
        """The token for this page's forms: the cookie's, while it is valid for the current
        session; otherwise a new one, set as the cookie."""
        if not hasattr(self, "_xsrf_token"):
            morsel = self.request.cookies.get(self.config.xsrf_cookie)
            current = morsel.value if morsel is not None else None
            if xsrf.valid(self.config.cookie_secret, current, self._session_id):
                self._xsrf_token = current
            else:
                self.issue_xsrf_token()
        return self._xsrf_token.encode("ascii")

    def issue_xsrf_token(self) -> None:
        self._xsrf_token = xsrf.new_token(self.config.cookie_secret, self._session_id)
        self.set_cookie(self.config.xsrf_cookie, self._xsrf_token, path="/", samesite="Lax",
                        secure=self.config.secure_cookies)

    # -- sessions -------------------------------------------------------------------

    async def session(self) -> tuple[Session, User] | None:
        """The web session named by the signed session cookie, looked up once per request."""
        if self._session is False:
            self._session = await sessions.resolve(self.ctx, self._session_id)
        return self._session  # type: ignore[return-value]

    def start_session(self, session_id: str) -> None:
        """Set the session cookie, and an XSRF token for the new session."""
        self.set_signed_cookie(
            self.config.session_cookie, session_id, expires_days=self.cookie_days(), path="/",
            httponly=True, samesite="Lax", secure=self.config.secure_cookies)
        self._session_id = session_id
        self.issue_xsrf_token()

    def end_session(self) -> None:
        self.clear_cookie(self.config.session_cookie, path="/")
        self._session_id = None
        self.issue_xsrf_token()

    # -- errors ---------------------------------------------------------------------

    def log_exception(self, typ, value, tb) -> None:  # type: ignore[override]
        log_failure(self.request, value, (typ, value, tb), metrics=self.ctx.metrics)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        status, body, headers = response_for(exc) if exc is not None else (status_code, {}, {})
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            self.log_error = body["error"]
        self.set_status(status)
        for name, value in headers.items():
            self.set_header(name, value)
        if status == 405:
            self.set_header("Allow", ", ".join(sorted(self.SUPPORTED_METHODS)))
        self.error_page(status, self._reason, _message(status, body))

    def error_page(self, status: int, title: str, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.render("error.html", title=title, message=message, status=status)

    def get_template_namespace(self) -> dict[str, Any]:
        namespace = super().get_template_namespace()
        namespace["service_name"] = self.config.service_name
        return namespace


class TooLargePage(PageHandler):
    """What a RequestHandler route answers to a body over the limit (:mod:`.body_limit`):
    413 as an error page, before the XSRF check or anything else the route would do."""

    def check_xsrf_cookie(self) -> None:
        raise too_large()

    def get(self, *args: Any, **kwargs: Any) -> None:
        raise too_large()

    post = put = patch = delete = options = get


def _message(status: int, body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return body["detail"]
    if isinstance(body, dict) and "error_description" in body:
        return body["error_description"]
    if status == 422:
        return "Some of the information sent was not valid."
    return "Something went wrong."
