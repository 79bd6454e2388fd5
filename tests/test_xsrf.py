"""XSRF: one rule for every cookie-authenticated unsafe request, and tokens only this service
can make (signed with the cookie secret, bound to the web session)."""

from __future__ import annotations

import pytest
from helpers import SKY_REDIRECT, WEBAPP_REDIRECT, Browser, exchange, json_of

from tokensvc.app import ROUTES
from tokensvc.handlers.edge import xsrf
from tokensvc.handlers.edge.routes import UNSAFE_METHODS

SECRET = "xsrf-test-secret-0123456789"


def test_tokens_are_signed_and_bound_to_the_session():
    token = xsrf.new_token(SECRET, "session-a")
    assert xsrf.valid([SECRET], token, "session-a")
    assert not xsrf.valid([SECRET], token, "session-b") and not xsrf.valid([SECRET], token, None)
    assert not xsrf.valid(["another-secret-0123456789"], token, "session-a")
    nonce = token.partition(".")[0]
    assert not xsrf.valid([SECRET], nonce, "session-a") and not xsrf.valid([SECRET], nonce + ".abc", "session-a")
    assert not xsrf.valid([SECRET], "abc", None) and not xsrf.valid([SECRET], "", None)
    # While the secret rotates, any of its keys verifies.
    assert xsrf.valid(["new-secret-0123456789", SECRET], token, "session-a")
    assert xsrf.new_token(SECRET, None) != xsrf.new_token(SECRET, None)


@pytest.mark.gen_test
async def test_no_unsafe_request_acts_on_the_session_cookie_without_a_token(browser, http_client, base_url):
    """The invariant, over the whole route table: an unsafe request carrying the session
    cookie and no XSRF token is refused (403) by every route that may read the cookie, and
    changes nothing anywhere else (those routes answer as if no cookie had been sent). A new
    route is covered without its author doing anything."""
    await browser.code_for("skyplanner", SKY_REDIRECT, scope="read")
    stranger = Browser(http_client, base_url)
    checked = 0
    for route in ROUTES:
        for method in sorted(route.methods & UNSAFE_METHODS):
            path = route.path.replace("{client_id}", "skyplanner")
            body = {"client_id": "skyplanner", "username": "alice", "password": "x"} if method != "DELETE" else None
            answer = await browser.fetch(path, method, body)
            if route.handler.reads_session:
                assert answer.code == 403, (method, path)
            else:
                assert answer.code == (await stranger.fetch(path, method, body)).code, (method, path)
            checked += 1
    assert checked >= 10
    assert (await browser.fetch("/v1/me")).code == 200  # still signed in: nothing happened
    assert json_of(await browser.fetch("/v1/me/connected-apps"))[0]["clientId"] == "skyplanner"


def test_a_route_that_does_not_read_the_session_cannot():
    """The exemption is declared, and holds: such a handler cannot read the cookie at all."""
    exempt = [route for route in ROUTES if not route.handler.reads_session]
    assert {route.path for route in exempt} == {"/oauth/token", "/oauth/token/refresh", "/oauth/token/introspect",
                                                "/oauth/token/revoke", "/oauth/revoke", "/oauth/revocations"}
    for route in exempt:
        with pytest.raises(RuntimeError, match="does not read the session"):
            route.handler.raw_session_id(object.__new__(route.handler))


@pytest.mark.gen_test
@pytest.mark.parametrize("form", ["/login", "/logout", "/account", "/oauth/authorize"])
async def test_a_planted_cookie_and_field_pair_is_refused(browser, form):
    await browser.login("alice")
    browser.cookies["_xsrf"] = "abc"
    response = await browser.fetch(form, "POST", {"_xsrf": "abc", "client_id": "skyplanner",
                                                  "username": "alice", "password": "alice-password"})
    assert response.code == 403


@pytest.mark.gen_test
async def test_a_planted_pair_is_refused_by_the_json_api(browser, http_client, base_url):
    await browser.code_for("skyplanner", SKY_REDIRECT, scope="read")
    browser.cookies["_xsrf"] = "abc"
    for path, method in (("/v1/me/connected-apps/skyplanner", "DELETE"), ("/oauth/sign-out", "POST")):
        response = await browser.fetch(path, method, {} if method == "POST" else None, headers={"X-XSRFToken": "abc"})
        assert response.code == 403, path
    assert (await browser.fetch("/v1/me")).code == 200  # still signed in: nothing happened


@pytest.mark.gen_test
async def test_a_token_issued_before_sign_in_or_to_another_session_is_refused(http_client, base_url):
    mallory, alice = Browser(http_client, base_url), Browser(http_client, base_url)
    anonymous_token = await alice.xsrf()
    await alice.login("alice")
    assert alice.cookies["_xsrf"] != anonymous_token  # signing in issued a token for the session
    await mallory.login("root")
    for planted in (anonymous_token, mallory.cookies["_xsrf"]):
        alice_cookies = dict(alice.cookies, _xsrf=planted)
        response = await alice.fetch("/logout", "POST", {"_xsrf": planted},
                                     headers={"Cookie": "; ".join(f"{k}={v}" for k, v in alice_cookies.items())})
        assert response.code == 403
    response = await alice.fetch("/logout", "POST", {"_xsrf": alice.cookies["_xsrf"]})
    assert response.code == 303


@pytest.mark.gen_test
async def test_bearer_requests_need_no_xsrf_token_even_with_a_cookie(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, scope="read write connected-apps:write")
    access = json_of(await exchange(http_client, base_url, code))["access_token"]
    await browser.code_for("skyplanner", SKY_REDIRECT, scope="read")
    response = await browser.fetch("/v1/me/connected-apps/skyplanner", "DELETE",
                                   headers={"Authorization": f"Bearer {access}"})
    assert response.code == 204


