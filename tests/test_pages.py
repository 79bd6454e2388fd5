"""The HTML pages' policies and the account page, in process (the same flows run in a real
browser in test_browser.py)."""

import re
from urllib.parse import urlencode

import pytest
from helpers import CHALLENGE, SKY_REDIRECT, WEBAPP_REDIRECT, Browser, exchange, json_of, make_config

from tokensvc.handlers.edge.headers import csp_source, page_csp


def directive(response, name: str) -> list[str]:
    for part in response.headers["Content-Security-Policy"].split(";"):
        words = part.split()
        if words and words[0] == name:
            return words[1:]
    raise AssertionError(f"no {name} in {response.headers['Content-Security-Policy']}")


def authorize_path(client_id: str, redirect_uri: str) -> str:
    return "/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "state": "s",
        "code_challenge": CHALLENGE, "code_challenge_method": "S256"})


@pytest.mark.gen_test
async def test_sign_in_page_lets_its_form_lead_on_to_the_verified_redirect(browser):
    page = await browser.fetch("/login?" + urlencode({"next": authorize_path("webapp", WEBAPP_REDIRECT)}))
    assert page.code == 200
    assert directive(page, "form-action") == ["'self'", WEBAPP_REDIRECT]
    assert b"to continue to <strong>Web app</strong>" in page.body
    # The re-rendered form after a wrong password keeps it.
    wrong = await browser.fetch("/login", "POST", {"username": "alice", "password": "nope",
                                                   "_xsrf": await browser.xsrf(),
                                                   "next": authorize_path("webapp", WEBAPP_REDIRECT)})
    assert wrong.code == 401 and directive(wrong, "form-action") == ["'self'", WEBAPP_REDIRECT]


@pytest.mark.gen_test
@pytest.mark.parametrize("target", [
    "/", "/account", authorize_path("webapp", "http://evil.example/cb"), authorize_path("nobody", WEBAPP_REDIRECT),
    "/oauth/authorize?client_id=webapp",
])
async def test_sign_in_page_is_self_only_unless_a_verified_request_is_behind_it(browser, target):
    page = await browser.fetch("/login?" + urlencode({"next": target}))
    assert page.code == 200
    assert directive(page, "form-action") == ["'self'"] and directive(page, "img-src") == ["'self'"]
    assert b"to continue to" not in page.body


@pytest.mark.gen_test
async def test_consent_page_allows_the_logo_and_the_redirect(browser):
    await browser.login("alice")
    page = await browser.authorize("skyplanner", SKY_REDIRECT, scope="read")
    assert page.code == 200
    assert directive(page, "img-src") == ["'self'", "https://skyplanner.example/logo.png"]
    assert directive(page, "form-action") == ["'self'", SKY_REDIRECT]
    assert b'href="/account#connected-apps"' in page.body


def test_csp_sources_are_as_narrow_as_the_url_allows():
    assert csp_source("https://cdn.example/a/logo.png") == "https://cdn.example/a/logo.png"
    assert csp_source("http://127.0.0.1:9000/callback") == "http://127.0.0.1:9000/callback"
    assert csp_source("https://cdn.example/logo.png?v=2") == "https://cdn.example"
    assert csp_source("https://cdn.example/a;b") == "https://cdn.example"
    assert csp_source("com.example.app:/callback") == "com.example.app:"
    assert csp_source("http://[::1]:8000/cb") == "http:" and csp_source("https://[::1]:8443/cb") == "https:"
    assert csp_source("/relative") is None
    assert "img-src 'self' https://a.example;" in page_csp(img_src=["https://a.example", "https://a.example"])


@pytest.mark.gen_test
async def test_account_page_needs_a_session(browser):
    response = await browser.fetch("/account")
    assert response.code == 303 and response.headers["Location"] == "/login?next=%2Faccount"
    removed = await browser.fetch("/account", "POST", {"action": "remove", "client_id": "skyplanner",
                                                       "_xsrf": await browser.xsrf()})
    assert removed.code == 303 and removed.headers["Location"].startswith("/login?")


