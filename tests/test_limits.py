"""Brute force: failed client authentications and sign-ins are limited per key and per address."""

import pytest
from backends import BACKENDS
from helpers import (
    PARTNER_SECRET,
    SKY_REDIRECT,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    basic,
    eventually,
    make_config,
    post_form,
)
from tornado.httpclient import HTTPRequest

from tokensvc.config import LimitSettings
from tokensvc.oauth import hashing
from tokensvc.ratelimit import FailureLimits, MemoryFailureLimiter, TooManyFailures
from tokensvc.records import Client


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
@pytest.mark.parametrize("config", [make_config(limits={
    "window_seconds": 60, "failed_client_auth_per_client": 3, "failed_client_auth_per_address": 5})],
    ids=["five-per-address"])
async def test_failed_client_authentication_is_limited_per_address(http_client, base_url, config):
    # Guesses at the secrets set by hand (the configuration's), over both of their ids.
    for client_id in ("webapp", "webapp", "webapp", "partner", "partner"):
        assert (await introspect(http_client, base_url, "wrong", client_id=client_id)).code == 401
    assert (await introspect(http_client, base_url, "wrong", client_id="webapp")).code == 429  # per client
    # partner has failed twice (its limit is 3), the address five times (its limit).
    assert (await introspect(http_client, base_url, "wrong", client_id="partner")).code == 429
    assert (await introspect(http_client, base_url, PARTNER_SECRET, client_id="partner")).code == 429  # set by hand
    # A public client proves nothing, so there is nothing to guess: it is never refused, and
    # gets the answer its request deserves.
    token_endpoint = await post_form(http_client, base_url + "/oauth/token", {
        "grant_type": "authorization_code", "code": "x", "redirect_uri": SKY_REDIRECT, "client_id": "skyplanner"})
    assert token_endpoint.code == 400 and b"invalid_grant" in token_endpoint.body


ROBOT_SECRET = hashing.new_secret()  # a generated secret: 256 random bits


async def add_robot(store):
    """A confidential client with a generated secret, recorded as such."""
    digest = hashing.digest(ROBOT_SECRET)
    await store.put_client(Client("robot", "Robot", ["https://robot.example/cb"], secret_hash=digest,
                                  generated_secret_hash=digest))


def revoke_from(http_client, base_url, address, client_id, secret):
    """POST /oauth/token/revoke (client authentication, then 200 {} whatever the token) from ``address``."""
    return http_client.fetch(HTTPRequest(base_url + "/oauth/token/revoke", method="POST", body="token=x",
                                         headers={"Authorization": basic(client_id, secret)},
                                         network_interface=address), raise_error=False)


@pytest.mark.gen_test
async def test_a_right_generated_secret_is_never_refused_by_a_limit(http_client, base_url, store, ctx, caplog):
    """Guessing a 256-bit secret gains nothing from a limit, and refusing the right one is a
    denial of service by anyone sharing the address (every local user shares loopback): the
    guesses are counted, audited and answered 429 past the limit, and the client's own right
    secret is answered from that address all the same."""
    await add_robot(store)
    codes = [(await revoke_from(http_client, base_url, "127.0.0.11", client_id, "guess")).code
             for _ in range(10) for client_id in ("robot", "webapp")]
    assert codes[:6] == [401] * 6 and set(codes[6:]) == {429}  # failed_client_auth_per_address
    assert (await revoke_from(http_client, base_url, "127.0.0.11", "robot", ROBOT_SECRET)).code == 200
    assert (await revoke_from(http_client, base_url, "127.0.0.11", "robot", "guess")).code == 429
    # A hand-set secret shorter than a generated one could be guessed: it keeps the limit.
    assert (await revoke_from(http_client, base_url, "127.0.0.11", "webapp", WEBAPP_SECRET)).code == 429
    failures = [r for r in caplog.records if getattr(r, "audit", {}).get("event") == "client_auth"]
    assert len(failures) == 21
    text = ctx.metrics.render().decode()
    assert "tokensvc_client_auth_failures_total 21.0" in text
    assert 'tokensvc_rate_limited_total{kind="client_auth"} 16.0' in text


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


@pytest.mark.gen_test
async def test_disabled_limits_never_refuse():
    limits = FailureLimits(LimitSettings(enabled=False, failed_logins_per_username=1,
                                         failed_client_auth_per_client=1))
    for attempt in (limits.login_attempt("alice", "127.0.0.1"), limits.client_attempt("webapp", "127.0.0.1")):
        for _ in range(5):
            await limits.failed(attempt)
            assert await limits.reserve(attempt) is None  # nothing counted, nothing refused
            await limits.check(attempt)


# -- under concurrency, and from several addresses (127.0.0.0/8) -----------------------------

import asyncio  # noqa: E402
from urllib.parse import urlencode  # noqa: E402

from helpers import Browser  # noqa: E402
from tornado.httpclient import AsyncHTTPClient  # noqa: E402


@pytest.fixture
def wide_client(io_loop):
    client = AsyncHTTPClient(force_instance=True, max_clients=64)
    yield client
    client.close()


def sign_in_request(base_url, xsrf, password, address="127.0.0.1"):
    return HTTPRequest(base_url + "/login", method="POST",  # from ``address``, to the service
                       body=urlencode({"username": "alice", "password": password, "_xsrf": xsrf, "next": "/"}),
                       headers={"Cookie": f"_xsrf={xsrf}"}, follow_redirects=False, network_interface=address)


