"""Start-up: config seeding is idempotent on every backend, and the backend factory."""

import asyncio
import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest
from backends import BACKENDS
from helpers import PASSWORD_HASHES, delete_client_by_hand, make_config

from tokensvc import config as config_module
from tokensvc.bootstrap import CLI_CLIENT, make_store, seed
from tokensvc.config import ConfigError, StorageSettings
from tokensvc.oauth import hashing
from tokensvc.storage.memory import MemoryStore
from tokensvc.storage.mongo import MongoStore


@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
@pytest.mark.gen_test
async def test_seeding_twice_changes_nothing_and_an_edit_is_applied(backend_store):
    store = backend_store
    config = make_config()
    await seed(store, config)
    users = await store.list_users()
    clients = await store.list_clients()
    await seed(store, config)
    assert await store.list_users() == users
    assert await store.list_clients() == clients
    webapp = await store.get_client("webapp")
    assert webapp.secret_hash == hashing.digest("webapp-test-secret-0123456789abcdef") and webapp.first_party
    installation = await store.get_installation("backyard-scope")
    alice = await store.get_user_by_username("alice")
    assert installation.operators == [alice.user_id]

    edited = make_config()
    edited = dataclasses.replace(edited, clients=(
        dataclasses.replace(edited.clients[0], name="Web app 2", client_secret="rotated-secret"), *edited.clients[1:]))
    await seed(store, edited)
    webapp2 = await store.get_client("webapp")
    assert webapp2.name == "Web app 2" and webapp2.secret_hash == hashing.digest("rotated-secret")
    assert webapp2.created_at == webapp.created_at


def test_make_store_picks_the_backend():
    assert isinstance(make_store(StorageSettings(backend="memory")), MemoryStore)

    async def mongodb() -> None:
        # The driver's monitors are tasks of the running loop: the store is built inside it.
        store = make_store(StorageSettings(backend="mongodb", mongodb_uri="mongodb://127.0.0.1:1"))
        assert isinstance(store, MongoStore)
        await store.close()

    asyncio.run(mongodb())
    with pytest.raises(ConfigError, match="storage.backend"):
        make_store(StorageSettings(backend="redis"))


def test_mongodb_example_config_is_valid():
    path = Path(__file__).resolve().parent.parent / "config" / "tokensvc.mongodb.toml"
    settings = config_module.load(path, environ={"TOKENSVC_COOKIE_SECRET": "s" * 32})
    assert settings.storage.backend == "mongodb" and not settings.demo
    # The grace it sets is the documented formula's for its budget (docs/guide/operations.md, item 4).
    assert settings.tokens.refresh_grace_seconds == config_module.mongodb_grace_seconds(settings.storage.timeout_ms)
    with pytest.raises(ConfigError, match="cookie_secret"):
        config_module.load(path, environ={})


@pytest.mark.gen_test
async def test_mongodb_client_options_are_set_in_code_whatever_the_uri_says():
    uri = ("mongodb://127.0.0.1:1/?w=1&journal=false&readPreference=secondaryPreferred"
           "&readConcernLevel=local&timeoutMS=100&maxPoolSize=5")
    store = make_store(StorageSettings(backend="mongodb", mongodb_uri=uri, timeout_ms=12000, max_pool_size=40))
    try:
        client, db = store.client, store.db
        for target in (client, db):
            assert target.write_concern.document == {"w": "majority", "j": True, "wtimeout": 12000}
            assert target.read_preference.mongos_mode == "primary"
            assert target.read_concern.level == "majority"
        # No driver-wide timeoutMS (its retry loop has no backoff): the store keeps each
        # operation to the budget itself, and the driver retries a write once, never a read.
        assert client.options.timeout is None and store.budget == 12.0
        assert client.options.pool_options.max_pool_size == 40
        assert client.options.pool_options.wait_queue_timeout == 12.0
        assert client.options.retry_writes and not client.options.retry_reads
    finally:
        await store.close()


