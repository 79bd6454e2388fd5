"""Token families at their edges, through the protocol core on every backend (the mongodb one
through the yielding stand-in, so concurrent requests interleave as over a network): replays
by other clients, lost replies, two tabs, a thief within the grace period, dead tokens, how
much a family stores, and what a revocation announces."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest
from backends import BACKENDS
from helpers import CHALLENGE, SKY_REDIRECT, VERIFIER, WEBAPP_REDIRECT, make_config, new_verifier
from test_protocol import args

from tokensvc import config as config_module
from tokensvc.bootstrap import make_context, seed
from tokensvc.oauth import authorization, grants, introspection, principal, revocation, sessions, successors, tokens
from tokensvc.oauth.errors import InvalidGrant, InvalidScope
from tokensvc.records import Subject
from tokensvc.storage.base import FAMILY, GRANT, SESSION, Revocation, StorageError
from tokensvc.storage.memory import MemoryStore

pytestmark = [pytest.mark.gen_test, pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)]


@pytest.fixture
def seeded(backend_store, io_loop):
    io_loop.run_sync(lambda: seed(backend_store, make_config()))
    return backend_store


def context(store, clock, grace=0, **settings):
    settings.setdefault("tokens", {"refresh_grace_seconds": grace})
    return make_context(make_config(**settings), store, clock=clock)


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


def counted(ctx, name, **labels):
    return ctx.metrics.registry.get_sample_value(name, labels or None) or 0


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


@pytest.mark.parametrize("grace", [0, 30])
async def test_a_lost_exchange_reply_costs_one_more_authorization_and_nothing_else(seeded, clock, grace):
    """Codes have no grace: the retry of an exchange whose reply was lost is a replay (RFC
    6749 §4.1.2). It revokes that code's family, nothing else, and a new authorization works."""
    ctx = context(seeded, clock, grace=grace)
    code = await code_for(ctx)
    earlier = await exchange(ctx, await code_for(ctx))
    lost = await exchange(ctx, code)  # applied; the reply never reached the client
    clock.advance(1)
    with pytest.raises(InvalidGrant, match="already used"):
        await exchange(ctx, code)  # the client retries with the same code and verifier
    assert await alive(ctx, lost) == [False, False]
    assert await alive(ctx, earlier) == [True, True]
    again = await exchange(ctx, await code_for(ctx))  # one more authorization
    assert await alive(ctx, again) == [True, True]
    assert counted(ctx, "tokensvc_code_reuse_total") == 1


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
async def test_an_exchange_whose_family_write_fails(seeded, clock, monkeypatch, applied):
    """The family's write fails (503). Before the store applied it, the retry writes it and
    gets a working pair; after (a lost reply), the retry is a replay and the user authorizes
    once more; nothing else is revoked either way."""
    ctx = context(seeded, clock, grace=30)
    code = await code_for(ctx)
    earlier = await exchange(ctx, await code_for(ctx))
    create = seeded.create_family

    async def reply_lost(family):
        if applied:
            await create(family)
        raise StorageError("the reply was lost")

    monkeypatch.setattr(seeded, "create_family", reply_lost)
    with pytest.raises(StorageError):
        await exchange(ctx, code)
    monkeypatch.undo()
    if applied:
        with pytest.raises(InvalidGrant, match="already used"):
            await exchange(ctx, code)
        retried = await exchange(ctx, await code_for(ctx))
    else:
        retried = await exchange(ctx, code)
    assert await alive(ctx, retried) == [True, True]
    assert (await refresh(ctx, retried.refresh_token)).access_token
    assert await alive(ctx, earlier) == [True, True]


@pytest.mark.parametrize("grace", [0, 30])
@pytest.mark.parametrize("how", ["at-once", "pair-used", "after-grace", "refreshed"])
async def test_a_repeated_exchange_is_always_a_replay(seeded, clock, how, grace):
    ctx = context(seeded, clock, grace=grace)
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


