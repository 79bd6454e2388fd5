"""POST /oauth/token/refresh: rotation and reuse detection."""

import re

import pytest
from helpers import (
    NODE_REDIRECT,
    PARTNER_SECRET,
    PAST_CONCURRENT,
    SKY_REDIRECT,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    basic,
    check_oauth_error,
    check_schema,
    check_validation_error,
    exchange,
    family_of,
    json_of,
    post_form,
    query_of,
)

from tokensvc import schemas
from tokensvc.oauth import hashing


async def tokens_for(browser, http_client, base_url, **kwargs):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, **kwargs)
    response = await exchange(http_client, base_url, code)
    assert response.code == 200
    return json_of(response)


async def refresh(http_client, base_url, refresh_token, client_id="webapp", secret=WEBAPP_SECRET, **extra):
    headers = {"Authorization": basic(client_id, secret)} if secret else {}
    form = {"refresh_token": refresh_token, **extra}
    if not secret:
        form["client_id"] = client_id
    return await post_form(http_client, base_url + "/oauth/token/refresh", form, headers)


@pytest.mark.gen_test
async def test_refresh_rotates_and_returns_a_new_pair(browser, http_client, base_url, store):
    first = await tokens_for(browser, http_client, base_url, scope="read")
    response = await refresh(http_client, base_url, first["refresh_token"])
    assert response.code == 200, response.body
    second = check_schema(schemas.token_response, json_of(response))
    assert second["refresh_token"] != first["refresh_token"]
    assert second["access_token"] != first["access_token"]
    assert second["scope"] == "read" and second["token_type"] == "Bearer"
    assert response.headers["Cache-Control"] == "no-store"
    # One family, its pair replaced: the old refresh token is the one rotated out last.
    family = await family_of(store, second["refresh_token"])
    assert family == await family_of(store, first["refresh_token"]) == await family_of(store, second["access_token"])
    assert family.refresh_hash == hashing.digest(second["refresh_token"])
    assert family.previous_hash == hashing.digest(first["refresh_token"]) and family.rotations == 1
    assert family.access_hash == hashing.digest(second["access_token"])  # a refresh replaces the access token
    # The new refresh token works in turn.
    third = await refresh(http_client, base_url, second["refresh_token"])
    assert third.code == 200


@pytest.mark.gen_test
async def test_grant_type_refresh_token_is_accepted_and_ignored(browser, http_client, base_url):
    first = await tokens_for(browser, http_client, base_url)
    response = await refresh(http_client, base_url, first["refresh_token"], grant_type="refresh_token")
    assert response.code == 200


@pytest.mark.gen_test
async def test_rotated_refresh_reuse_revokes_the_family(browser, http_client, base_url, store, clock):
    other = await tokens_for(browser, http_client, base_url)  # another sign-in of the same user and app
    first = await tokens_for(browser, http_client, base_url)
    second = json_of(await refresh(http_client, base_url, first["refresh_token"]))
    clock.advance(PAST_CONCURRENT)
    reused = await refresh(http_client, base_url, first["refresh_token"])
    body = check_oauth_error(reused, 400, "invalid_grant")
    assert "already used" in body["error_description"]
    assert (await family_of(store, second["refresh_token"])).revoked_at is not None
    assert (await family_of(store, other["refresh_token"])).revoked_at is None
    assert (await refresh(http_client, base_url, other["refresh_token"])).code == 200
    # The current refresh token no longer works either.
    check_oauth_error(await refresh(http_client, base_url, second["refresh_token"]), 400, "invalid_grant")


@pytest.mark.gen_test
async def test_refresh_token_is_bound_to_its_client(browser, http_client, base_url, store):
    first = await tokens_for(browser, http_client, base_url)
    response = await refresh(http_client, base_url, first["refresh_token"], client_id="partner",
                             secret=PARTNER_SECRET)
    check_oauth_error(response, 400, "invalid_grant")
    # The rightful client is not cut off by the foreign attempt.
    assert (await refresh(http_client, base_url, first["refresh_token"])).code == 200


