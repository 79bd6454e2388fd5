"""The revocation relay on a real change stream: quiet is no error, the resume token follows
every answer, a stream that cannot resume starts again from now with one re-check, one the
server closes or that stops answering is opened again where it stood, and the feed's reported
state is what it does."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from datetime import timedelta

import pytest
from bson import Timestamp
from helpers import DEADLINE, eventually
from primary import BUDGET_MS, Fault, wire_settings

from tokensvc.bootstrap import make_store
from tokensvc.oauth import events, hashing
from tokensvc.records import Session, utcnow
from tokensvc.storage.base import SESSION, Revocation, StorageError, StoreObserver

pytestmark = pytest.mark.gen_test(timeout=30)

HEARD_SECONDS = 1.0  # the bound: a revocation is heard this soon after the store is back


async def next_revocation(feed, seconds=DEADLINE):
    return await asyncio.wait_for(feed.__anext__(), seconds)


async def streaming(store):
    """Until the change stream is open: its first answer (events or none) gave a resume point."""
    await eventually(lambda: store.feed.resume_token is not None, what="the change stream open")


async def polling(primary):
    """Until the feed polls (its starting point set): it has read a revocation field."""
    await eventually(lambda: primary.sent("find", "sessions"), what="the feed polling")


async def add_sessions(store, *ids):
    now = utcnow()
    for session_id in ids:
        await store.add_session(Session(session_id, "u_alice", now, now + timedelta(hours=1)))


async def test_revocations_arrive_and_quiet_longer_than_the_budget_is_no_error(wire_store, primary, caplog):
    await add_sessions(wire_store, "s1", "s2")
    feed = wire_store.revocation_feed()
    waiting = asyncio.ensure_future(next_revocation(feed))
    loop = asyncio.get_running_loop()
    quiet_until = loop.time() + BUDGET_MS / 1000 + 1
    # Quiet for longer than an operation's budget, the stream asking again and again meanwhile.
    await eventually(lambda: loop.time() > quiet_until and len(primary.sent("getMore")) >= 2, what="a quiet stream")
    assert not waiting.done()
    await wire_store.end_session("s1", utcnow())
    with caplog.at_level(logging.WARNING):
        assert await waiting == Revocation(SESSION, "s1")
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert wire_store.feed.resume_token is not None  # kept from the answers while quiet
    await feed.aclose()


async def test_the_resume_token_follows_every_answer_not_only_events(wire_store, primary):
    feed = wire_store.revocation_feed()
    pending = asyncio.ensure_future(next_revocation(feed))
    await streaming(wire_store)  # no event yet: the server's postBatchResumeToken
    quiet_token = wire_store.feed.resume_token
    await add_sessions(wire_store, "s1")  # an insert: no revocation, but the stream moves on
    await wire_store.end_session("s1", utcnow())
    assert await pending == Revocation(SESSION, "s1")
    assert wire_store.feed.resume_token != quiet_token
    await feed.aclose()


async def test_a_stream_that_cannot_resume_starts_again_from_now_and_every_socket_rechecks(wire_store, primary):
    await add_sessions(wire_store, "s1", "s2")
    rechecks = []
    revocation_events = events.RevocationEvents()
    revocation_events.subscribe([Revocation(SESSION, "unrelated")], lambda: rechecks.append("all"))
    seen = []
    revocation_events.subscribe([Revocation(SESSION, "s2")], lambda: seen.append("s2"))
    relay = asyncio.ensure_future(events.relay(wire_store, revocation_events, retry_seconds=0.1))
    await streaming(wire_store)
    # The connection drops under the stream, and meanwhile the history it would resume from is gone.
    primary.lose_history()
    primary.script(Fault("getMore", "hangup"))
    await eventually(lambda: len(primary.sent("aggregate")) >= 3 and rechecks, what="the stream started again from now")
    assert rechecks == ["all"] and seen == ["s2"]  # restarted: every listener re-checked once
    resumes = [doc["pipeline"][0]["$changeStream"] for doc in primary.sent("aggregate")]
    assert "resumeAfter" in resumes[1] and "resumeAfter" not in resumes[2]  # refused, then from now
    seen.clear()
    await wire_store.end_session("s2", utcnow())
    await eventually(lambda: seen, what="the revocation after the restart")
    assert seen == ["s2"]  # and it follows revocations again
    relay.cancel()
    await asyncio.gather(relay, return_exceptions=True)


async def test_without_change_streams_the_revocation_fields_are_polled(wire_store, primary, caplog):
    primary.change_streams = False
    await add_sessions(wire_store, "s1")
    feed = wire_store.revocation_feed(poll_seconds=0.05)
    waiting = asyncio.ensure_future(next_revocation(feed))
    await polling(primary)
    assert not wire_store.feed.change_streams and not waiting.done()  # polling, nothing revoked yet
    await wire_store.end_session("s1", utcnow())
    assert await waiting == Revocation(SESSION, "s1")
    assert "polling for revocations" in caplog.text
    await feed.aclose()


@pytest.mark.parametrize("wire_budget_ms", [9000])
async def test_a_revocation_whose_write_lands_late_within_its_budget_is_heard_by_polling(wire_store, primary,
                                                                                      wire_budget_ms):
    """Another process ends a session, and the server holds the write six seconds before it
    applies it (a write waiting out a busy server, or retried until a new primary is elected,
    lands so), within the store's budget. The write carries the time it was asked at: a poll
    reads back the budget and the clocks' skew before its last one, so it hears it (reading
    five seconds back, it never did, and the session's socket stayed open)."""
    primary.change_streams = False
    await add_sessions(wire_store, "late", "next")
    other = make_store(wire_settings(primary, timeout_ms=wire_budget_ms))  # a second process
    feed = wire_store.revocation_feed(poll_seconds=0.05)
    heard = []

    async def listen():
        async for revocation in feed:
            heard.append(revocation)

    listening = asyncio.ensure_future(listen())
    try:
        await polling(primary)
        primary.script(Fault("update", "delay", collection="sessions", seconds=6))
        assert await other.end_session("late", utcnow())  # applied six seconds after its time
        assert await other.end_session("next", utcnow())
        await eventually(lambda: Revocation(SESSION, "next") in heard, what="the revocation after it")
        # A poll that found "next" read the sessions after "late" landed.
        assert Revocation(SESSION, "late") in heard
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        await other.close()


