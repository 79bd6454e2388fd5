"""Token families at their edges, through the protocol core on every backend (the mongodb one
through the yielding stand-in, so concurrent requests interleave as over a network): replays
by other clients, lost replies, two tabs, a thief within the grace period, dead tokens, how
much a family stores, and what a revocation announces."""

from __future__ import annotations

import asyncio
import logging

import pytest
from backends import BACKENDS
from helpers import CHALLENGE, SKY_REDIRECT, VERIFIER, WEBAPP_REDIRECT, make_config, new_verifier
from test_protocol import args

from tokensvc import config as config_module
from tokensvc.bootstrap import make_context, seed
from tokensvc.oauth import authorization, grants, introspection, principal, revocation, sessions
from tokensvc.oauth.errors import InvalidGrant
from tokensvc.records import Subject
from tokensvc.storage.base import FAMILY, GRANT, SESSION, Revocation, StorageError
from tokensvc.storage.memory import MemoryStore

pytestmark = [pytest.mark.gen_test, pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)]


@pytest.fixture
def seeded(backend_store, io_loop):
    io_loop.run_sync(lambda: seed(backend_store, make_config()))
    return backend_store


def context(store, clock, grace=0, **settings):
    return make_context(make_config(tokens={"refresh_grace_seconds": grace}, **settings), store,
                                      clock=clock)


async def code_for(ctx, client_id="webapp", redirect_uri=WEBAPP_REDIRECT, challenge=CHALLENGE, username="alice"):
    request = await authorization.validate(ctx, args(client_id, redirect_uri, code_challenge=challenge))
    user = await ctx.store.get_user_by_username(username)
    location = await authorization.issue_code(ctx, request, Subject(user_id=user.user_id))
    return location.split("code=")[1].split("&")[0]


async def exchange(ctx, code, client_id="webapp", redirect_uri=WEBAPP_REDIRECT, verifier=VERIFIER):
    return await grants.exchange_code(ctx, await ctx.store.get_client(client_id), code, redirect_uri, verifier)


async def refresh(ctx, token, client_id="webapp"):
    return await grants.refresh(ctx, await ctx.store.get_client(client_id), token)


async def active(ctx, token):
    return (await introspection.introspect(ctx, token))["active"]


async def alive(ctx, tokens):
    return [await active(ctx, tokens.access_token), await active(ctx, tokens.refresh_token)]


def counted(ctx, name):
    return ctx.metrics.registry.get_sample_value(name) or 0


# -- codes ------------------------------------------------------------------------------------


async def test_a_redeemed_code_presented_by_anyone_else_revokes_nothing(seeded, clock):
    ctx = context(seeded, clock)
    code = await code_for(ctx)
    tokens = await exchange(ctx, code)
    wrong, _ = new_verifier()
    for presenter, redirect_uri, verifier, why in (
            ("skyplanner", WEBAPP_REDIRECT, VERIFIER, "another client"),  # public: no secret at all
            ("partner", WEBAPP_REDIRECT, VERIFIER, "another client"),
            ("webapp", WEBAPP_REDIRECT, wrong, "PKCE"),
            ("webapp", WEBAPP_REDIRECT, None, "PKCE"),
            ("webapp", SKY_REDIRECT, VERIFIER, "redirect_uri")):
        with pytest.raises(InvalidGrant, match=why):
            await exchange(ctx, code, presenter, redirect_uri, verifier)
    assert await alive(ctx, tokens) == [True, True]
    assert counted(ctx, "tokensvc_code_reuse_total") == 0


async def test_a_replay_by_its_own_client_revokes_that_codes_family_only(seeded, clock, caplog):
    ctx = context(seeded, clock)
    code = await code_for(ctx)
    first = await exchange(ctx, code)
    second = await exchange(ctx, await code_for(ctx))  # another sign-in: another family, the same grant
    with caplog.at_level(logging.INFO, "tokensvc.audit"), pytest.raises(InvalidGrant, match="already used"):
        await exchange(ctx, code)
    assert await alive(ctx, first) == [False, False]
    assert await alive(ctx, second) == [True, True]
    grant = await seeded.find_grant("webapp", (await principal.from_bearer(ctx, second.access_token)).subject)
    assert grant.revoked_at is None
    assert counted(ctx, "tokensvc_code_reuse_total") == 1
    assert any(getattr(r, "audit", {}).get("event") == "code_reuse"
               and r.audit["outcome"] == "family_revoked" for r in caplog.records)