@pytest.mark.parametrize("grace", [0, 30])
@pytest.mark.parametrize("presentations", [2, 5, 50])
async def test_of_concurrent_exchanges_of_a_code_exactly_one_is_exchanged(seeded, clock, grace, presentations):
    """Over one context or three (three processes sharing the store; memory has one), every
    presentation but one is an error, and what the code gave is revoked (RFC 6749 §4.1.2)."""
    contexts = [context(seeded, clock, grace=grace) for _ in range(1 if isinstance(seeded, MemoryStore) else 3)]
    code = await code_for(contexts[0])
    results = await asyncio.gather(*(exchange(contexts[index % len(contexts)], code)
                                     for index in range(presentations)), return_exceptions=True)
    issued = [result for result in results if isinstance(result, grants.TokenResponse)]
    refused = [result for result in results if isinstance(result, InvalidGrant)]
    assert (len(issued), len(refused)) == (1, presentations - 1), results
    assert await alive(contexts[0], issued[0]) == [False, False]
    assert sum(counted(ctx, "tokensvc_code_reuse_total") for ctx in contexts) == presentations - 1


# -- refresh --------------------------------------------------------------------------------


@pytest.mark.parametrize("grace", [0, 30])
@pytest.mark.parametrize("presentations", [2, 5, 50])
async def test_concurrent_refreshes_of_one_token_all_get_the_same_pair(seeded, clock, grace, presentations):
    """Two tabs, an app and its retry, a proxy's duplicate; over one context or three (three
    processes sharing the store): every presentation gets the one successor, the family lives
    on, and nothing is reuse."""
    contexts = [context(seeded, clock, grace=grace) for _ in range(1 if isinstance(seeded, MemoryStore) else 3)]
    first = await exchange(contexts[0], await code_for(contexts[0]))
    results = await asyncio.gather(*(refresh(contexts[index % len(contexts)], first.refresh_token)
                                     for index in range(presentations)))
    assert len({(result.access_token, result.refresh_token, result.scope) for result in results}) == 1
    assert await alive(contexts[0], results[0]) == [True, True]
    family, _ = await seeded.get_family(tokens.parse_refresh(first.refresh_token)[0])
    assert family.rotations == 1 and family.revoked_at is None
    assert sum(counted(ctx, "tokensvc_refresh_reuse_total") for ctx in contexts) == 0
    assert sum(counted(ctx, "tokensvc_tokens_issued_total", grant="refresh_token") for ctx in contexts) == 1
    assert (await refresh(contexts[-1], results[0].refresh_token)).access_token


async def test_an_access_token_has_a_routing_part_only_once_no_previous_release_may_serve(seeded, clock, monkeypatch):
    """While a release that recomputes successors without a routing part, and whose resource
    library refuses the new shape, may serve (the store binds no audience yet), neither an
    exchange's nor a rotation's access token has one, and a presentation within the window
    recomputes it so; once none may, both have one."""
    ctx = context(seeded, clock)
    monkeypatch.setattr(type(seeded), "binds_audiences", lambda self: _returning(False))
    first = await exchange(ctx, await code_for(ctx))
    assert len(first.access_token) == 43
    mine = await refresh(ctx, first.refresh_token)
    assert len(mine.access_token) == 43
    again = await refresh(ctx, first.refresh_token)  # within the window: the pair already issued
    assert (again.access_token, again.refresh_token) == (mine.access_token, mine.refresh_token)
    assert await alive(ctx, mine) == [True, True]
    monkeypatch.undo()
    clock.advance(60)
    routed = await refresh(ctx, mine.refresh_token)
    assert len(routed.access_token) == 86
    assert (await refresh(ctx, mine.refresh_token)).access_token == routed.access_token
    assert await alive(ctx, routed) == [True, True]
    assert len((await exchange(ctx, await code_for(ctx))).access_token) == 86


async def _returning(value):
    return value


