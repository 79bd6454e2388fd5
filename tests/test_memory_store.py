"""What only the memory backend promises: what it stores adds nothing to the work of CPython's
full garbage collections (see storage/memory.py). Its behaviour as a Store is the contract
suite's (tests/test_store_contract.py)."""

from __future__ import annotations

import gc
from datetime import timedelta

import pytest

from tokensvc.records import REFRESH, AuthorizationCode, Session, Subject, Token, utcnow
from tokensvc.storage.memory import MemoryStore


@pytest.mark.gen_test
async def test_stored_records_add_nothing_to_a_full_collection():
    store, now = MemoryStore(), utcnow()
    grant = await store.save_grant("webapp", Subject(user_id="u1"), ["read"], now)
    gc.collect()
    gc.collect()
    before = len(gc.get_objects())
    count = 5000
    await store.add_tokens([Token(f"t{n}", REFRESH, "webapp", grant.grant_id, ["read", "write"], now,
                                  now + timedelta(hours=1), user_id="u1", parent_hash="t0") for n in range(count)])
    for n in range(count // 10):
        await store.add_code(AuthorizationCode(f"c{n}", "webapp", "https://a/cb", ["read"], "u1", None, "x" * 43,
                                               "S256", now + timedelta(minutes=5)))
        await store.add_session(Session(f"s{n}", "u1", now, now + timedelta(days=1)))
    await store.rotate_refresh_token("t1", "webapp", now)
    await store.consume_code("c1", now)
    gc.collect()
    gc.collect()
    # As dataclasses, each token alone would be two objects a collection walks (it and its scopes).
    assert len(gc.get_objects()) - before < count // 50
    assert (await store.get_token("t1")).rotated_at == now and (await store.get_code("c1")).consumed_at == now
