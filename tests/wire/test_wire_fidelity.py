"""The stand-in as a server: where the wire tier's replica set would otherwise be more forgiving
than MongoDB, and hide a bug of the store's. Change events shaped and projected as a server
does and sent only once majority-committed; majority reads from the majority snapshot;
retryable writes deduplicated as a server keeps them; cursors through a step-down and a
restart; rollback; the TTL monitor. Each shown with the real driver, and through the store
where the store meets it."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

import pytest
from bson import Int64
from helpers import DEADLINE, eventually, wait_until
from primary import Fault, ReplicaSet, wire_settings
from pymongo import MongoClient
from pymongo.errors import CursorNotFound, OperationFailure
from pymongo.read_concern import ReadConcern
from pymongo.server_type import SERVER_TYPE
from pymongo.write_concern import WriteConcern

from tokensvc.bootstrap import make_store
from tokensvc.records import AuthorizationCode, Session, utcnow
from tokensvc.storage.base import CODE_RETENTION_SECONDS, SESSION, Revocation, StorageError


@pytest.fixture
def client(primary):
    client = MongoClient(primary.uri(), serverSelectionTimeoutMS=10_000)
    yield client
    client.close()


def next_change(stream, seconds: float = DEADLINE) -> dict:
    """The stream's next event, asking the server again until one comes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        change = stream.try_next()
        if change is not None:
            return change
    raise AssertionError("no change event came")


def unacknowledged(collection):
    """``collection`` written with w: 1, acknowledged by the primary alone (the secondaries lag)."""
    return collection.with_options(write_concern=WriteConcern(w=1))


# -- change streams


def test_a_change_stream_sends_only_what_its_pipeline_lets_through_and_projects(client):
    db = client["t"]
    db.x.insert_one({"_id": 1, "a": 1})
    with db.watch([{"$match": {"operationType": "update"}},
                   {"$project": {"operationType": 1, "updateDescription.updatedFields.b": 1}}]) as stream:
        db.x.insert_one({"_id": 2})  # not an update: never sent
        db.x.update_one({"_id": 1}, {"$set": {"a": 2, "b": 3}})
        change = next_change(stream)
    assert change == {"_id": change["_id"], "operationType": "update", "updateDescription": {"updatedFields": {"b": 3}}}


def test_a_change_stream_sends_the_events_of_what_it_watches_alone(client):
    db = client["t"]
    with db.x.watch() as collection, db.watch() as database, client.watch() as cluster:
        db.y.insert_one({"_id": "y"})
        client["other"].x.insert_one({"_id": "other"})
        db.x.insert_one({"_id": "x"})
        assert next_change(collection)["documentKey"] == {"_id": "x"}
        assert [next_change(database)["documentKey"] for _ in range(2)] == [{"_id": "y"}, {"_id": "x"}]
        assert [next_change(cluster)["documentKey"] for _ in range(3)] == [{"_id": "y"}, {"_id": "other"},
                                                                           {"_id": "x"}]


def test_change_events_are_shaped_as_a_server_shapes_them(client):
    db = client["t"]
    db.x.insert_one({"_id": 1, "a": {"b": 1}, "c": 1, "same": 1, "tags": ["x"]})
    with db.watch() as stream:
        db.x.update_one({"_id": 1}, {"$set": {"a.b": 2, "d.e": 5, "same": 1}, "$unset": {"c": "", "absent": ""},
                                     "$push": {"tags": "y"}})
        db.x.update_one({"_id": 1}, {"$set": {"same": 1}})  # changes nothing: no event
        db.x.replace_one({"_id": 1}, {"z": 1})
        db.x.update_one({"_id": 2}, {"$set": {"k": 1}}, upsert=True)
        db.x.find_one_and_update({"_id": 3}, {"$set": {"k": 2}}, upsert=True)
        db.x.delete_one({"_id": 2})
        update, replace, upserted, made, deleted = (next_change(stream) for _ in range(5))
    assert list(update) == ["_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey",
                            "updateDescription"]
    assert update["operationType"] == "update" and update["documentKey"] == {"_id": 1}
    assert update["ns"] == {"db": "t", "coll": "x"} and isinstance(update["wallTime"], datetime)
    # The paths the operators named; a field set anew from its first new part; the unchanged left out.
    assert update["updateDescription"] == {"updatedFields": {"a.b": 2, "d": {"e": 5}, "tags.1": "y"},
                                           "removedFields": ["c"], "truncatedArrays": []}
    assert list(replace) == ["_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns", "documentKey"]
    assert replace["operationType"] == "replace" and replace["fullDocument"] == {"_id": 1, "z": 1}
    assert [upserted["operationType"], upserted["fullDocument"]] == ["insert", {"_id": 2, "k": 1}]
    assert [made["operationType"], made["fullDocument"]] == ["insert", {"_id": 3, "k": 2}]
    assert list(deleted) == ["_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey"]
    assert deleted["operationType"] == "delete" and deleted["documentKey"] == {"_id": 2}
    times = [change["clusterTime"] for change in (update, replace, upserted, made, deleted)]
    assert times == sorted(times) and len(set(times)) == 5  # each its own write's optime


