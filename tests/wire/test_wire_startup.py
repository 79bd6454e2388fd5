"""Start-up on the wire: a member that does not take writes is not served from, index builds
have a budget of their own, and every index conflict is named by what is in the way."""

from __future__ import annotations

import pytest
from primary import BUDGET_MS, Fault, ReplicaSet, wire_settings

from tokensvc.bootstrap import make_store
from tokensvc.storage.base import StorageError, StoreFault
from tokensvc.storage.mongo import INDEXES

pytestmark = pytest.mark.gen_test


async def test_a_secondary_reached_directly_is_not_served_from():
    secondary = ReplicaSet(writable=False).start()
    try:
        store = make_store(wire_settings(secondary, mongodb_uri=secondary.uri(directConnection="true")))
        with pytest.raises(StorageError, match="is not a writable primary \\(secondary\\).*no directConnection"):
            await store.open()
        assert secondary.sent("createIndexes") == []  # nothing attempted on it
        await store.close()
    finally:
        secondary.stop()


async def test_index_builds_may_take_longer_than_a_requests_budget(primary):
    primary.script(Fault("createIndexes", "delay", collection="families", seconds=BUDGET_MS / 1000 + 0.5))
    store = make_store(wire_settings(primary))
    await store.open()  # not cut at the request budget
    assert len(primary.sent("createIndexes")) == len(INDEXES)
    await store.close()


async def test_tokensvcs_keys_under_another_name_are_named_with_what_to_drop(primary):
    primary.db["tokensvc"]["users"].create_index([("username", 1)], name="username_1", unique=True)
    store = make_store(wire_settings(primary))
    with pytest.raises(StoreFault) as refused:
        await store.open()
    message = str(refused.value)
    assert message.startswith("index users.username_1 (tokensvc's username) exists with other options")
    assert "db.users.dropIndex('username_1')" in message
    await store.close()


async def test_a_ttl_that_needs_coll_mod_without_the_role_says_which_role(primary):
    primary.db["tokensvc"]["codes"].create_index([("expires_at", 1)], name="ttl", expireAfterSeconds=60)
    primary.script(Fault("collMod", "error", code=13))  # Unauthorized: readWrite has no collMod
    store = make_store(wire_settings(primary))
    with pytest.raises(StoreFault) as refused:
        await store.open()
    message = str(refused.value)
    assert "index codes.ttl needs expireAfterSeconds 3600 (it has 60)" in message
    assert "dbAdmin" in message and "collMod: 'codes'" in message
    await store.close()


async def test_an_index_a_later_one_replaced_is_dropped(primary):
    primary.db["tokensvc"]["families"].create_index([("grant_id", 1)], name="grant_id")
    store = make_store(wire_settings(primary))
    await store.open()
    indexes = primary.db["tokensvc"]["families"].index_information()
    assert "grant_id" not in indexes and indexes["grant_live"]["key"] == [("grant_id", 1), ("revoked_at", 1),
                                                                            ("created_at", 1)]
    await store.open()  # and a start-up after that finds nothing to drop
    await store.close()
