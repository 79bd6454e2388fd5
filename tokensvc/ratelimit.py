"""Brute-force limits: client authentications and sign-ins are limited per (client id or
username, remote address) and per remote address; past a limit the key is refused (429 with
``Retry-After``) until its oldest attempt leaves the window.

Two ways to count, for the two kinds of check:

- **A sign-in is reserved before its check** (scrypt, tens of milliseconds of CPU) and given back
  when it succeeds (:meth:`FailureLimits.reserve`): of N concurrent wrong passwords only the
  limit's worth are ever checked. A confirmation code presented with an authorization code is
  reserved the same way, per address (:meth:`FailureLimits.confirmation_attempt`); and each
  authorization code's presentations with one are counted on their own, a bound no setting
  lifts (:meth:`FailureLimits.present`).
- **A client's secret, or an admin's bearer token, is checked at once** (a digest compared in
  constant time, no cost to speak of) and what counts is what the answer reveals
  (:meth:`FailureLimits.failed`, :meth:`FailureLimits.check`): a wrong one is counted, and
  answered 401 only while its count is within the limit, 429 past it. A right one of high
  entropy (a token, a generated client secret) is never refused: no number of guesses finds
  one, and refusing it would let anyone sharing the address lock its owner out. A right
  low-entropy secret (a client secret set by hand, shorter than a generated one) is answered
  429 too while the key is over its limit, so that a guesser learns the outcome of at most the
  limit's worth of guesses. A busy client's concurrent right requests never count at all.

:class:`MemoryFailureLimiter` counts in this process, with no wait between a count and its
decision. Several processes over one MongoDB also count in the store
(``storage.base.FailureCounts``): the counters of one address live in one document, and one
atomic ``$inc`` that returns the new counts counts an attempt in all of them; the decision is
made on the counts every process sees. Of N concurrent wrong attempts spread over any number of
processes, at most the limit's worth are checked (a sign-in) or answered 401 (a client), plus
one: a right client secret whose read of the counts went before the limit-th wrong one's count.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from tokensvc.errors import HTTPAnswer
from tokensvc.identifiers import username_key
from tokensvc.storage.base import FailureCounts, StorageError, StoreFault

log = logging.getLogger(__name__)

ADDRESS = "*"  # the counter of an address itself, whatever client id or username


class TooManyFailures(HTTPAnswer):
    """The key has failed too often: 429 with ``Retry-After`` (RFC 6585 §4)."""

    status_code = 429

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many failed attempts; retry in {retry_after} s")
        self.retry_after = retry_after

    def body(self) -> dict[str, str]:
        return {"error": "too_many_requests",
                "error_description": f"Too many failed attempts; try again in {self.retry_after} seconds."}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class LimitPolicy(Protocol):
    """The ``[limits]`` settings."""

    @property
    def enabled(self) -> bool: ...

    @property
    def window_seconds(self) -> int: ...

    @property
    def failed_client_auth_per_client(self) -> int: ...

    @property
    def failed_client_auth_per_address(self) -> int: ...

    @property
    def failed_logins_per_username(self) -> int: ...

    @property
    def failed_logins_per_address(self) -> int: ...

    @property
    def ipv6_prefix(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one attempt counts against: counters of one group, each with its limit."""

    group: str
    counters: tuple[tuple[str, int], ...]

    @property
    def keys(self) -> list[tuple[str, int]]:
        """The in-process keys: ``<group>|<counter>``."""
        return [(f"{self.group}|{counter}", limit) for counter, limit in self.counters]


@dataclass(frozen=True, slots=True)
class Reservation:
    """An attempt counted before its check: taken back if it succeeds."""

    attempt: Attempt
    at: float
    shared: bool = field(default=False)