def count_password_checks(monkeypatch) -> list[int]:
    """A list that gets one entry per password checked (scrypt still runs: a real wait)."""
    from tokensvc.oauth import sessions

    checked: list[int] = []
    original = sessions.check_password

    async def counting(*args, **kwargs):
        checked.append(1)
        return await original(*args, **kwargs)

    monkeypatch.setattr(sessions, "check_password", counting)
    return checked


@pytest.mark.gen_test(timeout=60)
async def test_forty_concurrent_wrong_passwords_check_only_the_limits_worth(browser, wide_client, base_url,
                                                                            monkeypatch):
    checked = count_password_checks(monkeypatch)
    xsrf = await browser.xsrf()
    requests = [sign_in_request(base_url, xsrf, "wrong-password") for _ in range(39)]
    requests.append(sign_in_request(base_url, xsrf, "alice-password"))  # the right one, in the same burst
    responses = await asyncio.gather(*(wide_client.fetch(r, raise_error=False) for r in requests))
    codes = sorted(response.code for response in responses)
    assert len(checked) == 3  # failed_logins_per_username, for this address
    assert codes.count(429) == 37 and set(codes) <= {401, 302, 429}
    # The owner, from an address of their own, is not locked out.
    owner = await wide_client.fetch(sign_in_request(base_url, xsrf, "alice-password", "127.0.0.2"), raise_error=False)
    assert owner.code == 302


@pytest.fixture
def yielding_ctx(backend_store, config, monkeypatch, io_loop):
    """A context over a store whose every call yields to the event loop: the mongodb stand-in
    does by itself (tests/yielding.py); the memory store is made to."""
    from tokensvc.bootstrap import make_context, seed
    from tokensvc.storage.memory import MemoryStore

    if isinstance(backend_store, MemoryStore):
        original = backend_store.get_client

        async def yielding_get_client(client_id):
            await asyncio.sleep(0)
            return await original(client_id)

        monkeypatch.setattr(backend_store, "get_client", yielding_get_client)
    io_loop.run_sync(lambda: seed(backend_store, config))
    return make_context(config, backend_store)


async def authenticate(ctx, secret, address="127.0.0.1", client_id="webapp"):
    from tokensvc.oauth import clientauth
    from tokensvc.oauth.clientauth import ClientRequest
    from tokensvc.oauth.errors import InvalidClient

    try:
        return await clientauth.authenticate_request(ctx, ClientRequest(None, client_id, secret, address))
    except (InvalidClient, TooManyFailures) as exc:
        return type(exc).__name__


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_forty_concurrent_wrong_secrets_learn_only_the_limits_worth(yielding_ctx):
    """A secret is checked at once (a digest); what a guess learns is its answer: 401 for only
    the limit's worth of wrong ones, 429 for the rest, and for the right one past the limit."""
    results = await asyncio.gather(*(authenticate(yielding_ctx, "wrong") for _ in range(39)),
                                   authenticate(yielding_ctx, WEBAPP_SECRET))
    assert results.count("InvalidClient") == 3  # failed_client_auth_per_client, for this address
    assert results.count("TooManyFailures") == 37
    assert results[-1] == "TooManyFailures"  # the right secret, after the limit: no different answer
    # The client itself, from another address, still authenticates.
    assert (await authenticate(yielding_ctx, WEBAPP_SECRET, "127.0.0.3")).client_id == "webapp"


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_concurrent_right_secrets_are_never_refused(yielding_ctx):
    # A busy confidential client (a resource server introspecting) sends many requests at once
    # from one address: attempts in flight must not count against the failure limit.
    results = await asyncio.gather(*(authenticate(yielding_ctx, WEBAPP_SECRET) for _ in range(50)))
    assert all(getattr(result, "client_id", None) == "webapp" for result in results), results


@pytest.mark.gen_test
async def test_a_strangers_failures_do_not_lock_the_owner_out(http_client, base_url):
    stranger = Browser(http_client, base_url)
    for _ in range(3):
        request = sign_in_request(stranger.base_url, await stranger.xsrf(), "wrong", "127.0.0.4")
        assert (await http_client.fetch(request, raise_error=False)).code == 401
    assert (await http_client.fetch(sign_in_request(stranger.base_url, stranger.cookies["_xsrf"], "wrong",
                                                    "127.0.0.4"), raise_error=False)).code == 429
    owner = Browser(http_client, base_url)
    assert (await owner.login("alice")).code == 302


# -- across processes: several service contexts over one MongoDB (the yielding stand-in) -----------


@pytest.fixture
def processes(io_loop, config):
    """Eight service contexts, as eight processes have, over one MongoDB whose every call
    yields to the event loop."""
    from backends import open_store

    from tokensvc.bootstrap import make_context, seed
    from tokensvc.storage.mongo import MongoStore

    store, cleanup = open_store("mongodb", io_loop)
    io_loop.run_sync(lambda: seed(store, config))
    stores = [store] + [MongoStore(store.client, store.db.name, change_streams=False) for _ in range(7)]
    yield [make_context(config, each) for each in stores]
    cleanup()


