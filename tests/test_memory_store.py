"""What only the memory backend promises: what it stores adds nothing to the work of CPython's
full garbage collections (see storage/rows.py). Its behaviour as a Store is the contract
suite's (tests/test_store_contract.py)."""

from __future__ import annotations

import gc
from datetime import timedelta

import pytest

from tokensvc.records import AuthorizationCode, Family, Pair, Session, Subject, utcnow
from tokensvc.storage.memory import MemoryStore


@pytest.mark.gen_test
async def test_stored_records_add_nothing_to_a_full_collection():
    store, now = MemoryStore(), utcnow()
    grant = await store.save_grant("webapp", Subject(user_id="u1"), ["read"], now)
    gc.collect()
    gc.collect()
    before = len(gc.get_objects())
    count = 5000
    for n in range(count):
        await store.create_family(Family(f"f{n}", grant.grant_id, "webapp", "u1", None, 0, ["read", "write"], now,
                                         f"r{n}", f"a{n}", now, now + timedelta(hours=1), now + timedelta(minutes=10),
                                         renewed_at=now))
    for n in range(count // 10):
        await store.add_code(AuthorizationCode(f"c{n}", "webapp", "https://a/cb", ["read"], "u1", None, "x" * 43,
                                               "S256", now + timedelta(minutes=5)))
        await store.add_session(Session(f"s{n}", "u1", now, now + timedelta(days=1)))
    later = now + timedelta(seconds=1)
    await store.rotate_family("f1", "r1", Pair("a-new", "r-new", ["read"], later, later + timedelta(hours=1),
                                               later + timedelta(minutes=10)), later)
    await store.consume_code("c1", now)
    gc.collect()
    gc.collect()
    # As dataclasses, each family alone would be two objects a collection walks (it and its scopes).
    assert len(gc.get_objects()) - before < count // 50
    assert (await store.get_family("f1"))[0].renewed_at == later and (await store.get_code("c1")).consumed_at == now