async def test_a_revocation_asked_again_stamps_again_a_mark_that_landed_later_than_a_poll_reads_back(
        wire_store, primary):
    """A sign-out answered 503 (the store stopped waiting at its budget) whose write the server
    applied later than a poll reads back, with the time it was asked at: the client's retry
    finds the session ended already and writes nothing, so no polling relay ever heard it (a
    revoked token's socket stayed open). Asked again, the store stamps the mark with the time of
    the retry, and the relays hear it."""
    primary.change_streams = False
    await add_sessions(wire_store, "late")
    landed_with = utcnow() - timedelta(seconds=BUDGET_MS / 1000 + 5 + 10)  # older than a poll reads back
    primary.db["tokensvc"]["sessions"].update_many({}, {"$set": {"ended_at": landed_with}})
    feed = wire_store.revocation_feed(poll_seconds=0.05)
    waiting = asyncio.ensure_future(next_revocation(feed))
    try:
        await polling(primary)
        asked = utcnow()
        assert await wire_store.end_session("late", asked) is False  # ended already: the client's retry
        assert await waiting == Revocation(SESSION, "late")
        stamped = primary.db["tokensvc"]["sessions"].find_one({})["ended_at"]
        assert abs(stamped.replace(tzinfo=asked.tzinfo) - asked) < timedelta(milliseconds=2)
    finally:
        waiting.cancel()
        await feed.aclose()


async def test_a_revocation_the_store_stopped_waiting_for_is_stamped_again_once_it_lands(wire_store, primary):
    """The server holds a sign-out's write past the store's budget (503), then applies it with
    the time it was asked at: once the driver's call ends, the store stamps the mark again, with
    a time at or after it landed, which every poll after the landing reads back to."""
    await add_sessions(wire_store, "held")
    asked = utcnow()
    primary.script(Fault("update", "delay", collection="sessions", seconds=BUDGET_MS / 1000 + 0.5))
    with pytest.raises(StorageError):
        await wire_store.end_session("held", asked)
    sessions = primary.db["tokensvc"]["sessions"]
    await eventually(lambda: sessions.find_one({})["ended_at"] is not None, what="the write landed")
    await eventually(lambda: sessions.find_one({})["ended_at"].replace(tzinfo=asked.tzinfo) > asked,
                     what="the mark stamped again, after the write landed")


