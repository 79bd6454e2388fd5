"""Who owns an entry (docs/guide/administration.md): the configuration file's ``[[clients]]``,
``[[users]]`` and ``[[installations]]`` (and the command line's client) are the file's, written
again at every start, so the operations refuse to change or remove them (409, naming the file)
on every path: the admin API, the command line on a store, ``apply``'s plan. Every other entry
is the admin API's, and seeding never writes it; seeding over an entry that differs says which
fields it writes. ``tests/wire/test_wire_ownership.py`` restarts workers and instances after
each kind of change."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from helpers import handed_over, issue_tokens

from tokensvc.admin import actions as admin
from tokensvc.admin.operator import Operator
from tokensvc.bootstrap import seed
from tokensvc.errors import ValidationFailed
from tokensvc.oauth import hashing
from tokensvc.records import Subject

pytestmark = pytest.mark.gen_test

FILE = "/etc/tokensvc/tokensvc.toml"
STRONG = "violet-comet-harbor"


@pytest.fixture
def config(config):
    return dataclasses.replace(config, config_file=FILE)


@pytest.fixture
def operator(io_loop, store, config, ctx):
    io_loop.run_sync(lambda: seed(store, config))
    return Operator(ctx, config)


CHANGES = {
    "demotion": lambda op: op.patch_user("root", {"admin": False}),
    "promotion": lambda op: op.patch_user("ALICE", {"admin": True}),  # a username in any case
    "password": lambda op: op.set_password("alice", {"password": STRONG}),
    "user removal": lambda op: op.remove_user("alice"),
    "secret rotation": lambda op: op.rotate_secret("webapp", {}),
    "narrowed scopes": lambda op: op.patch_client("webapp", {"allowedScopes": ["read"]}),
    "replaced client": lambda op: op.put_client("skyplanner", {"name": "SkyPlanner", "redirectUris": [
        "https://elsewhere.example/cb"]}),
    "client removal": lambda op: op.remove_client("partner"),
    "installation": lambda op: op.put_installation("backyard-scope", {"name": "Front yard", "kind": "telescope"}),
    "installation removal": lambda op: op.remove_installation("backyard-scope"),
}


@pytest.mark.parametrize("change", CHANGES)
async def test_an_entry_of_the_file_is_changed_by_no_operation_which_names_the_file(operator, store, change):
    before = (await store.list_clients(), await store.list_users(), await store.list_installations())
    with pytest.raises(admin.TheFiles) as refused:
        await CHANGES[change](operator)
    assert refused.value.status_code == 409
    assert f"is written by the configuration file {FILE} at every start: change it there" in str(refused.value)
    assert (await store.list_clients(), await store.list_users(), await store.list_installations()) == before


@pytest.mark.parametrize("change", [lambda op: op.patch_client("tokensvc-cli", {"description": "Ours now"}),
                                    lambda op: op.rotate_secret("tokensvc-cli", {}),
                                    lambda op: op.remove_client("tokensvc-cli")])
async def test_the_command_lines_client_is_refused_naming_admin_cli_client(operator, store, change):
    """``tokensvc-cli`` is no entry of the file's ``[[clients]]``: ``admin.cli_client`` (on by
    default) writes it. The 409 said to take it out of the file, where it never was."""
    before = await store.get_client("tokensvc-cli")
    with pytest.raises(admin.TheFiles) as refused:
        await change(operator)
    assert refused.value.status_code == 409
    assert str(refused.value) == (
        "client 'tokensvc-cli' is tokensvc login's own client, written at every start while admin.cli_client is on "
        "(its default): it cannot be changed here; admin.cli_client = false removes it, and a client of your own "
        "then serves tokensvc login --token-client-id")
    assert await store.get_client("tokensvc-cli") == before
    plan = operator.plan({"clients": [{"clientId": "tokensvc-cli", "description": "Ours now"}]})
    with pytest.raises(ValidationFailed) as planned:
        await plan
    assert planned.value.detail[0]["msg"].startswith("client 'tokensvc-cli' is tokensvc login's own client")


async def test_what_the_file_does_not_write_stays_the_operators_to_do(operator, ctx, store):
    """Tokens, grants and sessions are no entry of the file: revoked and ended as ever, a file
    user's too; reading an entry of the file is reading."""
    issued = await issue_tokens(ctx, "alice", "read")
    grants = (await operator.list_grants("alice"))["items"]
    assert grants and (await operator.revoke_grant(grants[0]["grantId"]))["familiesRevoked"] == 1
    assert (await operator.end_sessions("alice")) == {"ended": 0}
    assert (await operator.get_user("root"))["admin"] and (await operator.get_client("webapp"))["confidential"]
    assert not await store.list_grants(Subject(user_id=(await store.get_user_by_username("alice")).user_id))
    assert issued.access_token


