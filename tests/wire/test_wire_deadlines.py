"""The store's deadlines on the wire: a call the store stops waiting for is never cancelled
(storage/mongo/calls.py), goes on to the driver's own deadlines, and sends nothing after the
store answered; the driver comes out of an outage whole, and serves again."""

from __future__ import annotations

import asyncio

import pytest
from helpers import eventually
from primary import ReplicaSet
from pymongo import AsyncMongoClient

from tokensvc.records import Client, utcnow
from tokensvc.storage.base import StorageError
from tokensvc.storage.mongo import MongoStore

pytestmark = pytest.mark.gen_test(timeout=60)


async def test_a_write_the_store_gave_up_on_is_never_sent_after_its_503(primary):
    """A one-document write waits for a server the driver cannot reach. The store answers 503
    at its budget and stops waiting; the driver's own server selection lasts longer here (its
    timeout ten times the budget), so the call is still waiting when the server comes back:
    it ends then, having sent nothing (its session ended with the 503), and no attempt is
    counted after the client was told it failed."""
    client: AsyncMongoClient = AsyncMongoClient(primary.uri(), serverSelectionTimeoutMS=10_000, retryReads=False)
    store = MongoStore(client, "tokensvc", timeout_ms=1000, causal=True)
    counts = store.failure_counts()
    try:
        await counts.count_attempt("login|127.0.0.1", ["address"], 300)  # the window exists
        primary.forget()
        primary.set_down(0)
        with pytest.raises(StorageError, match="no answer within 1 s"):
            await counts.count_attempt("login|127.0.0.1", ["address"], 300)
        assert len(store.calls.left) == 1  # the call the store stopped waiting for: still selecting a server
        primary.set_down(0, False)
        await eventually(lambda: not store.calls.left, what="the call left behind ending when the server is back")
        assert primary.sent("findAndModify", "failures") == []
        assert (await counts.read_counts("login|127.0.0.1", ["address"]))[0] == [1]
    finally:
        await store.close()


async def test_the_store_serves_again_after_an_outage_that_outlasted_many_budgets(wire_store, primary):
    """Reads and writes, several at once, while the only member is unreachable: each a 503
    within its budget; once it answers again, the same operations succeed, and every call
    left behind has ended."""
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"], created_at=utcnow()))
    counts = wire_store.failure_counts()
    primary.set_down(0)
    for _ in range(3):
        answers = await asyncio.gather(*(operation for _ in range(3) for operation in (
            wire_store.get_client("webapp"), wire_store.list_clients(), counts.count_attempt("g", ["a"], 60),
            wire_store.revoke_family("f" * 64, utcnow()))), return_exceptions=True)
        assert all(isinstance(answer, StorageError) for answer in answers), answers
    primary.set_down(0, False)

    async def served() -> bool:
        try:
            return (await wire_store.get_client("webapp")).name == "Web"
        except StorageError:
            return False

    await eventually(served, what="the store serving again")
    assert (await counts.count_attempt("g", ["a"], 60))[0] == [1]
    await eventually(lambda: not wire_store.calls.left, what="every call left behind ending")
    assert not wire_store.client._topology._lock.locked()


@pytest.fixture
def primary():
    server = ReplicaSet().start()
    yield server
    server.stop()
