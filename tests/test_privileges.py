"""Privileges are decided when a token is used, not when it was issued: ``admin`` only while
the user is an administrator, every scope only while its client still lists it, nothing once
the client is gone; at refresh, at introspection, at the admin API and the ``/v1`` API, in every
process at once; and a user made an administrator again finds no chain of their earlier time
in force."""

from __future__ import annotations

import json

import pytest
from helpers import (
    CHALLENGE,
    PASSWORD_HASHES,
    SKY_REDIRECT,
    VERIFIER,
    WEBAPP_REDIRECT,
    delete_client_by_hand,
    hand_over,
    handed_over,
    issue_tokens,
    make_config,
)

from tokensvc.admin import actions as admin
from tokensvc.admin.operator import Operator
from tokensvc.app import make_admin_app
from tokensvc.bootstrap import make_context, seed
from tokensvc.oauth import authorization, grants, hashing, introspection, revocation
from tokensvc.oauth import principal as principals
from tokensvc.oauth.errors import InsufficientScope, InvalidGrant, InvalidScope
from tokensvc.records import Subject

pytestmark = pytest.mark.gen_test

CLI_REDIRECT = "http://127.0.0.1:53817/callback"  # tokensvc login's loopback port


@pytest.fixture
def config():
    config = make_config()
    bob = {"username": "bob", "password_hash": PASSWORD_HASHES["root"], "admin": True}
    return make_config(users=[*({"username": u.username, "password_hash": u.password_hash, "admin": u.admin}
                                for u in config.users), bob])


@pytest.fixture(autouse=True)
def seeded(io_loop, store, config):
    """The store as a start with ``config`` left it, its entries then handed to the admin API
    (a start whose file names them no more), which these tests change."""
    io_loop.run_sync(lambda: seed(store, config))
    io_loop.run_sync(lambda: hand_over(store, config))


@pytest.fixture
def app(store, config, ctx):
    return make_admin_app(handed_over(config), store, ctx)


@pytest.fixture
def operator(ctx, config):
    return Operator(ctx, handed_over(config))


async def refresh(ctx, tokens, client_id="webapp", scope=None):
    return await grants.refresh(ctx, await ctx.store.get_client(client_id), tokens.refresh_token, scope)


async def scope_of(ctx, token) -> str | None:
    return (await introspection.introspect(ctx, token)).get("scope")


async def admin_call(http_client, base_url, token):
    return await http_client.fetch(base_url + "/admin/users", headers={"Authorization": f"Bearer {token}"},
                                   raise_error=False)


async def test_a_demoted_admins_tokens_lose_admin_at_once_everywhere(ctx, operator, http_client, base_url):
    web = await issue_tokens(ctx, "bob", "read admin")
    cli = await issue_tokens(ctx, "bob", "admin", "tokensvc-cli", CLI_REDIRECT)
    assert (await admin_call(http_client, base_url, cli.access_token)).code == 200
    assert await scope_of(ctx, web.access_token) == "read admin"

    await operator.patch_user("bob", {"admin": False})
    # Introspection reports what is in force; a token with nothing left in force is inactive.
    assert await scope_of(ctx, web.access_token) == "read" and await scope_of(ctx, web.refresh_token) == "read"
    for token in (cli.access_token, cli.refresh_token):
        assert await introspection.introspect(ctx, token) == {"active": False}
    # The admin API: the CLI's token authenticates nobody any more, the web app's is no admin's.
    assert (await admin_call(http_client, base_url, cli.access_token)).code == 401
    refused = await admin_call(http_client, base_url, web.access_token)
    assert refused.code == 403 and json.loads(refused.body)["error"] == "access_denied"
    # The /v1 API acts with what is in force.
    principal = await principals.from_bearer(ctx, web.access_token)
    assert principal.scopes == ["read"] and (await principals.describe(ctx, principal))["scopes"] == ["read"]
    assert await principals.from_bearer(ctx, cli.access_token) is None
    # Refresh: the new pair holds what is in force, and asking for admin is refused.
    with pytest.raises(InvalidScope, match="No longer in force: admin"):
        await refresh(ctx, web, scope="read admin")
    renewed = await refresh(ctx, web)
    assert renewed.scope == "read"
    with pytest.raises(InvalidGrant, match="Nothing this authorization granted is in force"):
        await refresh(ctx, cli, "tokensvc-cli")


