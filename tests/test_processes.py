"""Several processes over one MongoDB: a revocation made by one process closes the affected
WebSockets of every other within a second, through one relay per process (a change stream on
the revoking collections, or a poll of their revocation fields where there is none)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from backends import open_store
from helpers import DEADLINE, SKY_REDIRECT, WEBAPP_REDIRECT, Clock, eventually, family_of, hand_over, relaying
from test_audience import NOTES, NOTES_SECRET, PHOTOS, grant_of, issued_as, with_apis
from test_feed import connect as connect_feed
from test_feed import next_message
from test_ws import closed_as_revoked, tokens, welcome_of, ws_url
from tornado.websocket import websocket_connect

from tokensvc.oauth import events, hashing
from tokensvc.records import Client, Family, Pair, Session, Subject, User, utcnow
from tokensvc.storage.base import CLIENT, CREDENTIALS, FAMILY, GRANT, SESSION, SUBJECT, Revocation, StoreObserver
from tokensvc.storage.memory import MemoryStore
from tokensvc.storage.mongo import WATCHED, MongoStore
from tokensvc.storage.mongo.feed import CLOCK_SKEW, poll_overlap


@pytest.fixture
def store(io_loop):
    """The service's store: the mongodb stand-in (the app fixture serves it)."""
    opened, cleanup = open_store("mongodb", io_loop)
    yield opened
    cleanup()


def other_process(store: MongoStore) -> MongoStore:
    """Another process's store over the same database."""
    return MongoStore(store.client, store.db.name, change_streams=False)


