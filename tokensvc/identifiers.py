"""What an id, a username, a redirect URI and a URL may look like: one definition shared by
the config loader, the operator commands and the request schemas."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# Client and installation ids: the unreserved characters of RFC 3986, at most 128.
ID_CHARS = re.compile(r"^[A-Za-z0-9._~-]+$")  # the characters alone (the length is checked apart)
ID = re.compile(r"^[A-Za-z0-9._~-]{1,128}$")
USERNAME = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")


def is_redirect_uri(uri: str) -> bool:
    """RFC 6749 §3.1.2: absolute, no fragment. Custom schemes serve native apps (RFC 8252 §7.1)."""
    parts = urlsplit(uri)
    return bool(parts.scheme) and not parts.fragment and (parts.scheme not in ("http", "https") or bool(parts.netloc))


def is_url(uri: str, schemes: tuple[str, ...] = ("http", "https")) -> bool:
    parts = urlsplit(uri)
    return parts.scheme in schemes and bool(parts.netloc)