async def test_making_an_admin_again_revives_no_chain_of_before(ctx, operator, store):
    web = await issue_tokens(ctx, "bob", "read admin")
    cli = await issue_tokens(ctx, "bob", "admin", "tokensvc-cli", CLI_REDIRECT)
    partner = await issue_tokens(ctx, "bob", "read", "skyplanner", "http://127.0.0.1:9000/callback")
    await operator.patch_user("bob", {"admin": False})
    renewed = await refresh(ctx, web)  # a chain that refreshed while demoted
    await operator.patch_user("bob", {"admin": True})
    for token in (web.access_token, web.refresh_token, renewed.access_token, renewed.refresh_token,
                  cli.access_token, cli.refresh_token):
        assert await introspection.introspect(ctx, token) == {"active": False}
    with pytest.raises(InvalidGrant):
        await refresh(ctx, cli, "tokensvc-cli")
    # A grant that could never carry admin (a client that may not ask for it) is left alone.
    assert await scope_of(ctx, partner.access_token) == "read"
    # Signing in again as the administrator works as ever.
    again = await issue_tokens(ctx, "bob", "admin", "tokensvc-cli", CLI_REDIRECT)
    assert await scope_of(ctx, again.access_token) == "admin"


async def test_a_code_issued_to_an_admin_is_exchanged_for_what_is_in_force(ctx, operator):
    request = await authorization.validate(ctx, {name: [value] for name, value in {
        "response_type": "code", "client_id": "webapp", "redirect_uri": WEBAPP_REDIRECT, "scope": "read admin",
        "code_challenge": CHALLENGE, "code_challenge_method": "S256"}.items()})
    bob = await ctx.store.get_user_by_username("bob")
    subject, _ = await authorization.resolve_subject(ctx, request, bob)
    code = (await authorization.issue_code(ctx, request, subject)).split("code=")[1].split("&")[0]
    await operator.patch_user("bob", {"admin": False})  # between the consent and the exchange
    tokens = await grants.exchange_code(ctx, await ctx.store.get_client("webapp"), code, WEBAPP_REDIRECT, VERIFIER)
    assert tokens.scope == "read" and await scope_of(ctx, tokens.access_token) == "read"


async def test_a_scope_taken_from_the_client_is_out_of_force_at_once(ctx, operator):
    tokens = await issue_tokens(ctx, "alice", "read write connected-apps:write")
    principal = await principals.from_bearer(ctx, tokens.access_token)
    principal.require("connected-apps:write")
    await operator.patch_client("webapp", {"allowedScopes": ["read", "admin"]})
    assert await scope_of(ctx, tokens.access_token) == "read"
    narrowed = await principals.from_bearer(ctx, tokens.access_token)
    assert narrowed.scopes == ["read"]
    with pytest.raises(InsufficientScope):  # DELETE /v1/me/connected-apps/{client_id} is refused
        narrowed.require("connected-apps:write")
    renewed = await refresh(ctx, tokens)
    assert renewed.scope == "read"  # the new pair holds only what was in force: for good
    await operator.patch_client("webapp", {"allowedScopes": ["read", "write", "connected-apps:write", "admin"]})
    assert await scope_of(ctx, renewed.access_token) == "read"
    await operator.patch_client("webapp", {"allowedScopes": ["admin"]})
    assert await introspection.introspect(ctx, renewed.access_token) == {"active": False}


