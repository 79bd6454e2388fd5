"""A parameter carrying a secret is withheld from every log line however its name is written:
in any case, percent-encoded (once or twice), with NUL, spaces, controls or invisible characters
in it, with bytes that are not UTF-8, with ``.``, ``-`` or ``+`` for its ``_``, or as an array
name (``access_token[]``, ``x[access_token]``); and a value shaped like a secret of the service
is withheld whatever its name. The access line, the line of an unexpected fault, Tornado's own
lines and the resource library's masked query each follow the one rule (``tokensvc.telemetry.redaction``);
the variants attack reviews found first, then names fuzzed."""

from __future__ import annotations

import logging
import secrets
import unicodedata
from urllib.parse import quote, unquote_to_bytes

import pytest
from helpers import WEBAPP_REDIRECT, exchange, json_of
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tokensvc.handlers.edge.access_log import redact
from tokensvc.resource.bearer import masked_query
from tokensvc.telemetry import logs

SECRET_NAMES = ("token", "access_token", "code", "refresh_token", "client_secret", "code_verifier", "password",
                "state")
VALUE = "SECRET-VALUE-9"  # shaped like nothing: only its name can withhold it
# What the review found written to the access log in the clear, and their kin.
VARIANTS = ["ACCESS_TOKEN", "access_token%00", "access_token%20", "Access_Token", "access%5Ftoken", "access_token+",
            "%00access_token", "access%2500_token", "%2561ccess_token", "access_token%E2%80%8B", "access_token%C2%A0",
            quote("ａｃｃｅｓｓ_token"), "Refresh_Token%09", "CODE", "Client_Secret%00", "PASSWORD", "sTaTe%20",
            "code_verifier%0D%0A", "TOKEN",
            # The second review: array names (PHP, Rack), what PHP reads as "_", characters that
            # render as nothing outside categories C and Z, bytes that are not UTF-8.
            "access_token[]", "access_token[0]", "access_token%5B%5D", "x[access_token]", "access.token",
            "access%20token", "access+token", "access-token", "access%CD%8Ftoken", "access_token%EF%B8%8F",
            "access%E3%85%A4token", "access%EF%BE%A0token", "access%E1%85%9Ftoken", "access%E2%A0%80token",
            "access%FFtoken", "access%ED%A0%80token", "Refresh.Token", "client-secret[]", "x[0][code]", "co%FFde",
            "pass%E2%A0%80word", "sta%CD%8Fte"]
SECRET_KEYS = {name.replace("_", "") for name in SECRET_NAMES}
# Characters that render as nothing or blank outside categories C and Z (a sample of Unicode's
# Default_Ignorable_Code_Point, the Hangul fillers, the braille blank) and what a decoder puts
# for bytes that are not UTF-8.
BLANK = set("\u034f\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0\ufffd") | {chr(c) for c in range(0xFE00, 0xFE10)}


def read_as_any_parser_may(name: str) -> set[str]:
    """The rule, written out here apart from the service's: decoded while that changes it (bytes
    not UTF-8 dropped), NFKC, case folded, every space, control, format, separator and blank
    character taken out, and "." "-" "+" "_"; the whole name and each part of an array name."""
    for _ in range(4):
        decoded = unquote_to_bytes(name.replace("+", " ")).decode("utf-8", "ignore")
        if decoded == name:
            break
        name = decoded
    folded = unicodedata.normalize("NFKC", name).casefold()
    parts = [folded, *folded.replace("]", "[").split("[")]
    return {"".join(char for char in part if not (char.isspace() or unicodedata.category(char)[0] in "CZ"
                                                  or char in BLANK or char in "._-+"))
            for part in parts}


def is_secret(name: str) -> bool:
    return bool(read_as_any_parser_may(name) & SECRET_KEYS)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_names_the_review_found_are_withheld_in_every_line(name):
    assert is_secret(name)  # each is a spelling of one
    uri = f"/v1/me?x=1&{name}={VALUE}&y=2"
    for line in (redact(uri), logs.withhold_client_input(f"GET {uri} (127.0.0.1)")):
        assert VALUE not in line and "x=1" in line and "y=2" in line, line
    nested = "/login?next=" + quote(f"/oauth/authorize?client_id=w&{name}={VALUE}", safe="")
    assert VALUE not in redact(nested) and "client_id%3Dw" in redact(nested)
    assert VALUE not in logs.withhold_client_input(f"GET {nested} (127.0.0.1)")


@pytest.mark.parametrize("name", [name for name in VARIANTS if "accesstoken" in read_as_any_parser_may(name)])
def test_the_resource_library_masks_its_token_however_its_name_is_written(name):
    assert masked_query(f"x=a%2Fb&{name}={VALUE}&flag") == "x=a%2Fb&access_token=***&flag"


def test_the_resource_library_keeps_its_applications_code_and_state():
    """The application's own OAuth callback parameters, however written, are kept: only
    ``access_token`` is masked."""
    query = f"code=c0de&state=st4te&Code%FF=1&x[state]=2&co.de=3&access.token={VALUE}"
    assert masked_query(query) == "code=c0de&state=st4te&Code%FF=1&x[state]=2&co.de=3&access_token=***"


@pytest.mark.parametrize("name", ["access\u034ftoken", "access\u2800token", "x[access\u3164token]",
                                  "access\u00cd\u008ftoken", "access\u00ff_token", "ａｃｃｅｓｓ_token［］"])
