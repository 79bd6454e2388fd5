"""GET/POST /oauth/authorize, the login page and the consent page."""

import email.utils
import re
from datetime import UTC, datetime
from urllib.parse import urlencode, urlsplit

import pytest
from helpers import CHALLENGE, NODE_REDIRECT, SKY_REDIRECT, WEBAPP_REDIRECT, another_confirmation, query_of

import tokensvc
from tokensvc.oauth import hashing


@pytest.mark.gen_test
async def test_unknown_client_gets_an_error_page_and_no_redirect(browser):
    response = await browser.authorize("nobody", WEBAPP_REDIRECT)
    assert response.code == 400
    assert "Location" not in response.headers
    assert response.headers["Content-Type"].startswith("text/html")
    assert b"The app that sent you here is not known to this service." in response.body


@pytest.mark.gen_test
async def test_unregistered_redirect_uri_gets_an_error_page_and_no_redirect(browser):
    for uri in ("https://evil.example/cb", WEBAPP_REDIRECT + "/extra", WEBAPP_REDIRECT + "?x=1",
                WEBAPP_REDIRECT.upper()):
        response = await browser.authorize("webapp", uri)
        assert response.code == 400, uri
        assert "Location" not in response.headers
        # In the words of the person who followed the link: no parameter names.
        assert b"Web app asked to send you back to an address it has not registered" in response.body
        assert b"redirect_uri" not in response.body and b"client_id" not in response.body


@pytest.mark.gen_test
async def test_missing_redirect_uri_or_client_id_is_an_error_page(browser):
    response = await browser.fetch("/oauth/authorize?" + urlencode({"client_id": "webapp", "response_type": "code"}))
    assert response.code == 400 and "Location" not in response.headers
    assert b"Web app did not say where to send you back to." in response.body
    response = await browser.fetch("/oauth/authorize?" + urlencode({"redirect_uri": WEBAPP_REDIRECT}))
    assert response.code == 400 and "Location" not in response.headers
    assert b"does not say which app it comes from" in response.body and b"client_id" not in response.body


@pytest.mark.gen_test
async def test_not_signed_in_redirects_to_login_with_next(browser):
    response = await browser.authorize("webapp", WEBAPP_REDIRECT)
    assert response.code == 302
    location = response.headers["Location"]
    assert location.startswith("/login?next=")
    assert query_of(location)["next"].startswith("/oauth/authorize?")


@pytest.mark.parametrize("params,error", [
    ({"code_challenge": None}, "invalid_request"),
    ({"code_challenge_method": "plain"}, "invalid_request"),
    ({"code_challenge_method": None}, "invalid_request"),
    ({"code_challenge": "too-short"}, "invalid_request"),
    ({"response_type": "token"}, "unsupported_response_type"),
    ({"response_type": None}, "invalid_request"),
    ({"scope": "read delete-everything"}, "invalid_scope"),
])
@pytest.mark.gen_test
async def test_faults_redirect_back_with_error_and_state(browser, params, error):
    await browser.login("alice")
    query = {"response_type": "code", "client_id": "webapp", "redirect_uri": WEBAPP_REDIRECT,
             "state": "opaque state/+=", "code_challenge": CHALLENGE, "code_challenge_method": "S256"}
    for key, value in params.items():
        if value is None:
            query.pop(key)
        else:
            query[key] = value
    response = await browser.fetch("/oauth/authorize?" + urlencode(query))
    assert response.code == 302, response.body
    location = response.headers["Location"]
    assert location.startswith(WEBAPP_REDIRECT + "?")
    result = query_of(location)
    assert result["error"] == error
    assert result["state"] == "opaque state/+="
    assert "code" not in result


@pytest.mark.gen_test
async def test_repeated_parameter_is_invalid_request(browser):
    await browser.login("alice")
    query = urlencode({"response_type": "code", "client_id": "webapp", "redirect_uri": WEBAPP_REDIRECT,
                       "code_challenge": CHALLENGE, "code_challenge_method": "S256", "state": "s"})
    response = await browser.fetch("/oauth/authorize?" + query + "&scope=read&scope=write")
    assert query_of(response.headers["Location"])["error"] == "invalid_request"


@pytest.mark.gen_test
async def test_first_party_client_gets_a_code_without_consent(browser, store):
    await browser.login("alice")
    response = await browser.authorize("webapp", WEBAPP_REDIRECT, state="xyz")
    assert response.code == 302
    result = query_of(response.headers["Location"])
    assert result["state"] == "xyz"
    assert result["iss"] == "http://127.0.0.1:8080"
    code = await store.get_code(hashing.digest(result["code"]))
    assert code is not None and code.consumed_at is None
    assert code.scopes == ["read", "write", "connected-apps:write"]  # admin only for admins
    assert code.code_challenge == CHALLENGE
    # Stored only as a hash.
    assert await store.get_code(result["code"]) is None


