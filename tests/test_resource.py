"""tokensvc.resource: a resource server's verifier (introspect once, cache within bounds, drop
on the revocation feed, fail closed) and its Tornado and ASGI adapters, against the service
over real HTTP and its real revocation feed."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import tornado.httpserver
import tornado.testing
import tornado.web
from helpers import DEADLINE, WEBAPP_SECRET, basic, eventually, issue_tokens, post_form
from test_ws import tokens
from tornado import gen
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from tokensvc.records import utcnow
from tokensvc.resource import InsufficientScope, InvalidToken, Settings, Unavailable, Verifier
from tokensvc.resource.cache import AnswerCache
from tokensvc.resource.introspection import Introspector
from tokensvc.resource.tornado import BearerAuthMixin, RevocableWebSocket, requires


class Monotonic:
    """The verifier's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def verifier_for(base_url, clock=None, **settings):
    return Verifier(Settings(base_url, "webapp", WEBAPP_SECRET, **settings), **({"clock": clock} if clock else {}))


async def started(verifier):
    await verifier.start()
    await asyncio.wait_for(verifier.connected.wait(), DEADLINE)
    return verifier


async def revoke(http_client, base_url, token):
    response = await post_form(http_client, base_url + "/oauth/token/revoke", {"token": token},
                               {"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert response.code == 200


@pytest.mark.gen_test(timeout=90)
async def test_a_token_is_introspected_once_then_dropped_when_revoked(browser, http_client, base_url):
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = await started(verifier_for(base_url))
    try:
        for _ in range(5):
            assert (await verifier.check(access, "read")).scopes == ["read"]
        assert (verifier.counts.introspections, verifier.counts.hits) == (1, 4)
        await revoke(http_client, base_url, access)
        await eventually(lambda: verifier.cached == 0, DEADLINE, what="the revocation dropping the entry")
        with pytest.raises(InvalidToken):
            await verifier.check(access)
        assert verifier.counts.introspections == 2
    finally:
        await verifier.close()


@pytest.mark.gen_test(timeout=90)
async def test_a_secret_rotation_drops_no_cached_answer_and_a_narrowing_does(browser, http_client, base_url, ctx):
    """Rotating the secret of the first-party web app (with overlap, then without) withdraws
    nothing from its tokens: a resource server keeps every answer it cached for them and asks
    tokensvc nothing again (the feed names no client). Narrowing the web app's scopes does
    withdraw: its answers are dropped and each token is introspected again."""
    from test_feed import notes_api
    from test_resource_feed import revoke_directly

    from tokensvc.admin import actions as admin

    secret = await notes_api(ctx)
    kept = (await tokens(browser, http_client, base_url, scope="read write"))["access_token"]
    revoked = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = await started(Verifier(Settings(base_url, "notes-api", secret)))
    try:
        for access in (kept, revoked):
            await verifier.check(access)
        assert (verifier.counts.introspections, verifier.cached) == (2, 2)
        await admin.rotate_secret(ctx, "webapp", keep_previous_seconds=3600)
        await admin.rotate_secret(ctx, "webapp")  # the old secret ends at once
        await revoke_directly(ctx, revoked)  # told after the rotations: when it is in, they were too
        await eventually(lambda: verifier.cached == 1, DEADLINE, what="the revocation dropping its entry")
        assert verifier.counts.revocations == 1  # the family's alone
        assert (await verifier.check(kept, "write")).scopes == ["read", "write"]
        assert verifier.counts.introspections == 2  # answered from the cache
        await admin.update_client(ctx, "webapp", {"scopes": ["read", "connected-apps:write", "admin"]})
        await eventually(lambda: verifier.cached == 0, DEADLINE, what="the narrowing dropping the entry")
        assert (await verifier.check(kept, "read")).scopes == ["read"]
        assert verifier.counts.introspections == 3
    finally:
        await verifier.close()


@pytest.mark.gen_test(timeout=90)
async def test_a_base_url_with_a_trailing_slash_reaches_introspection_and_the_feed(browser, http_client, base_url):
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    settings = Settings(base_url + "//", "webapp", WEBAPP_SECRET)
    assert settings.base_url == base_url
    verifier = await started(Verifier(settings))
    try:
        assert (await verifier.check(access)).scopes == ["read"]
    finally:
        await verifier.close()


@pytest.mark.gen_test(timeout=90)
async def test_scopes_are_checked_with_the_services_rule(browser, http_client, base_url):
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = verifier_for(base_url)
    assert (await verifier.check(access, "observations:read")).has("read")
    with pytest.raises(InsufficientScope) as info:
        await verifier.check(access, "write")
    assert info.value.status == 403
    assert info.value.headers("api")["WWW-Authenticate"] == (
        'Bearer realm="api", error="insufficient_scope", error_description="The token lacks the scope write", '
        'scope="write"')
    assert info.value.body()["scope"] == "write"
    with pytest.raises(InvalidToken) as missing:
        await verifier.check(None)
    assert missing.value.headers("api")["WWW-Authenticate"] == 'Bearer realm="api"'  # RFC 6750 §3.1: no error


@pytest.mark.gen_test(timeout=90)
async def test_a_refresh_token_is_no_bearer_token_and_an_inactive_answer_is_cached_briefly(browser, http_client,
                                                                                          base_url):
    issued = await tokens(browser, http_client, base_url)
    clock = Monotonic()
    verifier = verifier_for(base_url, clock, negative_ttl=5)
    with pytest.raises(InvalidToken):
        await verifier.check(issued["refresh_token"])  # not of an access token's form: not even asked
    assert verifier.counts.introspections == 0
    for _ in range(3):
        with pytest.raises(InvalidToken):
            await verifier.check("n" * 43)
    assert verifier.counts.introspections == 1
    clock.now += 6
    with pytest.raises(InvalidToken):
        await verifier.check("n" * 43)
    assert verifier.counts.introspections == 2


@pytest.mark.gen_test(timeout=90)
async def test_an_answer_never_outlives_the_tokens_exp_nor_the_cache_its_bound(browser, http_client, base_url):
    first = (await tokens(browser, http_client, base_url))["access_token"]
    second = (await tokens(browser, http_client, base_url))["access_token"]
    third = (await tokens(browser, http_client, base_url))["access_token"]
    clock = Monotonic()
    verifier = verifier_for(base_url, clock, max_entries=2, offline_ttl=10**6)
    for token in (first, second, third):
        await verifier.check(token)
    assert verifier.cached == 2  # the least recently used went
    await verifier.check(first)
    assert verifier.counts.introspections == 4
    clock.now += 3600  # the tokens' lifetime (access_ttl)
    await verifier.check(third)  # still active at the service (its clock did not move): asked again
    assert verifier.counts.introspections == 5


@pytest.mark.gen_test(timeout=90)
async def test_without_the_feed_an_answer_lives_offline_ttl_then_tokensvc_is_asked(browser, http_client, base_url):
    access = (await tokens(browser, http_client, base_url))["access_token"]
    clock = Monotonic()
    verifier = verifier_for(base_url, clock, offline_ttl=30)  # never started: the feed is down
    await verifier.check(access)
    clock.now += 29
    await verifier.check(access)
    assert verifier.counts.introspections == 1
    clock.now += 2
    await verifier.check(access)
    assert verifier.counts.introspections == 2


def drop_feeds(ctx):
    """The service closes every feed socket it has open (as a restart would)."""
    for reader in list(ctx.feed._readers):
        reader.__self__.close()


@pytest.mark.gen_test(timeout=90)
async def test_tokensvc_away_fails_closed():
    port = tornado.testing.bind_unused_port()
    port[0].close()  # nothing listens there
    verifier = verifier_for(f"http://127.0.0.1:{port[1]}", timeout=2)
    with pytest.raises(Unavailable) as info:
        await verifier.check("a" * 43)
    assert info.value.status == 503 and info.value.headers("api")["Retry-After"] == "1"


@pytest.mark.gen_test(timeout=90)
async def test_a_closed_verifier_serves_no_cached_answer_and_asks_nothing(http_server, browser, http_client,
                                                                         base_url):
    """After close() (the application stopping, a request still in flight), nothing keeps the
    cache current: a check is 503, not a cached answer, and opens no new HTTP client."""
    access = (await tokens(browser, http_client, base_url))["access_token"]
    settings = Settings(base_url, "webapp", WEBAPP_SECRET)
    introspector = Introspector(settings)
    verifier = await started(Verifier(settings, introspector=introspector))
    await verifier.check(access)
    assert introspector.client_open
    await verifier.close()
    assert not verifier.feed_up and not verifier.connected.is_set() and verifier.cached == 0
    with pytest.raises(Unavailable):
        await verifier.check(access)
    assert verifier.counts.introspections == 1 and not introspector.client_open


@pytest.mark.gen_test(timeout=90)
async def test_the_feed_away_bounds_every_answer_then_fails_closed(http_server, browser, http_client, base_url,
                                                                   ctx):
    """The feed and tokensvc go away together (the service stops): a cached answer is used
    within offline_ttl of the feed's going down, then the check fails closed (503)."""
    access = (await tokens(browser, http_client, base_url))["access_token"]
    clock = Monotonic()
    verifier = await started(verifier_for(base_url, clock, offline_ttl=30, timeout=2, retry_seconds=0.05,
                                          ping_seconds=0.4))
    try:
        await verifier.check(access)
        clock.now += 3000  # the feed is up, its pongs say so: the answer lives on
        await eventually(lambda: verifier.alive_at == clock.now, DEADLINE, what="a pong")
        await verifier.check(access)
        assert verifier.counts.introspections == 1
        http_server.stop()  # no new connection: neither introspection nor the feed answers
        await http_server.close_all_connections()
        drop_feeds(ctx)  # and the open feed ends (an upgraded socket is no HTTP connection)
        await eventually(lambda: not verifier.feed_up, DEADLINE, what="the feed noticed down")
        clock.now += 29
        await verifier.check(access)  # within offline_ttl of the feed's last sign of life
        clock.now += 2
        with pytest.raises(Unavailable):
            await verifier.check(access)
    finally:
        await verifier.close()


class StallingProxy:
    """A TCP proxy to tokensvc that can stall: from then on it passes nothing either way and
    closes nothing (a proxy that hangs, a silent partition). ``events`` records each connection
    from the client opened and closed by the client (``("open", n)``, ``("closed", n)``)."""

    def __init__(self, upstream_port):
        self.upstream_port, self.stalled, self._tasks = upstream_port, False, set()
        self.events = []

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader, writer):
        number = 1 + sum(1 for event in self.events if event[0] == "open")
        self.events.append(("open", number))
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        for source, sink, client in ((reader, up_writer, number), (up_reader, writer, None)):
            task = asyncio.ensure_future(self._pipe(source, sink, client))
            self._tasks.add(task)

    async def _pipe(self, source, sink, client):
        while data := await source.read(65536):
            if not self.stalled:  # stalled: read and dropped, so that a close is still seen
                sink.write(data)
                await sink.drain()
        if client is not None:
            self.events.append(("closed", client))
        if not self.stalled:
            sink.close()

    def close(self):
        self.server.close()
        for task in self._tasks:
            task.cancel()


@pytest.mark.gen_test(timeout=90)
async def test_a_silent_feed_bounds_an_answer_from_its_last_sign_of_life(browser, http_client, base_url):
    """The feed falls silent without closing (its proxy stalls): it is taken for down once a
    ping goes unanswered, and an answer lives offline_ttl from the feed's last sign of life,
    not from the moment its silence was noticed; then tokensvc, silent too, fails it closed."""
    access = (await tokens(browser, http_client, base_url))["access_token"]
    proxy = StallingProxy(int(base_url.rsplit(":", 1)[1]))
    clock = Monotonic()
    verifier = await started(verifier_for(await proxy.start(), clock, offline_ttl=30, ping_seconds=1))
    try:
        await verifier.check(access)
        proxy.stalled = True
        verifier.settings.timeout = 1  # tokensvc's silence, below, is given up after 1 s (not the setup's)
        clock.now += 20  # silent for 20 s before the silence is noticed
        await eventually(lambda: not verifier.feed_up, DEADLINE, what="the silent feed taken for down")
        assert verifier.alive_at < clock.now
        clock.now = verifier.alive_at + 31  # past offline_ttl from the last sign of life, not from the notice
        with pytest.raises(Unavailable):
            await verifier.check(access)
    finally:
        await verifier.close()
        proxy.close()


@pytest.mark.gen_test(timeout=90)
async def test_a_silent_feed_is_down_after_ping_seconds_not_after_its_close_handshake(browser, http_client,
                                                                                    base_url):
    """Silent for ping_seconds, the feed is taken for down and a new connection is tried at
    once: the silent one's close handshake (which Tornado gives 5 s) is not waited for."""
    proxy = StallingProxy(int(base_url.rsplit(":", 1)[1]))
    verifier = await started(verifier_for(await proxy.start(), ping_seconds=1, retry_seconds=0.05))
    try:
        assert proxy.events == [("open", 1)]
        proxy.stalled = True
        await eventually(lambda: ("open", 2) in proxy.events, DEADLINE, what="a new connection tried")
        assert ("closed", 1) not in proxy.events  # the silent one still waits for its close handshake
        assert not verifier.feed_up and not verifier.connected.is_set()
    finally:
        await verifier.close()
        proxy.close()


@pytest.mark.gen_test(timeout=90)
async def test_a_feed_that_drops_resumes_where_it_stood(browser, http_client, base_url, ctx):
    access = (await tokens(browser, http_client, base_url))["access_token"]
    verifier = await started(verifier_for(base_url, retry_seconds=0.05))
    try:
        await verifier.check(access)
        drop_feeds(ctx)
        await eventually(lambda: not verifier.feed_up, DEADLINE, what="the feed noticed down")
        await asyncio.wait_for(verifier.connected.wait(), DEADLINE)
        assert verifier.counts.connects == 2 and verifier.counts.flushes == 1  # the first ready only
        assert verifier.cached == 1  # resumed: nothing flushed
        await revoke(http_client, base_url, access)
        await eventually(lambda: verifier.cached == 0, DEADLINE, what="the revocation on the new connection")
    finally:
        await verifier.close()


@pytest.mark.gen_test(timeout=90)
async def test_an_answer_a_revocation_overtook_is_asked_again_not_cached():
    settings = Settings("http://127.0.0.1:9", "webapp", WEBAPP_SECRET)
    cache = AnswerCache(settings, time.monotonic)
    answers = [{"active": True, "scope": "read", "exp": 2**40, "grant_id": "g1", "family_id": "f1",
                "client_id": "webapp"}, None]

    class Overtaken(Introspector):
        async def introspect(self, token):
            cache.revoke(("grant_id", "g1"))  # heard on the feed while the answer travels
            return answers.pop(0)

    verifier = Verifier(settings, cache=cache, introspector=Overtaken(settings))
    with pytest.raises(InvalidToken):
        await verifier.check("a" * 43)
    assert verifier.cached == 1 and not answers  # the second answer (inactive), cached briefly


def held_introspection(held=lambda token: True, **settings):
    """A verifier (of nothing listening) whose introspection answers (active, ``read``) at once
    for a token ``held`` refuses, and for the others once the event returned is set; the list
    returned records each call held."""
    release, calls = asyncio.Event(), []

    class Held(Introspector):
        async def introspect(self, token):
            if held(token):
                calls.append(token)
                await release.wait()
            return {"active": True, "scope": "read", "exp": 2**40, "grant_id": "g1", "family_id": "f1"}

    of_nothing = Settings("http://127.0.0.1:9", "webapp", WEBAPP_SECRET, **settings)
    return Verifier(of_nothing, introspector=Held(of_nothing)), release, calls


@pytest.mark.gen_test(timeout=90)
async def test_concurrent_checks_of_one_token_share_one_introspection():
    verifier, release, calls = held_introspection()
    checks = [asyncio.ensure_future(verifier.check("a" * 43, "read")) for _ in range(5)]
    await eventually(lambda: calls, DEADLINE, what="the introspection")
    release.set()
    assert all(authorized.scopes == ["read"] for authorized in await asyncio.gather(*checks))
    assert len(calls) == 1


@pytest.mark.gen_test(timeout=90)
async def test_a_check_cancelled_leaves_the_shared_introspection_to_the_others():
    """One caller of a token's introspection goes away (its client disconnected, a timeout):
    the others still get the answer, and it is cached."""
    verifier, release, calls = held_introspection()
    first = asyncio.ensure_future(verifier.check("a" * 43, "read"))
    await eventually(lambda: calls, DEADLINE, what="the introspection")
    others = [asyncio.ensure_future(verifier.check("a" * 43, "read")) for _ in range(3)]
    await asyncio.sleep(0)  # every other caller waits on the same introspection
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    release.set()
    assert [authorized.scopes for authorized in await asyncio.gather(*others)] == [["read"]] * 3
    assert len(calls) == 1 and verifier.cached == 1


def test_every_access_token_tokensvc_issues_has_the_form_the_verifier_takes():
    """The verifier refuses without a round trip whatever is not 43 or 86 URL-safe characters:
    every access token tokensvc mints has that form, random or a rotation's derived successor,
    with its routing part (86) or of the old shape (43)."""
    import secrets

    from tokensvc.oauth import successors, tokens
    from tokensvc.oauth.hashing import ACCESS_TOKEN

    key = secrets.token_bytes(32)
    for _ in range(2000):
        minted = tokens.mint("family-secret-22-chars", ["read"], utcnow(), 60, 60)
        routed = tokens.mint("family-secret-22-chars", ["read"], utcnow(), 60, 60, routing_key=key)
        derived = successors.derive(key, minted.refresh_token, 1, successors.new_salt())
        successor = tokens.mint("family-secret-22-chars", ["read"], utcnow(), 60, 60, derived=derived,
                                routing_key=key)
        assert len(routed.access_token) == len(successor.access_token) == 86
        assert all(ACCESS_TOKEN.fullmatch(token) for token in (minted.access_token, *derived, routed.access_token,
                                                               successor.access_token))


@pytest.mark.gen_test(timeout=90)
async def test_what_cannot_be_a_tokensvc_access_token_is_refused_without_a_round_trip(http_server, base_url):
    verifier = verifier_for(base_url)
    refresh_form = "b" * 22 + "." + "c" * 43
    for junk in ("a" * 42, "a" * 44, "a" * 85, "a" * 87, "a" * 85 + "=",
                 "a" * 513, "a" * 10**6, "a" * 42 + "=", "a" * 42 + "/", "a" * 42 + "é",
                 "a" * 42 + "\n", refresh_form):
        with pytest.raises(InvalidToken) as info:
            await verifier.check(junk)
        assert info.value.status == 401
    assert verifier.counts.introspections == 0 and verifier.cached == 0
    with pytest.raises(InvalidToken):  # the form of one: asked, and not active
        await verifier.check("a" * 43)
    assert verifier.counts.introspections == 1
    with pytest.raises(InvalidToken):  # a routed one's form: asked too
        await verifier.check("a" * 86)
    assert verifier.counts.introspections == 2


class Malformed(tornado.web.RequestHandler):
    """An introspection endpoint refusing every token as tokensvc refuses a malformed one."""

    def initialize(self, status):
        self.status = status

    def post(self):
        self.set_status(self.status)
        self.write({"error": "invalid_request", "error_description": "token is malformed"})


@pytest.mark.gen_test(timeout=90)
@pytest.mark.parametrize("status", [400, 422])
async def test_a_token_tokensvc_refuses_as_malformed_is_not_active(http_server, base_url, status):
    """tokensvc answers 422 (no token it issued looks like this): the token is not active (401),
    not tokensvc unavailable (503); the answer is cached like any inactive one. tokensvc itself
    refuses a token past the form of its own (the introspector asked directly: the verifier's
    check refuses that form before asking), and an endpoint refusing a token of the form (400,
    422) is asked once."""
    introspector = Introspector(Settings(base_url, "webapp", WEBAPP_SECRET))
    try:
        response = await AsyncHTTPClient().fetch(base_url + "/oauth/token/introspect", method="POST",
                                                 body="token=" + "a" * 1024, raise_error=False,
                                                 headers={"Authorization": basic("webapp", WEBAPP_SECRET)})
        assert response.code in (400, 422)
        assert await introspector.introspect("a" * 1024) is None  # not active, not Unavailable
    finally:
        introspector.close()
    server, refusing = await serve(tornado.web.Application([("/oauth/token/introspect", Malformed,
                                                             {"status": status})]))
    verifier = verifier_for(refusing)
    try:
        for _ in range(2):
            with pytest.raises(InvalidToken) as info:
                await verifier.check("a" * 43)
            assert info.value.status == 401
        assert verifier.counts.introspections == 1
    finally:
        server.stop()
        await verifier.close()


class Nested(tornado.web.RequestHandler):
    """An introspection endpoint answering JSON nested past any reader's depth."""

    def post(self):
        self.set_header("Content-Type", "application/json")
        self.write("[" * 60_000)


@pytest.mark.gen_test(timeout=90)
async def test_an_answer_nested_past_the_limit_is_tokensvc_unavailable_never_a_fault():
    """The library reads tokensvc's answers within the service's own nesting depth: an answer of
    60,000 ``[`` (a RecursionError, which no handler of the resource server expects, escaped
    the check) is an answer it cannot use, 503, and nothing is cached."""
    server, fake = await serve(tornado.web.Application([("/oauth/token/introspect", Nested)]))
    verifier = verifier_for(fake)
    try:
        for _ in range(2):
            with pytest.raises(Unavailable):
                await verifier.check("a" * 43)
        assert verifier.counts.introspections == 2
    finally:
        server.stop()
        await verifier.close()


@pytest.mark.gen_test(timeout=90)
async def test_a_flood_of_new_tokens_waits_in_a_bounded_queue_and_the_rest_fail_at_once():
    """Anyone may present made-up tokens: at most introspection_concurrency introspections are
    in flight for checks and introspection_queue more wait; a check past that fails at once
    (503), it does not queue; a token cached meanwhile is answered as ever."""
    known = "k" * 43
    verifier, release, calls = held_introspection(lambda token: token != known, introspection_concurrency=2,
                                                  introspection_queue=3)
    await verifier.check(known)  # answered at once: cached
    checks = [asyncio.ensure_future(verifier.check(f"{number:03d}" + "x" * 40)) for number in range(10)]
    await eventually(lambda: len(calls) == 2 and sum(check.done() for check in checks) == 5, DEADLINE,
                     what="two introspections in flight, five refused")
    refused = [check for check in checks if check.done()]
    assert all(isinstance(check.exception(), Unavailable) for check in refused) and refused == checks[5:]
    assert (await verifier.check(known)).scopes == ["read"]
    release.set()
    assert all(authorized.scopes == ["read"] for authorized in await asyncio.gather(*checks[:5]))
    assert len(calls) == 5


@pytest.mark.gen_test(timeout=90)
async def test_junk_tokens_never_evict_a_good_answer(browser, http_client, base_url):
    """Inactive answers are cached apart, in a bounded table of their own: a flood of made-up
    tokens neither grows the cache past its bound nor pushes a good answer out."""
    access = (await tokens(browser, http_client, base_url))["access_token"]
    verifier = verifier_for(base_url, max_entries=2, max_negative=3)
    await verifier.check(access)
    for number in range(10):
        with pytest.raises(InvalidToken):
            await verifier.check(f"junk{number:03d}" + "x" * 36)
    assert verifier.cached == 1 + 3
    await verifier.check(access)
    assert verifier.counts.introspections == 11 and verifier.counts.hits == 1


@pytest.mark.gen_test(timeout=90)
async def test_an_answer_lives_to_exp_by_tokensvcs_clock_not_this_hosts(browser, http_client, base_url):
    """This host's clock is 1,000 s behind tokensvc's: the answer's lifetime is taken from
    tokensvc's Date header, so it is asked again at the token's exp, not 1,000 s later."""
    access = (await tokens(browser, http_client, base_url))["access_token"]
    clock = Monotonic()
    verifier = Verifier(Settings(base_url, "webapp", WEBAPP_SECRET, offline_ttl=10**6, max_ttl=10**6), clock=clock,
                        wall=lambda: time.time() - 1000)
    assert (await verifier.check(access)).answer["exp"] > time.time() + 3000
    clock.now += 3600  # the token's lifetime (access_ttl), by the monotonic clock
    await verifier.check(access)  # still active at the service (its clock did not move): asked again
    assert verifier.counts.introspections == 2


@pytest.mark.gen_test(timeout=90)
async def test_a_watched_connection_ends_at_exp_by_tokensvcs_clock(http_server, base_url, ctx, clock):
    """A token issued to expire within seconds, watched on a host whose clock is 1,000 s behind
    tokensvc's: the connection ends at the token's exp, by tokensvc's clock."""
    clock.now = utcnow() - timedelta(seconds=3600 - 3)  # issued so as to expire in 3 s (access_ttl 3600)
    access = (await issue_tokens(ctx, "alice", "read")).access_token
    verifier = Verifier(Settings(base_url, "webapp", WEBAPP_SECRET), wall=lambda: time.time() - 1000)
    ended = asyncio.Event()
    stop = verifier.watch(access, await verifier.check(access), ended.set)
    try:
        await asyncio.wait_for(ended.wait(), DEADLINE)
    finally:
        stop()
        await verifier.close()


@pytest.mark.process
def test_the_library_imports_tornado_and_no_other_requirement_of_the_package():
    """What the resource-server guide tells an integrator: ``pip install tokensvc``, no extra, and the library
    imports Tornado alone of what setup.cfg requires (nor an ASGI framework or server)."""
    import configparser
    import re
    from pathlib import Path

    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parent.parent / "setup.cfg")
    required = {re.match(r"[A-Za-z0-9_]+", line).group(0).lower()
                for line in setup["options"]["install_requires"].split("\n") if line.strip()}
    assert {"tornado", "pymongo", "marshmallow"} <= required
    probe = ("import sys, tokensvc.resource, tokensvc.resource.tornado, tokensvc.resource.asgi; "
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    imported = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                  check=True).stdout.split())
    assert imported & (required | {"bson", "starlette", "uvicorn"}) == {"tornado"}


