"""The admin API over real HTTP, on its own application (the admin listener's): every resource
answers in the service's shapes, and only an admin user's token with the ``admin`` scope
opens it."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from urllib.parse import quote

import pytest
from helpers import (
    SKY_REDIRECT,
    check_oauth_error,
    check_schema,
    check_validation_error,
    delete_client_by_hand,
    hand_over,
    handed_over,
    issue_tokens,
    json_of,
)

from tokensvc.admin import schemas as admin_schemas
from tokensvc.app import ADMIN_ROUTES, make_admin_app
from tokensvc.bootstrap import seed
from tokensvc.oauth import hashing, introspection, sessions

pytestmark = pytest.mark.gen_test

STRONG = "violet-comet-harbor"


@pytest.fixture
def app(io_loop, store, config, ctx):
    io_loop.run_sync(lambda: seed(store, config))
    return make_admin_app(io_loop.run_sync(lambda: hand_over(store, config)), store, ctx)


@pytest.fixture
def root_token(io_loop, ctx):
    return io_loop.run_sync(lambda: issue_tokens(ctx, "root", "read admin")).access_token


@pytest.fixture
def call(http_client, base_url, root_token):
    """``call(method, path, body)``: the admin API as root; returns the response."""

    async def call(method, path, body=None, token=root_token, raw=None, headers=None):
        all_headers = {"Authorization": f"Bearer {token}"} if token else {}
        if body is not None or raw is not None:
            all_headers["Content-Type"] = "application/json"
        all_headers.update(headers or {})
        return await http_client.fetch(base_url + path, method=method, headers=all_headers, raise_error=False,
                                       body=raw if raw is not None else json.dumps(body) if body is not None
                                       else ("" if method in ("POST", "PUT", "PATCH") else None),
                                       allow_nonstandard_methods=True)

    return call


def example_path(path: str) -> str:
    return (path.replace("{client_id}", "webapp").replace("{username}", "alice").replace("{session_id}", "0" * 24)
            .replace("{installation_id}", "backyard-scope").replace("{grant_id}", "g1"))


PROTECTED = [(route.path, method) for route in ADMIN_ROUTES for method in sorted(route.methods)
             if route.path not in ("/admin", "/openapi.json") and method not in ("HEAD", "OPTIONS")]


@pytest.mark.parametrize("path,method", PROTECTED)
async def test_every_admin_call_needs_an_admins_token_with_the_admin_scope(call, ctx, path, method):
    body = {} if method in ("POST", "PUT", "PATCH") else None
    # No token, a malformed one, a dead one: 401 with the bearer challenge.
    dead = await issue_tokens(ctx, "root", "read admin")
    await introspection_kill(ctx, dead.access_token)
    for token in (None, "not-a-token", dead.access_token):
        response = await call(method, example_path(path), body, token=token)
        check_oauth_error(response, 401, "invalid_token")
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    # A user who is not an admin (alice), and an admin's token without the scope: 403.
    alice = (await issue_tokens(ctx, "alice", "read write")).access_token
    check_oauth_error(await call(method, example_path(path), body, token=alice), 403, "access_denied")
    narrow = (await issue_tokens(ctx, "root", "read")).access_token
    check_oauth_error(await call(method, example_path(path), body, token=narrow), 403, "insufficient_scope")


async def introspection_kill(ctx, token):
    from tokensvc.oauth import revocation

    assert await revocation.revoke_token(ctx, token, None)
    assert await introspection.introspect(ctx, token) == {"active": False}



@pytest.mark.parametrize("field,value", [
    ("name", "   "), ("name", "Planner\x1b[31m"), ("name", "\u3000"), ("redirectUris", ["\x01https://p.example/cb"]),
    ("redirectUris", ["https://p.example/c\tb"]), ("logoUrl", " https://p.example/logo.png"),
    ("logoUrl", "ht\ttps://p.example/logo.png"), ("logoUrl", "https://[p.example/logo.png"),
    ("allowedOrigins", ["https://p\x01.example"]), ("allowedOrigins", ["https://p.example "]),
])
async def test_no_control_character_or_blank_name_gets_into_a_client(call, field, value):
    """What urlsplit would strip or drop (leading controls and spaces, tabs anywhere) and a name
    of spaces are refused, as the document's patterns say; brackets that hold no address are a
    422, never a 500."""
    body = {"name": "Planner", "redirectUris": ["https://p.example/cb"], field: value}
    response = await call("POST", "/admin/clients", body)
    assert response.code == 422, (field, value, response.body)
    assert json_of(response)["detail"][0]["loc"] == ["body", field]


def operations_with_a_body() -> list[tuple[str, str]]:
    from tokensvc.openapi import document as openapi

    paths = openapi.build(ADMIN_ROUTES, "http://127.0.0.1", admin=True)["paths"]
    return [(path, method.upper()) for path, item in sorted(paths.items()) for method, operation in sorted(item.items())
            if isinstance(operation, dict) and "requestBody" in operation]


NESTED_PAST_THE_LIMIT = {
    "brackets-filling-the-body": "[" * 60_000,  # past the interpreter's recursion limit: a RecursionError
    "deep-in-a-field": '{"name": ' + "[" * 900 + "]" * 900 + "}",  # parsed, then walked again
    "one-past-the-limit": "[" * 33 + "]" * 33,
    "objects": '{"a":' * 40 + "1" + "}" * 40,
}


@pytest.mark.parametrize("path,method", operations_with_a_body())
@pytest.mark.parametrize("nested", sorted(NESTED_PAST_THE_LIMIT))
async def test_a_body_nested_past_the_limit_is_422_never_500(call, path, method, nested):
    """Every JSON body is refused as invalid JSON past 32 levels of arrays and objects, before it
    is parsed: 64 KiB of ``[`` was a 500 (a RecursionError), and a deep value was walked by every
    schema after the parse. Brackets inside strings nest nothing."""
    from tokensvc import jsontext

    fault = check_validation_error(await call(method, example_path(path), raw=NESTED_PAST_THE_LIMIT[nested]),
                                   ["body"], "json_invalid")
    assert fault["ctx"] == {"max_depth": jsontext.MAX_DEPTH}


async def test_a_body_within_the_limit_is_read_as_ever(call):
    """32 levels are read (a wrong type is the field's fault, not the body's), and brackets in a
    string count for nothing."""
    within = '{"name": "Nested", "redirectUris": ["https://n.example/cb"], "description": ' + \
             "[" * 31 + "]" * 31 + "}"
    check_validation_error(await call("POST", "/admin/clients", raw=within), ["body", "description"], "string_type")
    in_a_string = {"name": "Brackets", "redirectUris": ["https://n.example/cb"], "description": "[{" * 100}
    created = await call("POST", "/admin/clients", in_a_string)
    assert created.code == 201 and json_of(created)["description"] == "[{" * 100


async def test_a_limit_is_ascii_digits(call):
    for limit in ("\u00b2", "-1", "1.5", "x"):
        check_validation_error(await call("GET", "/admin/clients?limit=" + quote(limit)), ["query", "limit"],
                               "int_parsing")
    assert (await call("GET", "/admin/clients?limit=2")).code == 200


@pytest.mark.parametrize("listing", ["/admin/clients", "/admin/users", "/admin/installations",
                                     "/admin/grants?username=alice"])
async def test_a_limit_is_within_the_documented_range(call, listing):
    """1-200, as the document says: 0 was a page of one and 100000 one of 200, answered 200."""
    joined = "&" if "?" in listing else "?"
    check_validation_error(await call("GET", f"{listing}{joined}limit=0"), ["query", "limit"], "greater_than_equal")
    check_validation_error(await call("GET", f"{listing}{joined}limit=201"), ["query", "limit"], "less_than_equal")
    check_validation_error(await call("GET", f"{listing}{joined}limit=100000"), ["query", "limit"], "less_than_equal")
    for limit in (1, 200):
        assert (await call("GET", f"{listing}{joined}limit={limit}")).code == 200

async def test_the_index_tells_the_command_line_where_to_sign_in(call):
    response = await call("GET", "/admin", token=None)
    assert response.code == 200
    assert json_of(response) == {"issuer": "http://127.0.0.1:8080",
                                 "authorizationEndpoint": "http://127.0.0.1:8080/oauth/authorize",
                                 "tokenEndpoint": "http://127.0.0.1:8080/oauth/token", "cliClientId": "tokensvc-cli"}
    assert response.headers["Cache-Control"] == "no-store"


# -- clients -----------------------------------------------------------------------------------


async def test_clients_lifecycle(call, ctx):
    response = await call("POST", "/admin/clients", {
        "name": "Planner", "redirectUris": ["https://planner.example/cb"], "allowedScopes": ["read", "write"],
        "confidential": True, "description": "Plans nights"})
    assert response.code == 201
    created = json_of(response)
    client_id, secret = created["clientId"], created["clientSecret"]
    assert len(secret) >= 43 and created["confidential"] and created["allowedScopes"] == ["read", "write"]
    assert (await ctx.store.get_client(client_id)).secret_hash != secret  # kept as a hash only

    shown = json_of(await call("GET", f"/admin/clients/{client_id}"))
    check_schema(admin_schemas.AdminClientShownSchema(), shown)
    assert "clientSecret" not in shown and secret not in json.dumps(shown)

    patched = json_of(await call("PATCH", f"/admin/clients/{client_id}", {"name": "Planner 2",
                                                                           "allowedOrigins": ["https://p.example"]}))
    assert patched["name"] == "Planner 2" and patched["allowedOrigins"] == ["https://p.example"]
    assert patched["redirectUris"] == ["https://planner.example/cb"] and patched["clientSecret"] is None

    rotated = json_of(await call("POST", f"/admin/clients/{client_id}/secret"))
    assert rotated["clientSecret"] != secret and rotated["clientId"] == client_id

    removed = await call("DELETE", f"/admin/clients/{client_id}")
    assert removed.code == 200 and json_of(removed) == {"removed": client_id, "grantsRevoked": 0}
    assert (await call("GET", f"/admin/clients/{client_id}")).code == 404


async def test_put_creates_then_replaces_and_changes_nothing_when_the_same(call, store):
    body = {"name": "Provisioned", "redirectUris": ["https://prov.example/cb"], "confidential": True}
    first = await call("PUT", "/admin/clients/prov", body)
    assert first.code == 201 and json_of(first)["created"] is True and json_of(first)["clientSecret"]
    stored = await store.get_client("prov")
    again = await call("PUT", "/admin/clients/prov", body)
    assert again.code == 200 and json_of(again)["created"] is False
    assert json_of(again)["clientSecret"] is None  # the secret is kept, never shown again
    assert await store.get_client("prov") == stored
    public = json_of(await call("PUT", "/admin/clients/prov", {**body, "confidential": False}))
    assert public["confidential"] is False and (await store.get_client("prov")).secret_hash is None
    conflicting = await call("PUT", "/admin/clients/prov", {**body, "clientId": "other"})
    check_validation_error(conflicting, ["body", "clientId"], "value_error")


@pytest.mark.parametrize("method,path", [("POST", "/admin/clients"), ("PUT", "/admin/clients/twin")])
async def test_two_registrations_of_one_id_at_once_give_one_201_and_one_409(call, store, method, path):
    """Both requests check the id before either writes (each held until the other has
    checked): the store's claim lets one register, and the other gets the documented 409."""
    real_list = store.list_clients
    both = asyncio.Barrier(2)

    async def held(*args, **kwargs):  # check_new_client's name check, once the id was found free
        result = await real_list(*args, **kwargs)
        await asyncio.wait_for(both.wait(), 10)
        return result

    store.list_clients = held
    answers = await asyncio.gather(*(call(method, path, {"name": f"Twin {n}", "redirectUris": [SKY_REDIRECT],
                                                         "clientId": "twin", "confidential": True})
                                     for n in range(2)))
    store.list_clients = real_list
    assert sorted(answer.code for answer in answers) == [201, 409], [a.code for a in answers]
    won, lost = sorted(answers, key=lambda answer: answer.code)
    assert json_of(lost) == {"detail": "a client with id 'twin' already exists"}
    assert (await store.get_client("twin")).name == json_of(won)["name"]
    secret = json_of(won)["clientSecret"]
    assert (await store.get_client("twin")).secret_hash == hashing.digest(secret)  # the winner's secret stands


async def test_client_mistakes_are_422_404_and_409(call):
    check_validation_error(await call("POST", "/admin/clients", {"redirectUris": ["https://x/cb"]}),
                           ["body", "name"], "missing")
    bad = await call("POST", "/admin/clients", {"name": "X", "redirectUris": ["javascript:alert(1)"]})
    assert bad.code == 422 and "javascript" in json_of(bad)["detail"][0]["msg"]
    check_validation_error(await call("POST", "/admin/clients", raw="{not json"), ["body"], "json_invalid")
    check_validation_error(await call("POST", "/admin/clients", raw="[1, 2]"), ["body"], "model_type")
    check_validation_error(await call("POST", "/admin/clients", {"name": "X", "redirectUris": "https://x/cb"}),
                           ["body", "redirectUris"], "list_type")
    empty = await call("POST", "/admin/clients", {"name": "Nameless", "redirectUris": ["https://x/cb"], "clientId": ""})
    assert empty.code == 422 and "client id" in json_of(empty)["detail"][0]["msg"]  # absent: a random one; empty: no id
    taken = await call("POST", "/admin/clients", {"name": "Again", "redirectUris": ["https://x/cb"],
                                                  "clientId": "webapp"})
    assert taken.code == 409 and json_of(taken) == {"detail": "a client with id 'webapp' already exists"}
    named = await call("POST", "/admin/clients", {"name": "web APP", "redirectUris": ["https://x/cb"]})
    assert named.code == 409
    for method, path, body in (("GET", "/admin/clients/ghost", None), ("PATCH", "/admin/clients/ghost", {}),
                               ("DELETE", "/admin/clients/ghost", None),
                               ("POST", "/admin/clients/ghost/secret", None)):
        missing = await call(method, path, body)
        assert missing.code == 404 and json_of(missing) == {"detail": "no client with id 'ghost'"}
    public = await call("POST", "/admin/clients/skyplanner/secret")  # the client's state, not the call, forbids it
    assert public.code == 409 and json_of(public) == {"detail": "client 'skyplanner' is public: it has no secret "
                                                                "to rotate"}


# What the review found each surface let through: user info, a capital scheme, ports 0 and
# 99999, a non-ASCII host, characters outside RFC 3986, an underscore in a host, an IPv6
# literal over https, and an authority read as a path after a private-use scheme.
BROKEN_REDIRECT_URIS = ["https://user@app.example/cb", "HTTPS://app.example/cb", "https://app.example:0/cb",
                        "https://app.example:99999/cb", "https://äpp.example/cb", "https://app.example/<cb>",
                        "https://app.example/a|b", "https://app.example/{cb}", "https://app_1.example/cb",
                        "https://[::1]/cb", "myapp://user@host/cb", "com.example.App:/cb", "http://LOCALHOST/cb"]


@pytest.mark.parametrize("uri", BROKEN_REDIRECT_URIS)
async def test_a_redirect_uri_follows_one_rule_whatever_its_scheme(call, store, uri):
    """The rule the document states holds for https and private-use schemes too (https was
    accepted after its named checks, without the rule); the fault names its field."""
    created = await call("POST", "/admin/clients", {"name": "Rule", "redirectUris": ["https://ok.example/cb", uri]})
    assert check_validation_error(created, ["body", "redirectUris"], "value_error")["msg"].startswith(
        "not a valid redirect URI (")
    patched = await call("PATCH", "/admin/clients/skyplanner", {"redirectUris": [uri]})
    check_validation_error(patched, ["body", "redirectUris"], "value_error")
    assert all(client.name != "Rule" for client in await store.list_clients())
    assert (await store.get_client("skyplanner")).redirect_uris == [SKY_REDIRECT]


async def test_a_stored_client_that_breaks_a_newer_rule_keeps_working_and_can_be_edited(call, store):
    """A client stored by 0.9.0 with a redirect URI or a logo URL the rules now refuse: a PATCH
    checks only what it sets (``{}`` changes nothing and is 200), a PUT what it sends, and the
    fault names the field it is in."""
    from dataclasses import replace

    old = replace(await store.get_client("skyplanner"), redirect_uris=["https://user@old.example:99999/cb"],
                  logo_url="https://old.example/logo|1.png")
    await store.put_client(old)
    assert (await call("PATCH", "/admin/clients/skyplanner", {})).code == 200
    renamed = json_of(await call("PATCH", "/admin/clients/skyplanner", {"name": "SkyPlanner 2"}))
    assert renamed["name"] == "SkyPlanner 2" and renamed["redirectUris"] == old.redirect_uris
    assert renamed["logoUrl"] == old.logo_url
    logo = await call("PATCH", "/admin/clients/skyplanner", {"logoUrl": "https://new.example/logo|2.png"})
    check_validation_error(logo, ["body", "logoUrl"], "value_error")
    fixed = json_of(await call("PATCH", "/admin/clients/skyplanner", {"redirectUris": ["https://new.example/cb"]}))
    assert fixed["redirectUris"] == ["https://new.example/cb"] and fixed["logoUrl"] == old.logo_url
    resent = await call("PUT", "/admin/clients/skyplanner", {"name": "SkyPlanner", "logoUrl": old.logo_url,
                                                              "redirectUris": ["https://new.example/cb"]})
    check_validation_error(resent, ["body", "logoUrl"], "value_error")


async def test_a_fault_of_the_address_is_located_in_the_path(call, store):
    """A PUT's id is the address's: its fault is at [path, name], not in the body."""
    body = {"name": "Spaced", "redirectUris": ["https://s.example/cb"]}
    check_validation_error(await call("PUT", "/admin/clients/a%20b", body), ["path", "client_id"], "value_error")
    check_validation_error(await call("PUT", "/admin/installations/a%20b", {"name": "D", "kind": "telescope"}),
                           ["path", "installation_id"], "value_error")
    check_validation_error(await call("POST", "/admin/clients", {**body, "clientId": "a b"}), ["body", "clientId"],
                           "value_error")
    assert await store.get_client("a b") is None and await store.get_installation("a b") is None


@pytest.mark.parametrize("dots", [".", ".."])
async def test_a_dot_segment_is_no_identifier(call, store, dots):
    """``.`` and ``..`` are removed from a URL's path by every client: a user, client or
    installation named so could never be addressed."""
    check_validation_error(await call("POST", "/admin/users", {"username": dots, "password": STRONG}),
                           ["body", "username"], "value_error")
    check_validation_error(await call("POST", "/admin/clients", {"name": "Dots", "clientId": dots,
                                                                 "redirectUris": ["https://d.example/cb"]}),
                           ["body", "clientId"], "value_error")
    assert await store.get_user_by_username(dots) is None and await store.get_client(dots) is None
    for dotted in (dots + "a", "a" + dots, "..."):
        created = await call("PUT", f"/admin/installations/{quote(dotted)}", {"name": "D", "kind": "telescope"})
        assert created.code == 201, dotted


async def test_a_field_the_service_does_not_know_is_refused_by_name_and_changes_nothing(call, store):
    """A misspelt field is never ignored: ``allowedScope`` changing nothing, or a PUT whose
    ``clientSecret`` was dropped making the client public, would be a silent mistake."""
    before = await store.get_client("webapp")
    patched = await call("PATCH", "/admin/clients/webapp", {"allowedScope": ["read"], "name": "Renamed"})
    assert check_validation_error(patched, ["body", "allowedScope"], "extra_forbidden")["input"] == ["read"]
    assert await store.get_client("webapp") == before
    put = await call("PUT", "/admin/clients/planner", {"name": "Planner", "redirectUris": ["https://p.example/cb"],
                                                       "clientSecret": "chosen-by-hand"})
    check_validation_error(put, ["body", "clientSecret"], "extra_forbidden")
    assert await store.get_client("planner") is None
    for method, path, body, field in (
            ("POST", "/admin/clients", {"name": "X", "redirectUris": ["https://x.example/cb"], "firstparty": True},
             "firstparty"),
            ("POST", "/admin/users", {"username": "gina", "password": "violet-comet-harbor", "isAdmin": True},
             "isAdmin"),
            ("PATCH", "/admin/users/alice", {"admin": False, "disabled": True}, "disabled"),
            ("PUT", "/admin/users/alice/password", {"password": "violet-comet-harbor", "keep_grants": True},
             "keep_grants"),
            ("PUT", "/admin/installations/dome-9", {"name": "Dome", "kind": "observatory", "operator": ["alice"]},
             "operator"),
            ("POST", "/admin/tokens/revoke", {"token": "x", "token_type_hint": "access_token"}, "token_type_hint")):
        check_validation_error(await call(method, path, body), ["body", field], "extra_forbidden")
    assert await store.get_user_by_username("gina") is None and await store.get_installation("dome-9") is None


@pytest.mark.parametrize("origin", ["https://*.evil.example", "https://app.*", "*", "https://App.example",
                                    "https://app.example:443", "https://app.example/", "http://app.example",
                                    "https://user@app.example", "null"])
async def test_an_origin_a_browser_would_never_send_is_refused(call, store, origin):
    before = await store.get_client("skyplanner")
    response = await call("PATCH", "/admin/clients/skyplanner", {"allowedOrigins": ["https://ok.example", origin]})
    assert response.code == 422 and "not a valid web origin" in json_of(response)["detail"][0]["msg"]
    assert await store.get_client("skyplanner") == before
    created = await call("POST", "/admin/clients", {"name": "Wild", "redirectUris": ["https://w.example/cb"],
                                                    "allowedOrigins": [origin]})
    assert created.code == 422 and all(client.name != "Wild" for client in await store.list_clients())


async def test_removing_a_client_stops_its_tokens_at_once(call, ctx):
    tokens = await issue_tokens(ctx, "alice", "read", "skyplanner", SKY_REDIRECT)
    assert (await introspection.introspect(ctx, tokens.refresh_token))["active"]
    removed = json_of(await call("DELETE", "/admin/clients/skyplanner"))
    assert removed == {"removed": "skyplanner", "grantsRevoked": 1}
    for token in (tokens.access_token, tokens.refresh_token):
        assert await introspection.introspect(ctx, token) == {"active": False}


async def test_a_removal_cut_short_leaves_the_client_gone_and_its_retry_finishes_it(call, ctx, store, config,
                                                                                     monkeypatch):
    """The store fails after the removal was recorded (its grants not yet revoked): 503, and yet
    the client's tokens are dead everywhere they are checked (introspection, bearer, refresh,
    the token endpoints' client authentication), nobody can register the id meanwhile, and the
    same DELETE again finishes it."""
    from tokensvc.oauth import bearer, clientauth, grants
    from tokensvc.oauth.clientauth import ClientRequest
    from tokensvc.oauth.errors import InvalidClient, InvalidGrant
    from tokensvc.storage.base import StorageError

    sky = await store.get_client("skyplanner")
    issued = [await issue_tokens(ctx, name, "read", "skyplanner", SKY_REDIRECT) for name in ("alice", "root")]
    revoke_batch = store.revoke_client_grants

    async def failing(*args):
        raise StorageError("the store went away mid-removal")

    monkeypatch.setattr(store, "revoke_client_grants", failing)
    cut_short = await call("DELETE", "/admin/clients/skyplanner")
    assert cut_short.code == 503, cut_short.body
    assert (await store.get_removal("skyplanner")) is not None
    assert len(await store.list_client_grants("skyplanner")) == 2  # not one revoked yet
    for tokens in issued:
        for token in (tokens.access_token, tokens.refresh_token):
            assert await introspection.introspect(ctx, token) == {"active": False}
        assert await bearer.in_force(ctx, tokens.access_token) is None
    # A refresh is refused at the client's authentication; one that authenticated it just
    # before the removal began is refused too, since the family is read with its client: no
    # pair is minted, and the family's tokens stay dead.
    with pytest.raises(InvalidGrant):
        await grants.refresh(ctx, sky, issued[0].refresh_token)
    for token in (issued[0].access_token, issued[0].refresh_token):
        assert await introspection.introspect(ctx, token) == {"active": False}
    with pytest.raises(InvalidClient):
        await clientauth.authenticate_request(ctx, ClientRequest(None, "skyplanner", None, "127.0.0.1", "/oauth/token"))
    assert (await call("GET", "/admin/clients/skyplanner")).code == 404
    assert "skyplanner" not in [item["clientId"] for item in json_of(await call("GET", "/admin/clients"))["items"]]
    again = await call("PUT", "/admin/clients/skyplanner", {"name": "SkyPlanner", "redirectUris": [SKY_REDIRECT]})
    assert again.code == 409 and "is being removed" in json_of(again)["detail"]
    monkeypatch.setattr(store, "revoke_client_grants", revoke_batch)
    finished = await call("DELETE", "/admin/clients/skyplanner")
    assert json_of(finished) == {"removed": "skyplanner", "grantsRevoked": 2}
    assert await store.get_removal("skyplanner") is None and await store.list_client_grants("skyplanner") == []
    assert (await call("DELETE", "/admin/clients/skyplanner")).code == 404  # done: nothing left to remove
    registered = await call("PUT", "/admin/clients/skyplanner", {"name": "SkyPlanner", "redirectUris": [SKY_REDIRECT]})
    assert registered.code == 201  # registered anew, with none of the grants of before
    for tokens in issued:
        assert await introspection.introspect(ctx, tokens.access_token) == {"active": False}


async def test_the_next_start_up_finishes_a_removal_left_under_way(ctx, store, config, caplog):
    """A process that stopped mid-removal: any process's start-up finishes it before seeding, so
    a client the configuration names again comes back afresh, with no grant of before."""
    from tokensvc.bootstrap import prepare
    from tokensvc.oauth import removal

    await seed(store, config)
    tokens = await issue_tokens(ctx, "alice", "read", "skyplanner", SKY_REDIRECT)
    grant_id = (await store.list_client_grants("skyplanner"))[0].grant_id
    await store.begin_removal("skyplanner", ctx.clock(), "stopped")  # the process stopped right after this
    await delete_client_by_hand(store, "skyplanner")
    with caplog.at_level(logging.INFO):
        await prepare(store, config)
    assert "finished the removal of client skyplanner" in caplog.text
    assert await store.get_removal("skyplanner") is None
    assert (await store.get_grant(grant_id)).revoked_at is not None
    assert (await store.get_client("skyplanner")).name == "SkyPlanner"  # seeded again from the configuration
    assert await introspection.introspect(ctx, tokens.access_token) == {"active": False}
    assert await removal.finish_pending(store, ctx.clock) == []


async def test_listings_are_paged(call):
    for index in range(5):
        assert (await call("PUT", f"/admin/clients/paged-{index}", {
            "name": f"Paged {index}", "redirectUris": ["https://p.example/cb"]})).code == 201
    seen, cursor = [], None
    while True:
        page = json_of(await call("GET", "/admin/clients?limit=3" + (f"&cursor={quote(cursor)}" if cursor else "")))
        assert len(page["items"]) <= 3
        seen += [client["clientId"] for client in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert {f"paged-{index}" for index in range(5)} <= set(seen) and "webapp" in seen
    check_validation_error(await call("GET", "/admin/clients?limit=many"), ["query", "limit"], "int_parsing")


async def test_a_page_never_holds_more_than_the_bound(call, store):
    from tokensvc.records import User

    for index in range(205):
        await store.put_user(User(f"u_{index:04}", f"user{index:04}", "scrypt$x", False))
    page = json_of(await call("GET", "/admin/users"))
    assert len(page["items"]) == 200 and page["next"] == "user0197"  # sorted: alice, root, user0000...
    rest = json_of(await call("GET", f"/admin/users?cursor={page['next']}"))
    assert len(rest["items"]) == 207 - 200 and rest["next"] is None


# -- users ---------------------------------------------------------------------------------------


async def test_users_lifecycle(call, ctx, store):
    created = await call("POST", "/admin/users", {"username": "dave", "password": STRONG})
    assert created.code == 201 and json_of(created)["admin"] is False
    assert STRONG not in repr(await store.get_user_by_username("dave"))
    assert json_of(await call("GET", "/admin/users/dave"))["username"] == "dave"
    assert json_of(await call("PATCH", "/admin/users/dave", {"admin": True}))["admin"] is True

    dave = await store.get_user_by_username("dave")
    await sessions.start(ctx, dave, "Mozilla/5.0 Firefox/130.0", "127.0.0.9")
    changed = json_of(await call("PUT", "/admin/users/dave/password", {"password": "orbit-lantern-quiet"}))
    assert changed == {"username": "dave", "sessionsEnded": 1, "familiesRevoked": 0}
    weak = await call("PUT", "/admin/users/dave/password", {"password": "password1"})
    assert weak.code == 422 and "too easy to guess" in json_of(weak)["detail"][0]["msg"]

    assert (await call("POST", "/admin/users", {"username": "dave", "password": STRONG})).code == 409
    assert (await call("POST", "/admin/users", {"username": "eve", "password": "eve12345"})).code == 422
    check_validation_error(await call("POST", "/admin/users", {"username": "eve"}), ["body", "password"], "missing")
    for almost in ("perhaps", "true", 0, 1):  # 0 and 1 equal False and True in Python, never in JSON
        check_validation_error(await call("PATCH", "/admin/users/dave", {"admin": almost}), ["body", "admin"],
                               "bool_parsing")
    removed = await call("DELETE", "/admin/users/dave")
    assert removed.code == 200 and json_of(removed)["removed"] == "dave"
    for method, path, body in (("GET", "/admin/users/dave", None), ("PATCH", "/admin/users/dave", {"admin": False}),
                               ("PUT", "/admin/users/dave/password", {"password": STRONG}),
                               ("DELETE", "/admin/users/dave", None), ("GET", "/admin/users/dave/sessions", None)):
        missing = await call(method, path, body)
        assert missing.code == 404 and json_of(missing) == {"detail": "no user named 'dave'"}


async def test_usernames_are_one_per_key_and_found_in_any_case(call, ctx, store):
    for taken in ("ROOT", "Root", "ALICE"):
        answer = await call("POST", "/admin/users", {"username": taken, "password": STRONG})
        assert answer.code == 409, taken
    created = json_of(await call("POST", "/admin/users", {"username": "Gina.Ray", "password": STRONG}))
    assert created["username"] == "gina.ray"  # kept as its key
    assert json_of(await call("GET", "/admin/users/GINA.RAY"))["userId"] == created["userId"]
    assert [user.username for user in await store.list_users()].count("gina.ray") == 1
    assert (await sessions.sign_in(ctx, "Gina.Ray", STRONG, "127.0.0.1")).user_id == created["userId"]
    installation = await call("PUT", "/admin/installations/dome-7", {"name": "Dome", "kind": "observatory",
                                                                     "operators": ["GINA.ray"]})
    assert json_of(installation)["operators"] == ["gina.ray"]


async def test_sessions_listed_and_ended(call, ctx, store):
    alice = await store.get_user_by_username("alice")
    await sessions.start(ctx, alice, "Mozilla/5.0 (X11; Linux x86_64) Chrome/131.0 Safari/537.36", "127.0.0.5")
    await sessions.start(ctx, alice, "Mozilla/5.0 Firefox/130.0", "127.0.0.6")
    listed = json_of(await call("GET", "/admin/users/alice/sessions"))
    assert sorted(entry["address"] for entry in listed) == ["127.0.0.5", "127.0.0.6"]
    for entry in listed:
        check_schema(admin_schemas.admin_session, entry)
    assert json_of(await call("DELETE", f"/admin/users/alice/sessions/{listed[0]['id']}")) == {"ended": 1}
    assert (await call("DELETE", f"/admin/users/alice/sessions/{listed[0]['id']}")).code == 404
    assert json_of(await call("DELETE", "/admin/users/alice/sessions")) == {"ended": 1}
    assert json_of(await call("GET", "/admin/users/alice/sessions")) == []


async def test_a_session_id_follows_one_rule_in_both_apis(call):
    """A session's id is 24 hex digits at the admin API as at /v1/me/sessions/{session_id} (one
    schema): any other is 422 at the path, never a 404 at one and a 422 at the other."""
    from tokensvc.handlers import admin as admin_api
    from tokensvc.handlers import me as api

    assert admin_api.UserSessionHandler.path_schema is api.SessionHandler.path_schema
    for session_id in ("xyz", "0" * 23, "A" * 24):
        check_validation_error(await call("DELETE", f"/admin/users/alice/sessions/{session_id}"),
                               ["path", "session_id"], "value_error")
    missing = await call("DELETE", "/admin/users/alice/sessions/" + "0" * 24)
    assert missing.code == 404 and json_of(missing) == {"detail": f"no session {'0' * 24!r} of 'alice' is signed in"}


async def test_answers_name_a_user_as_stored_whatever_case_the_address_has(call, store, ctx, caplog):
    """``PUT /admin/users/ROOT/password`` is root's: its answer, its audit line and every other
    answer name ``root`` as stored, never the address's spelling."""
    with caplog.at_level(logging.INFO, logger="tokensvc.audit"):
        changed = json_of(await call("PUT", "/admin/users/ALICE/password", {"password": "orbit-lantern-quiet"}))
        assert changed["username"] == "alice"
        assert json_of(await call("PATCH", "/admin/users/Alice", {"admin": True}))["username"] == "alice"
        assert json_of(await call("GET", "/admin/users/ALICE"))["username"] == "alice"
        assert json_of(await call("DELETE", "/admin/users/ALICE/sessions")) == {"ended": 0}
        gone = json_of(await call("DELETE", "/admin/users/ALICE"))
    assert gone == {"removed": "alice", "familiesRevoked": 0}
    assert await store.get_user_by_username("alice") is None
    named = {record.audit["event"]: record.audit["username"] for record in caplog.records
             if "username" in getattr(record, "audit", {}) and record.audit["event"] != "admin_call"}
    assert named == {"user_password_set": "alice", "user_admin_set": "alice", "sessions_ended": "alice",
                     "user_removed": "alice"}


# -- installations, grants, tokens, purge --------------------------------------------------------


async def test_installations_lifecycle(call, store):
    body = {"name": "Dome 1", "kind": "observatory", "operators": ["alice"]}
    first = await call("PUT", "/admin/installations/dome-1", body)
    assert first.code == 201 and json_of(first) == {"installationId": "dome-1", "name": "Dome 1",
                                                    "kind": "observatory", "operators": ["alice"], "created": True}
    again = await call("PUT", "/admin/installations/dome-1", body)
    assert again.code == 200 and json_of(again)["created"] is False
    listed = json_of(await call("GET", "/admin/installations"))
    assert [item["installationId"] for item in listed["items"]] == ["backyard-scope", "dome-1"]
    unknown = await call("PUT", "/admin/installations/dome-2", {**body, "operators": ["ghost"]})
    assert unknown.code == 422 and "no user named 'ghost'" in json_of(unknown)["detail"][0]["msg"]
    check_validation_error(await call("PUT", "/admin/installations/dome-2", {**body, "kind": "submarine"}),
                           ["body", "kind"], "value_error")
    assert (await call("DELETE", "/admin/installations/dome-1")).code == 200
    assert (await call("GET", "/admin/installations/dome-1")).code == 404
    assert await store.get_installation("dome-2") is None  # nothing half-written


async def test_grants_listed_by_user_and_client_and_revoked_one_by_one(call, ctx):
    sky = await issue_tokens(ctx, "alice", "read", "skyplanner", SKY_REDIRECT)
    await issue_tokens(ctx, "alice", "read")
    by_user = json_of(await call("GET", "/admin/grants?username=alice"))["items"]
    assert sorted(grant["clientId"] for grant in by_user) == ["skyplanner", "webapp"]
    by_both = json_of(await call("GET", "/admin/grants?username=alice&clientId=skyplanner"))["items"]
    by_client = json_of(await call("GET", "/admin/grants?clientId=skyplanner"))["items"]
    assert by_both == by_client and len(by_client) == 1 and by_client[0]["subject"] == by_user[0]["subject"]
    check_validation_error(await call("GET", "/admin/grants"), ["query"], "value_error")
    assert (await call("GET", "/admin/grants?username=ghost")).code == 404
    grant_id = by_client[0]["grantId"]
    assert json_of(await call("DELETE", f"/admin/grants/{grant_id}")) == {"revoked": grant_id, "familiesRevoked": 1}
    assert await introspection.introspect(ctx, sky.access_token) == {"active": False}
    assert (await call("DELETE", f"/admin/grants/{grant_id}")).code == 404


async def test_tokens_revoked_by_value_and_introspected_as_the_public_endpoint_does(call, ctx):
    tokens = await issue_tokens(ctx, "alice", "read write")
    seen = json_of(await call("POST", "/admin/tokens/introspect", {"token": tokens.access_token}))
    assert seen == await introspection.introspect(ctx, tokens.access_token) and seen["username"] == "alice"
    assert json_of(await call("POST", "/admin/tokens/revoke", {"token": tokens.refresh_token})) == {"revoked": True}
    for token in (tokens.access_token, tokens.refresh_token):
        assert json_of(await call("POST", "/admin/tokens/introspect", {"token": token})) == {"active": False}
    assert json_of(await call("POST", "/admin/tokens/revoke", {"token": tokens.refresh_token})) == {"revoked": False}
    check_validation_error(await call("POST", "/admin/tokens/revoke", {}), ["body", "token"], "missing")


async def test_purge_on_memory_says_the_server_purges_itself(call):
    answer = json_of(await call("POST", "/admin/purge"))
    assert set(answer) == {"codes", "families", "sessions", "note"} and "purges" in answer["note"]


# -- bounds, limits, audit, metrics ----------------------------------------------------------------


async def test_bodies_are_bounded_like_the_public_apis(call):
    response = await call("POST", "/admin/clients", raw=json.dumps({"name": "x" * 2_000_000}))
    assert response.code == 413
    many = await call("POST", "/admin/clients", {"name": "Many", "redirectUris": ["https://m.example/cb"] * 101})
    check_validation_error(many, ["body", "redirectUris"], "too_long")


async def test_guessed_tokens_are_limited_per_address_and_never_lock_the_admin_out(http_client, base_url, config,
                                                                                  root_token, ctx, caplog):
    """Every local user shares the loopback address: a stranger's guesses there are counted,
    audited and answered 429 past the limit, and the administrator's own token, which checks
    out, still opens the API from that very address."""
    import secrets

    def admin_clients(token, address):
        return http_client.fetch(base_url + "/admin/clients", headers={"Authorization": f"Bearer {token}"},
                                 raise_error=False, network_interface=address)

    limit = config.limits.failed_client_auth_per_address
    codes = [(await admin_clients(secrets.token_urlsafe(32), "127.0.0.2")).code for _ in range(limit + 10)]
    assert codes[:limit] == [401] * limit and set(codes[limit:]) == {429}
    assert (await admin_clients(root_token, "127.0.0.2")).code == 200
    assert (await admin_clients("guess", "127.0.0.2")).code == 429  # and further guesses still are not
    # Another address is not locked out by the first one's guesses.
    assert (await admin_clients("guess", "127.0.0.3")).code == 401
    refused = [record.audit for record in caplog.records
               if getattr(record, "audit", {}).get("event") == "admin_call" and record.audit["outcome"] == "refused"]
    assert len(refused) == limit + 12
    assert 'tokensvc_rate_limited_total{kind="admin"} 11.0' in ctx.metrics.render().decode()


async def test_every_call_is_audited_with_the_user_and_the_client_never_the_token(call, caplog, root_token):
    with caplog.at_level(logging.INFO, logger="tokensvc.audit"):
        await call("GET", "/admin/clients")
        await call("GET", "/admin/clients", token="guess")
    calls = [record.audit for record in caplog.records if getattr(record, "audit", {}).get("event") == "admin_call"]
    assert calls[0] == {"event": "admin_call", "username": "root", "client_id": "webapp", "method": "GET",
                        "route": "/admin/clients", "outcome": "success"}
    assert calls[1]["outcome"] == "refused" and calls[1]["reason"] == "invalid_token"
    assert root_token not in caplog.text


async def test_admin_requests_are_counted_under_their_route_patterns(call, ctx):
    await call("GET", "/admin/clients/webapp")
    await call("GET", "/admin/users/nobody")
    text = ctx.metrics.render().decode()
    assert 'route="/admin/clients/{client_id}"' in text and 'route="/admin/users/{username}"' in text
    assert "/admin/clients/webapp" not in text and "nobody" not in text


async def test_the_admin_listener_serves_its_own_openapi_document(call):
    document = json_of(await call("GET", "/openapi.json", token=None))
    assert document["info"]["title"] == "tokensvc admin API"
    assert set(document["paths"]) == {route.path for route in ADMIN_ROUTES}
    assert document["paths"]["/admin/clients/{client_id}"]["put"]["tags"] == ["admin"]


@pytest.mark.gen_test
async def test_a_resource_server_is_registered_with_a_secret_and_nothing_of_the_flow(call):
    response = await call("POST", "/admin/clients", {"name": "Notes API", "kind": "resource-server",
                                                      "clientId": "notes-api"})
    assert response.code == 201, response.body
    created = check_schema(admin_schemas.AdminClientWithSecretSchema(), json_of(response))
    assert (created["kind"], created["redirectUris"], created["allowedScopes"], created["firstParty"],
            created["confidential"]) == ("resource-server", [], [], False, True)
    assert created["clientSecret"]
    refused = await call("PUT", "/admin/clients/notes-api", {"name": "Notes API", "kind": "resource-server",
                                                             "redirectUris": ["https://notes.example/cb"]})
    assert refused.code == 422 and "a resource server has no" in json_of(refused)["detail"][0]["msg"]
    refused = await call("POST", "/admin/clients", {"name": "Calendar"})  # a client needs a redirect URI
    assert refused.code == 422 and "redirect URI" in json_of(refused)["detail"][0]["msg"]
    # Made a client again, it is one as the operator describes it, from scratch.
    response = await call("PATCH", "/admin/clients/notes-api", {"kind": "client",
                                                                "redirectUris": ["https://notes.example/cb"]})
    assert response.code == 200 and json_of(response)["kind"] == "client"
    assert json_of(response)["allowedScopes"] == ["read"]  # a client given no scope: read
    # And a resource server again only once what a client has is emptied: the field at fault is
    # named, as `apply` names it in the file's words.
    check_validation_error(await call("PATCH", "/admin/clients/notes-api", {"kind": "resource-server"}),
                           ["body", "redirectUris"], "value_error")
    response = await call("PATCH", "/admin/clients/notes-api", {"kind": "resource-server", "redirectUris": []})
    assert response.code == 200, response.body
    assert (json_of(response)["kind"], json_of(response)["allowedScopes"]) == ("resource-server", [])


# -- secrets the operator holds, and the plan of a desired state ---------------------------------


async def test_a_client_secret_given_as_its_digest_makes_the_client_confidential(call, store):
    from tokensvc.oauth import hashing

    digest = hashing.digest("a-secret-the-operator-holds")
    created = await call("PUT", "/admin/clients/held", {"name": "Held", "redirectUris": ["https://held.example/cb"],
                                                         "clientSecretSha256": digest})
    assert created.code == 201 and json_of(created)["confidential"] and json_of(created)["clientSecret"] is None
    assert (await store.get_client("held")).secret_hash == digest
    # A public client given one becomes confidential; the digest is kept as given.
    other = hashing.digest("another-held-secret")
    patched = json_of(await call("PATCH", "/admin/clients/skyplanner", {"clientSecretSha256": other}))
    assert patched["confidential"] and (await store.get_client("skyplanner")).secret_hash == other
    check_validation_error(await call("PATCH", "/admin/clients/held", {"clientSecretSha256": "not-hex"}),
                           ["body", "clientSecretSha256"], "value_error")
    # The digest of an empty secret (an unset variable hashed) would let anyone prove the client.
    check_validation_error(await call("PATCH", "/admin/clients/held", {"clientSecretSha256": hashing.digest("")}),
                           ["body", "clientSecretSha256"], "value_error")
    check_validation_error(await call("PUT", "/admin/clients/held", {
        "name": "Held", "redirectUris": ["https://held.example/cb"], "clientSecretSha256": digest,
        "confidential": False}), ["body", "clientSecretSha256"], "value_error")
    assert (await store.get_client("held")).secret_hash == digest  # nothing half-written


async def test_a_user_given_a_password_hash_signs_in_with_its_password(call, ctx, store):
    from tokensvc.oauth import hashing

    password_hash = hashing.hash_password("violet-comet-harbor")
    assert (await call("POST", "/admin/users", {"username": "hashed", "passwordHash": password_hash})).code == 201
    assert await sessions.sign_in(ctx, "hashed", "violet-comet-harbor", "127.0.0.1")
    check_validation_error(await call("POST", "/admin/users", {"username": "both", "password": STRONG,
                                                              "passwordHash": password_hash}),
                           ["body", "passwordHash"], "value_error")
    check_validation_error(await call("PUT", "/admin/users/hashed/password", {"passwordHash": "md5$x"}),
                           ["body", "passwordHash"], "value_error")
    assert (await store.get_user_by_username("hashed")).password_hash == password_hash


async def test_a_plan_writes_nothing_whoever_it_names(call, store):
    """The caller's own user and client may be named, demoted, re-passworded and pruned around
    in a plan: it is only a plan (the fuzz run relies on it). What ends the caller's rights is
    its last step; demoting and re-passwording them at once (which no run could finish) is
    refused, located at the entry. The command line's client is the configuration's (it is
    seeded at every start while admin.cli_client is on): a change to it is refused, located at
    its entry, and prune leaves it alone."""
    from tokensvc.oauth import hashing

    before = (await store.list_clients(), await store.list_users(), await store.list_installations())
    both = await call("POST", "/admin/plan", {"users": [{"username": "root", "admin": False, "password": STRONG}]})
    check_validation_error(both, ["body", "users", 0, "admin"], "value_error")
    cli = await call("POST", "/admin/plan", {"clients": [
        {"clientId": "webapp"}, {"clientId": "tokensvc-cli", "clientSecretSha256": hashing.digest("taken-over")}]})
    assert "written at every start while admin.cli_client is on" in check_validation_error(
        cli, ["body", "clients", 1], "value_error")["msg"]
    planned = await call("POST", "/admin/plan", {
        "users": [{"username": "root", "admin": False}],
        "clients": [{"clientId": "webapp", "redirectUris": ["https://elsewhere.example/cb"], "confidential": False}],
        "installations": [], "prune": True})
    assert planned.code == 200, planned.body
    actions = {(step["kind"], step["id"]): step["action"] for step in json_of(planned)["steps"]}
    assert actions[("user", "root")] == actions[("client", "webapp")] == "update"
    assert ("client", "tokensvc-cli") not in actions and actions[("user", "alice")] == "remove"
    assert actions[("installation", "backyard-scope")] == "remove"
    last = json_of(planned)["steps"][-1]
    assert (last["kind"], last["id"], last["endsCaller"]) == ("user", "root", True)
    assert [step["id"] for step in json_of(planned)["steps"] if step["endsCaller"]] == ["root"]
    assert (await store.list_clients(), await store.list_users(), await store.list_installations()) == before
    assert json_of(await call("GET", "/admin/users/root"))["admin"]  # the token still works, root still admin


async def test_a_plan_takes_admin_from_the_callers_client_last(call, store):
    """The caller's client losing ``admin`` (or changing kind) ends the caller's token as a
    demotion does: its step is the plan's last; with the caller's demotion too, refused."""
    webapp = {"clientId": "webapp", "allowedScopes": ["read", "write"]}
    planned = await call("POST", "/admin/plan", {
        "clients": [webapp, {"clientId": "later", "name": "Later", "redirectUris": ["https://later.example/cb"]}]})
    assert planned.code == 200, planned.body
    steps = json_of(planned)["steps"]
    assert [(step["id"], step["action"], step["endsCaller"]) for step in steps] == [
        ("later", "create", False), ("webapp", "update", True)]
    kept = await call("POST", "/admin/plan", {"clients": [{"clientId": "webapp", "allowedScopes": ["read", "admin"]}]})
    assert [step["endsCaller"] for step in json_of(kept)["steps"]] == [False]  # admin stays
    kind = await call("POST", "/admin/plan", {"clients": [{"clientId": "webapp", "kind": "resource-server",
                                                           "redirectUris": [], "allowedScopes": [], "firstParty": False,
                                                           "clientSecretSha256": "ab" * 32}]})
    assert kind.code == 200, kind.body
    assert [step["endsCaller"] for step in json_of(kind)["steps"]] == [True]
    both = await call("POST", "/admin/plan", {"users": [{"username": "root", "admin": False}], "clients": [webapp]})
    check_validation_error(both, ["body", "clients", 0], "value_error")
    assert "each end the rights of the token" in json_of(both)["detail"][0]["msg"]
    assert "admin" in (await store.get_client("webapp")).allowed_scopes  # a plan writes nothing


async def test_a_plan_entry_holds_its_tables_fields_only(call):
    """Each entry is checked for its table's fields and their types, for a user the service
    has as for a new one; an entry that is no object is refused first, at its index."""
    check_validation_error(await call("POST", "/admin/plan", {"users": [{"username": "alice"}, "bob"]}),
                           ["body", "users", 1], "model_type")
    wrong = await call("POST", "/admin/plan", {
        "users": [{"username": "alice", "admn": True}, {"password": STRONG}],
        "clients": [{"clientId": "webapp", "name": 7, "firstPartyy": True}],
        "installations": [{"installationId": "backyard-scope", "kind": "telescope", "owner": "alice"}]})
    assert [(item["loc"], item["type"]) for item in json_of(wrong)["detail"]] == [
        (["body", "users", 0, "admn"], "extra_forbidden"), (["body", "users", 1, "username"], "missing"),
        (["body", "clients", 0, "name"], "string_type"), (["body", "clients", 0, "firstPartyy"], "extra_forbidden"),
        (["body", "installations", 0, "owner"], "extra_forbidden")]
    assert (await call("POST", "/admin/plan")).code == 200  # no body: the plan of nothing


async def test_the_served_document_names_the_configured_installation_kinds(http_client, config, store, ctx, call):
    import dataclasses

    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    served = json_of(await call("GET", "/openapi.json"))["components"]["schemas"]
    assert served["InstallationBody"]["properties"]["kind"]["enum"] == ["telescope", "observatory"]
    sock, port = bind_unused_port()
    antenna = dataclasses.replace(handed_over(config), installation_kinds=["antenna"])
    server = HTTPServer(make_admin_app(antenna, store, ctx))
    server.add_sockets([sock])
    try:
        other = json_of(await http_client.fetch(f"http://127.0.0.1:{port}/openapi.json"))["components"]["schemas"]
    finally:
        server.stop()
    assert [other[name]["properties"]["kind"]["enum"] for name in ("InstallationBody", "PlanInstallation")] == [
        ["antenna"], ["antenna"]]


async def test_the_plan_of_a_desired_state_writes_nothing_and_names_every_problem(call, store):
    before = (await store.list_clients(), await store.list_users(), await store.list_installations())
    state = {"users": [{"username": "dora", "password": STRONG}],
             "clients": [{"clientId": "skyplanner", "allowedScopes": ["read"]},
                         {"clientId": "webapp", "allowedScopes": ["read", "write", "connected-apps:write", "admin"]}],
             "installations": [{"installationId": "dome", "name": "Dome", "kind": "observatory",
                                "operators": ["dora"]}]}
    planned = await call("POST", "/admin/plan", state)
    assert planned.code == 200, planned.body
    check_schema(admin_schemas.PlanSchema(), json_of(planned))
    assert not any(step["endsCaller"] for step in json_of(planned)["steps"])  # the caller is not named
    assert [{key: value for key, value in step.items() if key != "endsCaller"}
            for step in json_of(planned)["steps"]] == [
        {"kind": "user", "id": "dora", "action": "create", "changes": [{"field": "password", "secret": True}]},
        {"kind": "client", "id": "skyplanner", "action": "update",
         "changes": [{"field": "allowedScopes", "from": ["read", "observations:write"], "to": ["read"]}]},
        {"kind": "client", "id": "webapp", "action": "unchanged", "changes": []},
        {"kind": "installation", "id": "dome", "action": "create", "changes": [
            {"field": "name", "from": None, "to": "Dome"}, {"field": "kind", "from": None, "to": "observatory"},
            {"field": "operators", "from": None, "to": ["dora"]}]}]
    wrong = await call("POST", "/admin/plan", {
        "users": [{"username": "eve", "password": "eve"}, {"username": "alice", "admin": "yes"}],
        "clients": [{"clientId": "new-app", "redirectUris": ["https://new.example/cb"]},
                    {"clientId": "skyplanner", "redirectUris": ["javascript:alert(1)"]}],
        "installations": [{"installationId": "dome", "name": "Dome", "kind": "submarine"},
                          {"installationId": "dome-2", "name": "Dome 2", "kind": "telescope", "operators": ["ghost"]}],
        "prune": True})
    assert wrong.code == 422
    assert [(item["loc"], item["type"]) for item in json_of(wrong)["detail"]] == [
        (["body", "users", 0, "password"], "value_error"), (["body", "users", 1, "admin"], "bool_parsing"),
        (["body", "clients", 0, "name"], "missing"), (["body", "clients", 1, "redirectUris"], "value_error"),
        (["body", "installations", 0, "kind"], "value_error"),
        (["body", "installations", 1, "operators"], "value_error"),
        # Pruning would remove the client and the user of the token asking.
        (["body", "clients"], "value_error"), (["body", "users"], "value_error")]
    assert "'webapp', the client of the token" in json_of(wrong)["detail"][-2]["msg"]
    assert "'root', who runs this" in json_of(wrong)["detail"][-1]["msg"]
    assert (await store.list_clients(), await store.list_users(), await store.list_installations()) == before


# -- a client secret rotated with overlap ---------------------------------------------------------


async def test_a_rotation_that_keeps_the_previous_secret_lets_both_work_until_it_expires(call, ctx, store, clock,
                                                                                          caplog):
    """POST /admin/clients/{id}/secret with keepPreviousSeconds: the old secret proves the client
    beside the new one until then (shown as a time, never a hash), its use and its expiry
    audited once; another rotation, or any other change of the secret, ends it at once."""
    from helpers import WEBAPP_SECRET

    from tokensvc.oauth import clientauth
    from tokensvc.oauth.clientauth import ClientRequest
    from tokensvc.oauth.errors import InvalidClient

    def proves(secret):
        return clientauth.authenticate_request(ctx, ClientRequest(None, "webapp", secret, "127.0.0.1", "/oauth/token"))

    rotated = await call("POST", "/admin/clients/webapp/secret", {"keepPreviousSeconds": 600})
    assert rotated.code == 200, rotated.body
    answer = json_of(rotated)
    check_schema(admin_schemas.SecretRotatedSchema(), answer)
    new = answer["clientSecret"]
    assert answer["previousSecretExpiresAt"] == (clock.now + timedelta(seconds=600)).isoformat()
    shown = json_of(await call("GET", "/admin/clients/webapp"))
    check_schema(admin_schemas.AdminClientShownSchema(), shown)
    assert shown["previousSecretExpiresAt"] == answer["previousSecretExpiresAt"]
    assert shown["previousSecretLastUsedAt"] is None
    previous = await store.get_previous_secret("webapp")
    assert previous.secret_hash not in rotated.body.decode() + json.dumps(shown)
    with caplog.at_level(logging.INFO, logger="tokensvc.audit"):
        assert (await proves(new)).client_id == "webapp"
        assert (await proves(WEBAPP_SECRET)).client_id == "webapp"  # the old one, still in force
        clock.advance(30)
        await proves(WEBAPP_SECRET)  # within the minute: recorded once
        with pytest.raises(InvalidClient):
            await proves("neither-of-them")
        clock.advance(570)  # its ten minutes are up
        with pytest.raises(InvalidClient):
            await proves(WEBAPP_SECRET)
        assert (await proves(new)).client_id == "webapp"
        assert json_of(await call("GET", "/admin/clients/webapp"))["previousSecretExpiresAt"] is None
        assert await clientauth.expire_previous_secrets(store, clock.now) == 1
        assert await clientauth.expire_previous_secrets(store, clock.now) == 0
    events = [record.audit for record in caplog.records if record.name == "tokensvc.audit"]
    used = [event for event in events if event["event"] == "client_previous_secret_used"]
    expired = [event for event in events if event["event"] == "client_previous_secret_expired"]
    assert [(event["client_id"], event["outcome"]) for event in used] == [("webapp", "still_in_use")]
    assert [(event["client_id"], event["last_used_at"]) for event in expired] == [
        ("webapp", (clock.now - timedelta(seconds=600)).isoformat())]
    assert new not in caplog.text and WEBAPP_SECRET not in caplog.text and previous.secret_hash not in caplog.text

    # Kept again, then rotated without keeping: the old one stops at once.
    second = json_of(await call("POST", "/admin/clients/webapp/secret", {"keepPreviousSeconds": 600}))
    assert (await proves(new)).client_id == "webapp"
    third = json_of(await call("POST", "/admin/clients/webapp/secret"))
    assert third["previousSecretExpiresAt"] is None and await store.get_previous_secret("webapp") is None
    for gone in (new, second["clientSecret"]):
        with pytest.raises(InvalidClient):
            await proves(gone)
    # Any other change of the secret ends the overlap: it holds only beside the secret that replaced it.
    fourth = json_of(await call("POST", "/admin/clients/webapp/secret", {"keepPreviousSeconds": 600}))
    from tokensvc.oauth import hashing

    patched = await call("PATCH", "/admin/clients/webapp", {"clientSecretSha256": hashing.digest("held-by-ops")})
    assert patched.code == 200
    for gone in (third["clientSecret"], fourth["clientSecret"]):
        with pytest.raises(InvalidClient):
            await proves(gone)
    assert json_of(await call("GET", "/admin/clients/webapp"))["previousSecretExpiresAt"] is None


async def test_the_previous_secret_is_kept_for_a_bounded_time_of_a_confidential_client(call, store):
    before = await store.get_client("webapp")
    for wrong, kind in ((-1, "value_error"), (30 * 86400 + 1, "value_error"), ("3600", "value_error"),
                        (1.5, "value_error"), (None, "value_error")):
        check_validation_error(await call("POST", "/admin/clients/webapp/secret", {"keepPreviousSeconds": wrong}),
                               ["body", "keepPreviousSeconds"], kind)
    check_validation_error(await call("POST", "/admin/clients/webapp/secret", {"keepPrevious": 60}),
                           ["body", "keepPrevious"], "extra_forbidden")
    assert await store.get_client("webapp") == before and await store.get_previous_secret("webapp") is None
    public = await call("POST", "/admin/clients/skyplanner/secret", {"keepPreviousSeconds": 60})
    assert public.code == 409 and await store.get_previous_secret("skyplanner") is None
    assert (await call("POST", "/admin/clients/webapp/secret", raw="null")).code == 422  # a body, not an object
    assert await store.get_client("webapp") == before
    assert (await call("POST", "/admin/clients/webapp/secret", {"keepPreviousSeconds": 30 * 86400})).code == 200
    assert (await call("POST", "/admin/clients/webapp/secret", {"keepPreviousSeconds": 60.0})).code == 200  # JSON's 60
    assert (await store.get_previous_secret("webapp")).expires_at - (await store.get_previous_secret(
        "webapp")).rotated_at == timedelta(seconds=60)


LONE_SURROGATES = {
    "in-a-value": '{"name": "Gen \\ud800"}',
    "in-a-key": '{"name": "Gen", "\\udc00": 1}',
    "deep-in-a-list": '{"name": "Gen", "redirectUris": ["https://g.example/cb", {"x": ["\\udfff"]}]}',
    "as-raw-bytes": b'{"name": "Gen \xed\xa0\x80"}',  # what a surrogatepass decoding reads as one
}


async def stored_everything(store):
    return (await store.list_clients(), await store.list_users(), await store.list_installations())


@pytest.mark.parametrize("path,method", operations_with_a_body())
@pytest.mark.parametrize("where", sorted(LONE_SURROGATES))
async def test_a_lone_surrogate_in_a_body_is_422_and_nothing_is_stored(call, store, path, method, where):
    """A string holding a lone surrogate, key or value at any depth, is refused as invalid JSON
    before any schema sees it: it was stored on the memory backend (and broke every answer
    naming it), a 500 on MongoDB, and a 422 echoing it sent no answer at all."""
    before = await stored_everything(store)
    response = await asyncio.wait_for(call(method, example_path(path), raw=LONE_SURROGATES[where]), 10)
    fault = check_validation_error(response, ["body"], "json_invalid")
    assert "lone surrogate" in fault["msg"] and fault["input"] is None
    assert await stored_everything(store) == before


@pytest.mark.parametrize("method,path,body", [
    ("PATCH", "/admin/clients/webapp", {"name": "Gen \ud800"}),
    ("POST", "/admin/clients", {"name": "Gen", "redirectUris": ["https://g.example/cb"], "description": "\ud800"}),
    ("PUT", "/admin/installations/x", {"name": "X \ud800", "kind": "observatory", "operators": ["alice"]}),
    ("POST", "/admin/clients/webapp/secret", {"x": "\ud800"}),  # a 422 echoing it sent no answer
    ("POST", "/admin/users", {"username": "gen", "password": STRONG, "unknown": "\ud800"}),
])
async def test_the_reported_surrogate_writes_are_422_and_every_listing_still_answers(call, store, method, path, body):
    """The writes found to store a lone surrogate, or to send no answer: each a 422 now, and the
    listings and the record answer 200 after it."""
    before = await stored_everything(store)
    response = await asyncio.wait_for(call(method, path, raw=json.dumps(body)), 10)
    check_validation_error(response, ["body"], "json_invalid")
    assert await stored_everything(store) == before
    for listing in ("/admin/clients", "/admin/clients/webapp", "/admin/installations", "/admin/users"):
        assert (await call("GET", listing)).code == 200, listing


async def test_a_surrogate_pair_is_read_as_its_character(call, store):
    """An escaped pair is one character (U+1F52D here), no lone surrogate: taken as ever."""
    response = await call("PATCH", "/admin/clients/webapp", raw='{"name": "Scope \\ud83d\\udd2d"}')
    assert response.code == 200, response.body
    assert (await store.get_client("webapp")).name == "Scope \U0001f52d"