def test_the_refresh_grace_defaults_by_backend():
    assert make_config().tokens.refresh_grace_seconds == 0
    replica_set = {"backend": "mongodb", "mongodb_uri": "mongodb://db1,db2,db3/?replicaSet=rs0"}
    on_mongodb = make_config(storage=replica_set)
    # The whole retry budget: the first attempt's timeout, Retry-After, the retry's timeout.
    assert on_mongodb.tokens.refresh_grace_seconds == 2 * 15 + config_module.STORE_RETRY_AFTER_SECONDS == 35
    slower = make_config(storage={**replica_set, "timeout_ms": 20500})
    assert slower.tokens.refresh_grace_seconds == 2 * 21 + 5
    strict = make_config(storage=replica_set, tokens={"refresh_grace_seconds": 0})
    assert strict.tokens.refresh_grace_seconds == 0
    with pytest.raises(ConfigError, match="storage.timeout_ms"):
        make_config(storage={"timeout_ms": 0})


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_several_processes_seeding_one_empty_store_at_once_all_succeed(backend_store):
    import asyncio

    config = make_config()
    await asyncio.gather(*(seed(backend_store, config) for _ in range(5)))  # every call yields (mongodb)
    users = await backend_store.list_users()
    assert sorted(user.username for user in users) == sorted(u.username for u in config.users)
    ids = {user.username: user.user_id for user in users}
    for installation in await backend_store.list_installations():
        configured = next(i for i in config.installations if i.installation_id == installation.installation_id)
        assert installation.operators == [ids[name] for name in configured.operators]
    # The configured clients, and the command line's (tokensvc login).
    assert sorted(client.client_id for client in await backend_store.list_clients()) == sorted(
        [*(client.client_id for client in config.clients), CLI_CLIENT.client_id])


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_a_seeded_user_is_stored_under_the_key_of_their_name(backend_store):
    """As `users add` does: Dora is stored as dora, found as DORA, an installation's operator
    written in any case; a user seeded before as written keeps that name and id."""
    from tokensvc.records import User

    await backend_store.put_user(User("u_legacy", "Erin", PASSWORD_HASHES["alice"], False))  # as 0.9.0 stored it
    # The file names Erin in another case: the same user (on MongoDB a second one was made).
    config = make_config(users=[{"username": "Dora", "password_hash": PASSWORD_HASHES["alice"]},
                                {"username": "ERIN", "password_hash": PASSWORD_HASHES["root"]}],
                         installations=[{"installation_id": "dome", "name": "Dome", "kind": "observatory",
                                         "operators": ["DORA", "erin"]}])
    for _ in range(2):
        await seed(backend_store, config)
        assert sorted(user.username for user in await backend_store.list_users()) == ["Erin", "dora"]
    dora = await backend_store.get_user_by_username("DORA")
    assert (await backend_store.get_installation("dome")).operators == [dora.user_id, "u_legacy"]
    assert (await backend_store.get_user("u_legacy")).password_hash == PASSWORD_HASHES["root"]


@pytest.mark.gen_test
async def test_the_command_lines_client_is_seeded_unless_switched_off(store):
    config = make_config()
    await seed(store, config)
    cli_client = await store.get_client(CLI_CLIENT.client_id)
    assert cli_client is not None and cli_client.first_party and not cli_client.confidential
    assert cli_client.scopes == ["admin"]
    await seed(store, make_config(admin={"cli_client": False}))
    assert await store.get_client(CLI_CLIENT.client_id) is None


@pytest.mark.gen_test
async def test_the_start_up_line_counts_every_client_it_seeded(store, caplog):
    caplog.set_level("INFO", logger="tokensvc.bootstrap")
    await seed(store, make_config())
    await seed(store, make_config(admin={"cli_client": False}, installations=[]))
    # (switched off, the command line's client is removed, and audited: the audit logger's lines)
    assert [record.getMessage() for record in caplog.records if record.name == "tokensvc.bootstrap"] == [
        "seeded 5 clients (4 from the config and tokensvc-cli), 2 users, 1 installation",
        "seeded 4 clients (from the config), 2 users, 0 installations"]
    assert len(await store.list_clients()) == 4