@pytest.mark.gen_test
async def test_a_client_stored_before_the_stricter_rule_still_gets_its_codes(browser, store):
    """A redirect URI 0.9.0 accepted and the rule now refuses (user info, a port beyond 65535,
    an upper-case scheme) is still matched exactly and answered: upgrading breaks no client."""
    from tokensvc.identifiers import redirect_uri_problem
    from tokensvc.records import Client

    kept = ["https://user@legacy.example:99999/cb", "HTTPS://legacy.example/cb"]
    assert all(redirect_uri_problem(uri) is not None for uri in kept)
    await store.put_client(Client("legacy", "Legacy", kept, ["read"], secret_hash=hashing.digest("s" * 43),
                                  first_party=True))
    await browser.login("alice")
    for uri in kept:
        response = await browser.authorize("legacy", uri, state="old")
        assert response.code == 302, response.body
        location = response.headers["Location"]
        assert location.lower().startswith(uri.lower() + "?") and query_of(location)["code"]


@pytest.mark.gen_test
async def test_admin_scope_is_for_admin_users_only(browser):
    await browser.login("alice")
    response = await browser.authorize("webapp", WEBAPP_REDIRECT, scope="read admin")
    assert query_of(response.headers["Location"])["error"] == "invalid_scope"


@pytest.mark.gen_test
async def test_omitted_scope_means_the_clients_allowed_scopes(browser, store):
    await browser.login("root")
    response = await browser.authorize("webapp", WEBAPP_REDIRECT)
    assert response.code == 200  # admin among them: never without the user's click
    response = await browser.decide(response, "allow")
    code = await store.get_code(hashing.digest(query_of(response.headers["Location"])["code"]))
    assert code.scopes == ["read", "write", "connected-apps:write", "admin"]


@pytest.mark.gen_test
async def test_third_party_client_shows_a_consent_page(browser):
    await browser.login("alice")
    response = await browser.authorize("skyplanner", SKY_REDIRECT, scope="read observations:write")
    assert response.code == 200
    html = response.body.decode()
    assert "SkyPlanner" in html and "Plans your observing nights" in html
    assert "https://skyplanner.example/logo.png" in html
    assert "observations:write" in html and "Create and change your observations" in html
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert "form-action 'self' http://127.0.0.1:9000" in response.headers["Content-Security-Policy"]
    fields = browser.form_fields(html)
    assert fields["_xsrf"] and fields["code_challenge"] == CHALLENGE and fields["client_id"] == "skyplanner"


@pytest.mark.gen_test
async def test_consent_allow_issues_a_code(browser):
    await browser.login("alice")
    page = await browser.authorize("skyplanner", SKY_REDIRECT, state="s1")
    response = await browser.decide(page, "allow")
    assert response.code == 302
    result = query_of(response.headers["Location"])
    assert result["state"] == "s1" and result["code"]


@pytest.mark.gen_test
async def test_consent_deny_redirects_with_access_denied(browser):
    await browser.login("alice")
    page = await browser.authorize("skyplanner", SKY_REDIRECT, state="s2")
    response = await browser.decide(page, "deny")
    assert response.code == 302
    result = query_of(response.headers["Location"])
    assert result == {"error": "access_denied", "error_description": "The user denied the request",
                      "state": "s2", "iss": "http://127.0.0.1:8080"}


@pytest.mark.gen_test
async def test_consent_post_without_xsrf_is_refused(browser):
    await browser.login("alice")
    page = await browser.authorize("skyplanner", SKY_REDIRECT)
    fields = browser.form_fields(page.body.decode())
    fields.pop("_xsrf")
    fields["decision"] = "allow"
    response = await browser.fetch("/oauth/authorize", "POST", fields)
    assert response.code == 403
    assert "Location" not in response.headers


@pytest.mark.gen_test
async def test_consent_post_revalidates_the_request(browser):
    await browser.login("alice")
    page = await browser.authorize("skyplanner", SKY_REDIRECT)
    fields = browser.form_fields(page.body.decode())
    fields.update(decision="allow", redirect_uri="https://evil.example/cb")
    response = await browser.fetch("/oauth/authorize", "POST", fields)
    assert response.code == 400 and "Location" not in response.headers


CLI_REDIRECT = "http://127.0.0.1:53817/callback"  # tokensvc login's loopback port