@pytest.mark.gen_test
async def test_account_page_lists_and_removes_a_connected_app(browser, http_client, base_url):
    code = await browser.code_for("skyplanner", SKY_REDIRECT, scope="read")
    tokens = await exchange(http_client, base_url, code, client_id="skyplanner", secret=None,
                            redirect_uri=SKY_REDIRECT)
    access = json_of(tokens)["access_token"]
    page = await browser.fetch("/account")
    assert page.code == 200 and b'data-client-id="skyplanner"' in page.body and b"SkyPlanner" in page.body
    assert directive(page, "img-src") == ["'self'", "https://skyplanner.example/logo.png"]

    # Remove asks first: a confirmation naming the app, with its own button.
    assert b'aria-label="Remove SkyPlanner"' in page.body
    asking = await browser.fetch("/account?remove=skyplanner")
    assert b"Remove SkyPlanner?" in asking.body and b'name="action" value="remove"' in asking.body

    # The Remove form is XSRF-protected.
    refused = await browser.fetch("/account", "POST", {"action": "remove", "client_id": "skyplanner"})
    assert refused.code == 403
    invalid = await browser.fetch("/account", "POST", {"action": "remove", "client_id": "no spaces",
                                                       "_xsrf": browser.cookies["_xsrf"]})
    assert invalid.code == 422 and b"<html" in invalid.body

    removed = await browser.fetch("/account", "POST", {"action": "remove", "client_id": "skyplanner",
                                                       "_xsrf": browser.cookies["_xsrf"]})
    assert removed.code == 303 and removed.headers["Location"] == "/account?removed=skyplanner"
    page = await browser.fetch(removed.headers["Location"])
    assert b'data-client-id="skyplanner"' not in page.body and b"No app has access" in page.body
    assert b"SkyPlanner no longer has access to your account." in page.body
    me = await http_client.fetch(base_url + "/v1/me", headers={"Authorization": f"Bearer {access}"},
                                 raise_error=False)
    assert me.code == 401


@pytest.mark.gen_test
async def test_home_page_links_to_the_account_page_when_signed_in(browser):
    assert b'href="/account"' not in (await browser.fetch("/")).body
    await browser.login("alice")
    assert b'href="/account"' in (await browser.fetch("/")).body


@pytest.mark.gen_test
@pytest.mark.parametrize("control", ["\x00", "\x1f", "\x7f", "\x85", "\x9f"])
async def test_a_control_character_in_next_falls_back_to_home(browser, control):
    """C0, DEL and C1 characters in ``next``: sign-in lands on ``/``, never a 5xx."""
    target = f"/account{control}x"
    page = await browser.fetch("/login?" + urlencode({"next": target}))
    shown = re.search(rb'name="next" value="([^"]*)"', page.body).group(1).decode()
    assert page.code == 200 and not re.search(r"[\x00-\x1f\x7f-\x9f]", shown)  # "/" or tornado's cleaned copy
    response = await browser.fetch("/login", "POST", {"username": "alice", "password": "alice-password",
                                                      "next": target, "_xsrf": browser.cookies["_xsrf"]})
    assert response.code == 302 and response.headers["Location"] == "/"


@pytest.mark.gen_test
async def test_every_location_is_checked_before_it_is_sent(browser, caplog):
    from tokensvc.handlers.edge.headers import safe_location

    assert safe_location("/account") == "/account"
    assert safe_location("https://client.example/cb?code=abc&state=x%7Fy") == "https://client.example/cb?code=abc&state=x%7Fy"
    for bad in ("/x\x7f", "/x\r\nSet-Cookie: a=b", "https://client.example/\x85"):
        assert safe_location(bad) == "/"