CLI_REDIRECT = "http://127.0.0.1:5555/callback"


def audited(caplog, event):
    return [record.audit for record in caplog.records if record.name == "tokensvc.audit"
            and record.audit["event"] == event]


async def cli_login(store, clock):
    """root's `tokensvc login`: an admin token pair of the command line's client."""
    from helpers import issue_tokens

    from tokensvc.bootstrap import make_context

    ctx = make_context(make_config(), store, clock=clock)
    issued = await issue_tokens(ctx, "root", "admin", client_id=CLI_CLIENT.client_id, redirect_uri=CLI_REDIRECT)
    return ctx, issued


async def dead(ctx, issued):
    """Whether neither token of ``issued`` does anything: inactive, and no refresh."""
    from tokensvc.oauth import grants, introspection
    from tokensvc.oauth.errors import InvalidGrant

    for token in (issued.access_token, issued.refresh_token):
        if (await introspection.introspect(ctx, token))["active"]:
            return False
    client = await ctx.store.get_client(CLI_CLIENT.client_id)
    if client is not None:
        with pytest.raises(InvalidGrant):
            await grants.refresh(ctx, client, issued.refresh_token, None)
    return True


@pytest.mark.gen_test
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_switching_the_cli_client_off_removes_it_as_clients_remove_does_and_on_again_revives_nothing(
        backend_store, clock, caplog):
    """``admin.cli_client = false`` removes tokensvc-cli as ``clients remove`` would: its grants
    revoked (each announced through the store), audited, no removal left under way; a restart
    still switched off does nothing more; a later one switched on registers it afresh, and the
    admin tokens of before stay dead (no introspection answers active, no refresh)."""
    store = backend_store
    await seed(store, make_config())
    ctx, issued = await cli_login(store, clock)
    grant = (await store.list_client_grants(CLI_CLIENT.client_id))[0]
    with caplog.at_level("INFO", logger="tokensvc.audit"):
        await seed(store, make_config(admin={"cli_client": False}))
        await seed(store, make_config(admin={"cli_client": False}))  # a second start, still off
    assert (await store.get_grant(grant.grant_id)).revoked_at is not None
    assert [event["grants_revoked"] for event in audited(caplog, "client_removed")] == [1]
    assert await store.get_removal(CLI_CLIENT.client_id) is None and await store.list_removals() == []
    assert await dead(ctx, issued)
    await seed(store, make_config(admin={"cli_client": True}))
    assert (await store.get_client(CLI_CLIENT.client_id)).scopes == ["admin"]
    assert await dead(ctx, issued)
    _, again = await cli_login(store, clock)  # a new login works
    from tokensvc.oauth import introspection

    assert (await introspection.introspect(ctx, again.access_token))["active"]


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_several_processes_switching_the_cli_client_off_at_once_remove_it_once(backend_store, clock, caplog):
    """Start-ups at once (every store call yields on mongodb): none fails, the client is
    removed, its grant revoked, no removal left under way."""
    store = backend_store
    await seed(store, make_config())
    ctx, issued = await cli_login(store, clock)
    grant = (await store.list_client_grants(CLI_CLIENT.client_id))[0]
    off = make_config(admin={"cli_client": False})
    with caplog.at_level("INFO", logger="tokensvc.audit"):
        await asyncio.gather(*(seed(store, off) for _ in range(3)))
    assert await store.list_removals() == [] and await store.get_client(CLI_CLIENT.client_id) is None
    assert (await store.get_grant(grant.grant_id)).revoked_at is not None and audited(caplog, "client_removed")
    assert len(audited(caplog, "client_removal_started")) == 1  # by the one that recorded it
    await seed(store, make_config())
    assert await dead(ctx, issued)


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_removals_of_one_client_at_once_audit_its_start_once(backend_store, clock, caplog):
    """Three removals of one client at once (every store call yields on mongodb): its start is
    audited once, by the removal that recorded it; the client is gone, no removal left."""
    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context

    store = backend_store
    await seed(store, make_config())
    ctx = make_context(make_config(), store, clock=clock)
    with caplog.at_level("INFO", logger="tokensvc.audit"):
        await asyncio.gather(*(admin.remove_client(ctx, "webapp") for _ in range(3)), return_exceptions=True)
    assert [event["client_id"] for event in audited(caplog, "client_removal_started")] == ["webapp"]
    assert audited(caplog, "client_removed")
    assert await store.get_client("webapp") is None and await store.list_removals() == []


