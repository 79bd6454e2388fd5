"""The confirmation code a page shows (``oauth/confirmation.py``), carried by its form.

A page where the user decides on an authorization that would grant ``admin`` to a native app
shows a confirmation code, and its answer must issue the authorization code for that one: the
form carries it as ``_confirmation``, with a signature under the cookie secret bound to the web
session (as the XSRF token and ``_shown`` are). A form cannot bring a confirmation of its own,
nor one signed for another session; a field that does not verify is no confirmation, and the
page is shown again with one. The form is only ever posted by the page itself (its XSRF token,
its own origin), and the page is read by nobody but the person in front of it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

FIELD = "_confirmation"


def field(secret: str, session_id: str | None, confirmation: str) -> str:
    """The ``_confirmation`` field of a page that shows ``confirmation``."""
    return f"{confirmation}.{_signature(secret, confirmation, session_id)}"


def shown(secrets: Sequence[str], session_id: str | None, value: str | None) -> str | None:
    """The confirmation the answered page showed, when ``value`` is a field signed for this
    session by one of ``secrets`` (a cookie secret being rotated out still verifies); else None."""
    if not value or len(value) > 128:
        return None
    confirmation, _, signature = value.partition(".")
    if not confirmation.isalnum() or not confirmation.isascii():
        return None
    right = [hmac.compare_digest(signature, _signature(secret, confirmation, session_id)) for secret in secrets]
    return confirmation if any(right) else None


def _signature(secret: str, confirmation: str, session_id: str | None) -> str:
    message = f"confirmation|{confirmation}|{session_id or ''}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
