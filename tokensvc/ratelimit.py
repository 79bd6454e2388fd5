"""Brute-force limits: failed client authentications and failed sign-ins are counted per
client id / username and per remote address; past a limit the key is refused (429 with
``Retry-After``) until its oldest failure leaves the window.

:class:`MemoryFailureLimiter` keeps the counts in this process, where every check happens
without a wait. Several processes over one MongoDB
also count every failure in the store (:class:`SharedFailureCounts`, an atomic ``$inc``):
when a shared count reaches a limit, the process that counted it locks the key locally for
the rest of the window. A key is then refused everywhere after at most the limit plus one
failure per other process, instead of the limit in every process; a success costs no store
round trip.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tokensvc.errors import HTTPAnswer


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


@runtime_checkable
class SharedFailureCounts(Protocol):
    """Failure counts every process sees (the MongoDB store)."""

    async def count_failure(self, key: str, window_seconds: int) -> tuple[int, float]:
        """Count one failure of ``key`` in its current window (a new window starts when there
        is none); the count so far and the seconds the window has left."""

    async def forget_failures(self, key: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Reservation:
    """An attempt counted before its check: taken back if it succeeds."""

    keys: list[tuple[str, int]]
    at: float


class MemoryFailureLimiter:
    """Sliding-window failure counts in this process; idle keys are dropped as they age."""

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

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)

    def lock(self, key: str, limit: int, seconds: float) -> None:
        """Refuse ``key`` for ``seconds`` (a count seen elsewhere reached ``limit``)."""
        now = self.clock()
        self._failures[key] = deque([now - self.window + seconds] * limit)

    def reserve(self, keys: Iterable[tuple[str, int]]) -> Reservation:
        # No await between the check and the count: of N concurrent attempts, at most the
        # limit's worth get past, whatever the slow check after it does.
        listed = list(keys)
        self.check(listed)
        now = self.clock()
        self._count(listed, now)
        return Reservation(listed, now)

    def release(self, reservation: Reservation) -> None:
        for key, _ in reservation.keys:
            failures = self._failures.get(key)
            if failures is not None and reservation.at in failures:
                failures.remove(reservation.at)
                if not failures:
                    del self._failures[key]


class FailureLimits:
    """The service's limits over one limiter: which keys a failure counts against."""

    def __init__(self, settings: LimitPolicy, limiter: MemoryFailureLimiter | None = None,
                 shared: SharedFailureCounts | None = None) -> None:
        self.settings = settings
        self.limiter = limiter or MemoryFailureLimiter(settings.window_seconds)
        self.shared = shared

    # Failures count per (account, address) and per address, never per account alone: a
    # stranger's failures must not lock the owner out from an address of their own.

    def client_keys(self, client_id: str | None, address: str) -> list[tuple[str, int]]:
        keys = [(f"client-address:{address}", self.settings.failed_client_auth_per_address)]
        if client_id:
            keys.append((f"client:{client_id}|{address}", self.settings.failed_client_auth_per_client))
        return keys

    def login_keys(self, username: str | None, address: str) -> list[tuple[str, int]]:
        keys = [(f"login-address:{address}", self.settings.failed_logins_per_address)]
        if username:
            keys.append((f"login:{username.lower()}|{address}", self.settings.failed_logins_per_username))
        return keys

    def reserve(self, keys: list[tuple[str, int]]) -> Reservation | None:
        return self.limiter.reserve(keys) if self.settings.enabled else None

    def release(self, reservation: Reservation | None) -> None:
        if reservation is not None:
            self.limiter.release(reservation)

    def failed(self, keys: list[tuple[str, int]]) -> None:
        if self.settings.enabled:
            self.limiter.failed(keys)

    async def failed_everywhere(self, keys: list[tuple[str, int]]) -> None:
        """A failure this process has counted (reserved and not released): count it in the
        shared counts too, and lock here every key whose shared count reached its limit."""
        if self.shared is None or not self.settings.enabled:
            return
        for key, limit in keys:
            count, seconds_left = await self.shared.count_failure(key, self.settings.window_seconds)
            if count >= limit:
                self.limiter.lock(key, limit, seconds_left)

    async def login_succeeded(self, username: str, address: str) -> None:
        key = f"login:{username.lower()}|{address}"
        self.limiter.succeeded(key)
        if self.shared is not None:
            await self.shared.forget_failures(key)