@pytest.mark.parametrize("grace", [0, 30])
async def test_presentations_within_the_window_get_the_pair_already_issued(seeded, clock, grace):
    ctx = context(seeded, clock, grace=grace)
    first = await exchange(ctx, await code_for(ctx))
    mine = await refresh(ctx, first.refresh_token)
    clock.advance(successors.CONCURRENT_SECONDS)
    again = await refresh(ctx, first.refresh_token)  # an app's retry, a second tab
    assert (again.access_token, again.refresh_token) == (mine.access_token, mine.refresh_token)
    assert again.expires_in == ctx.tokens.access_ttl - successors.CONCURRENT_SECONDS  # the same pair's lifetime
    assert await alive(ctx, mine) == [True, True]
    # Presented again after its successor was used, within the window: reuse.
    assert await principal.from_bearer(ctx, mine.access_token) is not None
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, first.refresh_token)
    assert await alive(ctx, mine) == [False, False]


async def test_outside_the_window_the_grace_rules_stand(seeded, clock):
    """Past the window, a retry while the successor is unused gets a new pair and the unused
    one dies; presentations that arrive together then get that new pair."""
    ctx = context(seeded, clock, grace=30)
    first = await exchange(ctx, await code_for(ctx))
    lost = await refresh(ctx, first.refresh_token)
    clock.advance(successors.CONCURRENT_SECONDS + 1)
    retries = await asyncio.gather(*(refresh(ctx, first.refresh_token) for _ in range(5)))
    assert len({retry.refresh_token for retry in retries}) == 1 and retries[0].refresh_token != lost.refresh_token
    assert await alive(ctx, lost) == [False, False]
    assert await alive(ctx, retries[0]) == [True, True]
    # Without grace, the same presentation is reuse.
    strict = context(seeded, clock, grace=0)
    second = await refresh(strict, retries[0].refresh_token)
    clock.advance(successors.CONCURRENT_SECONDS + 1)
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(strict, retries[0].refresh_token)
    assert await alive(strict, second) == [False, False]


async def test_the_successor_key_rotates(seeded, clock):
    """The first key derives; every listed key recomputes what it derived. A process that does
    not know the key of a pair falls back to the grace rules (a new pair), as without it."""
    old, new = "o" * 32, "n" * 32
    before = context(seeded, clock, grace=30, tokens={"refresh_grace_seconds": 30, "successor_keys": [old]})
    during = context(seeded, clock, grace=30, tokens={"refresh_grace_seconds": 30, "successor_keys": [new, old]})
    after = context(seeded, clock, grace=30, tokens={"refresh_grace_seconds": 30, "successor_keys": [new]})
    first = await exchange(before, await code_for(before))
    derived_with_old = await refresh(before, first.refresh_token)
    assert (await refresh(during, first.refresh_token)).refresh_token == derived_with_old.refresh_token
    derived_with_new = await refresh(during, derived_with_old.refresh_token)
    assert (await refresh(after, derived_with_old.refresh_token)).refresh_token == derived_with_new.refresh_token
    other = await exchange(before, await code_for(before))
    other_next = await refresh(before, other.refresh_token)
    replaced = await refresh(after, other.refresh_token)  # the old key is gone here: a grace retry
    assert replaced.refresh_token != other_next.refresh_token
    assert await alive(after, other_next) == [False, False] and await alive(after, replaced) == [True, True]


async def test_the_successor_key_rotates_with_the_cookie_secret(seeded, clock):
    """Without successor_keys, each key of cookie_secret gives one: the rotation of
    docs/guide/operations.md rotates them too, and a pair derived before it is recomputed during it."""
    old, new = "the-old-cookie-secret-0123456789", "the-new-cookie-secret-0123456789"
    before, during, after = (context(seeded, clock, grace=30, cookie_secret=keys)
                             for keys in ([old], [new, old], [new]))
    first = await exchange(before, await code_for(before))
    derived_with_old = await refresh(before, first.refresh_token)
    assert (await refresh(during, first.refresh_token)).refresh_token == derived_with_old.refresh_token
    derived_with_new = await refresh(during, derived_with_old.refresh_token)
    assert (await refresh(after, derived_with_old.refresh_token)).refresh_token == derived_with_new.refresh_token


