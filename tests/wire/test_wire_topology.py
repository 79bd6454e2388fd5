"""The deployment as the process meets it at run time: a directly connected member that stops
being a writable primary is noticed from the driver's topology events (``/readyz`` says why,
writes fail at once) and served again once it is primary; a server too old, or credentials
refused, stop start-up with one line; a closed client is not retried; index builds do not wait
for a member that is down."""

from __future__ import annotations

import argparse
import asyncio
import time

import pytest
from helpers import eventually, make_config, serve_refusal
from primary import BUDGET_MS, ReplicaSet, wire_settings

from tokensvc.bootstrap import make_store, prepare
from tokensvc.cli.admin import load_settings
from tokensvc.handlers.edge.readiness import Readiness
from tokensvc.records import Client, utcnow
from tokensvc.storage.base import StorageError, StoreFault

pytestmark = pytest.mark.gen_test(timeout=30)

WEB = Client("webapp", "Web", ["https://a/cb"])


async def test_a_directly_connected_member_that_steps_down_is_noticed_and_served_again_once_primary(primary):
    store = make_store(wire_settings(primary, mongodb_uri=primary.uri(directConnection="true")))
    await store.open()
    readiness = Readiness(store)
    assert await readiness.unready() is None
    primary.step_down(after=None)  # it stays a secondary until elected again
    await eventually(lambda: store.unwritable() is not None, what="the driver seeing the step-down")
    reason = await readiness.unready()
    assert reason == f"MongoDB at {primary.address} is not a writable primary (secondary): point " \
                     "storage.mongodb_uri at the replica set (replicaSet=..., no directConnection=true)"
    started = time.monotonic()
    with pytest.raises(StorageError, match="is not a writable primary"):
        await store.put_client(WEB)
    assert time.monotonic() - started < BUDGET_MS / 1000 / 4  # at once, not after the budget
    assert primary.sent("update", "clients") == []  # not even tried
    primary.elect(0)
    await eventually(lambda: store.unwritable() is None, what="the driver seeing the election")
    assert await readiness.unready() is None
    await store.put_client(WEB)
    assert (await store.get_client("webapp")).name == "Web"
    await store.close()


async def test_through_the_replica_set_an_election_is_waited_for_not_refused(primary):
    """The same step-down seen through the replica set (no directConnection): no primary for a
    moment is an election, which requests wait out within their budget."""
    store = make_store(wire_settings(primary))
    await store.open()
    elected = primary.step_down(after=0.5)
    await store.put_client(WEB)  # waits for the new term
    assert elected.is_set() and primary.term == 2 and store.unwritable() is None
    await store.close()


def config_on(tmp_path, uri: str):
    path = tmp_path / "tokensvc.toml"
    path.write_text(f'demo = true\n[storage]\nbackend = "mongodb"\nmongodb_uri = "{uri}"\ntimeout_ms = 3000\n')
    return load_settings(argparse.Namespace(config=str(path)))


@pytest.mark.parametrize("wire_version", [6, 8])
def test_a_server_older_than_4_4_stops_start_up_with_one_line(tmp_path, wire_version):
    old = ReplicaSet(max_wire_version=wire_version).start()
    try:
        started = time.monotonic()
        message = serve_refusal(config_on(tmp_path, old.uri()))
        assert time.monotonic() - started < 3  # refused at once, never retried as "not answering"
    finally:
        old.stop()
    assert "\n" not in message and message.startswith("MongoDB is too old for tokensvc, which needs MongoDB 4.4 or "
                                                      f"later: Server at {old.address} reports wire version "
                                                      f"{wire_version}"), message


def test_credentials_the_server_refuses_stop_start_up_with_one_line(tmp_path):
    refusing = ReplicaSet(auth_fails=True).start()
    try:
        uri = refusing.uri(authSource="admin").replace("mongodb://", "mongodb://tokensvc:wrong@")
        message = serve_refusal(config_on(tmp_path, uri))
    finally:
        refusing.stop()
    assert message == ("MongoDB refused the credentials of storage.mongodb_uri: Authentication failed. (check its "
                       "user, password and authSource)")


async def test_prepare_does_not_retry_what_waiting_cannot_mend():
    old = ReplicaSet(max_wire_version=6).start()
    try:
        store = make_store(wire_settings(old))
        with pytest.raises(StoreFault, match="too old"):
            await asyncio.wait_for(prepare(store, make_config(), first_delay=0.01), 5)
        await store.close()
    finally:
        old.stop()


async def test_a_closed_client_is_not_retried(primary):
    store = make_store(wire_settings(primary))
    await store.ping()
    await store.close()
    retried = []
    store.observer.retry = retried.append
    for operation in (lambda: store.get_client("webapp"), lambda: store.put_client(WEB),
                      lambda: store.end_user_sessions("u_alice", utcnow())):
        started = time.monotonic()
        with pytest.raises(StorageError):  # the service is stopping: 503, never 500
            await operation()
        assert time.monotonic() - started < 0.2
    assert retried == []


async def test_index_builds_do_not_wait_for_a_member_that_is_down():
    """Three members, one down: a build under the default commit quorum (every voting member)
    would hold start-up until it is back; tokensvc asks for a majority."""
    replica_set = ReplicaSet(size=3).start()
    try:
        replica_set.set_down(2)
        store = make_store(wire_settings(replica_set))
        store.build_budget = 5
        await store.open()
        builds = replica_set.sent("createIndexes")
        assert builds and all(build["commitQuorum"] == "majority" for build in builds)
        await store.close()
    finally:
        replica_set.stop()