def test_a_name_with_characters_beyond_ascii_is_withheld_in_every_line(name):
    """A name written with the characters themselves, not escaped; also as Tornado reads raw
    bytes in a request line (Latin-1: ``\u00cd\u008f`` is U+034F's UTF-8)."""
    uri = f"/v1/me?x=1&{name}={VALUE}&y=2"
    for line in (redact(uri), logs.withhold_client_input(f"GET {uri} (127.0.0.1)")):
        assert VALUE not in line and "x=1" in line and "y=2" in line, line
    assert masked_query(uri.partition("?")[2]) == "x=1&access_token=***&y=2"


# Ways a character of a name may be written in a query, and what may stand between them.
def written(char: str) -> st.SearchStrategy[str]:
    encoded = "".join(f"%{byte:02X}" for byte in char.encode())
    ways = [char, char.upper(), encoded, encoded.lower(), encoded.replace("%", "%25")]
    if char == "_":  # what a parser reads as "_", or nothing
        ways += [".", "-", "+", "%20", "%2E", "%2D", ""]
    return st.sampled_from(ways)


JUNK = st.sampled_from(["", "", "", "%00", "%20", "+", "%09", "%0A", "%1F", "%7F", "%C2%85", "%E2%80%8B", "%C2%A0",
                        "%E2%80%A8", "%EF%BB%BF", "%2500", "%252B", "%CD%8F", "%EF%B8%8F", "%E3%85%A4", "%EF%BE%A0",
                        "%E1%85%9F", "%E2%A0%80", "%FF", "%ED%A0%80", "%25FF", ".", "-", "%2E"])
ARRAY = st.sampled_from(["{}", "{}", "{}[]", "{}[0]", "{}%5B%5D", "x[{}]", "x%5B{}%5D", "x[{}][y]", "{}%255B%255D"])


@st.composite
def spellings(draw: st.DrawFn, names: tuple[str, ...] = SECRET_NAMES) -> str:
    name = draw(st.sampled_from(names))
    return draw(ARRAY).format(draw(JUNK) + "".join(draw(written(char)) + draw(JUNK) for char in name))


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(spellings())
@example("ACCESS_TOKEN")
@example("access_token%00")
@example("access_token%20")
@example("access.token[]")
@example("x[access%FFtoken]")
def test_a_fuzzed_spelling_of_a_secrets_name_is_withheld_everywhere(name):
    assert is_secret(name)
    uri = f"/cb?keep=1&{name}={VALUE}&also=2"
    for line in (redact(uri), logs.withhold_client_input(f"GET {uri} (127.0.0.1)")):
        assert VALUE not in line and "keep=1" in line and "also=2" in line, (name, line)


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(spellings(("access_token",)))
def test_a_fuzzed_spelling_of_access_token_is_masked_by_the_resource_library(name):
    assert masked_query(f"keep=1&{name}={VALUE}") == "keep=1&access_token=***"


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.~-", min_size=1,
               max_size=24).filter(lambda name: not is_secret(name)))
def test_any_other_name_keeps_its_value_as_it_came(name):
    uri = f"/cb?{name}={VALUE}&scope=read+write&redirect_uri=https%3A%2F%2Fapp.example%2Fcb"
    assert redact(uri) == uri
    assert logs.withhold_client_input(f"GET {uri}") == f"GET {uri}"
    assert masked_query(uri.partition("?")[2]) == uri.partition("?")[2]


def test_a_value_shaped_like_a_secret_is_withheld_whatever_its_name():
    """Tokens, codes, client secrets, session ids: 43 characters of base64url; a refresh token two
    of them with a dot; a PKCE verifier 43 or more. Under a name no rule knows, they are withheld
    all the same; shorter values and what a URL holds besides are kept."""
    token = secrets.token_urlsafe(32)
    for value in (token, f"{token}.{secrets.token_urlsafe(32)}", secrets.token_urlsafe(96), quote(f"Bearer {token}")):
        uri = f"/v1/me?t={value}&scope=read"
        for line in (redact(uri), logs.withhold_client_input(f"GET {uri} (127.0.0.1)")):
            assert token[:20] not in line and value not in line and "scope=read" in line, line
    kept = "/oauth/authorize?client_id=webapp&redirect_uri=https%3A%2F%2Fapp.example%2Fcb&scope=read+write&x=" + \
        "a" * 42
    assert redact(kept) == kept


# -- through the service -------------------------------------------------------------------------


@pytest.mark.gen_test
async def test_no_spelling_of_a_token_parameter_reaches_the_access_or_error_lines(browser, http_client, base_url,
                                                                                caplog, monkeypatch):
    """A real access token sent under every variant name, to the API, the socket's route,
    revocation and a page that fails: the access lines and the fault's line name the request
    without it (and `/oauth/revoke` still 200)."""
    from tokensvc.handlers import pages

    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    access = json_of(await exchange(http_client, base_url, code))["access_token"]

    async def broken(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(pages.HomeHandler, "get", broken)
    with caplog.at_level(logging.DEBUG):
        for name in VARIANTS:
            await http_client.fetch(f"{base_url}/v1/me?{name}={access}", raise_error=False)
            await http_client.fetch(f"{base_url}/v1/ws?{name}={access}", raise_error=False)
            revoked = await http_client.fetch(f"{base_url}/oauth/revoke?{name}={access}", method="POST", body="")
            assert revoked.code == 200
            assert (await http_client.fetch(f"{base_url}/?{name}={access}", raise_error=False)).code == 500
    text = "\n".join(f"{r.getMessage()} {getattr(r, 'access', '')}" for r in caplog.records)
    assert access not in text and access[:20] not in text
    assert text.count("Uncaught exception GET /?") == len(VARIANTS)