# -- the Tornado adapter ------------------------------------------------------------------------


class Notes(BearerAuthMixin):
    @requires("read")
    async def get(self) -> None:
        self.write({"subject": self.authorized.subject, "scopes": self.authorized.scopes})

    @requires()
    async def post(self) -> None:
        self.authorized.require("write")
        self.write({"written": True})


class Live(RevocableWebSocket):
    required_scope = "read"

    def open(self) -> None:
        self.write_message("hello")


async def serve(application):
    sock, port = tornado.testing.bind_unused_port()
    server = tornado.httpserver.HTTPServer(application)
    server.add_sockets([sock])
    return server, f"http://127.0.0.1:{port}"


@pytest.mark.gen_test(timeout=90)
async def test_the_tornado_mixin_answers_rfc_6750(browser, http_client, base_url):
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = verifier_for(base_url)
    server, api = await serve(tornado.web.Application([("/notes", Notes)], tokensvc_verifier=verifier))
    try:
        response = await http_client.fetch(api + "/notes", raise_error=False)
        assert response.code == 401 and response.headers["WWW-Authenticate"] == 'Bearer realm="api"'
        assert json.loads(response.body) == {"error_description": "A bearer token is required"}  # no error, as above
        response = await http_client.fetch(api + "/notes", raise_error=False, headers={"Authorization": "Bearer x"})
        assert response.code == 401 and 'error="invalid_token"' in response.headers["WWW-Authenticate"]
        assert json.loads(response.body)["error"] == "invalid_token"
        response = await http_client.fetch(api + "/notes", headers={"Authorization": f"Bearer {access}"})
        assert json.loads(response.body)["scopes"] == ["read"]
        response = await http_client.fetch(api + "/notes", method="POST", body="", raise_error=False,
                                           headers={"Authorization": f"Bearer {access}"})
        assert response.code == 403 and json.loads(response.body) == {
            "error": "insufficient_scope", "error_description": "The token lacks the scope write", "scope": "write"}
        assert 'scope="write"' in response.headers["WWW-Authenticate"]
    finally:
        server.stop()
        await verifier.close()  # the mixin opened its feed


