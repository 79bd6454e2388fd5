"""A MongoDB stand-in that yields to the event loop like a real server.

mongomock-motor's coroutines never wait: each driver call runs to its end in the step that
awaits it, so concurrent requests on the ``mongodb`` backend would run one after another and
no race could show. :class:`Yielding` wraps its client (and every database, collection and
cursor reached through it) so that every awaited driver call first yields to the event loop
and yields again before its reply is handed back, optionally after ``latency`` seconds each
way. What the server does atomically (one document command) stays atomic; everything between
two calls can interleave, as it does over a network.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from collation import caseless


class Yielding:
    def __init__(self, target: Any, latency: float = 0.0) -> None:
        self._target = target
        self._latency = latency

    def __getitem__(self, key: str) -> Yielding:
        return Yielding(self._target[key], self._latency)

    def __getattr__(self, name: str) -> Any:
        if name == "command":
            return self._command
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "find" and args and kwargs.get("collation") is not None:  # mongomock ignores it
                args = (caseless(args[0], kwargs["collation"]), *args[1:])
            result = value(*args, **kwargs)
            if inspect.isawaitable(result):
                return self._later(result)
            if result is self._target:  # a cursor's chaining methods (sort, limit, ...)
                return self
            if hasattr(result, "to_list") or hasattr(result, "find_one"):
                return Yielding(result, self._latency)
            return result

        return call

    async def _command(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        """A command, as a replica-set primary answers it (mongomock knows no ``hello``)."""
        if command == "hello":
            return await self._later(asyncio.sleep(0, {"ok": 1, "isWritablePrimary": True}))
        return await self._later(self._target.command(command, *args, **kwargs))

    async def _later(self, awaitable: Any) -> Any:
        try:
            await asyncio.sleep(self._latency)  # the request travels to the server ...
        except asyncio.CancelledError:  # never sent: the driver's call is dropped, not left unawaited
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            raise
        result = await awaitable
        await asyncio.sleep(self._latency)  # ... and the reply comes back, a loop iteration later
        return result
