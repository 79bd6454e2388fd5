"""The MongoDB store's mapping layer: a record's hashes are packed (format 2) or found in either
format by the mapper of its kind, never by hand at a call site."""

from __future__ import annotations

import inspect
import re
from datetime import timedelta

import pytest

from tokensvc.records import Pair, utcnow
from tokensvc.storage.mongo import CODES, FAMILIES, SESSIONS, MongoStore, hashes
from tokensvc.storage.mongo.mapping import pair_fields

pytestmark = pytest.mark.mongodb

A, B = "a" * 64, "b" * 64  # two SHA-256 hex digests


def test_a_filter_finds_each_hash_in_either_format_and_leaves_the_rest_as_is():
    assert FAMILIES.match(family_id=A, access_hash=B, revoked_at=None, grant_id="g1") == {
        "_id": {"$in": [bytes.fromhex(A), A]}, "access_hash": {"$in": [bytes.fromhex(B), B]},
        "revoked_at": None, "grant_id": "g1"}
    assert SESSIONS.match(session_hash=A) == {"_id": {"$in": [bytes.fromhex(A), A]}}
    # A single-document write never lands on a frozen original (its copy is written instead).
    assert CODES.writable(code_hash=A, consumed_at=None) == {**CODES.match(code_hash=A, consumed_at=None),
                                                             **hashes.NOT_FROZEN}


def test_a_write_stores_each_hash_as_the_format_says_and_nothing_else_packed():
    now = utcnow()
    pair = Pair(A, B, ["read"], now, now + timedelta(hours=1), now + timedelta(minutes=10))
    written = FAMILIES.fields(hashes.packed, **pair_fields(pair), previous_hash=A, previous_access_hash=None,
                              renewed_at=now)
    assert written["access_hash"] == bytes.fromhex(A) and written["refresh_hash"] == bytes.fromhex(B)
    assert written["previous_hash"] == bytes.fromhex(A) and written["previous_access_hash"] is None
    assert [name for name, value in written.items() if isinstance(value, bytes)] == [
        "refresh_hash", "access_hash", "previous_hash"]
    assert CODES.fields(hashes.packed, family_id=A, consumed_at=now) == {"family_id": bytes.fromhex(A),
                                                                         "consumed_at": now}
    assert FAMILIES.fields(lambda value: value, access_hash=A) == {"access_hash": A}  # format 1: hex


def test_no_call_site_of_the_store_packs_or_widens_a_hash_by_hand():
    source = inspect.getsource(MongoStore)
    assert re.findall(r"hashes\.either\(|\bpack\(", source) == []
