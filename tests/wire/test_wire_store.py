"""What the real driver sends for the store's operations, and how the store meets the faults
a replica set shows: lost replies, dropped connections, retryable errors that do not stop,
a server that does not answer, a client closed under a request."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from bson import Timestamp
from helpers import eventually
from primary import BUDGET_MS, Fault, wire_settings

from tokensvc.bootstrap import make_store
from tokensvc.oauth import hashing
from tokensvc.records import AuthorizationCode, Client, Family, Pair, Session, Subject, User, utcnow
from tokensvc.storage.base import Conflict, StorageError
from tokensvc.storage.mongo import ONCE, READ, RERUN, RETRY_KINDS, STEPS, MongoStore
from tokensvc.storage.mongo.indexes import CASELESS

pytestmark = pytest.mark.gen_test

ALICE = Subject(user_id="u_alice")
WRITES = ("insert", "update", "delete", "findAndModify")
READS = ("find", "aggregate", "count")


def code(now, code_hash="c1"):
    return AuthorizationCode(code_hash, "webapp", "https://a/cb", ["read"], "u_alice", None, "x" * 43, "S256",
                             now + timedelta(minutes=5))


def family(now, grant_id, family_id="f1"):
    return Family(family_id, grant_id, "webapp", "u_alice", None, 0, ["read"], now, "r" + family_id,
                  "a" + family_id, now, now + timedelta(hours=1), now + timedelta(minutes=10), renewed_at=now)


async def every_operation(store: MongoStore) -> None:
    """Each operation of the Store contract once, as the service runs them."""
    now = utcnow()
    await store.put_client(Client("webapp", "Web", ["https://a/cb"], created_at=now))
    await store.get_client("webapp")
    await store.list_clients(None, 10)
    await store.put_user(User("u_alice", "alice", "scrypt$x"))
    await store.seed_user(User("u_bob", "bob", "scrypt$y"), now)
    await store.get_user("u_alice")
    await store.get_user_by_username("alice")
    await store.list_users()
    grant = await store.save_grant("webapp", ALICE, ["read"], now)
    await store.get_grant(grant.grant_id)
    await store.find_grant("webapp", ALICE)
    await store.list_grants(ALICE)
    await store.list_client_grants("webapp", None, 10)
    await store.add_code(code(now))
    await store.get_code("c1")
    await store.consume_code("c1", now, family_id="f1")
    await store.create_family(family(now, grant.grant_id))
    await store.get_family("f1")
    await store.find_access("af1")
    await store.mark_access_used("f1", "af1", now)
    await store.list_families(grant.grant_id)
    await store.revoke_access("f1", "af1", now)
    await store.revoke_family("f1", now)
    await store.add_session(Session("s1", "u_alice", now, now + timedelta(hours=1)))
    await store.get_session("s1")
    await store.touch_session("s1", now)
    await store.list_user_sessions("u_alice", now)
    await store.end_session("s1", now)
    await store.end_user_sessions("u_alice", now)
    await store.failure_counts().count_attempt("client|127.0.0.1", ["address"], 300)
    await store.failure_counts().read_counts("client|127.0.0.1", ["address"])
    await store.failure_counts().uncount_attempt("client|127.0.0.1", ["address"], [])
    await store.mark_grant_revoked(grant.grant_id, now)
    await store.revoke_grant_families(grant.grant_id, now)
    await store.revoke_client_grants("webapp", now, 10)
    removal = await store.begin_removal("webapp", now, "tag")
    await store.mark_removal("webapp", now)
    await store.get_removal("webapp")
    await store.list_removals()
    await store.withdraw_client(removal)
    await store.end_removal(removal)
    await store.purge_expired(now)
    await store.ping()


async def test_every_operation_sends_what_the_design_promises(wire_store, primary):
    await every_operation(wire_store)
    commands = [(name, doc) for name, doc in primary.commands if name in WRITES + READS]
    assert {name for name, _ in commands} == set(WRITES + READS) - {"count"}
    for name, doc in commands:
        assert doc.get("$readPreference", {"mode": "primary"})["mode"] == "primary", (name, doc)
        if name in WRITES:
            # Every write waits for a journaled majority, for at most the budget.
            assert doc["writeConcern"] == {"w": "majority", "j": True, "wtimeout": BUDGET_MS}, (name, doc)
            multi = any(spec.get("multi") for spec in doc.get("updates", [])) or any(
                spec.get("limit") == 0 for spec in doc.get("deletes", []))
            # A single-document write carries its txnNumber (a retry is applied once); the driver
            # never makes a multi-document write retryable: the store runs those again itself.
            assert ("txnNumber" in doc) is not multi, (name, doc)
        else:
            # A majority read, after every write acknowledged before it (the first write came first).
            assert doc["readConcern"]["level"] == "majority", (name, doc)
            assert doc["readConcern"]["afterClusterTime"] is not None, (name, doc)
            assert 0 < doc["maxTimeMS"] <= BUDGET_MS, (name, doc)


async def test_a_read_waits_for_every_write_acknowledged_before_it_whichever_request_made_it(wire_store, primary):
    """A primary elected a moment ago may not yet hold the last acknowledged revocation in its
    majority snapshot: every read names the latest operation time this process has seen, and
    the server waits until it holds it (causal consistency), across requests and tasks."""
    now = utcnow()
    await wire_store.add_session(Session("s1", "u_alice", now, now + timedelta(hours=1)))
    await asyncio.create_task(wire_store.end_session("s1", now))  # another request, another task
    ended_at = primary.clock
    primary.forget()
    assert await wire_store.get_session("s1") is None  # ended
    read = primary.sent("find", "sessions")[0]
    assert read["readConcern"] == {"level": "majority", "afterClusterTime": Timestamp(1_700_000_000, ended_at)}
    # Reads carry the time forward too, and a time never goes back.
    await wire_store.get_client("webapp")
    assert primary.sent("aggregate", "clients")[0]["readConcern"]["afterClusterTime"] == Timestamp(1_700_000_000,
                                                                                             ended_at)


async def test_a_lost_reply_is_retried_with_the_same_txn_number_and_applied_once(wire_store, primary):
    now = utcnow()
    await wire_store.add_code(code(now))
    primary.script(Fault("findAndModify", "hangup_after", collection="codes"))
    consumed = await wire_store.consume_code("c1", now, family_id="f1")
    # The answer is the first attempt's: the code as it was before this consumption.
    assert consumed is not None and consumed.consumed_at is None
    sent = primary.sent("findAndModify", "codes")
    assert len(sent) == 2 and sent[0]["txnNumber"] == sent[1]["txnNumber"]
    assert sent[0]["lsid"] == sent[1]["lsid"]
    assert (await wire_store.get_code("c1")).family_id == "f1"


async def test_multi_document_writes_are_run_again_after_a_dropped_connection(wire_store, primary):
    now = utcnow()
    for index in range(3):
        await wire_store.add_session(Session(f"s{index}", "u_alice", now, now + timedelta(hours=1)))
    primary.script(Fault("update", "hangup", collection="sessions", times=2))
    assert await wire_store.end_user_sessions("u_alice", now) == 3
    assert len(primary.sent("update", "sessions")) == 3
    for collection, operation, run in (
            ("families", "update", lambda: wire_store.revoke_grant_families("g1", now)),
            ("codes", "delete", lambda: wire_store.purge_expired(now)),
            ("grants", "update", lambda: wire_store.revoke_client_grants("webapp", now, 10))):
        primary.script(Fault(operation, "hangup", collection=collection))
        await run()  # no StorageError: run again, and the sweep is the same sweep


async def test_retryable_errors_that_do_not_stop_are_tried_with_backoff_not_back_to_back(wire_store, primary):
    primary.script(Fault("aggregate", "error", collection="clients", code=262, labels=("RetryableWriteError",),
                         times=100_000),
                   Fault("update", "error", collection="clients", code=6, labels=("RetryableWriteError",),
                         times=100_000),
                   Fault("findAndModify", "error", collection="codes", code=134, labels=("RetryableWriteError",),
                         times=100_000))
    for operation in (lambda: wire_store.get_client("webapp"),
                      lambda: wire_store.put_client(Client("webapp", "Web", ["https://a/cb"])),
                      lambda: wire_store.consume_code("c1", utcnow())):
        started = time.monotonic()
        with pytest.raises(StorageError):
            await operation()
        assert time.monotonic() - started <= BUDGET_MS / 1000 + 0.5  # never past the budget
    # A storm sends thousands. Full jitter may draw short waits, and each store attempt of a
    # write is two commands (the driver's own retry): tens at the most within the budget.
    assert 2 <= len(primary.sent("aggregate", "clients")) <= 40
    assert 2 <= len(primary.sent("update", "clients")) <= 60
    assert len(primary.sent("findAndModify", "codes")) == 2  # a one-document write: the driver's one retry


async def test_an_operation_never_outlasts_its_budget_and_the_store_recovers(wire_store, primary):
    primary.script(Fault("aggregate", "delay", collection="clients", seconds=BUDGET_MS / 1000 + 2))
    started = time.monotonic()
    with pytest.raises(StorageError, match="no answer within"):
        await wire_store.get_client("webapp")
    assert time.monotonic() - started < BUDGET_MS / 1000 + 0.5
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"]))
    assert (await wire_store.get_client("webapp")).name == "Web"


async def test_a_request_under_a_closed_client_is_a_storage_error(primary):
    store = make_store(wire_settings(primary))
    await store.ping()
    await store.close()
    with pytest.raises(StorageError):  # InvalidOperation: the service is stopping; 503, never 500
        await store.get_client("webapp")


async def test_an_srv_name_that_does_not_resolve_is_transient():
    store = make_store(wire_settings_for("mongodb+srv://cluster0.no-such-name.invalid/", 500))
    started = time.monotonic()
    with pytest.raises(StorageError):
        await store.ping()
    assert time.monotonic() - started < 5
    await store.close()


def wire_settings_for(uri: str, timeout_ms: int):
    from tokensvc.config import StorageSettings

    return StorageSettings(backend="mongodb", mongodb_uri=uri, database="tokensvc", timeout_ms=timeout_ms)


async def test_writes_from_concurrent_requests_go_on_while_one_waits(wire_store, primary):
    """A slow answer holds up its own connection only."""
    primary.script(Fault("find", "delay", collection="users", seconds=1.0))
    slow = asyncio.ensure_future(wire_store.get_user("u_slow"))
    started = time.monotonic()
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"]))
    assert time.monotonic() - started < 0.5
    assert await slow is None


async def test_the_store_reports_its_work_as_metrics(wire_store, primary):
    from tokensvc.bootstrap import StoreMetrics
    from tokensvc.telemetry.metrics import Metrics

    metrics = Metrics()
    wire_store.observer = StoreMetrics(metrics)
    await wire_store.get_client("webapp")
    primary.script(Fault("find", "error", collection="users", code=262, labels=("RetryableWriteError",), times=2))
    await wire_store.get_user("u_alice")
    text = metrics.render().decode()
    assert 'tokensvc_store_operation_seconds_count{operation="get_client"} 1.0' in text
    assert 'tokensvc_store_attempt_errors_total{code="262",operation="get_user"} 2.0' in text
    assert 'tokensvc_store_retries_total{operation="get_user"} 2.0' in text
    assert "tokensvc_store_pool_wait_seconds_count" in text
    assert "tokensvc_store_pool_checked_out 0.0" in text  # every connection back in the pool


async def test_hashes_are_stored_as_their_32_bytes_and_found_by_them(wire_store, primary):
    """Every hash of a secret is a SHA-256 digest: stored as 32 bytes, not 64 hex characters,
    in the document and in the indexes on it; the records still hold hex."""
    now = utcnow()
    secret = {name: hashing.digest(name) for name in ("code", "family", "refresh", "access", "session", "next")}
    await wire_store.add_code(code(now, secret["code"]))
    await wire_store.add_session(Session(secret["session"], "u_alice", now, now + timedelta(hours=1)))
    grant = await wire_store.save_grant("webapp", ALICE, ["read"], now)
    await wire_store.create_family(replace(family(now, grant.grant_id, secret["family"]),
                                           refresh_hash=secret["refresh"], access_hash=secret["access"]))
    assert (await wire_store.consume_code(secret["code"], now, family_id=secret["family"])) is not None
    db = primary.db["tokensvc"]
    stored = (db["codes"].find_one()["_id"], db["codes"].find_one()["family_id"], db["sessions"].find_one()["_id"],
              db["families"].find_one()["_id"], db["families"].find_one()["refresh_hash"],
              db["families"].find_one()["access_hash"])
    assert all(isinstance(value, bytes) and len(value) == 32 for value in stored), stored
    redeemed = await wire_store.get_code(secret["code"])
    assert (redeemed.code_hash, redeemed.family_id) == (secret["code"], secret["family"])
    assert (await wire_store.get_session(secret["session"])).session_hash == secret["session"]
    found, _ = await wire_store.find_access(secret["access"])
    assert (found.family_id, found.refresh_hash, found.access_hash) == (secret["family"], secret["refresh"],
                                                                        secret["access"])
    assert (await wire_store.get_family(secret["family"]))[0] == found
    pair = Pair(hashing.digest("next access"), secret["next"], ["read"], now, now + timedelta(hours=1),
                now + timedelta(minutes=10))
    rotated = await wire_store.rotate_family(secret["family"], secret["refresh"], pair, now)
    assert rotated.previous_hash == secret["refresh"] and rotated.refresh_hash == secret["next"]
    assert isinstance(db["families"].find_one()["previous_hash"], bytes)
    await wire_store.mark_access_used(secret["family"], pair.access_hash, now)
    assert (await wire_store.get_family(secret["family"]))[0].access_used_at is not None
    assert await wire_store.revoke_access(secret["family"], pair.access_hash, now) is True
    assert await wire_store.revoke_family(secret["family"], now) is True
    assert await wire_store.end_session(secret["session"], now) is True


async def test_a_sweep_run_again_after_its_reply_was_lost_reports_what_the_store_holds_after_it(wire_store, primary):
    """The sweep applied, its reply lost: run again, it changes nothing, yet it reports what it
    revoked (the announcement to this process's sockets depends on it)."""
    now = utcnow()
    for index in range(3):
        await wire_store.add_session(Session(f"s{index}", "u_alice", now, now + timedelta(hours=1)))
    grant = await wire_store.save_grant("webapp", ALICE, ["read"], now)
    for index in range(2):
        await wire_store.create_family(family(now, grant.grant_id, f"f{index}"))
    primary.script(Fault("update", "hangup_after", collection="sessions"),
                   Fault("update", "hangup_after", collection="families"))
    assert await wire_store.end_user_sessions("u_alice", now) == 3
    assert await wire_store.revoke_grant_families(grant.grant_id, now) == 2
    assert len(primary.sent("update", "sessions")) == len(primary.sent("update", "families")) == 2  # run again


async def test_a_mark_run_again_after_its_reply_was_lost_reports_its_own_effect(wire_store, primary):
    """A second holder's mark applied, its reply lost (the driver's retry's too), run again: it
    finds nothing to do, yet reports what the first run did (the mark is audited once); a mark
    holding another call's moment is not claimed. A delete run again so is done all the same."""
    now = utcnow()
    grant = await wire_store.save_grant("webapp", ALICE, ["read"], now)
    await wire_store.create_family(family(now, grant.grant_id))
    await wire_store.create_family(family(now, grant.grant_id, "f2"))
    await wire_store.put_user(User("u_alice", "alice", "scrypt$x"))
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"], created_at=now))
    removal = await wire_store.begin_removal("webapp", now, "tag")
    primary.forget()
    primary.script(Fault("update", "hangup_after", collection="families", times=2),
                   Fault("delete", "hangup_after", collection="users", times=2),
                   Fault("delete", "hangup_after", collection="clients", times=2))
    assert await wire_store.mark_second_holder("f1", now) is True
    await wire_store.delete_user("u_alice")
    await wire_store.withdraw_client(removal)
    assert all(fault.hits == 2 for fault in primary.faults), primary.faults
    assert len(primary.sent("update", "families")) == 3  # run again by the store
    assert await wire_store.get_user("u_alice") is None
    assert primary.db["tokensvc"]["clients"].count_documents({}) == 0
    assert (await wire_store.get_family("f1"))[0].second_holder_at is not None
    # Without a lost reply nothing is claimed: the mark stays the first one's.
    assert await wire_store.mark_second_holder("f1", now + timedelta(seconds=1)) is False
    await wire_store.db["families"].update_one({"_id": "f2"}, {"$set": {"second_holder_at": now}})
    primary.script(Fault("update", "hangup_after", collection="families", times=2))
    assert await wire_store.mark_second_holder("f2", now + timedelta(seconds=1)) is False


async def test_a_removal_whose_every_reply_is_lost_happens_whole_and_once(wire_store, primary, caplog):
    """Every step of a client's removal applied by the server with its reply lost (the record,
    the document's deletion, the families' sweep, the grants', the record's end): each is run
    again or deduplicated, and the removal ends whole: the client gone, every grant and family
    of it revoked, each grant counted once, the record gone. The record's write, run again,
    still knows it made the record: the removal's start is audited."""
    from tokensvc.oauth import removal

    now = utcnow()
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"], created_at=now))
    grant_ids = []
    for index in range(3):
        grant = await wire_store.save_grant("webapp", Subject(user_id=f"u_{index}"), ["read"], now)
        await wire_store.create_family(replace(family(now, grant.grant_id, f"f{index}"), user_id=f"u_{index}"))
        grant_ids.append(grant.grant_id)
    primary.forget()
    primary.script(Fault("findAndModify", "hangup_after", collection="removals"),
                   Fault("delete", "hangup_after", collection="clients"),
                   Fault("update", "hangup_after", collection="families"),
                   Fault("update", "hangup_after", collection="grants"),
                   Fault("delete", "hangup_after", collection="removals"))
    with caplog.at_level(logging.INFO, "tokensvc.audit"):
        assert await removal.remove_client(wire_store, "webapp", lambda: now) == 3
    assert all(fault.hits == 1 for fault in primary.faults), primary.faults  # every reply was lost once
    assert [record.audit["event"] for record in caplog.records if record.name == "tokensvc.audit"] == [
        "client_removal_started", "client_removed"]
    assert await wire_store.get_client("webapp") is None and await wire_store.get_removal("webapp") is None
    assert await wire_store.list_client_grants("webapp") == []
    for grant_id in grant_ids:
        assert (await wire_store.get_grant(grant_id)).revoked_at is not None
        assert await wire_store.list_families(grant_id) == []
    assert primary.db["tokensvc"]["clients"].count_documents({}) == 0


async def test_a_removals_last_step_run_again_after_a_lost_reply_keeps_a_client_registered_in_between(
        wire_store, primary):
    """The record's deletion, the last step of a removal, applied with its reply lost (and the
    driver's retry's too): the id is free, and a client is registered under it before the store
    runs the step again. The run again deletes nothing of it: the client registered stays, with
    the secret its registration answered (it was deleted, 201 and then 404)."""
    from tokensvc.oauth import removal

    now = utcnow()
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"], created_at=now))
    recorded = await wire_store.begin_removal("webapp", now, "tag")
    await wire_store.withdraw_client(recorded)
    primary.forget()
    # The document's deletion goes through; the record's is applied and its reply lost, twice;
    # a deletion of the document after that waits until the client is registered.
    held = Fault("delete", "hold", collection="clients")
    primary.script(Fault("delete", "delay", collection="clients"),
                   Fault("delete", "hangup_after", collection="removals", times=2), held)
    ending = asyncio.ensure_future(wire_store.end_removal(recorded))
    try:
        await eventually(lambda: len(primary.sent("delete", "removals")) >= 2, what="the record's end, its reply lost")
        assert primary.db["tokensvc"]["removals"].count_documents({}) == 0  # applied: the id is free
        registered = Client("webapp", "Web again", ["https://a/cb"], secret_hash="b" * 64, created_at=utcnow())
        await removal.register(wire_store, registered, registered.created_at)  # 201, and its secret
    finally:
        primary.release(held)
    await ending
    assert await wire_store.get_client("webapp") == registered


async def test_a_registration_while_a_removals_last_step_runs_again_is_refused_and_leaves_nothing(
        wire_store, primary):
    """The last step of a removal runs again after the previous secret's deletion lost its
    reply (and the driver's retry's); the client's document is gone and the record is there.
    A registration of the id landing then is refused, and takes back what it inserted: nothing
    of it is left for the run again to delete after a 201 (it was: 201 and a secret, then 404).
    Once the removal ends, the id is registered again."""
    from tokensvc.oauth import removal

    now = utcnow()
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"], created_at=now))
    recorded = await wire_store.begin_removal("webapp", now, "tag")
    primary.forget()
    deletions = itertools.count(1)
    held = Fault("delete", "hold", collection="clients", when=lambda doc: next(deletions) >= 2)
    primary.script(Fault("delete", "hangup_after", collection="previous_secrets", times=2), held)
    ending = asyncio.ensure_future(wire_store.end_removal(recorded))
    try:
        await eventually(lambda: held.hits >= 1, what="the run again's deletion of the document, held")
        assert primary.db["tokensvc"]["clients"].count_documents({}) == 0
        registered = Client("webapp", "Web again", ["https://a/cb"], secret_hash="b" * 64, created_at=utcnow())
        with pytest.raises(Conflict):
            await removal.register(wire_store, registered, registered.created_at)
        assert primary.db["tokensvc"]["clients"].count_documents({}) == 0
    finally:
        primary.release(held)
    await ending
    assert primary.db["tokensvc"]["removals"].count_documents({}) == 0
    await removal.register(wire_store, registered, registered.created_at)
    assert await wire_store.get_client("webapp") == registered


async def test_a_registration_that_finds_the_removal_ended_keeps_its_client_whatever_the_last_step_ran(
        wire_store, primary):
    """A registration inserts its document while the removal is recorded, and looks for the
    removal only after the removal's last step ran, twice (the previous secret's deletion lost
    its reply), and ended: the registration stands (201), and its client is there."""
    from tokensvc.oauth import removal

    now = utcnow()
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"], created_at=now))
    recorded = await wire_store.begin_removal("webapp", now, "tag")
    await wire_store.withdraw_client(recorded)
    primary.forget()
    looked = Fault("find", "hold", collection="removals")
    primary.script(looked, Fault("delete", "hangup_after", collection="previous_secrets", times=2))
    registered = Client("webapp", "Web again", ["https://a/cb"], secret_hash="b" * 64, created_at=utcnow())
    registering = asyncio.ensure_future(removal.register(wire_store, registered, registered.created_at))
    try:
        await eventually(lambda: looked.hits >= 1, what="the registration's look for a removal, held")
        assert primary.db["tokensvc"]["clients"].count_documents({}) == 1  # inserted, under the record
        await wire_store.end_removal(recorded)
        assert len(primary.sent("delete", "previous_secrets")) >= 3  # the last step ran again
        assert primary.db["tokensvc"]["removals"].count_documents({}) == 0
    finally:
        primary.release(looked)
    await registering
    assert await wire_store.get_client("webapp") == registered


async def test_a_username_is_looked_up_in_one_read_through_an_index_whatever_its_case(wire_store, primary):
    """A username in any case (a name release 0.9.0 stored with capitals, typed otherwise), or one
    no user has (a typo, a guess at sign-in), is one read of the users, an equality on the
    username under the caseless collation, which the caseless index serves: never a
    case-insensitive regex, which reads the whole username index, and never a second read."""
    await wire_store.put_user(User("u_carol", "Carol", "scrypt$x"))  # as release 0.9.0 stored it
    await wire_store.put_user(User("u_dave", "dave", "scrypt$y"))
    indexes = await wire_store.db["users"].index_information()
    assert indexes["username_caseless"]["collation"] == CASELESS and not indexes["username_caseless"].get("unique")
    for typed, found in (("CAROL", "u_carol"), ("Carol", "u_carol"), ("Dave", "u_dave"), ("nobody", None)):
        primary.forget()
        user = await wire_store.get_user_by_username(typed)
        assert (user.user_id if user else None) == found
        reads = primary.sent("find", "users") + primary.sent("aggregate", "users")
        assert len(reads) == 1, reads
        assert reads[0]["collation"] == CASELESS and "$regex" not in str(reads[0]["filter"]), reads[0]
        assert set(reads[0]["filter"]) == {"username"}


async def test_expired_previous_secrets_forgotten_before_a_failure_are_each_told(wire_store, primary, caplog):
    """Two previous secrets are expired, and the store refuses to forget the second: the first,
    forgotten, is told (audited) all the same, and the second once the store takes it. Forgotten
    in one batch, a failure midway told none of those it had forgotten."""
    from tokensvc.oauth import clientauth
    from tokensvc.records import PreviousSecret
    from tokensvc.storage.base import StoreFault

    now = utcnow()
    for index, client_id in enumerate(("c1", "c2")):
        await wire_store.put_previous_secret(PreviousSecret(client_id, "a" * 64, "b" * 64, now - timedelta(hours=1),
                                                            now - timedelta(minutes=2 - index)))
    primary.script(Fault("findAndModify", "delay", collection="previous_secrets"),
                   Fault("findAndModify", "error", collection="previous_secrets", code=2))  # BadValue

    def told():
        return [record.audit["client_id"] for record in caplog.records if record.name == "tokensvc.audit"
                and record.audit["event"] == "client_previous_secret_expired"]

    with caplog.at_level(logging.INFO, "tokensvc.audit"):
        with pytest.raises(StoreFault):
            await clientauth.expire_previous_secrets(wire_store, now)
        assert told() == ["c1"] and await wire_store.get_previous_secret("c1") is None
        assert await clientauth.expire_previous_secrets(wire_store, now) == 1
    assert told() == ["c1", "c2"] and await wire_store.get_previous_secret("c2") is None


async def test_a_removal_the_store_stops_midway_is_carried_on_by_a_retry(wire_store, primary):
    """The server refuses the families' sweep until the budget runs out: the removal stops
    with StorageError after its record (the client already gone), and the same removal again
    finishes it."""
    from tokensvc.oauth import removal

    now = utcnow()
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"], created_at=now))
    grant = await wire_store.save_grant("webapp", ALICE, ["read"], now)
    await wire_store.create_family(family(now, grant.grant_id))
    primary.script(Fault("update", "error", collection="families", code=262, labels=("RetryableWriteError",),
                         times=100_000))
    with pytest.raises(StorageError):
        await removal.remove_client(wire_store, "webapp", lambda: now)
    assert await wire_store.get_removal("webapp") is not None and await wire_store.get_client("webapp") is None
    assert [g.grant_id for g in await wire_store.list_client_grants("webapp")] == [grant.grant_id]
    with primary.lock:  # the server answers again
        primary.faults.clear()
    assert await removal.remove_client(wire_store, "webapp", lambda: now) == 1
    assert await wire_store.get_removal("webapp") is None and await wire_store.list_families(grant.grant_id) == []


# One operation of each retry kind (mongo.RETRY_KINDS), each meeting a lost reply: the server
# applied the command and the connection closed before its answer came.
REPRESENTATIVES = {ONCE: "count_attempt", RERUN: "put_client", READ: "get_grant", STEPS: "put_user"}


def test_each_retry_kind_has_its_lost_reply_test_below():
    assert set(REPRESENTATIVES) == set(RETRY_KINDS.values())
    assert all(RETRY_KINDS[name] == kind for kind, name in REPRESENTATIVES.items())


async def test_a_write_run_once_whose_replies_are_all_lost_fails_and_is_applied_once(wire_store, primary):
    """ONCE: a write that, applied twice, does something else (here an attempt counted twice).
    The driver's one retry carries the same txnNumber, which the server applies at most once;
    when its reply is lost too, the store does not run the write again: 503, counted once."""
    counts = wire_store.failure_counts()
    assert (await counts.count_attempt("login|127.0.0.1", ["address"], 300))[0] == [1]  # the window
    primary.forget()
    primary.script(Fault("findAndModify", "hangup_after", collection="failures", times=2))
    with pytest.raises(StorageError):
        await counts.count_attempt("login|127.0.0.1", ["address"], 300)
    sent = primary.sent("findAndModify", "failures")
    assert len(sent) == 2 and sent[0]["txnNumber"] == sent[1]["txnNumber"]
    assert (await counts.read_counts("login|127.0.0.1", ["address"]))[0] == [2]


async def test_a_claim_whose_reply_is_lost_registers_the_client_and_is_no_false_conflict(wire_store, primary):
    """add_client (ONCE): the insert applied and its reply lost, the driver's retry carries the
    same txnNumber and the server answers it as applied: no duplicate key, the client is there."""
    client = Client("twin", "Twin", ["https://a/cb"], created_at=utcnow())
    primary.script(Fault("insert", "hangup_after", collection="clients"))
    await wire_store.add_client(client)
    sent = primary.sent("insert", "clients")
    assert len(sent) == 2 and sent[0]["txnNumber"] == sent[1]["txnNumber"]
    assert (await wire_store.get_client("twin")).name == "Twin"
    with pytest.raises(Conflict):  # another registration of the id: refused
        await wire_store.add_client(client)


async def test_an_idempotent_write_whose_replies_are_all_lost_is_run_again_and_succeeds(wire_store, primary):
    """RERUN: a write whose second application changes nothing more (an upsert of the whole
    client). After the driver's retry's reply is lost too, the store runs it again."""
    now = utcnow()
    primary.script(Fault("update", "hangup_after", collection="clients", times=2))
    await wire_store.put_client(Client("webapp", "Web", ["https://a/cb"], created_at=now))
    sent = primary.sent("update", "clients")
    assert len(sent) == 3 and sent[0]["txnNumber"] == sent[1]["txnNumber"] != sent[2]["txnNumber"]
    assert (await wire_store.get_client("webapp")).name == "Web"


async def test_a_withdrawal_whose_reply_is_lost_is_run_again_and_reports_no_count(wire_store, primary):
    """RERUN, a sweep: the families' withdrawal applied and its reply lost, the store runs the
    whole withdrawal again, which finds nothing left to withdraw. What it changed cannot be told
    then (its modified count said 0 for a family it did narrow), so it reports no count."""
    now = utcnow()
    grant = await wire_store.save_grant("webapp", ALICE, ["read", "write"], now)
    await wire_store.create_family(replace(family(now, grant.grant_id), scopes=["read", "write"]))
    primary.script(Fault("update", "hangup_after", collection="families"))
    assert await wire_store.withdraw_scopes("webapp", ["read"]) is None
    assert len(primary.sent("update", "families")) == 2  # run again
    assert (await wire_store.get_family("f1"))[0].scopes == ["read"]
    assert (await wire_store.get_grant(grant.grant_id)).scopes == ["read"]


async def test_a_read_whose_reply_is_lost_is_run_again_under_the_servers_time_limit(wire_store, primary):
    """READ: the driver never retries a read (retryReads=False); the store runs it again, each
    run under the server's maxTimeMS."""
    grant = await wire_store.save_grant("webapp", ALICE, ["read"], utcnow())
    primary.forget()
    primary.script(Fault("find", "hangup_after", collection="grants"))
    assert (await wire_store.get_grant(grant.grant_id)) == grant
    sent = primary.sent("find", "grants")
    assert len(sent) == 2 and all(0 < doc["maxTimeMS"] <= BUDGET_MS for doc in sent)


async def test_a_method_of_several_steps_runs_again_only_the_step_whose_reply_was_lost(wire_store, primary):
    """STEPS: put_user reads who holds the name, then writes: each step is an operation of its
    own kind, so a lost write is run again alone, not the read before it."""
    primary.script(Fault("update", "hangup_after", collection="users", times=2))
    await wire_store.put_user(User("u_alice", "alice", "scrypt$x"))
    assert len(primary.sent("find", "users")) == 1 and len(primary.sent("update", "users")) == 3
    assert (await wire_store.get_user("u_alice")).username == "alice"


async def test_the_polling_feed_reads_after_every_write_acknowledged_before_it(wire_store, primary):
    """Every collection the store reaches runs in the operation's causally consistent session,
    the polling fallback of the revocation feed's reads too (they reach the collections by
    name): a poll just after an election waits for the revocations acknowledged before it."""
    now = utcnow()
    grant = await wire_store.save_grant("webapp", ALICE, ["read"], now)
    await wire_store.create_family(family(now, grant.grant_id))
    await wire_store.revoke_family("f1", now)
    revoked_at = primary.clock
    primary.forget()
    wire_store.feed.change_streams = False
    feed = wire_store.revocation_feed(poll_seconds=0.01)
    try:
        async with asyncio.timeout(30):  # a bound for a hang, not a speed
            assert (await anext(feed)).key == "f1"
    finally:
        await feed.aclose()
    polled = [doc for doc in primary.sent("find", "families") if "revoked_at" in doc["filter"]]
    assert polled and all(doc["readConcern"]["afterClusterTime"] >= Timestamp(1_700_000_000, revoked_at)
                          for doc in polled)


async def test_a_resource_uri_is_one_clients_whichever_process_writes_it(wire_store, primary):
    """RFC 8707: start-up makes the unique multikey index ``clients.resources`` (documents
    without a resource left out), so that of two registrations declaring one resource URI at
    once, as two processes run them, one lands and the other is ResourceTaken (the server's
    DuplicateKey names the index) and writes nothing; a change is refused so too; clients
    without resources are as many as there are."""
    from tokensvc.records import RESOURCE_SERVER
    from tokensvc.storage.base import ResourceTaken

    clients = primary.db["tokensvc"]["clients"]
    index = clients.index_information()["resources"]
    assert index["unique"] is True and index["partialFilterExpression"] == {"resources": {"$type": "string"}}
    now = utcnow()

    def api(client_id: str, *resources: str) -> Client:
        return Client(client_id, client_id, [], [], secret_hash="h", kind=RESOURCE_SERVER, created_at=now,
                      resources=list(resources) or None)

    results = await asyncio.gather(*(wire_store.add_client(api(client_id, "https://shared.example"))
                                     for client_id in ("one-api", "two-api")), return_exceptions=True)
    assert sorted(type(result).__name__ for result in results) == ["NoneType", "ResourceTaken"], results
    assert clients.count_documents({"resources": "https://shared.example"}) == 1
    await wire_store.add_client(api("three-api", "https://three.example"))
    with pytest.raises(ResourceTaken):
        await wire_store.update_client("three-api", {"resources": ["https://three.example", "https://shared.example"]})
    assert clients.find_one({"_id": "three-api"})["resources"] == ["https://three.example"]
    for n in range(3):
        await wire_store.put_client(api(f"bare-{n}"))
        await wire_store.add_client(Client(f"app-{n}", f"App {n}", ["https://a/cb"], created_at=now))
