"""Waiting for an event, never for a fixed time: a condition is polled until it holds or a
deadline passes. The deadline bounds a hang; it measures no speed (on a busy 2-core machine a
step takes many times what it takes on an idle one), so it is generous."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

DEADLINE = 30.0  # seconds
INTERVAL = 0.01


async def until(condition: Callable[[], Any], what: str = "", deadline: float = DEADLINE) -> Any:
    """The first true value of ``condition()`` (awaited when it is a coroutine), polled on the
    running loop; AssertionError naming ``what`` once ``deadline`` seconds have passed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() >= end:
            raise AssertionError(f"not within {deadline:g} s: {what or condition}")
        await asyncio.sleep(INTERVAL)


def wait_until(condition: Callable[[], Any], what: str = "", deadline: float = DEADLINE,
               retry: tuple[type[BaseException], ...] = (), interval: float = 0.05) -> Any:
    """The same, blocking: for a process, a server in a thread, anything the test waits on
    outside an event loop. An exception of ``retry`` (a request's: the server is busy or not
    listening yet) means "not yet"; the last one is chained to the AssertionError."""
    end = time.monotonic() + deadline
    last: BaseException | None = None
    while True:
        try:
            value = condition()
        except retry as exc:
            value, last = None, exc
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"not within {deadline:g} s: {what or condition}") from last
        time.sleep(interval)
