"""What a log line may hold of a request's parameters: the one rule of which carry secrets.

A parameter carries a secret when its name, read the way any parser might read it, is one of
:data:`SECRET_PARAMETERS`: percent-decoded (again while that changes anything: a name escaped
twice is the name itself to a parser that decodes twice), ``+`` read as a space, NFKC, case
folded, with every space, control, format and separator character taken out. So
``ACCESS_TOKEN``, ``access_token%00``, ``access_token%20``, ``access%5Ftoken`` and
``Access_Token+`` are all ``access_token``. Tornado reads only the exact name (it decodes once
and strips nothing from a name); other parsers and proxies differ, and a client that sent its
token under such a name has put it in the URL all the same.

A value is withheld too when it holds what the service's secrets look like
(:data:`SECRET_SHAPED`), whatever its parameter's name: tokens, codes, client secrets and
session ids are 43 characters of base64url, a refresh token two of them joined by a dot, and a
PKCE verifier 43 or more unreserved characters. An identifier that long is withheld with them;
nothing a log is read for is lost with it.

Only the standard library: the service's logs and the resource library both use it.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import unquote_plus

# Request parameters whose values are secrets (RFC 6749, 6750, 7009, 7636, 7662; the sign-in
# form): never written to a log line.
SECRET_PARAMETERS = frozenset({"token", "access_token", "code", "refresh_token", "client_secret",
                               "code_verifier", "confirmation_code", "password", "state"})
MAX_DECODINGS = 4  # a name decoded this many times at most (each pass shortens it)
# 43 or more characters of the base64url alphabet in a row: a secret the service issued, or a
# PKCE verifier (secrets.token_urlsafe), wherever it stands in a value.
SECRET_SHAPED = re.compile(r"[A-Za-z0-9_-]{43,}")
_PLAIN_NAME = re.compile(r"[a-z0-9_]*")  # a name that reads as itself: nothing to decode, fold or take out


def name_key(name: str) -> str:
    """``name`` as any parser may read it: decoded, folded, and without the characters a parser
    or a person's eye passes over (see the module's docstring)."""
    if _PLAIN_NAME.fullmatch(name):
        return name
    for _ in range(MAX_DECODINGS):
        decoded = unquote_plus(name)
        if decoded == name:
            break
        name = decoded
    folded = unicodedata.normalize("NFKC", name).casefold()
    return "".join(char for char in folded if not (char.isspace() or unicodedata.category(char)[0] in "CZ"))


def secret_name(name: str) -> bool:
    """Whether a parameter named ``name`` carries a secret, however the name was written."""
    return name in SECRET_PARAMETERS or name_key(name) in SECRET_PARAMETERS


def secret_shaped(value: str) -> bool:
    """Whether ``value`` holds something shaped like one of the service's secrets."""
    return SECRET_SHAPED.search(value) is not None


def decoded(value: str) -> str:
    """``value`` percent-decoded (``+`` a space) until that changes nothing, at most
    :data:`MAX_DECODINGS` times: what a secret in it may have been written as."""
    for _ in range(MAX_DECODINGS):
        once = unquote_plus(value)
        if once == value:
            break
        value = once
    return value