async def test_the_recheck_an_event_causes_reads_at_or_after_the_revocation(wire_store, primary):
    """Another process ended the session: the re-check this process makes on the event must not
    be answered from before that write (a primary elected meanwhile), so the event's cluster
    time becomes the floor of every read after it."""
    await add_sessions(wire_store, "s1")
    other = make_store(wire_settings(primary))  # a second process
    feed = wire_store.revocation_feed()
    pending = asyncio.ensure_future(next_revocation(feed))
    await streaming(wire_store)
    await other.end_session("s1", utcnow())
    revoked_at = primary.clock
    assert await pending == Revocation(SESSION, "s1")
    primary.forget()
    assert await wire_store.get_session("s1") is None  # ended
    assert primary.sent("find", "sessions")[0]["readConcern"]["afterClusterTime"] == Timestamp(1_700_000_000,
                                                                                               revoked_at)
    await feed.aclose()
    await other.close()


@pytest.mark.parametrize("streams", [True, False])
async def test_a_revocation_names_the_record_by_its_hash_as_the_records_do(wire_store, primary, streams):
    """Keys stored as 32 bytes (a session's hash, a family's id) reach the relay's subscribers
    as the hex the records and the sockets hold, from the change stream and from polling."""
    primary.change_streams = streams
    session_hash = hashing.digest("a session")
    await add_sessions(wire_store, session_hash)
    feed = wire_store.revocation_feed(poll_seconds=0.05)
    waiting = asyncio.ensure_future(next_revocation(feed))
    await (streaming(wire_store) if streams else polling(primary))
    await wire_store.end_session(session_hash, utcnow())
    assert await waiting == Revocation(SESSION, session_hash)
    await feed.aclose()


class States(StoreObserver):
    """What the store reports of its feed, in order."""

    def __init__(self):
        self.states = []

    def feed(self, state):
        self.states.append(state)


class Listening:
    """The relay of one process, with a socket standing on session s2 and one on nothing
    revoked here (it hears only re-checks of everything): the s2 socket hears each re-check
    too, so what reached it by the stream is :attr:`delivered`."""

    def __init__(self, store, retry_seconds=0.1):
        self.rechecks, self.seen = [], []
        self.events = events.RevocationEvents()
        self.events.subscribe([Revocation(SESSION, "unrelated")], lambda: self.rechecks.append("all"))
        self.events.subscribe([Revocation(SESSION, "s2")], lambda: self.seen.append("s2"))
        self.task = asyncio.ensure_future(events.relay(store, self.events, retry_seconds=retry_seconds))

    @property
    def delivered(self):
        return len(self.seen) - len(self.rechecks)

    async def stop(self):
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
def relay_of(io_loop):
    """Starts a process's relay (:class:`Listening`) on a store; stopped after the test, however it ends."""
    started = []

    def start(store, retry_seconds=0.1):
        started.append(Listening(store, retry_seconds))
        return started[-1]

    yield start
    for listening in started:
        io_loop.run_sync(listening.stop)


async def test_a_stream_the_server_closes_is_opened_again_where_it_stood_with_one_recheck(wire_store, primary,
                                                                                          relay_of):
    await add_sessions(wire_store, "s1", "s2")
    wire_store.observer = observer = States()
    listening = relay_of(wire_store)
    await eventually(lambda: observer.states == ["stream"], what="the stream open")
    primary.streams.close()  # the server ends the cursor: a getMore answered with cursor id 0
    await eventually(lambda: len(primary.sent("aggregate")) == 2, what="the stream opened again")
    await wire_store.end_session("s2", utcnow())
    await eventually(lambda: listening.delivered == 1, what="the revocation")
    assert listening.rechecks == ["all"]  # once, for what the gap may hold
    reopened = primary.sent("aggregate")[1]["pipeline"][0]["$changeStream"]
    assert "resumeAfter" in reopened  # where it stood: nothing in between is lost
    assert observer.states == ["stream", "interrupted", "stream"]  # never polling, and it says so


async def test_a_get_more_that_hangs_is_abandoned_and_the_stream_opened_again(wire_store, primary, relay_of):
    await add_sessions(wire_store, "s2")
    primary.script(Fault("getMore", "delay", seconds=60))  # the first getMore never answers
    listening = relay_of(wire_store)
    await eventually(lambda: primary.sent("getMore"), what="the first getMore")
    await wire_store.end_session("s2", utcnow())  # while the getMore hangs
    watchdog = 1 + BUDGET_MS / 1000  # the stream's await time, and the budget
    await eventually(lambda: listening.delivered == 1, seconds=watchdog + 5, what="the revocation")
    assert listening.rechecks == ["all"]
    assert "resumeAfter" in primary.sent("aggregate")[1]["pipeline"][0]["$changeStream"]  # where it stood


