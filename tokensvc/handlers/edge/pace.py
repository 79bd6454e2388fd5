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

The moment holds for :data:`MAX_SECONDS`, not for the session's life: an "allow" posted later
than that after the page was rendered is taken for none as well, and the page shown again
with a moment of its own. A page whose buttons have long been there is what a click meant for
something else lands on, when a page elsewhere brings an old tab of the service back (the
history, a restored window) under the user's pointer; an answer after that long was never the
answer to what the user is reading now.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime

FIELD = "_shown"
MIN_SECONDS = 0.5  # an "allow" sooner than this after the page was rendered is taken for none
MAX_SECONDS = 600  # and one later than this (ten minutes: a page read at leisure is answered in time)
TOO_SOON, TOO_LATE = "too soon", "too late"
REVEAL_SECONDS = 0.8  # when the buttons appear (static/style.css: .decision button)


def stamp(secret: str, session_id: str | None, now: datetime) -> str:
    """The ``_shown`` field of a page rendered at ``now``: its time (ms) and a signature."""
    at = str(int(now.timestamp() * 1000))
    return f"{at}.{_signature(secret, at, session_id)}"


def judge(secret: str, session_id: str | None, value: str | None, now: datetime) -> str | None:
    """None when an "allow" posted at ``now`` with the ``_shown`` field ``value`` is taken;
    :data:`TOO_SOON` when it comes sooner than :data:`MIN_SECONDS` after its page was rendered,
    or the field is missing or not signed for this session (a form rendered by a release
    without it, or forged); :data:`TOO_LATE` when it comes more than :data:`MAX_SECONDS` after.
    Either way the page is shown again, with a field of its own."""
    if not value or len(value) > 128:
        return TOO_SOON
    at, _, signature = value.partition(".")
    if not at.isdigit() or not hmac.compare_digest(signature, _signature(secret, at, session_id)):
        return TOO_SOON
    waited = now.timestamp() * 1000 - int(at)
    if waited < MIN_SECONDS * 1000:
        return TOO_SOON
    return TOO_LATE if waited > MAX_SECONDS * 1000 else None


def _signature(secret: str, at: str, session_id: str | None) -> str:
    message = f"shown|{at}|{session_id or ''}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