@pytest.mark.gen_test
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_a_removal_whose_mark_fails_to_be_written_has_its_start_audited(backend_store, clock, caplog,
                                                                             monkeypatch):
    """The removal is recorded, then the write of its mark fails (503): its start is audited
    all the same, by that call, and the retry, which finds it recorded, finishes it: each audit
    line once."""
    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context
    from tokensvc.storage.base import StorageError

    store = backend_store
    await seed(store, make_config())
    ctx = make_context(make_config(), store, clock=clock)
    mark = store.mark_removal

    async def failing(*args):
        raise StorageError("the store went away")

    monkeypatch.setattr(store, "mark_removal", failing)
    with caplog.at_level("INFO", logger="tokensvc.audit"):
        with pytest.raises(StorageError):
            await admin.remove_client(ctx, "webapp")
        assert await store.get_removal("webapp") is not None and await store.get_client("webapp") is None
        monkeypatch.setattr(store, "mark_removal", mark)
        await admin.remove_client(ctx, "webapp")
    assert [event["client_id"] for event in audited(caplog, "client_removal_started")] == ["webapp"]
    assert [event["client_id"] for event in audited(caplog, "client_removed")] == ["webapp"]
    assert await store.list_removals() == []


@pytest.mark.gen_test
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_switching_the_cli_client_off_cut_short_is_finished_by_the_next_start_up(backend_store, clock,
                                                                                      monkeypatch):
    """The store fails once the removal is recorded: that start-up fails (it retries), the
    client is gone meanwhile, and the next one, switched on again, finishes the removal before
    registering the client afresh."""
    from tokensvc.bootstrap import prepare
    from tokensvc.storage.base import StorageError

    store = backend_store
    await seed(store, make_config())
    ctx, issued = await cli_login(store, clock)
    revoke = store.revoke_client_grants

    async def failing(*args):
        raise StorageError("the store went away")

    monkeypatch.setattr(store, "revoke_client_grants", failing)
    with pytest.raises(StorageError):
        await seed(store, make_config(admin={"cli_client": False}))
    assert await store.get_removal(CLI_CLIENT.client_id) is not None
    assert await dead(ctx, issued)
    monkeypatch.setattr(store, "revoke_client_grants", revoke)
    await prepare(store, make_config())
    assert await store.list_removals() == [] and await store.get_client(CLI_CLIENT.client_id) is not None
    assert await store.list_client_grants(CLI_CLIENT.client_id) == []
    assert await dead(ctx, issued)


