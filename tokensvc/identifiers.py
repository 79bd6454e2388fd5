"""What an id, a username, a scope, an installation kind, a redirect URI and a URL may look
like: one definition, with one message each, shared by the config loader, the operator
commands and the request schemas."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
import unicodedata
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

# Client and installation ids: the unreserved characters of RFC 3986, at most 128. An id and a
# username are each a path segment of the APIs, so never a dot segment ("." or ".."), which
# clients remove from a URL's path (RFC 3986 §5.2.4) before it is sent.
NOT_A_DOT_SEGMENT = r"(?!\.\.?$)"
ID_CHARS = re.compile(rf"^{NOT_A_DOT_SEGMENT}[A-Za-z0-9._~-]+$")  # the characters alone (the length apart)
ID = re.compile(rf"^{NOT_A_DOT_SEGMENT}[A-Za-z0-9._~-]{{1,128}}$")
USERNAME = re.compile(rf"^{NOT_A_DOT_SEGMENT}[A-Za-z0-9._@-]{{1,64}}$")
MIN_PASSWORD_LENGTH = 8
MIN_PASSWORD_SCORE = 3  # zxcvbn's 0-4: 3 is "safely unguessable" against an online attack
ZXCVBN_MAX_LENGTH = 72  # what zxcvbn rates; a longer password is rated by its start
ID_RULE = "1-128 characters of [A-Za-z0-9._~-], not . or .."
USERNAME_RULE = "1-64 characters of [A-Za-z0-9._@-], not . or .."
# What a node installation may be, unless the config's installation_kinds says otherwise.
DEFAULT_KINDS = ("telescope", "observatory")
KIND = re.compile(r"^[a-z][a-z0-9 -]{0,31}$")
KIND_RULE = "1-32 characters of lower-case letters, digits, spaces and '-', starting with a letter"
# A password hash as the service stores it (hashing.hash_password): scrypt$N$r$p$salt$key.
PASSWORD_HASH = re.compile(r"^scrypt\$[0-9]{1,8}\$[0-9]{1,3}\$[0-9]{1,3}\$[A-Za-z0-9+/]+={0,2}\$[A-Za-z0-9+/]+={0,2}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
EMPTY_SECRET_SHA256 = hashlib.sha256(b"").hexdigest()
# RFC 6749 §3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E )
SCOPE_TOKEN = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]+$")
# A client's or an installation's name: no control character, and something that is not a space
# (the characters Python's str.strip and JavaScript's \s take for one, named: the OpenAPI
# document states this very pattern).
NAME = re.compile(r"^[^\x00-\x1f\x7f-\x9f]*[^\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
                  r"[^\x00-\x1f\x7f-\x9f]*$")
NAME_RULE = "printable characters, not only spaces"
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1

# The URIs an operator registers, each a regular expression that the OpenAPI document states
# as it is, for every scheme alike: RFC 3986's characters (a name in another script is written
# as its punycode), a lowercase scheme, a host of letters, digits, dots and hyphens without user
# info, a port 1-65535. A private-use scheme's URI either names an authority
# (``myapp://host/cb``) or has a path that does not start with ``//`` (``com.example.app:/cb``),
# so an authority is never read as a path. Each rule's function checks its named faults first
# (for their messages), then the expression.
URI_RULE = ("RFC 3986 characters only, a lowercase scheme, a host of letters, digits, dots and hyphens without "
            "user info, a port 1-65535")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LOOPBACK = rf"(?:localhost|127\.{_OCTET}\.{_OCTET}\.{_OCTET}|\[::1\])"
_HOST = r"[A-Za-z0-9.-]+"
_PORT = r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?"
_PATH = r"[A-Za-z0-9._~!$&'()*+,;=:@%/-]*"
_QUERY = r"(?:\?[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*)?"
_NEVER = "https?|javascript|data|file|vbscript|blob|about|filesystem"
REDIRECT_URI = re.compile(
    rf"^(?:https://{_HOST}{_PORT}(?:/{_PATH})?{_QUERY}"
    rf"|http://{_LOOPBACK}{_PORT}(?:/{_PATH})?{_QUERY}"
    rf"|(?!(?:{_NEVER}):)[a-z][a-z0-9+.-]*:(?://[A-Za-z0-9._~!$&'()*+,;=%-]*{_PORT}(?:/{_PATH})?|(?!//){_PATH})"
    rf"{_QUERY})$")
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"  # RFC 1123 §2.1, lower case
ORIGIN = re.compile(rf"^(?:https://{_LABEL}(?:\.{_LABEL})*(?!:443$)|http://{_LOOPBACK}(?!:80$)){_PORT}$")
ORIGIN_MAX_LENGTH = 261  # https:// and a host name of at most 253 characters, or with a port a shorter one
WEB_URL = re.compile(rf"^https?://{_HOST}{_PORT}(?:/{_PATH})?{_QUERY}$")
# A logo as the configuration and the admin API take it: a web URL, or a path this service
# serves (made a web URL at auth_url by served_here).
LOGO = re.compile(rf"^(?:https?://{_HOST}{_PORT}(?:/{_PATH})?|/(?!/){_PATH}){_QUERY}$")


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a client or installation id, or None when it can."""
    return None if ID.fullmatch(value) else ID_RULE


