"""RFC 9700 checklist items that no other module holds, and malformed input."""

import ast
import re
from pathlib import Path

import pytest
from helpers import CHALLENGE, VERIFIER, WEBAPP_REDIRECT, WEBAPP_SECRET, basic, check_oauth_error, json_of

import tokensvc
from tokensvc.oauth import hashing, pkce

# What a client presents in clear: never compared as it is (only its SHA-256, or the KDF's output).
RAW_SECRETS = re.compile(r"^(client_secret|secret|password|code_verifier|verifier|refresh_token|access_token|"
                         r"token|code|session_id|submitted|cookie|confirmation|confirmation_code|typed|shown)$")
# Comparisons that are no check of a secret, each with its reason.
NOT_CHECKS = {
    "oauth/tokens.py: SEPARATOR in token",  # the format: the separator stands at the same place in every token
    "cli/admin.py: getpass.getpass('Repeat password: ') != password",  # the operator's own two entries, at a prompt
    # The confirmation code the service drew itself (its page's form, signature verified), checked for
    # its form before the code is issued for it: what a client presents is looked up by digest.
    "oauth/authorization.py: confirmations.normalized(confirmation) != confirmation",
}


def test_no_presented_secret_is_compared_with_an_operator():
    """A secret a client presents is compared only through ``hmac.compare_digest`` (constant
    time) or after hashing: no ``==``, ``!=`` or ``in`` anywhere in the package has one as an
    operand, so no comparison can end early at the first wrong character of one."""
    package = Path(tokensvc.__file__).parent
    found = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                     for op in node.ops):
                for operand in (node.left, *node.comparators):
                    # A plain name, or an attribute (but ``exc.code`` is an error's code).
                    if isinstance(operand, ast.Name):
                        name = operand.id
                    elif isinstance(operand, ast.Attribute) and operand.attr != "code":
                        name = operand.attr
                    else:
                        continue
                    where = f"{path.relative_to(package)}: {ast.unparse(node)}"
                    if RAW_SECRETS.match(name) and where not in NOT_CHECKS:
                        found.append(where)
    assert found == []


def test_each_secret_check_refuses_a_near_miss():
    """The right value passes; one differing in its last character does not."""
    stored = hashing.digest(WEBAPP_SECRET)
    assert hashing.matches(WEBAPP_SECRET, stored) and not hashing.matches(WEBAPP_SECRET[:-1] + "x", stored)
    assert pkce.verify(VERIFIER, CHALLENGE) and not pkce.verify(VERIFIER[:-1] + "x", CHALLENGE)
    password_hash = hashing.hash_password("alice-password")
    assert hashing.verify_password("alice-password", password_hash)
    assert not hashing.verify_password("alice-passworx", password_hash)


def test_secrets_have_256_bits():
    secret = hashing.new_secret()
    assert len(secret) == 43 and len({hashing.new_secret() for _ in range(100)}) == 100


@pytest.mark.parametrize("body,content_type", [
    (b"%%%&&&===", "application/x-www-form-urlencoded"),
    (b"\xff\xfe\x00garbage", "application/x-www-form-urlencoded"),
    (b"--x\r\nContent-Disposition: form-data; name=\"code\"\r\n\r\nabc", "multipart/form-data; boundary=y"),
    (b"{not json", "application/json"),
    (b"grant_type=authorization_code&code=%E0%A4%A", "application/x-www-form-urlencoded"),
])
@pytest.mark.gen_test
async def test_malformed_bodies_are_4xx_never_500(http_client, base_url, body, content_type):
    for path in ("/oauth/token", "/oauth/token/refresh", "/oauth/token/introspect", "/oauth/token/revoke",
                 "/oauth/sign-out", "/oauth/revoke"):
        response = await http_client.fetch(base_url + path, method="POST", body=body, raise_error=False,
                                           headers={"Content-Type": content_type,
                                                    "Authorization": basic("webapp", WEBAPP_SECRET)})
        assert 200 <= response.code < 500, (path, response.code, response.body)
        assert b"Traceback" not in response.body
        json_of(response)


@pytest.mark.gen_test
async def test_state_is_returned_untouched(browser):
    await browser.login("alice")
    state = "a b+c/d=e&f?g%h\u00e9"
    response = await browser.authorize("webapp", WEBAPP_REDIRECT, state=state)
    from helpers import query_of

    assert query_of(response.headers["Location"])["state"] == state


@pytest.mark.gen_test
async def test_code_issued_with_a_challenge_cannot_be_redeemed_without_a_verifier(browser, http_client, base_url):
    from helpers import exchange

    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    check_oauth_error(await exchange(http_client, base_url, code, verifier=None), 400, "invalid_grant")
    check_oauth_error(await exchange(http_client, base_url, code), 400, "invalid_grant")  # and it is spent
