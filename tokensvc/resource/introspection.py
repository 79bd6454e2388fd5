"""Asking tokensvc about a token (RFC 7662): :class:`Introspector` makes the call, with the
resource server's client credentials, through an HTTP client of its own; :class:`Introspections`
shares each token's call among whoever asks, within bounds, and caches what it learns.

An answer's ``exp`` is judged by whichever of tokensvc's clock and this host's says it comes
first (fail closed, whichever is wrong): tokensvc's is this host's plus the offset the last
answer's ``Date`` header gave (at most: the header is in whole seconds; an answer without a
``Date`` it can read gives none). What tokensvc refuses as malformed (400, 422) is no token it
issued: not active.

Anyone may present tokens, so what a flood of made-up ones can take is bounded: checks have at
most ``introspection_concurrency`` introspections in flight and ``introspection_queue`` more
waiting; past that a check of a token not cached fails at once (:class:`Unavailable`) rather than
queueing. Watched connections are asked again on places of their own (``reverify_concurrency``),
which checks never take, and the HTTP client has a connection for every place, so nothing
queues in it. Concurrent asks of one token share one introspection (a caller that goes away
leaves it running for the others), and an answer a revocation overtook on its way is asked
again, never cached.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from tokensvc import jsontext
from tokensvc.resource.cache import AnswerCache, Entry
from tokensvc.resource.errors import Unavailable
from tokensvc.resource.settings import Counts, Settings, basic_authorization

log = logging.getLogger("tokensvc.resource.verifier")  # the one logger docs/guide/resource-servers.md names


class Introspector:
    """Introspects one token at a time for a verifier, and keeps tokensvc's clock as its answers
    tell it. A verifier's seam: one given to :class:`~tokensvc.resource.Verifier` (a subclass
    answering as a test needs) replaces the HTTP calls."""

    def __init__(self, settings: Settings, *, wall: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._wall = wall
        self._offset = 0.0  # tokensvc's clock minus this host's, at most (the last Date heard)
        self._client: AsyncHTTPClient | None = None
        self._authorization = basic_authorization(settings)

    @property
    def client_open(self) -> bool:
        """Whether the HTTP client is open (it is made on the first introspection)."""
        return self._client is not None

    async def introspect(self, token: str) -> dict[str, Any] | None:
        """The answer for an active access token, None for anything else; :class:`Unavailable`
        when tokensvc does not answer."""
        settings = self.settings
        request = HTTPRequest(settings.base_url + "/oauth/token/introspect", method="POST",
                              body=urlencode({"token": token, "token_type_hint": "access_token"}),
                              headers={"Authorization": self._authorization, "Accept": "application/json"},
                              request_timeout=settings.timeout, connect_timeout=settings.timeout)
        sent = self._wall()
        try:
            response = await self._http().fetch(request)
            answer = jsontext.loads(response.body)
        except HTTPClientError as exc:  # an answer other than 200, or none (599)
            if exc.code in (400, 422):  # the token itself refused (too long, malformed): none tokensvc issued
                return None
            if exc.code in (401, 403):
                log.error("introspection refused (%s): check the resource server's client credentials", exc.code)
            raise Unavailable(f"The token service could not introspect ({exc.code})") from None
        except (TimeoutError, OSError, ValueError) as exc:
            raise Unavailable(f"The token service did not answer ({type(exc).__name__})") from None
        self._learn_offset(response.headers.get("Date"), sent)
        if not isinstance(answer, dict) or answer.get("active") is not True:
            return None
        if answer.get("token_type", "access_token") != "access_token":
            return None  # a refresh token is never a bearer token
        return answer

    def seconds_left(self, answer: dict[str, Any]) -> float:
        """Seconds until the token's ``exp`` by tokensvc's clock or this host's, whichever says
        fewer: a ``Date`` in the past (a clock, or a proxy, gone wrong) stretches nothing."""
        return float(answer.get("exp", 0)) - (self._wall() + max(self._offset, 0.0))

    def close(self) -> None:
        """The HTTP client closed; the next introspection opens another."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def _http(self) -> AsyncHTTPClient:
        """The introspector's own HTTP client: the application's requests through the loop's
        shared one never queue behind its introspections, nor they behind the application's."""
        if self._client is None:
            settings = self.settings  # a connection for every place: none waits in the client's queue
            self._client = AsyncHTTPClient(force_instance=True, max_clients=settings.introspection_concurrency
                                           + settings.reverify_concurrency)
        return self._client

    def _learn_offset(self, date: str | None, sent: float) -> None:
        """tokensvc's clock, from its answer's ``Date``: stamped after ``sent`` (this host's
        clock), in whole seconds, so its clock is at most ``Date + 1 - sent`` ahead of ours."""
        try:
            stamped = email.utils.parsedate_to_datetime(date).timestamp()  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            self._offset = 0.0  # none heard: an offset heard before is no longer known to hold
            return
        self._offset = stamped + 1 - sent


