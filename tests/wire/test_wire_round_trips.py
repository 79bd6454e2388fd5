"""The store round trips of each hot request, counted where the replica set receives them.

Many users' tokens are used in rotation (a deployment's steady state: thousands of users, each
seen less than once a second), through the service's HTTP routes on the MongoDB store, and every
command the three members receive is counted, whatever its kind. A request that adds a round
trip fails its test: ``ROUND_TRIPS`` is what each costs now, and lowering it is the only change
it takes without a reason given in review.

What this process keeps of the store is answered for at most a second after it was read
(docs/security.md, "What a process keeps"): here that second does not run out, so that the
count is each request's own, whatever the machine's speed; the one read a second per client that
it costs a process is not a request's. The bound has tests of its own (test_wire_caches.py).
"""

from __future__ import annotations

import pytest
from helpers import (
    CHALLENGE,
    PASSWORD_HASHES,
    PAST_CONCURRENT,
    VERIFIER,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    basic,
    json_of,
    post_form,
)
from primary import NOT_A_REQUEST, ReplicaSet

from tokensvc.config import StorageSettings
from tokensvc.oauth import authorization
from tokensvc.records import User

pytestmark = pytest.mark.gen_test(timeout=120)

USERS = 12  # in rotation: more than any per-user cache keeps warm between two of a user's requests
ROUNDS = 2

# Commands a request sends, in the steady state. The goals of docs/performance.md: introspection
# 1, /v1/me 1, a client's public record at most 1, refresh at most 2, code exchange at most 3,
# RFC 7009 revocation at most 2.
EXCHANGE = 3
ROUND_TRIPS = {
    "introspection": 1,  # the family, with its grant, client and user (0.10.0: 6)
    "me": 1,  # the same read (0.10.0: 3)
    "client": 1,  # (0.10.0: 1)
    "refresh": 2,  # that read, and the rotation (0.10.0: 6)
    "exchange": EXCHANGE,  # the code consumed as presented, the grant with its user, the family (0.10.0: 9)
    "revoke": 2,  # that read, and the revocation (0.10.0: 5)
}

MEMBERS = 3  # of the replica set (conftest.py's primary), as a deployment runs: every command any receives is counted


@pytest.fixture
def wire_budget_ms():
    return StorageSettings().timeout_ms  # answers, not how soon: a busy machine does not run this out


@pytest.fixture
def config(wire_budget_ms):
    from helpers import make_config

    return make_config(storage={"backend": "mongodb", "mongodb_uri": "mongodb://db1,db2,db3/?replicaSet=rs0",
                                "timeout_ms": wire_budget_ms})


@pytest.fixture
def store(wire_store):
    wire_store.registry.recent.clock = lambda: 0.0  # what it keeps stays within its bound throughout
    return wire_store


@pytest.fixture(autouse=True)
def within_the_bound(ctx):
    """What the limits keep of the failure counts stays within its bound throughout, too."""
    ctx.limits.clock = lambda: 0.0


def received(primary: ReplicaSet) -> list[tuple[str, dict]]:
    with primary.lock:
        return [(name, doc) for name, doc in primary.commands if name not in NOT_A_REQUEST]


def describe(commands: list[tuple[str, dict]]) -> list[str]:
    return [f"{name} {doc.get(name)}" for name, doc in commands]


async def counted(primary: ReplicaSet, requests) -> tuple[float, list[str]]:
    """The commands per request of ``requests`` (coroutine functions, each one request that
    must succeed), and what the first of them sent."""
    total, first = 0, None
    for request in requests:
        primary.forget()
        await request()
        commands = received(primary)
        first = first if first is not None else describe(commands)
        total += len(commands)
    return total / len(requests), first or []


@pytest.fixture
def users(app, ctx, io_loop):
    async def made() -> list[User]:
        made = [User(f"u_load{index}", f"load{index}", PASSWORD_HASHES["alice"]) for index in range(USERS)]
        for user in made:
            await ctx.store.put_user(user)
        return made

    return io_loop.run_sync(made)


async def code_for(ctx, user: User, scope: str = "read write") -> str:
    args = {"response_type": "code", "client_id": "webapp", "redirect_uri": WEBAPP_REDIRECT, "state": "s",
            "code_challenge": CHALLENGE, "code_challenge_method": "S256", "scope": scope}
    request = await authorization.validate(ctx, {name: [value] for name, value in args.items()})
    subject, _ = await authorization.resolve_subject(ctx, request, user)
    return (await authorization.issue_code(ctx, request, subject)).split("code=")[1].split("&")[0]


async def tokens_for(ctx, http_client, base_url, users: list[User]) -> list[dict]:
    issued = []
    for user in users:
        response = await post_form(http_client, base_url + "/oauth/token", {
            "grant_type": "authorization_code", "code": await code_for(ctx, user), "redirect_uri": WEBAPP_REDIRECT,
            "code_verifier": VERIFIER}, headers={"Authorization": basic("webapp", WEBAPP_SECRET)})
        assert response.code == 200, response.body
        issued.append(json_of(response))
    # Past the grace of a lost reply and the window of concurrent presentations: the steady
    # state, where a pair's use writes nothing.
    ctx.clock.advance(ctx.tokens.refresh_grace_seconds + PAST_CONCURRENT)
    return issued