class MemoryFailureLimiter:
    """Sliding-window attempt counts in this process; idle keys are dropped as they age."""

    def __init__(self, window_seconds: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 100_000) -> None:
        self.window = window_seconds
        self.clock = clock
        self.max_keys = max_keys
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, key: str, now: float) -> deque[float] | None:
        failures = self._failures.get(key)
        if failures is None:
            return None
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures:
            del self._failures[key]
            return None
        return failures

    def check(self, keys: Iterable[tuple[str, int]]) -> None:
        if not self._failures:  # the usual case, checked on every token request
            return
        now = self.clock()
        waits = []
        for key, limit in keys:
            failures = self._recent(key, now)
            if failures is not None and len(failures) >= limit:
                waits.append(failures[len(failures) - limit] + self.window - now)
        if waits:
            raise TooManyFailures(max(1, math.ceil(max(waits))))

    def failed(self, keys: Iterable[tuple[str, int]]) -> None:
        self._count(keys, self.clock())

    def _count(self, keys: Iterable[tuple[str, int]], now: float) -> None:
        if len(self._failures) >= self.max_keys:  # bound memory under a flood of distinct keys
            for key in list(self._failures):
                self._recent(key, now)
        for key, limit in keys:
            failures = self._failures.setdefault(key, deque())
            failures.append(now)
            while len(failures) > limit:  # only the newest `limit` failures matter
                failures.popleft()

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def lock(self, key: str, limit: int, seconds: float) -> None:
        """Refuse ``key`` for ``seconds`` (a count seen elsewhere reached ``limit``)."""
        now = self.clock()
        self._failures[key] = deque([now - self.window + seconds] * limit)

    def reserve(self, keys: list[tuple[str, int]]) -> float:
        """Check and count one attempt against each key, with no wait in between: of N
        concurrent attempts, at most the limit's worth get past. When it was counted."""
        self.check(keys)
        now = self.clock()
        self._count(keys, now)
        return now

    def release(self, keys: list[tuple[str, int]], at: float) -> None:
        for key, _ in keys:
            failures = self._failures.get(key)
            if failures is not None and at in failures:
                failures.remove(at)
                if not failures:
                    del self._failures[key]