@pytest.mark.gen_test
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
@pytest.mark.parametrize("registration", ["seeding", "clients add", "admin API PUT"])
async def test_a_client_registered_again_after_any_deletion_revives_nothing_of_before(backend_store, clock,
                                                                                      registration):
    """Whatever deleted a client without revoking its grants (0.9.0's `clients remove` cut short
    between its deletion and its revocation, its start-up switching tokensvc-cli off, a hand in
    the database), registering the id again revokes what was left under it first, each grant
    announced: the tokens of before stay dead under the new client."""
    from tokensvc.admin import actions as admin
    from tokensvc.storage.base import GRANT, Revocation

    store = backend_store
    await seed(store, make_config())
    ctx, issued = await cli_login(store, clock)
    grant = (await store.list_client_grants(CLI_CLIENT.client_id))[0]
    await delete_client_by_hand(store, CLI_CLIENT.client_id)  # as 0.9.0 did, with no revocation after it
    clock.advance(1)  # the registration comes after the grant (its claim bounds the leftovers)
    heard = []
    ctx.events.watch(heard.append)
    if registration == "seeding":
        await seed(store, make_config())
    elif registration == "clients add":
        await admin.create_client(store, admin.ClientSpec("Again", [CLI_REDIRECT], ["admin"], first_party=True),
                                  CLI_CLIENT.client_id, ctx.events.publish)
    else:
        await admin.put_client(ctx, CLI_CLIENT.client_id, admin.ClientSpec("Again", [CLI_REDIRECT], ["admin"]))
    assert (await store.get_grant(grant.grant_id)).revoked_at is not None
    assert await dead(ctx, issued)
    if registration != "seeding":  # start-up: no WebSocket listens yet
        assert Revocation(GRANT, grant.grant_id) in heard


@pytest.mark.gen_test(timeout=30)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_a_registration_that_loses_the_race_for_an_id_takes_and_replaces_nothing(backend_store, clock):
    """B checks that the id is free; A registers it and a user gets a grant under A; then B
    goes on: B is refused (409), A's document (its secret) stays, and A's live grant too."""
    from helpers import SKY_REDIRECT, issue_tokens

    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context
    from tokensvc.oauth import introspection

    store = backend_store
    await seed(store, make_config())
    ctx = make_context(make_config(), store, clock=clock)
    checked, go = asyncio.Event(), asyncio.Event()
    real_list = store.list_clients

    async def held(*args, **kwargs):  # B's check_new_client, held once it has found the id free
        result = await real_list(*args, **kwargs)
        store.list_clients = real_list
        checked.set()
        await go.wait()
        return result

    store.list_clients = held
    b = asyncio.ensure_future(admin.create_client(store, admin.ClientSpec("Twin B", [SKY_REDIRECT], ["read"],
                                                                          confidential=True),
                                                  "twin", ctx.events.publish, clock()))
    await asyncio.wait_for(checked.wait(), 10)
    a, a_secret = await admin.create_client(store, admin.ClientSpec("Twin A", [SKY_REDIRECT], ["read"],
                                                                    confidential=True),
                                            "twin", ctx.events.publish, clock())
    clock.advance(1)
    issued = await issue_tokens(ctx, "alice", "read", "twin", SKY_REDIRECT)
    go.set()
    with pytest.raises(admin.Taken, match="already exists"):
        await b
    assert (await store.get_client("twin")).secret_hash == a.secret_hash == hashing.digest(a_secret)
    assert (await introspection.introspect(ctx, issued.access_token))["active"]


@pytest.mark.gen_test(timeout=30)
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_a_start_up_that_loses_the_race_to_seed_a_new_client_seeds_over_the_winners(backend_store):
    """Two processes seed a new [[clients]] entry at once: the one whose claim comes second
    takes the other's client as an existing one (no failure), and its clearing, bounded by the
    moment it began, revokes nothing the winner issued."""
    from tokensvc.bootstrap import seed_client_as
    from tokensvc.records import Client, Subject, utcnow

    store = backend_store
    now = utcnow()
    first = Client("seeded", "Seeded", ["https://a/cb"], ["read"], created_at=now + timedelta(milliseconds=1))
    await seed_client_as(store, None, first, first.created_at)  # the other process, which won
    issued = await store.save_grant("seeded", Subject(user_id="u1"), ["read"], now + timedelta(seconds=1))
    claimed_at = (await store.get_client("seeded")).created_at
    await seed_client_as(store, None, dataclasses.replace(first, name="Seeded again", created_at=now), now)
    stored = await store.get_client("seeded")
    assert stored.name == "Seeded again" and stored.created_at == claimed_at  # the winner's claim stays
    assert (await store.get_grant(issued.grant_id)).revoked_at is None