@pytest.mark.gen_test
@pytest.mark.parametrize("method,path,allow", [
    ("DELETE", "/login", "GET, HEAD, POST"), ("PUT", "/account", "GET, HEAD, POST"), ("POST", "/", "GET, HEAD"),
    ("PUT", "/logout", "GET, HEAD, POST"), ("DELETE", "/oauth/authorize", "GET, HEAD, POST"),
    ("POST", "/v1/ws", "GET, HEAD"),
])
async def test_every_405_carries_allow(http_client, base_url, method, path, allow):
    response = await http_client.fetch(base_url + path, method=method, raise_error=False,
                                       allow_nonstandard_methods=True, body=b"" if method in ("POST", "PUT") else None)
    assert response.code == 405 and response.headers["Allow"] == allow
    assert response.headers["X-Frame-Options"] == "DENY"  # the security headers, on the socket's refusal too


@pytest.mark.gen_test
async def test_the_consent_page_shows_only_words_an_operator_registered(browser, store):
    from tokensvc.records import Client

    await store.put_client(Client("plain", "Plain", ["https://plain.example/cb"], ["read", "photos:read"]))
    await browser.login("alice")
    page = (await browser.authorize("plain", "https://plain.example/cb", scope="read photos:read")).body.decode()
    assert "Read your data" in page  # the service's own word for its own scope
    assert "<span>photos:read</span>" in page  # no description configured: as the operator wrote it
    assert "Read your photos" not in page
    sky = (await browser.authorize("skyplanner", SKY_REDIRECT, scope="observations:write")).body.decode()
    assert "Create and change your observations" in sky  # the configured description


def test_scope_descriptions_are_checked(tmp_path):
    from tokensvc import config

    for text, message in (('[scopes]\n"a:read" = 3\n', "scopes.a:read: expected a description"),
                          ('scopes = "x"\n', "scopes: expected a table")):
        path = tmp_path / "c.toml"
        path.write_text("demo = true\n" + text)
        with pytest.raises(config.ConfigError, match=message):
            config.load(path, environ={})


@pytest.mark.gen_test
@pytest.mark.parametrize("path", ["/static/style.css", "/favicon.ico", "/static/nothing.css"])
async def test_static_files_carry_the_security_headers(http_client, base_url, path):
    response = await http_client.fetch(base_url + path, raise_error=False)
    assert response.code == (404 if "nothing" in path else 200)
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'none'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY" and response.headers["X-Request-ID"]


@pytest.mark.gen_test
async def test_signing_in_ends_the_session_the_browser_had(browser, http_client, base_url):
    await browser.login("alice")
    before = dict(browser.cookies)
    assert (await browser.fetch("/v1/me")).code == 200
    await browser.login("root")  # someone else signs in on the same browser
    stale = Browser(http_client, base_url, cookies=before)
    assert (await stale.fetch("/v1/me")).code == 401  # alice's session is over, not just replaced
    assert json_of(await browser.fetch("/v1/me"))["username"] == "root"


@pytest.mark.gen_test
@pytest.mark.parametrize("host,status", [
    ("evil.example", 400), ("evil.example:8080", 400), ("127.0.0.1", 200), ("localhost:1234", 200),
    ("[::1]:8080", 200), ("tokensvc.internal", 200),
])
@pytest.mark.parametrize("config", [make_config(server={"allowed_hosts": ["tokensvc.internal"]})])
async def test_only_the_configured_host_names_are_served(http_client, base_url, config, host, status):
    """DNS rebinding: a name an attacker points at this address reaches nothing; the public
    URLs' names, server.allowed_hosts and the loopback names do (tests/test_hosts.py)."""
    for path in ("/metrics", "/oauth/clients", "/login"):
        response = await http_client.fetch(base_url + path, headers={"Host": host}, raise_error=False)
        assert response.code == status, (path, host)
    probe = await http_client.fetch(base_url + "/healthz", headers={"Host": "10.4.0.17:8080"})
    assert probe.code == 200  # a load balancer's probe names the instance's own address