@pytest.mark.gen_test(timeout=60)
async def test_forty_concurrent_wrong_secrets_over_eight_processes_learn_only_the_limits_worth(processes):
    assert all(ctx.limits.shared is not None for ctx in processes)
    results = await asyncio.gather(*(authenticate(processes[n % 8], "wrong") for n in range(40)))
    assert results.count("InvalidClient") == 3 and results.count("TooManyFailures") == 37
    # Every process now refuses the right hand-set secret from that address too; another address is free.
    assert {await authenticate(ctx, WEBAPP_SECRET) for ctx in processes} == {"TooManyFailures"}
    assert (await authenticate(processes[5], WEBAPP_SECRET, "127.0.0.9")).client_id == "webapp"
    # A generated secret that checks out is answered by every process, from that address too.
    await add_robot(processes[0].store)
    assert {(await authenticate(ctx, ROBOT_SECRET, client_id="robot")).client_id for ctx in processes} == {"robot"}
    # Guesses at it count in a group of their own, limited alike (their 429 says nothing: a
    # right one is answered, and no guess is ever right), which refuses no client's right secret.
    guesses = [await authenticate(ctx, "guess", client_id="robot") for ctx in processes]
    assert guesses == ["InvalidClient"] * 3 + ["TooManyFailures"] * 5


@pytest.mark.gen_test(timeout=60)
async def test_concurrent_right_secrets_over_eight_processes_are_never_refused(processes):
    results = await asyncio.gather(*(authenticate(processes[n % 8], WEBAPP_SECRET) for n in range(48)))
    assert all(getattr(result, "client_id", None) == "webapp" for result in results), results


@pytest.mark.gen_test(timeout=60)
async def test_forty_concurrent_wrong_passwords_over_eight_processes_check_only_the_limits_worth(
        processes, monkeypatch):
    from tokensvc.oauth import sessions

    checked = count_password_checks(monkeypatch)

    async def sign_in(ctx, password):
        try:
            return await sessions.sign_in(ctx, "alice", password, "127.0.0.1")
        except TooManyFailures:
            return "TooManyFailures"

    results = await asyncio.gather(*(sign_in(processes[n % 8], "wrong-password") for n in range(40)))
    assert len(checked) == 3  # failed_logins_per_username: reserved in the store before scrypt
    assert results.count(None) == 3 and results.count("TooManyFailures") == 37
    # The owner signs in from another address; a right password gives its reservation back.
    assert (await sessions.sign_in(processes[2], "alice", "alice-password", "127.0.0.5")).username == "alice"
    group = processes[0].limits.login_attempt("alice", "127.0.0.5").group

    async def given_back():  # the store takes the reservation back in the background
        return set((await processes[0].store.db["failures"].find_one({"_id": group}))["c"].values()) == {0}

    await eventually(given_back, what="the reservation given back")


@pytest.mark.gen_test(timeout=60)
async def test_a_take_back_the_store_missed_is_made_once_it_answers_again(processes, config, monkeypatch):
    """The store goes away between a sign-in's count and its take-back (a right password): the
    take-back is kept and made as soon as the store may answer again, so that the counts of the
    address and the username are as they were, not one too high until the window ends (an
    outage under sign-in load left every right password behind the address refused, 429)."""
    from tokensvc.ratelimit import FailureLimits
    from tokensvc.storage.base import StorageError

    store = processes[0].store
    counts = store.failure_counts()
    away, back = True, asyncio.Event()
    taking_back = counts.uncount_attempt

    async def uncount(*args):
        if away:
            raise StorageError("MongoDB: no answer within 2 s")
        return await taking_back(*args)

    async def reachable(seconds):  # the store's: returns once it may answer again
        await back.wait()

    monkeypatch.setattr(counts, "uncount_attempt", uncount)
    limits = FailureLimits(config.limits, shared=counts, pause=reachable)
    attempt = limits.login_attempt("alice", "127.0.0.1")
    for _ in range(3):
        limits.release(await limits.reserve(limits.sign_in_attempts("alice", "127.0.0.1")), clear_account=True)
    await eventually(lambda: limits.owed == 6, what="the take-backs the store missed, kept")  # two groups each
    assert (await counts.read_counts(attempt.group, attempt.names))[0] == [3, 3]
    away = False
    back.set()
    await eventually(lambda: limits.owed == 0, what="the take-backs made")
    assert (await counts.read_counts(attempt.group, attempt.names))[0] == [0, 0]


# -- what exempts a right secret: what the store holds of it, never what a request presents -------

# Set by hand and as long as a generated secret (43 characters), but predictable: a guesser who
# knows the pattern finds it. Its length said "high entropy", and the right one was answered
# 200 among 429s (about 254 guesses a second on one connection found one).
LONG_HAND_SET = "webapp-production-secret-2026-01-15-by-carol"


def spec(name, **fields):
    from tokensvc.admin.actions import ClientSpec

    return ClientSpec(name, ["https://robot.example/cb"], **fields)


async def hand_set_by_configuration(ctx):
    """webapp, as a configuration entry sets it, with a long secret (the fixture's config)."""
    return "webapp", LONG_HAND_SET


async def hand_set_by_the_admin_api(ctx):
    from tokensvc.admin import actions as admin

    await admin.create_client(ctx.store, spec("Robot", secret_sha256=hashing.digest(LONG_HAND_SET)), "robot")
    return "robot", LONG_HAND_SET


async def hand_set_over_a_generated_one(ctx):
    from tokensvc.admin import actions as admin

    await admin.create_client(ctx.store, spec("Robot", confidential=True), "robot")
    await admin.update_client(ctx, "robot", {"secret_sha256": hashing.digest(LONG_HAND_SET)})
    return "robot", LONG_HAND_SET


async def hand_set_then_kept_by_a_rotation(ctx):
    """A rotation that keeps the previous secret: that one is still the hand-set one."""
    from tokensvc.admin import actions as admin

    await admin.create_client(ctx.store, spec("Robot", secret_sha256=hashing.digest(LONG_HAND_SET)), "robot")
    await admin.rotate_secret(ctx, "robot", keep_previous_seconds=3600)
    return "robot", LONG_HAND_SET