def test_a_pipeline_that_changes_the_resume_token_ends_the_stream_and_other_stages_are_refused(client):
    db = client["t"]
    with pytest.raises(OperationFailure) as refused:
        db.watch([{"$group": {"_id": "$operationType"}}])
    assert refused.value.code == 20  # IllegalOperation
    with db.watch([{"$project": {"_id": 0, "operationType": 1}}]) as stream:
        db.x.insert_one({"_id": 1})
        with pytest.raises(OperationFailure) as ended:
            next_change(stream)
    assert ended.value.code == 280  # ChangeStreamFatalError: the stream could never resume


def test_a_change_event_waits_for_the_majority_commit_point(primary, client):
    db = client["t"]
    with db.watch(max_await_time_ms=100) as stream:
        primary.lagging = True
        unacknowledged(db.x).insert_one({"_id": 1})
        assert stream.try_next() is None  # applied on the primary alone: a failover could roll it back
        with db.watch(max_await_time_ms=100) as later:  # opened at the commit point, before the write
            unacknowledged(db.x).insert_one({"_id": 2})
            primary.catch_up()
            assert [next_change(stream)["documentKey"], next_change(stream)["documentKey"]] == [{"_id": 1}, {"_id": 2}]
            assert next_change(later)["documentKey"] == {"_id": 1}


@pytest.mark.gen_test
async def test_the_relay_hears_a_revocation_once_a_majority_holds_it(wire_store, primary):
    """Another process ends a session while the secondaries lag: its write applies on the
    primary, its write concern fails, and the relay hears nothing of it until a majority holds
    it; then it hears it, and the re-check reads it."""
    now = utcnow()
    await wire_store.add_session(Session("s1", "u_alice", now, now + timedelta(hours=1)))
    other = make_store(wire_settings(primary))
    feed = wire_store.revocation_feed()
    pending = asyncio.ensure_future(anext(feed))
    await eventually(lambda: wire_store.feed.resume_token is not None, what="the change stream open")
    primary.lagging = True
    primary.script(Fault("update", "write_concern_error", collection="sessions", code=64))
    with pytest.raises(StorageError, match="WTimeoutError"):
        await other.end_session("s1", utcnow())
    asked = len(primary.sent("getMore"))
    await eventually(lambda: len(primary.sent("getMore")) >= asked + 2, what="two answers more")
    assert not pending.done()
    assert await wire_store.get_session("s1") is not None  # and no read shows it either
    primary.catch_up()
    assert await asyncio.wait_for(pending, DEADLINE) == Revocation(SESSION, "s1")
    assert await wire_store.get_session("s1") is None
    await feed.aclose()
    await other.close()


# -- majority reads


def test_a_majority_read_answers_from_the_commit_point(primary, client):
    db = client["t"]
    db.x.insert_one({"_id": 1, "v": 1})
    primary.lagging = True
    unacknowledged(db.x).update_one({"_id": 1}, {"$set": {"v": 2}})
    unacknowledged(db.x).insert_one({"_id": 2})
    majority = db.get_collection("x", read_concern=ReadConcern("majority"))
    local = db.get_collection("x", read_concern=ReadConcern("local"))
    assert list(majority.find()) == [{"_id": 1, "v": 1}]
    assert majority.count_documents({}) == 1
    assert list(local.find()) == [{"_id": 1, "v": 2}, {"_id": 2}]
    primary.catch_up()
    assert list(majority.find()) == [{"_id": 1, "v": 2}, {"_id": 2}]