def username_problem(value: str) -> str | None:
    return None if USERNAME.fullmatch(value) else USERNAME_RULE


def username_key(value: str) -> str:
    """What makes two usernames the same one: NFKC, then case folded (Unicode's caseless
    match, UAX #15 and §3.13), so ``ROOT`` is ``root``. A new user is stored under this form."""
    return unicodedata.normalize("NFKC", value).casefold()


def name_problem(value: str) -> str | None:
    return None if NAME.fullmatch(value) else NAME_RULE


def kind_problem(value: str, kinds: Sequence[str] = DEFAULT_KINDS) -> str | None:
    """Why ``value`` cannot be an installation's kind (one of ``kinds``, the configured ones)."""
    return None if value in kinds else f"one of {', '.join(kinds)}"


def password_hash_problem(value: str) -> str | None:
    """Why ``value`` cannot be a stored password hash (``scrypt$N$r$p$salt$key``, what
    ``tokensvc`` itself writes), or None when it can."""
    return None if PASSWORD_HASH.fullmatch(value) else "a scrypt hash as tokensvc stores it (scrypt$N$r$p$salt$key)"


def secret_sha256_problem(value: str) -> str | None:
    """Why ``value`` cannot be a client secret's SHA-256 (64 lower-case hex digits, and not the
    digest of an empty secret, which would let any client prove itself with none)."""
    if not SHA256_HEX.fullmatch(value):
        return "64 lower-case hex digits (the SHA-256 of the secret)"
    return "the SHA-256 of a secret that is not empty" if value == EMPTY_SECRET_SHA256 else None


# The one length rule of every secret given by hand: a cookie_secret key, a successor key, a
# client_secret (the configuration, `config check`, `apply`). A generated one is longer
# (secrets.token_urlsafe(32): 43 characters); the admin API takes a secret only as its digest.
MIN_SECRET_LENGTH = 32
MAKE_A_SECRET = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


def secret_problem(value: str, *, demo: bool = False) -> str | None:
    """Why ``value`` cannot be a secret given by hand: empty or blank (an unset variable), or,
    outside demo mode, shorter than :data:`MIN_SECRET_LENGTH` (every visitor holds a cookie
    signed with the cookie secret, on which a guess is tested offline; a client secret is
    guessed online, and a short one keeps the failure limits on its right answers)."""
    if not value.strip():
        return "a secret that is not empty or blank"
    if len(value) < MIN_SECRET_LENGTH and not demo:
        return f"a secret of at least {MIN_SECRET_LENGTH} characters, not {len(value)} ({MAKE_A_SECRET})"
    return None


def scope_problem(value: str) -> str | None:
    """Why ``value`` cannot be a scope (RFC 6749 §3.3), or None when it can."""
    return None if SCOPE_TOKEN.fullmatch(value) else "a scope is printable ASCII without spaces, quotes or backslashes"


