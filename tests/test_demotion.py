"""A user's privileges narrowed (no longer an administrator, or removed) reach resource servers
within the revocation feed's latency, whichever path made the change: the admin API, the command
line, ``apply``, the configuration at start-up; in this process or in another sharing the store.
The change is written with the user's mark (``narrowed_at``), which every process's relay hears,
and the feed names the user (``sub``, as introspection does); a resource server's verifier drops
what it cached for them, and its connections of theirs ask again what is left."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import timedelta

import pytest
from backends import open_store
from helpers import DEADLINE, PASSWORD_HASHES, eventually, hand_over, handed_over, issue_tokens, make_config
from test_cli import CONFIG as CLI_CONFIG
from test_feed import connect, next_message
from test_processes import other_process
from test_resource import started, verifier_for
from tornado import gen
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from tokensvc.admin import actions as admin
from tokensvc.admin.operator import Operator
from tokensvc.app import make_admin_app
from tokensvc.bootstrap import make_context, seed
from tokensvc.cli import main as cli
from tokensvc.oauth import events, introspection
from tokensvc.resource import InsufficientScope
from tokensvc.storage.mongo import MongoStore

pytestmark = [pytest.mark.gen_test(timeout=90), pytest.mark.mongodb]


def users(bob_admin: bool) -> list[dict]:
    return [{"username": "alice", "password_hash": PASSWORD_HASHES["alice"]},
            {"username": "root", "password_hash": PASSWORD_HASHES["root"], "admin": True},
            {"username": "bob", "password_hash": PASSWORD_HASHES["root"], "admin": bob_admin}]


@pytest.fixture
def config():
    return make_config(users=users(True))


@pytest.fixture
def store(io_loop):
    """The serving process's store: the MongoDB stand-in (no change streams: its relay polls)."""
    opened, cleanup = open_store("mongodb", io_loop)
    yield opened
    cleanup()


@pytest.fixture
def relay(io_loop, app, store, ctx):
    """This process's relay: what other processes write reaches its feed."""
    task = io_loop.asyncio_loop.create_task(events.relay(store, ctx.events))
    yield task
    task.cancel()
    io_loop.run_sync(lambda: asyncio.gather(task, return_exceptions=True))


@pytest.fixture
def bob(io_loop, app, store):
    return io_loop.run_sync(lambda: store.get_user_by_username("bob"))