@pytest.mark.gen_test
async def test_the_store_decides_on_what_a_majority_holds_not_on_a_write_the_secondaries_lack(wire_store, primary):
    """Another process's write applied on the primary alone (its write concern failed) is not
    what this process reads: a failover could roll it back."""
    now = utcnow()
    await wire_store.add_session(Session("s1", "u_alice", now, now + timedelta(hours=1)))
    other = make_store(wire_settings(primary))
    primary.lagging = True
    primary.script(Fault("update", "write_concern_error", collection="sessions", code=64))
    with pytest.raises(StorageError):
        await other.end_session("s1", utcnow())
    assert primary.db["tokensvc"]["sessions"].count_documents({"ended_at": {"$ne": None}}) == 1  # the newest data
    assert await wire_store.get_session("s1") is not None
    primary.catch_up()
    assert await wire_store.get_session("s1") is None
    await other.close()


# -- retryable writes


def test_a_retry_runs_only_the_statements_not_executed_and_an_older_txn_number_is_refused(primary, client):
    db = client["t"]
    db.x.insert_one({"_id": 2, "in": "the way"})
    with client.start_session(causal_consistency=False) as session:
        insert = {"insert": "x", "documents": [{"_id": 1}, {"_id": 2}], "txnNumber": Int64(5)}
        first = db.command(insert, session=session)
        assert first["n"] == 1 and first["writeErrors"][0]["code"] == 11000
        db.x.delete_one({"_id": 2})
        again = db.command(insert, session=session)  # the first document from the record, the second run now
        assert again["n"] == 2 and "writeErrors" not in again
        assert db.command({"insert": "x", "documents": [{"_id": 3}], "txnNumber": Int64(6)}, session=session)["n"] == 1
        with pytest.raises(OperationFailure) as stale:
            db.command(insert, session=session)
    assert stale.value.code == 225  # TransactionTooOld
    assert sorted(document["_id"] for document in db.x.find()) == [1, 2, 3]
    inserted = [event["documentKey"]["_id"] for event in primary.streams.events if event["operationType"] == "insert"]
    assert inserted.count(1) == 1


def test_a_retry_answered_from_its_record_waits_for_its_write_concern_again(primary, client):
    db = client["t"]
    insert = {"insert": "x", "documents": [{"_id": 1}], "txnNumber": Int64(1),
              "writeConcern": {"w": "majority", "wtimeout": 100}}
    with client.start_session(causal_consistency=False) as session:
        primary.lagging = True
        first = db.command(insert, session=session)
        assert first["n"] == 1 and first["writeConcernError"]["code"] == 64  # applied, not replicated
        primary.catch_up()
        again = db.command(insert, session=session)
        assert again["n"] == 1 and "writeConcernError" not in again  # from its record, and a majority holds it
    assert db.x.count_documents({}) == 1


# -- cursors


def restarted(replica_set: ReplicaSet, client: MongoClient, index: int) -> None:
    """Member ``index``'s process killed and started again, and the driver back on it."""
    address = tuple(replica_set.members[index].address.split(":"))
    address = (address[0], int(address[1]))
    replica_set.set_down(index)
    wait_until(lambda: client.topology_description.server_descriptions()[address].server_type == SERVER_TYPE.Unknown,
               "the driver seeing the member go", DEADLINE, interval=0.01)
    replica_set.set_down(index, down=False)
    client.admin.command("ping")


def test_a_cursor_outlives_a_step_down_and_not_its_members_restart():
    replica_set = ReplicaSet(size=2, batch_size=2).start()
    client = MongoClient(replica_set.uri(), serverSelectionTimeoutMS=10_000)
    try:
        db = client["t"]
        db.x.insert_many([{"_id": index} for index in range(6)])
        cursor = db.x.find(batch_size=2)
        assert [next(cursor)["_id"] for _ in range(2)] == [0, 1]
        replica_set.step_down(after=None)  # no primary: the cursor's member is a secondary now
        assert [document["_id"] for document in cursor] == [2, 3, 4, 5]
        assert not [refusal for refusal in replica_set.refusals if refusal[0] == "getMore"]
        replica_set.elect(0)
        cursor = db.x.find(batch_size=2)
        assert [next(cursor)["_id"] for _ in range(2)] == [0, 1]
        restarted(replica_set, client, 0)
        with pytest.raises(CursorNotFound):
            list(cursor)
    finally:
        client.close()
        replica_set.stop()