def password_problem(password: str, context: Sequence[str] = ()) -> str | None:
    """Why ``password`` cannot be a user's password (``users add``, ``users set-password`` and
    the config's ``[[users]]`` alike), or None when it can.

    NIST SP 800-63B §5.1.1.2: at least 8 characters, any characters, no composition rule, and
    not one that is common, breached or built from context words (``context``: the username,
    the service's name, and each of their parts: :func:`context_words`). A password that holds
    a context word of 3 letters or more, forwards or reversed (``lorac``), is refused outright,
    compared as they read (:func:`_readings`): whatever their case, accents, separators or
    digits between the letters (``tokensvc-carol``, ``carol_tokensvc_2026``,
    ``ćarol-tókensvc-99``), digits and signs written for letters (``c4rol-t0kensvc``, a
    username ``r00t`` in ``r00t-granite-harbor``), letters of another script that look the same
    (a Cyrillic ``с`` for ``c``), or Latin letters written otherwise (small capitals
    ``ᴄᴀʀᴏʟ``, a stroke ``cⱥrøl``). The rest is rated by zxcvbn against its frequency lists of
    common passwords, words and names and against those words, and anything it scores below 3
    of 4 is refused, with its own reason.
    """
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"a password needs at least {MIN_PASSWORD_LENGTH} characters"
    held = _readings(password)
    words = [part for word in context for part in context_words(word)]
    for word in words:
        if any(len(reading) >= MIN_CONTEXT_LETTERS and any(reading in text or reading[::-1] in text for text in held)
               for reading in _readings(word)):
            return ("this password is too easy to guess (it holds the username or the service's name); "
                    "use a few unrelated words")
    from zxcvbn import zxcvbn  # its lists take a moment to load: only where a password is set

    rating = zxcvbn(password[:ZXCVBN_MAX_LENGTH], user_inputs=[word for word in (*context, *words) if word])
    if rating["score"] < MIN_PASSWORD_SCORE:
        why = (rating["feedback"]["warning"] or "it is common or built from a name").rstrip(".")
        return f"this password is too easy to guess ({why[0].lower() + why[1:]}); use a few unrelated words"
    return None


MIN_CONTEXT_LETTERS = 3  # a shorter context word ("al") is part of too many words to refuse
_PARTS = re.compile(r"[._@+-]+")  # what separates the parts of a username (and of a service's name)


def context_words(word: str) -> list[str]:
    """``word`` and the parts it is made of, as a person's name is made of names: the parts of
    a username before its last ``@`` (``dora.smith`` is ``dora`` and ``smith``; the domain of an
    address names no one), each part of the service's name."""
    local = word.rpartition("@")[0] or word
    parts = [part for part in _PARTS.split(local) if part]
    return [word, *parts] if len(parts) > 1 or local != word else [word]


# Letters of other scripts that look like Latin ones (a few of Unicode's confusables, those a
# keyboard layout offers), and digits and signs written for letters: what a password compared
# with a word is read as. i, l, 1, | and ! are one letter here, as they are to the eye.
_LOOK_ALIKE = str.maketrans({
    "а": "a", "в": "b", "с": "c", "е": "e", "һ": "h", "і": "i", "ј": "j", "к": "k", "м": "m", "н": "h",
    "о": "o", "р": "p", "ѕ": "s", "т": "t", "х": "x", "у": "y", "ԁ": "d", "ԛ": "q", "ԝ": "w",  # Cyrillic
    "α": "a", "β": "b", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u",
    "χ": "x", "γ": "y",  # Greek
    "ı": "i", "ɡ": "g", "ℓ": "l", "l": "i",
})
# Latin letters written otherwise, which no decomposition takes back to the letter: small
# capitals (ᴄᴀʀᴏʟ), letters with a stroke or a bar (ø, đ), dotless, script, turned and reversed
# forms. Found by their Unicode names, in the blocks that hold them, and read as that letter.
_LATIN_FORM = re.compile(r"LATIN (?:SMALL |CAPITAL )?LETTER (?:SMALL CAPITAL |DOTLESS |SCRIPT |TURNED |REVERSED )?"
                         r"([A-Z])(?: WITH .+)?")
_LATIN_BLOCKS = ((0x00C0, 0x024F), (0x0250, 0x02AF), (0x1D00, 0x1DBF), (0x1E00, 0x1EFF), (0x2C60, 0x2C7F),
                 (0xA720, 0xA7FF), (0xAB30, 0xAB6F), (0x10780, 0x107BF), (0x1DF00, 0x1DFFF))