HAND_SET = [hand_set_by_configuration, hand_set_by_the_admin_api, hand_set_over_a_generated_one,
            hand_set_then_kept_by_a_rotation]


LONG_SECRET_CONFIG = make_config(limits={"window_seconds": 60, "failed_client_auth_per_client": 3,
                                         "failed_client_auth_per_address": 6},
                                 clients=[{"client_id": "webapp", "name": "Web app", "redirect_uris": [WEBAPP_REDIRECT],
                                           "first_party": True, "client_secret": LONG_HAND_SET}])


@pytest.fixture
def long_secret_config():
    return LONG_SECRET_CONFIG


@pytest.mark.gen_test
@pytest.mark.parametrize("made", HAND_SET, ids=lambda made: made.__name__)
async def test_a_secret_set_by_hand_keeps_the_limit_on_right_answers_however_long(long_secret_config, made):
    from tokensvc.bootstrap import make_context, seed
    from tokensvc.storage.memory import MemoryStore

    store = MemoryStore()
    await seed(store, long_secret_config)
    ctx = make_context(long_secret_config, store)
    client_id, secret = await made(ctx)
    assert len(secret) >= hashing.SECRET_LENGTH
    assert [await authenticate(ctx, "guess", client_id=client_id) for _ in range(4)] == \
        ["InvalidClient"] * 3 + ["TooManyFailures"]
    assert await authenticate(ctx, secret, client_id=client_id) == "TooManyFailures"
    # From an address of its own, the client is answered.
    assert (await authenticate(ctx, secret, "127.0.0.31", client_id=client_id)).client_id == client_id


async def generated_by_registration(ctx):
    from tokensvc.admin import actions as admin

    client, secret = await admin.create_client(ctx.store, spec("Robot", confidential=True), "robot")
    return "robot", secret


async def generated_by_a_rotation(ctx):
    from tokensvc.admin import actions as admin

    await admin.create_client(ctx.store, spec("Robot", secret_sha256=hashing.digest(LONG_HAND_SET)), "robot")
    secret, _ = await admin.rotate_secret(ctx, "robot")
    return "robot", secret


async def generated_then_kept_by_a_rotation(ctx):
    from tokensvc.admin import actions as admin

    client, secret = await admin.create_client(ctx.store, spec("Robot", confidential=True), "robot")
    await admin.rotate_secret(ctx, "robot", keep_previous_seconds=3600)
    return "robot", secret


async def generated_when_made_confidential(ctx):
    from tokensvc.admin import actions as admin

    await admin.create_client(ctx.store, spec("Robot"), "robot")
    _, secret = await admin.update_client(ctx, "robot", {"confidential": True})
    return "robot", secret


async def generated_then_handed_back_by_the_configuration(ctx):
    """Rotated, then its digest copied into the configuration that seeds the client (the
    procedure for a client the configuration owns): the very secret the service generated."""
    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import seed

    secret, _ = await admin.rotate_secret(ctx, "webapp")
    await seed(ctx.store, make_config(clients=[{"client_id": "webapp", "name": "Web app",
                                                "redirect_uris": [WEBAPP_REDIRECT], "first_party": True,
                                                "client_secret_sha256": hashing.digest(secret)}]))
    return "webapp", secret


async def generated_then_handed_back_by_the_admin_api(ctx):
    from tokensvc.admin import actions as admin

    client, secret = await admin.create_client(ctx.store, spec("Robot", confidential=True), "robot")
    await admin.update_client(ctx, "robot", {"secret_sha256": hashing.digest(secret)})
    await admin.put_client(ctx, "robot", spec("Robot", secret_sha256=hashing.digest(secret), description="Again"))
    return "robot", secret


GENERATED = [generated_by_registration, generated_by_a_rotation, generated_then_kept_by_a_rotation,
             generated_when_made_confidential, generated_then_handed_back_by_the_configuration,
             generated_then_handed_back_by_the_admin_api]


@pytest.mark.gen_test
@pytest.mark.parametrize("made", GENERATED, ids=lambda made: made.__name__)
async def test_a_secret_the_service_generated_is_never_refused(long_secret_config, made):
    from tokensvc.bootstrap import make_context, seed
    from tokensvc.storage.memory import MemoryStore

    store = MemoryStore()
    await seed(store, long_secret_config)
    ctx = make_context(long_secret_config, store)
    client_id, secret = await made(ctx)
    assert secret is not None
    assert [await authenticate(ctx, "guess", client_id=client_id) for _ in range(4)] == \
        ["InvalidClient"] * 3 + ["TooManyFailures"]
    assert (await authenticate(ctx, secret, client_id=client_id)).client_id == client_id
    assert await authenticate(ctx, "guess", client_id=client_id) == "TooManyFailures"


def answer_of(response):
    """What a caller learns from a response: its status, body and headers (the request id and
    the date aside, which every response has of its own)."""
    headers = sorted((name, value) for name, value in response.headers.get_all()
                     if name not in ("X-Request-Id", "X-Request-ID", "Date"))
    return response.code, response.body, headers


@pytest.fixture
def frozen_limits(ctx):
    """The limits' clock stopped: Retry-After is the same for every answer of one moment."""
    ctx.limits.clock = lambda: 1000.0
    return ctx