async def test_a_pair_no_key_derived_is_never_taken_for_a_successor(seeded, clock):
    """A release that does not derive pairs (0.9.0) rotates with a random pair and leaves the
    family's serial, key id and salt as they were: recomputing them gives another pair, so the
    presentation is decided by the grace rules, never answered with a pair the store lacks."""
    ctx = context(seeded, clock, grace=30)
    first = await exchange(ctx, await code_for(ctx))
    mine = await refresh(ctx, first.refresh_token)
    family, _ = await seeded.get_family(tokens.parse_refresh(mine.refresh_token)[0])
    older_release = tokens.mint(mine.refresh_token.partition(".")[0], family.scopes, clock(), 3600, 86400)
    assert await seeded.rotate_family(family.family_id, family.refresh_hash,
                                      replace(older_release.pair, serial=family.serial, key_id=family.key_id,
                                              salt=family.salt),
                                      clock())
    with pytest.raises(InvalidGrant, match="already used"):  # not the one rotated out last: reuse
        await refresh(ctx, first.refresh_token)
    second = await exchange(ctx, await code_for(ctx))
    family, _ = await seeded.get_family(tokens.parse_refresh(second.refresh_token)[0])
    theirs = tokens.mint(second.refresh_token.partition(".")[0], family.scopes, clock(), 3600, 86400)
    await seeded.rotate_family(family.family_id, family.refresh_hash, theirs.pair, clock())
    again = await refresh(ctx, second.refresh_token)  # within the window, but no successor of ours
    assert again.refresh_token != theirs.refresh_token
    assert await alive(ctx, again) == [True, True]


async def test_a_thief_within_the_window_gets_the_clients_own_pair_and_is_caught_next(seeded, clock):
    """Whoever presents the rotated-out token within the window gets the pair the client got:
    nothing more. Whichever of them refreshes second presents a rotated-out token: reuse."""
    ctx = context(seeded, clock)
    stolen = await exchange(ctx, await code_for(ctx))
    mine = await refresh(ctx, stolen.refresh_token)
    theirs = await refresh(ctx, stolen.refresh_token)
    assert theirs.refresh_token == mine.refresh_token
    await refresh(ctx, theirs.refresh_token)
    clock.advance(successors.CONCURRENT_SECONDS + 1)
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, mine.refresh_token)
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
    """Within the grace, past the window, before the client used its new pair, a thief's
    presentation looks like a lost reply's retry and gets a pair; the client's next refresh is
    then reuse, and the family (the thief's pair with it) is revoked."""
    ctx = context(seeded, clock, grace=30)
    stolen = await exchange(ctx, await code_for(ctx))
    mine = await refresh(ctx, stolen.refresh_token)
    clock.advance(successors.CONCURRENT_SECONDS + 1)
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
    config = make_config(storage={"backend": "mongodb", "mongodb_uri": "mongodb://db1,db2,db3/?replicaSet=rs0"})
    timeout_s = config.storage.timeout_ms / 1000
    # The first attempt may take the whole budget, the client waits Retry-After, and the retry
    # may take the budget again before it reaches the store.
    budget = 2 * timeout_s + config_module.STORE_RETRY_AFTER_SECONDS
    assert config.tokens.refresh_grace_seconds >= budget
    ctx = make_context(config, seeded, clock=clock)
    first = await exchange(ctx, await code_for(ctx))
    rotate = seeded.rotate_family

    async def applied_but_reply_lost(*arguments, **options):
        await rotate(*arguments, **options)
        raise StorageError("timed out waiting for the reply")

    monkeypatch.setattr(seeded, "rotate_family", applied_but_reply_lost)
    with pytest.raises(StorageError):
        await refresh(ctx, first.refresh_token)
    monkeypatch.undo()
    clock.advance(budget)
    retried = await refresh(ctx, first.refresh_token)
    assert await alive(ctx, retried) == [True, True]
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 0


def held_rotations(store, monkeypatch, held=1):
    """The store's first ``held`` rotations wait, once they reached it, until the test lets
    them apply (a majority write that lags, an election): an event each says it arrived."""
    rotate, gate, arrived = store.rotate_family, asyncio.Event(), [asyncio.Event() for _ in range(held)]
    calls = []

    async def slow(*arguments, **options):
        calls.append(arguments)
        if len(calls) <= held:
            arrived[len(calls) - 1].set()
            await gate.wait()
        return await rotate(*arguments, **options)

    monkeypatch.setattr(store, "rotate_family", slow)
    return gate, arrived