def _latin_forms() -> dict[int, str]:
    forms = {}
    for first, last in _LATIN_BLOCKS:
        for code in range(first, last + 1):
            found = _LATIN_FORM.fullmatch(unicodedata.name(chr(code), ""))
            if found:  # then read as that letter is read (an l as an i)
                forms[code] = found.group(1).lower().translate(_LOOK_ALIKE)
    return forms


@functools.cache
def _look_alike() -> dict[int, str]:
    """The whole table, made when a password is first compared (not at every import)."""
    return {**_latin_forms(), **_LOOK_ALIKE}
_FOR_LETTERS = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "9": "g",
                              "@": "a", "$": "s", "!": "i", "|": "i", "+": "t"})


def _readings(text: str) -> tuple[str, str]:
    """How a password or a context word reads, as its letters alone: case folded (NFKC), accents
    taken off (NFKD without the combining marks), letters of other scripts that look like Latin
    ones read as those; then once with digits and signs read as the letters they stand for
    (``c4r0l``: ``carol``), once with them set aside (``car2ol``: ``carol``)."""
    plain = "".join(char for char in unicodedata.normalize("NFKD", username_key(text))
                    if not unicodedata.combining(char)).translate(_look_alike())
    return (_letters(plain.translate(_FOR_LETTERS)), _letters(plain))


def _letters(text: str) -> str:
    return "".join(char for char in text if char.isalpha())


NEVER_REDIRECT_SCHEMES = frozenset({"javascript", "data", "file", "vbscript", "blob", "about", "filesystem"})
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


