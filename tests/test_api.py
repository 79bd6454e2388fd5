"""The public API: bearer and cookie authentication, scopes, /v1/me and connected apps."""

import pytest
from helpers import (
    NODE_REDIRECT,
    SKY_REDIRECT,
    WEBAPP_REDIRECT,
    check_schema,
    check_validation_error,
    exchange,
    json_of,
)

from tokensvc import schemas


async def user_token(browser, http_client, base_url, scope="read write", user="alice"):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, scope=scope, user=user)
    return json_of(await exchange(http_client, base_url, code))["access_token"]


async def sky_token(browser, http_client, base_url, scope="read"):
    code = await browser.code_for("skyplanner", SKY_REDIRECT, scope=scope)
    return json_of(await exchange(http_client, base_url, code, client_id="skyplanner", secret=None,
                                  redirect_uri=SKY_REDIRECT))["access_token"]


async def installation_token(browser, http_client, base_url):
    code = await browser.code_for("node-agent", NODE_REDIRECT, installation_id="backyard-scope")
    return json_of(await exchange(http_client, base_url, code, client_id="node-agent", secret=None,
                                  redirect_uri=NODE_REDIRECT))["access_token"]


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


async def get(http_client, base_url, path, headers=None, method="GET"):
    return await http_client.fetch(base_url + path, method=method, headers=headers or {}, raise_error=False,
                                   allow_nonstandard_methods=True)


@pytest.mark.gen_test
async def test_me_with_a_user_token(browser, http_client, base_url, store):
    token = await user_token(browser, http_client, base_url)
    response = await get(http_client, base_url, "/v1/me", bearer(token))
    assert response.code == 200
    body = check_schema(schemas.me, json_of(response))
    alice = await store.get_user_by_username("alice")
    assert body == {"subjectType": "user", "id": alice.user_id, "username": "alice", "clientId": "webapp",
                    "scopes": ["read", "write"]}


@pytest.mark.gen_test
async def test_me_with_an_installation_token(browser, http_client, base_url):
    token = await installation_token(browser, http_client, base_url)
    body = check_schema(schemas.me, json_of(await get(http_client, base_url, "/v1/me", bearer(token))))
    assert body == {"subjectType": "installation", "id": "backyard-scope", "name": "Backyard telescope",
                    "clientId": "node-agent", "scopes": ["read", "write"]}


@pytest.mark.gen_test
async def test_me_with_the_session_cookie(browser):
    await browser.login("alice")
    body = json_of(await browser.fetch("/v1/me"))
    assert body["subjectType"] == "user" and body["username"] == "alice"
    assert body["clientId"] is None and body["scopes"] == ["read", "write"]


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Bearer "}, {"Authorization": "Basic eDp5"},
])
@pytest.mark.gen_test
async def test_missing_or_invalid_token_is_401(http_client, base_url, headers):
    response = await get(http_client, base_url, "/v1/me", headers)
    assert response.code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="tokensvc", error="invalid_token"'
    assert json_of(response)["error"] == "invalid_token"


@pytest.mark.gen_test
async def test_expired_and_revoked_tokens_are_401(browser, http_client, base_url, clock):
    token = await user_token(browser, http_client, base_url)
    clock.advance(3601)
    assert (await get(http_client, base_url, "/v1/me", bearer(token))).code == 401
    clock.advance(-3601)
    assert (await get(http_client, base_url, "/v1/me", bearer(token))).code == 200
    await http_client.fetch(base_url + "/oauth/revoke", method="POST", body="", headers=bearer(token))
    assert (await get(http_client, base_url, "/v1/me", bearer(token))).code == 401


