"""XSRF: one rule for every cookie-authenticated unsafe request, and tokens only this service
can make (signed with the cookie secret, bound to the web session)."""

from __future__ import annotations

import pytest
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from helpers import SKY_REDIRECT, WEBAPP_REDIRECT, Browser, exchange, json_of
from tokensvc.handlers import xsrf
from tokensvc.handlers.json_api import JsonHandler
from tokensvc.handlers.page import PageHandler, TooLargePage

SECRET = "xsrf-test-secret-0123456789"


def request(method: str, headers: dict[str, str] | None = None) -> HTTPServerRequest:
    return HTTPServerRequest(start_line=RequestStartLine(method, "/x", "HTTP/1.1"), headers=HTTPHeaders({"Host": "127.0.0.1", **(headers or {})}))


def test_tokens_are_signed_and_bound_to_the_session():
    token = xsrf.new_token(SECRET, "session-a")
    assert xsrf.valid(SECRET, token, "session-a")
    assert not xsrf.valid(SECRET, token, "session-b") and not xsrf.valid(SECRET, token, None)
    assert not xsrf.valid("another-secret-0123456789", token, "session-a")
    nonce = token.partition(".")[0]
    assert not xsrf.valid(SECRET, nonce, "session-a") and not xsrf.valid(SECRET, nonce + ".abc", "session-a")
    assert not xsrf.valid(SECRET, "abc", None) and not xsrf.valid(SECRET, "", None)
    assert xsrf.new_token(SECRET, None) != xsrf.new_token(SECRET, None)


def test_which_requests_are_checked():
    cookie = {"Cookie": "tokensvc_session=x"}
    def required(method, headers=None, **kwargs):
        return xsrf.required(request(method, headers), session_cookie="tokensvc_session", **kwargs)

    # Pages: every unsafe request, signed in or not (sign-in itself is a form).
    assert required("POST", page=True, takes_session=True)
    assert required("POST", {"Authorization": "Bearer t"}, page=True, takes_session=True)
    assert not required("GET", cookie, page=True, takes_session=True)
    # JSON routes that take the session: when it is the request's credential.
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert required(method, cookie, page=False, takes_session=True)
    assert not required("GET", cookie, page=False, takes_session=True)
    assert not required("DELETE", page=False, takes_session=True)  # no cookie: a bearer or nothing
    assert not required("DELETE", {**cookie, "Authorization": "Bearer t"}, page=False, takes_session=True)
    # Routes that never take the cookie (the token endpoints) ignore one sent along.
    assert not required("POST", cookie, page=False, takes_session=False)


def test_every_route_that_takes_the_session_is_covered_by_default():
    """A new page or /v1 handler is protected without its author doing anything."""
    import tokensvc.handlers.api as api
    import tokensvc.handlers.token as token

    takes = {cls.__name__ for cls in _subclasses(JsonHandler) if cls.takes_session}
    assert {"MeHandler", "ConnectedAppsHandler", "ConnectedAppHandler", "SignOutHandler"} <= takes
    assert not any(cls.takes_session for cls in (token.TokenHandler, token.RefreshHandler, token.IntrospectHandler,
                                                  token.RevokeHandler, token.GrantRevokeHandler))
    assert issubclass(api.ConnectedAppHandler, api.ApiEndpoint)
    # No page replaces the base's check; the one that does refuses every request outright.
    assert [cls for cls in _subclasses(PageHandler) if "check_xsrf_cookie" in vars(cls)] == [TooLargePage]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


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
    assert response.code == 200


@pytest.mark.gen_test
async def test_bearer_requests_need_no_xsrf_token_even_with_a_cookie(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, scope="read write connected-apps:write")
    access = json_of(await exchange(http_client, base_url, code))["access_token"]
    await browser.code_for("skyplanner", SKY_REDIRECT, scope="read")
    response = await browser.fetch("/v1/me/connected-apps/skyplanner", "DELETE",
                                   headers={"Authorization": f"Bearer {access}"})
    assert response.code == 204