@pytest.mark.gen_test
@pytest.mark.parametrize("client_id,redirect_uri,scope,user,where", [
    ("tokensvc-cli", CLI_REDIRECT, "admin", "root", "tokensvc command line on this computer, port 53817"),
    ("node-agent", NODE_REDIRECT, "read write", "alice", "Node agent on this computer, port 8765"),
    ("node-agent", "http://[::1]:8765/paired", "read", "alice", "Node agent on this computer, port 8765"),
    ("desk-app", "com.example.desk:/cb", "read", "alice",
     "Desk app in the app that opens com.example.desk: links on this device"),
    ("webapp", WEBAPP_REDIRECT, "read admin", "root", "Web app on this computer, port 8080"),
], ids=["cli-admin", "native-loopback", "native-ipv6", "native-scheme", "admin-confidential"])
async def test_no_code_leaves_without_the_users_click_where_nothing_vouches_for_the_app(
        browser, store, client_id, redirect_uri, scope, user, where):
    """RFC 8252 §8.6: a public client with a loopback or private-use redirect cannot prove it is
    the app it names, so even a first-party one gets the one-click page, every time (an earlier
    approval proves nothing either); and admin is never granted without it, whatever the client."""
    from tokensvc.records import Client

    await store.put_client(Client("desk-app", "Desk app", ["com.example.desk:/cb"], ["read"], first_party=True))
    await store.put_client(Client("node-agent", "Node agent", [NODE_REDIRECT, "http://[::1]/paired"],
                                  ["read", "write"], first_party=True))
    await browser.login(user)
    for issued in range(2):
        page = await browser.authorize(client_id, redirect_uri, scope=scope)
        assert page.code == 200 and "Location" not in page.headers
        html = page.body.decode()
        text = " ".join(re.sub(r"<[^>]+>", "", html).split())
        assert "Continue to" in text and f"Your sign-in goes to {where}." in text
        for word in scope.split():
            assert f'<code class="scope">{word}</code>' in html
        assert page.headers["X-Frame-Options"] == "DENY"
        assert "form-action 'self' " in page.headers["Content-Security-Policy"]
        assert code_count(store) == issued  # none for this request yet
        allowed = await browser.decide(page, "allow")
        assert allowed.code == 302 and allowed.headers["Location"].startswith(redirect_uri + "?code=")
    denied = await browser.decide(await browser.authorize(client_id, redirect_uri, scope=scope), "deny")
    assert query_of(denied.headers["Location"])["error"] == "access_denied"


@pytest.mark.gen_test
@pytest.mark.parametrize("headers,xsrf", [
    ({}, None),  # a page elsewhere posting the form: it cannot read the XSRF cookie
    ({"Sec-Fetch-Site": "same-site"}, "valid"),  # another port of 127.0.0.1: same site, another origin
    ({"Sec-Fetch-Site": "cross-site"}, "valid"),
    ({"Origin": "http://127.0.0.1:53817"}, "valid"),
    ({"Origin": "null"}, "valid"),  # a sandboxed frame or a data: URL, saying nothing of where it is
], ids=["no-token", "same-site", "cross-site", "foreign-origin", "null-origin"])
async def test_the_one_click_page_is_only_answered_from_itself(browser, store, headers, xsrf):
    await browser.login("root")
    page = await browser.authorize("tokensvc-cli", CLI_REDIRECT, scope="admin")
    fields = browser.form_fields(page.body.decode())
    if xsrf is None:
        fields.pop("_xsrf")
    response = await browser.fetch("/oauth/authorize", "POST", {**fields, "decision": "allow"}, headers=headers)
    assert response.code == 403 and "Location" not in response.headers
    assert code_count(store) == 0


def code_count(store) -> int:
    """Codes the memory store holds, whatever their state."""
    return len(store._codes)


@pytest.mark.gen_test
async def test_pairing_an_installation_needs_an_operator(browser, store):
    await browser.login("alice")
    page = await browser.authorize("node-agent", NODE_REDIRECT, installation_id="backyard-scope")
    # Even the first-party agent shows which installation it pairs before the code is issued.
    assert page.code == 200 and b"Pair Backyard telescope" in page.body and b"a telescope, with" in page.body
    assert b"Not alice? <button type=\"submit\" class=\"link\">Switch account</button>" in page.body
    response = await browser.decide(page, "allow")
    code = await store.get_code(hashing.digest(query_of(response.headers["Location"])["code"]))
    assert code.installation_id == "backyard-scope" and code.user_id is None
    cancelled = await browser.decide(await browser.authorize("node-agent", NODE_REDIRECT,
                                                             installation_id="backyard-scope"), "deny")
    assert query_of(cancelled.headers["Location"])["error"] == "access_denied"


