"""Watched connections (:meth:`Verifier.watch <tokensvc.resource.Verifier.watch>`): a socket
held open on a token ends when the token's authorization does.

A watch ends when a revocation names its token's family or grant, or at its ``exp``; a flush, a
narrowed client or user, the feed down past ``offline_ttl``, or ``max_ttl`` after its answer's
introspection has each token asked again through the cache and the shared introspection, at most
``reverify_concurrency`` at a time (a larger batch spread over ``reverify_spread`` seconds) and
one at a time per connection (asked again during one, it runs once more after it). A token
tokensvc says is inactive (or no longer holding the connection's scope) ends its connections;
tokensvc not answering is no revocation: it is asked again until ``offline_ttl`` past the moment
the authorization was last known current, and only then does the connection end (fail closed).
The connections ended unconfirmed are logged (WARNING), one line a round with their number.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable
from typing import Any

from tokensvc.oauth.scopes import satisfies
from tokensvc.resource.bearer import Authorized
from tokensvc.resource.cache import AnswerCache, Entry, token_key
from tokensvc.resource.errors import Unavailable
from tokensvc.resource.feed import FeedFollower
from tokensvc.resource.introspection import Introspections
from tokensvc.resource.settings import Settings

log = logging.getLogger("tokensvc.resource.verifier")  # the one logger docs/guide/resource-servers.md names

# What a message names when some of what the tokens may do was withdrawn (a client narrowed, a
# user demoted), rather than the tokens ended: a watched connection asks again what is left.
NARROWED = ("client_id", "sub")


class Watch:
    """One watched connection's hold on its token: call it (or :meth:`stop`) when the connection
    closes; nothing of the watch runs after that, ``on_end`` included."""

    __slots__ = ("token", "authorized", "required", "on_end", "confirmed", "ended", "timer", "reverifying",
                 "again", "_watches")

    def __init__(self, watches: set[Watch], token: str, authorized: Authorized, required: str | None,
                 on_end: Callable[[], None], confirmed: float) -> None:
        self._watches = watches
        self.token, self.authorized, self.required, self.on_end = token, authorized, required, on_end
        self.confirmed = confirmed  # on the clock: when the authorization was last known current
        self.ended = False
        self.timer: asyncio.TimerHandle | None = None  # its token's exp, or max_ttl: asked again then
        self.reverifying = False  # one re-verification at a time
        self.again = False  # asked for during it: once more after it

    @property
    def due(self) -> float | None:
        """When (on the event loop's clock) the token is next asked again or ends at its
        ``exp``; None once the watch ended."""
        return None if self.ended or self.timer is None else self.timer.when()

    def stop(self) -> None:
        """Ended without ``on_end``: nothing of it runs again."""
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
        self._watches.discard(self)

    __call__ = stop


class Watches:
    """A verifier's watched connections. Tokens are asked again through ``introspections``
    (their lane for re-verifications) unless ``cache`` holds a current answer; ``feed`` says
    whether that answer is current."""

    def __init__(self, settings: Settings, clock: Callable[[], float], cache: AnswerCache,
                 introspections: Introspections, feed: FeedFollower) -> None:
        self.settings = settings
        self._clock, self._cache, self._introspections, self._feed = clock, cache, introspections, feed
        self._watches: set[Watch] = set()
        self._reverifying = 0  # watches with a re-verification in flight
        self._unconfirmed = 0  # of them, ended unconfirmed since the last were logged
        self._tasks: set[asyncio.Future[Any]] = set()
        self._confirming = False  # the watches are confirmed while the feed is down

    @property
    def reverifying(self) -> int:
        """The watched connections whose token is being asked again."""
        return self._reverifying

    def watch(self, token: str, authorized: Authorized, on_end: Callable[[], None],
              scope: str | None = None) -> Watch:
        entry = self._cache.peek(token_key(token))
        watch = Watch(self._watches, token, authorized, scope, on_end, self._last_known_current(entry))
        self._watches.add(watch)
        self._schedule(watch, entry)
        if self._feed.down_since is not None and not self._confirming:
            self._spawn(self._confirm_while_down())
        return watch

    def revoked(self, named: tuple[str, str]) -> None:
        """A revocation ends the watches whose family or grant it names, and asks again for
        those of a narrowed client or user (what is left?)."""
        watches = [watch for watch in self._watches if watch.authorized.answer.get(named[0]) == named[1]]
        if named[0] in NARROWED:
            self._reverify_each(watches)
        else:
            for watch in watches:
                self._end(watch)

    def flushed(self) -> None:
        """A flush asks again for every watched token."""
        self._reverify_each(self._watches)

    def feed_down(self) -> None:
        """The feed went down: every ``offline_ttl`` each watched token is asked again."""
        if not self._confirming:
            self._spawn(self._confirm_while_down())

    def cancel(self) -> None:
        """Every re-verification cancelled (the verifier closed)."""
        for task in list(self._tasks):
            task.cancel()

    def _schedule(self, watch: Watch, entry: Entry | None = None) -> None:
        """The watch is due at its token's ``exp``, or when the answer it stands on (``entry``;
        none: one just asked) leaves the cache, ``max_ttl`` after its introspection, if that
        comes first: an authorization is held no longer than a cached answer without being
        asked again."""
        if watch.timer is not None:
            watch.timer.cancel()
        if watch.ended:
            return
        held = self.settings.max_ttl if entry is None else entry.expires - self._clock()
        due = max(0.0, min(self._introspections.introspector.seconds_left(watch.authorized.answer), held))
        watch.timer = asyncio.get_running_loop().call_later(due, self._on_due, watch)

    def _on_due(self, watch: Watch) -> None:
        if self._introspections.introspector.seconds_left(watch.authorized.answer) <= 0:
            self._end(watch)
        else:
            self._reverify_soon(watch)

    def _end(self, watch: Watch) -> None:
        if not watch.ended:
            watch.stop()
            try:
                watch.on_end()
            except Exception:
                log.exception("a watch's on_end failed")

    def _reverify_each(self, watches: Iterable[Watch]) -> None:
        watches = list(watches)
        spread = self.settings.reverify_spread if len(watches) > self.settings.reverify_concurrency else 0.0
        for watch in watches:
            self._reverify_soon(watch, spread)

    def _reverify_soon(self, watch: Watch, spread: float = 0.0) -> None:
        """At most one re-verification of ``watch`` in flight, however many flushes ask for
        one: asked during one, it runs once more after it (what it found may predate the ask)."""
        if watch.reverifying:
            watch.again = True
        else:
            watch.reverifying = True
            self._reverifying += 1
            self._spawn(self._reverify_while_asked(watch, spread))

    async def _reverify_while_asked(self, watch: Watch, spread: float) -> None:
        try:
            while True:
                watch.again = False
                await self._reverify(watch, spread)
                if not watch.again:
                    return
                spread = 0.0
        finally:
            watch.reverifying = False
            self._reverifying -= 1
            if not self._reverifying and self._unconfirmed:  # a round over: one line, however many ended
                log.warning("%d watched connection(s) ended: tokensvc could not confirm their tokens within "
                            "offline_ttl", self._unconfirmed)
                self._unconfirmed = 0

    async def _reverify(self, watch: Watch, spread: float = 0.0) -> None:
        """Whether the watched token still holds what its connection stands on: through the
        cache and the introspection its other connections share, ``reverify_concurrency`` at a
        time, after a random wait within ``spread``. tokensvc not answering is no revocation:
        asked again until ``offline_ttl`` past the moment the authorization was last known
        current (the feed up: now), then the watch ends (fail closed)."""
        down = self._feed.down_since
        since = self._clock() if down is None else max(watch.confirmed, down)
        if spread:
            await asyncio.sleep(random.uniform(0, spread))
        key, wait = token_key(watch.token), self.settings.retry_seconds
        lane = self._introspections.reverifications
        while True:
            if watch.ended:
                return
            try:
                entry = (self._cache.get(key, self._feed.down_since)
                         or await self._introspections.ask(key, watch.token, lane))
                break
            except Unavailable:
                left = since + self.settings.offline_ttl - self._clock()
                if left <= 0:
                    self._unconfirmed += 1  # logged once for them all, when the round is over
                    self._end(watch)
                    return
                await asyncio.sleep(min(left, wait * (0.5 + random.random() / 2)))
                wait = min(wait * 2, 30.0)
        answer = entry.answer
        if answer is None or (watch.required and not satisfies(str(answer.get("scope", "")).split(), watch.required)):
            self._end(watch)
        else:
            watch.confirmed = self._last_known_current(entry)
            self._schedule(watch, entry)

    def _last_known_current(self, entry: Entry | None) -> float:
        """When ``entry``'s answer was last known current: now while the feed is up; else when
        it was introspected or the feed last vouched, whichever is later (now, with no entry:
        the answer was just asked)."""
        down = self._feed.down_since
        return self._clock() if down is None or entry is None else max(entry.verified, down)

    async def _confirm_while_down(self) -> None:
        """While the feed is down, every ``offline_ttl`` each watched connection's token is
        asked again (the feed cannot say it was revoked); one that is not confirmed ends."""
        self._confirming = True
        try:
            while self._feed.down_since is not None and self._watches:
                await asyncio.sleep(self.settings.offline_ttl)
                if self._feed.down_since is not None:
                    self._reverify_each(self._watches)
        finally:
            self._confirming = False

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
