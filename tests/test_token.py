"""POST /oauth/token: the authorization-code grant with PKCE."""

import pytest
from helpers import (
    PARTNER_REDIRECT,
    PARTNER_SECRET,
    SKY_REDIRECT,
    VERIFIER,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    basic,
    check_oauth_error,
    check_schema,
    check_validation_error,
    exchange,
    json_of,
    new_verifier,
    post_form,
)

from tokensvc import schemas
from tokensvc.oauth import hashing, tokens


@pytest.fixture
def token_url(base_url):
    return base_url + "/oauth/token"


@pytest.mark.gen_test
async def test_exchange_returns_the_token_response(browser, http_client, base_url, store, config):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, scope="read write")
    response = await exchange(http_client, base_url, code)
    assert response.code == 200, response.body
    body = check_schema(schemas.token_response, json_of(response))
    assert set(body) == {"access_token", "refresh_token", "expires_in", "token_type", "scope"}
    assert body["token_type"] == "Bearer" and body["expires_in"] == 3600 and body["scope"] == "read write"
    assert response.headers["Cache-Control"] == "no-store" and response.headers["Pragma"] == "no-cache"
    assert response.headers["Content-Type"] == "application/json"
    # Stored only as hashes: the record is found by digest, never by the token itself.
    assert await store.find_access(body["access_token"]) == (None, None)
    family, grant = await store.find_access(hashing.digest(body["access_token"]))
    assert family.access_hash == hashing.digest(body["access_token"])
    assert family.refresh_hash == hashing.digest(body["refresh_token"])
    assert body["access_token"] not in repr(family) and body["refresh_token"] not in repr(family)
    assert family.family_id == tokens.family_id(body["refresh_token"].split(".")[0])
    assert family.user_id is not None and family.installation_id is None and family.client_id == "webapp"
    assert family.grant_id == grant.grant_id and family.rotations == 0 and family.previous_hash is None
    assert family.scopes == ["read", "write"]
    assert (family.access_expires_at - family.issued_at).total_seconds() == config.tokens.access_ttl
    assert (family.expires_at - family.issued_at).total_seconds() == config.tokens.refresh_ttl


