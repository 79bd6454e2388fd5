"""The HTTP flow on every backend, what a database dump reveals, index use, and outages."""

from __future__ import annotations

import pytest
from backends import BACKENDS, REAL_URI, held, store_fixture
from helpers import (
    PAST_CONCURRENT,
    SKY_REDIRECT,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    basic,
    check_oauth_error,
    check_schema,
    exchange,
    json_of,
    post_form,
)

from tokensvc import schemas
from tokensvc.storage.mongo import INDEXES, MongoStore
from tokensvc.storage.mongo.causal import SessionedCollection

store = store_fixture()


async def full_flow(browser, http_client, base_url) -> list[str]:
    """authorize → token → refresh → introspect → revoke, first- and third-party; returns
    every secret the clients saw."""
    seen: list[str] = []
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, scope="read write")
    tokens = json_of(await exchange(http_client, base_url, code))
    seen += [code, tokens["access_token"], tokens["refresh_token"]]
    refreshed = await post_form(http_client, base_url + "/oauth/token/refresh",
                                {"refresh_token": tokens["refresh_token"]},
                                {"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert refreshed.code == 200, refreshed.body
    second = check_schema(schemas.token_response, json_of(refreshed))
    seen += [second["access_token"], second["refresh_token"]]
    introspect_url = base_url + "/oauth/token/introspect"
    auth = {"Authorization": basic("webapp", WEBAPP_SECRET)}
    info = json_of(await post_form(http_client, introspect_url, {"token": second["access_token"]}, auth))
    assert info["active"] is True and info["username"] == "alice"
    assert json_of(await post_form(http_client, introspect_url, {"token": tokens["refresh_token"]}, auth)) \
        == {"active": False}
    revoked = await post_form(http_client, base_url + "/oauth/token/revoke", {"token": second["refresh_token"]}, auth)
    assert revoked.code == 200
    for token in (second["access_token"], second["refresh_token"]):
        assert json_of(await post_form(http_client, introspect_url, {"token": token}, auth)) == {"active": False}

    sky_code = await browser.code_for("skyplanner", SKY_REDIRECT)
    sky = json_of(await exchange(http_client, base_url, sky_code, client_id="skyplanner", secret=None,
                                 redirect_uri=SKY_REDIRECT))
    seen += [sky_code, sky["access_token"], sky["refresh_token"]]
    # Replaying the code revokes what it gave.
    check_oauth_error(await exchange(http_client, base_url, sky_code, client_id="skyplanner", secret=None,
                                     redirect_uri=SKY_REDIRECT), 400, "invalid_grant")
    assert json_of(await post_form(http_client, introspect_url, {"token": sky["access_token"]}, auth)) \
        == {"active": False}
    seen.append(browser.cookies["tokensvc_session"])
    return seen


@pytest.mark.gen_test
async def test_full_flow(browser, http_client, base_url, store):
    await full_flow(browser, http_client, base_url)


@pytest.mark.gen_test
async def test_refresh_reuse_revokes_the_grant(browser, http_client, base_url, store, clock):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    first = json_of(await exchange(http_client, base_url, code))
    url, auth = base_url + "/oauth/token/refresh", {"Authorization": basic("webapp", WEBAPP_SECRET)}
    second = json_of(await post_form(http_client, url, {"refresh_token": first["refresh_token"]}, auth))
    clock.advance(PAST_CONCURRENT)
    check_oauth_error(await post_form(http_client, url, {"refresh_token": first["refresh_token"]}, auth),
                      400, "invalid_grant")
    check_oauth_error(await post_form(http_client, url, {"refresh_token": second["refresh_token"]}, auth),
                      400, "invalid_grant")


async def dump(store) -> str:
    """Everything the store holds, as text."""
    if isinstance(store, MongoStore):
        parts = []
        for name in ("clients", "users", "installations", "grants", "codes", "families", "sessions"):
            parts.append(repr(await store.db[name].find({}).to_list(None)))
        return "\n".join(parts)
    return repr(vars(store))


@pytest.mark.gen_test
async def test_the_store_holds_no_secret_in_clear(browser, http_client, base_url, store):
    seen = await full_flow(browser, http_client, base_url)
    text = await dump(store)
    assert "alice" in text  # the dump is real
    for secret in [*seen, WEBAPP_SECRET, "alice-password"]:
        assert secret not in text


class RecordingCollection:
    """Wraps a collection and records the filter of every query (with its collation, if any)."""

    def __init__(self, name, collection, log):
        self._name, self._collection, self._log = name, collection, log

    def __getattr__(self, attr):
        method = getattr(self._collection, attr)
        if attr in ("find", "find_one", "find_one_and_update", "update_one", "update_many", "replace_one",
                    "delete_one", "delete_many"):
            def record(filter=None, *args, **kwargs):
                self._log.append((self._name, dict(filter or {}), kwargs.get("collation")))
                return method(filter, *args, **kwargs)
            return record
        return method


def plan_stages(plan: dict) -> set[str]:
    stages = {plan.get("stage", "")}
    for key in ("inputStage", "queryPlan"):
        if key in plan:
            stages |= plan_stages(plan[key])
    for child in plan.get("inputStages", []):
        stages |= plan_stages(child)
    return stages


@pytest.mark.parametrize("store", [p for p in BACKENDS if p.id != "memory"], indirect=True)
@pytest.mark.gen_test
async def test_every_query_is_served_by_an_index(browser, http_client, base_url, store):
    """Each filter the store issues starts with an indexed field (checked on mongomock, which
    has no query planner); against a real server, ``explain()`` must show no COLLSCAN, and a
    query under a collation is served by an index of that collation."""
    log: list[tuple[str, dict]] = []
    names = ("clients", "users", "installations", "grants", "codes", "families", "sessions")
    # What the store's parts hold of these collections, each once (the codes, families and
    # sessions are held by their part and by the credentials both).
    held_collections = {id(value): value for value in held(store) if isinstance(value, SessionedCollection)}
    for collection in held_collections.values():
        name = collection._collection.name
        if name in names:
            collection._collection = RecordingCollection(name, collection._collection, log)
    assert {value._collection._name for value in held_collections.values()
            if isinstance(value._collection, RecordingCollection)} == set(names)
    await full_flow(browser, http_client, base_url)
    assert log
    leading = {(collection, keys[0][0]) for collection, keys, _ in INDEXES}
    for collection, query, collation in log:
        if not query:
            assert collection in ("clients", "users", "installations"), collection  # whole small listings
            continue
        assert "_id" in query or any((collection, field) in leading for field in query), (collection, query)
        if REAL_URI and type(store.client).__module__.startswith("pymongo"):
            explained = await store.db[collection].find(query, collation=collation).explain()
            plan = explained["queryPlanner"]["winningPlan"]
            assert "COLLSCAN" not in plan_stages(plan), (collection, query)
            if collation is not None:
                assert any(options.get("collation") == collation and options["name"] in str(plan)
                           for name, _, options in INDEXES if name == collection), (collection, query, plan)
