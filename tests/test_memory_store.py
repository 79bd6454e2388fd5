"""What only the memory backend promises: its rows stay out of the garbage collector's way.

Its behaviour as a Store is the contract suite's (tests/test_store_contract.py)."""

from __future__ import annotations

import gc
from datetime import timedelta

import pytest

from tokensvc.records import REFRESH, AuthorizationCode, Grant, Session, Subject, Token, utcnow
from tokensvc.storage.memory import CODES, GRANTS, TOKENS, MemoryStore


def test_rows_round_trip_with_lists_held_as_tuples():
    now = utcnow()
    token = Token("h1", REFRESH, "webapp", "g1", ["read", "write"], now, now + timedelta(hours=1),
                  user_id="u1", parent_hash="h0")
    row = TOKENS.pack(token)
    assert type(row) is tuple and row[TOKENS.index["scopes"]] == ("read", "write")
    assert TOKENS.unpack(row) == token and TOKENS.unpack(row) is not TOKENS.unpack(row)
    assert TOKENS.get(row, "parent_hash") == "h0"
    assert TOKENS.unpack(TOKENS.updated(row, revoked_at=now)).revoked_at == now
    assert TOKENS.unpack(None) is None
    grant = Grant("g1", "webapp", None, "scope-1", [], now)
    assert GRANTS.unpack(GRANTS.pack(grant)) == grant


@pytest.mark.gen_test
async def test_the_stored_rows_are_not_tracked_by_the_garbage_collector():
    store, now = MemoryStore(), utcnow()
    grant = await store.save_grant("webapp", Subject(user_id="u1"), ["read"], now)
    await store.add_tokens([Token(f"t{n}", REFRESH, "webapp", grant.grant_id, ["read"], now,
                                  now + timedelta(hours=1), user_id="u1", parent_hash="t0") for n in range(100)])
    await store.add_code(AuthorizationCode("c1", "webapp", "https://a/cb", ["read"], "u1", None, "x" * 43, "S256",
                                           now + timedelta(minutes=5)))
    await store.add_session(Session("s1", "u1", now, now + timedelta(days=1)))
    await store.rotate_refresh_token("t1", "webapp", now)
    await store.consume_code("c1", now)
    # A row's scopes tuple may be untracked after the row is examined: a second collection
    # then takes the row, and a full one the dict that holds only untracked rows.
    gc.collect()
    gc.collect()
    held = [store._tokens, store._codes, store._sessions, store._grants, store._children]
    for table in held:
        assert table and not gc.is_tracked(table)
        assert not any(gc.is_tracked(row) for row in table.values())
    assert CODES.unpack(store._codes["c1"]).consumed_at == now
