"""POST /oauth/token/introspect (RFC 7662): who may call it, and what it says."""

import pytest
from helpers import (
    NODE_REDIRECT,
    PARTNER_SECRET,
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
)

from tokensvc import schemas
from tokensvc.oauth.feed import family_label


async def introspect(http_client, base_url, token, headers=None, **form):
    return await post_form(http_client, base_url + "/oauth/token/introspect", {"token": token, **form},
                           headers if headers is not None else {"Authorization": basic("webapp", WEBAPP_SECRET)})


@pytest.mark.gen_test
async def test_active_user_token(browser, http_client, base_url, store):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, scope="read write")
    tokens = json_of(await exchange(http_client, base_url, code))
    response = await introspect(http_client, base_url, tokens["access_token"])
    assert response.code == 200
    body = check_schema(schemas.introspection_response, json_of(response))
    alice = await store.get_user_by_username("alice")
    assert body == {
        "active": True, "scope": "read write", "client_id": "webapp", "token_type": "access_token",
        "exp": body["exp"], "iat": body["iat"], "iss": "http://127.0.0.1:8080",
        "sub": alice.user_id, "subject_type": "user", "username": "alice",
        "family_id": family_label((await family_of(store, tokens["access_token"])).family_id),
        "grant_id": (await family_of(store, tokens["access_token"])).grant_id}
    assert body["exp"] - body["iat"] == 3600
    assert response.headers["Cache-Control"] == "no-store"
    refresh = json_of(await introspect(http_client, base_url, tokens["refresh_token"]))
    assert refresh["active"] is True and refresh["token_type"] == "refresh_token"


@pytest.mark.gen_test
async def test_installation_token(browser, http_client, base_url):
    code = await browser.code_for("node-agent", NODE_REDIRECT, installation_id="backyard-scope")
    tokens = json_of(await exchange(http_client, base_url, code, client_id="node-agent", secret=None,
                                    redirect_uri=NODE_REDIRECT))
    body = json_of(await introspect(http_client, base_url, tokens["access_token"]))
    assert body["subject_type"] == "installation" and body["installation_id"] == "backyard-scope"
    assert body["sub"] == "backyard-scope" and "username" not in body


@pytest.mark.parametrize("token", ["unknown-token", "x" * 600])
@pytest.mark.gen_test
async def test_unknown_token_is_only_inactive(http_client, base_url, token):
    response = await introspect(http_client, base_url, token[:512])
    assert response.code == 200 and json_of(response) == {"active": False}


@pytest.mark.gen_test
async def test_expired_token_is_inactive(browser, http_client, base_url, clock):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    tokens = json_of(await exchange(http_client, base_url, code))
    clock.advance(3601)
    assert json_of(await introspect(http_client, base_url, tokens["access_token"])) == {"active": False}


@pytest.mark.gen_test
async def test_third_party_confidential_client_is_refused_403(http_client, base_url):
    response = await introspect(http_client, base_url, "x", {"Authorization": basic("partner", PARTNER_SECRET)})
    check_oauth_error(response, 403, "access_denied")


@pytest.mark.gen_test
async def test_public_first_party_client_is_401(http_client, base_url):
    response = await introspect(http_client, base_url, "x", {}, client_id="node-agent")
    check_oauth_error(response, 401, "invalid_client")


@pytest.mark.gen_test
async def test_bad_credentials_are_401(http_client, base_url):
    response = await introspect(http_client, base_url, "x", {"Authorization": basic("webapp", "nope")})
    check_oauth_error(response, 401, "invalid_client")
    assert response.headers["WWW-Authenticate"].startswith("Basic")
    response = await introspect(http_client, base_url, "x", {})
    check_validation_error(response, ["body", "client_id"], "missing")


@pytest.mark.gen_test
async def test_client_secret_post_caller(http_client, base_url):
    response = await introspect(http_client, base_url, "x", {}, client_id="webapp", client_secret=WEBAPP_SECRET)
    assert response.code == 200 and json_of(response) == {"active": False}