async def admin_api(config, store, ctx, method, path, body=None):
    """The admin API of this process, as root."""
    from tornado.httpclient import AsyncHTTPClient

    sock, port = bind_unused_port()
    server = HTTPServer(make_admin_app(await hand_over(store, config), store, ctx))
    server.add_sockets([sock])
    root = (await issue_tokens(ctx, "root", "read admin")).access_token
    try:
        return await AsyncHTTPClient().fetch(
            f"http://127.0.0.1:{port}{path}", method=method, raise_error=False, allow_nonstandard_methods=True,
            headers={"Authorization": f"Bearer {root}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body))
    finally:
        server.stop()


async def run_cli(store, tmp_path, *argv):
    """``tokensvc ARGS --config`` against the store's database, as an operator runs it beside the
    service (its own event loop, its own store object: another process to the service)."""
    path = tmp_path / "tokensvc.toml"
    path.write_text(CLI_CONFIG)
    client, database = store.client, store.db.name
    code = await asyncio.to_thread(cli.main, [*argv, "--config", str(path)],
                                   store_factory=lambda settings: MongoStore(client, database, change_streams=False))
    assert code == 0


async def named(reader, **expected):
    """Read the feed until a ``revoked`` message naming ``expected``: it, checked against its schema."""
    while True:
        message = await next_message(reader)
        if message["type"] == "revoked" and all(message.get(key) == value for key, value in expected.items()):
            return message


async def test_a_demotion_at_the_admin_api_is_named_on_the_feed(app, http_server, base_url, store, ctx, config,
                                                                bob):
    web = await issue_tokens(ctx, "bob", "read admin")
    assert (await introspection.introspect(ctx, web.access_token))["sub"] == bob.user_id  # what a cache keys on
    reader = await connect(base_url)
    assert (await next_message(reader))["seq"] == 0
    response = await admin_api(config, store, ctx, "PATCH", "/admin/users/bob", {"admin": False})
    assert response.code == 200 and json.loads(response.body)["admin"] is False
    # The feed's message: the user, as introspection's sub names them, and nothing else.
    assert await next_message(reader) == {"type": "revoked", "seq": 1, "sub": bob.user_id}
    stored = await store.get_user(bob.user_id)
    assert stored.admin is False and stored.narrowed_at == ctx.clock()
    assert (await introspection.introspect(ctx, web.access_token))["scope"] == "read"
    # Already no administrator: nothing written, nothing announced.
    assert (await admin_api(config, store, ctx, "PATCH", "/admin/users/bob", {"admin": False})).code == 200
    assert ctx.feed.seq == 1
    # A promotion narrows nothing: the grants that may carry admin are revoked (named by grant),
    # the user is not named.
    assert (await admin_api(config, store, ctx, "PATCH", "/admin/users/bob", {"admin": True})).code == 200
    assert {key for message in list(ctx.feed._recent)[1:] for key in message} <= {"type", "seq", "grant_id"}
    reader.close()


async def demote_elsewhere(path, store, config, tmp_path):
    """bob demoted by another process sharing the store, by ``path``."""
    elsewhere = other_process(store)
    if path == "admin-api":  # what PATCH /admin/users/bob runs, in another process
        handed = await hand_over(store, config)
        await Operator(make_context(config, elsewhere), handed).patch_user("bob", {"admin": False})
    elif path == "cli":
        await hand_over(store, config)
        await run_cli(store, tmp_path, "users", "set-admin", "bob", "no")
    elif path == "apply":
        await hand_over(store, config)
        wanted = tmp_path / "wanted.toml"
        wanted.write_text('[[users]]\nusername = "bob"\nadmin = false\n')
        await run_cli(store, tmp_path, "apply", "-f", str(wanted))
    else:  # another process starting with a configuration that no longer makes bob an administrator
        await seed(elsewhere, make_config(users=users(False)))


@pytest.mark.parametrize("path", ["admin-api", "cli", "apply", "configuration"])
async def test_a_demotion_in_another_process_is_named_on_this_ones_feed(app, http_server, base_url, store, ctx,
                                                                        config, relay, bob, tmp_path, path):
    web = await issue_tokens(ctx, "bob", "read admin")
    reader = await connect(base_url)
    await next_message(reader)
    await demote_elsewhere(path, store, config, tmp_path)
    assert await named(reader, sub=bob.user_id)
    stored = await store.get_user(bob.user_id)
    assert stored.admin is False and stored.narrowed_at is not None
    assert (await introspection.introspect(ctx, web.access_token))["scope"] == "read"
    reader.close()


async def test_a_configuration_that_keeps_a_user_as_they_are_marks_nothing(app, store, config, bob):
    await seed(store, config)
    await seed(store, make_config(users=users(False)))
    marked = (await store.get_user(bob.user_id)).narrowed_at
    assert marked is not None
    await seed(store, make_config(users=users(False)))  # already no administrator: the mark stays as it was
    assert (await store.get_user(bob.user_id)).narrowed_at == marked


@pytest.mark.parametrize("where", ["here", "elsewhere"])
async def test_a_removal_names_the_user_and_each_grant(app, http_server, base_url, store, ctx, config, relay, bob,
                                                       where):
    """Each grant is revoked and named, in every process; the user's mark, written just before
    the deletion, is named by this process, and by the others where their relay follows a change
    stream (tests/wire/test_wire_relay.py): a poll finds no document once it is deleted, and the
    grants name everything a cache may hold for the user."""
    web = await issue_tokens(ctx, "bob", "read admin")
    grant_id = (await introspection.introspect(ctx, web.access_token))["grant_id"]
    reader = await connect(base_url)
    await next_message(reader)
    if where == "here":
        assert (await admin_api(config, store, ctx, "DELETE", "/admin/users/bob")).code == 200
    else:
        await Operator(make_context(config, other_process(store)), await hand_over(store, config)).remove_user("bob")
    assert await named(reader, grant_id=grant_id)
    if where == "here":
        assert await named(reader, sub=bob.user_id)
    assert await store.get_user(bob.user_id) is None
    assert await introspection.introspect(ctx, web.access_token) == {"active": False}
    reader.close()


async def test_a_grant_made_while_a_user_is_removed_is_revoked_and_named_too(app, store, ctx, bob):
    """A grant the user's sign-in made between the removal's sweep and the deletion: its tokens
    are refused once the user is gone, and the sweep after the deletion revokes and names it."""
    heard = []
    ctx.feed.open(heard.append)
    delete_user = store.delete_user
    late = {}

    async def deleting(user_id):
        late["tokens"] = await issue_tokens(ctx, "bob", "read")
        late["grant_id"] = (await introspection.introspect(ctx, late["tokens"].access_token))["grant_id"]
        return await delete_user(user_id)

    store.delete_user = deleting
    await admin.remove_user(ctx, "bob")
    assert (await store.get_grant(late["grant_id"])).revoked_at is not None
    assert {"type": "revoked", "grant_id": late["grant_id"], "seq": len(heard)} == heard[-1]
    assert {"type": "revoked", "sub": bob.user_id, "seq": len(heard) - 1} == heard[-2]


# -- a resource server's verifier ----------------------------------------------------------------


@pytest.mark.parametrize("where", ["here", "elsewhere"])
async def test_a_cached_admin_answer_is_dropped_when_the_user_is_demoted(app, http_server, base_url, store, ctx,
                                                                         config, relay, bob, tmp_path, where):
    """bob's answer (read admin) is cached; bob is demoted: within the feed's latency the entry
    is gone, and the next check asks again and refuses admin (403). Another user's entry stays."""
    access = (await issue_tokens(ctx, "bob", "read admin")).access_token
    other = (await issue_tokens(ctx, "root", "read admin")).access_token
    verifier = await started(verifier_for(base_url))
    try:
        for token in (access, other):
            assert (await verifier.check(token, "admin")).subject is not None
        assert verifier.cached == 2 and verifier.counts.introspections == 2
        if where == "here":
            assert (await admin_api(config, store, ctx, "PATCH", "/admin/users/bob", {"admin": False})).code == 200
        else:
            await demote_elsewhere("cli", store, config, tmp_path)
        await eventually(lambda: verifier.cached == 1, DEADLINE, what="the demotion dropping bob's entry")
        with pytest.raises(InsufficientScope) as refused:
            await verifier.check(access, "admin")
        assert refused.value.status == 403
        assert (await verifier.check(access, "read")).scopes == ["read"]
        assert set((await verifier.check(other, "admin")).scopes) == {"read", "admin"}
        assert verifier.counts.introspections == 3  # bob's asked again, once; root's still cached
    finally:
        await verifier.close()


async def test_a_watched_connection_of_a_demoted_user_asks_again_what_is_left(app, http_server, base_url, ctx,
                                                                              config):
    """A connection standing on admin ends; one standing on read, of the same token, holds. Both
    ask again through one introspection (the token's answer is shared)."""
    access = (await issue_tokens(ctx, "bob", "read admin")).access_token
    verifier = await started(verifier_for(base_url))
    ended = {"admin": asyncio.Event(), "read": asyncio.Event()}
    try:
        authorized = await verifier.check(access, "admin")
        stops = [verifier.watch(access, authorized, ended[scope].set, scope) for scope in ended]
        asked = verifier.counts.introspections
        await Operator(ctx, await hand_over(ctx.store, config)).patch_user("bob", {"admin": False})
        await gen.with_timeout(timedelta(seconds=DEADLINE), ended["admin"].wait())
        await eventually(lambda: verifier.counts.introspections == asked + 1 and not verifier.reverifying, DEADLINE,
                         what="both connections asked again, through one introspection")
        assert not ended["read"].is_set()
        for stop in stops:
            stop()
    finally:
        await verifier.close()


# -- a new password -------------------------------------------------------------------------------


@pytest.fixture
def carol(io_loop, app, store):
    """A user the operator manages (the configuration file writes bob at every start)."""
    return io_loop.run_sync(lambda: admin.create_user(store, "carol", None, password_hash=PASSWORD_HASHES["root"]))


async def set_password_elsewhere(path, store, config, tmp_path, monkeypatch):
    """carol given alice's password by another process sharing the store, by ``path``, her grants
    kept (``apply`` keeps them too); or bob given it by the configuration at start-up. The user."""
    elsewhere = other_process(store)
    if path == "admin-api":  # what PUT /admin/users/bob/password runs, in another process
        await Operator(make_context(config, elsewhere), handed_over(config)).set_password(
            "carol", {"passwordHash": PASSWORD_HASHES["alice"], "keepGrants": True})
    elif path == "cli":
        monkeypatch.setattr("sys.stdin", io.StringIO("a-new-password-for-bob-7\n"))
        await run_cli(store, tmp_path, "users", "set-password", "carol", "--keep-grants", "--password-stdin")
    elif path == "apply":
        wanted = tmp_path / "wanted.toml"
        wanted.write_text(f'[[users]]\nusername = "carol"\npassword_hash = "{PASSWORD_HASHES["alice"]}"\n')
        await run_cli(store, tmp_path, "apply", "-f", str(wanted))
    else:  # another process starting with a configuration that gives bob another password
        await seed(elsewhere, make_config(users=[*users(True)[:2], {**users(True)[2],
                                                                      "password_hash": PASSWORD_HASHES["alice"]}]))
        return await store.get_user_by_username("bob")
    return await store.get_user_by_username("carol")


async def test_a_new_password_at_the_admin_api_is_named_on_the_feed(app, http_server, base_url, store, ctx, config,
                                                                    carol):
    """The user, as introspection's sub names them, and nothing else: with the grants kept, the
    password is the one message; without, each grant follows it."""
    web = await issue_tokens(ctx, "carol", "read")
    grant_id = (await introspection.introspect(ctx, web.access_token))["grant_id"]
    reader = await connect(base_url)
    assert (await next_message(reader))["seq"] == 0
    response = await admin_api(config, store, ctx, "PUT", "/admin/users/carol/password",
                               {"passwordHash": PASSWORD_HASHES["alice"], "keepGrants": True})
    assert response.code == 200, response.body
    assert await next_message(reader) == {"type": "revoked", "seq": 1, "sub": carol.user_id}
    stored = await store.get_user(carol.user_id)
    assert stored.password_hash == PASSWORD_HASHES["alice"] and stored.narrowed_at == ctx.clock()
    assert (await introspection.introspect(ctx, web.access_token))["active"] is True  # kept
    response = await admin_api(config, store, ctx, "PUT", "/admin/users/carol/password",
                               {"passwordHash": PASSWORD_HASHES["root"]})
    assert response.code == 200, response.body
    assert await next_message(reader) == {"type": "revoked", "seq": 2, "sub": carol.user_id}
    assert await named(reader, grant_id=grant_id)
    assert await introspection.introspect(ctx, web.access_token) == {"active": False}
    reader.close()


@pytest.mark.parametrize("path", ["admin-api", "cli", "apply", "configuration"])
async def test_a_new_password_in_another_process_is_named_on_this_ones_feed(app, http_server, base_url, store, ctx,
                                                                            config, relay, carol, tmp_path,
                                                                            monkeypatch, path):
    before = {user.username: user for user in await store.list_users()}
    reader = await connect(base_url)
    await next_message(reader)
    user = await set_password_elsewhere(path, store, config, tmp_path, monkeypatch)
    assert await named(reader, sub=user.user_id)
    assert user.password_hash != before[user.username].password_hash and user.narrowed_at is not None
    reader.close()


async def test_a_configuration_that_keeps_a_users_password_marks_nothing(app, store, config, bob):
    await seed(store, config)
    assert (await store.get_user(bob.user_id)).narrowed_at is None


@pytest.mark.parametrize("where", ["here", "elsewhere"])
async def test_every_cached_answer_of_a_user_is_dropped_when_their_password_changes(
        app, http_server, base_url, store, ctx, config, relay, carol, tmp_path, monkeypatch, where):
    """carol's answers (two tokens) are cached; her password is set, her grants kept: within the
    feed's latency each entry of hers is gone, and the next check asks again. Another user's entry
    stays."""
    mine = [(await issue_tokens(ctx, "carol", "read")).access_token,
            (await issue_tokens(ctx, "carol", "read")).access_token]
    other = (await issue_tokens(ctx, "root", "read")).access_token
    verifier = await started(verifier_for(base_url))
    try:
        for token in (*mine, other):
            assert (await verifier.check(token, "read")).subject is not None
        assert verifier.cached == 3 and verifier.counts.introspections == 3
        if where == "here":
            response = await admin_api(config, store, ctx, "PUT", "/admin/users/carol/password",
                                       {"passwordHash": PASSWORD_HASHES["alice"], "keepGrants": True})
            assert response.code == 200, response.body
        else:
            await set_password_elsewhere("cli", store, config, tmp_path, monkeypatch)
        await eventually(lambda: verifier.cached == 1, DEADLINE, what="the new password dropping carol's entries")
        for token in mine:
            assert (await verifier.check(token, "read")).scopes == ["read"]
        await verifier.check(other, "read")
        assert verifier.counts.introspections == 5  # carol's asked again; root's still cached
    finally:
        await verifier.close()
