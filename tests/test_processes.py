"""Several processes over one MongoDB: a revocation made by one process closes the affected
WebSockets of every other within a second, through one relay per process (a change stream,
or a poll of the revocation counter where there is none)."""

from __future__ import annotations

import asyncio

import pytest
from pymongo.errors import OperationFailure
from tornado.websocket import websocket_connect

from backends import open_store
from test_ws import closed_within_a_second, tokens, welcome_of, ws_url
from tokensvc.oauth import events, hashing
from tokensvc.storage.memory import MemoryStore
from tokensvc.storage.mongo import MongoStore


@pytest.fixture
def store(io_loop):
    """The service's store: the mongodb stand-in (the app fixture serves it)."""
    opened, cleanup = open_store("mongodb", io_loop)
    yield opened
    cleanup()


def other_process(store: MongoStore) -> MongoStore:
    """Another process's store over the same database."""
    return MongoStore(store._client, store._db.name, change_streams=False)


@pytest.mark.gen_test(timeout=30)
async def test_a_revocation_in_another_process_closes_the_socket_within_a_second(browser, http_client, base_url,
                                                                                 store, ctx):
    relay = asyncio.ensure_future(events.relay(store, ctx.events))
    try:
        issued = await tokens(browser, http_client, base_url)
        connection = await websocket_connect(ws_url(base_url, "?access_token=" + issued["access_token"]))
        await welcome_of(connection)
        elsewhere = other_process(store)
        record = await elsewhere.get_token(hashing.digest(issued["access_token"]))
        await elsewhere.revoke_grant(record.grant_id, ctx.clock())  # no event of this process fires
        await closed_within_a_second(connection)
    finally:
        relay.cancel()


@pytest.mark.gen_test(timeout=30)
async def test_only_a_revocation_that_changed_something_is_announced(store, clock):
    seen = []
    feed = store.revocation_feed(poll_seconds=0.05).__aiter__()
    waiting = asyncio.ensure_future(feed.__anext__())
    await asyncio.sleep(0.1)
    assert not await other_process(store).revoke_token("no-such-token", clock())
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await other_process(store).delete_user_sessions("u_nobody")
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await other_process(store)._announce()
    await asyncio.wait_for(waiting, 1)
    seen.append(1)
    await feed.aclose()
    assert seen == [1]


class FakeStream:
    def __init__(self, changes):
        self.changes, self.resume_token = list(changes), None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.changes:
            raise OperationFailure("cursor killed", 237)  # a permanent end: the feed stops
        change = self.changes.pop(0)
        self.resume_token = {"_data": change}
        return change


class FakeCounter:
    def __init__(self, refuse=None):
        self.refuse, self.resumed_after = refuse, []

    async def watch(self, resume_after=None):
        self.resumed_after.append(resume_after)
        if self.refuse:
            raise OperationFailure("The $changeStream stage is only supported on replica sets", self.refuse)
        return FakeStream(["one", "two"])

    async def find_one(self, query):
        return {"_id": "revocations", "seq": 0}


@pytest.mark.gen_test
async def test_the_change_stream_yields_each_announcement_and_keeps_its_resume_token(store):
    store.change_streams, store.revocations = True, FakeCounter()
    feed = store.revocation_feed()
    assert await feed.__anext__() is None and await feed.__anext__() is None
    from tokensvc.storage.base import StoreFault
    with pytest.raises(StoreFault):
        await feed.__anext__()
    assert store._resume_token == {"_data": "two"}  # the next watch resumes after it


@pytest.mark.gen_test
async def test_without_change_streams_the_counter_is_polled(store, caplog):
    store.change_streams, store.revocations = True, FakeCounter(refuse=40573)
    feed = store.revocation_feed(poll_seconds=0.01)
    waiting = asyncio.ensure_future(feed.__anext__())
    await asyncio.sleep(0.05)
    assert not store.change_streams and not waiting.done()  # polling, nothing announced
    waiting.cancel()
    assert "polling for revocations" in caplog.text


@pytest.mark.gen_test
async def test_the_relay_ends_at_once_for_a_store_of_one_process(ctx):
    await asyncio.wait_for(events.relay(MemoryStore(), ctx.events), 1)


@pytest.mark.gen_test(timeout=30)
async def test_the_relay_rechecks_everyone_after_an_interruption(store, ctx):
    from tokensvc.storage.base import StorageError

    calls = []

    async def broken_feed():
        raise StorageError("away")
        yield

    store.revocation_feed = broken_feed
    ctx.events.subscribe(lambda: calls.append(1))
    relay = asyncio.ensure_future(events.relay(store, ctx.events, retry_seconds=0.01))
    await asyncio.sleep(0.1)
    relay.cancel()
    assert calls  # every listener re-checked after each gap


@pytest.mark.gen_test(timeout=30)
async def test_failure_limits_hold_across_processes(store, monkeypatch, io_loop):
    from helpers import make_config
    from test_limits import authenticate
    from tokensvc.bootstrap import seed
    from tokensvc.oauth import clientauth
    from tokensvc.oauth.context import OAuthContext

    config = make_config(limits={"window_seconds": 60, "failed_client_auth_per_client": 3,
                                 "failed_client_auth_per_address": 100})
    await seed(store, config)
    processes = [OAuthContext.from_settings(config, store), OAuthContext.from_settings(config, other_process(store))]
    assert all(ctx.limits.shared is not None for ctx in processes)
    checked = []
    original = clientauth.verify
    monkeypatch.setattr(clientauth, "verify", lambda client, creds: (checked.append(1), original(client, creds))[1])
    results = [await authenticate(processes[n % 2], "wrong") for n in range(20)]  # a load balancer's round robin
    # The limit (3), plus at most one more per other process: not 3 in each.
    assert len(checked) == 4 and results.count("TooManyFailures") == 16
    # The shared count lives in the store, with a TTL.
    assert (await store.failures.find_one({"_id": "client:webapp|127.0.0.1"}))["n"] == 4