@pytest.mark.gen_test
@pytest.mark.parametrize("headers,status", [
    ({"Sec-Fetch-Site": "cross-site"}, 403),
    ({"Sec-Fetch-Site": "same-site"}, 403),  # a sibling subdomain, or http beside https
    ({"Origin": "http://evil.tokensvc.example"}, 403),
    ({"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "cross-site"}, 403),
    ({"Sec-Fetch-Site": "same-origin", "Origin": "null"}, 302),  # a same-origin form under no-referrer
    ({"Origin": "null"}, 403),  # a sandboxed frame, a data: page: says nothing of where it is
    ({"Origin": "http://127.0.0.1:8080"}, 302),  # its configured origin
    ({}, 302),  # a client that says nothing (not a browser): the token decides
], ids=["cross-site", "same-site", "foreign-origin", "cross-site-own-origin", "same-origin", "null-origin",
        "own-origin", "silent"])
async def test_a_form_from_another_origin_is_refused_even_with_a_valid_token(http_client, base_url, headers, status):
    """Login CSRF on an http deployment: a page elsewhere that planted a pre-sign-in pair
    (cookie and field) still cannot sign a browser in, where the browser says where it is."""
    victim = Browser(http_client, base_url)
    planted = await victim.xsrf()  # a valid pre-sign-in token, as a planting attacker would have
    response = await victim.fetch("/login", "POST", {"username": "alice", "password": "alice-password",
                                                     "_xsrf": planted}, headers=headers)
    assert response.code == status


@pytest.mark.gen_test
@pytest.mark.parametrize("path", ["/login", "/logout", "/account", "/oauth/authorize", "/oauth/sign-out"])
async def test_a_token_beyond_ascii_is_refused_not_a_fault(browser, path):
    await browser.login("alice")
    for cookie, field in (("\u00e9t\u00e9", "\u00e9t\u00e9"), (browser.cookies["_xsrf"], "\u00e9" * 20)):
        browser.cookies["_xsrf"] = cookie
        answer = await browser.fetch(path, "POST", {"_xsrf": field})
        assert answer.code == 403, (path, answer.code)


@pytest.mark.gen_test
async def test_an_empty_field_leaves_the_header_to_speak(browser):
    """An empty form value is an absent one (as everywhere in forms): the X-XSRFToken header
    then carries the token."""
    await browser.login("alice")
    token = browser.cookies["_xsrf"]
    assert (await browser.fetch("/logout", "POST", {"_xsrf": ""}, headers={"X-XSRFToken": token})).code == 303


# -- rotating the cookie secret --------------------------------------------------------------------

OLD, NEW = "the-old-cookie-secret-0123456789", "the-new-cookie-secret-0123456789"


@pytest.fixture
def serve_with(io_loop, store, config):
    """``serve_with(keys)``: the service over the shared store with ``cookie_secret = keys``, as
    one instance of a rolling deploy; its base URL."""
    import dataclasses

    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    from tokensvc.app import make_app
    from tokensvc.bootstrap import seed

    io_loop.run_sync(lambda: seed(store, config))
    servers = []

    def serve_with(keys: list[str]) -> str:
        settings = dataclasses.replace(config, cookie_secret=keys[0], cookie_secrets=tuple(keys))
        sock, port = bind_unused_port()
        server = HTTPServer(make_app(settings, store))
        server.add_sockets([sock])
        servers.append(server)
        return f"http://127.0.0.1:{port}"

    yield serve_with
    for server in servers:
        server.stop()


def signed_with(secret: str, cookie: str) -> bool:
    import tornado.web

    return tornado.web.decode_signed_value(secret, "tokensvc_session", cookie) is not None


@pytest.mark.gen_test
async def test_a_new_cookie_secret_signs_while_the_old_one_still_verifies(http_client, serve_with):
    """The rotation of docs/guide/operations.md: sessions and forms of the old key work on instances
    that list both keys; new sessions are signed with the new key; once the old key is dropped,
    what it signed is refused (signed out, a form shown again), and what the new one signed works."""
    before, both, after = serve_with([OLD]), serve_with([NEW, OLD]), serve_with([NEW])
    browser = Browser(http_client, before)
    assert (await browser.login("alice")).code == 302
    old_session, old_form = browser.cookies["tokensvc_session"], browser.cookies["_xsrf"]
    assert signed_with(OLD, old_session) and not signed_with(NEW, old_session)

    browser.base_url = both
    assert (await browser.fetch("/account")).code == 200  # still signed in
    assert browser.cookies["_xsrf"] == old_form  # its forms keep their token
    ended = await browser.fetch("/account", "POST", {"action": "end-others", "_xsrf": old_form})
    assert ended.code == 303  # the old key's XSRF token passes
    fresh = Browser(http_client, both)
    assert (await fresh.login("alice")).code == 302
    new_session = fresh.cookies["tokensvc_session"]
    assert signed_with(NEW, new_session) and not signed_with(OLD, new_session)

    browser.base_url = fresh.base_url = after
    assert (await browser.fetch("/account")).code == 303  # what only the old key signed: signed out
    refused = await browser.fetch("/logout", "POST", {"_xsrf": old_form})
    assert refused.code == 403
    assert (await fresh.fetch("/account")).code == 200
    signed_out = await fresh.fetch("/logout", "POST", {"_xsrf": fresh.cookies["_xsrf"]})
    assert signed_out.code == 303