@pytest.mark.gen_test
async def test_pairing_an_installation_one_does_not_operate_is_denied(browser, store, config):
    from tokensvc.records import Installation

    await store.put_installation(Installation("other-scope", "Other", "observatory", []))
    await browser.login("alice")
    for installation in ("other-scope", "no-such-scope"):
        response = await browser.authorize("node-agent", NODE_REDIRECT, installation_id=installation)
        assert query_of(response.headers["Location"])["error"] == "access_denied"
    # An admin may pair any installation.
    admin = type(browser)(browser.client, browser.base_url, browser.clock)
    await admin.login("root")
    page = await admin.authorize("node-agent", NODE_REDIRECT, installation_id="other-scope")
    assert b"an observatory, with" in page.body  # in good English, whatever the kind
    assert "code" in query_of((await admin.decide(page, "allow")).headers["Location"])


# -- login ---------------------------------------------------------------------------

@pytest.mark.gen_test
async def test_login_sets_a_hardened_session_cookie_and_returns_to_next(browser, store):
    response = await browser.login("alice", next_path="/oauth/authorize?x=1")
    assert response.code == 302
    assert response.headers["Location"] == "/oauth/authorize?x=1"
    cookie = [h for h in response.headers.get_list("Set-Cookie") if h.startswith("tokensvc_session=")][0]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # the test auth_url is http
    xsrf = [h for h in response.headers.get_list("Set-Cookie") if h.startswith("_xsrf=")][0]
    # No script reads it (the pages carry the token in their forms); one on another port would.
    assert "HttpOnly" in xsrf and "SameSite=Lax" in xsrf and "Path=/" in xsrf
    # The server keeps only a hash of the session id.
    assert browser.cookies["tokensvc_session"] not in repr(store._sessions)


@pytest.mark.gen_test
async def test_wrong_credentials_get_401_and_one_message(browser):
    wrong_password = await browser.login("alice", "not-the-password")
    unknown_user = await browser.login("mallory", "whatever")
    for response in (wrong_password, unknown_user):
        assert response.code == 401
        assert b"Wrong username or password." in response.body
        assert b'name="password"' in response.body
    assert "tokensvc_session" not in browser.cookies


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/x", "/\\evil.example",
                                    "javascript:alert(1)", "http:/evil", ""])
@pytest.mark.gen_test
async def test_login_never_redirects_off_site(browser, target):
    response = await browser.login("alice", next_path=target)
    assert response.code == 302
    assert response.headers["Location"] == "/"


@pytest.mark.gen_test
async def test_login_without_xsrf_is_refused(browser):
    await browser.fetch("/login")
    response = await browser.fetch("/login", "POST", {"username": "alice", "password": "alice-password"})
    assert response.code == 403


@pytest.mark.gen_test
async def test_html_pages_carry_a_strict_csp(browser):
    response = await browser.fetch("/login")
    csp = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "script-src" not in csp
    assert response.headers["X-Frame-Options"] == "DENY"
    # Its forms post their own origin (Origin: null is refused); no other origin gets a Referer.
    assert response.headers["Referrer-Policy"] == "same-origin"
    assert '<meta name="referrer" content="same-origin">' in response.body.decode()


@pytest.mark.gen_test
async def test_the_authorization_endpoint_is_auth_urls_not_base_urls(http_client, store):
    """With auth_url on another host than base_url, a request at base_url's host is sent on to
    auth_url (GET, its query whole) or finds nothing (POST); at auth_url's, or where both name
    one host, it is served."""
    import tornado.httpserver
    import tornado.testing
    from helpers import make_config

    from tokensvc.app import make_app
    from tokensvc.bootstrap import seed

    query = urlencode({"response_type": "code", "client_id": "webapp", "redirect_uri": WEBAPP_REDIRECT,
                       "code_challenge": CHALLENGE, "code_challenge_method": "S256", "state": "s t"})
    for base, auth, moved in (("https://api.example", "https://login.example", True),
                              ("https://one.example", "https://one.example:8443", False)):
        config = make_config(base_url=base, auth_url=auth)
        await seed(store, config)
        sock, port = tornado.testing.bind_unused_port()
        server = tornado.httpserver.HTTPServer(make_app(config, store))
        server.add_sockets([sock])
        try:
            async def fetch(host, method="GET", port=port):
                return await http_client.fetch(f"http://127.0.0.1:{port}/oauth/authorize?{query}", method=method,
                                                headers={"Host": host}, follow_redirects=False, raise_error=False,
                                                body=b"" if method == "POST" else None)

            at_base = await fetch(urlsplit(base).netloc)
            if moved:
                assert at_base.code == 302 and at_base.headers["Location"] == f"{auth}/oauth/authorize?{query}"
                assert (await fetch(urlsplit(base).netloc, "POST")).code == 404
            else:
                assert at_base.code == 302 and at_base.headers["Location"].startswith("/login?next=")
            at_auth = await fetch(urlsplit(auth).netloc)
            assert at_auth.code == 302 and at_auth.headers["Location"].startswith("/login?next=")
        finally:
            server.stop()