class Lane:
    """Introspections of one kind, one per token shared by whoever asks: at most ``limit`` in
    flight and, when ``queue`` is given, that many more waiting for a place; past that a new
    one is refused at once (:class:`Unavailable`) rather than queued."""

    def __init__(self, limit: int, queue: int | None = None) -> None:
        self._places = asyncio.Semaphore(limit)
        self._bound = None if queue is None else limit + queue
        self.inflight: dict[bytes, asyncio.Future[Entry]] = {}  # in flight and waiting

    def join(self, key: bytes, introspect: Callable[[], Awaitable[Entry]]) -> asyncio.Future[Entry]:
        task = self.inflight.get(key)
        if task is None:
            if self._bound is not None and len(self.inflight) >= self._bound:
                raise Unavailable("Too many tokens are being introspected at once")
            task = asyncio.ensure_future(self._run(introspect))
            self.inflight[key] = task
            task.add_done_callback(lambda done: self._settled(key, done))
        return task

    def cancel(self) -> None:
        for task in list(self.inflight.values()):
            task.cancel()

    async def _run(self, introspect: Callable[[], Awaitable[Entry]]) -> Entry:
        async with self._places:
            return await introspect()

    def _settled(self, key: bytes, task: asyncio.Future[Entry]) -> None:
        if self.inflight.get(key) is task:
            del self.inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning when every caller went away


class Introspections:
    """A verifier's introspections: shared per token within a lane (:attr:`checks`, or
    :attr:`reverifications` for watched connections), and cached unless a revocation overtook
    them."""

    def __init__(self, settings: Settings, introspector: Introspector, cache: AnswerCache,
                 clock: Callable[[], float], counts: Counts) -> None:
        self.settings, self.introspector = settings, introspector
        self._cache, self._clock, self._counts = cache, clock, counts
        self.checks = Lane(settings.introspection_concurrency, settings.introspection_queue)
        self.reverifications = Lane(settings.reverify_concurrency)  # never starved by checks

    async def ask(self, key: bytes, token: str, lane: Lane) -> Entry:
        """The token's answer, from one introspection at a time per token and ``lane`` whoever
        asks: it runs as a task of its own, so a caller cancelled (its client went away) leaves
        it running for the others."""
        return await asyncio.shield(lane.join(key, lambda: self._current(key, token)))

    def cancel(self) -> None:
        """Every introspection in flight or waiting cancelled (the verifier closed)."""
        self.checks.cancel()
        self.reverifications.cancel()

    async def _current(self, key: bytes, token: str) -> Entry:
        """An answer no revocation overtook: asked again when one named it on its way."""
        for _ in range(3):
            generation, asked = self._cache.generation, self._clock()
            self._counts.introspections += 1
            answer = await self.introspector.introspect(token)
            overtaken = self._cache.overtaken(generation, answer)
            if overtaken is None:  # too much happened meanwhile to tell: used once, not cached
                return self._entry(answer, asked)
            if not overtaken:
                entry = self._entry(answer, asked)
                self._cache.store(key, entry)
                return entry
        raise Unavailable("Revocations keep overtaking the introspection of this token")

    def _entry(self, answer: dict[str, Any] | None, asked: float) -> Entry:
        settings, now = self.settings, self._clock()
        if answer is None:
            return Entry(None, now + settings.negative_ttl, asked)
        return Entry(answer, now + min(self.introspector.seconds_left(answer), settings.max_ttl), asked)
