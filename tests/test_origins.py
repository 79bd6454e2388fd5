"""The CORS origin decision (tokensvc.oauth.origins): one read in flight shared by every
decision, a bounded wait for it, no wait at all while the store is away, and a change made
here seen by the next decision."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tokensvc.oauth.origins import BrowserOrigins
from tokensvc.storage.base import StorageError

APP = "https://app.example"
DEADLINE = 10.0  # far above any wait the decision may take; reaching it means it hung


class Registry:
    """A registry whose reads answer when the test says so (or fail, or answer at once)."""

    def __init__(self, origins=(APP,), held: bool = False) -> None:
        self.origins, self.reads, self.fail = list(origins), 0, False
        self.release = asyncio.Event()
        if not held:
            self.release.set()

    async def list_clients(self):
        self.reads += 1
        origins = tuple(self.origins)  # what the store holds when the read reaches it
        await self.release.wait()
        if self.fail:
            raise StorageError("the store is away")
        return [SimpleNamespace(browser_origins=origins)]


async def decide(origins: BrowserOrigins, registry: Registry, origin: str = APP) -> bool:
    return await asyncio.wait_for(origins.allows(registry, origin), DEADLINE)


@pytest.mark.gen_test
async def test_decisions_share_one_read_and_wait_for_it_at_most_their_bound():
    registry = Registry(held=True)
    origins = BrowserOrigins(wait=0.05)
    assert await asyncio.gather(*(decide(origins, registry) for _ in range(20))) == [False] * 20
    assert registry.reads == 1
    # The store counts as away: the next decisions do not wait for the read still in flight.
    origins.wait = DEADLINE * 10
    assert await decide(origins, registry) is False and registry.reads == 1
    registry.release.set()
    await asyncio.wait_for(_read_done(origins), DEADLINE)
    assert await decide(origins, registry) is True and registry.reads == 1  # the set read, kept for its TTL


@pytest.mark.gen_test
async def test_a_store_that_answers_is_waited_for_and_a_change_here_is_seen_next():
    registry = Registry(origins=())
    origins = BrowserOrigins(wait=DEADLINE)
    assert await decide(origins, registry) is False
    registry.origins.append(APP)
    assert await decide(origins, registry) is False  # within the TTL
    origins.forget()
    assert await decide(origins, registry) is True and registry.reads == 2


@pytest.mark.gen_test
async def test_a_change_made_while_a_read_is_in_flight_is_read_again():
    registry = Registry(origins=(), held=True)
    origins = BrowserOrigins(wait=DEADLINE)
    first = asyncio.ensure_future(decide(origins, registry))
    await asyncio.wait_for(_reading(origins), DEADLINE)
    registry.origins.append(APP)
    origins.forget()
    registry.release.set()
    assert await first is False  # the read in flight reached the store before the change
    assert await decide(origins, registry) is True and registry.reads == 2


@pytest.mark.gen_test
async def test_a_failed_read_keeps_the_last_set_and_decisions_stop_waiting():
    now = [0.0]
    registry = Registry()
    origins = BrowserOrigins(ttl=30.0, clock=lambda: now[0], wait=DEADLINE * 10)
    assert await decide(origins, registry) is True
    registry.fail, now[0] = True, 31.0
    assert await decide(origins, registry) is True and registry.reads == 2  # failed: the last set stands
    registry.release.clear()  # the store hangs now: a decision does not wait for its read
    now[0] = 29.0 + 31.0  # past the retry's second
    assert await decide(origins, registry) is True and registry.reads == 3
    registry.fail = False
    registry.release.set()
    await asyncio.wait_for(_read_done(origins), DEADLINE)


async def _reading(origins: BrowserOrigins) -> None:
    while origins._reading is None:
        await asyncio.sleep(0)


async def _read_done(origins: BrowserOrigins) -> None:
    while origins._reading is not None:
        await asyncio.sleep(0)