def redirect_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a registered redirect URI, or None when it can.

    https; http only to a loopback host (RFC 8252 §7.3, §8.3); or a private-use scheme for a
    native app (RFC 8252 §7.1). Absolute, without a fragment (RFC 6749 §3.1.2). Schemes that
    run or read something in the browser are never one. Whatever the scheme, the URI is then
    held to :data:`REDIRECT_URI` (no user info, a port 1-65535, RFC 3986's characters).
    """
    try:
        parts = urlsplit(uri)
        host = parts.hostname
    except ValueError:
        return "not a URI"
    scheme = parts.scheme.lower()
    if not scheme or not _SCHEME.fullmatch(parts.scheme) or any(ch.isspace() for ch in uri) or CONTROL.search(uri):
        return "an absolute URI is required"
    if parts.fragment or "#" in uri:
        return "a fragment is not allowed (RFC 6749 §3.1.2)"
    if scheme in NEVER_REDIRECT_SCHEMES:
        return f"the {scheme}: scheme is never a redirect target"
    if scheme == "https" and not host:
        return "an https URI needs a host"
    if scheme == "http" and not is_loopback(host):
        return "http only to a loopback host (127.0.0.1, [::1], localhost); use https"
    if "@" in parts.netloc:
        return "no user info before the host"
    if not REDIRECT_URI.fullmatch(uri):
        return URI_RULE
    return None


def served_here(uri: str, auth_url: str) -> str:
    """A logo given as a path (``/static/app.svg``), as the configuration and the admin API
    alike take one: the URL this service serves it at (``auth_url`` + path), which is what a
    client holds; anything else as it is, for :func:`logo_url_problem` to judge."""
    return auth_url + uri if uri.startswith("/") and not uri.startswith("//") else uri


def logo_url_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a client's logo URL (the configuration, the command line, the
    admin API and ``apply`` alike), or None when it can: an absolute http(s) URL with a host,
    held to :data:`WEB_URL`."""
    if not is_url(uri):
        return "an absolute http(s) URL with a host"
    if not WEB_URL.fullmatch(uri):
        return URI_RULE
    return None


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is reached from this machine alone (localhost, 127.0.0.0/8, ::1)."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


RESOURCE_MAX_LENGTH = 2048
RESOURCE_URI_RULE = "an absolute URI (scheme://host/...), no fragment, no spaces (RFC 8707 section 2)"


def resource_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a resource indicator (RFC 8707 §2: an absolute URI without a
    fragment), as a request names one or a resource server declares it, or None."""
    if len(uri) > RESOURCE_MAX_LENGTH:
        return f"at most {RESOURCE_MAX_LENGTH} characters"
    if any(ord(char) <= 0x20 or ord(char) == 0x7F for char in uri):
        return "no spaces or control characters"
    if "#" in uri:
        return "no fragment"
    try:
        parts = urlsplit(uri)
    except ValueError:
        return RESOURCE_URI_RULE
    if not parts.scheme or not parts.netloc or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", parts.scheme):
        return RESOURCE_URI_RULE
    return None


OWN_RESOURCE_PATH = "/v1"  # tokensvc's own API, a resource at base_url + /v1 (RFC 8707)


def own_resource(base_url: str) -> str:
    """tokensvc's own API as a resource (RFC 8707): ``base_url`` + ``/v1``."""
    return base_url.rstrip("/") + OWN_RESOURCE_PATH


def resource_key(uri: str) -> str:
    """The canonical form of a resource URI (:func:`canonical_resource`), user info left out:
    what two URIs a store written before the rule holds are compared by. ``uri`` has passed
    :func:`resource_uri_problem`."""
    return canonical_resource(uri)[0]


def declared_resource_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a resource URI a resource server declares, or None when it can: a
    resource indicator (:func:`resource_uri_problem`) written in its canonical form alone
    (:func:`canonical_resource`), so that every writer, the store's unique index, introspection
    and the verifier compare URIs by comparing strings. The message names the form to write."""
    why = resource_uri_problem(uri)
    if why is not None:
        return why
    canonical, why = canonical_resource(uri)
    if why is not None:
        return why
    return None if canonical == uri else f"write it in canonical form: {canonical}"


_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_ENCODED = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = re.compile(r"[A-Za-z0-9._~-]")
_HOST_NAME = re.compile(r"[a-z0-9._~-]+")
_IP_LITERAL = re.compile(r"\[[0-9a-f:.]+\]")


def canonical_resource(uri: str) -> tuple[str, str | None]:
    """``uri`` in the canonical form of RFC 3986 §6.2.2-6.2.3, and why it cannot be declared
    (None when it can be, once written so). The scheme and the host in lower case, the host
    without a trailing dot, the port without leading zeros and left out when it is the scheme's
    default, an empty path for ``/`` (http and https), percent-encoded unreserved characters
    decoded and the others' hex in upper case, dot segments removed (§5.2.4). The path's case
    is kept, as it is significant; a host name is never resolved. User info is refused (and
    left out of the form). ``uri`` has passed :func:`resource_uri_problem`."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    userinfo, at, hostport = parts.netloc.rpartition("@")
    why = "no user info before the host" if at else None
    if hostport.startswith("["):
        host, _, rest = hostport.partition("]")
        host, port = host + "]", rest[1:] if rest.startswith(":") else None
        if rest and not rest.startswith(":"):
            why = why or "a host, then a port 1-65535"
    else:
        host, colon, port_text = hostport.rpartition(":")
        host, port = (host, port_text) if colon else (hostport, None)
    host = _normalized(host).lower().removesuffix(".")
    if not (_HOST_NAME.fullmatch(host) or _IP_LITERAL.fullmatch(host)) or ".." in host or host.startswith("."):
        why = why or "a host of letters, digits, dots and hyphens, or an IP address in brackets"
    if port:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            why = why or "a port 1-65535"
        elif int(port) != DEFAULT_PORTS.get(scheme):
            host += f":{int(port)}"
    path = _remove_dot_segments(_normalized(parts.path))
    if path == "/" and scheme in DEFAULT_PORTS:
        path = ""
    if _PERCENT.search(parts.path) or _PERCENT.search(parts.query):
        why = why or "a % only as the start of %XX"
    query = f"?{_normalized(parts.query)}" if parts.query or uri.endswith("?") else ""
    return f"{scheme}://{host}{path}{query}", why


def _normalized(text: str) -> str:
    """``text`` with its percent-encoded unreserved characters decoded, the others' hex in
    upper case (RFC 3986 §6.2.2.1-6.2.2.2)."""
    def one(found: re.Match[str]) -> str:
        char = chr(int(found.group(1), 16))
        return char if _UNRESERVED.fullmatch(char) else found.group().upper()
    return _ENCODED.sub(one, text)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4."""
    output: list[str] = []
    while path:
        if path.startswith("../"):
            path = path[3:]
        elif path.startswith("./") or path.startswith("/./"):
            path = path[2:]
        elif path == "/.":
            path = "/"
        elif path.startswith("/../"):
            path = path[3:]
            if output:
                output.pop()
        elif path == "/..":
            path = "/"
            if output:
                output.pop()
        elif path in (".", ".."):
            path = ""
        else:
            slash = path.find("/", 1)
            segment, path = (path, "") if slash == -1 else (path[:slash], path[slash:])
            output.append(segment)
    return "".join(output)


def resources_not_canonical(declared: Iterable[tuple[str, Sequence[str] | None]]) -> list[str]:
    """What a store written before the rule may hold (``declared``: each client's id and
    resources): each resource URI not in its canonical form, said with the client that declares
    it and the form to write. Such a URI binds tokens as it is written, until it is changed."""
    return [f"client {client_id!r} declares the resource {uri!r}, which is not in canonical form: write it as "
            f"{resource_key(uri)!r} (the admin API, tokensvc apply, the configuration file)"
            for client_id, resources in declared for uri in resources or []
            if resource_uri_problem(uri) is None and declared_resource_problem(uri) is not None]


def within_own_resource(uri: str, base_url: str) -> bool:
    """Whether ``uri`` names tokensvc's own API (``base_url`` + ``/v1``) or a URI within it,
    compared canonically: no resource server declares one, since a token meant for tokensvc
    would pass at that server too."""
    return within_resource(uri, own_resource(base_url))


def within_resource(uri: str, resource: str) -> bool:
    """Whether ``uri`` is ``resource`` or a URI within it, compared canonically."""
    own, key = resource_key(resource), resource_key(uri)
    return key == own or key.startswith(own + "/")


def origin_problem(origin: str) -> str | None:
    """Why ``origin`` cannot be a web origin a browser sends, or None when it can: written as a
    browser serializes it (``scheme://host[:port]``, lower case, no default port, nothing after
    the host), http or https, the host a DNS name of letters, digits and hyphens (an
    internationalized one in its ``xn--`` form) or an IP address; never a pattern
    (``https://*.example``), which a browser never sends and this service never expands."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return "not a URL"
    if CONTROL.search(origin) or any(ch.isspace() for ch in origin):
        return "no spaces or control characters"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "http:// or https:// and a host"
    if parts.path or parts.query or parts.fragment or "@" in parts.netloc or origin != origin.strip():
        return "scheme, host and port only, no path"
    if not _host_of_origin(parts.hostname):
        return "a host name of letters, digits, hyphens and dots, or an IP address; no wildcard"
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        return "https, or http on a loopback host"
    canonical = f"{parts.scheme}://{parts.netloc.lower()}"
    if port is not None and port == DEFAULT_PORTS[parts.scheme]:
        canonical = canonical.rsplit(":", 1)[0]
    if origin != canonical:
        return f"write it as a browser sends it: {canonical}"
    if not ORIGIN.fullmatch(origin) or len(origin) > ORIGIN_MAX_LENGTH:
        return "https and a DNS name, or http and a loopback host; a port 1-65535"
    return None


DEFAULT_PORTS = {"http": 80, "https": 443}
_DNS_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


def _host_of_origin(host: str) -> bool:
    """Whether ``host`` (as ``urlsplit`` gives it: lower case, no brackets) can be an origin's:
    an IP address, or a DNS name of LDH labels (RFC 1123 §2.1)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    return len(host) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in host.split("."))


def is_url(uri: str, schemes: tuple[str, ...] = ("http", "https")) -> bool:
    """Whether ``uri`` is an absolute URL of one of ``schemes`` with a host part, and no space
    or control character (which urlsplit would strip or drop, not refuse)."""
    if CONTROL.search(uri) or any(ch.isspace() for ch in uri):
        return False
    try:
        parts = urlsplit(uri)
    except ValueError:  # brackets that hold no IPv6 address
        return False
    return parts.scheme in schemes and bool(parts.netloc)
