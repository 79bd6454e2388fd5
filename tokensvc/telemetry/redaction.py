"""What a log line may hold of a request's parameters: the one rule of which carry secrets.

A parameter carries a secret when its name, read the way any parser might read it, is one of
:data:`SECRET_PARAMETERS`: percent-decoded (again while that changes anything: a name escaped
twice is the name itself to a parser that decodes twice), ``+`` read as a space, its bytes read
as UTF-8 with what is not UTF-8 dropped, NFKC, case folded, with every space, control, format,
separator, default-ignorable or blank-rendering character taken out (U+034F, U+FE0F, the Hangul
fillers, the braille blank), and ``.``, ``-``, ``+`` and ``_`` taken out too (PHP reads ``.``
and a space as ``_``). Each part of an array name counts as a name of its own: PHP and Rack read
``access_token[]`` and ``x[access_token]`` as carrying ``access_token``. So ``ACCESS_TOKEN``,
``access_token%00``, ``access.token``, ``access-token``, ``access%FFtoken``, ``access_token[0]``
and ``Access_Token+`` are all ``access_token``. Tornado reads only the exact name (it decodes once
and strips nothing from a name); other parsers and proxies differ, and a client that sent its
token under such a name has put it in the URL all the same. A harmless name that reads as a
secret's (``accesstoken``, ``co.de``) has its value withheld as well.

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
from collections.abc import Iterator
from urllib.parse import unquote_plus, unquote_to_bytes

# Request parameters whose values are secrets (RFC 6749, 6750, 7009, 7636, 7662; the sign-in
# form): never written to a log line.
SECRET_PARAMETERS = frozenset({"token", "access_token", "code", "refresh_token", "client_secret",
                               "code_verifier", "confirmation_code", "password", "state"})
MAX_DECODINGS = 4  # a name decoded this many times at most (each pass shortens it)
# 43 or more characters of the base64url alphabet in a row: a secret the service issued, or a
# PKCE verifier (secrets.token_urlsafe), wherever it stands in a value.
SECRET_SHAPED = re.compile(r"[A-Za-z0-9_-]{43,}")
_PLAIN_NAME = re.compile(r"[a-z0-9_]*")  # a name that reads as itself but for its "_": nothing to decode or fold
# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt), which renders as nothing,
# with the characters that render blank besides (the braille blank) and U+FFFD, what a decoder
# puts in the place of bytes that are not UTF-8.
_IGNORABLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
                        "\u2060-\u206f\u2800\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\ufffd"
                        "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]")
_PUNCTUATION = frozenset("._-+ ")  # what a parser reads as "_" (PHP: "." and " "), and "_" itself
_ARRAY = re.compile(r"[\[\]]")  # a[b][c]: each part a name


def _decoded_name(name: str | bytes) -> str:
    """``name`` percent-decoded (``+`` a space) while that changes it, its bytes read as UTF-8
    with what is not UTF-8 dropped."""
    text = name.decode("utf-8", "ignore") if isinstance(name, bytes) else name
    for _ in range(MAX_DECODINGS):
        once = unquote_to_bytes(text.replace("+", " ").encode("utf-8", "surrogatepass")).decode("utf-8", "ignore")
        if once == text:
            break
        text = once
    return text


def _key(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(char for char in folded if not (char in _PUNCTUATION or char.isspace()
                                                   or unicodedata.category(char)[0] in "CZ"
                                                   or _IGNORABLE.match(char)))


def name_key(name: str) -> str:
    """``name`` as any parser may read it: decoded, folded, and without the characters a parser
    or a person's eye passes over, nor ``.``, ``-``, ``+`` and ``_`` (see the module's
    docstring). ``access_token`` and ``access.token`` are both ``accesstoken``."""
    if _PLAIN_NAME.fullmatch(name):
        return name.replace("_", "")
    return _key(_decoded_name(name))


def name_keys(name: str) -> Iterator[str]:
    """The keys (:func:`name_key`) of ``name`` and of each part of it an array name holds
    (``a[b][c]``: ``a``, ``b`` and ``c``); for a name of Latin-1 characters, also of its bytes
    read as UTF-8 (what Tornado makes of raw bytes in a request line)."""
    if _PLAIN_NAME.fullmatch(name):
        yield name.replace("_", "")
        return
    readings = [_decoded_name(name)]
    if not name.isascii() and max(name) <= "\xff":
        readings.append(_decoded_name(name.encode("latin-1")))
    for reading in readings:
        folded = unicodedata.normalize("NFKC", reading)
        yield _key(folded)
        if _ARRAY.search(folded):
            yield from (_key(part) for part in _ARRAY.split(folded))


_SECRET_KEYS = frozenset(name_key(name) for name in SECRET_PARAMETERS)


def secret_name(name: str) -> bool:
    """Whether a parameter named ``name`` carries a secret, however the name was written."""
    return name in SECRET_PARAMETERS or any(key in _SECRET_KEYS for key in name_keys(name))


def names(name: str, parameter: str) -> bool:
    """Whether a parameter named ``name`` is ``parameter`` (one of :data:`SECRET_PARAMETERS`) to
    some parser, however the name was written (:func:`name_keys`)."""
    return name == parameter or name_key(parameter) in name_keys(name)


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