class Failing(BearerAuthMixin):
    async def get(self):
        raise RuntimeError("a bug of the resource server")


@pytest.mark.gen_test(timeout=90)
@pytest.mark.parametrize("own_log", [False, True])
async def test_tornados_log_lines_never_hold_a_query_token(http_client, caplog, own_log):
    """A token in the query is taken out of the request as the mixin's handler is made: the
    access log (a refusal is a WARNING; a method the handler lacks, 405, is refused before any
    of its code runs), the line of an uncaught exception (Tornado's adds the request's repr),
    and an application's own ``log_function`` name the request with ``access_token=***``;
    whichever of Tornado's methods writes them (none is overridden)."""
    verifier = verifier_for("http://127.0.0.1:9")  # nothing listens: a token presented is answered 503
    own = {"log_function": lambda handler: logging.getLogger("app.access").info(
        "%s %s", handler.get_status(), handler.request.uri)} if own_log else {}
    server, api = await serve(tornado.web.Application([("/live", Live), ("/failing", Failing)],
                                                      tokensvc_verifier=verifier, **own))
    secret = "a-query-token-" + "x" * 29  # of the form of an access token: asked
    try:
        with caplog.at_level(logging.INFO):
            response = await http_client.fetch(api + "/failing?access_token=" + secret, raise_error=False)
            assert response.code == 500
            response = await http_client.fetch(api + "/live?x=1&access_token=" + secret, raise_error=False,
                                               headers={"Connection": "Upgrade", "Upgrade": "websocket"})
            assert response.code == 503
            response = await http_client.fetch(api + "/live?access_token=" + secret, method="POST", body="",
                                               raise_error=False)
            assert response.code == 405
            response = await http_client.fetch(api + "/live?access%5Ftoken=" + secret, raise_error=False)
            assert response.code == 503  # escaped, the name is access_token all the same: presented
            response = await http_client.fetch(api + "/failing?y=2&ACCESS%5ftoken=" + secret, raise_error=False)
            assert response.code == 500  # a name no parser takes for the token here, masked all the same
    finally:
        server.stop()
        await verifier.close()  # the mixin opened its feed
    logged = "\n".join(record.getMessage() + (caplog.text if record.exc_info else "") for record in caplog.records)
    assert "Uncaught exception GET /failing?access_token=*** " in logged
    if own_log:
        assert [record.getMessage() for record in caplog.records if record.name == "app.access"] == [
            "500 /failing?access_token=***", "503 /live?x=1&access_token=***", "405 /live?access_token=***",
            "503 /live?access_token=***", "500 /failing?y=2&access_token=***"]
    else:
        assert "GET /live?x=1&access_token=*** " in logged and "POST /live?access_token=*** " in logged
    assert secret not in caplog.text