@pytest.mark.gen_test
@pytest.mark.parametrize("config", [LONG_SECRET_CONFIG], ids=["long-hand-set"])
async def test_past_the_limit_a_right_and_a_wrong_secret_get_the_same_answer(http_client, base_url, frozen_limits):
    """While a key is over its limit, what a guesser gets for the right hand-set secret is what
    it gets for a wrong one: status, body and every header."""
    for _ in range(3):
        assert (await revoke_from(http_client, base_url, "127.0.0.41", "webapp", "guess")).code == 401
    answers = [answer_of(await revoke_from(http_client, base_url, "127.0.0.41", "webapp", secret))
               for secret in ("guess", LONG_HAND_SET, "guess-again", LONG_HAND_SET)]
    assert answers[0][0] == 429
    assert all(answer == answers[0] for answer in answers), answers


PAST_THE_LIMIT = [["right"] * 6, ["wrong"] * 6, ["right", "wrong"] * 3, ["wrong", "right"] * 3,
                  ["wrong", "right", "right", "wrong", "wrong", "wrong"]]


async def answers_past_the_limit(now, attempt, pattern):
    """What ``attempt(right)`` answers, one every 2 s on the limits' clock: first three wrong
    ones (the key's limit), then ``pattern``; each answer's kind, or the refusal's Retry-After
    and the limit that refused."""
    answers = []
    for guess in ["wrong"] * 3 + pattern:
        try:
            answers.append(await attempt(guess == "right"))
        except TooManyFailures as refused:
            answers.append(("TooManyFailures", refused.retry_after, refused.reason))
        now[0] += 2
    return answers


async def client_secret_attempt(ctx, n):
    """A hand-set client secret (the configuration's), from an address of the run's own."""
    from tokensvc.oauth import clientauth
    from tokensvc.oauth.clientauth import ClientRequest
    from tokensvc.oauth.errors import InvalidClient

    async def attempt(right):
        try:
            await clientauth.authenticate_request(ctx, ClientRequest(
                None, "webapp", WEBAPP_SECRET if right else "wrong", f"127.0.12.{n}"))
        except InvalidClient:
            return "InvalidClient"
        return "authenticated"
    return attempt


async def password_attempt(ctx, n, known=False):
    """A password of an account of the run's own, from a browser it does not know (or from one
    that signed in to it before: ``known``)."""
    from tokensvc.oauth import sessions
    from tokensvc.oauth.sessions import KnownBrowser
    from tokensvc.records import User

    username = f"guessed{n}"
    await ctx.store.put_user(User(f"u_guessed{n}", username, cheap_password_hash("right-password")))
    browser = KnownBrowser.new().knowing(username) if known else None

    async def attempt(right):
        password = "right-password" if right else "wrong-password"
        user = await sessions.sign_in(ctx, username, password, f"127.0.13.{n}", browser)
        return "signed in" if user else "wrong password"
    return attempt


async def known_browser_password_attempt(ctx, n):
    return await password_attempt(ctx, n, known=True)


@pytest.mark.gen_test(timeout=120)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
@pytest.mark.parametrize("config", [make_config(limits={
    "window_seconds": 60, "failed_client_auth_per_client": 3, "failed_client_auth_per_address": 6,
    "failed_logins_per_username": 3, "failed_logins_per_address": 5, "failed_logins_per_account": 3})],
    ids=["limits"])
@pytest.mark.parametrize("kind", [client_secret_attempt, password_attempt, known_browser_password_attempt],
                         ids=["hand-set-client-secret", "password", "password-from-a-known-browser"])
async def test_past_the_limit_right_and_wrong_leave_the_same_state(yielding_ctx, kind):
    """While a key is over its limit, a right and a wrong credential get the same answer and
    leave the same state: every later answer, its Retry-After included, is the same whichever
    was sent. A refused attempt is not counted: the window is not extended by refused guesses,
    and Retry-After falls as the clock runs."""
    now = [10_000.0]
    yielding_ctx.limits.clock = lambda: now[0]
    runs = []
    for n, pattern in enumerate(PAST_THE_LIMIT):
        now[0] = 10_000.0
        runs.append(await answers_past_the_limit(now, await kind(yielding_ctx, n), pattern))
    first = runs[0]
    assert all(answer[0] == "TooManyFailures" for answer in first[3:]), first
    assert [answer[1] for answer in first[3:]] == [first[3][1] - 2 * step for step in range(6)], first
    assert all(run == first for run in runs), runs


@pytest.mark.gen_test
async def test_failures_under_client_ids_that_do_not_exist_never_limit_a_real_one(http_client, base_url, store):
    """Anyone sharing an address failed under ids no client has (and with malformed credentials)
    until the address was over its limit, and every client with a hand-set secret was refused
    from it: a resource server's introspection, and so every new token at its API (503)."""
    await add_robot(store)
    failures = []
    for n in range(12):
        failures.append((await revoke_from(http_client, base_url, "127.0.0.51", f"ghost-{n}", "guess")).code)
        malformed = HTTPRequest(base_url + "/oauth/token/revoke", method="POST", body="token=x",
                                headers={"Authorization": "Basic !!!"}, network_interface="127.0.0.51")
        failures.append((await http_client.fetch(malformed, raise_error=False)).code)
    # The unknown ids are limited all the same, in a count of their own.
    assert failures[:6] == [401] * 6 and set(failures[6:]) == {429}
    # A public client's id and a generated secret's guessed at: nothing a limit protects either.
    for _ in range(12):
        await revoke_from(http_client, base_url, "127.0.0.51", "robot", "guess")
        await http_client.fetch(HTTPRequest(base_url + "/oauth/token/revoke", method="POST",
                                            body="token=x&client_id=skyplanner&client_secret=guess",
                                            network_interface="127.0.0.51"), raise_error=False)
    # The clients whose secrets were set by hand are answered from that address.
    assert (await revoke_from(http_client, base_url, "127.0.0.51", "webapp", WEBAPP_SECRET)).code == 200
    assert (await revoke_from(http_client, base_url, "127.0.0.51", "partner", PARTNER_SECRET)).code == 200


