"""What the account page and the /v1/me API tell a user, and what they let them undo: the
scopes in force, their sessions, their installations; and the pages a browser meets when it
opens an address that is not a page."""

from __future__ import annotations

import pytest
from helpers import NODE_REDIRECT, SKY_REDIRECT, Browser, exchange, json_of, post_form

from tokensvc.oauth import sessions


async def bearer(browser, http_client, base_url, scope="read write"):
    code = await browser.code_for("webapp", "http://127.0.0.1:8080/callback", scope=scope)
    return json_of(await exchange(http_client, base_url, code))["access_token"]


@pytest.mark.gen_test
async def test_an_app_shows_every_scope_a_live_token_of_it_holds(browser, http_client, base_url):
    """Consent to read observations:write, then again to read: the first refresh token still
    refreshes to both, so the account page and the API say both."""
    broad = await browser.code_for("skyplanner", SKY_REDIRECT, scope="read observations:write")
    first = json_of(await exchange(http_client, base_url, broad, client_id="skyplanner", secret=None,
                                   redirect_uri=SKY_REDIRECT))
    await browser.code_for("skyplanner", SKY_REDIRECT, scope="read")
    apps = json_of(await browser.fetch("/v1/me/connected-apps"))
    assert [app["scopes"] for app in apps] == [["read", "observations:write"]]
    page = await browser.fetch("/account")
    assert b"observations:write" in page.body
    # Once that token is revoked, what is in force is the latest consent's.
    revoked = await post_form(http_client, base_url + "/oauth/token/revoke",
                              {"token": first["refresh_token"], "client_id": "skyplanner"})
    assert revoked.code == 200
    assert [app["scopes"] for app in json_of(await browser.fetch("/v1/me/connected-apps"))] == [["read"]]


@pytest.mark.gen_test
async def test_a_user_lists_and_signs_out_their_sessions(browser, http_client, base_url):
    elsewhere = Browser(http_client, base_url)
    await elsewhere.login("alice")
    await browser.login("alice")
    listed = json_of(await browser.fetch("/v1/me/sessions"))
    assert len(listed) == 2 and sum(session["current"] for session in listed) == 1
    assert {"id", "browser", "userAgent", "address", "signedInAt", "lastSeenAt", "current"} <= set(listed[0])
    other = next(session for session in listed if not session["current"])
    # With the web app's cookie, an unsafe call needs the XSRF header; sessions:write is in write.
    assert (await browser.fetch("/v1/me/sessions/" + other["id"], "DELETE")).code == 403
    ended = await browser.fetch("/v1/me/sessions/" + other["id"], "DELETE",
                                headers={"X-XSRFToken": browser.cookies["_xsrf"]})
    assert ended.code == 204
    assert (await elsewhere.fetch("/v1/me")).code == 401
    assert (await browser.fetch("/v1/me/sessions/" + other["id"], "DELETE",
                                headers={"X-XSRFToken": browser.cookies["_xsrf"]})).code == 404
    assert [session["current"] for session in json_of(await browser.fetch("/v1/me/sessions"))] == [True]


@pytest.mark.gen_test
async def test_the_sessions_api_with_a_bearer_token(browser, http_client, base_url):
    await browser.login("alice")
    token = await bearer(browser, http_client, base_url, "read")
    listed = await http_client.fetch(base_url + "/v1/me/sessions", headers={"Authorization": f"Bearer {token}"})
    assert [session["current"] for session in json_of(listed)] == [False]  # a token is no session
    denied = await http_client.fetch(base_url + "/v1/me/sessions/" + json_of(listed)[0]["id"], method="DELETE",
                                     headers={"Authorization": f"Bearer {token}"}, raise_error=False)
    assert denied.code == 403 and json_of(denied)["scope"] == "sessions:write"