@pytest.mark.gen_test(timeout=90)
async def test_the_tornado_websocket_closes_4401_when_its_token_is_revoked(browser, http_client, base_url):
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    other = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = await started(verifier_for(base_url))
    server, api = await serve(tornado.web.Application([("/live", Live)], tokensvc_verifier=verifier))
    try:
        ws = api.replace("http://", "ws://") + "/live"
        with pytest.raises(HTTPClientError) as info:
            await websocket_connect(ws)
        assert info.value.code == 401
        connection = await websocket_connect(ws + "?access_token=" + access)
        bystander = await websocket_connect(HTTPRequest(ws, headers={"Authorization": f"Bearer {other}"}))
        for socket in (connection, bystander):
            assert await socket.read_message() == "hello"
        await revoke(http_client, base_url, access)
        assert await gen.with_timeout(timedelta(seconds=DEADLINE), connection.read_message()) is None
        assert connection.close_code == 4401
        bystander.write_message("still here")
        assert bystander.close_code is None
        bystander.close()
    finally:
        server.stop()
        await verifier.close()


# -- the ASGI adapter ---------------------------------------------------------------------------


async def asgi_call(app, scope, incoming=()):
    """Run an ASGI application on one connection: what it sent."""
    queue: asyncio.Queue = asyncio.Queue()
    for message in incoming:
        queue.put_nowait(message)
    sent = []

    async def send(message):
        sent.append(message)

    await app(scope, queue.get, send)
    return sent