# -- per account, across addresses: passwords (NIST SP 800-63B §5.2.2) ------------------------------
#
# An account takes at most 10 failed sign-ins an hour (limits.failed_logins_per_account,
# limits.account_window_seconds) from every browser that has not signed in to it before, from
# any number of addresses, and at most 100 failures since its last sign-in
# (limits.consecutive_failed_logins). A browser that has signed in to it before is an account of
# its own to the limits: its owner signs in there whatever anyone else fails.


def browser_at(http_client, base_url, address):
    return Browser(http_client, base_url, address=address)


def addresses(count, start=100):
    """``count`` loopback addresses, each an address of its own to the limits."""
    return [f"127.0.{(start + n) // 250}.{(start + n) % 250 + 2}" for n in range(count)]


@pytest.mark.gen_test(timeout=90)
async def test_an_account_takes_ten_failures_an_hour_from_any_number_of_addresses(http_client, base_url, monkeypatch):
    """40 wrong passwords for one account from 20 addresses, two each (within every address's
    limits): all of them were answered 401. Only 10 are checked now; and the owner, in a browser
    that has not signed in before, is told to wait or to use one that has."""
    checked = count_password_checks(monkeypatch)
    codes = []
    for address in addresses(20):
        guesser = browser_at(http_client, base_url, address)
        for _ in range(2):
            codes.append((await guesser.login("alice", "wrong-password")).code)
    assert codes[:10] == [401] * 10 and codes[10:] == [429] * 30
    assert len(checked) == 10
    owner = browser_at(http_client, base_url, "127.0.9.9")
    refused = await owner.login("alice")
    assert refused.code == 429 and 1 <= int(refused.headers["Retry-After"]) <= 3600
    assert b"Too many failed sign-in attempts for this account" in refused.body
    assert b"a browser you have signed in with before" in refused.body
    # Another account is not touched, from the same addresses.
    assert (await browser_at(http_client, base_url, addresses(1)[0]).login("root")).code == 302


@pytest.mark.gen_test(timeout=90)
async def test_the_owner_signs_in_where_they_signed_in_before_whatever_anyone_fails(http_client, base_url, config):
    owner = browser_at(http_client, base_url, "127.0.0.1")
    assert (await owner.login("alice")).code == 302
    assert any(name.endswith("_browser") for name in owner.cookies)
    await owner.fetch("/logout", "POST", {"_xsrf": owner.cookies["_xsrf"]})
    # Guessers spend the account's hour, and the address the owner shares with them.
    for address in addresses(5):
        await browser_at(http_client, base_url, address).login("alice", "wrong-password")
        await browser_at(http_client, base_url, address).login("alice", "wrong-password")
    for name in ("u1", "u2", "u3", "u4", "u5"):
        await browser_at(http_client, base_url, "127.0.0.1").login(name, "whatever-password")
    assert (await browser_at(http_client, base_url, "127.0.0.1").login("alice")).code == 429
    # The owner's browser, from that address or any other.
    assert (await owner.login("alice")).code == 302
    owner.address = "127.0.5.5"
    assert (await owner.login("alice")).code == 302
    # A cookie that is not the service's, or a browser that signed in to another account, is no
    # browser that signed in to this one.
    forged = browser_at(http_client, base_url, "127.0.5.6")
    forged.cookies[config.browser_cookie] = "made-up|" + "0" * 32
    assert (await forged.login("alice")).code == 429
    roots = browser_at(http_client, base_url, "127.0.5.7")
    assert (await roots.login("root")).code == 302
    assert (await roots.login("alice")).code == 429


@pytest.mark.gen_test(timeout=90)
async def test_a_browser_that_signed_in_before_is_limited_on_its_own(http_client, base_url):
    """Someone holding the owner's browser (its cookie) gets the account's hourly number of
    guesses there, and takes none from the owner's other browsers."""
    owner = browser_at(http_client, base_url, "127.0.6.1")
    assert (await owner.login("alice")).code == 302
    codes = [(await owner.login("alice", "wrong-password")).code for _ in range(11)]
    assert codes == [401] * 10 + [429]
    assert b"in this browser" in (await owner.login("alice")).body
    # The account's own count is untouched: a new browser signs in.
    assert (await browser_at(http_client, base_url, "127.0.6.2").login("alice")).code == 302


def cheap_password_hash(password):
    """An scrypt hash as cheap as scrypt allows, for a user a test fails a hundred times."""
    import base64
    import hashlib
    import secrets as random

    salt = random.token_bytes(16)
    key = hashlib.scrypt(password.encode(), salt=salt, n=2, r=1, p=1, dklen=32)
    return f"scrypt$2$1$1${base64.b64encode(salt).decode()}${base64.b64encode(key).decode()}"


@pytest.fixture
def carol(io_loop, store, ctx):
    from tokensvc.records import User

    io_loop.run_sync(lambda: store.put_user(User("u_carol", "carol", cheap_password_hash("carol-password"))))
    return "carol"


