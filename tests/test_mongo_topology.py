"""What the store makes of the driver's views of a replica set (tokensvc/storage/mongo/topology.py):
an election wakes the waits on the old primary (reads, the relay's change stream) and says the
store may answer again, also when the driver knew no primary in between (it marked the crashed
one unknown first, as a timed-out handshake to it makes it); the same primary seen again, or
a secondary's change, wakes nothing. A new primary's heartbeat, which the driver publishes at
once (its topology's events wait in a queue emptied once a second), is followed as soon as the
driver's view shows it."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from bson import ObjectId
from helpers import DEADLINE, eventually
from pymongo import monitoring
from pymongo.asynchronous.settings import TopologySettings
from pymongo.hello import Hello
from pymongo.server_description import ServerDescription
from pymongo.topology_description import TOPOLOGY_TYPE, TopologyDescription

from tokensvc.storage.base import StoreObserver
from tokensvc.storage.mongo import MongoStore, calls, topology
from tokensvc.storage.mongo.topology import DriverEvents, Topology

A, B, C = ("db1", 27017), ("db2", 27017), ("db3", 27017)


def member(address, state: str, term: int = 1) -> ServerDescription:
    """A member as its ``hello`` describes it: ``"primary"`` (elected in ``term``),
    ``"secondary"``, or ``"unknown"`` (no answer)."""
    if state == "unknown":
        return ServerDescription(address)
    hello = {"ok": 1, "setName": "rs0", "hosts": [f"{host}:{port}" for host, port in (A, B, C)], "setVersion": 1,
             "maxWireVersion": 25, "minWireVersion": 0, "isWritablePrimary": state == "primary",
             "secondary": state == "secondary"}
    if state == "primary":
        hello["electionId"] = ObjectId(f"7fffffff{term:016x}")
    return ServerDescription(address, Hello(hello))


def view(*members: ServerDescription) -> TopologyDescription:
    """The replica set as the driver describes it, with these members."""
    kind = (TOPOLOGY_TYPE.ReplicaSetWithPrimary if any(server.is_writable for server in members)
            else TOPOLOGY_TYPE.ReplicaSetNoPrimary)
    return TopologyDescription(kind, {server.address: server for server in members}, "rs0", None, None,
                               TopologySettings())


async def waits(topology: Topology) -> tuple[asyncio.Future, asyncio.Future]:
    """A wait an election abandons, and the store's wait until it may answer again."""
    waiter = asyncio.get_running_loop().create_future()
    topology.abandoned().add(waiter)
    return waiter, topology.writable()


async def settled() -> None:
    """The wakes the driver's events queued (call_soon_threadsafe) have run."""
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.gen_test
async def test_an_election_wakes_the_waits_on_the_old_primary():
    topology = Topology()
    topology.description = view(member(A, "primary"), member(B, "secondary"), member(C, "secondary"))
    waiter, writable = await waits(topology)
    topology.description = view(member(A, "unknown"), member(B, "primary", term=2), member(C, "secondary"))
    await settled()
    assert waiter.done() and waiter.result() == calls.ELECTED
    assert writable.done()


@pytest.mark.gen_test
async def test_an_election_wakes_them_also_after_the_driver_gave_up_on_the_old_primary():
    """The crashed primary is marked unknown before the others elect (a new connection's
    handshake to it timed out): the driver knows no primary for a while. What was sent to the
    old one still waits on it, and the election wakes it all the same."""
    topology = Topology()
    topology.description = view(member(A, "primary"), member(B, "secondary"), member(C, "secondary"))
    waiter, writable = await waits(topology)
    topology.description = view(member(A, "unknown"), member(B, "secondary"), member(C, "secondary"))
    await settled()
    assert not waiter.done() and not writable.done()
    topology.description = view(member(A, "unknown"), member(B, "primary", term=2), member(C, "secondary"))
    await settled()
    assert waiter.done() and waiter.result() == calls.ELECTED
    assert writable.done()


@pytest.mark.gen_test
async def test_the_same_primary_seen_again_or_a_secondarys_change_wakes_nothing():
    topology = Topology()
    topology.description = view(member(A, "primary"), member(B, "secondary"), member(C, "secondary"))
    waiter, writable = await waits(topology)
    topology.description = view(member(A, "primary"), member(B, "unknown"), member(C, "secondary"))
    await settled()
    assert not waiter.done() and not writable.done()
    topology.description = view(member(A, "unknown"), member(B, "unknown"), member(C, "secondary"))
    topology.description = view(member(A, "primary"), member(B, "secondary"), member(C, "secondary"))
    await settled()
    assert not waiter.done()  # the same primary, the same term: nothing waited on another
    assert writable.done()  # but a member takes writes again


class Driver:
    """What :class:`DriverEvents` reads of the store: its topology, its client's view now."""

    def __init__(self, description: TopologyDescription) -> None:
        self.topology = Topology()
        self.topology.description = description
        self.client = SimpleNamespace(topology_description=description)
        self.observer = StoreObserver()


def heartbeat(server: ServerDescription) -> monitoring.ServerHeartbeatSucceededEvent:
    hello = Hello({"ok": 1, "setName": "rs0", "isWritablePrimary": server.is_writable,
                   "secondary": not server.is_writable, "maxWireVersion": 25, "minWireVersion": 0,
                   **({"electionId": server.election_id} if server.election_id else {})})
    return monitoring.ServerHeartbeatSucceededEvent(0.001, hello, server.address, awaited=True)