def http_scope(path, token=None):
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": headers, "scheme": "http", "server": ("test", 80), "client": ("127.0.0.1", 1),
            "root_path": "", "http_version": "1.1", "asgi": {"version": "3.0"}}


def starlette_app(verifier):
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from tokensvc.resource.asgi import BearerAuthMiddleware

    async def notes(request):
        request.auth.require("write" if request.query_params.get("write") else "read")
        return JSONResponse({"subject": request.auth.subject, "scopes": request.auth.scopes})

    async def healthz(request):
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/notes", notes), Route("/healthz", healthz)],
                     middleware=[Middleware(BearerAuthMiddleware, verifier=verifier, exempt=("/healthz",))])


@pytest.mark.gen_test(timeout=90)
async def test_the_asgi_middleware_in_a_starlette_application(browser, http_client, base_url):
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = verifier_for(base_url)
    app = starlette_app(verifier)
    try:
        sent = await asgi_call(app, http_scope("/notes"), [{"type": "http.request", "body": b""}])
        assert sent[0]["status"] == 401 and (b"www-authenticate", b'Bearer realm="api"') in sent[0]["headers"]
        sent = await asgi_call(app, http_scope("/notes", access), [{"type": "http.request", "body": b""}])
        assert sent[0]["status"] == 200 and json.loads(sent[1]["body"])["scopes"] == ["read"]
        scope = {**http_scope("/notes", access), "query_string": b"write=1"}
        sent = await asgi_call(app, scope, [{"type": "http.request", "body": b""}])
        assert sent[0]["status"] == 403 and json.loads(sent[1]["body"])["scope"] == "write"
        for path, status in (("/healthz", 200), ("/healthz/", 401), ("/healthz/../notes", 401)):
            sent = await asgi_call(app, http_scope(path), [{"type": "http.request", "body": b""}])
            assert sent[0]["status"] == status, path  # an exempt path is served as it is, and only it
    finally:
        await verifier.close()  # the middleware opened its feed on the first request