async def overtaken(ctx, store, clock, monkeypatch, held_for):
    """A rotation held in the store while a second presentation of the same token, arriving
    10 ms later, rotates first; the held one is let go ``held_for`` seconds later. The held
    presentation (a future) and the second one's answer."""
    first = await exchange(ctx, await code_for(ctx))
    gate, (held,) = held_rotations(store, monkeypatch)
    slow = asyncio.ensure_future(refresh(ctx, first.refresh_token))
    await held.wait()
    clock.advance(0.01)
    other = await refresh(ctx, first.refresh_token)
    clock.advance(held_for)
    gate.set()
    return slow, other


@pytest.mark.parametrize("grace", [0, 30])
async def test_a_presentation_is_judged_by_its_arrival_whatever_the_store_takes(seeded, clock, grace, monkeypatch):
    """A rotation whose write takes 3 s (a lagging majority, an election) and a second tab
    arriving 10 ms after it, whose own rotation lands first: the first, deciding again 3 s
    later, arrived within the window of the pair the second was issued, so both get that pair
    and nothing is reuse or replaced."""
    ctx = context(seeded, clock, grace=grace)
    slow, second_tab = await overtaken(ctx, seeded, clock, monkeypatch, held_for=3)
    first_tab = await slow
    assert (first_tab.access_token, first_tab.refresh_token) == (second_tab.access_token, second_tab.refresh_token)
    assert await alive(ctx, first_tab) == [True, True]
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 0
    assert counted(ctx, "tokensvc_tokens_issued_total", grant="refresh_token") == 1
    assert (await refresh(ctx, first_tab.refresh_token)).access_token


@pytest.mark.parametrize("grace", [0, 30])
async def test_presentations_held_through_an_election_get_one_pair(seeded, clock, grace, monkeypatch):
    """Both rotations reach the store and wait 12 s for a new primary, then one lands: the
    other, deciding then, is judged by its arrival with the one that landed, and gets its pair."""
    ctx = context(seeded, clock, grace=grace)
    first = await exchange(ctx, await code_for(ctx))
    gate, arrivals = held_rotations(seeded, monkeypatch, held=2)
    tabs = [asyncio.ensure_future(refresh(ctx, first.refresh_token))]
    await arrivals[0].wait()
    clock.advance(0.5)
    tabs.append(asyncio.ensure_future(refresh(ctx, first.refresh_token)))
    await arrivals[1].wait()
    clock.advance(12)
    gate.set()
    answers = await asyncio.gather(*tabs)
    assert len({(answer.access_token, answer.refresh_token) for answer in answers}) == 1
    assert await alive(ctx, answers[0]) == [True, True]
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 0


async def test_an_arrival_stands_for_a_bounded_time(seeded, clock, monkeypatch):
    """A presentation the store holds longer than successors.HELD_SECONDS is judged as if it
    had arrived that long before its decision: a concurrent pair issued just after its arrival
    is then not its own (the grace rules decide: reuse here), while one held just under the
    bound still gets it."""
    for held_for, answered in ((successors.HELD_SECONDS - 1, True), (successors.HELD_SECONDS + 3, False)):
        ctx = context(seeded, clock)
        slow, other = await overtaken(ctx, seeded, clock, monkeypatch, held_for)
        if answered:
            assert (await slow).refresh_token == other.refresh_token
            assert await alive(ctx, other) == [True, True]
        else:
            with pytest.raises(InvalidGrant, match="already used"):
                await slow
            assert await alive(ctx, other) == [False, False]
        monkeypatch.undo()


async def test_a_pair_used_before_a_presentation_arrived_is_not_given_to_it_however_late(seeded, clock):
    """The order that counts is the arrivals': a presentation that arrived after the pair's
    first use is reuse, one that arrived before it gets the pair even when the store answers
    it after the use."""
    ctx = context(seeded, clock)
    first = await exchange(ctx, await code_for(ctx))
    mine = await refresh(ctx, first.refresh_token)
    arrived = clock()
    clock.advance(1)
    assert await principal.from_bearer(ctx, mine.access_token) is not None  # the first use, 1 s in
    late = await grants.refresh(ctx, await seeded.get_client("webapp"), first.refresh_token, arrived=arrived)
    assert late.refresh_token == mine.refresh_token
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, first.refresh_token)  # arrived after the use