async def test_a_lost_exchange_reply_is_retried_and_only_the_lost_pair_dies(seeded, clock):
    ctx = context(seeded, clock, grace=30)
    code = await code_for(ctx)
    earlier = await exchange(ctx, await code_for(ctx))
    lost = await exchange(ctx, code)  # applied; the reply never reached the client
    clock.advance(20)
    retried = await exchange(ctx, code)  # the client retries with the same code and verifier
    assert await alive(ctx, lost) == [False, False]
    assert await alive(ctx, retried) == [True, True]
    assert await alive(ctx, earlier) == [True, True]
    assert (await refresh(ctx, retried.refresh_token)).access_token
    assert counted(ctx, "tokensvc_code_reuse_total") == 0


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
async def test_an_exchange_whose_store_write_fails_can_be_retried(seeded, clock, monkeypatch, applied):
    """The family's write fails (503), after the store applied it or before: the retry gets a
    working pair, and nothing else is revoked."""
    ctx = context(seeded, clock, grace=30)
    code = await code_for(ctx)
    create = seeded.create_family

    async def reply_lost(family):
        if applied:
            await create(family)
        raise StorageError("the reply was lost")

    monkeypatch.setattr(seeded, "create_family", reply_lost)
    with pytest.raises(StorageError):
        await exchange(ctx, code)
    monkeypatch.undo()
    retried = await exchange(ctx, code)
    assert await alive(ctx, retried) == [True, True]
    assert (await refresh(ctx, retried.refresh_token)).access_token


@pytest.mark.parametrize("how", ["no-grace", "pair-used", "after-grace", "refreshed"])
async def test_a_repeated_exchange_is_a_replay_unless_it_retries_an_unused_pair_within_the_grace(
        seeded, clock, how):
    ctx = context(seeded, clock, grace=0 if how == "no-grace" else 30)
    code = await code_for(ctx)
    first = await exchange(ctx, code)
    if how == "pair-used":
        assert await principal.from_bearer(ctx, first.access_token) is not None
    elif how == "after-grace":
        clock.advance(31)
    elif how == "refreshed":
        first = await refresh(ctx, first.refresh_token)
    with pytest.raises(InvalidGrant, match="already used"):
        await exchange(ctx, code)
    assert await alive(ctx, first) == [False, False]
    assert counted(ctx, "tokensvc_code_reuse_total") == 1


# -- refresh --------------------------------------------------------------------------------


async def test_two_tabs_refreshing_at_once_leave_one_live_pair_and_the_other_is_reuse(seeded, clock):
    ctx = context(seeded, clock, grace=30)
    first = await exchange(ctx, await code_for(ctx))
    tabs = await asyncio.gather(refresh(ctx, first.refresh_token), refresh(ctx, first.refresh_token))
    states = [await alive(ctx, tab) for tab in tabs]
    assert sorted(states) == [[False, False], [True, True]]  # the retry replaced the pair it raced
    dead = tabs[states.index([False, False])]
    live = tabs[states.index([True, True])]
    # The tab left holding the replaced pair presents it: that is reuse, and the family goes.
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, dead.refresh_token)
    assert await alive(ctx, live) == [False, False]
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 1


async def test_two_refreshes_at_once_without_grace_are_reuse(seeded, clock):
    ctx = context(seeded, clock)
    first = await exchange(ctx, await code_for(ctx))
    results = await asyncio.gather(refresh(ctx, first.refresh_token), refresh(ctx, first.refresh_token),
                                   return_exceptions=True)
    assert sorted(type(result).__name__ for result in results) == ["InvalidGrant", "TokenResponse"]
    winner = next(result for result in results if not isinstance(result, Exception))
    assert await alive(ctx, winner) == [False, False]
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 1


async def test_a_thief_presenting_a_rotated_out_token_after_its_successor_was_used(seeded, clock, caplog):
    ctx = context(seeded, clock, grace=30)
    stolen = await exchange(ctx, await code_for(ctx))
    mine = await refresh(ctx, stolen.refresh_token)
    assert await principal.from_bearer(ctx, mine.access_token) is not None  # the client uses its new pair
    clock.advance(5)
    with caplog.at_level(logging.INFO, "tokensvc.audit"), pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, stolen.refresh_token)  # within the grace, but the successor was used
    assert await alive(ctx, mine) == [False, False]
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 1
    assert any(getattr(r, "audit", {}).get("event") == "refresh_reuse" for r in caplog.records)


async def test_a_thief_who_retries_first_is_caught_when_the_client_comes_back(seeded, clock):
    """Within the grace, before the client used its new pair, a thief's presentation looks
    like a lost reply's retry and gets a pair; the client's next refresh is then reuse, and
    the family (the thief's pair with it) is revoked."""
    ctx = context(seeded, clock, grace=30)
    stolen = await exchange(ctx, await code_for(ctx))
    mine = await refresh(ctx, stolen.refresh_token)
    theirs = await refresh(ctx, stolen.refresh_token)
    assert await alive(ctx, theirs) == [True, True]
    assert await principal.from_bearer(ctx, mine.access_token) is None  # replaced
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, mine.refresh_token)
    assert await alive(ctx, theirs) == [False, False]