async def tornado_notes(verifier, path, token):
    server, api = await serve(tornado.web.Application([("/notes", Notes)], tokensvc_verifier=verifier))
    try:
        response = await AsyncHTTPClient().fetch(api + path, raise_error=False,
                                                 headers={"Authorization": f"Bearer {token}"})
        return response.code
    finally:
        server.stop()


async def asgi_notes(verifier, path, token):
    return (await asgi_call(starlette_app(verifier), http_scope(path, token),
                            [{"type": "http.request", "body": b""}]))[0]["status"]


@pytest.mark.gen_test(timeout=90)
@pytest.mark.parametrize("served", [tornado_notes, asgi_notes], ids=["tornado", "asgi"])
async def test_an_adapter_opens_the_feed_the_application_forgot_to_start(served, browser, http_client, base_url):
    """No ``await verifier.start()``, no lifespan: the first check opens the feed, so a revoked
    token is refused as soon as the feed names it, not ``offline_ttl`` (an hour here) later. A
    verifier closed at shutdown is not opened again by a late request, which it refuses (503)."""
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = verifier_for(base_url, offline_ttl=3600)
    try:
        assert await served(verifier, "/notes", access) == 200
        await asyncio.wait_for(verifier.connected.wait(), DEADLINE)
        await revoke(http_client, base_url, access)
        await eventually(lambda: verifier.cached == 0, DEADLINE, what="the feed dropping the answer")
        assert await served(verifier, "/notes", access) == 401
    finally:
        await verifier.close()
    assert await served(verifier, "/notes", access) == 503
    assert not verifier.following  # no feed following again