@pytest.mark.gen_test
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_a_registration_whose_clearing_fails_claims_nothing_and_clears_when_asked_again(backend_store,
                                                                                                     clock):
    """The store fails while the leftovers are revoked: the registration fails (503) without
    leaving the client registered over live leftovers, and asked again it registers and clears."""
    from tokensvc.admin import actions as admin
    from tokensvc.storage.base import StorageError

    store = backend_store
    await seed(store, make_config())
    ctx, issued = await cli_login(store, clock)
    await delete_client_by_hand(store, CLI_CLIENT.client_id)  # as 0.9.0 did, with no revocation after it
    clock.advance(1)
    real = store.revoke_client_grants

    async def failing(*args):
        raise StorageError("the store went away")

    store.revoke_client_grants = failing
    spec = admin.ClientSpec("Again", [CLI_REDIRECT], ["admin"], first_party=True)
    with pytest.raises(StorageError):
        await admin.create_client(store, spec, CLI_CLIENT.client_id, now=clock())
    assert await store.get_client(CLI_CLIENT.client_id) is None
    store.revoke_client_grants = real
    await admin.create_client(store, spec, CLI_CLIENT.client_id, now=clock())
    assert await store.list_client_grants(CLI_CLIENT.client_id) == []
    assert await dead(ctx, issued)


@pytest.mark.gen_test
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_a_registration_whose_claim_was_written_but_not_answered_leaves_no_leftover_live(backend_store):
    """The claim applied, its answer lost (503): the leftovers were revoked before it, so asked
    again (409: the client is there) nothing of the earlier client of that id is live."""
    from tokensvc.admin import actions as admin
    from tokensvc.records import Subject, utcnow
    from tokensvc.storage.base import StorageError

    store, now = backend_store, utcnow()
    old = await store.save_grant("app1", Subject(user_id="u1"), ["read"], now - timedelta(hours=1))
    real = store.add_client

    async def lost(client):
        await real(client)
        raise StorageError("the answer was lost")

    store.add_client = lost
    spec = admin.ClientSpec(name="App", redirect_uris=["https://a/cb"])
    with pytest.raises(StorageError):
        await admin.create_client(store, spec, "app1", now=now)
    store.add_client = real
    with pytest.raises(admin.Taken):
        await admin.create_client(store, spec, "app1", now=now)
    assert (await store.get_grant(old.grant_id)).revoked_at is not None


@pytest.mark.gen_test
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_a_registration_that_fails_while_clearing_leaves_the_client_registered_since(backend_store):
    """A's clearing stalls, then fails; meanwhile the id is registered by C: A claimed nothing,
    so C's client stays, and A asked again is refused (409)."""
    from tokensvc.admin import actions as admin
    from tokensvc.records import Subject, utcnow
    from tokensvc.storage.base import StorageError

    store, now = backend_store, utcnow()
    await store.save_grant("app1", Subject(user_id="u1"), ["read"], now - timedelta(hours=1))
    real, held, go = store.revoke_client_grants, asyncio.Event(), asyncio.Event()

    async def stalled(*args, **kwargs):
        store.revoke_client_grants = real
        held.set()
        await go.wait()
        raise StorageError("the store went away")

    store.revoke_client_grants = stalled
    a = asyncio.ensure_future(admin.create_client(store, admin.ClientSpec("A", ["https://a/cb"]), "app1", now=now))
    await held.wait()
    await admin.create_client(store, admin.ClientSpec("C", ["https://c/cb"]), "app1", now=utcnow())
    go.set()
    with pytest.raises(StorageError):
        await a
    assert (await store.get_client("app1")).name == "C"


