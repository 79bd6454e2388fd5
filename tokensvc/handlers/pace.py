"""A decision at a person's pace: a page where the user grants something (consent, pairing, the
one-click page) takes an "allow" only once it has been shown long enough to be read.

Double-clickjacking: a page elsewhere asks for a double click where the page's button will
be; the first click sends the browser to the authorization request, and the second lands on
the button that appears under the pointer. Frames and scripts have nothing to do with it (the
page is the top document, the service's own). So the page's buttons appear, and take clicks,
only after :data:`REVEAL_SECONDS` (``static/style.css``, without a script: the pages run
none); and the server takes an "allow" posted sooner than :data:`MIN_SECONDS` after it
rendered the page for no decision, showing the page again. The moment is signed into the
form (``_shown``, under the cookie secret and bound to the web session as the XSRF token
is), so a form cannot claim an earlier one.

The server's bound is below the stylesheet's, so that a person who clicks as soon as the
buttons appear is never refused: what is left for the clocks of two processes (a page
rendered by one, answered at another) to disagree by.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime

FIELD = "_shown"
MIN_SECONDS = 0.5  # an "allow" sooner than this after the page was rendered is taken for none
REVEAL_SECONDS = 0.8  # when the buttons appear (static/style.css: .decision button)


def stamp(secret: str, session_id: str | None, now: datetime) -> str:
    """The ``_shown`` field of a page rendered at ``now``: its time (ms) and a signature."""
    at = str(int(now.timestamp() * 1000))
    return f"{at}.{_signature(secret, at, session_id)}"


def too_soon(secret: str, session_id: str | None, value: str | None, now: datetime) -> bool:
    """Whether a decision posted at ``now`` with the ``_shown`` field ``value`` comes sooner than
    :data:`MIN_SECONDS` after its page was rendered; a field that is missing or not signed for
    this session (a form rendered by a release without it, or forged) is taken as too soon: the
    page is shown again, with a field of its own."""
    if not value or len(value) > 128:
        return True
    at, _, signature = value.partition(".")
    if not at.isdigit() or not hmac.compare_digest(signature, _signature(secret, at, session_id)):
        return True
    return now.timestamp() * 1000 - int(at) < MIN_SECONDS * 1000


def _signature(secret: str, at: str, session_id: str | None) -> str:
    message = f"shown|{at}|{session_id or ''}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