async def issue_code(ctx, username, scope, client_id="webapp", redirect_uri=WEBAPP_REDIRECT) -> str:
    request = await authorization.validate(ctx, {name: [value] for name, value in {
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "scope": scope,
        "code_challenge": CHALLENGE, "code_challenge_method": "S256"}.items()})
    subject, _ = await authorization.resolve_subject(ctx, request, await ctx.store.get_user_by_username(username))
    return (await authorization.issue_code(ctx, request, subject)).split("code=")[1].split("&")[0]


async def test_widening_a_narrowed_client_again_gives_the_tokens_of_before_nothing_back(ctx, operator, store):
    """A narrowing is withdrawn from what the client's grants, codes and tokens hold: widened
    again, the tokens issued before (never refreshed since), a code on its way and the grant's
    listing keep what the narrowing left them; a token issued after the widening gets all."""
    from tokensvc.oauth import connected_apps

    tokens = await issue_tokens(ctx, "alice", "read write connected-apps:write")
    code = await issue_code(ctx, "alice", "read write")
    sky = await issue_tokens(ctx, "alice", "read observations:write", "skyplanner", SKY_REDIRECT)
    await operator.patch_client("webapp", {"allowedScopes": ["read", "admin"]})
    await operator.patch_client("skyplanner", {"allowedScopes": ["profile"]})  # nothing sky's tokens hold
    await operator.patch_client("webapp", {"allowedScopes": ["read", "write", "connected-apps:write", "admin"]})
    await operator.patch_client("skyplanner", {"allowedScopes": ["read", "observations:write"]})
    for token in (tokens.access_token, tokens.refresh_token):
        assert await scope_of(ctx, token) == "read"
    for token in (sky.access_token, sky.refresh_token):
        assert await introspection.introspect(ctx, token) == {"active": False}
    with pytest.raises(InvalidGrant, match="Nothing this authorization granted is in force"):
        await refresh(ctx, sky, "skyplanner")
    exchanged = await grants.exchange_code(ctx, await store.get_client("webapp"), code, WEBAPP_REDIRECT, VERIFIER)
    assert exchanged.scope == "read"
    alice = await store.get_user_by_username("alice")
    [app] = [app for app in await connected_apps.list_connected(ctx, Subject(user_id=alice.user_id))
             if app.client_id == "webapp"]
    assert app.scopes == ["read"]
    again = await issue_tokens(ctx, "alice", "read write")  # consented after the widening: all of it
    assert await scope_of(ctx, again.access_token) == "read write"


async def test_a_narrowing_by_the_configuration_is_withdrawn_too(ctx, store, config):
    """The file narrows a client at the next start-up (seeding): the same withdrawal, so the
    file widening it again later gives nothing back either."""
    tokens = await issue_tokens(ctx, "alice", "read write")
    clients = [{"client_id": c.client_id, "name": c.name, "redirect_uris": c.redirect_uris,
                "allowed_scopes": c.allowed_scopes, "first_party": c.first_party, "client_secret": c.client_secret}
               for c in config.clients]
    users = [{"username": u.username, "password_hash": u.password_hash, "admin": u.admin} for u in config.users]
    narrowed = [{**c, "allowed_scopes": ["read"]} if c["client_id"] == "webapp" else c for c in clients]
    await seed(store, make_config(clients=narrowed, users=users))
    assert (await store.get_client("webapp")).narrowed_at is not None
    await seed(store, config)
    assert await scope_of(ctx, tokens.refresh_token) == "read"


@pytest.mark.parametrize("path", ["admin-refresh", "admin-access", "client-refresh", "client-access",
                                  "revoke-bearer", "revoke-token"])