@pytest.mark.gen_test(timeout=90)
@pytest.mark.parametrize("config", [make_config(limits={"failed_logins_per_account": 1000})], ids=["hourly-raised"])
async def test_a_hundred_failures_since_the_last_sign_in_stop_every_browser_the_account_does_not_know(ctx, carol):
    """NIST SP 800-63B §5.2.2: at most 100 consecutive failed attempts on one account. Past them
    a browser that never signed in to it is refused, right password or not, until the owner signs
    in from one that did, an operator sets a new password, or 30 days pass."""
    from tokensvc.oauth import sessions
    from tokensvc.oauth.sessions import KnownBrowser

    async def sign_in(password, address, browser=None):
        try:
            user = await sessions.sign_in(ctx, carol, password, address, browser)
        except TooManyFailures as refused:
            return refused
        return user.username if user else None

    known = KnownBrowser.new().knowing(carol)
    assert await sign_in("carol-password", "127.0.7.1", known) == "carol"
    results = [await sign_in("wrong-password", address) for address in addresses(101, start=300)]
    assert results[:100] == [None] * 100
    stopped = results[100]
    assert isinstance(stopped, TooManyFailures) and stopped.reason == "account_stopped"
    assert 29 * 86400 < stopped.retry_after <= 30 * 86400
    assert isinstance(await sign_in("carol-password", "127.0.8.1"), TooManyFailures)
    # The owner, in a browser that signed in before; then the count starts again.
    assert await sign_in("carol-password", "127.0.8.2", known) == "carol"
    assert await sign_in("carol-password", "127.0.8.3") == "carol"


@pytest.mark.gen_test(timeout=90)
async def test_the_accounts_hour_and_its_stop_end_with_their_windows(ctx, carol, monkeypatch):
    from tokensvc.oauth import sessions

    now = [5000.0]
    ctx.limits.clock = lambda: now[0]
    for address in addresses(10, start=600):
        assert await sessions.sign_in(ctx, carol, "wrong-password", address) is None
    with pytest.raises(TooManyFailures) as refused:
        await sessions.sign_in(ctx, carol, "carol-password", "127.0.9.1")
    assert refused.value.reason == "account" and refused.value.retry_after == 3600
    now[0] += 3600
    assert (await sessions.sign_in(ctx, carol, "carol-password", "127.0.9.1")).username == "carol"


@pytest.mark.gen_test(timeout=90)
async def test_a_new_password_set_by_an_operator_ends_the_accounts_wait(ctx, carol):
    from tokensvc.admin import actions as admin
    from tokensvc.oauth import sessions

    for address in addresses(10, start=700):
        await sessions.sign_in(ctx, carol, "wrong-password", address)
    with pytest.raises(TooManyFailures):
        await sessions.sign_in(ctx, carol, "carol-password", "127.0.9.2")
    await admin.set_password(ctx, carol, None, password_hash=cheap_password_hash("carol-new-password"))
    assert (await sessions.sign_in(ctx, carol, "carol-new-password", "127.0.9.2")).username == "carol"


def test_the_per_account_numbers_are_nists():
    from tokensvc.config import ConfigError

    settings = LimitSettings()
    assert (settings.failed_logins_per_account, settings.account_window_seconds) == (10, 3600)
    assert (settings.consecutive_failed_logins, settings.consecutive_window_seconds) == (100, 30 * 86400)
    make_config(limits={"consecutive_failed_logins": 100})
    with pytest.raises(ConfigError, match=r"^limits.consecutive_failed_logins: at most 100"):
        make_config(limits={"consecutive_failed_logins": 101})


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_forty_concurrent_wrong_passwords_from_twenty_addresses_check_only_the_accounts_worth(
        yielding_ctx, monkeypatch):
    from tokensvc.oauth import sessions

    checked = count_password_checks(monkeypatch)

    async def sign_in(address):
        try:
            return await sessions.sign_in(yielding_ctx, "alice", "wrong-password", address)
        except TooManyFailures:
            return "TooManyFailures"

    results = await asyncio.gather(*(sign_in(address) for address in addresses(20) * 2))
    assert len(checked) == 10 and results.count(None) == 10 and results.count("TooManyFailures") == 30


@pytest.mark.gen_test(timeout=60)
async def test_forty_wrong_passwords_from_twenty_addresses_over_eight_processes_check_only_the_accounts_worth(
        processes, monkeypatch):
    from tokensvc.oauth import sessions

    checked = count_password_checks(monkeypatch)

    async def sign_in(ctx, address):
        try:
            return await sessions.sign_in(ctx, "alice", "wrong-password", address)
        except TooManyFailures:
            return "TooManyFailures"

    results = await asyncio.gather(*(sign_in(processes[n % 8], address)
                                     for n, address in enumerate(addresses(20) * 2)))
    assert len(checked) == 10 and results.count(None) == 10 and results.count("TooManyFailures") == 30
    # The owner, in a browser that signed in before, from any process.
    from tokensvc.oauth.sessions import KnownBrowser

    known = KnownBrowser.new().knowing("alice")
    assert (await sessions.sign_in(processes[3], "alice", "alice-password", "127.0.0.1", known)).username == "alice"


# -- confirmation codes: per code whatever the settings, per address as sign-ins --------------------


async def present(ctx, code, typed, address="127.0.0.1"):
    """A code of ``tokensvc-cli`` presented with the confirmation ``typed``: the scope it gave,
    or the refusal's name and description."""
    from helpers import CLI_REDIRECT, VERIFIER

    from tokensvc.oauth import grants
    from tokensvc.oauth.errors import InvalidGrant

    cli = await ctx.store.get_client("tokensvc-cli")
    try:
        return (await grants.exchange_code(ctx, cli, code, CLI_REDIRECT, VERIFIER, typed, address=address)).scope
    except InvalidGrant as exc:
        return exc.description
    except TooManyFailures:
        return "TooManyFailures"


