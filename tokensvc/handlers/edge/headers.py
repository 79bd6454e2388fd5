"""What responses carry for their safety: the security headers of each output format, a
page's Content-Security-Policy, and the check every ``Location`` passes before it is sent."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from tokensvc.identifiers import CONTROL  # never in a Location

log = logging.getLogger("tokensvc.handlers.headers")  # the name its lines carry: what log filters select

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
# RFC 6749 §5.1: token responses, and anything else private to the caller, are never cached.
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


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


JSON_HEADERS = {**SECURITY_HEADERS, "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'"}
TOKEN_HEADERS = {**JSON_HEADERS, **NO_STORE}
PRIVATE_HEADERS = {**JSON_HEADERS, "Cache-Control": "no-store"}
# A page's forms post their own origin in ``Origin`` (under no-referrer a browser sends
# ``Origin: null``, which tells nothing and is refused, guards.check_xsrf); every other
# origin (a client's redirect, a logo's host) still gets no Referer.
PAGE_HEADERS = {**SECURITY_HEADERS, "Referrer-Policy": "same-origin", "Content-Security-Policy": page_csp(),
                "Cache-Control": "no-store"}
# Static files are the pages' own style sheet and icons: cacheable, and never a document that
# could run anything. Opened on their own, a browser shows an image in a document it styles
# inline itself, which is all 'unsafe-inline' allows here.
STATIC_HEADERS = {**SECURITY_HEADERS, "Content-Security-Policy": "default-src 'none'; img-src 'self'; "
                                                                 "style-src 'self' 'unsafe-inline'; "
                                                                 "frame-ancestors 'none'"}


def csp_source(url: str) -> str | None:
    """The narrowest CSP source expression that matches ``url`` (None if it cannot be one).

    A private-use scheme (RFC 8252 §7.1) is a scheme source; http(s) URLs keep their path
    when it holds nothing a source expression cannot (CSP3 §2.3.1), else their origin. CSP has
    no expression for an IPv6 literal (``[::1]``, a loopback redirect RFC 8252 §7.3 allows):
    browsers drop ``http://[::1]:8000`` as invalid, so such a URL gets its scheme source.
    """
    parts = urlsplit(url)
    if not parts.scheme:
        return None
    if parts.scheme not in ("http", "https") or parts.netloc.startswith("["):
        return f"{parts.scheme}:"
    if not parts.netloc or not _SOURCE_HOST.fullmatch(parts.netloc):
        return None
    origin = f"{parts.scheme}://{parts.netloc}"
    if parts.path and not parts.query and _SOURCE_PATH.fullmatch(parts.path):
        return origin + parts.path
    return origin


_SOURCE_HOST = re.compile(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?")
_SOURCE_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+=:@/%-]*")


def safe_location(url: str) -> str:
    """``url`` if it can be sent as a ``Location``; ``/`` if it holds a control character."""
    if CONTROL.search(url):
        log.warning("refused a redirect to a location with a control character")
        return "/"
    return url