class Polls(StoreObserver):
    """What the feed's polling tells: that it began (its starting point set), and each read of
    a revocation field (a round reads every one of them once)."""

    ROUND = sum(len(fields) for fields in WATCHED.values())

    def __init__(self) -> None:
        self.began = asyncio.Event()
        self.reads = 0

    def feed(self, state: str) -> None:
        if state == "polling":
            self.began.set()

    def operation(self, name: str, seconds: float) -> None:
        if name == "_revoked_since":
            self.reads += 1

    async def round_after_now(self) -> None:
        """Until a whole round has read the store after this moment (the read under way now
        may have begun before it, so the round after the current one)."""
        target = (-(-(self.reads + 1) // self.ROUND) + 1) * self.ROUND
        await eventually(lambda: self.reads >= target, what="a poll round")


@pytest.mark.gen_test(timeout=30)
async def test_a_revocation_in_another_process_closes_the_socket_within_a_second(browser, http_client, base_url,
                                                                                 store, ctx):
    async with relaying(store, ctx.events):
        issued = await tokens(browser, http_client, base_url)
        connection = await websocket_connect(ws_url(base_url, "?access_token=" + issued["access_token"]))
        await welcome_of(connection)
        elsewhere = other_process(store)
        record = await family_of(elsewhere, issued["access_token"])
        await elsewhere.mark_grant_revoked(record.grant_id, ctx.clock())  # no event of this process fires
        await closed_as_revoked(connection)


@pytest.mark.gen_test(timeout=30)
async def test_a_revocation_in_another_process_reaches_the_revocation_feed(browser, http_client, base_url, store,
                                                                           ctx):
    """Resource servers hear through any process what every process revokes: its relay feeds
    the revocation feed (GET /oauth/revocations) as it closes its own sockets."""
    async with relaying(store, ctx.events):
        issued = await tokens(browser, http_client, base_url)
        reader = await connect_feed(base_url)
        await next_message(reader)
        elsewhere = other_process(store)
        record = await family_of(elsewhere, issued["access_token"])
        await elsewhere.mark_grant_revoked(record.grant_id, ctx.clock())  # no event of this process fires
        assert await next_message(reader) == {"type": "revoked", "seq": 1, "grant_id": record.grant_id}
        reader.close()


@pytest.mark.gen_test(timeout=30)
async def test_the_feed_names_each_revocation_of_another_process_once(store):
    now = Clock().now
    store.observer = polls = Polls()
    feed = store.revocation_feed(poll_seconds=0.05).__aiter__()
    elsewhere = other_process(store)
    grant = await elsewhere.save_grant("webapp", Subject(user_id="u1"),
                                       ["read"], now)
    family = Family("f1", grant.grant_id, "webapp", "u1", None, 0, ["read"], now, "r1", "a1", now,
                    now + timedelta(hours=1), now + timedelta(minutes=10), renewed_at=now)
    await elsewhere.create_family(family)
    await elsewhere.add_session(Session("s1", "u1", now, now + timedelta(hours=1)))
    waiting = asyncio.ensure_future(feed.__anext__())
    await asyncio.wait_for(polls.began.wait(), DEADLINE)
    # Changes that revoke nothing are not announced.
    assert not await elsewhere.revoke_family("no-such-family", now)
    assert not await elsewhere.end_session("no-such-session", now)
    await elsewhere.rotate_family("f1", "r1", Pair(
        "a2", "r2", ["read"], now, now + timedelta(hours=1), now + timedelta(minutes=10)), now)
    await polls.round_after_now()
    assert not waiting.done()
    assert await elsewhere.revoke_access("f1", "a2", now)
    assert await waiting == Revocation(FAMILY, "f1")
    assert await elsewhere.end_session("s1", now)
    assert await asyncio.wait_for(feed.__anext__(), DEADLINE) == Revocation(SESSION, "s1")
    assert await elsewhere.mark_grant_revoked(grant.grant_id, now)
    assert await elsewhere.revoke_grant_families(grant.grant_id, now) == 1
    seen = {await asyncio.wait_for(feed.__anext__(), DEADLINE) for _ in range(2)}
    assert seen == {Revocation(GRANT, grant.grant_id), Revocation(FAMILY, "f1")}
    later = asyncio.ensure_future(feed.__anext__())
    for _ in range(2):  # each announced once, however often the poll reads them back
        await polls.round_after_now()
    assert not later.done()
    later.cancel()
    with pytest.raises(asyncio.CancelledError):
        await later


@pytest.mark.gen_test
async def test_the_relay_ends_at_once_for_a_store_of_one_process(ctx):
    await asyncio.wait_for(events.relay(MemoryStore(), ctx.events), DEADLINE)


@pytest.mark.gen_test(timeout=30)
async def test_a_client_narrowed_in_another_process_closes_the_socket_within_a_second(browser, http_client, base_url,
                                                                                      store, ctx, config):
    """A narrowing revokes nothing, yet may take away what a socket stands on (read): it is
    announced under the client, in the client's own write (narrowed_at), so that every
    process's relay makes the client's sockets re-check. Another client's sockets stay open."""
    from tokensvc.admin.operator import Operator
    from tokensvc.bootstrap import make_context

    async with relaying(store, ctx.events):
        issued = await tokens(browser, http_client, base_url, scope="read write")
        narrowed = await websocket_connect(ws_url(base_url, "?access_token=" + issued["access_token"]))
        await welcome_of(narrowed)
        elsewhere = Operator(make_context(config, other_process(store)), await hand_over(store, config))
        await elsewhere.patch_client("skyplanner", {"description": "A narrowing of another client is no concern"})
        await elsewhere.patch_client("webapp", {"allowedScopes": ["write", "admin"]})  # read stays in force
        await elsewhere.patch_client("webapp", {"allowedScopes": ["admin"]})
        await closed_as_revoked(narrowed)


@pytest.mark.gen_test(timeout=30)
async def test_a_readers_client_rotated_or_removed_in_another_process_closes_the_reader(http_server, base_url, store,
                                                                                        ctx, config, monkeypatch):
    """The rotation's write carries the client's credentials mark (credentials_changed_at),
    which every relay hears: the reader checks its credentials again and is closed. Another
    reader of the feed (as a resource server reads it) is told nothing of the rotation, which
    withdraws nothing from the client's tokens, and is told of a narrowing made there. A
    removal's deletion leaves nothing a poll can find: the readers also check every
    RECHECK_SECONDS (shortened here)."""
    from test_feed import closed_for_its_credentials, notes_api

    from tokensvc.admin.operator import Operator
    from tokensvc.bootstrap import make_context
    from tokensvc.handlers import feed

    secret = await notes_api(ctx)
    elsewhere = Operator(make_context(config, other_process(store)), await hand_over(store, config))
    async with relaying(store, ctx.events):
        listening = await connect_feed(base_url)
        await next_message(listening)
        reader = await connect_feed(base_url, client_id="notes-api", secret=secret)
        await next_message(reader)
        rotated = (await elsewhere.rotate_secret("notes-api", {}))["clientSecret"]
        assert await closed_for_its_credentials(reader) == []
        await elsewhere.patch_client("webapp", {"allowedScopes": ["read", "write"]})
        assert await next_message(listening) == {"type": "revoked", "seq": 1, "client_id": "webapp"}
        listening.close()
        monkeypatch.setattr(feed, "RECHECK_SECONDS", 0.2)
        reader = await connect_feed(base_url, client_id="notes-api", secret=rotated)
        await next_message(reader)
        await elsewhere.remove_client("notes-api")
        await closed_for_its_credentials(reader)


@pytest.mark.gen_test(timeout=30)
async def test_a_rotation_in_another_process_heard_during_a_readers_handshake_closes_it_before_ready(
        http_server, base_url, store, ctx, config, monkeypatch):
    """A rotation made elsewhere whose announcement reaches this process through the relay
    after the reader's credentials were read, but before it subscribed: checked before
    ``ready``, and the reader is closed (4403) having been told nothing."""
    from test_feed import changed_after_authenticating, closed_for_its_credentials, notes_api

    from tokensvc.admin.operator import Operator
    from tokensvc.bootstrap import make_context
    from tokensvc.handlers import feed

    secret = await notes_api(ctx)
    elsewhere = Operator(make_context(config, other_process(store)), await hand_over(store, config))

    async def rotated_elsewhere_and_heard(ctx):
        mark = ctx.events.mark()
        await elsewhere.rotate_secret("notes-api", {})
        await eventually(lambda: ctx.events.mark() > mark, DEADLINE, what="the rotation relayed here")

    monkeypatch.setattr(feed, "RECHECK_SECONDS", 3600.0)
    changed_after_authenticating(monkeypatch, rotated_elsewhere_and_heard)
    async with relaying(store, ctx.events):
        reader = await connect_feed(base_url, client_id="notes-api", secret=secret)
        assert await closed_for_its_credentials(reader) == []


@pytest.mark.gen_test(timeout=30)
async def test_the_feed_names_a_narrowed_client(store):
    store.observer = polls = Polls()
    feed = store.revocation_feed(poll_seconds=0.05).__aiter__()
    elsewhere = other_process(store)
    await elsewhere.put_client(Client("c1", "One", ["https://a/cb"], ["read", "write"]))
    waiting = asyncio.ensure_future(feed.__anext__())
    await asyncio.wait_for(polls.began.wait(), DEADLINE)
    await elsewhere.update_client("c1", {"description": "nothing withdrawn"})
    await polls.round_after_now()
    assert not waiting.done()
    await elsewhere.update_client("c1", {"allowed_scopes": ["read"], "narrowed_at": Clock().now})
    assert await waiting == Revocation(CLIENT, "c1")
    # What its feed readers proved changed: heard under its own kind, which the feed never names.
    await elsewhere.update_client("c1", {"secret_hash": "s2", "credentials_changed_at": Clock().now})
    assert await asyncio.wait_for(feed.__anext__(), DEADLINE) == Revocation(CREDENTIALS, "c1")
    now = Clock().now + timedelta(milliseconds=1)
    await elsewhere.update_client("c1", {"allowed_scopes": [], "kind": "resource-server", "narrowed_at": now,
                                         "credentials_changed_at": now})
    assert {await asyncio.wait_for(feed.__anext__(), DEADLINE) for _ in range(2)} == {
        Revocation(CLIENT, "c1"), Revocation(CREDENTIALS, "c1")}
    await feed.aclose()


@pytest.mark.gen_test(timeout=30)
async def test_the_feed_names_a_narrowed_user_each_time_they_are_marked(store):
    """A user's mark (narrowed_at: demoted, being removed) is heard as a client's is. Marked
    again within the poll's read-back overlap (demoted, promoted, demoted again), the user is
    announced again: a poll keeps what it saw with its time, and another time is news."""
    store.observer = polls = Polls()
    feed = store.revocation_feed(poll_seconds=0.05).__aiter__()
    elsewhere = other_process(store)
    await elsewhere.put_user(User("u1", "una", "h1", admin=True))
    waiting = asyncio.ensure_future(feed.__anext__())
    await asyncio.wait_for(polls.began.wait(), DEADLINE)
    await elsewhere.update_user("u1", {"password_hash": "h2"})
    await polls.round_after_now()
    assert not waiting.done()
    now = Clock().now
    await elsewhere.update_user("u1", {"admin": False, "narrowed_at": now})
    assert await waiting == Revocation(SUBJECT, "u1")
    await elsewhere.update_user("u1", {"admin": True})
    again = asyncio.ensure_future(feed.__anext__())
    for _ in range(2):  # read back within the overlap: not announced twice
        await polls.round_after_now()
    assert not again.done()
    await elsewhere.update_user("u1", {"admin": False, "narrowed_at": now + timedelta(milliseconds=1)})
    assert await asyncio.wait_for(again, DEADLINE) == Revocation(SUBJECT, "u1")
    await feed.aclose()


@pytest.mark.gen_test(timeout=30)
async def test_the_relay_rechecks_everyone_after_an_interruption(store, ctx):
    from tokensvc.storage.base import StorageError

    calls = []

    async def broken_feed():
        raise StorageError("away")
        yield

    store.revocation_feed = broken_feed
    ctx.events.subscribe([Revocation(FAMILY, "f")], lambda: calls.append(1))
    relay = asyncio.ensure_future(events.relay(store, ctx.events, retry_seconds=0.01))
    await eventually(lambda: calls, what="every listener re-checked after each gap")
    relay.cancel()


@pytest.mark.gen_test(timeout=30)
async def test_failure_limits_hold_across_processes(store, monkeypatch, io_loop):
    from helpers import make_config
    from test_limits import authenticate

    from tokensvc.bootstrap import make_context, seed
    from tokensvc.oauth import clientauth

    config = make_config(limits={"window_seconds": 60, "failed_client_auth_per_client": 3,
                                 "failed_client_auth_per_address": 100})
    await seed(store, config)
    processes = [make_context(config, store), make_context(config, other_process(store))]
    assert all(ctx.limits.shared is not None for ctx in processes)
    checked = []
    original = clientauth.verify
    monkeypatch.setattr(clientauth, "verify", lambda *args: (checked.append(1), original(*args))[1])
    results = [await authenticate(processes[n % 2], "wrong") for n in range(20)]  # a load balancer's round robin
    # The limit (3) over both processes, not 3 in each: the rest learn nothing (429).
    assert len(checked) == 20 and results.count("InvalidClient") == 3 and results.count("TooManyFailures") == 17
    # The shared count lives in the store, one document per address, with a TTL.
    counts = (await store.db["failures"].find_one({"_id": "client|127.0.0.1"}))["c"]
    assert counts[processes[0].limits.client_attempt("webapp", "x").counters[1][0]] >= 3


@pytest.mark.parametrize("client_id", ["webapp", "skyplanner"])  # confidential, public
@pytest.mark.gen_test(timeout=60)
async def test_a_removal_cut_short_in_another_process_is_named_to_resource_servers(http_server, base_url, store, ctx,
                                                                                   config, client_id):
    """Another process removes a client, and the store fails once the removal is recorded, its
    grants not yet revoked (503 there): this process's relay, polling, hears the removal's mark
    and the feed names the client to resource servers, public or confidential; by then tokensvc
    refuses the client's tokens, so an introspection after the message can only say inactive."""
    from helpers import SKY_REDIRECT, WEBAPP_REDIRECT, issue_tokens
    from test_feed import notes_api

    from tokensvc.admin.operator import Operator
    from tokensvc.bootstrap import make_context
    from tokensvc.oauth import introspection
    from tokensvc.storage.base import StorageError

    store.observer = polls = Polls()
    secret = await notes_api(ctx)
    issued = await issue_tokens(ctx, "alice", "read", client_id,
                                WEBAPP_REDIRECT if client_id == "webapp" else SKY_REDIRECT)
    other = other_process(store)
    elsewhere = Operator(make_context(config, other), await hand_over(store, config))

    async def cut_short(*args):
        raise StorageError("the store went away")

    async with relaying(store, ctx.events):
        await asyncio.wait_for(polls.began.wait(), DEADLINE)
        listening = await connect_feed(base_url, client_id="notes-api", secret=secret)
        assert (await next_message(listening))["type"] == "ready"
        other.revoke_client_grants = cut_short
        with pytest.raises(StorageError):
            await elsewhere.remove_client(client_id)
        while (message := await next_message(listening))["type"] == "revoked" and "client_id" not in message:
            pass  # (none comes first: no grant was revoked)
        assert message == {"type": "revoked", "seq": message["seq"], "client_id": client_id}
        assert await introspection.introspect(ctx, issued.access_token) == {"active": False}
        assert await store.get_removal(client_id) is not None
        assert len(await store.list_client_grants(client_id)) == 1  # still to revoke: a retry or a start-up


@pytest.mark.gen_test(timeout=30)
async def test_the_feed_names_a_client_whose_removal_another_process_finished(store):
    """A removal in another process deletes the client's document and its record moments after
    it began, before the next poll: its mark, kept a day, is still found, and the client named
    once; a removal of it again (registered anew) is named again."""
    from tokensvc.oauth import removal

    store.observer = polls = Polls()
    feed = store.revocation_feed(poll_seconds=0.05).__aiter__()
    elsewhere = other_process(store)
    await elsewhere.put_client(Client("c1", "One", ["https://a/cb"], ["read"]))
    waiting = asyncio.ensure_future(feed.__anext__())
    await asyncio.wait_for(polls.began.wait(), DEADLINE)
    await removal.remove_client(elsewhere, "c1", Clock())
    assert await store.get_removal("c1") is None
    assert await waiting == Revocation(CLIENT, "c1")
    waiting = asyncio.ensure_future(feed.__anext__())
    await polls.round_after_now()
    assert not waiting.done()  # named once
    await elsewhere.put_client(Client("c1", "One", ["https://a/cb"], ["read"]))
    await removal.remove_client(elsewhere, "c1", lambda: Clock().now + timedelta(milliseconds=1))
    assert await waiting == Revocation(CLIENT, "c1")
    await feed.aclose()


def lagging(seconds: float) -> Clock:
    """A clock that reads ``seconds`` before now until a test moves it (the work between two
    writes took that long)."""
    clock = Clock()
    clock.advance(-seconds)
    return clock


async def hearing(store: MongoStore, polls: Polls) -> tuple[list[Revocation], asyncio.Future]:
    """What the store's polling feed yields, from its first poll on (the list grows), and the
    task listening (cancel it)."""
    store.observer = polls
    feed = store.revocation_feed(poll_seconds=0.05).__aiter__()
    heard: list[Revocation] = []

    async def listen() -> None:
        async for revocation in feed:
            heard.append(revocation)

    listening = asyncio.ensure_future(listen())
    await asyncio.wait_for(polls.began.wait(), DEADLINE)
    return heard, listening


@pytest.mark.gen_test(timeout=30)
async def test_a_start_up_finishing_two_removals_names_the_second_to_polling_relays(store):
    """A start-up finishes two removals another process left under way; the first one's grants
    take longer than a poll's overlap (poll_overlap): the second one's mark is stamped when it is written, not
    when the start-up began, and a polling relay names that client."""
    from tokensvc.oauth import removal

    polls = Polls()
    elsewhere = other_process(store)
    late = poll_overlap(elsewhere).total_seconds() + 1
    clock = lagging(late)
    for client_id in ("a", "b"):
        await elsewhere.put_client(Client(client_id, client_id.upper(), ["https://a/cb"], ["read"]))
        await elsewhere.begin_removal(client_id, clock(), "stopped")  # left under way: the process stopped
    heard, listening = await hearing(store, polls)
    revoke = elsewhere.revoke_client_grants

    async def long(client_id, now, limit, before=None):
        if client_id == "a":
            clock.advance(late)  # many batches
        return await revoke(client_id, now, limit, before)

    elsewhere.revoke_client_grants = long
    assert await removal.finish_pending(elsewhere, clock) == ["a", "b"]
    await eventually(lambda: Revocation(CLIENT, "b") in heard, what="b named")
    listening.cancel()
    await asyncio.gather(listening, return_exceptions=True)


@pytest.mark.gen_test(timeout=30)
async def test_a_long_removals_later_batch_is_heard_by_a_polling_relay(store, monkeypatch):
    """A removal whose grant batches take longer than a poll's overlap: each batch is stamped
    when it is written, so a polling relay hears the grants of a later batch too."""
    from tokensvc.oauth import removal

    monkeypatch.setattr(removal, "BATCH", 1)
    polls = Polls()
    elsewhere = other_process(store)
    late = poll_overlap(elsewhere).total_seconds() + 1
    clock = lagging(late)
    await elsewhere.put_client(Client("c1", "One", ["https://a/cb"], ["read"]))
    grants = [await elsewhere.save_grant("c1", Subject(user_id=f"u_{index}"), ["read"], clock())
              for index in range(2)]
    heard, listening = await hearing(store, polls)
    revoke, batches = elsewhere.revoke_client_grants, []

    async def long(client_id, now, limit, before=None):
        batch = await revoke(client_id, now, limit, before)
        batches.append(list(batch))
        clock.advance(late)  # a batch that took long
        return batch

    elsewhere.revoke_client_grants = long
    assert await removal.remove_client(elsewhere, "c1", clock) == 2
    assert sorted(batches[0] + batches[1]) == sorted(grant.grant_id for grant in grants)
    await eventually(lambda: Revocation(GRANT, batches[1][0]) in heard, what="the later batch heard")
    listening.cancel()
    await asyncio.gather(listening, return_exceptions=True)


@pytest.mark.gen_test(timeout=30)
async def test_a_revocation_whose_write_lands_late_is_heard_by_a_polling_relay(store):
    """A write carries the time read just before it, and lands when its operation gets through:
    a retry after a primary stepped down lands seconds later, anywhere within the store's
    budget, on a host whose clock may run a little behind the poller's. A polling relay reads
    back the budget and that skew, so it hears the revocation however late within them it
    landed (the overlap of five seconds alone missed it, and its socket stayed open)."""
    polls = Polls()
    elsewhere = other_process(store)
    now = utcnow()
    for session_id in ("late", "next"):
        await elsewhere.add_session(Session(session_id, "u_alice", now, now + timedelta(hours=1)))
    heard, listening = await hearing(store, polls)
    try:
        await polls.round_after_now()
        # Landing now, near the end of its budget, from a host whose clock runs behind.
        stamped = utcnow() - timedelta(seconds=elsewhere.budget - 1) - CLOCK_SKEW
        assert await elsewhere.end_session("late", stamped)
        assert await elsewhere.end_session("next", utcnow())
        await eventually(lambda: Revocation(SESSION, "next") in heard, what="the revocation after it")
        await polls.round_after_now()
        assert Revocation(SESSION, "late") in heard
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


def _family(family_id: str, grant_id: str, client_id: str, now) -> Family:
    return Family(family_id, grant_id, client_id, "u_alice", None, 0, ["read"], now, hashing.digest(family_id + "r"),
                  hashing.digest(family_id + "a"), now, now + timedelta(hours=1), now + timedelta(minutes=10),
                  renewed_at=now)


@pytest.mark.gen_test(timeout=30)
async def test_a_grants_families_swept_long_after_its_mark_are_heard_by_a_polling_relay(store):
    """A grant is revoked in two writes (the grant marked, then its families swept), and a
    promotion revokes each grant that may carry admin, one after the other: each write is stamped
    when it is made, so a polling relay hears the families of a sweep that came long after the
    grant's mark, and the later grant of a promotion."""
    from tokensvc.oauth import revocation

    polls = Polls()
    elsewhere = other_process(store)
    late = poll_overlap(elsewhere).total_seconds() + 1
    clock = lagging(late)
    for client_id in ("c0", "c1"):
        await elsewhere.put_client(Client(client_id, client_id.upper(), ["https://a/cb"], ["read", "admin"]))
    grants = [await elsewhere.save_grant(f"c{index}", Subject(user_id="u_alice"), ["read"], clock())
              for index in range(2)]
    families = [hashing.digest(f"family {index}") for index in range(2)]
    for grant, family_id in zip(grants, families, strict=True):
        assert await elsewhere.create_family(_family(family_id, grant.grant_id, grant.client_id, clock()))
    heard, listening = await hearing(store, polls)
    mark = elsewhere.mark_grant_revoked

    async def long(grant_id, now, audience=None):
        marked = await mark(grant_id, now, audience)
        clock.advance(late)  # the grant's write took long (retried until a primary was elected)
        return marked

    elsewhere.mark_grant_revoked = long
    try:
        ended = await revocation.end_grant(elsewhere, grants[0].grant_id, clock)
        assert (ended.marked, ended.count) == (True, 1)
        await eventually(lambda: Revocation(FAMILY, families[0]) in heard, what="the families of the grant")
        # A promotion's grants: the second one's writes long after the first one's.
        elsewhere.list_grants = lambda subject: asyncio.sleep(0, grants)
        promoted = await revocation.end_chains_before_promotion(elsewhere, "u_alice", clock)
        assert {grant_id: ended.count for grant_id, ended in promoted.items()} == {grants[1].grant_id: 1}
        await eventually(lambda: {Revocation(GRANT, grants[1].grant_id), Revocation(FAMILY, families[1])} <= set(heard),
                         what="the promotion's later grant")
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


@pytest.mark.gen_test(timeout=30)
async def test_a_narrowing_whose_withdrawal_took_long_is_heard_by_a_polling_relay(store):
    """A narrowing withdraws the scopes from the client's tokens before it writes the client
    with its mark: the mark is stamped when it is written, after a withdrawal that took long."""
    from tokensvc.oauth import revocation

    polls = Polls()
    elsewhere = other_process(store)
    late = poll_overlap(elsewhere).total_seconds() + 1
    clock = lagging(late)
    before = Client("c1", "One", ["https://a/cb"], ["read", "write"])
    await elsewhere.put_client(before)
    heard, listening = await hearing(store, polls)
    withdraw = elsewhere.withdraw_scopes

    async def long(client_id, kept):
        clock.advance(late)  # a large client's tokens
        return await withdraw(client_id, kept)

    elsewhere.withdraw_scopes = long
    try:
        await revocation.client_change(elsewhere, before, {"allowed_scopes": ["read"]}, clock,
                                       lambda marks: elsewhere.update_client("c1", {"allowed_scopes": ["read"],
                                                                                    **marks}))
        await eventually(lambda: Revocation(CLIENT, "c1") in heard, what="the narrowing")
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


@pytest.mark.gen_test(timeout=30)
async def test_a_registrations_later_batch_of_leftovers_is_heard_by_a_polling_relay(store, monkeypatch):
    """A registration revokes the grants left under its id a batch at a time before it claims
    the id: each batch is stamped when it is written (the registration's moment is the bound
    of the leftovers, not the time of the writes), so a polling relay hears a later batch."""
    from tokensvc.oauth import removal

    monkeypatch.setattr(removal, "BATCH", 1)
    polls = Polls()
    elsewhere = other_process(store)
    late = poll_overlap(elsewhere).total_seconds() + 1
    clock = lagging(late)
    grants = [await elsewhere.save_grant("c1", Subject(user_id=f"u_{index}"), ["read"], clock())
              for index in range(2)]
    clock.advance(1)
    now = clock()
    heard, listening = await hearing(store, polls)
    revoke, batches = elsewhere.revoke_client_grants, []

    async def long(client_id, stamp, limit, before=None):
        batch = await revoke(client_id, stamp, limit, before)
        batches.append(list(batch))
        clock.advance(late)  # a batch that took long
        return batch

    elsewhere.revoke_client_grants = long
    try:
        await removal.register(elsewhere, Client("c1", "One", ["https://a/cb"], ["read"], created_at=now), now,
                               clock=clock)
        assert sorted(batches[0] + batches[1]) == sorted(grant.grant_id for grant in grants)
        await eventually(lambda: Revocation(GRANT, batches[1][0]) in heard, what="the later batch heard")
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


def test_an_insert_elsewhere_than_removed_clients_is_no_revocation():
    """The move to format 2 inserts a copy of a revoked family or an ended session
    (hashes.finish): the change stream hears an insert holding the mark, and it revokes
    nothing; a removal's first mark (an upsert that made its document) names the client."""
    from tokensvc.storage.mongo.feed import _revocations

    at = utcnow()
    for collection, mark in (("families", "revoked_at"), ("sessions", "ended_at"), ("grants", "revoked_at")):
        change = {"operationType": "insert", "ns": {"coll": collection}, "documentKey": {"_id": "ab" * 32},
                  "fullDocument": {"_id": "ab" * 32, mark: at}}
        assert _revocations(change) == []
    mark = {"operationType": "insert", "ns": {"coll": "removed_clients"}, "documentKey": {"_id": "c1"},
            "fullDocument": {"_id": "c1", "removed_at": at}}
    assert _revocations(mark) == [Revocation(CLIENT, "c1")]


@pytest.mark.gen_test(timeout=30)
async def test_a_revocation_in_another_process_carries_the_audience_of_the_tokens_it_may_touch(store):
    """The audience of a revocation travels with its mark through the store, so that the relay of
    every process tells it to the resource servers it concerns alone: another process revokes a
    grant whose tokens are meant for photos alone (its mark, and its families'), demotes their user,
    narrows their client; each is heard with that audience. A mark written without one (as the
    previous release writes it), or written again over one (a re-stamp, a write of that release),
    is heard as every reader's."""
    from helpers import make_config

    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context
    from tokensvc.oauth import revocation

    photos = "https://photos.example"
    now = Clock().now
    store.observer = polls = Polls()
    feed = store.revocation_feed(poll_seconds=0.05).__aiter__()

    async def heard(count: int) -> set[tuple[str, str, tuple[str, ...] | None]]:
        revocations = [await asyncio.wait_for(feed.__anext__(), DEADLINE) for _ in range(count)]
        return {(revoked.kind, revoked.key, revoked.audience) for revoked in revocations}

    elsewhere = other_process(store)
    there = make_context(make_config(), elsewhere)
    await elsewhere.put_user(User("u1", "una", "h1", admin=True))
    await elsewhere.put_client(Client("c1", "One", ["https://a/cb"], ["read", "write"]))
    grants = [await elsewhere.save_grant("c1", Subject(user_id=user_id), ["read"], now) for user_id in ("u1", "u2")]
    for index, grant in enumerate(grants):
        await elsewhere.create_family(Family(
            f"f{index}", grant.grant_id, "c1", grant.subject.user_id, None, 0, ["read"], now, f"r{index}",
            f"a{index}", now, now + timedelta(hours=1), now + timedelta(minutes=10), renewed_at=now, audience=[photos]))
    # una's tokens in force once her grant of c1 is revoked: those of c2, meant for photos alone.
    await elsewhere.put_client(Client("c2", "Two", ["https://a/cb"], ["read"]))
    other_grant = await elsewhere.save_grant("c2", Subject(user_id="u1"), ["read"], now)
    await elsewhere.create_family(Family(
        "f2", other_grant.grant_id, "c2", "u1", None, 0, ["read"], now, "r2", "a2", now, now + timedelta(hours=1),
        now + timedelta(minutes=10), renewed_at=now, audience=[photos]))
    waiting = asyncio.ensure_future(feed.__anext__())
    await asyncio.wait_for(polls.began.wait(), DEADLINE)
    await revocation.revoke_grant(there, grants[0].grant_id, "test")
    first = await waiting
    assert {(first.kind, first.key, first.audience)} | await heard(1) == {
        (GRANT, grants[0].grant_id, (photos,)), (FAMILY, "f0", (photos,))}
    await admin.set_admin(there, "una", False)
    assert await heard(1) == {(SUBJECT, "u1", (photos,))}
    await admin.update_client(there, "c1", {"scopes": ["read"]})
    assert await heard(1) == {(CLIENT, "c1", (photos,))}
    # The previous release marks the other grant, and the user again: heard as every reader's.
    await elsewhere.authorizations.grants.update_one({"_id": grants[1].grant_id}, {"$set": {"revoked_at": now}})
    assert await heard(1) == {(GRANT, grants[1].grant_id, None)}
    await elsewhere.registry.users.update_one({"_id": "u1"}, {"$set": {"narrowed_at": Clock().now + timedelta(
        seconds=1)}})
    assert await heard(1) == {(SUBJECT, "u1", None)}
    await feed.aclose()


@pytest.mark.parametrize("config", [with_apis()], ids=["apis"])
@pytest.mark.gen_test(timeout=30)
async def test_a_resource_server_hears_another_processes_revocations_by_audience(app, http_server, base_url, store,
                                                                               ctx, config):
    """Another process revokes a grant whose tokens are meant for photos alone, then one meant
    for notes, then one naming none, and demotes the user whose tokens in force are meant for
    notes.
    notes-api, reading this process's feed (which its relay feeds), hears the notes and the
    unbound ones alone, numbered without a gap; the web app hears every one."""
    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context
    from tokensvc.oauth import revocation
    from tokensvc.oauth.feed import family_label

    async with relaying(store, ctx.events):
        notes = await connect_feed(base_url, client_id="notes-api", secret=NOTES_SECRET)
        webapp = await connect_feed(base_url)
        for reader in (notes, webapp):
            await next_message(reader)
        issued = {name: await issued_as(ctx, *how) for name, how in {
            "photos": ("alice", "webapp", WEBAPP_REDIRECT, PHOTOS),
            "notes": ("root", "webapp", WEBAPP_REDIRECT, NOTES),
            "none": ("alice", "skyplanner", SKY_REDIRECT)}.items()}
        grants = {name: await grant_of(ctx, tokens) for name, tokens in issued.items()}
        named = {name: {grants[name], family_label((await family_of(store, tokens.access_token)).family_id)}
                 for name, tokens in issued.items()}
        there = make_context(config, other_process(store))  # no event of this process fires
        for name in ("photos", "notes", "none"):
            await revocation.revoke_grant(there, grants[name], "test")
        heard = [await next_message(notes) for _ in range(4)]
        assert [message["seq"] for message in heard] == [1, 2, 3, 4]
        assert {message.get("grant_id") or message.get("family_id") for message in heard} == (
            named["notes"] | named["none"])  # nothing of photos
        await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, NOTES)  # root's tokens in force: notes
        await admin.set_admin(there, "root", False)
        root = await store.get_user_by_username("root")
        assert await next_message(notes) == {"type": "revoked", "seq": 5, "sub": root.user_id}
        everything = [await next_message(webapp) for _ in range(7)]
        assert {message.get("grant_id") or message.get("family_id") or message.get("sub")
                for message in everything} == named["photos"] | named["notes"] | named["none"] | {root.user_id}
        notes.close()
        webapp.close()


@pytest.mark.gen_test(timeout=30)
async def test_a_family_exchanged_while_its_user_is_demoted_is_named_with_its_audience(store):
    """A code of the user's is exchanged between the read of their families' audiences and the
    demotion's mark: its family stood until the mark, so its audience is read again after it,
    the announcement carries it, and the mark is written again with it, which another process's
    relay hears: a resource server that family's tokens are meant for hears the demotion too."""
    from helpers import make_config

    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context

    photos = "https://photos.example"
    now = Clock().now
    store.observer = polls = Polls()
    feed = store.revocation_feed(poll_seconds=0.05).__aiter__()
    elsewhere = other_process(store)
    there = make_context(make_config(), elsewhere)
    announced: list[Revocation | None] = []
    there.events.watch(announced.append)
    await elsewhere.put_user(User("u1", "una", "h1", admin=True))
    grant = await elsewhere.save_grant("webapp", Subject(user_id="u1"), ["read"], now)

    def family(index: int, audience: list[str]) -> Family:
        return Family(f"f{index}", grant.grant_id, "webapp", "u1", None, 0, ["read"], now, f"r{index}", f"a{index}",
                      now, now + timedelta(hours=1), now + timedelta(minutes=10), renewed_at=now, audience=audience)

    await elsewhere.create_family(family(0, [NOTES]))
    read = elsewhere.families_audience

    async def racing(**which):
        audience = await read(**which)
        if (await elsewhere.get_family("f1"))[0] is None:
            await elsewhere.create_family(family(1, [photos]))  # exchanged just after the read
        return audience

    elsewhere.families_audience = racing
    waiting = asyncio.ensure_future(feed.__anext__())
    await asyncio.wait_for(polls.began.wait(), DEADLINE)
    await admin.set_admin(there, "una", False)
    assert [(each.kind, each.key, each.audience) for each in announced if each is not None] == [
        (SUBJECT, "u1", (NOTES, photos))]
    heard = [await waiting]
    while heard[-1].audience != (NOTES, photos):  # the second mark (a poll may read the first too)
        heard.append(await asyncio.wait_for(feed.__anext__(), DEADLINE))
    assert {(each.kind, each.key) for each in heard} == {(SUBJECT, "u1")}
    await feed.aclose()


@pytest.mark.parametrize("config", [with_apis()], ids=["apis"])
@pytest.mark.gen_test(timeout=30)
async def test_another_processes_grant_revocation_names_no_family_of_another_api(app, http_server, base_url,
                                                                                  store, ctx, config):
    """alice's grant to the web app holds a family meant for notes and one meant for photos
    alone. Another process revokes it, then root's grant meant for notes. notes-api hears the
    grant and the notes family, never the photos family's label."""
    from tokensvc.bootstrap import make_context
    from tokensvc.oauth import revocation
    from tokensvc.oauth.feed import family_label

    async with relaying(store, ctx.events):
        notes = await connect_feed(base_url, client_id="notes-api", secret=NOTES_SECRET)
        await next_message(notes)
        for_notes = await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT, NOTES)
        for_photos = await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT, PHOTOS)
        delimiter = await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, NOTES)
        grant = await grant_of(ctx, for_notes)
        assert await grant_of(ctx, for_photos) == grant  # one grant, two families
        photos_label = family_label((await family_of(store, for_photos.access_token)).family_id)
        last = await grant_of(ctx, delimiter)
        there = make_context(config, other_process(store))  # no event of this process fires
        await revocation.revoke_grant(there, grant, "test")
        await revocation.revoke_grant(there, last, "test")
        heard = []
        while not heard or heard[-1].get("grant_id") != last:
            heard.append(await next_message(notes))
        labels = {message.get("family_id") for message in heard}
        assert photos_label not in labels, f"notes-api heard the photos family's label: {heard}"
        notes.close()