async def test_the_same_entry_is_the_admin_apis_once_a_start_with_a_file_that_no_longer_names_it(operator, ctx,
                                                                                                    config, store):
    """The store's mark follows the file of the last start: one whose file names the entry
    no more clears it, one whose file names it again marks it again (a rolling deploy that
    removes an entry, or adds one, while instances of both files start)."""
    await seed(store, handed_over(config))  # the restart with the file that hands the entries over
    assert not any(client.owner for client in await store.list_clients() if client.client_id != "tokensvc-cli")
    assert not any(user.owner for user in await store.list_users())
    await Operator(ctx, handed_over(config)).patch_user("root", {"admin": False})
    assert not (await store.get_user_by_username("root")).admin
    await seed(store, config)  # a start with the file that names it again: the file's again
    assert (await store.get_user_by_username("root")).admin
    with pytest.raises(admin.TheFiles, match=f"written by the configuration file {FILE} at every start"):
        await Operator(ctx, handed_over(config)).patch_user("root", {"admin": False})


async def test_a_start_with_another_file_says_what_it_takes_from_the_deployments(operator, store, config, caplog):
    """Instances of one store that start with different files take entries from each other at
    every start: a start whose file is not the one that marked an entry warns, naming both files,
    for each entry it now writes and each it no longer names. The deployment's own hand-over (a
    start of the same file that no longer names an entry) warns of nothing."""
    other = dataclasses.replace(config, config_file=ELSEWHERE,
                                users=tuple(user for user in config.users if user.username == "alice"))
    with caplog.at_level(logging.WARNING, logger="tokensvc.bootstrap"):
        await seed(store, other)
    lines = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert (f"user alice was written at every start by the configuration file {FILE}, and is now by this one, "
            f"{ELSEWHERE}: run every instance of one store with the same file") in lines
    assert (f"user root was written at every start by the configuration file {FILE}, which this start's file, "
            f"{ELSEWHERE}, does not name: it is the admin API's until a start with {FILE}; run every instance of "
            "one store with the same file") in lines
    assert (await store.get_user_by_username("alice")).owner == ELSEWHERE
    caplog.clear()
    await seed(store, other)  # the same file again: nothing taken
    await seed(store, dataclasses.replace(other, users=(), installations=()))  # its own hand-over of alice
    assert not [record for record in caplog.records if record.levelno == logging.WARNING]


ELSEWHERE = "/srv/elsewhere/tokensvc.toml"


def elsewhere(config, **admin_settings):
    """The settings of a command given another file than the deployment's (``--config``),
    which names none of its entries."""
    return dataclasses.replace(handed_over(config), config_file=ELSEWHERE,
                               admin=dataclasses.replace(config.admin, **admin_settings))


@pytest.mark.parametrize("change", CHANGES)
async def test_an_entry_the_store_marks_is_refused_whatever_file_the_operator_was_given(operator, ctx, config, store,
                                                                                       change):
    """The command line on a store reads the file it is given, not the running deployment's: the
    store says which entries a file writes at every start, so the change is refused all the
    same, naming the file that writes it, and nothing changes (a rotated secret that the next
    restart took back, before)."""
    before = (await store.list_clients(), await store.list_users(), await store.list_installations())
    with pytest.raises(admin.TheFiles) as refused:
        await CHANGES[change](Operator(ctx, elsewhere(config)))
    assert refused.value.status_code == 409
    assert f"is written by the configuration file {FILE} at every start: change it there" in str(refused.value)
    assert (await store.list_clients(), await store.list_users(), await store.list_installations()) == before


