"""Races, lost responses and outages, over real HTTP, on every backend."""

from __future__ import annotations

import asyncio

import pytest
from backends import store_fixture
from helpers import (
    PAST_CONCURRENT,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    basic,
    exchange,
    family_of,
    json_of,
    make_config,
    new_verifier,
    post_form,
)
from pymongo.errors import ServerSelectionTimeoutError
from tornado.httpclient import AsyncHTTPClient

from tokensvc.oauth import hashing
from tokensvc.records import Subject
from tokensvc.storage.mongo import MongoStore

store = store_fixture()

AUTH = {"Authorization": basic("webapp", WEBAPP_SECRET)}


@pytest.fixture
def wide_client(io_loop):
    client = AsyncHTTPClient(force_instance=True, max_clients=64)
    yield client
    client.close()


async def first_tokens(browser, http_client, base_url):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    return json_of(await exchange(http_client, base_url, code))


async def refresh(client, base_url, token):
    return await post_form(client, base_url + "/oauth/token/refresh", {"refresh_token": token}, AUTH)


async def active(http_client, base_url, token):
    response = await post_form(http_client, base_url + "/oauth/token/introspect", {"token": token}, AUTH)
    return json_of(response)["active"]


async def live_families_of_grant(store, grant_id):
    return len(await store.list_families(grant_id))


@pytest.fixture
def config(request):
    return make_config(tokens={"refresh_grace_seconds": getattr(request, "param", 0)})


@pytest.mark.parametrize("config", [0, 30], indirect=True, ids=["no-grace", "grace"])
@pytest.mark.parametrize("presentations", [2, 5, 50])
@pytest.mark.gen_test(timeout=60)
async def test_of_concurrent_exchanges_of_one_code_exactly_one_is_exchanged(
        browser, http_client, wide_client, base_url, store, config, presentations):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    responses = await asyncio.gather(*(exchange(wide_client, base_url, code) for _ in range(presentations)))
    codes = sorted(response.code for response in responses)
    odd = [r.body[:200] for r in responses if r.code not in (200, 400)][:2]
    assert codes.count(200) == 1 and codes.count(400) == presentations - 1, (codes, odd)
    assert all(json_of(r)["error"] == "invalid_grant" for r in responses if r.code == 400)
    winner = json_of(next(r for r in responses if r.code == 200))
    # Reuse detection fired: what the code gave (its family) is revoked; the grant stands.
    assert not await active(http_client, base_url, winner["access_token"])
    record = await family_of(store, winner["refresh_token"])
    assert record.revoked_at is not None
    assert (await store.get_grant(record.grant_id)).revoked_at is None
    assert await live_families_of_grant(store, record.grant_id) == 0


@pytest.mark.parametrize("presentations", [2, 5, 50])
@pytest.mark.gen_test(timeout=60)
async def test_concurrent_refreshes_of_one_token_all_get_the_same_pair(
        browser, http_client, wide_client, base_url, store, presentations):
    tokens = await first_tokens(browser, http_client, base_url)
    responses = await asyncio.gather(*(refresh(wide_client, base_url, tokens["refresh_token"])
                                       for _ in range(presentations)))
    assert [response.code for response in responses] == [200] * presentations, [r.body[:200] for r in responses]
    pairs = {(json_of(r)["access_token"], json_of(r)["refresh_token"]) for r in responses}
    assert len(pairs) == 1
    access, refresh_token = pairs.pop()
    assert await active(http_client, base_url, access) and await active(http_client, base_url, refresh_token)
    record = await family_of(store, refresh_token)
    assert record.revoked_at is None and record.rotations == 1
    assert (await refresh(http_client, base_url, refresh_token)).code == 200  # and the family goes on