@pytest.mark.gen_test
async def test_admin_bearer_with_admin_scope_may_introspect(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, user="root", scope="read admin")
    admin_token = json_of(await exchange(http_client, base_url, code))["access_token"]
    # The call names its client, as every token-endpoint call does: the bearer token's.
    response = await introspect(http_client, base_url, admin_token, {"Authorization": f"Bearer {admin_token}"},
                                client_id="webapp")
    assert response.code == 200 and json_of(response)["username"] == "root"


@pytest.mark.gen_test
async def test_an_admins_bearer_call_names_its_tokens_client(browser, http_client, base_url):
    """Every token-endpoint call carries client_id (the interface, §4), an administrator's bearer
    call too: without it, 422 at [body, client_id] before the token is looked at (it was
    answered); naming another client than the token's, 401 invalid_client."""
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, user="root", scope="read admin")
    admin_token = json_of(await exchange(http_client, base_url, code))["access_token"]
    bearer = {"Authorization": f"Bearer {admin_token}"}
    check_validation_error(await introspect(http_client, base_url, admin_token, bearer), ["body", "client_id"],
                           "missing")
    check_validation_error(await introspect(http_client, base_url, "x", {"Authorization": "Bearer not-a-token"}),
                           ["body", "client_id"], "missing")
    check_oauth_error(await introspect(http_client, base_url, admin_token, bearer, client_id="partner"), 401,
                      "invalid_client")


@pytest.mark.gen_test
async def test_admin_bearer_without_admin_scope_is_403(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, user="root", scope="read")
    token = json_of(await exchange(http_client, base_url, code))["access_token"]
    response = await introspect(http_client, base_url, token, {"Authorization": f"Bearer {token}"},
                                client_id="webapp")
    check_oauth_error(response, 403, "insufficient_scope")
    assert 'error="insufficient_scope"' in response.headers["WWW-Authenticate"]


@pytest.mark.gen_test
async def test_non_admin_bearer_is_403(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, user="alice")
    token = json_of(await exchange(http_client, base_url, code))["access_token"]
    response = await introspect(http_client, base_url, token, {"Authorization": f"Bearer {token}"},
                                client_id="webapp")
    check_oauth_error(response, 403, "access_denied")


@pytest.mark.gen_test
async def test_invalid_bearer_is_401(http_client, base_url):
    response = await introspect(http_client, base_url, "x", {"Authorization": "Bearer not-a-token"},
                                client_id="webapp")
    check_oauth_error(response, 401, "invalid_client")


@pytest.mark.gen_test
async def test_missing_token_is_422(http_client, base_url):
    response = await post_form(http_client, base_url + "/oauth/token/introspect", {},
                               {"Authorization": basic("webapp", WEBAPP_SECRET)})
    check_validation_error(response, ["body", "token"], "missing")


@pytest.mark.gen_test
async def test_scope_reports_what_is_in_force_when_asked(http_client, base_url, ctx, store):
    """A resource server trusting RFC 7662 sees what the token may do now: after root is no
    longer an administrator, ``admin`` is gone from ``scope``; a token with nothing left in
    force is inactive."""
    from dataclasses import replace

    from helpers import issue_tokens

    web = await issue_tokens(ctx, "root", "read admin")
    cli = await issue_tokens(ctx, "root", "admin", "tokensvc-cli", "http://127.0.0.1:5/callback")
    assert json_of(await introspect(http_client, base_url, web.access_token))["scope"] == "read admin"
    root = await store.get_user_by_username("root")
    await store.put_user(replace(root, admin=False))
    body = check_schema(schemas.introspection_response, json_of(await introspect(http_client, base_url,
                                                                                 web.access_token)))
    assert body["active"] is True and body["scope"] == "read" and body["username"] == "root"
    assert json_of(await introspect(http_client, base_url, cli.refresh_token)) == {"active": False}