TOO_MANY = "Too many confirmation codes were presented with this authorization code: it is no longer valid"


def count_code_lookups(monkeypatch, store) -> list[str]:
    looked_up: list[str] = []
    original = store.get_code

    async def get_code(code_hash):
        looked_up.append(code_hash)
        return await original(code_hash)

    monkeypatch.setattr(store, "get_code", get_code)
    return looked_up


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_a_code_is_looked_up_for_three_confirmations_at_most_then_dies(yielding_ctx, monkeypatch):
    """Whoever received the code guesses its confirmation (40 bits) three times at most,
    concurrent guesses and guesses from many addresses included: each presentation is counted
    before the lookup, and past three the code is dead, the right confirmation included."""
    from helpers import another_confirmation, confirmed_code

    from tokensvc.oauth import confirmation

    code, shown = await confirmed_code(yielding_ctx)
    looked_up = count_code_lookups(monkeypatch, yielding_ctx.store)
    wrong = another_confirmation(shown)
    results = await asyncio.gather(*(present(yielding_ctx, code, wrong, f"127.0.1.{n}") for n in range(20)))
    assert results.count(confirmation.NOT_THE_PAGES) == 3 and results.count(TOO_MANY) == 17
    assert len(looked_up) == 3
    assert await present(yielding_ctx, code, shown, "127.0.2.1") == TOO_MANY
    # Another code's presentations are its own.
    code, shown = await confirmed_code(yielding_ctx)
    assert await present(yielding_ctx, code, wrong, "127.0.2.2") == confirmation.NOT_THE_PAGES
    assert await present(yielding_ctx, code, shown, "127.0.2.2") == "admin"


@pytest.mark.gen_test
async def test_a_codes_three_presentations_hold_with_the_limits_turned_off(store):
    from helpers import another_confirmation, confirmed_code

    from tokensvc.bootstrap import make_context, seed

    settings = make_config(limits={"enabled": False})
    await seed(store, settings)
    ctx = make_context(settings, store)
    code, shown = await confirmed_code(ctx)
    for _ in range(3):
        assert await present(ctx, code, another_confirmation(shown)) != TOO_MANY
    assert await present(ctx, code, shown) == TOO_MANY


@pytest.mark.gen_test(timeout=60)
async def test_a_codes_three_presentations_hold_over_eight_processes(processes):
    from helpers import another_confirmation, confirmed_code

    code, shown = await confirmed_code(processes[0])
    wrong = another_confirmation(shown)
    results = await asyncio.gather(*(present(processes[n % 8], code, wrong, f"127.0.3.{n}") for n in range(40)))
    assert results.count(TOO_MANY) == 37
    assert {await present(ctx, code, shown, f"127.0.4.{n}") for n, ctx in enumerate(processes)} == {TOO_MANY}


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_wrong_confirmations_are_limited_per_address_and_right_ones_never_refused(yielding_ctx):
    """A person types the confirmation code, as a password: an address's wrong confirmations
    count, and past the sign-in's limit per address (5 here) a wrong one gets 429. A right one
    never counts and is never refused by that count: made-up confirmations sent from the
    person's address (loopback, a NAT) do not lock them out. Each code's three presentations
    bound guessing whatever the address's count."""
    from helpers import another_confirmation, confirmed_code

    from tokensvc.oauth import confirmation

    for _ in range(6):  # right ones never count
        code, shown = await confirmed_code(yielding_ctx)
        assert await present(yielding_ctx, code, shown, "127.0.0.8") == "admin"
    for _ in range(5):
        code, shown = await confirmed_code(yielding_ctx)
        assert await present(yielding_ctx, code, another_confirmation(shown), "127.0.0.8") == confirmation.NOT_THE_PAGES
    code, shown = await confirmed_code(yielding_ctx)
    assert await present(yielding_ctx, code, another_confirmation(shown), "127.0.0.8") == "TooManyFailures"
    assert await present(yielding_ctx, code, shown, "127.0.0.8") == "admin"  # the person, from the same address
    code, shown = await confirmed_code(yielding_ctx)
    for _ in range(3):
        assert await present(yielding_ctx, code, another_confirmation(shown), "127.0.0.8") == "TooManyFailures"
    assert await present(yielding_ctx, code, shown, "127.0.0.8") == TOO_MANY  # the code's three, spent
    assert yielding_ctx.metrics.registry.get_sample_value("tokensvc_rate_limited_total",
                                                          {"kind": "confirmation"}) == 4


@pytest.mark.gen_test(timeout=60)
async def test_made_up_confirmations_from_the_admins_address_never_block_the_admins_login(http_client, base_url,
                                                                                         ctx):
    """Twenty made-up confirmations from 127.0.0.1, then the admin's real exchange from
    127.0.0.1: answered, not 429."""
    from helpers import CLI_REDIRECT, VERIFIER, another_confirmation, confirmed_code

    def exchange(code, typed):
        return post_form(http_client, base_url + "/oauth/token", {
            "grant_type": "authorization_code", "code": code, "redirect_uri": CLI_REDIRECT,
            "client_id": "tokensvc-cli", "code_verifier": VERIFIER, "confirmation_code": typed})

    codes = []
    for _ in range(20):
        code, shown = await confirmed_code(ctx)
        codes.append((await exchange(code, another_confirmation(shown))).code)
    assert codes[:5] == [400] * 5 and set(codes[5:]) == {429}
    code, shown = await confirmed_code(ctx)
    answer = await exchange(code, shown)
    assert answer.code == 200 and b"access_token" in answer.body