@pytest.mark.gen_test
async def test_refresh_token_is_not_a_bearer_token(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    refresh = json_of(await exchange(http_client, base_url, code))["refresh_token"]
    assert (await get(http_client, base_url, "/v1/me", bearer(refresh))).code == 401


@pytest.mark.gen_test
async def test_missing_scope_is_403_naming_it(browser, http_client, base_url):
    token = await sky_token(browser, http_client, base_url, scope="observations:write")
    response = await get(http_client, base_url, "/v1/me", bearer(token))
    assert response.code == 403
    body = json_of(response)
    assert body["error"] == "insufficient_scope" and body["scope"] == "read"
    assert response.headers["WWW-Authenticate"] == \
        'Bearer realm="tokensvc", error="insufficient_scope", scope="read"'


@pytest.mark.gen_test
async def test_connected_apps_lists_active_grants(browser, http_client, base_url, clock):
    token = await user_token(browser, http_client, base_url, scope="read write")
    clock.advance(1)  # listed oldest first
    await sky_token(browser, http_client, base_url)
    response = await get(http_client, base_url, "/v1/me/connected-apps", bearer(token))
    body = check_schema(schemas.connected_apps, json_of(response))
    assert [(app["clientId"], app["name"], app["scopes"]) for app in body] == [
        ("webapp", "Web app", ["read", "write"]), ("skyplanner", "SkyPlanner", ["read"])]
    assert body[1]["logoUrl"] == "https://skyplanner.example/logo.png" and body[0]["grantedAt"]


@pytest.mark.gen_test
async def test_delete_connected_app_revokes_the_grant_and_its_tokens(browser, http_client, base_url):
    token = await user_token(browser, http_client, base_url, scope="read write")
    sky = await sky_token(browser, http_client, base_url)
    assert (await get(http_client, base_url, "/v1/me", bearer(sky))).code == 200
    response = await get(http_client, base_url, "/v1/me/connected-apps/skyplanner", bearer(token), "DELETE")
    assert response.code == 204 and response.body == b""
    assert (await get(http_client, base_url, "/v1/me", bearer(sky))).code == 401
    apps = json_of(await get(http_client, base_url, "/v1/me/connected-apps", bearer(token)))
    assert [app["clientId"] for app in apps] == ["webapp"]
    again = await get(http_client, base_url, "/v1/me/connected-apps/skyplanner", bearer(token), "DELETE")
    assert again.code == 404 and "detail" in json_of(again)


@pytest.mark.gen_test
async def test_delete_connected_app_needs_connected_apps_write(browser, http_client, base_url):
    token = await user_token(browser, http_client, base_url, scope="read")
    response = await get(http_client, base_url, "/v1/me/connected-apps/webapp", bearer(token), "DELETE")
    assert response.code == 403 and json_of(response)["scope"] == "connected-apps:write"
    narrow = await user_token(browser, http_client, base_url, scope="connected-apps:write")
    response = await get(http_client, base_url, "/v1/me/connected-apps/webapp", bearer(narrow), "DELETE")
    assert response.code == 204


@pytest.mark.gen_test
async def test_installation_tokens_cannot_touch_connected_apps(browser, http_client, base_url):
    token = await installation_token(browser, http_client, base_url)
    for method, path in (("GET", "/v1/me/connected-apps"), ("DELETE", "/v1/me/connected-apps/node-agent")):
        response = await get(http_client, base_url, path, bearer(token), method)
        assert response.code == 403 and json_of(response)["error"] == "access_denied"


@pytest.mark.gen_test
async def test_delete_with_a_bad_client_id_is_422(browser, http_client, base_url):
    token = await user_token(browser, http_client, base_url)
    response = await get(http_client, base_url, "/v1/me/connected-apps/" + "x" * 200, bearer(token), "DELETE")
    check_validation_error(response, ["path", "client_id"], "string_too_long")


@pytest.mark.gen_test
async def test_cookie_authenticated_delete_needs_the_xsrf_header(browser, http_client, base_url):
    await sky_token(browser, http_client, base_url)  # alice signs in and grants skyplanner
    response = await browser.fetch("/v1/me/connected-apps/skyplanner", "DELETE")
    assert response.code == 403
    response = await browser.fetch("/v1/me/connected-apps/skyplanner", "DELETE",
                                   headers={"X-XSRFToken": browser.cookies["_xsrf"]})
    assert response.code == 204