@pytest.mark.gen_test(timeout=60)
async def test_revoke_racing_refresh_leaves_no_live_chain(browser, http_client, wide_client, base_url, store):
    for _ in range(5):
        tokens = await first_tokens(browser, http_client, base_url)
        refreshed, revoked = await asyncio.gather(
            refresh(wide_client, base_url, tokens["refresh_token"]),
            post_form(wide_client, base_url + "/oauth/token/revoke", {"token": tokens["refresh_token"]}, AUTH))
        assert revoked.code == 200 and refreshed.code in (200, 400)
        assert not await active(http_client, base_url, tokens["refresh_token"])
        if refreshed.code == 200:  # the revocation reached the chain's new links too
            new = json_of(refreshed)
            assert not await active(http_client, base_url, new["refresh_token"])
            assert not await active(http_client, base_url, new["access_token"])


@pytest.mark.gen_test
async def test_a_failed_verifier_spends_the_code_without_revoking_anything(browser, http_client, base_url, store):
    """A leaked code alone (no verifier) can spend the code, but not cut the user off: the
    user's own exchange is invalid_grant, and the tokens the grant already holds live on."""
    earlier = json_of(await exchange(http_client, base_url, await browser.code_for("webapp", WEBAPP_REDIRECT)))
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    wrong, _ = new_verifier()
    assert (await exchange(http_client, base_url, code, verifier=wrong)).code == 400
    response = await exchange(http_client, base_url, code)
    assert response.code == 400 and json_of(response)["error"] == "invalid_grant"
    assert json_of(response)["error_description"] == "The authorization code is no longer valid"
    assert await active(http_client, base_url, earlier["access_token"])
    assert await active(http_client, base_url, earlier["refresh_token"])


# -- outages in the middle of a flow ----------------------------------------------------

class Outage:
    """Makes chosen store operations fail as an unreachable MongoDB (or any backend) would."""

    def __init__(self, store, monkeypatch):
        self.store, self.monkeypatch, self.down = store, monkeypatch, set()

    def fail(self, *operations):
        from tokensvc.storage.base import StorageError

        for name in operations:
            original = getattr(self.store, name)

            async def broken(*args, _name=name, _original=original, **kwargs):
                if _name in self.down:
                    if isinstance(self.store, MongoStore):  # through the real error translation
                        from tokensvc.storage.mongo import translate

                        raise translate(ServerSelectionTimeoutError("No servers found yet"))
                    raise StorageError("store unavailable")
                return await _original(*args, **kwargs)

            self.monkeypatch.setattr(self.store, name, broken)
            self.down.add(name)

    def recover(self):
        self.down.clear()


@pytest.mark.gen_test
async def test_outage_during_code_exchange_issues_nothing_and_the_retry_works(
        browser, http_client, base_url, store, monkeypatch):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    outage = Outage(store, monkeypatch)
    outage.fail("create_family")
    response = await exchange(http_client, base_url, code)
    assert response.code == 503 and set(json_of(response)) == {"detail"}
    # The code names the family its redemption starts; no token of it exists.
    redeemed = await store.get_code(hashing.digest(code))
    assert await store.get_family(redeemed.family_id) == (None, None)
    outage.recover()
    response = await exchange(http_client, base_url, code)
    assert response.code == 200
    assert await active(http_client, base_url, json_of(response)["access_token"])


@pytest.mark.gen_test
async def test_outage_during_refresh_keeps_the_refresh_token(browser, http_client, base_url, store, monkeypatch):
    tokens = await first_tokens(browser, http_client, base_url)
    outage = Outage(store, monkeypatch)
    outage.fail("rotate_family")
    response = await refresh(http_client, base_url, tokens["refresh_token"])
    assert response.code == 503
    record = await family_of(store, tokens["refresh_token"])
    assert record.refresh_hash == hashing.digest(tokens["refresh_token"]) and record.revoked_at is None
    outage.recover()
    assert (await refresh(http_client, base_url, tokens["refresh_token"])).code == 200