async def test_the_command_lines_client_is_refused_whatever_the_operators_settings_say(operator, ctx, config, store):
    before = await store.get_client("tokensvc-cli")
    with pytest.raises(admin.TheFiles) as refused:
        await Operator(ctx, elsewhere(config, cli_client=False)).rotate_secret("tokensvc-cli", {})
    assert str(refused.value).startswith("client 'tokensvc-cli' is tokensvc login's own client, written at every "
                                         "start while admin.cli_client is on")
    assert await store.get_client("tokensvc-cli") == before


async def test_a_plan_given_another_file_changes_no_entry_the_store_marks_and_prunes_none(operator, ctx, config):
    other = Operator(ctx, elsewhere(config))
    with pytest.raises(ValidationFailed) as refused:
        await other.plan({"clients": [{"clientId": "webapp", "allowedScopes": ["read"]}],
                          "users": [{"username": "alice", "admin": True}]})
    assert [(item["loc"], f"written by the configuration file {FILE}" in item["msg"])
            for item in refused.value.detail] == [(["body", "users", 0], True), (["body", "clients", 0], True)]
    assert (await other.plan({"clients": [], "users": [], "installations": [], "prune": True}))["steps"] == []


async def test_a_plan_names_an_entry_of_the_file_as_the_file_has_it_changes_none_and_prunes_none(operator, store):
    unchanged = await operator.plan({"clients": [{"clientId": "webapp", "allowedScopes": [
        "read", "write", "connected-apps:write", "admin"]}], "users": [{"username": "alice"}]})
    assert [step["action"] for step in unchanged["steps"]] == ["unchanged", "unchanged"]
    with pytest.raises(ValidationFailed) as refused:
        await operator.plan({"users": [{"username": "alice", "admin": True}],
                             "clients": [{"clientId": "made-here", "name": "Made here",
                                          "redirectUris": ["https://made.example/cb"]},
                                         {"clientId": "webapp", "allowedScopes": ["read"]}]})
    assert [(item["loc"], "written by the configuration file" in item["msg"]) for item in refused.value.detail] == [
        (["body", "users", 0], True), (["body", "clients", 1], True)]
    await operator.create_client({"clientId": "made-here", "name": "Made here",
                                  "redirectUris": ["https://made.example/cb"]})
    pruned = await operator.plan({"clients": [], "users": [], "installations": [], "prune": True})
    assert [(step["kind"], step["id"], step["action"]) for step in pruned["steps"]] == [
        ("client", "made-here", "remove")]


async def test_seeding_over_an_entry_that_differs_says_which_fields_it_writes(store, config, caplog):
    await seed(store, config)
    caplog.set_level(logging.INFO, logger="tokensvc.bootstrap")
    caplog.clear()
    await seed(store, config)  # a restart with the same file: nothing to say
    assert "written as the configuration file says" not in caplog.text
    # An entry of the admin API's that a new version of the file names: the file's from now on.
    webapp = await store.get_client("webapp")
    await store.update_client("webapp", {"name": "Renamed here", "secret_hash": hashing.digest("another")})
    alice = await store.get_user_by_username("alice")
    await store.update_user(alice.user_id, {"admin": True})
    await seed(store, config)
    assert "client webapp written as the configuration file says: name, secret_hash" in caplog.text
    assert "user alice written as the configuration file says: admin" in caplog.text
    assert "another" not in caplog.text and hashing.digest("another") not in caplog.text
    written = await store.get_client("webapp")
    assert (written.name, written.secret_hash) == (webapp.name, webapp.secret_hash)
    assert not (await store.get_user_by_username("alice")).admin