@pytest.mark.gen_test
async def test_secure_cookie_on_https(http_client, base_url, store, io_loop):
    # A separate app whose public URL is https: its session cookie must be Secure.
    from helpers import Browser, make_config

    from tokensvc.app import make_app
    from tokensvc.bootstrap import seed

    config = make_config(auth_url="https://auth.example", base_url="https://auth.example",
                         server={"allowed_hosts": ["127.0.0.1"]})  # reached here on loopback
    await seed(store, config)
    import tornado.httpserver
    import tornado.testing

    sock, port = tornado.testing.bind_unused_port()
    server = tornado.httpserver.HTTPServer(make_app(config, store))
    server.add_sockets([sock])
    try:
        other = Browser(http_client, f"http://127.0.0.1:{port}")
        page = await other.fetch("/login")
        xsrf_cookie = [h for h in page.headers.get_list("Set-Cookie") if h.startswith("__Host-_xsrf=")][0]
        assert "Secure" in xsrf_cookie and "Path=/" in xsrf_cookie and "Domain" not in xsrf_cookie
        assert "HttpOnly" in xsrf_cookie
        response = await other.fetch("/login", "POST", {"username": "alice", "password": "alice-password",
                                                        "_xsrf": other.cookies["__Host-_xsrf"]})
        assert response.code == 302
        cookie = [h for h in response.headers.get_list("Set-Cookie") if h.startswith("__Host-tokensvc_session=")][0]
        assert "Secure" in cookie and "Path=/" in cookie and "Domain" not in cookie and "HttpOnly" in cookie
        # Cleared as it was set: a browser ignores a __Host- cookie's clearing without Secure.
        for path in ("/logout", "/oauth/sign-out"):
            if "__Host-tokensvc_session" not in other.cookies:
                await other.fetch("/login", "POST", {"username": "alice", "password": "alice-password",
                                                     "_xsrf": other.cookies["__Host-_xsrf"]})
            token = other.cookies["__Host-_xsrf"]
            signed_out = await other.fetch(path, "POST", {"_xsrf": token}, headers={"X-XSRFToken": token})
            assert signed_out.code == (303 if path == "/logout" else 200), (path, signed_out.body)
            cleared = [h for h in signed_out.headers.get_list("Set-Cookie")
                       if h.startswith("__Host-tokensvc_session=")][0]
            expires = email.utils.parsedate_to_datetime(re.search(r"expires=([^;]+)", cleared).group(1))
            assert "Secure" in cleared and "Path=/" in cleared and expires < datetime.now(UTC)
    finally:
        server.stop()


@pytest.mark.gen_test
async def test_home_page_and_logout(browser):
    await browser.login("alice")
    home = await browser.fetch("/")
    assert b"Signed in as alice" in home.body
    response = await browser.fetch("/logout", "POST", {"_xsrf": browser.cookies["_xsrf"]})
    # Sent on with 303, so that Back never offers to post the form again.
    assert response.code == 303 and response.headers["Location"] == "/logout"
    assert b"You are signed out" in (await browser.fetch("/logout")).body
    home = await browser.fetch("/")
    assert b"Signed in as" not in home.body
    assert urlsplit(browser.base_url).scheme == "http"


@pytest.mark.parametrize("asked,matches", [
    ("http://127.0.0.1:8765/paired", True),  # as registered
    ("http://127.0.0.1:50123/paired", True),  # any port (RFC 8252 §7.3)
    ("http://127.0.0.1/paired", True),
    ("http://127.0.0.1:50123/paired?x=1", False),  # nothing else may differ
    ("http://127.0.0.1:50123/paired/", False),
    ("http://127.0.0.1:50123/other", False),
    ("http://127.0.0.2:50123/paired", False),
    ("http://localhost:50123/paired", False),  # a name, not a loopback IP (RFC 8252 §8.3)
    ("https://127.0.0.1:50123/paired", False),
    ("http://evil@127.0.0.1:50123/paired", False),
    ("http://127.0.0.1:50123/paired#x", False),
    ("http://127.0.0.1:port/paired", False),
])
def test_a_native_apps_loopback_redirect_uri_matches_on_any_port_and_nothing_else(asked, matches):
    from tokensvc.oauth.authorization import registered
    from tokensvc.records import Client

    native = Client("node-agent", "Node agent", [NODE_REDIRECT, "https://app.example/cb"])
    assert registered(asked, native) is matches


def test_the_ipv6_loopback_and_https_redirects_match_exactly():
    from tokensvc.oauth.authorization import registered
    from tokensvc.records import Client

    assert registered("http://[::1]:4000/callback", Client("cli", "CLI", ["http://[::1]/callback"]))
    assert not registered("https://app.example:444/cb", Client("app", "App", ["https://app.example/cb"]))


