"""Through HTTP, on the real driver: what a client sees when the replica set loses a reply
after applying the write (the token lifecycle's retries, proven on the wire)."""

from __future__ import annotations

import pytest
from helpers import WEBAPP_REDIRECT, exchange, json_of, make_config, query_of
from primary import Fault

from tokensvc.config import StorageSettings
from tokensvc.oauth import introspection
from tokensvc.records import Subject

pytestmark = pytest.mark.gen_test


@pytest.fixture
def wire_budget_ms():
    """No fault here waits out the store's budget (a lost reply is a hang-up, answered at once),
    and these tests decide answers, not how soon they come: the default budget, which a busy
    machine does not run out. (Within the tier's 2 s, a request that a loaded machine holds up,
    a pause such as a full collection of a whole run's heap stretched by the load, is answered
    503.)"""
    return StorageSettings().timeout_ms


@pytest.fixture
def config(wire_budget_ms):
    # The MongoDB backend's default grace: the whole retry budget of a client.
    return make_config(storage={"backend": "mongodb", "mongodb_uri": "mongodb://db1,db2,db3/?replicaSet=rs0",
                                "timeout_ms": wire_budget_ms})  # the store itself is the wire tier's


@pytest.fixture
def store(wire_store):
    return wire_store


async def code_of(browser) -> str:
    await browser.login("alice")
    response = await browser.authorize("webapp", WEBAPP_REDIRECT, scope="read")
    return query_of(response.headers["Location"])["code"]


async def test_an_exchange_whose_reply_is_lost_after_the_code_was_consumed_is_retried(
        browser, http_client, base_url, primary, ctx, config):
    assert config.tokens.refresh_grace_seconds > 0
    code = await code_of(browser)
    # The consumption is applied, and both its reply and the driver's retry's are lost.
    primary.script(Fault("findAndModify", "hangup_after", collection="codes", times=2))
    lost = await exchange(http_client, base_url, code)
    assert lost.code == 503 and lost.headers["Retry-After"]
    retried = await exchange(http_client, base_url, code)
    assert retried.code == 200, retried.body
    tokens = json_of(retried)
    # Nothing was revoked: the tokens work and the grant lives.
    assert (await introspection.introspect(ctx, tokens["access_token"]))["active"] is True
    alice = await ctx.store.get_user_by_username("alice")
    grants = await ctx.store.list_grants(Subject(user_id=alice.user_id))
    assert [grant.client_id for grant in grants] == ["webapp"]  # live, not revoked


async def test_a_refresh_whose_reply_is_lost_after_the_rotation_is_retried(browser, http_client, base_url, primary,
                                                                           ctx):
    from helpers import WEBAPP_SECRET, basic, post_form

    tokens = json_of(await exchange(http_client, base_url, await code_of(browser)))
    refresh = {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]}
    headers = {"Authorization": basic("webapp", WEBAPP_SECRET)}
    primary.script(Fault("findAndModify", "hangup_after", collection="families", times=2))
    lost = await post_form(http_client, base_url + "/oauth/token/refresh", refresh, headers=headers)
    assert lost.code == 503
    retried = await post_form(http_client, base_url + "/oauth/token/refresh", refresh, headers=headers)
    assert retried.code == 200, retried.body
    renewed = json_of(retried)
    assert (await introspection.introspect(ctx, renewed["access_token"]))["active"] is True


@pytest.mark.parametrize("presentations", [2, 5, 50])
async def test_concurrent_presentations_of_a_refresh_token_get_one_pair_and_of_a_code_one_exchange(
        browser, http_client, base_url, primary, ctx, presentations):
    """On the real driver, against a server that runs them concurrently: every presentation of
    one refresh token gets the same successor, and of one code exactly one is exchanged."""
    import asyncio

    from helpers import WEBAPP_SECRET, basic, post_form
    from tornado.httpclient import AsyncHTTPClient

    wide = AsyncHTTPClient(force_instance=True, max_clients=64)
    auth = {"Authorization": basic("webapp", WEBAPP_SECRET)}
    tokens = json_of(await exchange(http_client, base_url, await code_of(browser)))
    answers = await asyncio.gather(*(post_form(wide, base_url + "/oauth/token/refresh",
                                               {"refresh_token": tokens["refresh_token"]}, auth)
                                     for _ in range(presentations)))
    assert [answer.code for answer in answers] == [200] * presentations
    assert len({json_of(answer)["refresh_token"] for answer in answers}) == 1
    renewed = json_of(answers[0])
    assert (await introspection.introspect(ctx, renewed["access_token"]))["active"] is True
    code = await code_of(browser)
    answers = await asyncio.gather(*(exchange(wide, base_url, code) for _ in range(presentations)))
    assert sorted(answer.code for answer in answers) == [200] + [400] * (presentations - 1)
    wide.close()


async def test_concurrent_refreshes_that_meet_a_write_conflict_get_one_pair(browser, http_client, base_url, primary,
                                                                            ctx):
    """Two presentations of one refresh token whose rotations read the family together and
    commit one after the other: the server answers the loser a write conflict (112, labelled
    TransientTransactionError, nothing applied). The store runs it again as the label says, it
    finds the family rotated, and the window answers it with the winner's pair: two 200s, one
    pair, alive."""
    import asyncio

    from helpers import WEBAPP_SECRET, basic, post_form

    auth = {"Authorization": basic("webapp", WEBAPP_SECRET)}
    tokens = json_of(await exchange(http_client, base_url, await code_of(browser)))
    primary.script(Fault("findAndModify", "race", collection="families", code=112,
                         labels=("TransientTransactionError",), times=2))
    answers = await asyncio.gather(*(post_form(http_client, base_url + "/oauth/token/refresh",
                                               {"refresh_token": tokens["refresh_token"]}, auth) for _ in range(2)))
    assert [answer.code for answer in answers] == [200, 200], [answer.body for answer in answers]
    assert len({json_of(answer)["refresh_token"] for answer in answers}) == 1
    assert ("findAndModify", 112) in primary.refusals
    assert (await introspection.introspect(ctx, json_of(answers[0])["access_token"]))["active"] is True


async def test_at_debug_the_log_holds_no_password_hash_and_no_secret_digest(browser, http_client, base_url, store):
    """A sign-in and a code exchange by a client with a secret, logged at debug on the real
    driver: the service's own debug lines are there, the driver's command log (whole user and
    client documents) is not."""
    import hashlib
    import io
    import logging

    from helpers import WEBAPP_SECRET

    from tokensvc.telemetry import logs

    root, driver = logging.getLogger(), logging.getLogger("pymongo")
    saved = root.handlers[:], root.level, driver.level
    stream = io.StringIO()
    handler = logs.configure("text", "debug", stream=stream)
    try:
        logging.getLogger("tokensvc.wire").debug("logged at debug")
        code = await code_of(browser)  # the sign-in reads alice's record, its password hash with it
        assert (await exchange(http_client, base_url, code)).code == 200  # webapp's secret against its digest
        handler.flush_now()
    finally:
        root.handlers[:], root_level, driver_level = saved
        root.setLevel(root_level)
        driver.setLevel(driver_level)
    text = stream.getvalue()
    assert "DEBUG tokensvc.wire: logged at debug" in text and "POST /oauth/token" in text
    alice = await store.get_user_by_username("alice")
    webapp = await store.get_client("webapp")
    assert alice.password_hash.startswith("scrypt$") and webapp.secret_hash
    assert "scrypt$" not in text
    assert webapp.secret_hash not in text
    assert hashlib.sha256(WEBAPP_SECRET.encode()).hexdigest() not in text