@pytest.mark.parametrize("grace", [0, 35])
async def test_a_thiefs_rotation_is_revealed_by_the_access_token_it_killed(seeded, clock, grace):
    """A thief rotates the current refresh token; the client's next call with its access token
    fails (one pair per family) and its app refreshes at once, within the window. That access
    token, rotated out but not expired, shows a second holder: the client's presentation is
    then decided by the grace rules, so the thief's rotation is caught (reuse at grace 0; at
    a grace, the thief's unused pair replaced and its next refresh reuse), never absorbed."""
    ctx = context(seeded, clock, grace=grace)
    client = await exchange(ctx, await code_for(ctx))
    clock.advance(600)
    thief = await refresh(ctx, client.refresh_token)
    clock.advance(0.2)
    assert await principal.from_bearer(ctx, client.access_token) is None  # the client's API call: 401
    clock.advance(0.3)
    if grace == 0:
        with pytest.raises(InvalidGrant, match="already used"):
            await refresh(ctx, client.refresh_token)
    else:
        replaced = await refresh(ctx, client.refresh_token)
        assert replaced.refresh_token != thief.refresh_token
        with pytest.raises(InvalidGrant, match="already used"):
            await refresh(ctx, thief.refresh_token)
        assert await alive(ctx, replaced) == [False, False]
    assert await alive(ctx, thief) == [False, False]
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 1


async def _api_call(ctx, old):
    assert await principal.from_bearer(ctx, old.access_token) is None


async def _introspected(ctx, old):
    assert await active(ctx, old.access_token) is False


async def _introspected_refresh(ctx, old):
    assert await active(ctx, old.refresh_token) is False


async def _revoked_rfc7009(ctx, old):
    assert await revocation.revoke_token(ctx, old.access_token, await ctx.store.get_client("webapp")) is False


async def _revoked_grant(ctx, old):
    await revocation.revoke_grants_of(ctx, [old.access_token, old.refresh_token])


SECOND_HOLDER_PATHS = {"api call": _api_call, "introspection": _introspected,
                       "introspection of the refresh token": _introspected_refresh,
                       "RFC 7009 revocation": _revoked_rfc7009, "/oauth/revoke": _revoked_grant}


@pytest.mark.parametrize("path", SECOND_HOLDER_PATHS)
async def test_a_token_of_the_replaced_pair_closes_the_window_from_every_path(seeded, clock, path):
    """The invariant: once a token of the pair a rotation replaced is presented, while it would
    still be in force, anywhere but at the refresh endpoint (an API call, introspection, either
    revocation endpoint), no presentation of the rotated-out refresh token gets the successor:
    its holder is not the one that rotated. The rotation stands, the old token authorizes and
    revokes nothing, and the presentation that follows within the window is reuse (grace 0)."""
    ctx = context(seeded, clock)
    old = await exchange(ctx, await code_for(ctx))
    clock.advance(600)
    new = await refresh(ctx, old.refresh_token)
    clock.advance(0.2)
    await SECOND_HOLDER_PATHS[path](ctx, old)
    family, _ = await seeded.get_family(tokens.parse_refresh(new.refresh_token)[0])
    assert family.second_holder_at == clock() and family.revoked_at is None
    assert await alive(ctx, new) == [True, True]
    clock.advance(0.3)
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, old.refresh_token)
    assert await alive(ctx, new) == [False, False]
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 1


async def test_presentations_at_the_refresh_endpoint_alone_keep_the_window(seeded, clock):
    """Presentations of the rotated-out refresh token at the refresh endpoint are the retries
    the window is for: any number of them leave it open, and each gets the pair."""
    ctx = context(seeded, clock)
    old = await exchange(ctx, await code_for(ctx))
    new = await refresh(ctx, old.refresh_token)
    for _ in range(5):
        clock.advance(0.3)
        assert (await refresh(ctx, old.refresh_token)).refresh_token == new.refresh_token
    family, _ = await seeded.get_family(tokens.parse_refresh(new.refresh_token)[0])
    assert family.second_holder_at is None