class FailureLimits:
    """The service's limits: which counters an attempt counts against, reserved in this
    process and, with several processes, in the store."""

    def __init__(self, settings: LimitPolicy, limiter: MemoryFailureLimiter | None = None,
                 shared: FailureCounts | None = None) -> None:
        self.settings = settings
        self.limiter = limiter or MemoryFailureLimiter(settings.window_seconds)
        self.shared = shared
        self._releasing: set[asyncio.Task[None]] = set()
        self._presented: dict[int, MemoryFailureLimiter] = {}  # present(), in this process, by window

    # Attempts count per (account, address) and per address, never per account alone: a
    # stranger's failures must not lock the owner out from an address of their own. An
    # "address" is an IPv6 network of ``ipv6_prefix`` bits (:func:`address_key`).

    def client_attempt(self, client_id: str | None, address: str) -> Attempt:
        counters = [(ADDRESS, self.settings.failed_client_auth_per_address)]
        if client_id:
            counters.append((_counter(client_id), self.settings.failed_client_auth_per_client))
        return Attempt(f"client|{self.address_key(address)}", tuple(counters))

    def admin_attempt(self, address: str) -> Attempt:
        """A call of the admin API: its bearer tokens count per address, as client secrets do,
        in a group of their own (a wrong admin token does not lock an address out of /oauth/token)."""
        return Attempt(f"admin|{self.address_key(address)}", ((ADDRESS, self.settings.failed_client_auth_per_address),))

    def login_attempt(self, username: str | None, address: str) -> Attempt:
        counters = [(ADDRESS, self.settings.failed_logins_per_address)]
        if username:
            counters.append((_counter(username_key(username)), self.settings.failed_logins_per_username))
        return Attempt(f"login|{self.address_key(address)}", tuple(counters))

    def confirmation_attempt(self, address: str) -> Attempt:
        """A confirmation code presented with an authorization code (``oauth/grants.py``): a
        person types it, as a password, so it counts per address with the sign-in's limit per
        address, in a group of its own (wrong confirmations do not lock an address out of
        sign-in)."""
        return Attempt(f"confirmation|{self.address_key(address)}",
                       ((ADDRESS, self.settings.failed_logins_per_address),))

    async def present(self, key: str, limit: int, window_seconds: int) -> bool:
        """Count one presentation of what ``key`` names (an authorization code's confirmations,
        ``oauth/confirmation.py``), before it is checked: whether it is within ``limit``
        presentations in the ``window_seconds`` from the first. Counted whatever ``enabled``
        says (a rule of the protocol, not a limit an operator may lift), never taken back, and,
        with several processes, in the store: of any number of presentations, concurrent or
        not, from any process, ``limit`` at most are within."""
        if self.shared is not None:
            counts, _ = await self.shared.count_attempt(f"presented|{key}", ["n"], window_seconds)
            return counts[0] <= limit
        presented = self._presented.get(window_seconds)
        if presented is None:
            presented = self._presented[window_seconds] = MemoryFailureLimiter(window_seconds,
                                                                               self.limiter.clock)
        try:
            presented.reserve([(key, limit)])
        except TooManyFailures:
            return False
        return True

    def address_key(self, address: str) -> str:
        """What the limits count an address as: an IPv6 address as its network of
        ``ipv6_prefix`` bits (a host commonly holds a /64 and may pick any address of it, so
        each address apart would give it unlimited guesses); an IPv4 address, and one mapped
        into IPv6 (``::ffff:192.0.2.1``), as itself; anything else (``-``) as written."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return address
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.ipv4_mapped is not None:
                return str(ip.ipv4_mapped)
            return str(ipaddress.IPv6Network((ip, self.settings.ipv6_prefix), strict=False))
        return str(ip)

    async def failed(self, attempt: Attempt) -> None:
        """A failed attempt, counted after its (instant) check: TooManyFailures when a counter
        is now past its limit, so that the outcome of the check stays hidden."""
        if not self.settings.enabled:
            return
        keys = attempt.keys
        try:
            self.limiter.check(keys)
        finally:
            self.limiter.failed(keys)
        if self.shared is not None:
            counts, seconds_left = await self.shared.count_attempt(
                attempt.group, [counter for counter, _ in attempt.counters], self.settings.window_seconds)
            self._refuse_past(keys, counts, seconds_left, at_limit=False)

    async def check(self, attempt: Attempt) -> None:
        """A succeeded attempt: TooManyFailures while a counter is at its limit (the right
        secret is refused too, or it would tell itself from the wrong ones)."""
        if not self.settings.enabled:
            return
        keys = attempt.keys
        self.limiter.check(keys)
        if self.shared is not None:
            counts, seconds_left = await self.shared.read_counts(
                attempt.group, [counter for counter, _ in attempt.counters])
            self._refuse_past(keys, counts, seconds_left, at_limit=True)

    def _refuse_past(self, keys: list[tuple[str, int]], counts: list[int], seconds_left: float, *,
                     at_limit: bool) -> None:
        over = [(key, limit) for (key, limit), count in zip(keys, counts, strict=True)
                if count > limit or (at_limit and count == limit)]
        for key, limit in over:  # refused here at once for the rest of the window
            self.limiter.lock(key, limit, seconds_left)
        if over:
            raise TooManyFailures(max(1, math.ceil(seconds_left)))

    async def reserve(self, attempt: Attempt) -> Reservation | None:
        """Count ``attempt`` before its check; TooManyFailures (nothing counted) past a limit."""
        if not self.settings.enabled:
            return None
        keys = attempt.keys
        at = self.limiter.reserve(keys)
        if self.shared is None:
            return Reservation(attempt, at)
        names = [counter for counter, _ in attempt.counters]
        try:
            counts, seconds_left = await self.shared.count_attempt(attempt.group, names,
                                                                   self.settings.window_seconds)
        except BaseException:
            self.limiter.release(keys, at)
            raise
        try:
            self._refuse_past(keys, counts, seconds_left, at_limit=False)
        except TooManyFailures:
            self.limiter.release(keys, at)
            await self._uncount(attempt.group, names)
            raise
        return Reservation(attempt, at, shared=True)

    def release(self, reservation: Reservation | None, *, clear_account: bool = False) -> None:
        """The reserved attempt succeeded: take it back (in the store, without waiting). With
        ``clear_account`` (a right password), the account's count goes back to zero: its
        earlier failures are forgiven, the address's are not."""
        if reservation is None:
            return
        attempt = reservation.attempt
        self.limiter.release(attempt.keys, reservation.at)
        names = [counter for counter, _ in attempt.counters]
        reset = names[1:] if clear_account else []
        for counter in reset:
            self.limiter.forget(f"{attempt.group}|{counter}")
        if reservation.shared:
            task = asyncio.get_running_loop().create_task(
                self._uncount(attempt.group, [name for name in names if name not in reset], reset))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def _uncount(self, group: str, counters: list[str], reset: list[str] | None = None) -> None:
        assert self.shared is not None
        try:
            await self.shared.uncount_attempt(group, counters, reset or [])
        except (StorageError, StoreFault) as exc:  # the count stays one too high until the window ends
            log.warning("could not take back an attempt's count: %s", exc)


def _counter(account: str) -> str:
    """A counter's name for a client id or username: a digest, safe as a document field name
    whatever the account holds (dots, dollars) and of a fixed size."""
    return hashlib.sha256(account.encode("utf-8", "replace")).hexdigest()[:32]