@pytest.mark.gen_test(timeout=90)
async def test_the_asgi_websocket_closes_4401_when_its_token_is_revoked(browser, http_client, base_url):
    from tokensvc.resource.asgi import BearerAuthMiddleware

    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = await started(verifier_for(base_url))
    received = []

    async def app(scope, receive, send):  # a plain ASGI WebSocket application
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": "hello"})
        while True:
            message = await receive()
            received.append(message)
            if message["type"] == "websocket.disconnect":
                return

    middleware = BearerAuthMiddleware(app, verifier, scope="read")
    scope = {**http_scope("/live"), "type": "websocket", "query_string": f"access_token={access}".encode()}
    try:
        refused = await asgi_call(middleware, {**scope, "query_string": b""}, [{"type": "websocket.connect"}])
        assert refused == [{"type": "websocket.close", "code": 1008}]
        queue: asyncio.Queue = asyncio.Queue()
        queue.put_nowait({"type": "websocket.connect"})
        sent = []

        async def send(message):
            sent.append(message)

        running = asyncio.ensure_future(middleware(scope, queue.get, send))
        await eventually(lambda: len(sent) == 2, DEADLINE, what="the socket accepted")
        await revoke(http_client, base_url, access)
        await asyncio.wait_for(running, DEADLINE)
        assert sent[-1] == {"type": "websocket.close", "code": 4401}
        assert received == [{"type": "websocket.disconnect", "code": 4401}]
        assert scope["query_string"] == b"access_token=***"  # what the server's access log writes
    finally:
        await verifier.close()