WEBAPP = {"Authorization": basic("webapp", WEBAPP_SECRET)}


async def used_once(http_client, base_url, issued: list[dict]) -> None:
    """Each access token presented once: its pair's first use is recorded (a write, once)."""
    for tokens in issued:
        response = await http_client.fetch(base_url + "/v1/me", headers={
            "Authorization": f"Bearer {tokens['access_token']}"}, raise_error=False)
        assert response.code == 200, response.body


async def test_introspection_and_the_api_cost_one_round_trip(http_client, base_url, ctx, primary, users):
    issued = await tokens_for(ctx, http_client, base_url, users)
    await used_once(http_client, base_url, issued)

    def introspect(token: str):
        async def request() -> None:
            response = await post_form(http_client, base_url + "/oauth/token/introspect", {"token": token},
                                       headers=WEBAPP)
            assert response.code == 200 and json_of(response)["active"] is True, response.body
        return request

    def me(token: str):
        async def request() -> None:
            response = await http_client.fetch(base_url + "/v1/me", headers={"Authorization": f"Bearer {token}"},
                                               raise_error=False)
            assert response.code == 200, response.body
        return request

    rotation = [tokens["access_token"] for _ in range(ROUNDS) for tokens in issued]
    per_request, sent = await counted(primary, [introspect(token) for token in rotation])
    assert per_request == ROUND_TRIPS["introspection"], sent
    per_request, sent = await counted(primary, [me(token) for token in rotation])
    assert per_request == ROUND_TRIPS["me"], sent


async def test_a_clients_public_record_costs_one_round_trip(http_client, base_url, primary, app):
    async def request() -> None:
        response = await http_client.fetch(base_url + "/oauth/clients/skyplanner", raise_error=False)
        assert response.code == 200, response.body

    per_request, sent = await counted(primary, [request] * 4)
    assert per_request == ROUND_TRIPS["client"], sent


async def test_a_refresh_costs_two_round_trips(http_client, base_url, ctx, primary, users):
    issued = await tokens_for(ctx, http_client, base_url, users)

    def refresh(index: int):
        async def request() -> None:
            response = await post_form(http_client, base_url + "/oauth/token/refresh",
                                       {"grant_type": "refresh_token", "refresh_token": issued[index]["refresh_token"]},
                                       headers=WEBAPP)
            assert response.code == 200, response.body
            issued[index] = json_of(response)
        return request

    per_request, sent = await counted(primary, [refresh(index) for _ in range(ROUNDS) for index in range(USERS)])
    assert per_request == ROUND_TRIPS["refresh"], sent


async def test_a_code_exchange_costs_three_round_trips(http_client, base_url, ctx, primary, users):
    codes = [await code_for(ctx, user) for user in users]

    def exchange(code: str):
        async def request() -> None:
            response = await post_form(http_client, base_url + "/oauth/token", {
                "grant_type": "authorization_code", "code": code, "redirect_uri": WEBAPP_REDIRECT,
                "code_verifier": VERIFIER}, headers=WEBAPP)
            assert response.code == 200, response.body
        return request

    await exchange(codes.pop())()  # the client's record and its failure counts read once: this process keeps them
    per_request, sent = await counted(primary, [exchange(code) for code in codes])
    assert per_request == ROUND_TRIPS["exchange"], sent


@pytest.mark.parametrize("kind", ["access_token", "refresh_token"])
async def test_a_revocation_costs_two_round_trips(http_client, base_url, ctx, primary, users, kind):
    issued = await tokens_for(ctx, http_client, base_url, users)
    await used_once(http_client, base_url, issued)

    def revoke(token: str):
        async def request() -> None:
            response = await post_form(http_client, base_url + "/oauth/token/revoke", {"token": token},
                                       headers=WEBAPP)
            assert response.code == 200, response.body
        return request

    per_request, sent = await counted(primary, [revoke(tokens[kind]) for tokens in issued])
    assert per_request == ROUND_TRIPS["revoke"], sent


async def test_a_sign_in_with_an_unknown_username_looks_it_up_on_its_index(browser, primary, app):
    page = await browser.fetch("/login?next=/")
    assert page.code == 200
    primary.forget()
    response = await browser.fetch("/login", "POST", {"username": "nobody-here", "password": "a-wrong-password",
                                                      "next": "/", "_xsrf": browser.cookies["_xsrf"]})
    assert response.code == 401, response.body
    lookups = [doc for name, doc in received(primary) if doc.get(name) == "users"]
    # One read of the users, by username under the caseless collation of its index.
    assert [(doc["filter"], doc.get("collation", {}).get("strength")) for doc in lookups] == [
        ({"username": {"$in": ["nobody-here"]}}, 2)], describe(received(primary))