@pytest.mark.gen_test
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_a_grant_given_to_a_client_just_registered_is_never_a_leftover(backend_store):
    """A user authorizes the new client at once: its grant is a new generation (the leftover of
    the earlier client of that id was revoked before the claim, so never carried on), and stays."""
    from tokensvc.admin import actions as admin
    from tokensvc.records import Subject, utcnow

    store, now = backend_store, utcnow()
    old = await store.save_grant("app1", Subject(user_id="u1"), ["read"], now - timedelta(hours=1))
    real, issued = store.add_client, {}

    async def then_authorized(client):
        await real(client)
        issued["grant"] = await store.save_grant("app1", Subject(user_id="u1"), ["read"], now + timedelta(seconds=1))

    store.add_client = then_authorized
    await admin.create_client(store, admin.ClientSpec("App", ["https://a/cb"]), "app1", now=now)
    assert issued["grant"].generation > old.generation and issued["grant"].created_at > now
    assert (await store.get_grant(issued["grant"].grant_id)).revoked_at is None


@pytest.mark.gen_test
@pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)
async def test_each_seeded_client_bounds_its_leftovers_by_the_moment_its_own_id_was_found_free(backend_store,
                                                                                              monkeypatch):
    """A long start-up: a grant left under an id (its client deleted by hand while the seeding
    ran through the entries before it) is older than the moment that entry's id was found free,
    so it is revoked, however long before the run began."""
    from tokensvc import bootstrap
    from tokensvc.records import Subject, utcnow

    store, start = backend_store, utcnow()
    moments = iter(start + timedelta(seconds=10 * step) for step in range(100))
    monkeypatch.setattr(bootstrap, "utcnow", lambda: next(moments))
    real, left = store.add_client, {}

    async def meanwhile(client):
        await real(client)
        if client.client_id == "webapp":  # the first entry, while a later one's client is gone
            left["grant"] = await store.save_grant("partner", Subject(user_id="u1"), ["read"],
                                                   start + timedelta(seconds=5))

    store.add_client = meanwhile
    await seed(store, make_config())
    assert (await store.get_grant(left["grant"].grant_id)).revoked_at is not None


def instance_of(client) -> MongoStore:
    """A serving process's MongoDB store on the database ``client`` holds: it registers among
    the running processes when it opens."""
    from yielding import Yielding

    from tokensvc.storage.mongo import processes

    store = MongoStore(Yielding(client), "tokensvc_test", change_streams=False)
    store.registration = processes.Registration(10)
    return store


@pytest.mark.gen_test(timeout=60)
async def test_an_instance_that_disagrees_on_the_cli_client_with_a_running_one_says_so(caplog):
    """``admin.cli_client`` is the deployment's: the store is one, and an instance with it off
    removes the command line's client for every instance. Instances that disagree would remove
    it and register it afresh at each of their starts (each removal ending every command-line
    sign-in), so an instance that starts beside a running one that says otherwise warns, naming
    the value here and there; one that agrees, or starts alone, says nothing. The memory store
    has one process: nothing to compare."""
    from mongomock_motor import AsyncMongoMockClient

    from tokensvc.bootstrap import prepare

    database = AsyncMongoMockClient(tz_aware=True)
    on, off, also_on = instance_of(database), instance_of(database), instance_of(database)
    warned = "admin.cli_client"
    with caplog.at_level("WARNING", logger="tokensvc.bootstrap"):
        await prepare(on, make_config())
        assert warned not in caplog.text  # alone
        await prepare(also_on, make_config())
        assert warned not in caplog.text  # agrees
        await prepare(off, make_config(admin={"cli_client": False}))
    lines = [record.getMessage() for record in caplog.records if warned in record.getMessage()]
    assert len(lines) == 1 and "false here" in lines[0] and "true at 2 running instances" in lines[0], lines
    caplog.clear()
    with caplog.at_level("WARNING", logger="tokensvc.bootstrap"):
        await off.close()  # stopped: no longer running
        await prepare(instance_of(database), make_config())
    assert warned not in caplog.text
    assert await MemoryStore().deployment_settings({"cli_client": False}) == {}
    for store in (on, also_on):
        await store.close()
