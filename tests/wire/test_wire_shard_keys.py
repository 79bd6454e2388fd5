"""Every hot query carries its collection's shard key, checked on the filters a three-member
replica set receives (docs/guide/operations.md, Beyond one replica set).

A sharded deployment sends a query that names its collection's shard key to the one shard that
holds it; one that does not goes to every shard. Each hot request of the round-trip table
(introspection, ``/v1/me``, a client's public record, refresh, code exchange, RFC 7009
revocation of either token) is sent here with nothing kept in the process, so the reads of a
cold process (the client, its previous secret, the failure counts) are seen too, and every
command on a collection the table of keys names is checked: a find's, an aggregate's
``$match``, a findAndModify's, an update's and a delete's filter, an insert's documents, and
each ``$lookup`` (its ``foreignField``).

An access token's family is found by its id and the token's hash together: the token carries
its family's id, enciphered under a server key, beside its random part (oauth/tokens.py). A
token of the old shape (issued by 0.10.0) is still found by its hash alone, on every shard,
until it expires.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import VERIFIER, WEBAPP_REDIRECT, json_of, post_form
from primary import NOT_A_REQUEST, ReplicaSet
from test_wire_round_trips import WEBAPP, code_for, tokens_for

from tokensvc.config import StorageSettings
from tokensvc.records import User

pytestmark = pytest.mark.gen_test(timeout=120)

# The shard key of each collection a hot request reads or writes (docs/guide/operations.md). The
# registry's collections (clients, removals, previous_secrets) stay unsharded in the plan: a few
# hundred documents, each read by its key, which is checked here all the same.
SHARD_KEYS = {
    "families": "_id",
    "codes": "_id",
    "grants": "_id",
    "users": "_id",
    "sessions": "_id",
    "failures": "_id",
    "clients": "_id",
    "removals": "_id",
    "previous_secrets": "_id",
}

MEMBERS = 3  # of the replica set (conftest.py's primary), as a deployment runs


@pytest.fixture
def config():
    from helpers import make_config

    return make_config(storage={"backend": "mongodb", "mongodb_uri": "mongodb://db1,db2,db3/?replicaSet=rs0",
                                "timeout_ms": StorageSettings().timeout_ms})


@pytest.fixture
def store(wire_store):
    return wire_store


@pytest.fixture
def users(app, ctx, io_loop):
    from helpers import PASSWORD_HASHES

    async def made() -> list[User]:
        made = [User(f"u_shard{index}", f"shard{index}", PASSWORD_HASHES["alice"]) for index in range(3)]
        for user in made:
            await ctx.store.put_user(user)
        return made

    return io_loop.run_sync(made)


def carries(condition: Any, key: str) -> bool:
    """Whether a filter pins ``key`` to one value or a list of values (a targeted query):
    at its top level, in every branch of an ``$or``, or in a part of an ``$and``."""
    if not isinstance(condition, dict):
        return False
    if key in condition:
        value = condition[key]
        return not isinstance(value, dict) or set(value) <= {"$eq", "$in"}
    return (all(carries(branch, key) for branch in condition.get("$or", [None]))
            or any(carries(part, key) for part in condition.get("$and", [])))


def queries(name: str, command: dict) -> list[tuple[str, str, Any]]:
    """(collection, what, its filter or document) of each query ``command`` sends."""
    collection = command.get(name)
    if not isinstance(collection, str):
        return []
    if name == "find":
        return [(collection, "filter", command.get("filter", {}))]
    if name == "findAndModify":
        return [(collection, "query", command.get("query", {}))]
    if name == "update":
        return [(collection, "q", spec["q"]) for spec in command["updates"]]
    if name == "delete":
        return [(collection, "q", spec["q"]) for spec in command["deletes"]]
    if name == "insert":
        return [(collection, "document", document) for document in command["documents"]]
    if name == "aggregate":
        stages = command.get("pipeline", [])
        found = [(collection, "$match", stages[0]["$match"])] if stages and "$match" in stages[0] else [
            (collection, "$match", {})]
        for stage in stages:
            lookup = stage.get("$lookup")
            if lookup is not None:
                found.append((lookup["from"], "$lookup", {lookup["foreignField"]: "$" + lookup["localField"]}))
        return found
    return []


def broadcast(primary: ReplicaSet) -> list[tuple[str, str, Any]]:
    """The queries received that do not carry their collection's shard key."""
    with primary.lock:
        commands = [(name, doc) for name, doc in primary.commands if name not in NOT_A_REQUEST]
    return [(collection, what, condition) for name, doc in commands
            for collection, what, condition in queries(name, doc)
            if collection in SHARD_KEYS and not carries(condition, SHARD_KEYS[collection])]


async def test_every_hot_query_carries_its_collections_shard_key(http_client, base_url, ctx, primary, users):
    issued = await tokens_for(ctx, http_client, base_url, users)
    code = await code_for(ctx, users[0])
    primary.forget()
    ctx.store.registry.recent.clear()  # what a cold process reads of the client, too

    async def ok(response) -> dict:
        assert response.code == 200, response.body
        return json_of(response)

    tokens = issued[0]
    await ok(await post_form(http_client, base_url + "/oauth/token/introspect", {"token": tokens["access_token"]},
                             headers=WEBAPP))
    await ok(await http_client.fetch(base_url + "/v1/me", headers={"Authorization": f"Bearer {tokens['access_token']}"},
                                     raise_error=False))
    await ok(await http_client.fetch(base_url + "/oauth/clients/skyplanner", raise_error=False))
    renewed = await ok(await post_form(http_client, base_url + "/oauth/token/refresh", {
        "grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]}, headers=WEBAPP))
    await ok(await post_form(http_client, base_url + "/oauth/token", {
        "grant_type": "authorization_code", "code": code, "redirect_uri": WEBAPP_REDIRECT,
        "code_verifier": VERIFIER}, headers=WEBAPP))
    await ok(await post_form(http_client, base_url + "/oauth/token/revoke", {"token": renewed["refresh_token"]},
                             headers=WEBAPP))
    await ok(await post_form(http_client, base_url + "/oauth/token/revoke", {"token": issued[1]["access_token"]},
                             headers=WEBAPP))

    assert broadcast(primary) == []
    with primary.lock:
        seen = {collection for name, doc in primary.commands for collection, _, _ in queries(name, doc)}
    # The check saw the collections each of these requests reaches.
    assert {"families", "codes", "grants", "users", "clients", "previous_secrets"} <= seen, seen


def test_a_filter_carries_a_key_only_when_it_pins_it():
    assert carries({"_id": "a", "x": 1}, "_id") and carries({"_id": {"$in": ["a", b"a"]}}, "_id")
    assert carries({"$or": [{"_id": "a"}, {"_id": "b"}]}, "_id")
    assert carries({"$and": [{"x": 1}, {"_id": "a"}]}, "_id")
    assert not carries({"_id": {"$gt": "a"}}, "_id") and not carries({"x": 1}, "_id")
    assert not carries({"$or": [{"_id": "a"}, {"x": 1}]}, "_id")