async def test_a_relay_that_waited_out_the_store_follows_it_within_a_second_of_its_return(wire_store, primary,
                                                                                           relay_of):
    """The store goes down under the stream: the driver's resume waits for a server its whole
    selection timeout (the budget, 2 s) and the feed is interrupted. The store is back at once.
    The relay, whose attempt took longer than its pause between attempts (a second, as
    ``serve`` runs it), tries again at once and so follows the store within a second of its
    return, where it stood, with one re-check for what the gap may hold; it does not first
    sleep its second."""
    await add_sessions(wire_store, "s2")
    wire_store.observer = observer = States()
    listening = relay_of(wire_store, retry_seconds=1.0)
    await eventually(lambda: observer.states == ["stream"], what="the stream open")
    primary.set_down(0)
    await eventually(lambda: "interrupted" in observer.states, what="the feed interrupted")
    primary.set_down(0, False)
    await eventually(lambda: observer.states[-1] == "stream", seconds=HEARD_SECONDS,
                     what="the stream open again within a second of the store's return")
    assert "resumeAfter" in primary.sent("aggregate")[-1]["pipeline"][0]["$changeStream"]
    await wire_store.end_session("s2", utcnow())
    await eventually(lambda: listening.delivered == 1, what="the revocation")
    assert listening.rechecks == ["all"]


async def test_the_feed_says_stream_only_once_a_stream_is_open(wire_store, primary, relay_of):
    wire_store.observer = observer = States()
    primary.script(Fault("aggregate", "error", code=6, times=2))  # HostUnreachable, twice
    relay_of(wire_store)
    await eventually(lambda: "stream" in observer.states, what="the stream open")
    assert observer.states == ["interrupted", "interrupted", "stream"]
    assert len(primary.sent("aggregate")) == 3


async def test_an_invalidated_stream_follows_from_now_with_one_recheck(wire_store, primary, relay_of):
    await add_sessions(wire_store, "s1", "s2")
    listening = relay_of(wire_store)
    await eventually(lambda: primary.sent("getMore"), what="the stream open")
    primary.streams.invalidate()  # the database dropped or renamed under the stream
    await eventually(lambda: len(primary.sent("aggregate")) == 2, what="the stream opened again")
    assert "resumeAfter" not in primary.sent("aggregate")[1]["pipeline"][0]["$changeStream"]  # from now
    assert listening.rechecks == ["all"]
    await wire_store.end_session("s2", utcnow())
    await eventually(lambda: listening.delivered == 1, what="the revocation")


@pytest.mark.parametrize("streams", [True, False])
async def test_a_user_demoted_or_removed_in_another_process_is_named(wire_store, primary, streams):
    """Another process demotes root (its seeding made root an administrator), then removes the
    user: the demotion's write carries the user's mark, which this process's feed hears from the
    change stream and from polling; the removal's mark, written just before the deletion, is in
    the change stream (a poll finds no document once it is deleted: the removal's revoked grants
    name what a cache holds, tests/test_demotion.py)."""
    from helpers import make_config

    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context, seed
    from tokensvc.storage.base import SUBJECT

    primary.change_streams = streams
    config = make_config()
    other = make_store(wire_settings(primary))  # a second process
    await seed(other, config)
    root = await other.get_user_by_username("root")
    feed = wire_store.revocation_feed(poll_seconds=0.05)
    waiting = asyncio.ensure_future(next_revocation(feed))
    await (streaming(wire_store) if streams else polling(primary))
    elsewhere = make_context(config, other)
    await admin.set_admin(elsewhere, "root", False)
    assert await waiting == Revocation(SUBJECT, root.user_id)
    assert (await wire_store.get_user(root.user_id)).narrowed_at is not None
    if streams:
        waiting = asyncio.ensure_future(next_revocation(feed))
        await admin.remove_user(elsewhere, "root")
        assert await waiting == Revocation(SUBJECT, root.user_id)
    await feed.aclose()
    await other.close()