def test_a_browser_is_named_as_a_person_would():
    assert sessions.browser_of("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
                               "Chrome/156.0.0.0 Safari/537.36") == "Chrome on Linux"
    assert sessions.browser_of("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 "
                               "(KHTML, like Gecko) Version/17.0 Mobile/15E148 Safari/604.1") == "Safari on iOS"
    assert sessions.browser_of(None) == "An unknown browser"


@pytest.mark.gen_test
async def test_an_installation_is_listed_once_paired_and_no_longer_once_unpaired(browser, http_client, base_url):
    await browser.login("alice")
    listed = b'data-installation-id="backyard-scope"'
    assert listed not in (await browser.fetch("/account")).body  # operated, never paired
    page = await browser.authorize("node-agent", NODE_REDIRECT, installation_id="backyard-scope")
    assert (await browser.decide(page, "allow")).code == 302  # paired: the agent holds its grant
    account = await browser.fetch("/account")
    assert listed in account.body and b"A telescope \xc2\xb7 <code>backyard-scope</code>" in account.body
    stranger = Browser(http_client, base_url)
    await stranger.login("root")  # an admin sees every paired installation
    assert listed in (await stranger.fetch("/account")).body
    asking = await browser.fetch("/account?unpair=backyard-scope")
    assert b"Unpair Backyard telescope?" in asking.body
    unpaired = await browser.fetch("/account", "POST", {"action": "unpair", "installation_id": "backyard-scope",
                                                        "_xsrf": browser.cookies["_xsrf"]})
    assert unpaired.code == 303 and unpaired.headers["Location"] == "/account?unpaired=backyard-scope"
    after = await browser.fetch(unpaired.headers["Location"])
    assert b"Backyard telescope is unpaired" in after.body and listed not in after.body
    nobody = await browser.fetch("/account", "POST", {"action": "unpair", "installation_id": "no-such-scope",
                                                      "_xsrf": browser.cookies["_xsrf"]})
    assert nobody.code == 403


@pytest.mark.gen_test
@pytest.mark.parametrize("path,method,status", [("/nope", "GET", 404), ("/oauth/token", "GET", 405),
                                                ("/v1/me/sessions/x", "GET", 405)])
async def test_a_browser_navigation_gets_a_page_and_an_api_call_json(http_client, base_url, path, method, status):
    page = await http_client.fetch(base_url + path, method=method, raise_error=False,
                                   headers={"Accept": "text/html,application/xhtml+xml", "Sec-Fetch-Mode": "navigate"})
    assert page.code == status and page.headers["Content-Type"].startswith("text/html")
    assert b"<h1>" in page.body and b"Go to the home page" in page.body
    assert "style-src 'self'" in page.headers["Content-Security-Policy"]
    fetched = await http_client.fetch(base_url + path, method=method, raise_error=False,
                                      headers={"Accept": "text/html", "Sec-Fetch-Mode": "cors"})
    api = await http_client.fetch(base_url + path, method=method, raise_error=False)
    for answer in (fetched, api):
        assert answer.code == status and answer.headers["Content-Type"] == "application/json"



@pytest.mark.gen_test
@pytest.mark.parametrize("accept,page", [
    ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", True),  # a browser's navigation
    ("text/*;q=0.5, application/json;q=0.4", True),
    ("application/json, text/html;q=0.1", False),
    ("text/html;q=0", False),
    ("text/html;q=0.5, */*;q=0.5", False),  # a tie keeps JSON
    ("TEXT/HTML, application/*;q=0.2", True),
    ("text/html;q=0.3, application/json;q=0.7, */*;q=1", False),
    ("*/*", False),
    ("text/html;q=bogus", False),
])
async def test_an_error_page_only_for_a_client_that_prefers_html_to_json(http_client, base_url, accept, page):
    answer = await http_client.fetch(base_url + "/nope", raise_error=False, headers={"Accept": accept})
    assert answer.code == 404
    assert answer.headers["Content-Type"] == ("text/html; charset=UTF-8" if page else "application/json")