@pytest.mark.parametrize("asked,matches", [
    ("http://127.0.0.1:8080/callback", True),  # as registered, and nothing else
    ("http://127.0.0.1:50999/callback", False),  # another port of the host: any local process's
    ("http://127.0.0.1/callback", False),
    ("http://[::1]:8080/callback", False),
])
def test_a_confidential_clients_loopback_redirect_uri_matches_exactly(asked, matches):
    """The any-port rule is a native app's (RFC 8252 §7.3: a public client): a confidential
    client is a server at an address of its own, and its code goes there alone."""
    from tokensvc.oauth.authorization import registered
    from tokensvc.records import Client

    server = Client("webapp", "Web app", [WEBAPP_REDIRECT], secret_hash="0" * 64)
    assert registered(asked, server) is matches


@pytest.mark.gen_test
async def test_a_native_app_on_another_loopback_port_gets_its_code_there(browser, http_client, base_url):
    from helpers import exchange

    await browser.login("alice")
    elsewhere = "http://127.0.0.1:50999/paired"  # registered: http://127.0.0.1:8765/paired
    code = await browser.code_for("node-agent", elsewhere, scope="read")
    # The code is bound to the URI the request named: redeemed with it, never with another port's.
    refused = await exchange(http_client, base_url, code, client_id="node-agent", secret=None,
                             redirect_uri=NODE_REDIRECT)
    assert refused.code == 400
    code = await browser.code_for("node-agent", elsewhere, scope="read")
    assert (await exchange(http_client, base_url, code, client_id="node-agent", secret=None,
                           redirect_uri=elsewhere)).code == 200


@pytest.mark.gen_test
async def test_a_confidential_client_gets_no_code_on_another_loopback_port(browser):
    """webapp is confidential with a loopback redirect: whatever listens on another port of the
    host gets no code, only an error page (before: a 302 there carrying the code)."""
    await browser.login("alice")
    response = await browser.authorize("webapp", "http://127.0.0.1:50999/callback")
    assert response.code == 400 and "Location" not in response.headers
    assert b"Web app asked to send you back to an address it has not registered" in response.body


# -- a decision at a person's pace (double-clickjacking) ------------------------------------------


@pytest.mark.gen_test
@pytest.mark.parametrize("client_id,redirect_uri,user,extra", [
    ("skyplanner", SKY_REDIRECT, "alice", {"scope": "read"}),  # consent
    ("tokensvc-cli", CLI_REDIRECT, "root", {"scope": "admin"}),  # the one-click page
    ("node-agent", NODE_REDIRECT, "alice", {"installation_id": "backyard-scope"}),  # pairing
], ids=["consent", "one-click", "pairing"])
async def test_an_allow_sooner_than_a_person_reads_is_taken_for_none(browser, clock, client_id, redirect_uri, user,
                                                                      extra):
    """Double-clickjacking: the second click of a double click that sent the browser to the page
    lands on its button a fraction of a second after it was rendered. The server takes such an
    "allow" for no decision: the page again, saying why, and no code; the same page answered
    once it could be read is answered. Deny is taken at once (it grants nothing)."""
    from tokensvc.handlers.edge import pace

    await browser.login(user)
    page = await browser.authorize(client_id, redirect_uri, **extra)
    fields = {**browser.form_fields(page.body.decode()), "decision": "allow"}
    clock.advance(pace.MIN_SECONDS / 2)  # the second click of a double click
    again = await browser.fetch("/oauth/authorize", "POST", fields)
    assert again.code == 200 and "Location" not in again.headers
    assert b"Your answer came before this page could be read" in again.body
    assert b'name="decision" value="allow"' in again.body
    clock.advance(pace.MIN_SECONDS)  # the first page, read: its form is taken
    answered = await browser.fetch("/oauth/authorize", "POST", fields)
    assert answered.code == 302 and "code" in query_of(answered.headers["Location"])
    fresh = browser.form_fields((await browser.authorize(client_id, redirect_uri, **extra)).body.decode())
    denied = await browser.fetch("/oauth/authorize", "POST", {**fresh, "decision": "deny"})
    assert query_of(denied.headers["Location"])["error"] == "access_denied"