async def test_a_rotated_out_access_token_shows_a_second_holder_only_while_it_would_be_in_force(seeded, clock):
    """Tabs that refresh together, with no call between, and one whose access token had
    expired before another tab refreshed, still get one pair; a rotated-out access token
    presented before its expiry closes the window for the family, for good."""
    ctx = context(seeded, clock)
    tokens_ = await exchange(ctx, await code_for(ctx))
    clock.advance(ctx.tokens.access_ttl + 1)
    assert await principal.from_bearer(ctx, tokens_.access_token) is None  # expired
    mine = await refresh(ctx, tokens_.refresh_token)
    assert await principal.from_bearer(ctx, tokens_.access_token) is None  # expired, then rotated out
    assert (await refresh(ctx, tokens_.refresh_token)).refresh_token == mine.refresh_token
    family, _ = await seeded.get_family(tokens.parse_refresh(mine.refresh_token)[0])
    assert family.second_holder_at is None
    clock.advance(successors.CONCURRENT_SECONDS + 1)
    theirs = await refresh(ctx, mine.refresh_token)
    assert await principal.from_bearer(ctx, mine.access_token) is None  # rotated out, unexpired
    family, _ = await seeded.get_family(family.family_id)
    assert family.second_holder_at == clock()
    with pytest.raises(InvalidGrant, match="already used"):  # within the window, but not concurrent now
        await refresh(ctx, mine.refresh_token)
    assert await alive(ctx, theirs) == [False, False]


async def test_the_successor_needs_the_salt_the_store_holds(seeded, clock):
    """Each rotation draws a salt of its own, stored with the pair: the key and a refresh
    token copied long ago do not compute the pairs after it, nor does any salt but the one
    the store holds now."""
    ctx = context(seeded, clock)
    _, key = ctx.successors.deriving
    current = stolen = await exchange(ctx, await code_for(ctx))
    presented, salts = [], []
    for _ in range(4):
        clock.advance(60)
        presented.append(current.refresh_token)
        current = await refresh(ctx, current.refresh_token)
        family, _ = await seeded.get_family(tokens.parse_refresh(current.refresh_token)[0])
        salts.append(family.salt)
    assert len(set(salts)) == 4 and all(len(salt) == 22 for salt in salts)
    secret = stolen.refresh_token.partition(".")[0]
    # What the window does: the previous token, the serial and the stored salt give the pair
    # (the access token's random part, its routing part enciphered under the same key).
    access, tail = successors.derive(key, presented[-1], family.serial, family.salt)
    assert (access + tokens.route(key, family.family_id, access), f"{secret}.{tail}") == (
        current.access_token, current.refresh_token)
    # Whoever has the key and the first token, but not the store's record, computes nothing.
    for salt in salts[:-1]:
        access, _ = successors.derive(key, presented[-1], family.serial, salt)
        assert access != current.access_token[:43]
    token = stolen.refresh_token
    for serial in range(1, len(salts)):
        access, tail = successors.derive(key, token, serial, salts[-1])
        token = f"{secret}.{tail}"
        assert token not in presented[1:] + [current.refresh_token]