async def test_a_token_with_no_scope_in_force_is_revoked_all_the_same(ctx, operator, store, path):
    """Every revocation finds a token by its record (live: not revoked, not expired), whatever
    is in force now: a token whose every scope its client no longer lists is given up by every
    path (before, each answered that it was not in force and revoked nothing)."""
    tokens = await issue_tokens(ctx, "alice", "read observations:write", "skyplanner", SKY_REDIRECT)
    family_id = (await store.find_access(hashing.digest(tokens.access_token)))[0].family_id
    await operator.patch_client("skyplanner", {"allowedScopes": ["profile"]})
    token = tokens.access_token if path.endswith("access") or path == "revoke-bearer" else tokens.refresh_token
    if path.startswith("admin"):
        assert await admin.revoke_token_value(ctx, token) is True
    elif path.startswith("client"):
        assert await revocation.revoke_token(ctx, token, await store.get_client("skyplanner")) is True
    else:
        presented = [token, None] if path == "revoke-bearer" else [None, token]
        await revocation.revoke_grants_of(ctx, presented)
    family, grant = await store.get_family(family_id)
    if path.startswith("revoke"):
        assert grant.revoked_at is not None and family.revoked_at is not None
    elif path.endswith("access"):
        assert family.access_revoked_at is not None and family.revoked_at is None
    else:
        assert family.revoked_at is not None


async def test_a_token_of_a_client_that_is_gone_does_nothing(ctx, store):
    """However the client went (a removal whose bulk revocation had not run yet, a store
    written by another release), its tokens do nothing at once."""
    tokens = await issue_tokens(ctx, "alice", "read")
    await delete_client_by_hand(store, "webapp")
    for token in (tokens.access_token, tokens.refresh_token):
        assert await introspection.introspect(ctx, token) == {"active": False}
    assert await principals.from_bearer(ctx, tokens.access_token) is None


async def test_a_promotion_by_the_configuration_revives_no_chain_either(ctx, operator, store, config):
    """The file says bob is an administrator: after a demotion through the admin API, the next
    start-up makes him one again, and ends his chains of before as the admin API would."""
    web = await issue_tokens(ctx, "bob", "read admin")
    await operator.patch_user("bob", {"admin": False})
    await seed(store, config)
    assert (await store.get_user_by_username("bob")).admin
    assert await introspection.introspect(ctx, web.refresh_token) == {"active": False}
    await seed(store, config)  # already an administrator: nothing more is revoked
    again = await issue_tokens(ctx, "bob", "read admin")
    await seed(store, config)
    assert await scope_of(ctx, again.access_token) == "read admin"


# -- across processes: two service contexts over one MongoDB -------------------------------------


@pytest.fixture
def two_processes(io_loop, config):
    from backends import open_store

    from tokensvc.storage.mongo import MongoStore

    store, cleanup = open_store("mongodb", io_loop)
    io_loop.run_sync(lambda: seed(store, config))
    io_loop.run_sync(lambda: hand_over(store, config))
    other = MongoStore(store.client, store.db.name, change_streams=False)
    yield make_context(config, store), make_context(config, other)
    cleanup()


async def test_a_demotion_in_one_process_holds_in_every_other_at_once(two_processes, config):
    first, second = two_processes
    web = await issue_tokens(first, "bob", "read admin")
    assert await scope_of(second, web.access_token) == "read admin"
    await Operator(first, handed_over(config)).patch_user("bob", {"admin": False})
    assert await scope_of(second, web.access_token) == "read"
    with pytest.raises(InvalidScope):
        await refresh(second, web, scope="admin")
    await Operator(second, handed_over(config)).patch_client("webapp", {"allowedScopes": ["write"]})
    assert await introspection.introspect(first, web.access_token) == {"active": False}



async def test_the_connected_apps_show_what_is_in_force(ctx, operator):
    from tokensvc.oauth import connected_apps

    bob = await ctx.store.get_user_by_username("bob")
    await issue_tokens(ctx, "bob", "read write admin")
    await operator.patch_client("webapp", {"allowedScopes": ["read", "admin"]})
    await operator.patch_user("bob", {"admin": False})
    [app] = await connected_apps.list_connected(ctx, Subject(user_id=bob.user_id))
    assert app.client_id == "webapp" and app.scopes == ["read"]