@pytest.mark.gen_test
@pytest.mark.parametrize("shown", ["missing", "forged", "another-session", "malformed"])
async def test_the_moment_a_page_was_shown_is_the_servers_word(browser, http_client, base_url, clock, shown):
    """The render time is signed into the form, bound to the session: a form that drops it,
    writes an earlier one, or carries another session's is taken as too soon (the page again)."""
    from helpers import Browser

    from tokensvc.handlers.edge import pace

    await browser.login("alice")
    page = await browser.authorize("skyplanner", SKY_REDIRECT, scope="read")
    fields = {**browser.form_fields(page.body.decode()), "decision": "allow"}
    if shown == "missing":
        fields.pop(pace.FIELD)
    elif shown == "forged":
        at, _, signature = fields[pace.FIELD].partition(".")
        fields[pace.FIELD] = f"{int(at) - 60_000}.{signature}"
    elif shown == "another-session":
        other = Browser(http_client, base_url, clock)
        await other.login("alice")
        fields[pace.FIELD] = other.form_fields(
            (await other.authorize("skyplanner", SKY_REDIRECT, scope="read")).body.decode())[pace.FIELD]
    else:
        fields[pace.FIELD] = "soon"
    clock.advance(pace.REVEAL_SECONDS)
    again = await browser.fetch("/oauth/authorize", "POST", fields)
    assert again.code == 200 and b"Your answer came before this page could be read" in again.body


@pytest.mark.gen_test
async def test_an_allow_on_a_page_shown_long_ago_is_taken_for_none(browser, clock):
    """The moment a page was shown holds for a while, not for the session's life: an allow
    posted more than ``pace.MAX_SECONDS`` after the page was rendered (a tab left open, a page
    brought back from the history under a click meant for something else) is taken for none,
    and the page is shown again, saying why, with a moment of its own; within the time it is
    taken. Deny is taken whenever it comes."""
    from tokensvc.handlers.edge import pace

    await browser.login("alice")
    page = await browser.authorize("skyplanner", SKY_REDIRECT, scope="read")
    fields = {**browser.form_fields(page.body.decode()), "decision": "allow"}
    clock.advance(pace.MAX_SECONDS + 1)
    again = await browser.fetch("/oauth/authorize", "POST", fields)
    assert again.code == 200 and "Location" not in again.headers
    assert b"This page was shown too long ago" in again.body
    assert b"Your answer came before this page could be read" not in again.body
    fresh = {**browser.form_fields(again.body.decode()), "decision": "allow"}
    assert fresh[pace.FIELD] != fields[pace.FIELD]
    assert (await browser.fetch("/oauth/authorize", "POST", {**fields, "decision": "deny"})).code == 302
    clock.advance(pace.MAX_SECONDS - 1)  # read for a long while, within the time
    answered = await browser.fetch("/oauth/authorize", "POST", fresh)
    assert answered.code == 302 and "code" in query_of(answered.headers["Location"])


def test_the_buttons_appear_after_the_server_takes_an_answer():
    """The stylesheet reveals a decision's buttons later than the server's bound: a person who
    clicks as soon as they appear is never refused (the margin is what clocks may disagree by)."""
    from pathlib import Path

    from tokensvc.handlers.edge import pace

    css = (Path(tokensvc.__file__).resolve().parent / "static" / "style.css").read_text()
    rule = re.search(r"\.decision button \{[^}]*animation: appear [.0-9]+s [a-z-]+ ([.0-9]+)s both;", css)
    assert rule and float(rule.group(1)) == pace.REVEAL_SECONDS > pace.MIN_SECONDS + 0.25
    assert re.search(r"@keyframes appear \{ from \{ visibility: hidden; opacity: 0; \}", css)


# -- admin to a native app: the confirmation code its page shows ---------------------------------


@pytest.mark.gen_test
async def test_admin_to_a_native_app_shows_a_confirmation_code_that_its_exchange_must_carry(
        browser, http_client, base_url, store):
    """The one-click page of tokensvc login shows a confirmation code, says where to type it, and
    its form carries it (signed); the code the click issues is exchanged only with it."""
    from helpers import confirmation_shown, exchange, json_of

    from tokensvc.handlers.edge import confirmation_field
    from tokensvc.oauth import confirmation

    await browser.login("root")
    page = await browser.authorize("tokensvc-cli", CLI_REDIRECT, scope="admin")
    html = page.body.decode()
    text = " ".join(re.sub(r"<[^>]+>", "", html).split())
    shown = confirmation_shown(html)
    assert shown and confirmation.normalized(shown) is not None
    assert "Type this code where tokensvc command line asks for it, then choose Continue: " + shown in text
    assert "Go on only if you started this yourself, just now. Any program on this computer can start this: only " \
        "the one you type the code into gets the access. Never type the code into a web page." in text
    field = browser.form_fields(html)[confirmation_field.FIELD]
    assert field.startswith(confirmation.normalized(shown) + ".")
    allowed = await browser.decide(page, "allow")
    code = query_of(allowed.headers["Location"])["code"]
    assert await store.get_code(hashing.digest(code)) is None  # stored under code and confirmation alone
    cli = {"client_id": "tokensvc-cli", "secret": None, "redirect_uri": CLI_REDIRECT}
    refused = await exchange(http_client, base_url, code, **cli)
    assert refused.code == 400 and b"invalid_grant" in refused.body
    wrong = await exchange(http_client, base_url, code, **cli, confirmation=another_confirmation(shown))
    assert wrong.code == 400 and confirmation.NOT_THE_PAGES.encode() in wrong.body
    issued = await exchange(http_client, base_url, code, **cli, confirmation=shown.lower())
    assert issued.code == 200 and json_of(issued)["scope"] == "admin"


