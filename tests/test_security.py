"""RFC 9700 checklist items that no other module holds, and malformed input."""

import hmac

import pytest
from helpers import CHALLENGE, VERIFIER, WEBAPP_REDIRECT, WEBAPP_SECRET, basic, check_oauth_error, json_of

from tokensvc.oauth import hashing, pkce


def test_secrets_are_compared_in_constant_time(monkeypatch):
    calls = []
    original = hmac.compare_digest

    def spy(a, b):
        calls.append((type(a), type(b)))
        return original(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert hashing.matches(WEBAPP_SECRET, hashing.digest(WEBAPP_SECRET))
    assert not hashing.matches("wrong", hashing.digest(WEBAPP_SECRET))
    assert pkce.verify(VERIFIER, CHALLENGE)
    assert hashing.verify_password("alice-password", hashing.hash_password("alice-password"))
    assert len(calls) == 4


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