@pytest.mark.gen_test
async def test_expired_refresh_token_is_invalid_grant(browser, http_client, base_url, clock):
    first = await tokens_for(browser, http_client, base_url)
    clock.advance(2592000 + 1)
    check_oauth_error(await refresh(http_client, base_url, first["refresh_token"]), 400, "invalid_grant")


@pytest.mark.gen_test
async def test_access_token_is_not_a_refresh_token(browser, http_client, base_url):
    first = await tokens_for(browser, http_client, base_url)
    check_oauth_error(await refresh(http_client, base_url, first["access_token"]), 400, "invalid_grant")


@pytest.mark.gen_test
async def test_public_client_refreshes_with_client_id(browser, http_client, base_url):
    code = await browser.code_for("skyplanner", SKY_REDIRECT)
    tokens = json_of(await exchange(http_client, base_url, code, client_id="skyplanner", secret=None,
                                    redirect_uri=SKY_REDIRECT))
    response = await refresh(http_client, base_url, tokens["refresh_token"], client_id="skyplanner", secret=None)
    assert response.code == 200, response.body


@pytest.mark.gen_test
async def test_missing_refresh_token_is_422(http_client, base_url):
    response = await post_form(http_client, base_url + "/oauth/token/refresh", {"client_id": "webapp"})
    detail = check_validation_error(response, ["body", "refresh_token"], "missing")
    assert detail == {"loc": ["body", "refresh_token"], "msg": "Field required", "type": "missing",
                      "input": None, "ctx": {}}


@pytest.mark.gen_test
async def test_installation_refresh_tokens_live_longer(browser, http_client, base_url, store, config):
    code = await browser.code_for("node-agent", NODE_REDIRECT, installation_id="backyard-scope")
    tokens = json_of(await exchange(http_client, base_url, code, client_id="node-agent", secret=None,
                                    redirect_uri=NODE_REDIRECT))
    record = await family_of(store, tokens["refresh_token"])
    assert record.installation_id == "backyard-scope" and record.user_id is None
    lifetime = (record.expires_at - record.issued_at).total_seconds()
    assert lifetime == config.tokens.installation_refresh_ttl
    renewed = json_of(await refresh(http_client, base_url, tokens["refresh_token"], client_id="node-agent",
                                    secret=None))
    record = await family_of(store, renewed["refresh_token"])
    assert record.installation_id == "backyard-scope"
    assert (record.expires_at - record.issued_at).total_seconds() == config.tokens.installation_refresh_ttl


@pytest.mark.gen_test
async def test_refresh_may_narrow_but_not_widen_the_scope(browser, http_client, base_url):
    first = await tokens_for(browser, http_client, base_url, scope="read write")
    narrowed = await refresh(http_client, base_url, first["refresh_token"], scope="read")
    assert narrowed.code == 200 and json_of(narrowed)["scope"] == "read"
    wider = await refresh(http_client, base_url, json_of(narrowed)["refresh_token"], scope="read write")
    check_oauth_error(wider, 400, "invalid_scope")


ERROR_DESCRIPTION = re.compile(r"[\x20-\x21\x23-\x5b\x5d-\x7e]+")  # RFC 6749 §5.2's grammar


@pytest.mark.gen_test
async def test_an_error_description_holds_only_the_characters_rfc_6749_allows(browser, http_client, base_url):
    """A request's own words echoed in error_description (a scope beyond ASCII, a quote, a
    backslash) are percent-encoded: the JSON answer and the redirect's both stay within
    %x20-21 / %x23-5B / %x5D-7E and still say what was sent."""
    pair = await tokens_for(browser, http_client, base_url, scope="read")
    for scope, shown in (("é", "%C3%A9"), ('say"what', "say%22what"), ("back\\slash", "back%5C")):
        said = check_oauth_error(await refresh(http_client, base_url, pair["refresh_token"], scope=scope), 400,
                                 "invalid_scope")["error_description"]
        assert ERROR_DESCRIPTION.fullmatch(said) and shown in said, said
    await browser.login("alice")
    redirected = await browser.authorize("webapp", WEBAPP_REDIRECT, scope="read é")
    said = query_of(redirected.headers["Location"])["error_description"]
    assert ERROR_DESCRIPTION.fullmatch(said) and "%C3%A9" in said, said

