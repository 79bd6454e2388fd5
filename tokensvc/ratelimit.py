"""Brute-force limits: client authentications and sign-ins are limited per (client id or
username, remote address) and per remote address; past a limit the key is refused (429 with
``Retry-After``) until its oldest attempt leaves the window.

Two ways to count, for the two kinds of check:

- **A sign-in is reserved before its check** (scrypt, tens of milliseconds of CPU) and given back
  when it succeeds (:meth:`FailureLimits.reserve`): of N concurrent wrong passwords only the
  limit's worth are ever checked. Each authorization code's presentations with a confirmation
  code are counted before the lookup, a bound no setting lifts (:meth:`FailureLimits.present`);
  a wrong confirmation also counts per address as a client's secret does, after its lookup
  (:meth:`FailureLimits.confirmation_attempt`), and a right one is never refused by that count.
- **A client's secret, or an admin's bearer token, is checked at once** (a digest compared in
  constant time, no cost to speak of) and what counts is what the answer reveals
  (:meth:`FailureLimits.failed`, :meth:`FailureLimits.check`): a wrong one is counted, and
  answered 401 only while its count is within the limit, 429 past it. A right one of high
  entropy (a token, a client secret the store records as generated) is never refused: no
  number of guesses finds one, and refusing it would let anyone sharing the address lock its
  owner out. Any other right secret (one set by hand, whatever its length) is answered 429 too
  while the key is over its limit, exactly as a wrong one, so that a guesser learns the outcome
  of at most the limit's worth of guesses (``oauth/clientauth.py`` decides which is which). A
  busy client's concurrent right requests never count at all.

Past a limit, an attempt refused is not counted, right or wrong: both leave the same state, so
no later answer's ``Retry-After`` tells them apart, and the window is not extended by refused
guesses (the limit stays a guesser's rate).

:class:`MemoryFailureLimiter` counts in this process, with no wait between a count and its
decision. Several processes over one MongoDB also count in the store
(``storage.base.FailureCounts``): the counters of one group (an address; an account, a
browser) live in one document with the group's window, and one
atomic ``$inc`` that returns the new counts counts an attempt in all of them; the decision is
made on the counts every process sees. Of N concurrent wrong attempts spread over any number of
processes, at most the limit's worth are checked (a sign-in) or answered 401 (a client), plus
one: a right client secret whose read of the counts went before the limit-th wrong one's count.

**Passwords are limited per account too**, from any number of addresses (NIST SP 800-63B
§5.2.2), and never so that the owner is locked out (:meth:`FailureLimits.sign_in_attempts`): a
browser that has not signed in to the account before counts against the account's hour
(``failed_logins_per_account`` per ``account_window_seconds``) and against its failures since its
last sign-in (``consecutive_failed_logins``, at most 100, over ``consecutive_window_seconds``); a
browser that has signed in to it before (its signed cookie says so) counts against counters of
its own, alike, and none of the account's: the owner signs in there whatever anyone else fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tokensvc.errors import HTTPAnswer
from tokensvc.identifiers import username_key
from tokensvc.storage.base import CACHE_SECONDS, FailureCounts, StorageError, StoreFault

log = logging.getLogger(__name__)

# The most groups whose clean state a process keeps (FailureLimits.check): past it, all are read again.
MAX_CLEAN_GROUPS = 10_000
ADDRESS = "*"  # the counter of an address itself, whatever client id or username
FAILURES = "n"  # the one counter of an account's or a browser's group
# Take-backs of counts kept while the store is away (FailureLimits._owe), at most; and how long
# between tries at the latest (sooner when the store may answer again).
OWED_MOST = 10_000
OWED_RETRY_SECONDS = 1.0

# Which limit refused an attempt (TooManyFailures.reason): the sign-in page words each.
BY_ADDRESS, BY_ACCOUNT, ACCOUNT_STOPPED, BY_BROWSER = "address", "account", "account_stopped", "browser"


class TooManyFailures(HTTPAnswer):
    """The key has failed too often: 429 with ``Retry-After`` (RFC 6585 §4). ``reason``: which
    limit refused (the sign-in page says what its owner may do); the JSON answer is the same
    whichever it was."""

    status_code = 429

    def __init__(self, retry_after: int, reason: str = BY_ADDRESS) -> None:
        super().__init__(f"too many failed attempts; retry in {retry_after} s")
        self.retry_after = retry_after
        self.reason = reason

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

    @property
    def failed_logins_per_account(self) -> int: ...

    @property
    def account_window_seconds(self) -> int: ...

    @property
    def consecutive_failed_logins(self) -> int: ...

    @property
    def consecutive_window_seconds(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one attempt counts against: counters of one group, each with its limit, in the
    group's window (seconds; 0: ``window_seconds``). ``clear``: the counters a right password
    sets back to zero; ``reason``: what a refusal by this group says."""

    group: str
    counters: tuple[tuple[str, int], ...]
    window: int = 0
    clear: tuple[str, ...] = ()
    reason: str = BY_ADDRESS

    @property
    def keys(self) -> list[tuple[str, int]]:
        """The in-process keys: ``<group>|<counter>``."""
        return [(f"{self.group}|{counter}", limit) for counter, limit in self.counters]

    @property
    def names(self) -> list[str]:
        return [counter for counter, _ in self.counters]


