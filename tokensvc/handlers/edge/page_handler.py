"""The page base: every HTML page is a :class:`PageHandler`.

Pages are forms and templates, which is what Tornado's ``RequestHandler`` is for. Beyond what
every route gets from the request lifecycle, a page has a strict Content-Security-Policy
(widened per response only by what the page shows or leads to), the XSRF token of its forms,
and the web session.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tornado.web
from tornado.escape import xhtml_escape

from tokensvc.handlers.edge import xsrf
from tokensvc.handlers.edge.headers import csp_source, page_csp
from tokensvc.handlers.edge.web_handler import WebHandler
from tokensvc.oauth import sessions
from tokensvc.records import Session, User


class PageHandler(WebHandler):
    """An HTML page: XSRF-checked forms, a strict CSP, errors as an error page."""

    def initialize(self, *args: Any, **kwargs: Any) -> None:
        super().initialize(*args, **kwargs)
        self._session: tuple[Session, User] | None = None
        self._session_read = False
        self._session_id = self.raw_session_id()
        self._form_token: str | None = None

    def allow_sources(self, form_action: Iterable[str | None] = (), img_src: Iterable[str | None] = ()) -> None:
        """Widen this response's CSP by the given URLs (each as :func:`csp_source` makes it)."""
        forms = [source for url in form_action if url and (source := csp_source(url))]
        images = [source for url in img_src if url and (source := csp_source(url))]
        self.set_header("Content-Security-Policy", page_csp(forms, images))

    @property
    def xsrf_token(self) -> bytes:
        """The token for this page's forms: the cookie's, while it is valid for the current
        session; otherwise a new one, set as the cookie."""
        if self._form_token is None:
            morsel = self.request.cookies.get(self.config.xsrf_cookie)
            current = morsel.value if morsel is not None else None
            if current is not None and xsrf.valid(self.config.cookie_secrets, current, self._session_id):
                self._form_token = current
            else:
                self._form_token = self.issue_xsrf_token()
        return self._form_token.encode("ascii")

    def issue_xsrf_token(self) -> str:
        """A new token for the current session, set as the cookie. HttpOnly: the pages carry the
        token in their forms, and no script needs the cookie, while a page on any other port of
        the same host (cookies are not kept apart by port) could read one that is not."""
        self._form_token = xsrf.new_token(self.config.cookie_secret, self._session_id)
        self.set_cookie(self.config.xsrf_cookie, self._form_token, path="/", samesite="Lax",
                        secure=self.config.secure_cookies, httponly=True)
        return self._form_token

    # -- sessions -------------------------------------------------------------------

    async def session(self) -> tuple[Session, User] | None:
        """The web session named by the signed session cookie, looked up once per request."""
        if not self._session_read:
            self._session = await sessions.resolve(self.ctx, self._session_id)
            self._session_read = True
        return self._session

    def start_session(self, session_id: str) -> None:
        """Set the session cookie, and an XSRF token for the new session."""
        self.set_signed_cookie(
            self.config.session_cookie, session_id, expires_days=self.cookie_days(), path="/",
            httponly=True, samesite="Lax", secure=self.config.secure_cookies)
        self._session_id = session_id
        self.issue_xsrf_token()

    # A browser's cookie is kept this long after its last sign-in there.
    BROWSER_COOKIE_DAYS = 365

    def known_browser(self) -> sessions.KnownBrowser | None:
        """The browser as its signed cookie tells (the accounts that signed in with it), or None
        without a valid one. Signed with the first key of cookie_secret, any key verifies."""
        morsel = self.request.cookies.get(self.config.browser_cookie)
        if morsel is None:
            return None
        for secret in self.config.cookie_secrets:
            raw = tornado.web.decode_signed_value(secret, self.config.browser_cookie, morsel.value,
                                                  max_age_days=self.BROWSER_COOKIE_DAYS)
            if raw:
                return sessions.KnownBrowser.parse(raw.decode("ascii", "replace"))
        return None

    def remember_browser(self, browser: sessions.KnownBrowser) -> None:
        """Set the browser's cookie: the accounts that signed in with it, this one first. Kept
        across sign-outs (it is no credential: the password is still asked), HttpOnly."""
        self.set_signed_cookie(self.config.browser_cookie, browser.value(), expires_days=self.BROWSER_COOKIE_DAYS,
                               path="/", httponly=True, samesite="Lax", secure=self.config.secure_cookies)

    def end_session(self) -> None:
        # Secure as it was set: a browser ignores a __Host- cookie's clearing without it.
        self.clear_cookie(self.config.session_cookie, path="/", secure=self.config.secure_cookies)
        self._session_id = None
        self.issue_xsrf_token()

    def get_template_namespace(self) -> dict[str, Any]:
        namespace = super().get_template_namespace()
        namespace.update(service_name=self.config.service_name, with_article=with_article, breakable=breakable)
        return namespace


def with_article(word: str) -> str:
    """``word`` after "a" or "an", as a page says it: "a telescope", "an observatory" (an
    installation's kind is the operator's word: installation_kinds)."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def breakable(url: str) -> str:
    """``url`` as HTML that a narrow screen wraps only after a ``/`` (``<wbr>``), never inside
    a word; for ``{% raw %}``."""
    return "/<wbr>".join(xhtml_escape(part) for part in url.split("/"))