async def test_a_retry_of_an_older_token_or_after_the_grace_is_reuse(seeded, clock):
    ctx = context(seeded, clock, grace=30)
    first = await exchange(ctx, await code_for(ctx))
    second = await refresh(ctx, first.refresh_token)
    third = await refresh(ctx, second.refresh_token)
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, first.refresh_token)  # not the one rotated out last
    assert await alive(ctx, third) == [False, False]
    fresh = await exchange(ctx, await code_for(ctx))
    newer = await refresh(ctx, fresh.refresh_token)
    clock.advance(31)
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, fresh.refresh_token)
    assert await alive(ctx, newer) == [False, False]


async def test_the_mongodb_default_grace_covers_an_honest_retry_through_a_long_incident(seeded, clock, monkeypatch):
    config = make_config(storage={"backend": "mongodb"})
    timeout_s = config.storage.timeout_ms / 1000
    # The first attempt may take the whole budget, the client waits Retry-After, and the retry
    # may take the budget again before it reaches the store.
    budget = 2 * timeout_s + config_module.STORE_RETRY_AFTER_SECONDS
    assert config.tokens.refresh_grace_seconds >= budget
    ctx = make_context(config, seeded, clock=clock)
    first = await exchange(ctx, await code_for(ctx))
    rotate = seeded.rotate_family

    async def applied_but_reply_lost(*arguments):
        await rotate(*arguments)
        raise StorageError("timed out waiting for the reply")

    monkeypatch.setattr(seeded, "rotate_family", applied_but_reply_lost)
    with pytest.raises(StorageError):
        await refresh(ctx, first.refresh_token)
    monkeypatch.undo()
    clock.advance(budget)
    retried = await refresh(ctx, first.refresh_token)
    assert await alive(ctx, retried) == [True, True]
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 0


# -- dead tokens ----------------------------------------------------------------------------------


async def test_a_token_not_in_force_revokes_nothing(seeded, clock):
    ctx = context(seeded, clock)
    webapp = await seeded.get_client("webapp")
    first = await exchange(ctx, await code_for(ctx))
    second = await refresh(ctx, first.refresh_token)  # first's pair: rotated out and replaced
    for dead in (first.refresh_token, first.access_token):
        assert await revocation.revoke_token(ctx, dead, None) is False  # /oauth/sign-out?token=
        assert await revocation.revoke_grant_of(ctx, dead) is False  # /oauth/revoke
    assert await revocation.revoke_token(ctx, first.access_token, webapp) is False  # replaced: unknown
    assert await alive(ctx, second) == [True, True]

    # The user removes the app and connects it again: the old tokens are an earlier generation.
    alice = Subject(user_id=(await seeded.get_user_by_username("alice")).user_id)
    assert await revocation.revoke_connected_app(ctx, alice, "webapp")
    reconnected = await exchange(ctx, await code_for(ctx))
    for old in (second.access_token, second.refresh_token):
        assert await revocation.revoke_grant_of(ctx, old) is False
        assert await revocation.revoke_token(ctx, old, webapp) is False
    assert await alive(ctx, reconnected) == [True, True]

    # Expired: nothing either.
    clock.advance(ctx.tokens.access_ttl + 1)
    assert await revocation.revoke_grant_of(ctx, reconnected.access_token) is False
    assert await active(ctx, reconnected.refresh_token)
    assert await revocation.revoke_grant_of(ctx, reconnected.refresh_token) is True
    assert await active(ctx, reconnected.refresh_token) is False


async def test_a_client_revoking_its_rotated_out_refresh_token_ends_the_family(seeded, clock):
    """RFC 7009 §2.1 at /oauth/token/revoke: the client ends what it started, even with a
    token a racing refresh of its own has just rotated out."""
    ctx = context(seeded, clock)
    webapp = await seeded.get_client("webapp")
    first = await exchange(ctx, await code_for(ctx))
    second = await refresh(ctx, first.refresh_token)
    other = await exchange(ctx, await code_for(ctx))
    assert await revocation.revoke_token(ctx, first.refresh_token, await seeded.get_client("partner")) is False
    assert await alive(ctx, second) == [True, True]
    assert await revocation.revoke_token(ctx, first.refresh_token, webapp) is True
    assert await alive(ctx, second) == [False, False]
    assert await alive(ctx, other) == [True, True]
    assert await revocation.revoke_token(ctx, first.refresh_token, webapp) is False  # already
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 0  # a revocation, not reuse


async def test_a_client_revokes_only_its_own_tokens(seeded, clock):
    ctx = context(seeded, clock)
    tokens = await exchange(ctx, await code_for(ctx))
    for other in ("skyplanner", "partner"):
        client = await seeded.get_client(other)
        for token in (tokens.access_token, tokens.refresh_token):
            assert await revocation.revoke_token(ctx, token, client) is False
    assert await alive(ctx, tokens) == [True, True]


