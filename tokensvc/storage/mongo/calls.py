"""How the MongoDB store waits for the driver: each call runs in a task of its own, which the
store waits for at most the call's budget and never cancels.

A cancellation delivered inside the driver can leave it broken. PyMongo's asyncio driver waits
on its conditions (server selection, a connection from the pool) with ``asyncio.wait_for``,
which on Python 3.11 runs the wait in a task of its own: a task cancelled while that inner task
takes the lock back leaves the lock released by the wrong task, or held by no one for good
(docs/guide/operations.md: every later server selection, the driver's monitor and its close wait
forever). So nothing the store does cancels a call: not its budget, not an election that
abandons a read, not the caller going away (``/readyz``'s short wait, a stop cancelling the
relay). The store stops waiting instead, and the call ends by the driver's own deadlines
(``pymongo.timeout`` for a read, the client's server-selection, pool and socket timeouts);
:meth:`Calls.settle` lets every call still running end once the client is closed. Nor does the
process's end cancel one: ``asyncio.run`` would cancel every task still running, these among
them, so ``tokensvc serve`` leaves without cancelling the calls its store's close could not
wait out (:func:`running`, ``tokensvc.cli.main.run``)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import weakref
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


# The driver calls of this process, whichever store started them: those still running when a
# service's event loop ends are left to end with the process, not cancelled (``tokensvc.cli.main.run``).
_STARTED: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


def running(loop: asyncio.AbstractEventLoop) -> int:
    """How many driver calls are still running on ``loop``, whichever store started them."""
    return sum(1 for call in list(_STARTED) if call.get_loop() is loop and not call.done())


class Calls:
    """The driver calls of one store: each in a task of its own, waited for and never cancelled;
    each kept until it ends (``running``), and those the store stopped waiting for in ``left``."""

    def __init__(self) -> None:
        self.running: set[asyncio.Task[Any]] = set()
        self.left: set[asyncio.Task[Any]] = set()

    def start(self, call: Coroutine[Any, Any, R], context: contextvars.Context | None = None) -> asyncio.Task[R]:
        """``call`` running in a task of its own (in ``context``, a copy of the caller's by default)."""
        task = asyncio.get_running_loop().create_task(call, context=context)
        self.running.add(task)
        _STARTED.add(task)
        task.add_done_callback(self.running.discard)
        return task

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
        """Wait at most ``seconds`` for every call still running to end, never cancelling one:
        those left behind, those a caller still waits for (a request the drain did not wait out),
        and those started or left meanwhile; how many are still running then."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(seconds, 0.0)
        while self.running and loop.time() < deadline:
            await asyncio.wait(set(self.running), timeout=deadline - loop.time())
        return len(self.running)
