"""CORS for browser apps: the token endpoints and the /v1 API answer the origins of public
clients' https redirect URIs and of clients' allowed_origins, and nothing else (a native app's
loopback redirect is no browser app's origin); introspection stays closed to browsers;
credentials are never allowed across origins."""

from __future__ import annotations

import pytest
from helpers import SKY_REDIRECT, check_validation_error, exchange, json_of, make_config, post_form

SKY_ORIGIN = "http://127.0.0.1:9000"  # skyplanner's loopback redirect: allowed only when listed
WEBAPP_ORIGIN = "http://127.0.0.1:8080"  # webapp is confidential: its secret is not for a browser
EXTRA_ORIGIN = "https://planner.example"  # listed for partner
SPA_ORIGIN = "https://spa.example"  # a public client's https redirect URI's origin


def with_extra_origin():
    """Origins given: partner's EXTRA_ORIGIN, and skyplanner's own loopback origin (a browser
    app on a development machine); a public browser app with an https redirect."""
    config = make_config()
    origins = {"partner": [EXTRA_ORIGIN], "skyplanner": [SKY_ORIGIN]}
    raw = {"clients": [{"client_id": c.client_id, "name": c.name, "redirect_uris": c.redirect_uris,
                        "allowed_scopes": c.allowed_scopes, "first_party": c.first_party,
                        "client_secret": c.client_secret, "description": c.description, "logo_url": c.logo_url,
                        "allowed_origins": origins.get(c.client_id)}
                       for c in config.clients]
           + [{"client_id": "spa", "name": "SPA", "redirect_uris": [SPA_ORIGIN + "/cb"]}]}
    return make_config(**raw)


async def preflight(http_client, base_url, path, origin, method="POST"):
    return await http_client.fetch(base_url + path, method="OPTIONS", raise_error=False, headers={
        "Origin": origin, "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type"})


@pytest.mark.gen_test
@pytest.mark.parametrize("config", [with_extra_origin()])
@pytest.mark.parametrize("path,method", [("/oauth/token", "POST"), ("/oauth/token/refresh", "POST"),
                                         ("/oauth/token/revoke", "POST"), ("/oauth/revoke", "POST"),
                                         ("/v1/me", "GET"), ("/v1/me/connected-apps/skyplanner", "DELETE")])
async def test_a_preflight_from_an_allowed_origin(http_client, base_url, config, path, method):
    for origin in (SKY_ORIGIN, EXTRA_ORIGIN, SPA_ORIGIN):
        answer = await preflight(http_client, base_url, path, origin, method)
        assert answer.code == 204 and answer.body == b""
        assert answer.headers["Access-Control-Allow-Origin"] == origin
        assert method in answer.headers["Access-Control-Allow-Methods"].split(", ")
        assert "Authorization" in answer.headers["Access-Control-Allow-Headers"]
        assert int(answer.headers["Access-Control-Max-Age"]) > 0 and answer.headers["Vary"] == "Origin"
        assert "Access-Control-Allow-Credentials" not in answer.headers


@pytest.mark.gen_test
@pytest.mark.parametrize("origin", [WEBAPP_ORIGIN, "https://evil.example", "null", "http://127.0.0.1:9001",
                                    # native apps' loopback redirects (skyplanner's, the command line's):
                                    # any local page on that port would be them
                                    SKY_ORIGIN, "http://127.0.0.1", "http://[::1]"])
async def test_any_other_origin_gets_no_allowance(http_client, base_url, origin):
    answer = await preflight(http_client, base_url, "/oauth/token", origin)
    assert answer.code == 204 and "Access-Control-Allow-Origin" not in answer.headers
    assert answer.headers["Vary"] == "Origin"
    refused = await http_client.fetch(base_url + "/oauth/token", method="POST", body="client_id=skyplanner",
                                      headers={"Origin": origin}, raise_error=False)
    assert "Access-Control-Allow-Origin" not in refused.headers


@pytest.mark.gen_test
@pytest.mark.parametrize("config", [with_extra_origin()])
async def test_answers_to_an_allowed_origin_carry_it_errors_included(browser, http_client, base_url, config):
    code = await browser.code_for("skyplanner", SKY_REDIRECT, scope="read")
    issued = await exchange(http_client, base_url, code, client_id="skyplanner", secret=None,
                            redirect_uri=SKY_REDIRECT)
    assert issued.code == 200
    tokens = json_of(issued)
    me = await http_client.fetch(base_url + "/v1/me", headers={"Authorization": f"Bearer {tokens['access_token']}",
                                                               "Origin": SKY_ORIGIN})
    assert me.headers["Access-Control-Allow-Origin"] == SKY_ORIGIN
    assert "X-Request-ID" in me.headers["Access-Control-Expose-Headers"]
    wrong = await post_form(http_client, base_url + "/oauth/token/refresh",
                            {"refresh_token": "nope", "client_id": "skyplanner"}, {"Origin": SKY_ORIGIN})
    assert wrong.code == 400 and wrong.headers["Access-Control-Allow-Origin"] == SKY_ORIGIN
    plain = await http_client.fetch(base_url + "/v1/me", headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert plain.headers["Vary"] == "Origin" and "Access-Control-Allow-Origin" not in plain.headers


@pytest.mark.gen_test
async def test_introspection_stays_closed_to_browsers(http_client, base_url):
    answer = await preflight(http_client, base_url, "/oauth/token/introspect", SKY_ORIGIN)
    assert answer.code == 405 and "Access-Control-Allow-Origin" not in answer.headers
    posted = await http_client.fetch(base_url + "/oauth/token/introspect", method="POST", body="token=x",
                                     headers={"Origin": SKY_ORIGIN}, raise_error=False)
    assert "Access-Control-Allow-Origin" not in posted.headers


@pytest.mark.gen_test
@pytest.mark.parametrize("config", [with_extra_origin()])
@pytest.mark.parametrize("path,loc", [("/v1/me/connected-apps/a,b", ["path", "client_id"]),
                                      ("/v1/me/sessions/not-a-session", ["path", "session_id"])])
async def test_a_preflight_checks_the_path_as_its_method_would(http_client, base_url, config, path, loc):
    answer = await preflight(http_client, base_url, path, SPA_ORIGIN, "DELETE")
    check_validation_error(answer, loc, "value_error")
    assert answer.headers["Access-Control-Allow-Origin"] == SPA_ORIGIN  # a browser app may read why
    deleted = await http_client.fetch(base_url + path, method="DELETE", raise_error=False)
    check_validation_error(deleted, loc, "value_error")