@pytest.mark.gen_test
async def test_a_new_primarys_heartbeat_is_followed_without_waiting_for_the_drivers_queued_events():
    """The driver publishes its topology's events from a queue it empties once a second, its
    heartbeats at once. The heartbeat of a member that says it is a new primary makes the store
    take the driver's view as soon as it shows that primary: the waits on the old one are woken
    before any topology event is published."""
    store = Driver(view(member(A, "primary"), member(B, "secondary"), member(C, "secondary")))
    events = DriverEvents()
    events.connection = store  # type: ignore[assignment]
    waiter, writable = await waits(store.topology)
    elected = member(B, "primary", term=2)
    events.succeeded(heartbeat(elected))  # the driver has not taken the answer in yet
    await settled()
    assert not waiter.done()
    store.client.topology_description = view(member(A, "unknown"), elected, member(C, "secondary"))  # now it has
    await eventually(waiter.done, seconds=5, what="the election followed")
    assert waiter.result() == calls.ELECTED and writable.done()


@pytest.mark.gen_test
async def test_every_heartbeat_takes_the_drivers_view_and_a_stale_primarys_is_looked_for_a_while():
    """Each heartbeat, and each cleared pool, makes the store take the driver's view, at once and
    once more when the driver has taken it in. The known primary's or a secondary's wakes
    nothing. A member that only believes it is primary (its term is over) is looked for in the
    driver's view :data:`LOOKS` times, then no more."""
    store = Driver(view(member(A, "primary"), member(B, "secondary"), member(C, "secondary")))
    events = DriverEvents()
    events.connection = store  # type: ignore[assignment]
    looked = []

    class Client:
        @property
        def topology_description(self) -> TopologyDescription:
            looked.append(1)
            return view(member(A, "primary"), member(B, "secondary"), member(C, "secondary"))

    store.client = Client()  # type: ignore[assignment]
    waiter, _ = await waits(store.topology)
    events.succeeded(heartbeat(member(A, "primary")))
    events.succeeded(heartbeat(member(B, "secondary")))
    events.pool_cleared(monitoring.PoolClearedEvent(C))
    await eventually(lambda: len(looked) == 6, seconds=5, what="two looks for each")
    assert not waiter.done()
    looked.clear()
    events.succeeded(heartbeat(member(B, "primary", term=2)))  # a member that only believes it
    await eventually(lambda: len(looked) == topology.LOOKS + 2, seconds=5, what="every look")
    await asyncio.sleep(topology.LOOK_SECONDS * 3)
    assert len(looked) == topology.LOOKS + 2 and not waiter.done()  # and no more


@pytest.mark.gen_test
async def test_the_primarys_heartbeat_when_the_store_saw_none_is_the_store_back_at_once():
    """The whole set was down and comes back, the same primary in the same term: no election,
    but the waits for the store to answer again (a failed socket re-check, the relay, start-up)
    end at its first heartbeat, not at the driver's next queued event."""
    up = view(member(A, "primary"), member(B, "secondary"), member(C, "secondary"))
    store = Driver(up)
    events = DriverEvents()
    events.connection = store  # type: ignore[assignment]
    down = view(member(A, "unknown"), member(B, "unknown"), member(C, "unknown"))
    store.topology.description = store.client.topology_description = down
    waiter, writable = await waits(store.topology)
    events.succeeded(heartbeat(member(A, "primary")))
    store.client.topology_description = up
    await eventually(writable.done, seconds=5, what="the store back")
    assert not waiter.done()  # nothing was elected: what waits on the primary waits on


def test_a_burst_of_server_changes_never_blocks_the_stores_event_loop():
    """PyMongo's asyncio driver hands its server and topology events to listeners through a
    queue of 100, which a task on the same event loop empties once a second, and puts into it
    blocking. More than 100 changes within that second (an outage under load: each operation
    failing on an established connection is one) blocked the event loop for good, and the
    process answered nothing more (a store chaos run). The store listens to none of them: the
    heartbeats and the pool's events it follows are published at once."""
    finished = threading.Event()

    async def burst() -> None:
        store = MongoStore.connect("mongodb://127.0.0.1:1/?replicaSet=rs0", "tokensvc", timeout_ms=500,
                                   max_pool_size=10)
        await store.connection.client.aconnect()
        driver = store.connection.client._topology  # the driver's own SDAM path, as an outage drives it
        address = ("127.0.0.1", 1)
        for change in range(150):
            driver._sdam.server_description_changed(ServerDescription(address),
                                                    ServerDescription(address, error=OSError(change)), address)
        await store.close()
        finished.set()

    thread = threading.Thread(target=asyncio.run, args=(burst(),), daemon=True)
    thread.start()
    assert finished.wait(DEADLINE), "the event loop blocked"


def test_each_member_that_changes_its_state_is_counted():
    """``tokensvc_store_topology_changes_total``: each member whose state differs from the view
    the store took before (an election: the old primary unknown, a secondary primary)."""
    changes = []
    seen = Topology(lambda: changes.append(1))
    seen.description = view(member(A, "primary"), member(B, "secondary"), member(C, "secondary"))
    seen.description = view(member(A, "primary"), member(B, "secondary"), member(C, "secondary"))
    assert changes == []
    seen.description = view(member(A, "unknown"), member(B, "primary", term=2), member(C, "secondary"))
    assert len(changes) == 2
