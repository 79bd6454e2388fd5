"""How the MongoDB store waits for the driver: each call runs in a task of its own, which the
store waits for at most the call's budget and never cancels.

A cancellation delivered inside the driver can leave it broken. PyMongo's asyncio driver waits
on its conditions (server selection, a connection from the pool) with ``asyncio.wait_for``,
which on Python 3.11 runs the wait in a task of its own: a task cancelled while that inner task
takes the lock back leaves the lock released by the wrong task, or held by no one for good
(docs/operations.md: every later server selection, the driver's monitor and its close wait
forever). So nothing the store does cancels a call: not its budget, not an election that
abandons a read, not the caller going away (``/readyz``'s short wait, a stop cancelling the
relay). The store stops waiting instead, and the call ends by the driver's own deadlines
(``pymongo.timeout`` for a read, the client's server-selection, pool and socket timeouts);
:meth:`Calls.settle` lets the calls left behind end before the client closes."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

R = TypeVar("R")


class Left(Exception):
    """The store stopped waiting for a call (the call itself goes on to its own end)."""


class Elected(Left):
    """Another primary was elected while a call waited: it is run again, on the new one."""


ELECTED = "elected"  # what an election wakes a waiter with (storage/mongo/topology.py)


def wake(waiter: asyncio.Future[Any], why: Any = None) -> None:
    """End a wait (the call done, its time up, an election), unless something else ended it."""
    if not waiter.done():
        waiter.set_result(why)


class Calls:
    """The driver calls of one store: each in a task of its own, waited for and never cancelled;
    those the store stopped waiting for, until they end."""

    def __init__(self) -> None:
        self.left: set[asyncio.Task[Any]] = set()

    def start(self, call: Coroutine[Any, Any, R], context: contextvars.Context | None = None) -> asyncio.Task[R]:
        """``call`` running in a task of its own (in ``context``, a copy of the caller's by default)."""
        return asyncio.get_running_loop().create_task(call, context=context)

    async def wait(self, call: asyncio.Task[R], seconds: float, elections: set[asyncio.Future[Any]] | None = None) -> R:
        """The answer of ``call``, waited for at most ``seconds`` (:class:`Left`), or until an
        election wakes the wait through ``elections`` (:class:`Elected`; the topology's set of
        waits an election abandons). Whatever happens (the caller cancelled too), the call is
        never cancelled: one not done is left to end by itself."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        call.add_done_callback(lambda _: wake(waiter))
        timer = loop.call_later(max(seconds, 0.0), wake, waiter)
        if elections is not None:
            elections.add(waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if elections is not None:
                elections.discard(waiter)
            if not call.done():
                self.leave(call)
        if call.done():
            return call.result()
        raise Elected() if waiter.result() == ELECTED else Left()

    def leave(self, call: asyncio.Task[Any]) -> None:
        """``call`` goes on without anyone waiting for it: kept until it ends, its outcome read
        then (a driver error nobody will answer with)."""
        self.left.add(call)
        call.add_done_callback(self._ended)

    def _ended(self, call: asyncio.Task[Any]) -> None:
        self.left.discard(call)
        if not call.cancelled() and call.exception() is not None:
            log.debug("a store call nobody waited for any more ended: %r", call.exception())

    async def settle(self, seconds: float) -> int:
        """Wait at most ``seconds`` for the calls left behind to end (never cancelling one); how
        many are still running then."""
        if self.left:
            await asyncio.wait(set(self.left), timeout=max(seconds, 0.0))
        return len(self.left)