@dataclass(frozen=True, slots=True)
class Reservation:
    """An attempt counted before its check, in each of its groups (with when it was counted in
    this process): taken back if it succeeds."""

    parts: tuple[tuple[Attempt, float], ...]
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
        wait = self.wait(keys)
        if wait is not None:
            raise TooManyFailures(wait)

    def wait(self, keys: Iterable[tuple[str, int]]) -> int | None:
        """The seconds until no key of ``keys`` is at its limit, or None when none is."""
        if not self._failures:  # the usual case, checked on every token request
            return None
        now = self.clock()
        waits = []
        for key, limit in keys:
            failures = self._recent(key, now)
            if failures is not None and len(failures) >= limit:
                waits.append(failures[len(failures) - limit] + self.window - now)
        return max(1, math.ceil(max(waits))) if waits else None

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
        return self.count(keys)

    def count(self, keys: list[tuple[str, int]]) -> float:
        """Count one attempt against each key, now; when it was counted."""
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
                 shared: FailureCounts | None = None, clock: Callable[[], float] = time.monotonic,
                 pause: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """``pause``: waits at most its seconds, less when the store may answer again (the
        store's ``reachable``), between tries of the take-backs the store missed."""
        self.settings = settings
        self.clock = clock
        self.limiter = limiter or MemoryFailureLimiter(settings.window_seconds, lambda: self.clock())
        self.shared = shared
        # The in-process counts of each window: window_seconds', and the accounts' longer ones.
        self._limiters = {settings.window_seconds: self.limiter}
        self._releasing: set[asyncio.Task[None]] = set()
        # Take-backs the store missed (it went away between a count and its take-back), each
        # with the end of its window: made once the store answers again (:meth:`_pay_back`).
        self._owed: deque[tuple[float, str, list[str], list[str]]] = deque()
        self._paying: asyncio.Task[None] | None = None
        self._pause = pause
        self._presented: dict[int, MemoryFailureLimiter] = {}  # present(), in this process, by window
        # The groups the store counted no failure of when this process last read them (check),
        # each until CACHE_SECONDS after that read began, unless a failure of the group was
        # counted here since: a right secret of such a group is answered without asking again.
        self._clean: dict[str, float] = {}
        self._failures_here = 0  # failures this process counted: a read that overlapped one is not kept

    # Attempts count per (account, address) and per address: a stranger's failures must not
    # lock the owner out from an address of their own. An "address" is an IPv6 network of
    # ``ipv6_prefix`` bits (:func:`address_key`). A password is limited per account too, across
    # addresses, by what only its owner may hold: a browser that signed in before
    # (:meth:`sign_in_attempts`).

    def client_attempt(self, client_id: str | None, address: str, *, guarded: bool = True) -> Attempt:
        """A client authentication. ``guarded``: it could be a guess at a secret the limits
        protect (a confidential client's secret set by hand), whose right answer the limit
        refuses too. Every other failure (an id no client has, malformed credentials, a public
        client's id, a generated secret guessed at) counts in a group of its own: limited
        alike, it never refuses a client whose right answers the limit guards."""
        counters = [(ADDRESS, self.settings.failed_client_auth_per_address)]
        if client_id:
            counters.append((_counter(client_id), self.settings.failed_client_auth_per_client))
        return Attempt(f"{'client' if guarded else 'client-unguarded'}|{self.address_key(address)}", tuple(counters))

    def admin_attempt(self, address: str) -> Attempt:
        """A call of the admin API: its bearer tokens count per address, as client secrets do,
        in a group of their own (a wrong admin token does not lock an address out of /oauth/token)."""
        return Attempt(f"admin|{self.address_key(address)}", ((ADDRESS, self.settings.failed_client_auth_per_address),))

    def login_attempt(self, username: str | None, address: str) -> Attempt:
        """A sign-in's counts at its address: the address's, and the username's there (which a
        right password clears)."""
        counters = [(ADDRESS, self.settings.failed_logins_per_address)]
        if username:
            counters.append((_counter(username_key(username)), self.settings.failed_logins_per_username))
        return Attempt(f"login|{self.address_key(address)}", tuple(counters),
                       clear=tuple(name for name, _ in counters[1:]))

    def sign_in_attempts(self, username: str, address: str, browser: str | None = None) -> tuple[Attempt, ...]:
        """What a sign-in counts against. From a browser that has not signed in to the account
        before: the address's counts (:meth:`login_attempt`), the account's hour and the
        account's failures since its last sign-in, whatever the address. From ``browser``, the
        id of one that has (the handler vouches for it: a cookie signed with the cookie
        secret): that browser's own hour and failures since its last sign-in, and nothing else,
        so that its owner signs in whatever anyone else fails, and whoever held its cookie gets
        no more guesses than the account gives everyone else. The username counts as typed (its
        key): one no user has is limited alike, so a refusal tells nobody whether it exists."""
        settings = self.settings
        if browser is not None:
            key = _counter(f"{browser}|{account_counter(username)}")
            return (Attempt(f"browser|{key}", ((FAILURES, settings.failed_logins_per_account),),
                            settings.account_window_seconds, (FAILURES,), BY_BROWSER),
                    Attempt(f"browser-run|{key}", ((FAILURES, settings.consecutive_failed_logins),),
                            settings.consecutive_window_seconds, (FAILURES,), BY_BROWSER))
        account = account_counter(username)
        return self.login_attempt(username, address), self._account_hour(account), self._account_run(account)

    def _account_hour(self, account: str) -> Attempt:
        """An account's failed sign-ins from browsers it does not know, in its window (an hour),
        which no sign-in clears: the rate a guesser gets, whatever the owner does."""
        return Attempt(f"account|{account}", ((FAILURES, self.settings.failed_logins_per_account),),
                       self.settings.account_window_seconds, (), BY_ACCOUNT)

    def _account_run(self, account: str) -> Attempt:
        """An account's failures since its last sign-in, which any sign-in clears."""
        return Attempt(f"account-run|{account}", ((FAILURES, self.settings.consecutive_failed_logins),),
                       self.settings.consecutive_window_seconds, (FAILURES,), ACCOUNT_STOPPED)

    def confirmation_attempt(self, address: str) -> Attempt:
        """A wrong confirmation code presented with an authorization code (``oauth/grants.py``):
        a person types it, as a password, so it counts per address with the sign-in's limit per
        address, in a group of its own (wrong confirmations do not lock an address out of
        sign-in). A right one never counts here and is never refused by it: each code's
        presentations (:meth:`present`) bound guessing."""
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

    def _window(self, attempt: Attempt) -> int:
        return attempt.window or self.settings.window_seconds

    def _memory(self, attempt: Attempt) -> MemoryFailureLimiter:
        """The in-process counts of the attempt's window."""
        window = self._window(attempt)
        limiter = self._limiters.get(window)
        if limiter is None:
            limiter = self._limiters[window] = MemoryFailureLimiter(window, lambda: self.clock())
        return limiter

    async def failed(self, attempt: Attempt) -> None:
        """A failed attempt, counted after its (instant) check: TooManyFailures when a counter
        is now past its limit, so that the outcome of the check stays hidden. One refused here
        is not counted: a right one refused (:meth:`check`) counts nothing, so a wrong one
        refused must leave the same state, or a later answer's ``Retry-After`` would tell them
        apart; and the window is not extended by refused guesses, so the limit stays a rate."""
        if not self.settings.enabled:
            return
        keys, limiter = attempt.keys, self._memory(attempt)
        self._failures_here += 1
        self._clean.pop(attempt.group, None)
        limiter.check(keys)
        limiter.failed(keys)
        if self.shared is not None:
            counts, seconds_left = await self.shared.count_attempt(attempt.group, attempt.names, self._window(attempt))
            self._refuse_past([(attempt, counts, seconds_left)], at_limit=False)

    async def check(self, attempt: Attempt) -> None:
        """A succeeded attempt: TooManyFailures while a counter is at its limit (the right
        secret is refused too, or it would tell itself from the wrong ones). With the counts in
        the store, a group the store counted no failure of when this process read it, less
        than ``CACHE_SECONDS`` ago, and of which this process counted none since, is not read
        again (docs/security.md, What a process keeps)."""
        if not self.settings.enabled:
            return
        self._memory(attempt).check(attempt.keys)
        if self.shared is not None:
            group = attempt.group
            if self._clean.get(group, 0.0) > self.clock():
                return  # no failure in the store a moment ago, and none counted here since
            began, failures = self.clock(), self._failures_here
            counts, seconds_left = await self.shared.read_counts(group, attempt.names)
            self._refuse_past([(attempt, counts, seconds_left)], at_limit=True)
            if not any(counts) and failures == self._failures_here:
                if len(self._clean) >= MAX_CLEAN_GROUPS:
                    self._clean.clear()
                self._clean[group] = began + CACHE_SECONDS

    def _refuse_past(self, counted: list[tuple[Attempt, list[int], float]], *, at_limit: bool,
                     reserved: bool = False) -> None:
        """TooManyFailures when a counter of any group is past its limit (or at it), with the
        longest wait of the groups that refuse and that group's reason. Each refusing key is
        then refused here at once for the rest of its window, but an account's or a browser's
        by a reservation (``reserved``): its count holds the attempts in flight from every
        address, given back as they succeed or are refused, and a burst from one address must
        not lock an account out here for an hour. An address's in flight are its own."""
        refusals = []
        for attempt, counts, seconds_left in counted:
            over = [(key, limit) for (key, limit), count in zip(attempt.keys, counts, strict=True)
                    if count > limit or (at_limit and count == limit)]
            for key, limit in over if not reserved or attempt.reason == BY_ADDRESS else ():
                self._memory(attempt).lock(key, limit, seconds_left)
            if over:
                refusals.append((max(1, math.ceil(seconds_left)), attempt.reason))
        if refusals:
            raise TooManyFailures(*max(refusals))

    async def reserve(self, attempt: Attempt | Sequence[Attempt]) -> Reservation | None:
        """Count ``attempt`` (one group, or several: :meth:`sign_in_attempts`) before its check;
        TooManyFailures (nothing counted) past a limit of any of them."""
        if not self.settings.enabled:
            return None
        parts = (attempt,) if isinstance(attempt, Attempt) else tuple(attempt)
        self._failures_here += 1  # an attempt counted before its check: a failure until it is taken back
        for part in parts:
            self._clean.pop(part.group, None)
        waits = [(wait, part.reason) for part in parts if (wait := self._memory(part).wait(part.keys)) is not None]
        if waits:
            raise TooManyFailures(*max(waits))
        reservation = Reservation(tuple((part, self._memory(part).count(part.keys)) for part in parts))
        if self.shared is None:
            return reservation
        shared = self.shared
        results = await asyncio.gather(*(shared.count_attempt(part.group, part.names, self._window(part))
                                         for part in parts), return_exceptions=True)
        counted = [(part, *result) for part, result in zip(parts, results, strict=True)
                   if not isinstance(result, BaseException)]
        failure = next((result for result in results if isinstance(result, BaseException)), None)
        try:
            if failure is not None:
                raise failure
            self._refuse_past(counted, at_limit=False, reserved=True)
        except BaseException:
            self._release_here(reservation)
            for part, _, _ in counted:
                await self._uncount(part, part.names)
            raise
        return Reservation(reservation.parts, shared=True)

    def release(self, reservation: Reservation | None, *, clear_account: bool = False) -> None:
        """The reserved attempt succeeded: take it back (in the store, without waiting). With
        ``clear_account`` (a right password), each group's ``clear`` counters go back to zero:
        the username's at the address and the account's failures since its last sign-in (or the
        browser's own) are forgiven, the address's and the account's hour are not."""
        if reservation is None:
            return
        self._release_here(reservation)
        for attempt, _ in reservation.parts:
            reset = list(attempt.clear) if clear_account else []
            for counter in reset:
                self._memory(attempt).forget(f"{attempt.group}|{counter}")
            if reservation.shared:
                self._in_background(self._uncount(attempt, [name for name in attempt.names if name not in reset],
                                                  reset))

    def _release_here(self, reservation: Reservation) -> None:
        for attempt, at in reservation.parts:
            self._memory(attempt).release(attempt.keys, at)

    def signed_in(self, username: str) -> None:
        """The account signed in (from any browser): its failures since its last sign-in are
        forgiven (NIST: consecutive failures), its hour is not."""
        self._forget([self._account_run(account_counter(username))])

    def password_set(self, username: str) -> None:
        """An operator set the account a new password: whatever was guessed at was the old one,
        so the account's counts (its hour and its failures since its last sign-in) are forgiven."""
        account = account_counter(username)
        self._forget([self._account_hour(account), self._account_run(account)])

    def _forget(self, attempts: list[Attempt]) -> None:
        if not self.settings.enabled:
            return
        for attempt in attempts:
            for counter in attempt.names:
                self._memory(attempt).forget(f"{attempt.group}|{counter}")
            if self.shared is not None:
                self._in_background(self._uncount(attempt, [], attempt.names))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _uncount(self, attempt: Attempt, counters: list[str], reset: list[str] | None = None) -> None:
        """Take back ``counters`` of ``attempt``'s group (and set ``reset`` to zero) in the store;
        when the store fails, kept and made once it answers again (:meth:`_pay_back`): a count
        left one too high until its window ends locked out every right password behind the
        address after an outage."""
        assert self.shared is not None
        try:
            await self.shared.uncount_attempt(attempt.group, counters, reset or [])
        except (StorageError, StoreFault) as exc:
            self._owe(self.clock() + self._window(attempt), attempt.group, counters, reset or [], exc)

    def _owe(self, until: float, group: str, counters: list[str], reset: list[str], exc: Exception) -> None:
        if len(self._owed) >= OWED_MOST:  # bounded: the oldest are the first whose window ends
            self._owed.popleft()
            log.warning("more than %d take-backs of attempts' counts wait for the store: the oldest is dropped",
                        OWED_MOST)
        if not self._owed:  # once per outage, not once per sign-in
            log.warning("could not take back an attempt's count (taken back once the store answers): %s", exc)
        self._owed.append((until, group, counters, reset))
        if self._paying is None:
            self._paying = asyncio.get_running_loop().create_task(self._pay_back())

    async def _pay_back(self) -> None:
        """Make the take-backs the store missed, the oldest first, as soon as it may answer
        again (``pause``), and again after each failure; one whose window has ended is dropped
        (its count went with the window)."""
        assert self.shared is not None
        try:
            while self._owed:
                await self._pause(OWED_RETRY_SECONDS)
                while self._owed:
                    until, group, counters, reset = self._owed[0]
                    if self.clock() < until:
                        try:
                            await self.shared.uncount_attempt(group, counters, reset)
                        except (StorageError, StoreFault):
                            break  # still away: wait again
                    self._owed.popleft()
        finally:
            self._paying = None

    @property
    def owed(self) -> int:
        """How many take-backs wait for the store."""
        return len(self._owed)


def account_counter(username: str) -> str:
    """What the limits and a browser's cookie know an account by: a digest of its username's
    key (any case, as sign-in takes it), never the username."""
    return _counter(username_key(username))


def _counter(account: str) -> str:
    """A counter's name for a client id or username: a digest, safe as a document field name
    whatever the account holds (dots, dollars) and of a fixed size."""
    return hashlib.sha256(account.encode("utf-8", "replace")).hexdigest()[:32]