# -- bounded families -----------------------------------------------------------------------------


class Counting:
    """The store, counting the calls a revocation makes."""

    def __init__(self, store):
        self.store, self.calls = store, []

    def __getattr__(self, name):
        method = getattr(self.store, name)

        async def call(*arguments, **kwargs):
            self.calls.append(name)
            return await method(*arguments, **kwargs)

        return call


async def family_count(store):
    if isinstance(store, MemoryStore):
        return len(store._families)
    return await store.families.count_documents({})


async def test_a_family_stays_one_record_however_often_it_refreshes(seeded, clock):
    """100,000 refreshes (on MongoDB's stand-in, 2,000): one record, the first token still
    recognised as reuse, and revoking the grant costs what it costs after one refresh."""
    ctx = context(seeded, clock)
    rounds = 100_000 if isinstance(seeded, MemoryStore) else 2000
    logging.getLogger("tokensvc.audit").disabled = True  # 100,000 audit lines are not the subject here
    try:
        costs = []
        for times in (1, rounds):
            tokens = await exchange(ctx, await code_for(ctx))
            first = tokens.refresh_token
            for _ in range(times):
                tokens = await refresh(ctx, tokens.refresh_token)
            assert await family_count(seeded) == len(costs) + 1
            grant_id = (await principal.from_bearer(ctx, tokens.access_token)).token.grant_id
            counting = Counting(seeded)
            ctx.store = counting
            revoked = await revocation.revoke_grant(ctx, grant_id, "test")
            ctx.store = seeded
            costs.append((counting.calls, revoked))
            assert await alive(ctx, tokens) == [False, False]
            with pytest.raises(InvalidGrant):  # the first token of the family is still known
                await refresh(ctx, first)
            await seed(seeded, make_config())
            await code_for(ctx)  # consent again, for the next family
        assert costs[0] == costs[1] == (["mark_grant_revoked", "revoke_grant_families"], 1)
    finally:
        logging.getLogger("tokensvc.audit").disabled = False


async def test_every_rotated_out_token_of_a_family_is_reuse(seeded, clock):
    ctx = context(seeded, clock)
    tokens = await exchange(ctx, await code_for(ctx))
    history = [tokens.refresh_token]
    for _ in range(20):
        tokens = await refresh(ctx, tokens.refresh_token)
        history.append(tokens.refresh_token)
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, history[7])
    assert await alive(ctx, tokens) == [False, False]
    with pytest.raises(InvalidGrant, match="revoked"):
        await refresh(ctx, history[-1])
    # A token that only looks like one of the family's is no more than unknown elsewhere.
    with pytest.raises(InvalidGrant, match="Unknown"):
        await refresh(ctx, "x" * 22 + "." + "y" * 43)


# -- what a revocation announces ---------------------------------------------------------------


async def test_a_revocation_announces_what_it_changed_and_nothing_else(seeded, clock):
    ctx = context(seeded, clock)
    a = await exchange(ctx, await code_for(ctx))
    b = await exchange(ctx, await code_for(ctx))
    sky_code = await code_for(ctx, "skyplanner", SKY_REDIRECT)
    c = await exchange(ctx, sky_code, "skyplanner", SKY_REDIRECT)
    heard = []
    keys = {}
    for name, tokens in (("a", a), ("b", b), ("c", c)):
        token = (await principal.from_bearer(ctx, tokens.access_token)).token
        keys[name] = [Revocation(FAMILY, token.family_id), Revocation(GRANT, token.grant_id)]
        for key in keys[name]:
            ctx.events.subscribe([key], lambda name=name, kind=key.kind: heard.append((name, kind)))

    assert await revocation.revoke_token(ctx, a.access_token, None)
    assert heard == [("a", FAMILY)]
    heard.clear()
    for nothing in (a.access_token, "unknown", a.refresh_token + "x"):  # changes nothing: silence
        await revocation.revoke_token(ctx, nothing, None)
    assert heard == []
    alice = Subject(user_id=(await seeded.get_user_by_username("alice")).user_id)
    assert await revocation.revoke_connected_app(ctx, alice, "skyplanner")
    assert heard == [("c", GRANT)]
    heard.clear()
    assert not await revocation.revoke_connected_app(ctx, alice, "skyplanner")
    assert heard == []

    user = await seeded.get_user_by_username("alice")
    session_id = await sessions.start(ctx, user)
    from tokensvc.oauth import hashing

    ctx.events.subscribe([Revocation(SESSION, hashing.digest(session_id))], lambda: heard.append(("s", SESSION)))
    assert not await sessions.end(ctx, "no-such-session")
    assert heard == []
    assert await sessions.end(ctx, session_id)
    assert heard == [("s", SESSION)]