@pytest.mark.parametrize("query, token", [
    ("access_token=first&access_token=last", "last"),  # given twice, the last counts
    ("access_token=%20padded%09", "padded"),  # whitespace around it stripped
    ("access%5Ftoken=escaped", "escaped"),  # the name as a parser decodes it
    ("access_token=first&access_token=", ""),  # a blank last one is presented, and refused as such
    ("ACCESS_TOKEN=other-name", None),
])
def test_every_adapter_reads_the_query_token_as_tokensvcs_own_sockets_do(query, token):
    """The ASGI middleware and the Tornado adapter take the same token from the same query as
    tokensvc's own sockets (``get_query_argument``), and leave no part of any in the request."""
    from unittest import mock

    from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

    from tokensvc.resource.bearer import take_query_token
    from tokensvc.resource.tornado import BearerAuthMixin

    scope = {"query_string": query.encode()}
    assert take_query_token(scope) == token
    request = HTTPServerRequest(start_line=RequestStartLine("GET", "/live?" + query, "HTTP/1.1"),
                                headers=HTTPHeaders({"Host": "api.example"}), connection=mock.Mock())
    handler = type("Probe", (BearerAuthMixin, tornado.web.RequestHandler), {"accept_query_token": True})
    own = type("Own", (tornado.web.RequestHandler,), {})(tornado.web.Application(), HTTPServerRequest(
        start_line=RequestStartLine("GET", "/live?" + query, "HTTP/1.1"), headers=HTTPHeaders({"Host": "api.example"}),
        connection=mock.Mock()))
    assert handler(tornado.web.Application(), request).presented_token() == token
    assert own.get_query_argument("access_token", None) == token
    for value in ("first", "padded", "escaped"):
        assert value not in scope["query_string"].decode() and value not in request.uri


@pytest.mark.gen_test(timeout=90)
async def test_a_websocket_is_closed_when_feed_and_tokensvc_are_away_past_offline_ttl(http_server, browser,
                                                                                        http_client, base_url, ctx):
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    verifier = await started(verifier_for(base_url, offline_ttl=0.2, timeout=2, retry_seconds=0.05))
    server, api = await serve(tornado.web.Application([("/live", Live)], tokensvc_verifier=verifier))
    try:
        connection = await websocket_connect(api.replace("http://", "ws://") + "/live?access_token=" + access)
        assert await connection.read_message() == "hello"
        http_server.stop()
        await http_server.close_all_connections()
        drop_feeds(ctx)
        assert await gen.with_timeout(timedelta(seconds=DEADLINE), connection.read_message()) is None
        assert connection.close_code == 4401
    finally:
        server.stop()
        await verifier.close()
