"""The wire tier enforces what it records, and the store meets it as a real replica set makes
it: ``maxTimeMS`` (50), a write concern that fails (``errInfo.wtimeout``: 503, and a clock that
does not wait on the write), ``afterClusterTime`` (a read waits for the commit point),
concurrent writes (write conflicts run again as their label says, unique-index races), and
listings in batches with a cursor that can be lost."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from bson import Timestamp
from helpers import eventually
from primary import BUDGET_MS, Fault, wire_settings

from tokensvc.bootstrap import make_store
from tokensvc.oauth import hashing
from tokensvc.records import Client, Family, Pair, Session, Subject, User, utcnow
from tokensvc.storage.base import StorageError

pytestmark = pytest.mark.gen_test(timeout=30)

ALICE = Subject(user_id="u_alice")


def session(name: str) -> Session:
    now = utcnow()
    return Session(name, "u_alice", now, now + timedelta(hours=1))


def pair(name: str) -> Pair:
    now = utcnow()
    return Pair(hashing.digest("access " + name), hashing.digest("refresh " + name), ["read"], now,
                now + timedelta(hours=1), now + timedelta(minutes=10))


async def test_a_read_the_server_stops_at_its_max_time_is_a_storage_error_within_the_budget(wire_store, primary):
    primary.script(Fault("aggregate", "delay", collection="clients", seconds=BUDGET_MS / 1000 * 3))
    started = time.monotonic()
    with pytest.raises(StorageError):
        await wire_store.get_client("webapp")
    assert time.monotonic() - started < BUDGET_MS / 1000 + 0.5
    sent = primary.sent("aggregate", "clients")[0]["maxTimeMS"]
    assert 0 < sent <= BUDGET_MS
    await eventually(lambda: ("aggregate", 50) in primary.refusals, what="the server's MaxTimeMSExpired")


async def test_a_failed_write_concern_is_503_and_no_later_read_waits_on_the_write(wire_store, primary):
    """The write applied on the primary but never reached a majority: a WTimeoutError (the
    server's errInfo.wtimeout), so 503. Its operation time is not taken into the causal clock:
    reads after it go on at the commit point instead of waiting for a write that may never be
    majority-committed."""
    await wire_store.add_session(session("s1"))
    await wire_store.add_session(session("s2"))
    acknowledged = primary.clock
    primary.lagging = True  # the secondaries fall behind: nothing more is majority-committed
    primary.script(Fault("update", "write_concern_error", collection="sessions", code=64))
    with pytest.raises(StorageError, match="WTimeoutError"):
        await wire_store.end_session("s1", utcnow())
    assert primary.clock == acknowledged + 1  # applied on the primary all the same
    primary.forget()
    started = time.monotonic()
    assert await wire_store.get_session("s2") is not None
    assert time.monotonic() - started < BUDGET_MS / 1000 / 2  # at once, not after maxTimeMS
    read = primary.sent("find", "sessions")[0]["readConcern"]
    assert read == {"level": "majority", "afterClusterTime": Timestamp(1_700_000_000, acknowledged)}


async def test_a_read_after_a_write_it_heard_of_waits_for_the_commit_point(wire_store, primary):
    other = make_store(wire_settings(primary))  # another process
    primary.lagging = True
    writing = asyncio.ensure_future(other.add_session(session("s9")))  # applied, waiting for a majority
    await eventually(lambda: primary.sent("insert", "sessions"), what="the insert")
    await eventually(lambda: primary.clock > primary.committed, what="the insert applied")
    wire_store.clock.seen(Timestamp(1_700_000_000, primary.clock))  # as the relay's change event tells it
    reading = asyncio.ensure_future(wire_store.get_session("s9"))
    await eventually(lambda: primary.sent("find", "sessions"), what="the read")
    assert not reading.done()  # the server holds it until the commit point reaches the write
    primary.catch_up()
    assert (await reading).session_hash == "s9"
    await writing
    await other.close()


async def test_a_write_conflict_is_run_again_as_its_label_says(wire_store, primary):
    """Two rotations of one family commit one after the other; the loser meets a write conflict
    (112, TransientTransactionError: nothing applied) and runs again, finding the family
    rotated already."""
    now = utcnow()
    grant = await wire_store.save_grant("webapp", ALICE, ["read"], now)
    await wire_store.create_family(Family("f1", grant.grant_id, "webapp", "u_alice", None, 0, ["read"], now, "r1",
                                          "a1", now, now + timedelta(hours=1), now + timedelta(minutes=10)))
    primary.script(Fault("findAndModify", "race", collection="families", code=112,
                         labels=("TransientTransactionError",), times=2))
    results = await asyncio.gather(wire_store.rotate_family("f1", "r1", pair("a"), now),
                                   wire_store.rotate_family("f1", "r1", pair("b"), now))
    assert sorted(result is None for result in results) == [False, True]  # exactly one rotated
    assert ("findAndModify", 112) in primary.refusals
    assert len(primary.sent("findAndModify", "families")) == 3  # the loser, once more
    family, _ = await wire_store.get_family("f1")
    assert family.rotations == 1


async def test_unique_index_races_between_processes_end_with_one_record(wire_store, primary):
    """Two processes seed one user (an upsert on the unique username: the loser is DuplicateKey)
    and save one grant (two inserts of one unique key) at the same moment: both succeed, with
    one record each."""
    other = make_store(wire_settings(primary))
    primary.script(Fault("findAndModify", "race", collection="users", code=11000, times=2),
                   Fault("insert", "race", collection="grants", times=2))
    seeded = await asyncio.gather(wire_store.seed_user(User("u_1", "alice", "scrypt$1"), utcnow()),
                                  other.seed_user(User("u_2", "alice", "scrypt$2"), utcnow()))
    assert seeded[0].user_id == seeded[1].user_id and ("findAndModify", 11000) in primary.refusals
    now = utcnow()
    grants = await asyncio.gather(wire_store.save_grant("webapp", ALICE, ["read"], now),
                                  other.save_grant("webapp", ALICE, ["read"], now))
    assert grants[0].grant_id == grants[1].grant_id
    assert primary.db["tokensvc"]["users"].count_documents({}) == 1
    assert primary.db["tokensvc"]["grants"].count_documents({}) == 1
    await other.close()


async def test_listings_come_in_batches_and_a_cursor_lost_meanwhile_is_read_again(wire_store, primary):
    primary.batch_size = 2
    now = utcnow()
    for index in range(5):
        await wire_store.put_client(Client(f"app{index}", "App", ["https://a/cb"], created_at=now))
    assert [client.client_id for client in await wire_store.list_clients()] == [f"app{i}" for i in range(5)]
    assert len(primary.sent("getMore")) == 2  # 2 + 2 + 1
    primary.forget()
    primary.script(Fault("getMore", "delay", seconds=0.3))
    listing = asyncio.ensure_future(wire_store.list_clients())
    await eventually(lambda: primary.sent("getMore"), what="the first getMore")
    primary.kill_cursors()  # the cursor is gone before the server reads on (a failover, a timeout)
    assert [client.client_id for client in await listing] == [f"app{i}" for i in range(5)]
    assert ("getMore", 43) in primary.refusals and len(primary.sent("aggregate", "clients")) == 2