@pytest.mark.gen_test
async def test_outage_before_the_grant_is_recorded(browser, store, monkeypatch):
    await browser.login("alice")
    outage = Outage(store, monkeypatch)
    outage.fail("save_grant")
    response = await browser.authorize("webapp", WEBAPP_REDIRECT)
    assert response.code == 503 and "Location" not in response.headers
    alice = await store.get_user_by_username("alice")
    assert await store.list_grants(Subject(user_id=alice.user_id)) == []
    outage.recover()
    assert (await browser.authorize("webapp", WEBAPP_REDIRECT)).code == 302


# -- the refresh grace period ---------------------------------------------------------------

class TestGrace:
    @pytest.fixture
    def config(self):
        return make_config(tokens={"refresh_grace_seconds": 30})

    @pytest.mark.gen_test
    async def test_retry_within_grace_gets_a_fresh_pair_and_voids_the_lost_one(
            self, browser, http_client, base_url, store, clock):
        first = await first_tokens(browser, http_client, base_url)
        lost = json_of(await refresh(http_client, base_url, first["refresh_token"]))  # response "lost"
        clock.advance(PAST_CONCURRENT)  # the client gave up waiting, and retries
        retry = await refresh(http_client, base_url, first["refresh_token"])
        assert retry.code == 200
        fresh = json_of(retry)
        assert not await active(http_client, base_url, lost["refresh_token"])
        assert not await active(http_client, base_url, lost["access_token"])
        assert await active(http_client, base_url, fresh["access_token"])
        # The fresh chain goes on.
        assert (await refresh(http_client, base_url, fresh["refresh_token"])).code == 200

    @pytest.mark.gen_test
    async def test_retry_after_the_grace_is_reuse(self, browser, http_client, base_url, store, clock):
        first = await first_tokens(browser, http_client, base_url)
        second = json_of(await refresh(http_client, base_url, first["refresh_token"]))
        clock.advance(31)
        response = await refresh(http_client, base_url, first["refresh_token"])
        assert response.code == 400 and json_of(response)["error"] == "invalid_grant"
        assert not await active(http_client, base_url, second["refresh_token"])

    @pytest.mark.gen_test
    async def test_an_older_generation_is_reuse(self, browser, http_client, base_url, store):
        first = await first_tokens(browser, http_client, base_url)
        second = json_of(await refresh(http_client, base_url, first["refresh_token"]))
        third = json_of(await refresh(http_client, base_url, second["refresh_token"]))
        response = await refresh(http_client, base_url, first["refresh_token"])
        assert response.code == 400
        assert not await active(http_client, base_url, third["refresh_token"])

    @pytest.mark.gen_test
    async def test_another_client_gets_nothing(self, browser, http_client, base_url, store):
        from helpers import PARTNER_SECRET

        first = await first_tokens(browser, http_client, base_url)
        second = json_of(await refresh(http_client, base_url, first["refresh_token"]))
        response = await post_form(http_client, base_url + "/oauth/token/refresh",
                                   {"refresh_token": first["refresh_token"]},
                                   {"Authorization": basic("partner", PARTNER_SECRET)})
        assert response.code == 400
        assert await active(http_client, base_url, second["refresh_token"])

    @pytest.mark.gen_test(timeout=30)
    async def test_retry_racing_the_lost_pairs_first_use(self, browser, http_client, wide_client, base_url, store):
        for _ in range(5):
            first = await first_tokens(browser, http_client, base_url)
            lost = json_of(await refresh(http_client, base_url, first["refresh_token"]))
            retry, use = await asyncio.gather(refresh(wide_client, base_url, first["refresh_token"]),
                                              refresh(wide_client, base_url, lost["refresh_token"]))
            winners = [json_of(r) for r in (retry, use) if r.code == 200]
            assert {retry.code, use.code} <= {200, 400}
            # At most one live chain remains of first -> lost -> (retry | use).
            candidates = [lost["refresh_token"], *(w["refresh_token"] for w in winners)]
            live = [token for token in candidates if await active(http_client, base_url, token)]
            assert len(live) <= 1, (retry.code, use.code)