@pytest.mark.gen_test
async def test_other_pages_show_no_confirmation_code(browser, store):
    """A native app's other scopes (its one-click page, pairing), a confidential client's admin
    and a third party's consent at an https address: as before, no code shown, none carried."""
    from helpers import confirmation_shown

    from tokensvc.handlers.edge import confirmation_field

    await browser.login("root")
    for page in (await browser.authorize("node-agent", NODE_REDIRECT, scope="read"),
                 await browser.authorize("node-agent", NODE_REDIRECT, installation_id="backyard-scope"),
                 await browser.authorize("webapp", WEBAPP_REDIRECT, scope="read admin"),
                 await browser.authorize("skyplanner", SKY_REDIRECT, scope="read")):
        assert page.code == 200 and confirmation_shown(page.body.decode()) is None
        assert confirmation_field.FIELD not in browser.form_fields(page.body.decode())
        assert b'class="confirmation"' not in page.body
        allowed = await browser.decide(page, "allow")
        code = query_of(allowed.headers["Location"])["code"]
        assert await store.get_code(hashing.digest(code)) is not None


@pytest.mark.gen_test
async def test_a_third_partys_native_app_asking_for_admin_shows_the_code_on_its_consent_page(browser, store):
    from helpers import confirmation_shown

    from tokensvc.records import Client

    await store.put_client(Client("desk-admin", "Desk admin", ["com.example.desk:/cb"], ["admin"]))
    await browser.login("root")
    page = await browser.authorize("desk-admin", "com.example.desk:/cb", scope="admin")
    assert page.code == 200 and b"wants access to your account" in page.body
    assert confirmation_shown(page.body.decode()) and b"then choose Allow" in page.body


@pytest.mark.gen_test
@pytest.mark.parametrize("carried", ["missing", "its-own", "another-session", "malformed"])
async def test_an_answer_issues_the_code_only_for_the_confirmation_its_page_showed(
        browser, http_client, base_url, clock, store, carried):
    """The form's confirmation is the server's word, bound to the session: a form that drops it,
    brings one of its own (a lure's, signed by nobody), or carries another session's issues no
    code; the page is shown again with a confirmation code of its own."""
    from helpers import Browser, confirmation_shown

    from tokensvc.handlers.edge import confirmation_field
    from tokensvc.oauth import confirmation

    await browser.login("root")
    page = await browser.authorize("tokensvc-cli", CLI_REDIRECT, scope="admin")
    fields = {**browser.form_fields(page.body.decode()), "decision": "allow"}
    if carried == "missing":
        fields.pop(confirmation_field.FIELD)
    elif carried == "its-own":
        _, _, signature = fields[confirmation_field.FIELD].partition(".")
        fields[confirmation_field.FIELD] = f"K7QM3XPD.{signature}"
    elif carried == "another-session":
        other = Browser(http_client, base_url, clock)
        await other.login("root")
        theirs = await other.authorize("tokensvc-cli", CLI_REDIRECT, scope="admin")
        fields[confirmation_field.FIELD] = other.form_fields(theirs.body.decode())[confirmation_field.FIELD]
    else:
        fields[confirmation_field.FIELD] = "K7QM3XPD"
    clock.advance(pace_seconds())
    again = await browser.fetch("/oauth/authorize", "POST", fields)
    assert again.code == 200 and "Location" not in again.headers and code_count(store) == 0
    assert confirmation.normalized(confirmation_shown(again.body.decode())) is not None


@pytest.mark.gen_test
async def test_the_page_shown_again_keeps_its_confirmation_code(browser, clock):
    """An answer that came too soon shows the page again with the same code: a person who
    typed it already has typed the right one."""
    from helpers import confirmation_shown

    await browser.login("root")
    page = await browser.authorize("tokensvc-cli", CLI_REDIRECT, scope="admin")
    again = await browser.fetch("/oauth/authorize", "POST", {**browser.form_fields(page.body.decode()),
                                                             "decision": "allow"})
    assert b"Your answer came before this page could be read" in again.body
    assert confirmation_shown(page.body.decode()) is not None
    assert confirmation_shown(again.body.decode()) == confirmation_shown(page.body.decode())


def pace_seconds() -> float:
    from tokensvc.handlers.edge import pace

    return pace.REVEAL_SECONDS