async def test_within_the_window_the_scope_is_checked_as_a_rotation_checks_it(seeded, clock):
    """A presentation within the window has its scope checked exactly as a rotation's (a
    malformed scope, a wider one: the same invalid_scope, word for word), and then gets the
    pair only for that pair's own scope or none: a narrower one is told so, never given the
    pair with a scope it did not ask for. Nothing is revoked by any of them."""
    ctx = context(seeded, clock)
    webapp = await seeded.get_client("webapp")
    first = await exchange(ctx, await code_for(ctx))
    current = await exchange(ctx, await code_for(ctx))  # a token no rotation touched, for comparison
    mine = await refresh(ctx, first.refresh_token)
    assert mine.scope == "read write connected-apps:write"
    for scope in ("read\x00x", "read  write\x7f", "admin", "read write2"):
        with pytest.raises(InvalidScope) as outside:
            await grants.refresh(ctx, webapp, current.refresh_token, scope)
        with pytest.raises(InvalidScope) as inside:
            await grants.refresh(ctx, webapp, first.refresh_token, scope)
        assert str(inside.value) == str(outside.value), scope
    for scope in ("read", "write connected-apps:write"):
        with pytest.raises(InvalidScope, match="just rotated by a concurrent request, with the scope"):
            await grants.refresh(ctx, webapp, first.refresh_token, scope)
    for scope in (None, "", mine.scope, "connected-apps:write write read read"):
        again = await grants.refresh(ctx, webapp, first.refresh_token, scope)
        assert (again.refresh_token, again.scope) == (mine.refresh_token, mine.scope)
    assert await alive(ctx, mine) == [True, True] and await alive(ctx, current) == [True, True]
    assert counted(ctx, "tokensvc_refresh_reuse_total") == 0


async def test_a_successor_used_after_a_late_reissue_is_never_given_again(seeded, clock):
    """The window runs from the current pair's issue, a reissue's too, and the pair's first
    use within it is recorded: a grace retry near the end of the grace, its pair used, then
    the old token once more is reuse, not that used pair again."""
    ctx = context(seeded, clock, grace=5)
    first = await exchange(ctx, await code_for(ctx))
    clock.advance(10)
    await refresh(ctx, first.refresh_token)
    clock.advance(4.9)
    reissued = await refresh(ctx, first.refresh_token)  # a retry within the grace
    clock.advance(0.6)  # past the grace, within the window of the reissued pair
    assert await principal.from_bearer(ctx, reissued.access_token) is not None
    clock.advance(0.5)
    with pytest.raises(InvalidGrant, match="already used"):
        await refresh(ctx, first.refresh_token)
    assert await alive(ctx, reissued) == [False, False]


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
    return await store.db["families"].count_documents({})


async def refreshed_often(store, clock, rounds: int) -> list[tuple[list[str], int]]:
    """A family refreshed once, then one refreshed ``rounds`` times: after each, one record per
    family, its first token still taken for reuse, and what revoking its grant cost (the store
    calls, the families revoked). bench/family.py runs it with 100,000 rounds."""
    ctx = context(store, clock)
    logging.getLogger("tokensvc.audit").disabled = True  # an audit line a refresh is not the subject here
    try:
        costs = []
        for times in (1, rounds):
            tokens = await exchange(ctx, await code_for(ctx))
            first = tokens.refresh_token
            for _ in range(times):
                tokens = await refresh(ctx, tokens.refresh_token)
            assert await family_count(store) == len(costs) + 1
            grant_id = (await principal.from_bearer(ctx, tokens.access_token)).token.grant_id
            counting = Counting(store)
            ctx.store = counting
            revoked = await revocation.revoke_grant(ctx, grant_id, "test")
            ctx.store = store
            costs.append((counting.calls, revoked))
            assert await alive(ctx, tokens) == [False, False]
            with pytest.raises(InvalidGrant):  # the first token of the family is still known
                await refresh(ctx, first)
            await seed(store, make_config())
            await code_for(ctx)  # consent again, for the next family
        return costs
    finally:
        logging.getLogger("tokensvc.audit").disabled = False


async def test_a_family_stays_one_record_however_often_it_refreshes(seeded, clock):
    """300 refreshes: one record, the first token still recognised as reuse, and revoking the
    grant costs what it costs after one refresh. The same run with 100,000 refreshes is
    bench/family.py's (docs/performance.md)."""
    costs = await refreshed_often(seeded, clock, 300)
    # Its families' audiences read before the mark and again before the sweep (the revocation
    # feed's audience of it), whatever their number.
    assert costs[0] == costs[1] == (
        ["families_audience", "mark_grant_revoked", "families_audience", "revoke_grant_families"], 1)


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
    for name, issued in (("a", a), ("b", b), ("c", c)):
        token = (await principal.from_bearer(ctx, issued.access_token)).token
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