@pytest.mark.gen_test
async def test_client_secret_post_works_too(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    response = await exchange(http_client, base_url, code, use_basic=False)
    assert response.code == 200, response.body


@pytest.mark.gen_test
async def test_public_client_uses_pkce_alone(browser, http_client, base_url):
    code = await browser.code_for("skyplanner", SKY_REDIRECT)
    response = await exchange(http_client, base_url, code, client_id="skyplanner", secret=None,
                              redirect_uri=SKY_REDIRECT)
    assert response.code == 200, response.body
    assert json_of(response)["scope"] == "read observations:write"


@pytest.mark.gen_test
async def test_wrong_verifier_is_invalid_grant(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    other_verifier, _ = new_verifier()
    response = await exchange(http_client, base_url, code, verifier=other_verifier)
    check_oauth_error(response, 400, "invalid_grant")


@pytest.mark.gen_test
async def test_missing_verifier_is_refused_pkce_downgrade(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    response = await exchange(http_client, base_url, code, verifier=None)
    body = check_oauth_error(response, 400, "invalid_grant")
    assert "code_verifier" in body["error_description"]


@pytest.mark.gen_test
async def test_reused_code_is_invalid_grant_and_revokes_the_first_tokens(browser, http_client, base_url, store):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    first = await exchange(http_client, base_url, code)
    assert first.code == 200
    tokens = json_of(first)
    second = await exchange(http_client, base_url, code)
    check_oauth_error(second, 400, "invalid_grant")
    family, _ = await store.find_access(hashing.digest(tokens["access_token"]))
    assert family.revoked_at is not None  # the family the code started: its access and refresh token


@pytest.mark.gen_test
async def test_wrong_redirect_uri_is_invalid_grant(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    response = await exchange(http_client, base_url, code, redirect_uri=WEBAPP_REDIRECT + "x")
    check_oauth_error(response, 400, "invalid_grant")


@pytest.mark.gen_test
async def test_expired_code_is_invalid_grant(browser, http_client, base_url, clock):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    clock.advance(301)
    response = await exchange(http_client, base_url, code)
    body = check_oauth_error(response, 400, "invalid_grant")
    assert "expired" in body["error_description"]


@pytest.mark.gen_test
async def test_code_is_bound_to_its_client(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    response = await exchange(http_client, base_url, code, client_id="partner", secret=PARTNER_SECRET,
                              redirect_uri=WEBAPP_REDIRECT)
    check_oauth_error(response, 400, "invalid_grant")


@pytest.mark.gen_test
async def test_a_redeemed_code_presented_by_another_client_cuts_nobody_off(browser, http_client, base_url):
    """Seen in a log or a Referer, a code that was already redeemed is presented by a public
    client (no secret, the right verifier or any): invalid_grant, and the user keeps access."""
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    issued = json_of(await exchange(http_client, base_url, code))
    for verifier in (VERIFIER, new_verifier()[0]):
        response = await exchange(http_client, base_url, code, client_id="skyplanner", secret=None,
                                  redirect_uri=WEBAPP_REDIRECT, verifier=verifier)
        body = check_oauth_error(response, 400, "invalid_grant")
        assert "already used" not in body["error_description"]
    introspected = await post_form(http_client, base_url + "/oauth/token/introspect",
                                   {"token": issued["refresh_token"]},
                                   {"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert json_of(introspected)["active"] is True


@pytest.mark.gen_test
async def test_unknown_code_is_invalid_grant(http_client, base_url):
    response = await exchange(http_client, base_url, "no-such-code")
    check_oauth_error(response, 400, "invalid_grant")


@pytest.mark.parametrize("grant_type", ["password", "client_credentials", "refresh_token", "implicit"])
@pytest.mark.gen_test
async def test_other_grant_types_are_unsupported_whatever_else_the_form_holds(http_client, token_url, grant_type):
    # No code, no client: grant_type is checked first.
    response = await post_form(http_client, token_url, {"grant_type": grant_type})
    check_oauth_error(response, 400, "unsupported_grant_type")
    assert response.headers["Cache-Control"] == "no-store"


@pytest.mark.gen_test
async def test_missing_fields_are_422_with_exact_loc(http_client, token_url):
    response = await post_form(http_client, token_url, {"grant_type": "authorization_code"},
                               {"Authorization": basic("webapp", WEBAPP_SECRET)})
    check_validation_error(response, ["body", "code"], "missing")
    check_validation_error(response, ["body", "redirect_uri"], "missing")
    response = await post_form(http_client, token_url, {"code": "x", "redirect_uri": WEBAPP_REDIRECT})
    check_validation_error(response, ["body", "grant_type"], "missing")


@pytest.mark.gen_test
async def test_missing_client_id_is_422(http_client, token_url):
    response = await post_form(http_client, token_url, {
        "grant_type": "authorization_code", "code": "x", "redirect_uri": WEBAPP_REDIRECT,
        "code_verifier": VERIFIER})
    check_validation_error(response, ["body", "client_id"], "missing")


@pytest.mark.gen_test
async def test_too_long_field_is_string_too_long(http_client, token_url):
    response = await post_form(http_client, token_url, {
        "grant_type": "authorization_code", "code": "c" * 513, "redirect_uri": WEBAPP_REDIRECT,
        "client_id": "skyplanner"})
    detail = check_validation_error(response, ["body", "code"], "string_too_long")
    assert detail["ctx"] == {"max_length": 512}


@pytest.mark.gen_test
async def test_bad_basic_credentials_are_401_with_challenge(http_client, token_url):
    form = {"grant_type": "authorization_code", "code": "x", "redirect_uri": WEBAPP_REDIRECT}
    for header in (basic("webapp", "wrong"), basic("nobody", "x"), "Basic !!!notbase64"):
        response = await post_form(http_client, token_url, form, {"Authorization": header})
        check_oauth_error(response, 401, "invalid_client")
        assert response.headers["WWW-Authenticate"].startswith("Basic")


@pytest.mark.gen_test
async def test_bad_post_secret_is_401(http_client, token_url):
    response = await post_form(http_client, token_url, {
        "grant_type": "authorization_code", "code": "x", "redirect_uri": WEBAPP_REDIRECT,
        "client_id": "webapp", "client_secret": "wrong"})
    check_oauth_error(response, 401, "invalid_client")


@pytest.mark.gen_test
async def test_confidential_client_without_secret_is_401(http_client, token_url):
    response = await post_form(http_client, token_url, {
        "grant_type": "authorization_code", "code": "x", "redirect_uri": PARTNER_REDIRECT,
        "client_id": "partner", "code_verifier": VERIFIER})
    check_oauth_error(response, 401, "invalid_client")


@pytest.mark.gen_test
async def test_two_authentication_methods_are_refused(http_client, token_url):
    response = await post_form(http_client, token_url, {
        "grant_type": "authorization_code", "code": "x", "redirect_uri": WEBAPP_REDIRECT,
        "client_secret": WEBAPP_SECRET}, {"Authorization": basic("webapp", WEBAPP_SECRET)})
    check_oauth_error(response, 400, "invalid_request")


@pytest.mark.gen_test
async def test_repeated_parameter_is_invalid_request(http_client, token_url):
    response = await http_client.fetch(token_url, method="POST", raise_error=False,
                                       body="grant_type=authorization_code&code=a&code=b")
    check_oauth_error(response, 400, "invalid_request")


@pytest.mark.gen_test
async def test_non_utf8_body_is_400(http_client, token_url):
    response = await http_client.fetch(token_url, method="POST", raise_error=False,
                                       body=b"grant_type=authorization_code&code=%ff%fe")
    check_oauth_error(response, 400, "invalid_request")


@pytest.mark.gen_test
async def test_body_over_64_kib_is_413(http_client, token_url):
    response = await http_client.fetch(token_url, method="POST", raise_error=False,
                                       body="code=" + "x" * (64 * 1024))
    assert response.code == 413
    assert "detail" in json_of(response)


@pytest.mark.gen_test
async def test_json_body_is_not_a_form(http_client, token_url):
    response = await http_client.fetch(token_url, method="POST", raise_error=False,
                                       headers={"Content-Type": "application/json"},
                                       body='{"grant_type": "authorization_code"}')
    check_validation_error(response, ["body", "grant_type"], "missing")


@pytest.mark.gen_test
async def test_unknown_parameters_are_ignored_even_repeated(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    from urllib.parse import urlencode

    body = urlencode({"grant_type": "authorization_code", "code": code, "redirect_uri": WEBAPP_REDIRECT,
                      "code_verifier": VERIFIER}) + "&extra=1&extra=2&audience=x"
    response = await http_client.fetch(base_url + "/oauth/token", method="POST", body=body, raise_error=False,
                                       headers={"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert response.code == 200, response.body


# -- the access token's shape: its family's id, enciphered, beside its random part ------------

async def _exchanged(browser, http_client, base_url) -> dict:
    response = await exchange(http_client, base_url, await browser.code_for("webapp", WEBAPP_REDIRECT))
    assert response.code == 200, response.body
    return json_of(response)


def _routing_keys(ctx) -> list[bytes]:
    return [key for _, key in ctx.successors.keys]


@pytest.mark.gen_test
async def test_an_access_token_carries_its_familys_id_enciphered_beside_its_random_part(browser, http_client,
                                                                                        base_url, store, ctx):
    """An access token is its random part (43 characters) and a routing part (43 more), RFC
    6750 b64token characters only: the routing part is its family's id enciphered under a key
    of the service, so the lookup names the family's shard key. It discloses nothing: neither
    the family's id (the hash its refresh token is looked up under) nor anything two tokens of
    one family share; under another key it names some other id."""
    import base64
    import re

    body = await _exchanged(browser, http_client, base_url)
    access = body["access_token"]
    assert len(access) == 86 and re.fullmatch(r"[A-Za-z0-9_-]+", access)
    family = await family_of_token(store, access)
    assert family is not None and family.access_hash == hashing.digest(access)
    assert tokens.routes(_routing_keys(ctx), access) == (family.family_id,)
    assert tokens.routes([b"another key" * 3], access) != (family.family_id,)
    raw = bytes.fromhex(family.family_id)
    for shown in (family.family_id, base64.urlsafe_b64encode(raw).rstrip(b"=").decode(),
                  base64.b64encode(raw).rstrip(b"=").decode()):
        assert shown[:12] not in access
    renewed = json_of(await post_form(http_client, base_url + "/oauth/token/refresh",
                                      {"refresh_token": body["refresh_token"]},
                                      headers={"Authorization": basic("webapp", WEBAPP_SECRET)}))
    assert len(renewed["access_token"]) == 86 and renewed["access_token"][43:] != access[43:]
    assert tokens.routes(_routing_keys(ctx), renewed["access_token"]) == (family.family_id,)
    assert tokens.routes(_routing_keys(ctx), access[:43]) == () and tokens.routes(_routing_keys(ctx), "x" * 86) != ()


@pytest.mark.gen_test
async def test_a_routing_part_naming_another_family_finds_nothing(browser, http_client, base_url, store, ctx):
    """The routing part names where to look, never what the token is: a token whose routing
    part is another token's is refused (its hash is no family's), and so is a token whose
    random part is another's; the genuine ones still work."""
    first = (await _exchanged(browser, http_client, base_url))["access_token"]
    second = (await _exchanged(browser, http_client, base_url))["access_token"]
    auth = {"Authorization": basic("webapp", WEBAPP_SECRET)}

    async def active(token: str) -> bool:
        response = await post_form(http_client, base_url + "/oauth/token/introspect", {"token": token}, headers=auth)
        return json_of(response)["active"]

    assert not await active(first[:43] + second[43:]) and not await active(second[:43] + first[43:])
    assert not await active(first[:43])
    assert await active(first) and await active(second)


@pytest.mark.gen_test
async def test_an_access_token_of_the_old_shape_works_until_it_expires(browser, http_client, base_url, store,
                                                                       clock, config):
    """An access token of the shape 0.10.0 issued (43 characters, no routing part) is found by
    its hash alone, as before: it works, at introspection and at /v1/me, until it expires."""
    from dataclasses import replace

    body = await _exchanged(browser, http_client, base_url)
    issued = await family_of_token(store, body["access_token"])
    old = tokens.mint("s" * 22, issued.scopes, issued.issued_at, config.tokens.access_ttl, config.tokens.refresh_ttl)
    assert len(old.access_token) == 43
    assert await store.create_family(replace(issued, family_id=tokens.family_id("s" * 22),
                                             access_hash=old.pair.access_hash, refresh_hash=old.pair.refresh_hash))
    auth = {"Authorization": basic("webapp", WEBAPP_SECRET)}
    answer = json_of(await post_form(http_client, base_url + "/oauth/token/introspect", {"token": old.access_token},
                                     headers=auth))
    assert answer["active"] is True and answer["client_id"] == "webapp"
    me = await http_client.fetch(base_url + "/v1/me", headers={"Authorization": f"Bearer {old.access_token}"},
                                 raise_error=False)
    assert me.code == 200, me.body
    clock.advance(config.tokens.access_ttl + 1)
    answer = json_of(await post_form(http_client, base_url + "/oauth/token/introspect", {"token": old.access_token},
                                     headers=auth))
    assert answer == {"active": False}


async def family_of_token(store, token: str):
    return (await store.find_access(hashing.digest(token)))[0]
