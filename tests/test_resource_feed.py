"""tokensvc.resource and the revocation feed: a resumed feed is current only once the messages
it missed are in (a connection cut before them resumes from the same point), a flush has every
watched connection asked again a few at a time without closing any that tokensvc is merely slow
to confirm, a message the verifier does not understand drops every answer, and the feed's life
is logged and counted without a token."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections import Counter

import pytest
import tornado.web
import tornado.websocket
from helpers import DEADLINE, WEBAPP_SECRET, basic, eventually, issue_tokens
from test_resource import Monotonic, drop_feeds, revoke, serve, started, verifier_for
from test_ws import tokens

from tokensvc import schemas
from tokensvc.oauth import introspection
from tokensvc.oauth.feed import Opening
from tokensvc.resource import InvalidToken, Settings, Unavailable, Verifier
from tokensvc.resource.cache import KEYS
from tokensvc.resource.feed import READY_FIELDS
from tokensvc.storage.base import StorageError

ACTIVE = {"active": True, "scope": "read", "exp": 2**40, "client_id": "webapp", "sub": "alice"}


class FakeTokensvc:
    """Stands in for tokensvc over real HTTP, for what the real one never does (a frame lost,
    a message out of turn, a handshake that hangs). Introspection answers ``ACTIVE`` (with a
    ``grant_id`` of the token's own) for the tokens in ``active``, inactive for any other, held
    until ``release`` is set when ``held(token)``. The feed's ``ready`` (or ``ready_instead``)
    resumes a reader of its stream that is not ahead of it and replays what it missed, after
    whatever ``before_ready`` holds; :meth:`publish` numbers a message, :meth:`send` writes one
    as it is; ``handshake``, when set, holds each upgrade after the first ``free_upgrades``.
    An answer carries ``exp`` and the header ``Date``: Tornado's, or ``date`` (``""``: none)."""

    def __init__(self):
        self.active, self.asked, self.release = set(), [], asyncio.Event()
        self.held = lambda token: False
        self.stream, self.published, self.feeds, self.closed, self.upgrades = "s1", [], [], 0, 0
        self.handshake: asyncio.Event | None = None
        self.free_upgrades, self.before_ready, self.ready_instead = 0, [], None
        self.exp, self.date = 2**40, None
        fake = self

        class Introspect(tornado.web.RequestHandler):
            async def post(self):
                token = self.get_body_argument("token")
                fake.asked.append(token)
                if fake.date is not None:
                    self.clear_header("Date")
                    if fake.date:
                        self.set_header("Date", fake.date)
                if fake.held(token):
                    await fake.release.wait()
                if token in fake.active:
                    self.write({**ACTIVE, "grant_id": "g-" + token[:8], "exp": fake.exp})
                else:
                    self.write({"active": False})

        class Feed(tornado.websocket.WebSocketHandler):
            async def get(self, *args, **kwargs):
                fake.upgrades += 1
                if fake.handshake is not None and fake.upgrades > fake.free_upgrades:
                    await fake.handshake.wait()
                await super().get(*args, **kwargs)

            def open(self):
                fake.feeds.append(self)
                stream, after = self.get_query_argument("stream", None), self.get_query_argument("after", None)
                resumed = stream == fake.stream and after is not None and int(after) <= len(fake.published)
                for message in fake.before_ready:
                    self.write_message(json.dumps(message))
                self.write_message(json.dumps(fake.ready_instead or {
                    "type": "ready", "stream": fake.stream, "seq": len(fake.published), "resumed": resumed}))
                for message in fake.published[int(after):] if resumed else ():
                    self.write_message(json.dumps(message))

            def on_close(self):
                fake.feeds.remove(self)
                fake.closed += 1

        self.app = tornado.web.Application([("/oauth/token/introspect", Introspect), ("/oauth/revocations", Feed)])

    async def start(self):
        self.server, self.base_url = await serve(self.app)
        return self

    def publish(self, body, lost=False):
        """A message of the stream, numbered, to every reader (``lost``: on the way)."""
        self.published.append({**body, "seq": len(self.published) + 1})
        if not lost:
            self.send(self.published[-1])

    def send(self, message):
        for feed in self.feeds:
            feed.write_message(json.dumps(message))

    def stop(self):
        self.release.set()
        self.server.stop()
        for feed in list(self.feeds):
            feed.close()


@contextlib.asynccontextmanager
async def fake_tokensvc_and_verifier(**settings):
    """A :class:`FakeTokensvc` and a verifier of it whose feed is up; both closed after."""
    fake = await FakeTokensvc().start()
    try:
        verifier = await started(verifier_for(fake.base_url, **settings))
        try:
            yield fake, verifier
        finally:
            await verifier.close()
    finally:
        fake.stop()


def tokens_of(prefix, count):
    """``count`` tokens of the form tokensvc issues, each its own."""
    return [f"{prefix}{number:05d}".ljust(43, "x") for number in range(count)]


@pytest.mark.gen_test(timeout=120)
async def test_a_flush_during_a_flood_of_made_up_tokens_closes_no_valid_connection():
    """Anyone may send made-up tokens: while hundreds of them wait on a slow introspection,
    a flush has every watched connection asked again on places of their own, answered at
    once, and none of them ends; the flood's checks past the queue fail at once (503)."""
    # The held introspections outlast every wait below (one given up would let another of the
    # queue in, and the counts would move on).
    async with fake_tokensvc_and_verifier(timeout=DEADLINE, offline_ttl=3600, retry_seconds=0.05,
                                          reverify_spread=0.0, introspection_queue=256) as (fake, verifier):
        watched = tokens_of("w", 20)
        fake.active.update(watched)
        ended = []
        stops = [verifier.watch(token, await verifier.check(token), lambda token=token: ended.append(token))
                 for token in watched]
        fake.held = lambda token: token.startswith("junk")  # the made-up tokens' introspections hang
        flood = [asyncio.ensure_future(verifier.check(token)) for token in tokens_of("junk", 1000)]
        await eventually(lambda: len(fake.asked) == len(watched) + verifier.settings.introspection_concurrency,
                         DEADLINE, what="the flood's introspections in flight")
        assert sum(1 for check in flood if check.done() and isinstance(check.exception(), Unavailable)) == (
            1000 - verifier.settings.introspection_concurrency - verifier.settings.introspection_queue)
        fake.publish({"type": "flush"})
        await eventually(lambda: fake.asked.count(watched[-1]) == 2 and not verifier.reverifying, DEADLINE,
                         what="every watched token asked again during the flood")
        assert all(fake.asked.count(token) == 2 for token in watched) and not ended
        fake.release.set()
        await asyncio.gather(*flood, return_exceptions=True)
        for stop in stops:
            stop()


@pytest.mark.gen_test(timeout=90)
@pytest.mark.parametrize("fault", ["lost", "repeated", "reordered"])
async def test_a_message_out_of_sequence_breaks_the_connection_and_the_feed_resumes_after_the_last_processed(fault):
    """A middlebox loses, repeats or reorders a frame of the feed: the message that does not
    follow the last processed ends the connection, and the next resumes after the last message
    processed, so the revocation the lost frame carried is heard, and nothing is flushed."""
    async with fake_tokensvc_and_verifier(retry_seconds=0.05) as (fake, verifier):
        first, second = tokens_of("t", 2)
        fake.active.update((first, second))
        for token in (first, second):
            await verifier.check(token)
        fake.active.clear()  # both revoked at tokensvc
        revocations = [{"type": "revoked", "grant_id": "g-" + token[:8]} for token in (first, second)]
        if fault == "lost":
            fake.publish(revocations[0], lost=True)
            fake.publish(revocations[1])
        elif fault == "repeated":
            fake.publish(revocations[0])
            fake.send(fake.published[-1])
            fake.publish(revocations[1], lost=True)
        else:
            fake.publish(revocations[0], lost=True)
            fake.publish(revocations[1])
            fake.send(fake.published[0])
        await eventually(lambda: verifier.counts.resumes == 1 and verifier.feed_up and verifier.counts.revocations == 2,
                         DEADLINE, what="the feed resumed and both revocations heard")
        assert verifier.cached == 0 and verifier.counts.flushes == 1  # the first ready's only
        for token in (first, second):
            with pytest.raises(InvalidToken):
                await verifier.check(token)


@pytest.mark.gen_test(timeout=90)
async def test_a_message_before_ready_flushes_and_the_feed_is_current_only_after_a_ready():
    """A message before the connection's ``ready`` (a proxy's replay, a confused stream): every
    answer is dropped, the connection given up, and the feed is current only once a new
    connection's ``ready`` came."""
    fake = await FakeTokensvc().start()
    fake.before_ready = [{"type": "revoked", "grant_id": "elsewhere", "seq": 1}]
    fake.free_upgrades, fake.handshake = 1, asyncio.Event()  # the second connection waits
    verifier = verifier_for(fake.base_url, retry_seconds=0.05)
    try:
        await verifier.start()
        await eventually(lambda: fake.upgrades == 2, DEADLINE, what="the first connection given up")
        assert not verifier.feed_up and not verifier.connected.is_set()
        assert (verifier.counts.flushes, verifier.counts.messages, verifier.counts.revocations) == (1, 0, 0)
        fake.before_ready = []
        fake.handshake.set()
        await asyncio.wait_for(verifier.connected.wait(), DEADLINE)
    finally:
        await verifier.close()
        fake.stop()


@pytest.mark.gen_test(timeout=90)
async def test_a_resumed_ready_behind_the_messages_processed_flushes():
    """A reconnection told it resumed, at a message before the last it processed (a process
    whose stream went back, a rewritten ready): what it resumes is unknown, so it flushes."""
    async with fake_tokensvc_and_verifier(retry_seconds=0.05) as (fake, verifier):
        token = tokens_of("t", 1)[0]
        fake.active.add(token)
        fake.publish({"type": "revoked", "grant_id": "g1"})
        fake.publish({"type": "revoked", "grant_id": "g2"})
        await eventually(lambda: verifier.counts.revocations == 2, DEADLINE, what="the revocations")
        await verifier.check(token)
        fake.ready_instead = {"type": "ready", "stream": fake.stream, "seq": 1, "resumed": True}
        for feed in list(fake.feeds):
            feed.close()
        await eventually(lambda: verifier.counts.connects == 2 and verifier.feed_up, DEADLINE,
                         what="the reconnection")
        assert verifier.counts.flushes == 2 and verifier.cached == 0 and verifier.counts.resumes == 0


@pytest.mark.gen_test(timeout=90)
async def test_a_date_in_the_past_stretches_no_answer_past_exp_by_this_hosts_clock():
    """An answer's ``Date`` from 1970 (a clock gone wrong, a proxy rewriting it) would put exp
    decades away by tokensvc's clock: the answer lives until exp by this host's clock, which
    says it comes first; a watch ends then too."""
    fake = await FakeTokensvc().start()
    clock, now = Monotonic(), 1_800_000_000.0
    fake.exp, fake.date = now + 100, "Thu, 01 Jan 1970 00:00:00 GMT"
    token = tokens_of("t", 1)[0]
    fake.active.add(token)
    verifier = Verifier(Settings(fake.base_url, "webapp", WEBAPP_SECRET, offline_ttl=10**6), clock=clock,
                        wall=lambda: now)
    try:
        await verifier.check(token)
        clock.now += 99
        await verifier.check(token)
        assert verifier.counts.introspections == 1
        clock.now += 2  # past exp by this host's clock
        await verifier.check(token)
        assert verifier.counts.introspections == 2
        watch = verifier.watch(token, await verifier.check(token), lambda: None)
        assert watch.due - asyncio.get_running_loop().time() <= 100
        watch()
    finally:
        await verifier.close()
        fake.stop()


@pytest.mark.gen_test(timeout=90)
@pytest.mark.parametrize("date", ["", "garbage"])
async def test_an_answer_without_a_date_keeps_no_offset_heard_before(date):
    """A ``Date`` far ahead (no answer may be cached by it), then answers with none, or none
    readable: the offset heard before no longer holds, and the next answer is cached by this
    host's clock."""
    fake = await FakeTokensvc().start()
    token = tokens_of("t", 1)[0]
    fake.active.add(token)
    fake.exp, fake.date = time.time() + 3600, "Fri, 31 Dec 9999 23:59:59 GMT"
    verifier = verifier_for(fake.base_url, offline_ttl=10**6)
    try:
        await verifier.check(token)
        assert verifier.cached == 0  # expired long ago, by that Date
        fake.date = date
        await verifier.check(token)
        await verifier.check(token)
        assert verifier.counts.introspections == 2 and verifier.cached == 1
    finally:
        await verifier.close()
        fake.stop()


@pytest.mark.gen_test(timeout=90)
async def test_a_watched_connection_is_asked_again_every_max_ttl_and_ends_when_its_token_is_not_active():
    """A token that expires in years is held by a connection no longer than ``max_ttl``
    without being asked again, as a cached answer is: when tokensvc no longer says it is active
    (revoked while no feed could tell), the connection ends."""
    async with fake_tokensvc_and_verifier(max_ttl=0.2) as (fake, verifier):
        token = tokens_of("t", 1)[0]
        fake.active.add(token)
        ended = asyncio.Event()
        stop = verifier.watch(token, await verifier.check(token), ended.set)
        await eventually(lambda: fake.asked.count(token) >= 3, DEADLINE, what="asked again twice")
        assert not ended.is_set()
        fake.active.clear()
        await asyncio.wait_for(ended.wait(), DEADLINE)
        stop()


@pytest.mark.gen_test(timeout=90)
async def test_a_verifier_closed_during_the_feeds_handshake_leaves_no_connection_open():
    fake = await FakeTokensvc().start()
    fake.handshake = asyncio.Event()
    verifier = verifier_for(fake.base_url)
    try:
        await verifier.start()
        await eventually(lambda: fake.upgrades == 1, DEADLINE, what="the handshake begun")
        await verifier.close()
        fake.handshake.set()  # the handshake completes after close()
        await eventually(lambda: fake.closed == 1 and not fake.feeds, DEADLINE, what="the connection closed")
    finally:
        fake.stop()


@pytest.mark.gen_test(timeout=90)
async def test_flushes_during_a_re_verification_pile_up_nothing():
    """Twenty flushes while each watched token's re-verification hangs: one re-verification
    per watched connection stays in flight (not one per flush), each runs once more after it,
    and no connection ends."""
    async with fake_tokensvc_and_verifier(reverify_spread=0.0, timeout=60) as (fake, verifier):
        watched = tokens_of("w", 10)
        fake.active.update(watched)
        ended = []
        stops = [verifier.watch(token, await verifier.check(token), lambda token=token: ended.append(token))
                 for token in watched]
        fake.held = lambda token: True
        for _ in range(20):
            fake.publish({"type": "flush"})
        await eventually(lambda: verifier.counts.flushes == 21
                         and len(fake.asked) == len(watched) + verifier.settings.reverify_concurrency, DEADLINE,
                         what="the flushes heard, watched tokens being asked again")
        assert verifier.reverifying == len(watched)
        fake.release.set()
        await eventually(lambda: not verifier.reverifying, DEADLINE, what="the re-verifications done")
        # The check, then asked again: once more when a flush overtook the answer, never per flush.
        assert all(fake.asked.count(token) in (2, 3) for token in watched) and not ended
        for stop in stops:
            stop()


@pytest.mark.gen_test(timeout=90)
async def test_connections_ended_unconfirmed_are_logged_in_one_line(caplog):
    """A flush while tokensvc does not answer: past offline_ttl every watched connection ends
    (fail closed), and the log says so in one line with their number, not one line each."""
    async with fake_tokensvc_and_verifier(offline_ttl=0.3, retry_seconds=0.05,
                                          reverify_spread=0.0) as (fake, verifier):
        watched = tokens_of("w", 30)
        fake.active.update(watched)
        ended = []
        for token in watched:
            verifier.watch(token, await verifier.check(token), lambda token=token: ended.append(token))
        # tokensvc stops answering: each introspection is held, and given up after 0.1 s. The
        # checks above had the default timeout (a busy machine may take longer than 0.1 s).
        fake.held = lambda token: True
        verifier.settings.timeout = 0.1
        with caplog.at_level(logging.WARNING, logger="tokensvc.resource"):
            fake.publish({"type": "flush"})
            await eventually(lambda: len(ended) == len(watched) and not verifier.reverifying, DEADLINE,
                             what="every watched connection ended")
        lines = [record.getMessage() for record in caplog.records if "watched connection" in record.getMessage()]
        assert lines == ["30 watched connection(s) ended: tokensvc could not confirm their tokens within offline_ttl"]


class Withheld:
    """Revocations made while the verifier's feed is away: their announcements are held back
    (the store is written, nothing reaches the feed) until :meth:`release` hands them to the
    feed, which buffers them for a reader that resumes."""

    def __init__(self, ctx, monkeypatch):
        self.ctx, self.held = ctx, []
        self._publish = ctx.events.publish
        monkeypatch.setattr(ctx.events, "publish", self.held.append)

    def release(self):
        self.ctx.events.publish = self._publish
        for revocation in self.held:
            self._publish(revocation)


def resumed_without_replay(ctx, monkeypatch, then):
    """The feed's next resumed opening sends its ``ready`` and holds back the messages it
    missed, handing them to ``then(reader, missed)``; later openings are left alone."""
    open_feed, done = ctx.feed.open, []

    def opening(reader, stream=None, after=None, **options):
        opened = open_feed(reader, stream, after, **options)
        if done or not opened.ready["resumed"]:
            return opened
        done.append(opened)
        asyncio.get_running_loop().call_soon(then, reader, opened.missed)
        return Opening(opened.ready, [])

    monkeypatch.setattr(ctx.feed, "open", opening)
    return done


@pytest.mark.gen_test(timeout=90)
async def test_a_feed_cut_between_ready_and_the_replay_resumes_from_where_it_stood(browser, http_client, base_url,
                                                                                    ctx, monkeypatch):
    """The feed drops while a token is revoked; the next connection's ``ready`` (resumed) comes,
    and the connection is cut before the revocation it missed is replayed: the one after resumes
    from the same point, hears the revocation, and the token is refused."""
    access = (await tokens(browser, http_client, base_url))["access_token"]
    verifier = await started(verifier_for(base_url, retry_seconds=0.05))
    try:
        await verifier.check(access)
        withheld = Withheld(ctx, monkeypatch)
        await revoke(http_client, base_url, access)  # while the verifier's feed is away (below)
        cut = resumed_without_replay(ctx, monkeypatch, lambda reader, missed: reader.__self__.close())
        drop_feeds(ctx)
        withheld.release()  # buffered for the reader that resumes
        await eventually(lambda: cut and verifier.counts.connects == 3 and verifier.feed_up, DEADLINE,
                         what="the cut connection and the next one")
        assert verifier.counts.resumes == 2 and verifier.counts.flushes == 1  # no flush: both resumed
        with pytest.raises(InvalidToken):
            await verifier.check(access)
        assert verifier.counts.introspections == 2
    finally:
        await verifier.close()


@pytest.mark.gen_test(timeout=90)
async def test_a_resumed_feed_is_current_only_once_the_replay_is_in(browser, http_client, base_url, ctx,
                                                                   monkeypatch):
    """Between a resumed ``ready`` and the messages it missed, the feed vouches for nothing: an
    answer is used only within offline_ttl of the feed's going down, then asked again (and the
    revoked token refused) although the replay is still on its way."""
    access = (await tokens(browser, http_client, base_url))["access_token"]
    clock = Monotonic()
    verifier = await started(verifier_for(base_url, clock, retry_seconds=0.05, offline_ttl=30))
    replay = asyncio.Event()

    async def later(reader, missed):
        await replay.wait()
        for message in missed:
            reader(message)

    try:
        await verifier.check(access)
        withheld = Withheld(ctx, monkeypatch)
        await revoke(http_client, base_url, access)
        resumed_without_replay(ctx, monkeypatch, lambda reader, missed: asyncio.ensure_future(later(reader, missed)))
        drop_feeds(ctx)
        withheld.release()
        await eventually(lambda: verifier.counts.resumes == 1, DEADLINE, what="the resumed ready")
        assert not verifier.feed_up and not verifier.connected.is_set()
        clock.now += 31
        with pytest.raises(InvalidToken):
            await verifier.check(access)
        replay.set()
        await eventually(lambda: verifier.feed_up and verifier.counts.revocations == 1, DEADLINE,
                         what="the replay heard")
        assert verifier.connected.is_set() and verifier.counts.flushes == 1
    finally:
        replay.set()
        await verifier.close()


@pytest.mark.gen_test(timeout=120)
async def test_a_flush_asks_again_for_every_watched_connection_a_few_at_a_time(http_server, base_url, ctx,
                                                                               monkeypatch):
    """200 watched connections, a flush (the relay was interrupted: revocations may have been
    missed), introspection slow (0.1 s) and failing now and then (503): every token is asked
    again (those that failed, again), the revoked tokens' connections end, and no other,
    although the whole round takes longer than one introspection's timeout; no more than
    reverify_concurrency introspections at a time."""
    issued = [(await issue_tokens(ctx, "alice", "read")).access_token for _ in range(200)]
    verifier = await started(verifier_for(base_url, offline_ttl=60, retry_seconds=0.05, reverify_spread=0.2))
    ended: set[str] = set()
    try:
        stops = [verifier.watch(token, await verifier.check(token), lambda token=token: ended.add(token))
                 for token in issued]
        # The round below takes longer than one introspection's timeout; the checks above had the
        # default one (a busy machine may hold one of them up longer than a second).
        verifier.settings.timeout = 1
        withheld = Withheld(ctx, monkeypatch)  # revoked while the relay was interrupted: never announced
        revoked = set(issued[::20])
        for token in revoked:
            await revoke_directly(ctx, token)
        assert len(withheld.held) == len(revoked)
        running, failed, asked, answer = [0, 0], set(), Counter(), introspection.introspect

        async def slow(ctx, token):
            asked[token] += 1
            running[0] += 1
            running[1] = max(running)
            try:
                await asyncio.sleep(0.1)
                if token in issued[1::7] and token not in failed:
                    failed.add(token)
                    raise StorageError("the store did not answer")  # 503, once for these tokens
                return await answer(ctx, token)
            finally:
                running[0] -= 1

        monkeypatch.setattr(introspection, "introspect", slow)
        ctx.events.publish_all()
        await eventually(lambda: verifier.counts.flushes == 2 and not verifier.reverifying, 90,
                         what="every watched token asked again")
        assert ended == revoked
        assert running[1] <= verifier.settings.reverify_concurrency
        assert set(asked) == set(issued) and all(asked[token] >= 2 for token in failed)
        for stop in stops:
            stop()
    finally:
        await verifier.close()


async def revoke_directly(ctx, token):
    """RFC 7009 through the protocol core, as the token's client."""
    from tokensvc.oauth import revocation

    await revocation.revoke_token(ctx, token, await ctx.store.get_client("webapp"))


@pytest.mark.gen_test(timeout=90)
@pytest.mark.parametrize("message", [{"type": "renamed"}, {"type": "revoked", "jti": "j1"},
                                     {"type": "revoked", "family_id": "f1", "token_family": "f2"},
                                     {"type": "revoked"}, {"type": "revoked", "family_id": None},
                                     {"type": "revoked", "family_id": ""}, {"type": "revoked", "sub": 5},
                                     {"type": "revoked", "grant_id": ["g1"]}])
async def test_a_feed_message_not_understood_drops_every_answer(browser, http_client, base_url, ctx, caplog,
                                                                message):
    """A newer tokensvc may name what this library does not know: whatever it revoked is
    dropped with every other answer (fail closed), and a warning says so once."""
    access = (await tokens(browser, http_client, base_url))["access_token"]
    verifier = await started(verifier_for(base_url))
    try:
        await verifier.check(access)
        with caplog.at_level(logging.WARNING, logger="tokensvc.resource"):
            for _ in range(2):
                ctx.feed._send(dict(message))
            ctx.feed._send({"type": "revoked", "grant_id": "after-them"})
            await eventually(lambda: verifier.counts.revocations == 1, DEADLINE, what="the messages heard")
        assert verifier.cached == 0 and verifier.counts.flushes == 3 and verifier.feed_up
        warned = [record for record in caplog.records if "not understood" in record.getMessage()]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING
        await verifier.check(access)
        assert verifier.counts.introspections == 2
    finally:
        await verifier.close()


@pytest.mark.gen_test(timeout=90)
@pytest.mark.parametrize("ready", [{"resumed": "partial"}, {"resumed": None}, {"resumed": True, "since": 0}])
async def test_a_ready_not_understood_drops_every_answer(ready, caplog):
    """A ``ready`` whose ``resumed`` is neither true nor false, or that carries a member the
    library does not know, cannot be taken to resume: every answer is dropped, with a warning
    once however often it comes."""
    async with fake_tokensvc_and_verifier(retry_seconds=0.05) as (fake, verifier):
        token = tokens_of("t", 1)[0]
        fake.active.add(token)
        with caplog.at_level(logging.WARNING, logger="tokensvc.resource"):
            for connects in (2, 3):
                await verifier.check(token)
                fake.ready_instead = {"type": "ready", "stream": fake.stream, "seq": 0, "resumed": True, **ready}
                for feed in list(fake.feeds):
                    feed.close()
                await eventually(lambda connects=connects: verifier.counts.connects == connects and verifier.feed_up,
                                 DEADLINE, what="the reconnection")
                assert verifier.cached == 0 and verifier.counts.resumes == 0
        assert verifier.counts.flushes == 3
        assert len([record for record in caplog.records if "not understood" in record.getMessage()]) == 1


def test_the_verifier_understands_every_message_the_feed_documents():
    """The feed's reference (schemas.FEED_MESSAGES) and the verifier agree: a message type or a
    revocation's identifier added to one and not the other fails here, not in production (where
    the verifier would flush on every such message)."""
    assert set(schemas.FEED_MESSAGES) == {"ready", "revoked", "flush"}
    assert set(schemas.FEED_MESSAGES["revoked"].fields) == {"type", "seq", *KEYS}
    assert set(schemas.FEED_MESSAGES["flush"].fields) == {"type", "seq"}
    assert set(schemas.FEED_MESSAGES["ready"].fields) == READY_FIELDS


@pytest.mark.gen_test(timeout=90)
async def test_the_feeds_life_is_logged_and_counted_without_a_token(browser, http_client, base_url, ctx,
                                                                    caplog):
    access = (await tokens(browser, http_client, base_url))["access_token"]
    with caplog.at_level(logging.INFO, logger="tokensvc.resource"):
        verifier = await started(verifier_for(base_url, retry_seconds=0.05))
        try:
            await verifier.check(access)
            for reader in list(ctx.feed._readers):
                reader.__self__.close(1001, "restarting")
            await eventually(lambda: verifier.counts.resumes == 1 and verifier.feed_up, DEADLINE,
                             what="the feed resumed")
            ctx.feed.stream = "another-stream"  # as after a restart: the reader cannot resume
            drop_feeds(ctx)
            await eventually(lambda: verifier.counts.flushes == 2 and verifier.feed_up, DEADLINE,
                             what="the feed flushed")
            ctx.events.publish_all()
            await revoke(http_client, base_url, access)
            await eventually(lambda: verifier.counts.revocations == 1, DEADLINE, what="the revocation")
        finally:
            await verifier.close()
    counts = verifier.counts
    assert (counts.connects, counts.resumes, counts.flushes, counts.messages) == (3, 1, 3, 2)
    lines = [(record.levelname, record.getMessage()) for record in caplog.records
             if record.name == "tokensvc.resource.verifier"]
    said = "\n".join(f"{level} {text}" for level, text in lines)
    for expected in ("INFO revocation feed connected",
                     "WARNING revocation feed closed (code 1001, restarting); reconnecting in",
                     "INFO revocation feed resumed after message 0 (0 to replay)",
                     "WARNING revocation feed could not resume",
                     "WARNING revocation feed: flush (revocations may have been missed)"):
        assert expected in said, said
    for secret in (access, WEBAPP_SECRET, basic("webapp", WEBAPP_SECRET).split()[1]):
        assert secret not in caplog.text


class ScriptedFeed:
    """A feed connection that hands over the messages it was given, then closes."""

    def __init__(self, messages):
        self.messages, self.close_code, self.close_reason = list(messages), 1000, None

    async def read_message(self):
        return json.dumps(self.messages.pop(0)) if self.messages else None

    def ping(self):
        pass

    def close(self, *args):
        self.messages = []


@pytest.mark.gen_test(timeout=90)
async def test_the_feed_resumes_after_the_last_message_processed_with_the_resource_servers_credentials():
    """Through the verifier's ``connect``: the first connection names no stream; each after it
    resumes the stream after the last message processed (not the ready's newest), also after a
    connection that failed; every one carries the resource server's Basic credentials, its id
    and secret form-encoded first (RFC 6749 §2.3.1)."""
    asked, scripts = [], [
        [{"type": "ready", "stream": "s1", "seq": 2, "resumed": False},
         {"type": "revoked", "grant_id": "g1", "seq": 3}],
        [{"type": "ready", "stream": "s1", "seq": 5, "resumed": True}, {"type": "flush", "seq": 4}],  # cut at 4
    ]

    async def connect(request):
        asked.append(request)
        if not scripts:
            raise OSError("refused")
        return ScriptedFeed(scripts.pop(0))

    verifier = Verifier(Settings("http://tokensvc.example:8080/", "notes api", "s3cret:&", retry_seconds=0.01),
                        connect=connect)
    try:
        await verifier.start()
        await eventually(lambda: len(asked) >= 4, DEADLINE, what="two connections, then failed ones")
    finally:
        await verifier.close()
    assert [request.url for request in asked[:4]] == [
        "ws://tokensvc.example:8080/oauth/revocations", "ws://tokensvc.example:8080/oauth/revocations?stream=s1&after=3",
        "ws://tokensvc.example:8080/oauth/revocations?stream=s1&after=4",
        "ws://tokensvc.example:8080/oauth/revocations?stream=s1&after=4"]
    assert {request.headers["Authorization"] for request in asked} == {
        "Basic " + base64.b64encode(b"notes%20api:s3cret%3A%26").decode()}
    counts = verifier.counts
    assert (counts.connects, counts.resumes, counts.messages, counts.revocations, counts.flushes) == (2, 1, 2, 1, 2)
