"""Brute force: failed client authentications and sign-ins are limited per key and per address."""

import pytest

from helpers import SKY_REDIRECT, WEBAPP_REDIRECT, WEBAPP_SECRET, basic, make_config, post_form
from tokensvc.config import LimitSettings
from tokensvc.ratelimit import FailureLimits, MemoryFailureLimiter, TooManyFailures


@pytest.fixture
def config():
    return make_config(limits={"window_seconds": 60, "failed_client_auth_per_client": 3,
                               "failed_client_auth_per_address": 6, "failed_logins_per_username": 3,
                               "failed_logins_per_address": 5})


def introspect(http_client, base_url, secret, client_id="webapp"):
    return post_form(http_client, base_url + "/oauth/token/introspect", {"token": "x"},
                     {"Authorization": basic(client_id, secret)})


@pytest.mark.gen_test
async def test_failed_client_authentication_is_limited_per_client(http_client, base_url, caplog):
    for _ in range(3):
        assert (await introspect(http_client, base_url, "wrong")).code == 401
    blocked = await introspect(http_client, base_url, WEBAPP_SECRET)  # even the right secret, for now
    assert blocked.code == 429
    assert 1 <= int(blocked.headers["Retry-After"]) <= 60
    assert b"too_many_requests" in blocked.body
    # Another client from the same address is not blocked yet.
    assert (await introspect(http_client, base_url, "wrong", client_id="partner")).code == 401
    failures = [r.audit for r in caplog.records if getattr(r, "audit", {}).get("event") == "client_auth"]
    assert len(failures) == 4 and all(f["outcome"] == "failure" for f in failures)


@pytest.mark.gen_test
async def test_failed_client_authentication_is_limited_per_address(http_client, base_url):
    for client_id in ("a", "b", "c", "d", "e", "f"):
        assert (await introspect(http_client, base_url, "wrong", client_id=client_id)).code == 401
    assert (await introspect(http_client, base_url, "wrong", client_id="g")).code == 429
    token_endpoint = await post_form(http_client, base_url + "/oauth/token", {
        "grant_type": "authorization_code", "code": "x", "redirect_uri": SKY_REDIRECT, "client_id": "skyplanner"})
    assert token_endpoint.code == 429


@pytest.mark.gen_test
async def test_failed_sign_ins_are_limited_per_username(browser):
    for _ in range(3):
        assert (await browser.login("alice", "wrong-password")).code == 401
    refused = await browser.login("alice")
    assert refused.code == 429 and "Retry-After" in refused.headers
    assert b"Too many failed sign-in attempts" in refused.body
    assert "tokensvc_session" not in browser.cookies
    # Another user signs in from the same address.
    assert (await browser.login("root")).code == 302


@pytest.mark.gen_test
async def test_a_successful_sign_in_clears_the_username(browser):
    for _ in range(2):
        await browser.login("alice", "wrong-password")
    assert (await browser.login("alice")).code == 302
    for _ in range(2):
        assert (await browser.login("alice", "wrong-password")).code == 401


@pytest.mark.gen_test
async def test_sign_ins_are_limited_per_address(browser):
    for name in ("u1", "u2", "u3", "u4", "u5"):
        assert (await browser.login(name, "whatever-password")).code == 401
    assert (await browser.login("alice")).code == 429


@pytest.mark.gen_test
async def test_successful_flows_are_not_slowed(browser, http_client, base_url):
    from helpers import exchange

    for _ in range(5):
        code = await browser.code_for("webapp", WEBAPP_REDIRECT)
        assert (await exchange(http_client, base_url, code)).code == 200


def test_window_slides():
    now = [0.0]
    limiter = MemoryFailureLimiter(60, clock=lambda: now[0])
    keys = [("k", 2)]
    limiter.failed(keys)
    now[0] = 10
    limiter.failed(keys)
    with pytest.raises(TooManyFailures) as info:
        limiter.check(keys)
    assert info.value.retry_after == 50  # the first failure leaves the window at t=60
    now[0] = 60.5
    limiter.check(keys)  # one failure left in the window
    now[0] = 71
    assert limiter._failures == {} or limiter.check(keys) is None
    limiter.check(keys)
    assert "k" not in limiter._failures


def test_memory_stays_bounded():
    now = [0.0]
    limiter = MemoryFailureLimiter(10, clock=lambda: now[0], max_keys=100)
    for i in range(100):
        limiter.failed([(f"k{i}", 3)])
    now[0] = 11
    limiter.failed([("fresh", 3)])
    assert set(limiter._failures) == {"fresh"}


def test_disabled_limits_never_refuse():
    limits = FailureLimits(LimitSettings(enabled=False, failed_logins_per_username=1))
    keys = limits.login_keys("alice", "127.0.0.1")
    for _ in range(5):
        limits.failed(keys)
        limits.check(keys)