@pytest.mark.parametrize("streams", [True, False])
async def test_a_clients_two_marks_are_heard_apart(wire_store, primary, streams):
    """Another process changes a client: a new secret alone is heard as a change of its feed
    readers' credentials (CREDENTIALS), a narrowing alone as the client's (CLIENT, which the
    revocation feed names), a change that is both (made a resource server) as both, and a change
    that marks nothing not at all; from the change stream (which says which fields an update
    set) and from polling (which reads each mark through its own partial index)."""
    from tokensvc.records import Client
    from tokensvc.storage.base import CLIENT, CREDENTIALS

    primary.change_streams = streams
    other = make_store(wire_settings(primary))  # a second process
    await other.open()
    await other.put_client(Client("c1", "One", ["https://a/cb"], ["read", "write"], secret_hash="s1"))
    feed = wire_store.revocation_feed(poll_seconds=0.05)
    waiting = asyncio.ensure_future(next_revocation(feed))
    await (streaming(wire_store) if streams else polling(primary))
    await other.update_client("c1", {"description": "nothing withdrawn"})
    now = utcnow()
    await other.update_client("c1", {"secret_hash": "s2", "credentials_changed_at": now})
    assert await waiting == Revocation(CREDENTIALS, "c1")
    await other.update_client("c1", {"allowed_scopes": ["read"], "narrowed_at": now})
    assert await next_revocation(feed) == Revocation(CLIENT, "c1")
    later = now + timedelta(milliseconds=1)
    await other.update_client("c1", {"allowed_scopes": [], "kind": "resource-server", "narrowed_at": later,
                                     "credentials_changed_at": later})
    assert {await next_revocation(feed) for _ in range(2)} == {Revocation(CLIENT, "c1"), Revocation(CREDENTIALS, "c1")}
    if streams:  # the projection keeps the marks the match selected on
        assert "updateDescription.updatedFields.credentials_changed_at" in primary.sent("aggregate")[-1][
            "pipeline"][2]["$project"]
    else:
        assert any("credentials_changed_at" in doc["filter"] for doc in primary.sent("find", "clients"))
    await feed.aclose()
    await other.close()


@pytest.mark.parametrize("streams", [True, False])
async def test_a_client_removed_in_another_process_is_named_once_its_tokens_are_refused(wire_store, primary,
                                                                                       streams):
    """Another process removes a client whose document is gone moments later, and one whose
    grants' revocation the store cuts short: each is named (CLIENT) from the removal's mark,
    written after its record (an upsert: an insert event, or a poll of its own partial index),
    and the removal is there when it is heard, so that a re-check finds the client gone."""
    from tokensvc.oauth import removal
    from tokensvc.records import Client
    from tokensvc.storage.base import CLIENT, StorageError

    primary.change_streams = streams
    other = make_store(wire_settings(primary))  # a second process
    await other.open()
    for client_id in ("c1", "c2"):
        await other.put_client(Client(client_id, client_id.upper(), ["https://a/cb"], ["read"]))
    feed = wire_store.revocation_feed(poll_seconds=0.05)
    waiting = asyncio.ensure_future(next_revocation(feed))
    await (streaming(wire_store) if streams else polling(primary))
    assert await removal.remove_client(other, "c1", utcnow) == 0
    assert await waiting == Revocation(CLIENT, "c1")
    assert await wire_store.get_client("c1") is None and await wire_store.get_removal("c1") is None

    async def cut_short(*args):
        raise StorageError("the store went away")

    other.revoke_client_grants = cut_short
    with pytest.raises(StorageError):
        await removal.remove_client(other, "c2", utcnow)
    assert await next_revocation(feed) == Revocation(CLIENT, "c2")
    assert await wire_store.get_removal("c2") is not None and await wire_store.get_client("c2") is None
    await feed.aclose()
    await other.close()


@pytest.mark.parametrize("streams", [True, False])
async def test_a_clients_removal_in_another_process_marks_each_grant_and_family_with_its_own_audience(
        wire_store, primary, streams):
    """Another process removes a client with a grant whose tokens are meant for photos alone
    and one meant for notes alone: the change stream and polling hear each grant with its own
    families' audience and each family with its own, never the client's together."""
    from tokensvc.oauth import removal
    from tokensvc.records import Client, Family, Subject
    from tokensvc.storage.base import CLIENT, FAMILY, GRANT

    photos, notes = "https://photos.example", "https://notes.example"
    primary.change_streams = streams
    other = make_store(wire_settings(primary))  # a second process
    await other.open()
    now = utcnow()
    await other.put_client(Client("c1", "One", ["https://a/cb"], ["read"]))
    grants = [await other.save_grant("c1", Subject(user_id=user_id), ["read"], now) for user_id in ("u1", "u2")]
    for index, (grant, audience) in enumerate(zip(grants, (photos, notes), strict=True)):
        await other.create_family(Family(
            hashing.digest(f"f{index}"), grant.grant_id, "c1", grant.subject.user_id, None, 0, ["read"], now,
            hashing.digest(f"r{index}"), hashing.digest(f"a{index}"), now, now + timedelta(hours=1),
            now + timedelta(minutes=10), renewed_at=now, audience=[audience]))
    feed = wire_store.revocation_feed(poll_seconds=0.05)
    waiting = asyncio.ensure_future(next_revocation(feed))
    await (streaming(wire_store) if streams else polling(primary))
    await removal.remove_client(other, "c1", utcnow)
    heard: dict[str, set] = defaultdict(set)
    first = await waiting
    heard[first.kind].add((first.key, first.audience))
    while len(heard[GRANT]) < 2 or len(heard[FAMILY]) < 2:
        revoked = await next_revocation(feed)
        heard[revoked.kind].add((revoked.key, revoked.audience))
    assert heard[GRANT] == {(grants[0].grant_id, (photos,)), (grants[1].grant_id, (notes,))}
    assert heard[FAMILY] == {(hashing.digest("f0"), (photos,)), (hashing.digest("f1"), (notes,))}
    assert heard[CLIENT] <= {("c1", (notes, photos))}
    await feed.aclose()
    await other.close()