def test_a_change_stream_resumes_where_it_stood_after_its_members_restart(primary, client):
    db = client["t"]
    with db.watch() as stream:
        db.x.insert_one({"_id": "a"})
        assert next_change(stream)["documentKey"] == {"_id": "a"}
        restarted(primary, client, 0)
        db.x.insert_one({"_id": "b"})
        assert next_change(stream)["documentKey"] == {"_id": "b"}
    opened = [doc["pipeline"][0]["$changeStream"] for doc in primary.sent("aggregate")]
    assert len(opened) == 2 and "resumeAfter" in opened[1]  # CursorNotFound: the driver resumed
    assert ("getMore", 43) in primary.refusals


# -- rollback


@pytest.mark.gen_test(timeout=30)
async def test_a_write_an_election_rolls_back_is_applied_once_by_the_drivers_retry():
    """The primary applies a session's end, then steps down before a secondary has it: the
    member elected never had it, so it is rolled back; the driver's retry (the write concern
    interrupted, 189, labelled) runs it on the new primary, once. The relay hears of it once."""
    replica_set = ReplicaSet(size=2).start()
    store = make_store(wire_settings(replica_set))
    try:
        await store.open()
        now = utcnow()
        for session_id in ("s1", "s2"):
            await store.add_session(Session(session_id, "u_alice", now, now + timedelta(hours=1)))
        feed = store.revocation_feed()
        heard = []

        async def listen():
            async for revocation in feed:
                heard.append(revocation)

        listening = asyncio.ensure_future(listen())
        await eventually(lambda: store.feed.resume_token is not None, what="the change stream open")
        replica_set.lagging = True
        ending = asyncio.ensure_future(store.end_session("s1", utcnow()))
        await eventually(lambda: replica_set.clock > replica_set.committed, what="the end applied on the primary alone")
        replica_set.step_down(after=None)
        await eventually(lambda: ("update", 189) in replica_set.refusals, what="its write concern interrupted")
        replica_set.elect(1)
        replica_set.catch_up()
        assert await ending is True
        assert replica_set.rollbacks == 1
        sent = replica_set.sent("update", "sessions")
        assert len(sent) == 2 and sent[0]["txnNumber"] == sent[1]["txnNumber"]
        assert await store.end_session("s2", utcnow())
        await eventually(lambda: Revocation(SESSION, "s2") in heard, what="the revocation after it")
        assert heard == [Revocation(SESSION, "s1"), Revocation(SESSION, "s2")]
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
    finally:
        await store.close()
        replica_set.stop()


# -- the TTL monitor


@pytest.mark.gen_test
async def test_the_ttl_monitor_deletes_what_expired_keeps_a_spent_code_its_retention_and_revokes_nothing(
        wire_store, primary):
    now = utcnow()
    await wire_store.add_code(AuthorizationCode("c1", "webapp", "https://a/cb", ["read"], "u_alice", None, "x" * 43,
                                                "S256", now - timedelta(minutes=1)))
    assert await wire_store.consume_code("c1", now) is not None
    await wire_store.add_session(Session("old", "u_alice", now - timedelta(hours=2), now - timedelta(hours=1)))
    await wire_store.add_session(Session("s1", "u_alice", now, now + timedelta(hours=1)))
    feed = wire_store.revocation_feed()
    pending = asyncio.ensure_future(anext(feed))
    await eventually(lambda: wire_store.feed.resume_token is not None, what="the change stream open")
    assert primary.expire() == 1  # the expired session; the spent code is kept for its replay
    assert (await wire_store.get_code("c1")).consumed_at is not None
    assert primary.db["tokensvc"]["sessions"].count_documents({}) == 1
    assert [event["ns"]["coll"] for event in primary.streams.events if event["operationType"] == "delete"] == [
        "sessions"]
    await wire_store.end_session("s1", utcnow())
    assert await asyncio.wait_for(pending, DEADLINE) == Revocation(SESSION, "s1")  # the delete revoked nothing
    assert primary.expire(now + timedelta(seconds=CODE_RETENTION_SECONDS, minutes=1)) == 2  # the code, and s1
    assert await wire_store.get_code("c1") is None
    await feed.aclose()