@pytest.mark.gen_test
@pytest.mark.parametrize("signed_in", [True, False], ids=["signed-in", "signed-out"])
@pytest.mark.parametrize("form", [{}, {"action": "explode"}, {"action": "remove", "client_id": "a b"}],
                         ids=["no-action", "unknown-action", "bad-client-id"])
async def test_an_account_form_that_is_not_valid_is_a_422_page_signed_in_or_not(browser, signed_in, form):
    """The form is checked before its caller: a fault is 422 (the page, a listed departure),
    never a sign-in the browser is sent to; a repeated field or one not UTF-8 too."""
    if signed_in:
        await browser.login("alice")
    xsrf = await browser.xsrf()
    answer = await browser.fetch("/account", "POST", {**form, "_xsrf": xsrf})
    assert answer.code == 422 and answer.headers["Content-Type"].startswith("text/html"), answer.body
    for raw in (b"action=remove&action=unpair", b"action=%FF"):
        cookies = "; ".join(f"{name}={value}" for name, value in browser.cookies.items())
        faulty = await browser.client.fetch(browser.base_url + "/account", method="POST", body=raw,
                                            raise_error=False, follow_redirects=False, headers={
                                                "Cookie": cookies, "X-XSRFToken": xsrf,
                                                "Content-Type": "application/x-www-form-urlencoded"})
        assert faulty.code == 422, (raw, faulty.code)


@pytest.mark.gen_test
async def test_an_expired_sign_in_form_is_shown_again(browser):
    await browser.xsrf()
    browser.cookies["_xsrf"] = "expired.token"
    again = await browser.fetch("/login", "POST", {"username": "alice", "password": "alice-password",
                                                  "_xsrf": "expired.token"})
    assert again.code == 403 and b"This form had expired. Sign in again." in again.body
    assert "tokensvc_session" not in browser.cookies  # nothing signed in
    assert (await browser.login("alice")).code == 302  # the new form works


@pytest.mark.gen_test
async def test_a_third_party_app_sees_sessions_and_other_apps_only_with_their_own_scopes(
        browser, http_client, base_url, store):
    """Where the user is signed in (addresses, browsers) and which other apps they use are
    theirs: the account page and the service's own apps see them with read; a third-party app
    needs sessions:read or connected-apps:read, named in its token (read does not cover them)."""
    from dataclasses import replace

    async def sky(scope):
        code = await browser.code_for("skyplanner", SKY_REDIRECT, scope=scope)
        return json_of(await exchange(http_client, base_url, code, client_id="skyplanner", secret=None,
                                      redirect_uri=SKY_REDIRECT))["access_token"]

    async def listing(path, token):
        return await http_client.fetch(base_url + path, headers={"Authorization": f"Bearer {token}"},
                                       raise_error=False)

    read_only = await sky("read")
    for path, scope in (("/v1/me/sessions", "sessions:read"), ("/v1/me/connected-apps", "connected-apps:read")):
        refused = await listing(path, read_only)
        assert refused.code == 403
        assert json_of(refused)["error"] == "insufficient_scope" and json_of(refused)["scope"] == scope
        assert (await listing(path, await bearer(browser, http_client, base_url, "read"))).code == 200  # first-party
        assert (await browser.fetch(path)).code == 200  # the user, on the account page's cookie
    skyplanner = await store.get_client("skyplanner")
    await store.put_client(replace(skyplanner, allowed_scopes=[*skyplanner.scopes, "sessions:read",
                                                               "connected-apps:read"]))
    consent = await browser.authorize("skyplanner", SKY_REDIRECT, scope="read sessions:read connected-apps:read")
    assert b"See where you are signed in (browsers and addresses)" in consent.body
    granted = await sky("read sessions:read connected-apps:read")
    assert json_of(await listing("/v1/me/sessions", granted))[0]["address"] == "127.0.0.1"
    assert sorted(app["clientId"] for app in json_of(await listing("/v1/me/connected-apps", granted))) == [
        "skyplanner", "webapp"]  # granted in the same tick of the test's clock: in no particular order