@pytest.mark.parametrize("streams", [True, False])
async def test_a_revocation_in_another_process_carries_its_audience(wire_store, primary, streams):
    """Another process revokes a grant whose tokens are meant for photos and notes, a family
    for each, then demotes their user, whose tokens in force are meant for photos: the change
    stream (which sends what an update set) and polling (which reads the mark's document) both
    hear each with its audience (the grant with its families' together, each family with its
    own: one sweep writes both), which every process's revocation feed tells those APIs'
    readers alone. A mark written without one, as the previous release writes it, is heard as
    every reader's."""
    from helpers import make_config

    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context
    from tokensvc.oauth import revocation
    from tokensvc.records import Family, Subject, User
    from tokensvc.storage.base import FAMILY, GRANT, SUBJECT

    photos, notes = "https://photos.example", "https://notes.example"
    primary.change_streams = streams
    other = make_store(wire_settings(primary))  # a second process
    await other.open()
    there = make_context(make_config(), other)
    now = utcnow()
    await other.put_user(User("u1", "una", "h1", admin=True))
    grants = [await other.save_grant("webapp", Subject(user_id=user_id), ["read"], now) for user_id in ("u1", "u2")]
    for index, grant in enumerate(grants):
        await other.create_family(Family(
            hashing.digest(f"f{index}"), grant.grant_id, "webapp", grant.subject.user_id, None, 0, ["read"], now,
            hashing.digest(f"r{index}"), hashing.digest(f"a{index}"), now, now + timedelta(hours=1),
            now + timedelta(minutes=10), renewed_at=now, audience=[photos]))
    await other.create_family(Family(
        hashing.digest("f2"), grants[0].grant_id, "webapp", "u1", None, 0, ["read"], now, hashing.digest("r2"),
        hashing.digest("a2"), now, now + timedelta(hours=1), now + timedelta(minutes=10), renewed_at=now,
        audience=[notes]))
    elsewhere = await other.save_grant("skyplanner", Subject(user_id="u1"), ["read"], now)
    await other.create_family(Family(
        hashing.digest("f3"), elsewhere.grant_id, "skyplanner", "u1", None, 0, ["read"], now, hashing.digest("r3"),
        hashing.digest("a3"), now, now + timedelta(hours=1), now + timedelta(minutes=10), renewed_at=now,
        audience=[photos]))
    feed = wire_store.revocation_feed(poll_seconds=0.05)
    waiting = asyncio.ensure_future(next_revocation(feed))
    await (streaming(wire_store) if streams else polling(primary))
    await revocation.revoke_grant(there, grants[0].grant_id, "test")
    revoked = [await waiting, await next_revocation(feed), await next_revocation(feed)]
    assert {(each.kind, each.key, each.audience) for each in revoked} == {
        (GRANT, grants[0].grant_id, (notes, photos)), (FAMILY, hashing.digest("f0"), (photos,)),
        (FAMILY, hashing.digest("f2"), (notes,))}
    await admin.set_admin(there, "una", False)
    revoked = [await next_revocation(feed)]
    assert [(each.kind, each.key, each.audience) for each in revoked] == [(SUBJECT, "u1", (photos,))]
    await other.authorizations.grants.update_one({"_id": grants[1].grant_id}, {"$set": {"revoked_at": now}})
    revoked = [await next_revocation(feed)]
    assert [(each.kind, each.key, each.audience) for each in revoked] == [(GRANT, grants[1].grant_id, None)]
    await feed.aclose()
    await other.close()
