"""What a process keeps of the store it shares with others, and the bound it keeps it within.

A process answers client authentication from the client and its previous secret as it read
them, and a right secret from the failure counts as it read them, for at most
``CACHE_SECONDS`` after the read began (docs/security.md, "What a process keeps"). Before that,
every change this process writes, and every announcement its relay hears of another's, makes
them current at once. A change whose announcement is missed is seen once the bound runs out.
Each process here is a store of its own over one database (the mongodb stand-in); their clocks
for the bound are moved by hand, so that nothing here measures time.
"""

from __future__ import annotations

import pytest
from backends import open_store
from helpers import WEBAPP_SECRET, eventually, make_config, relaying
from test_limits import authenticate

from tokensvc.bootstrap import make_context, seed
from tokensvc.oauth import hashing
from tokensvc.records import utcnow
from tokensvc.storage.base import CACHE_SECONDS, CLIENT, Revocation
from tokensvc.storage.mongo import MongoStore
from tokensvc.storage.mongo.recent import Recent

pytestmark = pytest.mark.gen_test(timeout=30)

ANOTHER_SECRET = "webapp-rotated-secret-0123456789abcdef"


class Seconds:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(io_loop):
    opened, cleanup = open_store("mongodb", io_loop)
    yield opened
    cleanup()


@pytest.fixture
def config():
    return make_config(limits={"window_seconds": 60, "failed_client_auth_per_client": 3,
                               "failed_client_auth_per_address": 100})


@pytest.fixture
def here(store, config, io_loop):
    """This process: its context on the store, the clock its caches are bounded by."""
    io_loop.run_sync(lambda: seed(store, config))
    ctx = make_context(config, store)
    seconds = Seconds()
    store.registry.recent.clock = seconds
    ctx.limits.clock = seconds
    return ctx, seconds


def elsewhere(store: MongoStore) -> MongoStore:
    """Another process's store over the same database."""
    return MongoStore(store.client, store.db.name, change_streams=False)


async def rotate(store: MongoStore, secret: str) -> None:
    """A new secret written as every writer writes one: with the mark its relay hears."""
    await store.update_client("webapp", {"secret_hash": hashing.digest(secret), "credentials_changed_at": utcnow()})


async def test_a_client_rotated_elsewhere_is_refused_here_once_the_bound_runs_out_if_its_announcement_is_missed(
        here, store):
    ctx, seconds = here
    assert (await authenticate(ctx, WEBAPP_SECRET)).client_id == "webapp"  # read, and kept
    await rotate(elsewhere(store), ANOTHER_SECRET)  # no relay runs here: its announcement is missed
    seconds.now += CACHE_SECONDS * 0.99
    assert (await authenticate(ctx, WEBAPP_SECRET)).client_id == "webapp"  # what was read, within its bound
    seconds.now += CACHE_SECONDS * 0.01
    assert await authenticate(ctx, WEBAPP_SECRET) == "InvalidClient"
    assert (await authenticate(ctx, ANOTHER_SECRET)).client_id == "webapp"


async def test_a_client_narrowed_or_rotated_elsewhere_is_current_here_as_soon_as_the_relay_hears_it(here, store):
    ctx, seconds = here
    heard: list[Revocation | None] = []
    ctx.events.watch(heard.append)
    async with relaying(store, ctx.events):
        await eventually(lambda: store.registry.recent.get("webapp") is None and heard == [], what="the relay")
        assert (await authenticate(ctx, WEBAPP_SECRET)).client_id == "webapp"
        other = elsewhere(store)
        await other.update_client("webapp", {"allowed_scopes": ["read"], "narrowed_at": utcnow()})
        await eventually(lambda: Revocation(CLIENT, "webapp") in heard, what="the narrowing heard")
        assert (await authenticate(ctx, WEBAPP_SECRET)).allowed_scopes == ["read"]  # the bound has not run
        await rotate(other, ANOTHER_SECRET)
        await eventually(lambda: len(heard) >= 2, what="the rotation heard")
        assert await authenticate(ctx, WEBAPP_SECRET) == "InvalidClient"


async def test_a_client_removed_elsewhere_is_refused_here_once_the_bound_runs_out(here, store):
    ctx, seconds = here
    assert (await authenticate(ctx, WEBAPP_SECRET)).client_id == "webapp"
    await elsewhere(store).begin_removal("webapp", utcnow(), "tag")
    seconds.now += CACHE_SECONDS
    assert await authenticate(ctx, WEBAPP_SECRET) == "InvalidClient"


async def test_a_change_this_process_writes_is_current_here_at_once(here, store):
    ctx, _ = here
    assert (await authenticate(ctx, WEBAPP_SECRET)).client_id == "webapp"
    await store.update_client("webapp", {"allowed_scopes": ["read"]})  # a widening or any change: no mark needed
    assert (await authenticate(ctx, WEBAPP_SECRET)).allowed_scopes == ["read"]
    await rotate(store, ANOTHER_SECRET)
    assert await authenticate(ctx, WEBAPP_SECRET) == "InvalidClient"


def test_a_read_that_a_change_overtook_is_not_kept():
    seconds = Seconds()
    recent: Recent[str] = Recent(clock=seconds)
    began = recent.began()
    recent.drop("webapp")  # a change lands while the read is under way
    recent.keep("webapp", "as read", began)
    assert recent.get("webapp") is None
    began = recent.began()
    recent.keep("webapp", "as read", began)
    assert recent.get("webapp") == "as read"
    seconds.now += CACHE_SECONDS
    assert recent.get("webapp") is None  # never past its bound


async def test_failures_counted_elsewhere_refuse_a_right_hand_set_secret_here_once_the_bound_runs_out(
        here, store, config):
    ctx, seconds = here
    assert (await authenticate(ctx, WEBAPP_SECRET)).client_id == "webapp"  # no failure: kept a second
    other = make_context(config, elsewhere(store))
    assert [await authenticate(other, "wrong") for _ in range(4)] == ["InvalidClient"] * 3 + ["TooManyFailures"]
    seconds.now += CACHE_SECONDS
    assert await authenticate(ctx, WEBAPP_SECRET) == "TooManyFailures"


async def test_a_failure_counted_here_is_weighed_at_once(here, store, config):
    ctx, _ = here
    assert (await authenticate(ctx, WEBAPP_SECRET)).client_id == "webapp"
    other = make_context(config, elsewhere(store))
    assert [await authenticate(other, "wrong") for _ in range(2)] == ["InvalidClient"] * 2
    # A guess here, the limit's third: the group's state kept here goes with it, and the
    # right secret is weighed on the store's counts again (at the limit: refused).
    assert await authenticate(ctx, "wrong") == "InvalidClient"
    assert await authenticate(ctx, WEBAPP_SECRET) == "TooManyFailures"
