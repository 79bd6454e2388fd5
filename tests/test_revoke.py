"""Revocation: RFC 7009 at /oauth/token/revoke, grant-wide at /oauth/revoke, and sign-out."""

import pytest
from helpers import (
    PARTNER_SECRET,
    SKY_REDIRECT,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    basic,
    check_oauth_error,
    exchange,
    family_of,
    json_of,
    post_form,
)

from tokensvc.oauth import tokens as token_format


async def webapp_tokens(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    return json_of(await exchange(http_client, base_url, code))


async def state_of(store, token):
    family = await family_of(store, token)
    if family is None:
        return "replaced"
    revoked = family.revoked_at or (not token_format.is_refresh_format(token) and family.access_revoked_at)
    return "revoked" if revoked else "active"


def live_sessions(store):
    from tokensvc.storage.memory import SESSIONS

    return [row for row in store._sessions.values() if SESSIONS.get(row, "ended_at") is None]


async def revoke(http_client, base_url, token, client_id="webapp", secret=WEBAPP_SECRET, **form):
    headers = {"Authorization": basic(client_id, secret)} if secret else {}
    body = {"token": token, **form}
    if not secret:
        body["client_id"] = client_id
    return await post_form(http_client, base_url + "/oauth/token/revoke", body, headers)


@pytest.mark.gen_test
async def test_revoking_an_access_token(browser, http_client, base_url, store):
    tokens = await webapp_tokens(browser, http_client, base_url)
    response = await revoke(http_client, base_url, tokens["access_token"], token_type_hint="access_token")
    assert response.code == 200 and json_of(response) == {}
    assert response.headers["Cache-Control"] == "no-store"
    assert await state_of(store, tokens["access_token"]) == "revoked"
    assert await state_of(store, tokens["refresh_token"]) == "active"


@pytest.mark.gen_test
async def test_revoking_a_refresh_token_takes_the_grants_access_tokens(browser, http_client, base_url, store):
    tokens = await webapp_tokens(browser, http_client, base_url)
    response = await revoke(http_client, base_url, tokens["refresh_token"])
    assert response.code == 200
    assert await state_of(store, tokens["refresh_token"]) == "revoked"
    assert await state_of(store, tokens["access_token"]) == "revoked"


@pytest.mark.gen_test
async def test_unknown_and_repeated_revocation_are_200(browser, http_client, base_url):
    assert json_of(await revoke(http_client, base_url, "no-such-token")) == {}
    tokens = await webapp_tokens(browser, http_client, base_url)
    for _ in range(2):
        assert (await revoke(http_client, base_url, tokens["access_token"])).code == 200


@pytest.mark.gen_test
async def test_another_clients_token_is_left_alone(browser, http_client, base_url, store):
    tokens = await webapp_tokens(browser, http_client, base_url)
    response = await revoke(http_client, base_url, tokens["access_token"], client_id="partner",
                            secret=PARTNER_SECRET)
    assert response.code == 200
    assert await state_of(store, tokens["access_token"]) == "active"


@pytest.mark.gen_test
async def test_bad_client_credentials_are_401(http_client, base_url):
    check_oauth_error(await revoke(http_client, base_url, "x", secret="wrong"), 401, "invalid_client")


@pytest.mark.gen_test
async def test_public_client_revokes_with_client_id(browser, http_client, base_url, store):
    code = await browser.code_for("skyplanner", SKY_REDIRECT)
    tokens = json_of(await exchange(http_client, base_url, code, client_id="skyplanner", secret=None,
                                    redirect_uri=SKY_REDIRECT))
    # Another public client's id does not reach it.
    as_node_agent = await revoke(http_client, base_url, tokens["access_token"], client_id="node-agent", secret=None)
    assert as_node_agent.code == 200
    assert await state_of(store, tokens["access_token"]) == "active"
    as_owner = await revoke(http_client, base_url, tokens["access_token"], client_id="skyplanner", secret=None)
    assert as_owner.code == 200
    assert await state_of(store, tokens["access_token"]) == "revoked"


@pytest.mark.gen_test
async def test_a_token_not_in_force_revokes_nothing_anywhere(browser, http_client, base_url, store):
    first = await webapp_tokens(browser, http_client, base_url)
    refreshed = await post_form(http_client, base_url + "/oauth/token/refresh",
                                {"refresh_token": first["refresh_token"]},
                                {"Authorization": basic("webapp", WEBAPP_SECRET)})
    current = json_of(refreshed)
    # first's refresh token is rotated out and its access token replaced: dead, each of them.
    assert (await revoke(http_client, base_url, first["access_token"])).code == 200  # replaced: unknown
    for dead in (first["refresh_token"], first["access_token"]):
        response = await http_client.fetch(base_url + "/oauth/revoke?token=" + dead, method="POST", body="",
                                           raise_error=False)
        assert response.code == 200
        response = await post_form(http_client, base_url + "/oauth/revoke", {}, {"Authorization": f"Bearer {dead}"})
        assert response.code == 200
        response = await post_form(http_client, base_url + "/oauth/sign-out?token=" + dead, {})
        assert response.code == 200
    assert await state_of(store, current["access_token"]) == "active"
    assert await state_of(store, current["refresh_token"]) == "active"
    # The user removes the app and connects it again: the tokens of before revoke nothing of now.
    response = await browser.fetch("/v1/me/connected-apps/webapp", "DELETE",
                                   headers={"X-XSRFToken": browser.cookies["_xsrf"]})
    assert response.code == 204
    reconnected = await webapp_tokens(browser, http_client, base_url)
    response = await post_form(http_client, base_url + "/oauth/revoke", {},
                               {"Authorization": f"Bearer {current['access_token']}"})
    assert response.code == 200
    assert await state_of(store, reconnected["access_token"]) == "active"


# -- POST /oauth/revoke ------------------------------------------------------------

@pytest.mark.gen_test
async def test_grant_revoke_cuts_every_token_of_the_grant(browser, http_client, base_url, store):
    first = await webapp_tokens(browser, http_client, base_url)
    second = await webapp_tokens(browser, http_client, base_url)  # same user and client: same grant
    response = await post_form(http_client, base_url + "/oauth/revoke", {},
                               {"Authorization": f"Bearer {first['access_token']}"})
    assert response.code == 200 and json_of(response) == {}
    for tokens in (first, second):
        assert await state_of(store, tokens["access_token"]) == "revoked"
        assert await state_of(store, tokens["refresh_token"]) == "revoked"
    grant = await store.list_grants((await family_of(store, first["access_token"])).subject)
    assert grant == []


@pytest.mark.gen_test
async def test_grant_revoke_with_query_token(browser, http_client, base_url, store):
    tokens = await webapp_tokens(browser, http_client, base_url)
    response = await http_client.fetch(base_url + "/oauth/revoke?token=" + tokens["refresh_token"],
                                       method="POST", body="", raise_error=False)
    assert response.code == 200
    assert await state_of(store, tokens["access_token"]) == "revoked"


@pytest.mark.parametrize("headers,query,body", [
    ({}, "", ""),
    ({"Authorization": "Bearer nonsense"}, "?token=nonsense", ""),
    ({"Authorization": "Basic ???"}, "?token=a&token=b", "x" * 70000),
    ({"Authorization": "Bearer"}, "?token=%ff", "grant_type=whatever"),
])
@pytest.mark.gen_test
async def test_grant_revoke_is_always_200(http_client, base_url, headers, query, body):
    response = await http_client.fetch(base_url + "/oauth/revoke" + query, method="POST", body=body,
                                       headers=headers, raise_error=False)
    assert response.code == 200 and json_of(response) == {}



@pytest.mark.gen_test
async def test_revoke_at_a_host_name_the_service_does_not_answer_to_is_400(http_client, base_url):
    """The departure from "always 200" that DNS rebinding asks for (docs/security.md): a name
    that is not the service's reaches no route, this one included."""
    response = await http_client.fetch(base_url + "/oauth/revoke", method="POST", body="",
                                       headers={"Host": "attacker.example"}, raise_error=False)
    assert response.code == 400 and "Unknown host" in json_of(response)["detail"]
    assert (await http_client.fetch(base_url + "/oauth/revoke", method="POST", body="")).code == 200

# -- POST /oauth/sign-out -------------------------------------------------------------

@pytest.mark.gen_test
async def test_sign_out_ends_the_session_and_revokes_the_token(browser, http_client, base_url, store):
    tokens = await webapp_tokens(browser, http_client, base_url)
    session_cookie = browser.cookies["tokensvc_session"]
    response = await browser.fetch("/oauth/sign-out?token=" + tokens["refresh_token"], "POST", {},
                                   headers={"X-XSRFToken": browser.cookies["_xsrf"]})
    assert response.code == 200 and json_of(response) == {}
    assert "tokensvc_session" not in browser.cookies
    assert live_sessions(store) == []
    assert await state_of(store, tokens["refresh_token"]) == "revoked"
    # The old cookie no longer signs anyone in.
    browser.cookies["tokensvc_session"] = session_cookie
    assert b"Signed in as" not in (await browser.fetch("/")).body


@pytest.mark.gen_test
@pytest.mark.parametrize("authorization", [None, "Bearer junk", "Basic d2ViYXBwOng="],
                         ids=["cookie-alone", "with-a-bearer-header", "with-a-basic-header"])
async def test_cookie_sign_out_needs_the_xsrf_header(browser, store, authorization):
    """Sign-out acts on the cookie: whatever else the request carries (an Authorization header
    of any kind is no authority here), it needs the XSRF token."""
    await browser.login("alice")
    headers = {"Authorization": authorization} if authorization else {}
    response = await browser.fetch("/oauth/sign-out", "POST", {}, headers=headers)
    assert response.code == 403
    assert len(live_sessions(store)) == 1
    signed_out = await browser.fetch("/oauth/sign-out", "POST", {}, headers={**headers,
                                                                            "X-XSRFToken": browser.cookies["_xsrf"]})
    assert signed_out.code == 200 and live_sessions(store) == []


@pytest.mark.gen_test
async def test_sign_out_without_a_session(http_client, base_url):
    response = await post_form(http_client, base_url + "/oauth/sign-out", {})
    assert response.code == 200 and json_of(response) == {}
