"""``tokensvc apply`` as an operator trusts ``kubectl apply`` and ``terraform plan``: every key of
the config file's tables honoured (secrets hashed before they leave the command line), the
whole file checked before anything changes, the plan printed, nothing changed by a dry run,
the second run a no-op, a failure midway told. Against a stopped service's MongoDB
(``--config``, the mongomock stand-in) and a running service's admin API (``--url``, memory)."""

from __future__ import annotations

import functools
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session
from service import WEBAPP_SECRET, user_agent_authorize
from test_admin_cli import (  # noqa: F401 - fixtures among them
    credentials,
    keyboard,
    ok,
    service,
    sign_in_in_a_browser,
    tokensvc,
)
from test_cli import config_path, mongo, run  # noqa: F401 - fixtures

from tokensvc import config as config_module
from tokensvc.cli import main as cli
from tokensvc.oauth import hashing
from tokensvc.storage.base import StorageError
from tokensvc.storage.mongo import MongoStore

FILE = '''
[[users]]
username = "dora"
password = "orbit-lantern-quiet"

[[clients]]
client_id = "applied-app"
name = "Applied app"
redirect_uris = ["https://applied.example/cb"]
allowed_scopes = ["read", "write"]
client_secret = "applied-app-secret-0123456789abcdef"
description = "Applied from a file"

[[installations]]
installation_id = "applied-dome"
name = "Applied dome"
kind = "observatory"
operators = ["dora"]
'''


def write(tmp_path: Path, text: str, name: str = "wanted.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- against a stopped service's MongoDB (--config) ----------------------------------------------


def test_the_plan_is_printed_applied_and_a_second_run_changes_nothing(run, tmp_path):
    wanted = write(tmp_path, FILE)
    code, planned, err = run("apply", "-f", wanted, "--dry-run")
    assert code == 0, err
    assert planned.splitlines() == [
        "create user dora", "    password: set",
        "create client applied-app", "    name: Applied app", "    redirect_uris: https://applied.example/cb",
        "    allowed_scopes: read write", "    client_secret: set", "    description: Applied from a file",
        "create installation applied-dome", "    name: Applied dome", "    kind: observatory", "    operators: dora",
        "plan: 3 to create, 0 to update, 0 unchanged, 0 to remove", "(dry run: nothing was changed)"]
    assert run("clients", "list")[1].strip() == "no clients"  # the dry run changed nothing
    code, applied, err = run("apply", "-f", wanted)
    assert code == 0, err
    # The real run prints exactly the plan the dry run printed, then what it did.
    assert applied.splitlines() == planned.splitlines()[:-1] + ["applied: 3 changes"]
    code, shown, _ = run("clients", "show", "applied-app", json_out=True)
    assert shown["confidential"] and shown["allowedScopes"] == ["read", "write"]
    assert run("apply", "-f", wanted)[1].splitlines() == [
        "unchanged user dora", "unchanged client applied-app", "unchanged installation applied-dome",
        "nothing to change (3 unchanged)"]
    assert "applied-app-secret" not in planned + applied and hashing.digest("applied-app-secret-0123456789abcdef") \
        not in planned + applied


def test_a_secret_is_hashed_before_it_leaves_the_command_line(run, mongo, tmp_path, monkeypatch):
    sent = []
    original = MongoStore.add_client

    async def recording(self, client):
        sent.append(repr(client))
        return await original(self, client)

    monkeypatch.setattr(MongoStore, "add_client", recording)  # a registration's write
    plans = []
    from tokensvc.admin import operator

    original_plan = operator.Operator.plan

    async def plan(self, body, *args):
        plans.append(repr(body))
        return await original_plan(self, body, *args)

    monkeypatch.setattr(operator.Operator, "plan", plan)
    assert run("apply", "-f", write(tmp_path, FILE))[0] == 0
    assert plans and sent and "applied-app-secret" not in "".join(plans + sent)
    assert hashing.digest("applied-app-secret-0123456789abcdef") in plans[0]
    # client_secret_sha256 passes as it is.
    digest = hashing.digest("a-second-secret-0123456789")
    code, out, err = run("apply", "-f", write(tmp_path, f'[[clients]]\nclient_id = "applied-app"\n'
                                                        f'client_secret_sha256 = "{digest}"\n', "digest.toml"))
    assert code == 0, err
    assert out.splitlines()[:2] == ["update client applied-app", "    client_secret_sha256: changed"]
    stored = [client for client in __import__("test_cli").stored(mongo, "clients")
              if client["_id"] == "applied-app"][0]
    assert stored["secret_hash"] == digest and digest not in out


def test_unknown_keys_and_tables_are_refused_naming_file_table_and_key(run, tmp_path):
    wanted = write(tmp_path, '''
[[clients]]
client_id = "typo-app"
name = "Typo app"
redirect_uri = ["https://typo.example/cb"]
first_partyy = true

[[users]]
username = "frank"
password = "orbit-lantern-quiet"
admin = "yes"
pasword = "orbit-lantern-quiet"

[[userz]]
username = "ghost"

[[installations]]
name = "No id"
kind = "telescope"
operator = ["frank"]
''')
    for dry in ([], ["--dry-run"]):
        code, out, err = run("apply", "-f", wanted, *dry)
        assert code == 1 and out == ""
        assert err.splitlines() == [
            f"tokensvc: {wanted}: 7 problems; nothing was changed",
            f"{wanted}: unknown table [[userz]] (a file has clients, users, installations)",
            f"{wanted}: [[users]] #1 (username = 'frank'): admin: expected a boolean, got 'yes'",
            f"{wanted}: [[users]] #1 (username = 'frank'): pasword: unknown key (the keys of [[users]]: username, "
            "password, password_hash, admin)",
            f"{wanted}: [[clients]] #1 (client_id = 'typo-app'): redirect_uri: unknown key (the keys of [[clients]]: "
            "client_id, name, redirect_uris, kind, allowed_scopes, first_party, client_secret, client_secret_sha256, "
            "description, logo_url, allowed_origins, resources)",
            f"{wanted}: [[clients]] #1 (client_id = 'typo-app'): first_partyy: unknown key (the keys of [[clients]]: "
            "client_id, name, redirect_uris, kind, allowed_scopes, first_party, client_secret, client_secret_sha256, "
            "description, logo_url, allowed_origins, resources)",
            f"{wanted}: [[installations]] #1: operator: unknown key (the keys of [[installations]]: installation_id, "
            "name, kind, operators)",
            f"{wanted}: [[installations]] #1: installation_id: a value is required (it names what the entry is)"]
    assert run("users", "list")[1].strip() == "no users"


def test_the_dry_run_checks_the_whole_plan_with_the_rules_of_the_real_run(run, tmp_path):
    assert run("apply", "-f", write(tmp_path, FILE))[0] == 0
    wanted = write(tmp_path, '''
[[users]]
username = "eve"
password = "eve-eve"

[[users]]
username = "dora"
password_hash = "md5$abc"

[[clients]]
client_id = "applied-app"
redirect_uris = ["http://applied.example/cb"]

[[clients]]
client_id = "second-app"
name = "applied APP"
redirect_uris = ["https://second.example/cb"]

[[installations]]
installation_id = "applied-dome"
kind = "submarine"

[[installations]]
installation_id = "dome-2"
name = "Dome 2"
kind = "telescope"
operators = ["ghost"]
''', "wrong.toml")
    for dry in (["--dry-run"], []):
        code, out, err = run("apply", "-f", wanted, *dry)
        assert code == 1 and out == "", err
        assert err.splitlines() == [
            f"tokensvc: {wanted}: 6 problems; nothing was changed",
            f"{wanted}: [[users]] #1 (username = 'eve'): password: a password needs at least 8 characters",
            f"{wanted}: [[users]] #2 (username = 'dora'): password_hash: not a valid password hash (a scrypt hash as "
            "tokensvc stores it (scrypt$N$r$p$salt$key)): 'md5$abc'",
            f"{wanted}: [[clients]] #1 (client_id = 'applied-app'): redirect_uris: not a valid redirect URI (http only "
            "to a loopback host (127.0.0.1, [::1], localhost); use https): 'http://applied.example/cb'",
            f"{wanted}: [[clients]] #2 (client_id = 'second-app'): a client named 'applied APP' already exists",
            f"{wanted}: [[installations]] #1 (installation_id = 'applied-dome'): kind: not a valid kind (one of "
            "telescope, observatory): 'submarine'",
            f"{wanted}: [[installations]] #2 (installation_id = 'dome-2'): operators: no user named 'ghost'"]
    assert run("clients", "show", "applied-app", json_out=True)[1]["redirectUris"] == ["https://applied.example/cb"]
    assert run("clients", "show", "second-app")[0] == 1


def test_a_field_left_out_keeps_its_value(run, tmp_path):
    assert run("apply", "-f", write(tmp_path, FILE))[0] == 0
    code, out, err = run("apply", "-f", write(tmp_path, '''
[[clients]]
client_id = "applied-app"
allowed_scopes = ["read"]

[[users]]
username = "dora"
admin = true

[[installations]]
installation_id = "applied-dome"
name = "The applied dome"
''', "partial.toml"))
    assert code == 0, err
    assert out.splitlines() == [
        "update user dora", "    admin: no -> yes",
        "update client applied-app", "    allowed_scopes: read write -> read",
        "update installation applied-dome", "    name: Applied dome -> The applied dome",
        "plan: 0 to create, 3 to update, 0 unchanged, 0 to remove", "applied: 3 changes"]
    shown = run("clients", "show", "applied-app", json_out=True)[1]
    assert shown["description"] == "Applied from a file" and shown["confidential"] and shown["name"] == "Applied app"
    installation = run("installations", "list", json_out=True)[1][0]
    assert installation["kind"] == "observatory" and installation["operators"] == ["dora"]


def test_a_password_is_changed_only_when_it_differs(run, mongo, tmp_path):
    from test_cli import stored

    assert run("apply", "-f", write(tmp_path, FILE))[0] == 0
    kept = [user for user in stored(mongo, "users") if user["username"] == "dora"][0]["password_hash"]
    same = write(tmp_path, '[[users]]\nusername = "dora"\npassword = "orbit-lantern-quiet"\n', "same.toml")
    assert run("apply", "-f", same)[1].splitlines() == ["unchanged user dora", "nothing to change (1 unchanged)"]
    new = write(tmp_path, '[[users]]\nusername = "dora"\npassword = "quartz-meadow-lantern"\n', "new.toml")
    assert run("apply", "-f", new, "--dry-run")[1].splitlines()[:2] == [
        "update user dora", "    password: changed (ends the user's web sessions and revokes their grants)"]
    assert run("apply", "-f", new)[0] == 0
    changed = [user for user in stored(mongo, "users") if user["username"] == "dora"][0]["password_hash"]
    assert changed != kept and hashing.verify_password("quartz-meadow-lantern", changed)
    # A hash as stored is taken as it is.
    as_stored = hashing.hash_password("lantern-quartz-meadow")
    code, out, _ = run("apply", "-f", write(tmp_path, f'[[users]]\nusername = "hana"\npassword_hash = "{as_stored}"\n'
                                                     'admin = true\n', "hash.toml"))
    assert code == 0 and as_stored not in out
    assert [user for user in stored(mongo, "users") if user["username"] == "hana"][0]["password_hash"] == as_stored


def test_prune_removes_what_a_named_table_leaves_out_after_listing_it(run, tmp_path):
    assert run("apply", "-f", write(tmp_path, FILE))[0] == 0
    assert run("clients", "add", "--name", "Stray", "--redirect-uri", "https://stray.example/cb",
               "--client-id", "stray")[0] == 0
    only_clients = write(tmp_path, '''
[[clients]]
client_id = "applied-app"
''', "clients.toml")
    planned = run("apply", "-f", only_clients, "--prune", "--dry-run")[1].splitlines()
    assert planned == ["unchanged client applied-app", "remove client stray",
                       "plan: 0 to create, 0 to update, 1 unchanged, 1 to remove", "(dry run: nothing was changed)"]
    # Without --prune nothing is removed; with it, only the clients (no [[users]] table: no user removed).
    assert run("apply", "-f", only_clients)[1].strip().endswith("nothing to change (1 unchanged)")
    code, out, _ = run("apply", "-f", only_clients, "--prune")
    assert code == 0 and out.splitlines()[-1] == "applied: 1 changes"
    assert run("clients", "show", "stray")[0] == 1 and run("users", "list", json_out=True)[1][0]["username"] == "dora"


def test_a_failure_midway_names_what_was_applied_and_what_was_not(run, tmp_path, monkeypatch):
    async def away(self, installation):
        raise StorageError("the primary stepped down")

    monkeypatch.setattr(MongoStore, "put_installation", away)
    code, out, err = run("apply", "-f", write(tmp_path, FILE))
    assert code == 1 and out.splitlines()[-1] == "plan: 3 to create, 0 to update, 0 unchanged, 0 to remove"
    assert [line for line in err.splitlines() if "tokensvc.audit" not in line] == [
        "tokensvc: apply stopped at create installation applied-dome: the primary stepped down",
        "  applied before it: create user dora, create client applied-app",
        "  not applied: nothing else",
        "(apply again once fixed: what was applied is unchanged the second time)"]
    monkeypatch.undo()
    assert run("apply", "-f", write(tmp_path, FILE))[1].splitlines()[-4:] == [
        "    kind: observatory", "    operators: dora", "plan: 1 to create, 0 to update, 2 unchanged, 0 to remove",
        "applied: 1 changes"]


def test_installation_kinds_are_the_configured_ones(run, config_path, tmp_path):
    Path(config_path).write_text(Path(config_path).read_text().replace(
        "[storage]", 'installation_kinds = ["telescope", "observatory", "antenna"]\n[storage]'))
    wanted = write(tmp_path, FILE.replace('kind = "observatory"', 'kind = "antenna"'))
    assert run("apply", "-f", wanted)[0] == 0
    assert run("installations", "add", "dish", "--name", "Dish", "--kind", "antenna")[0] == 0
    code, _, err = run("installations", "add", "sub", "--name", "Sub", "--kind", "submarine")
    assert code == 1 and err == ("tokensvc: not a valid kind (one of telescope, observatory, antenna): 'submarine'\n")


# -- against a running service's admin API (--url) ---------------------------------------------------


def code_for(service, client_id: str, secret: str | None) -> dict:
    """The authorization-code flow of a first-party client of the e2e config, as the client does it."""
    app = OAuth2Session(client_id, secret, scope="read", redirect_uri="http://127.0.0.1:1/callback",
                        code_challenge_method="S256", token_endpoint_auth_method="client_secret_post" if secret
                        else "none")
    verifier = secrets.token_urlsafe(48)
    url, _ = app.create_authorization_url(service.base + "/oauth/authorize", code_verifier=verifier)
    landed = user_agent_authorize(url)
    code = re.search(r"code=([^&]+)", landed)[1]
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": "http://127.0.0.1:1/callback",
            "code_verifier": verifier, "client_id": client_id, **({"client_secret": secret} if secret else {})}
    answer = requests.post(service.base + "/oauth/token", data=form, timeout=10)
    return {"status": answer.status_code, **answer.json()}


OWN_APP = '''
[[clients]]
client_id = "own-app"
name = "Own app"
redirect_uris = ["http://127.0.0.1:1/callback"]
allowed_scopes = ["read", "write"]
first_party = true
'''
OWN_SECRET = "own-app-secret-0123456789abcdef-0123"


@pytest.mark.process
def test_applying_a_confidential_clients_own_table_keeps_it_confidential(service, credentials, tmp_path):
    admin = ["--url", service.admin]
    ok(tokensvc("apply", "-f", write(tmp_path, OWN_APP + f'client_secret = "{OWN_SECRET}"\n', "made.toml"), *admin,
                credentials=credentials))
    wanted = write(tmp_path, OWN_APP)
    assert ok(tokensvc("apply", "-f", wanted, *admin, credentials=credentials)).splitlines() == [
        "unchanged client own-app", "nothing to change (1 unchanged)"]
    assert code_for(service, "own-app", None)["status"] == 401  # never public
    assert code_for(service, "own-app", OWN_SECRET)["status"] == 200
    new_secret = "a-new-own-app-secret-0123456789abcdef"
    rotated = write(tmp_path, OWN_APP + f'client_secret = "{new_secret}"\n', "rotated.toml")
    result = tokensvc("apply", "-f", rotated, *admin, credentials=credentials)
    assert ok(result).splitlines()[:2] == ["update client own-app", "    client_secret: changed"]
    assert new_secret not in result.stdout + result.stderr
    assert code_for(service, "own-app", OWN_SECRET)["status"] == 401
    assert code_for(service, "own-app", new_secret)["status"] == 200


WEBAPP = f'''
[[clients]]
client_id = "webapp"
name = "Web app"
redirect_uris = ["http://127.0.0.1:1/callback"]
allowed_scopes = ["read", "write"]
first_party = true
client_secret = "{WEBAPP_SECRET}"
'''


@pytest.mark.process
def test_apply_names_the_configuration_files_entries_as_the_file_has_them_and_changes_none(service, credentials,
                                                                                            tmp_path):
    """The service's configuration file writes its entries at every start: apply may name them
    as the file has them (unchanged), never change them (the file is named, nothing changes),
    and its prune leaves them alone."""
    admin = ["--url", service.admin]
    assert ok(tokensvc("apply", "-f", write(tmp_path, WEBAPP), *admin, credentials=credentials)).splitlines() == [
        "unchanged client webapp", "nothing to change (1 unchanged)"]
    changed = write(tmp_path, WEBAPP.replace('["read", "write"]', '["read"]') + '''
[[users]]
username = "alice"
admin = true
''', "changed.toml")
    result = tokensvc("apply", "-f", changed, *admin, credentials=credentials)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines()[1:] == [
        f"{changed}: [[users]] #1 (username = 'alice'): user 'alice' is written by the configuration file "
        f"{service.config} at every start: change it there (or take it out of the file to manage it here)",
        f"{changed}: [[clients]] #1 (client_id = 'webapp'): client 'webapp' is written by the configuration file "
        f"{service.config} at every start: change it there (or take it out of the file to manage it here)"]
    assert code_for(service, "webapp", WEBAPP_SECRET)["scope"] == "read"  # as the file has it
    pruned = write(tmp_path, '[[users]]\nusername = "root"\n[[clients]]\nclient_id = "webapp"\n', "pruned.toml")
    planned = ok(tokensvc("apply", "-f", pruned, "--prune", "--dry-run", *admin, credentials=credentials))
    for entry in ("user alice", "user bob", "client skyplanner", "client node-agent", "client tokensvc-cli"):
        assert entry not in planned


@pytest.mark.process
def test_a_partial_table_over_the_api_keeps_the_rest(service, credentials, tmp_path):
    admin = ["--url", service.admin]
    ok(tokensvc("apply", "-f", write(tmp_path, '''
[[clients]]
client_id = "partial-app"
name = "Partial app"
redirect_uris = ["https://partial.example/cb"]
allowed_scopes = ["read", "observations:write"]
description = "Keeps what a table leaves out"
logo_url = "https://partial.example/logo.png"
''', "made.toml"), *admin, credentials=credentials))
    before = requests.get(service.base + "/oauth/clients/partial-app", timeout=10).json()
    wanted = write(tmp_path, '[[clients]]\nclient_id = "partial-app"\nallowed_scopes = ["read"]\n')
    planned = ok(tokensvc("apply", "-f", wanted, "--dry-run", *admin, credentials=credentials))
    assert planned.splitlines()[:2] == ["update client partial-app",
                                        "    allowed_scopes: read observations:write -> read"]
    ok(tokensvc("apply", "-f", wanted, *admin, credentials=credentials))
    after = requests.get(service.base + "/oauth/clients/partial-app", timeout=10).json()
    assert after == {**before, "allowedScopes": ["read"]}
    assert after["description"] and after["logoUrl"]


@pytest.mark.process
def test_prune_never_removes_the_operator_running_it(service, credentials, tmp_path):
    mine = signed_in_admin(service, credentials, tmp_path, "opsprune")
    wanted = write(tmp_path, '[[users]]\nusername = "alice"\n')
    result = tokensvc("apply", "-f", wanted, "--prune", "--url", service.admin, credentials=mine)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"tokensvc: {wanted}: 1 problem; nothing was changed",
        f"{wanted}: [[users]]: pruning would remove 'opsprune', who runs this: name them in the file"]
    assert json_users(service, credentials) >= {"root", "alice", "bob", "opsprune"}


def json_users(service, credentials) -> set[str]:
    import json

    listed = ok(tokensvc("users", "list", "--json", "--url", service.admin, credentials=credentials))
    return {user["username"] for user in json.loads(listed)}


@pytest.mark.process
def test_apply_over_the_api_runs_the_same_plan_as_on_the_store(service, credentials, tmp_path):
    admin = ["--url", service.admin]
    wanted = write(tmp_path, FILE)
    planned = ok(tokensvc("apply", "-f", wanted, "--dry-run", *admin, credentials=credentials))
    applied = ok(tokensvc("apply", "-f", wanted, *admin, credentials=credentials))
    assert applied.splitlines() == planned.splitlines()[:-1] + ["applied: 3 changes"]
    assert ok(tokensvc("apply", "-f", wanted, *admin, credentials=credentials)).splitlines()[-1] == \
        "nothing to change (3 unchanged)"
    assert code_for(service, "webapp", WEBAPP_SECRET)["status"] == 200
    assert subprocess.run([sys.executable, "-m", "tokensvc", "apply", "--help"], capture_output=True, text=True,
                          timeout=30).returncode == 0


def test_a_user_is_one_whatever_the_case_the_file_names_them_in(run, tmp_path):
    code, out, err = run("apply", "-f", write(tmp_path, '''
[[users]]
username = "Dora"
password = "orbit-lantern-quiet"

[[installations]]
installation_id = "applied-dome"
name = "Applied dome"
kind = "observatory"
operators = ["DORA"]
'''))
    assert code == 0, err
    assert run("installations", "list", json_out=True)[1][0]["operators"] == ["dora"]  # stored under the key
    twice = '[[users]]\nusername = "carol"\npassword = "orbit-lantern-quiet"\n[[users]]\nusername = "CAROL"\n'
    code, _, err = run("apply", "-f", write(tmp_path, twice, "twice.toml"))
    assert code == 1 and "[[users]] #2 (username = 'CAROL'): username: user 'CAROL' is named twice" in err


def test_a_secret_below_the_one_minimum_length_is_refused_before_it_is_hashed(run, tmp_path):
    """The configuration's rule (identifiers.MIN_SECRET_LENGTH): the service sees only the
    digest, so the command line holds the secret to it, naming the entry."""
    wanted = write(tmp_path, FILE.replace('client_secret = "applied-app-secret-0123456789abcdef"',
                                          'client_secret = "x"'))
    code, out, err = run("apply", "-f", wanted, "--dry-run")
    assert code == 1 and out == ""
    assert f"{wanted}: [[clients]] #1 (client_id = 'applied-app'): client_secret: expected a secret of at least 32 " \
           "characters, not 1" in err
    assert run("clients", "list")[1].strip() == "no clients"


# -- a logo given as a path, as the configuration takes it ---------------------------------------

LOGO_PATH_CLIENT = '''
[[clients]]
client_id = "pathlogo"
name = "Path logo"
redirect_uris = ["https://pathlogo.example/cb"]
logo_url = "/static/demo-client.svg"
'''


def test_a_logo_given_as_a_path_is_served_here_on_the_store(run, config_path, tmp_path):
    served = config_module.load(config_path, environ={}).auth_url + "/static/demo-client.svg"
    wanted = write(tmp_path, LOGO_PATH_CLIENT)
    code, planned, err = run("apply", "-f", wanted, "--dry-run")
    assert code == 0, err
    assert f"    logo_url: {served}" in planned.splitlines()  # what the client will hold
    code, _, err = run("apply", "-f", wanted)
    assert code == 0, err
    assert run("clients", "show", "pathlogo", json_out=True)[1]["logoUrl"] == served
    assert run("apply", "-f", wanted)[1].splitlines()[-1] == "nothing to change (1 unchanged)"


@pytest.mark.process
def test_the_demos_own_logo_path_applies_over_the_api(service, credentials, tmp_path):
    admin = ["--url", service.admin]
    seeded = requests.get(service.base + "/oauth/clients/skyplanner", timeout=10).json()["logoUrl"]
    assert seeded == service.base + "/static/demo-client.svg"  # the configuration's logo, given as a URL
    # The demo's own table gives it as a path: the same logo, nothing to change.
    demo = write(tmp_path, '[[clients]]\nclient_id = "skyplanner"\nlogo_url = "/static/demo-client.svg"\n')
    assert ok(tokensvc("apply", "-f", demo, *admin, credentials=credentials)).splitlines() == [
        "unchanged client skyplanner", "nothing to change (1 unchanged)"]
    # A client of the admin API's own takes a path the same way.
    made = write(tmp_path, LOGO_PATH_CLIENT.replace("pathlogo", "pathlogo-api"), "made.toml")
    ok(tokensvc("apply", "-f", made, *admin, credentials=credentials))
    assert requests.get(service.base + "/oauth/clients/pathlogo-api", timeout=10).json()["logoUrl"] == seeded
    other = write(tmp_path, '[[clients]]\nclient_id = "pathlogo-api"\nlogo_url = "/static/other.svg"\n', "o.toml")
    planned = ok(tokensvc("apply", "-f", other, "--dry-run", *admin, credentials=credentials))
    assert planned.splitlines()[:2] == ["update client pathlogo-api",
                                        f"    logo_url: {seeded} -> {service.base}/static/other.svg"]
    applied = ok(tokensvc("apply", "-f", other, *admin, credentials=credentials))
    assert applied.splitlines() == planned.splitlines()[:-1] + ["applied: 1 changes"]
    shown = requests.get(service.base + "/oauth/clients/pathlogo-api", timeout=10).json()["logoUrl"]
    assert shown == service.base + "/static/other.svg"


# -- what ends the rights of the token apply runs with ---------------------------------------------

OPS_PASSWORD = "copper-meadow-signal"


def signed_in_admin(service, credentials, tmp_path, username: str) -> Path:
    """A second administrator (root's file makes them), signed in with ``tokensvc login``: the
    credentials file their token is kept in."""
    made = write(tmp_path, f'[[users]]\nusername = "{username}"\npassword = "{OPS_PASSWORD}"\nadmin = true\n',
                 f"{username}.toml")
    ok(tokensvc("apply", "-f", made, "--url", service.admin, credentials=credentials))
    path = tmp_path / username / "credentials.json"
    with pytest.MonkeyPatch.context() as patch, keyboard(patch) as typing:
        patch.setenv("TOKENSVC_CREDENTIALS", str(path))
        patch.setattr("webbrowser.open", functools.partial(sign_in_in_a_browser, username=username,
                                                           password=OPS_PASSWORD, typing=typing))
        assert cli.main(["login", "--url", service.admin, "--confirmation-stdin", "--json"]) == 0
    return path


def client_ids(service, credentials) -> set[str]:
    import json

    listed = ok(tokensvc("clients", "list", "--json", "--url", service.admin, credentials=credentials))
    return {client["clientId"] for client in json.loads(listed)}


@pytest.mark.process
@pytest.mark.parametrize("change", ["admin = false", 'password = "a-brand-new-long-passphrase"'])
def test_a_file_that_ends_its_runners_rights_applies_them_last(service, credentials, tmp_path, change):
    name = "ops" + str(len(change))
    mine = signed_in_admin(service, credentials, tmp_path, name)
    client = f"after-{name}"
    wanted = write(tmp_path, f'''
[[users]]
username = "{name}"
{change}

[[clients]]
client_id = "{client}"
name = "After {name}"
redirect_uris = ["https://after.example/cb"]
''')
    admin = ["--url", service.admin]
    planned = ok(tokensvc("apply", "-f", wanted, "--dry-run", *admin, credentials=mine)).splitlines()
    assert planned[0] == f"create client {client}"
    assert planned[3] == f"update user {name}"  # after everything else
    assert planned[5] == "    (applied last: it ends this token's rights)"
    result = tokensvc("apply", "-f", wanted, *admin, credentials=mine)
    assert result.returncode == 0, result.stderr  # true to what happened: every step applied
    assert result.stdout.splitlines() == planned[:-1] + [
        "applied: 2 changes", "(this token's rights have ended: sign in again with `tokensvc login`)"]
    assert client in client_ids(service, credentials)
    assert tokensvc("clients", "list", *admin, credentials=mine).returncode == 1  # as the plan said
    shown = json_user(service, credentials, name)
    assert shown["admin"] is (change != "admin = false")


def json_user(service, credentials, username: str) -> dict:
    import json

    listed = ok(tokensvc("users", "list", "--json", "--url", service.admin, credentials=credentials))
    return next(user for user in json.loads(listed) if user["username"] == username)


@pytest.mark.process
def test_demoting_and_rekeying_the_runner_at_once_is_refused(service, credentials, tmp_path):
    mine = signed_in_admin(service, credentials, tmp_path, "opsboth")
    wanted = write(tmp_path, '''
[[clients]]
client_id = "never-made"
name = "Never made"
redirect_uris = ["https://never.example/cb"]

[[users]]
username = "opsboth"
admin = false
password = "a-brand-new-long-passphrase"
''')
    for dry_run in (["--dry-run"], []):
        result = tokensvc("apply", "-f", wanted, *dry_run, "--url", service.admin, credentials=mine)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.splitlines() == [
            f"tokensvc: {wanted}: 1 problem; nothing was changed",
            f"{wanted}: [[users]] #1 (username = 'opsboth'): admin: 'opsboth' runs this: their demotion and their "
            "new password each end this token's rights, so one run cannot apply both; apply one, sign in again, "
            "then the other"]
    assert "never-made" not in client_ids(service, credentials)
    assert json_user(service, credentials, "opsboth")["admin"] is True


# -- a resource server: introspection and the feed, nothing else -------------------------------------

API_SECRET = "notes-api-secret-0123456789abcdef"
RESOURCE_SERVER = f'''
[[clients]]
client_id = "notes-api"
name = "Notes API"
kind = "resource-server"
client_secret = "{API_SECRET}"
'''


def test_a_resource_server_is_planned_applied_and_unchanged_the_second_time(run, mongo, tmp_path):
    from test_cli import stored

    wanted = write(tmp_path, RESOURCE_SERVER)
    code, planned, err = run("apply", "-f", wanted, "--dry-run")
    assert code == 0, err
    assert planned.splitlines() == [
        "create client notes-api", "    name: Notes API", "    kind: resource-server", "    client_secret: set",
        "plan: 1 to create, 0 to update, 0 unchanged, 0 to remove", "(dry run: nothing was changed)"]
    assert run("clients", "list")[1].strip() == "no clients"
    code, applied, err = run("apply", "-f", wanted)
    assert code == 0, err
    assert applied.splitlines() == planned.splitlines()[:-1] + ["applied: 1 changes"]
    shown = run("clients", "show", "notes-api", json_out=True)[1]
    assert (shown["kind"], shown["redirectUris"], shown["allowedScopes"], shown["firstParty"],
            shown["confidential"]) == ("resource-server", [], [], False, True)
    assert [client["secret_hash"] for client in stored(mongo, "clients")] == [hashing.digest(API_SECRET)]
    assert run("apply", "-f", wanted)[1].splitlines() == ["unchanged client notes-api",
                                                          "nothing to change (1 unchanged)"]


def test_a_resource_server_table_with_anything_of_the_flow_is_refused_in_the_files_words(run, tmp_path):
    assert run("apply", "-f", write(tmp_path, RESOURCE_SERVER))[0] == 0
    wanted = write(tmp_path, f'''
[[clients]]
client_id = "notes-api"
allowed_origins = ["https://notes.example"]

[[clients]]
client_id = "rs-redirect"
name = "RS redirect"
kind = "resource-server"
redirect_uris = ["https://rs.example/cb"]
client_secret = "{API_SECRET}"

[[clients]]
client_id = "rs-scoped"
name = "RS scoped"
kind = "resource-server"
allowed_scopes = ["read"]
client_secret = "{API_SECRET}"

[[clients]]
client_id = "rs-first"
name = "RS first"
kind = "resource-server"
first_party = true
client_secret = "{API_SECRET}"

[[clients]]
client_id = "rs-secretless"
name = "RS secretless"
kind = "resource-server"
''', "wrong.toml")
    feed_only = "it only introspects tokens and reads the revocation feed"
    for dry in (["--dry-run"], []):
        code, out, err = run("apply", "-f", wanted, *dry)
        assert code == 1 and out == "", err
        assert err.splitlines() == [
            f"tokensvc: {wanted}: 5 problems; nothing was changed",
            f"{wanted}: [[clients]] #1 (client_id = 'notes-api'): allowed_origins: a resource server has no web "
            f"origin: {feed_only}",
            f"{wanted}: [[clients]] #2 (client_id = 'rs-redirect'): redirect_uris: a resource server has no "
            f"redirect URI: {feed_only}",
            f"{wanted}: [[clients]] #3 (client_id = 'rs-scoped'): allowed_scopes: a resource server has no scope: "
            f"{feed_only}",
            f"{wanted}: [[clients]] #4 (client_id = 'rs-first'): first_party: a resource server has no first-party "
            f"flag: {feed_only}",
            # a secret apply made could be shown to no one
            f"{wanted}: [[clients]] #5 (client_id = 'rs-secretless'): a resource server is confidential: give "
            "client_secret or client_secret_sha256"]
    assert [client["clientId"] for client in run("clients", "list", json_out=True)[1]] == ["notes-api"]


TURNCOAT_SECRET = "turncoat-secret-0123456789abcdef"
TURNCOAT = f'''
[[clients]]
client_id = "turncoat"
name = "Turncoat"
redirect_uris = ["http://127.0.0.1:1/callback"]
first_party = true
client_secret = "{TURNCOAT_SECRET}"
'''
AS_RESOURCE_SERVER = '''
[[clients]]
client_id = "turncoat"
kind = "resource-server"
redirect_uris = []
first_party = false
'''
AS_CLIENT = '''
[[clients]]
client_id = "turncoat"
kind = "client"
redirect_uris = ["http://127.0.0.1:1/callback"]
'''


def introspected(service, token: str, client_id: str, secret: str) -> requests.Response:
    return requests.post(service.base + "/oauth/token/introspect", data={"token": token}, auth=(client_id, secret),
                         timeout=10)


@pytest.mark.process
def test_a_change_of_kind_keeps_a_resource_server_to_introspection_and_the_feed(service, credentials, tmp_path):
    """A client made a resource server keeps its id and secret, and nothing of the flow: the
    file says so (its redirect URIs and first-party flag emptied; its scopes go with the kind),
    and every token it was issued is out of force at once, for good. Made a client again, it
    starts from nothing (the scopes of a client given none: read). The plan says each of it;
    the admin API (PATCH, the same checks) carries it out."""
    admin = ["--url", service.admin]

    def apply(text: str, name: str, *options: str) -> list[str]:
        return ok(tokensvc("apply", "-f", write(tmp_path, text, name), *options, *admin,
                           credentials=credentials)).splitlines()

    apply(TURNCOAT, "turncoat.toml")
    issued = code_for(service, "turncoat", TURNCOAT_SECRET)
    assert issued["status"] == 200
    assert introspected(service, issued["access_token"], "turncoat", TURNCOAT_SECRET).json()["active"] is True
    # Only the kind: what a client has and a resource server may not is named in the file's words.
    partial = write(tmp_path, '[[clients]]\nclient_id = "turncoat"\nkind = "resource-server"\n', "partial.toml")
    refused = tokensvc("apply", "-f", partial, *admin, credentials=credentials)
    assert refused.returncode == 1 and refused.stderr.splitlines()[1:] == [
        f"{partial}: [[clients]] #1 (client_id = 'turncoat'): redirect_uris: a resource server has no redirect URI: "
        "it only introspects tokens and reads the revocation feed"]
    planned = apply(AS_RESOURCE_SERVER, "rs.toml", "--dry-run")
    assert planned == [
        "update client turncoat", "    kind: client -> resource-server",
        "    redirect_uris: http://127.0.0.1:1/callback -> -", "    allowed_scopes: read -> -",
        "    first_party: yes -> no", "plan: 0 to create, 1 to update, 0 unchanged, 0 to remove",
        "(dry run: nothing was changed)"]
    assert apply(AS_RESOURCE_SERVER, "rs.toml") == planned[:-1] + ["applied: 1 changes"]
    assert apply(AS_RESOURCE_SERVER, "rs.toml") == ["unchanged client turncoat", "nothing to change (1 unchanged)"]
    # Its own token is dead; its secret still proves it, for introspection alone.
    assert introspected(service, issued["access_token"], "turncoat", TURNCOAT_SECRET).json() == {"active": False}
    assert requests.get(service.base + "/v1/me", headers={"Authorization": f"Bearer {issued['access_token']}"},
                        timeout=10).status_code == 401
    refresh = requests.post(service.base + "/oauth/token/refresh", auth=("turncoat", TURNCOAT_SECRET),
                            data={"refresh_token": issued["refresh_token"]}, timeout=10)
    assert refresh.status_code == 400 and refresh.json()["error"] == "unauthorized_client"
    # Back to a client: as the file describes it, from nothing; its tokens of before stay dead.
    planned = apply(AS_CLIENT, "client.toml", "--dry-run")
    assert planned[:4] == ["update client turncoat", "    kind: resource-server -> client",
                           "    redirect_uris: - -> http://127.0.0.1:1/callback", "    allowed_scopes: - -> read"]
    assert apply(AS_CLIENT, "client.toml") == planned[:-1] + ["applied: 1 changes"]
    assert introspected(service, issued["access_token"], "webapp", WEBAPP_SECRET).json() == {"active": False}
    answer = introspected(service, issued["access_token"], "turncoat", TURNCOAT_SECRET)
    assert answer.status_code == 403  # a third-party client: it no longer introspects
    assert code_for(service, "turncoat", TURNCOAT_SECRET)["status"] == 200
    ok(tokensvc("clients", "remove", "turncoat", *admin, credentials=credentials))


def test_a_file_that_never_ends_or_starts_with_a_byte_order_mark_is_one_line(run, tmp_path):
    """``apply -f`` reads its file as ``--config`` is read: a device or a pipe is refused before
    it is read (``/dev/zero`` was read without end, its memory growing), a byte order mark is
    named (it was a TOML error at line 1), a directory is one line too."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        code, out, err = run("apply", "-f", path)
        assert code == 1 and out == "" and err == f"tokensvc: {path}: not a regular file (give the TOML file with -f)\n"
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + FILE.encode())
    code, out, err = run("apply", "-f", str(bom))
    assert code == 1 and err == (f"tokensvc: {bom}: starts with a UTF-8 byte order mark, which TOML does not take: "
                                 "save it as UTF-8 without one\n")
    code, out, err = run("apply", "-f", str(tmp_path))
    assert code == 1 and err == f"tokensvc: {tmp_path}: a directory, not a file (give the TOML file with -f)\n"


def test_a_resource_moved_to_a_client_named_first_is_refused_saying_to_name_the_giver_first(run, tmp_path):
    """A plan is checked and applied in its order: a resource another client of the plan gives
    up is taken only after it, and the refusal says so; listed the other way, it applies."""
    for client_id, uri in (("a-api", "https://shared.example"), ("b-api", "https://b.example")):
        code, _, err = run("clients", "add", "--kind", "resource-server", "--name", client_id, "--client-id",
                           client_id, "--resource", uri)
        assert code == 0, err
    entries = {client_id: (f'[[clients]]\nclient_id = "{client_id}"\nresources = [{uris}]\n')
               for client_id, uris in (("b-api", '"https://b.example", "https://shared.example"'),
                                       ("a-api", '"https://a.example"'))}
    wanted = write(tmp_path, entries["b-api"] + entries["a-api"])
    code, out, err = run("apply", "-f", wanted)
    assert code == 1 and out == "", err
    assert ("'https://shared.example' is declared by client 'a-api' (as 'https://shared.example'): a resource URI is "
            "one resource server's; if 'a-api' gives it up later in this plan, name 'a-api' before 'b-api'") in err, err
    wanted = write(tmp_path, entries["a-api"] + entries["b-api"])
    code, out, err = run("apply", "-f", wanted)
    assert code == 0, err
    assert run("clients", "show", "b-api", json_out=True)[1]["resources"] == ["https://b.example",
                                                                            "https://shared.example"]


def test_a_stored_resource_uri_not_in_canonical_form_is_rewritten_by_apply(run, mongo, tmp_path):
    """A store written before declared URIs had to be canonical: ``apply`` writes the form the
    warning names, and an apply leaving the URI as stored says which form to write."""
    import asyncio

    from test_cli import stored

    asyncio.run(mongo["tokensvc"]["clients"].insert_one({
        "_id": "notes-api", "name": "Notes API", "redirect_uris": [], "allowed_scopes": [], "kind": "resource-server",
        "secret_hash": "h", "resources": ["HTTPS://Notes.example:443/"]}))
    kept = write(tmp_path, '[[clients]]\nclient_id = "notes-api"\ndescription = "Notes"\n', "kept.toml")
    code, _, err = run("apply", "-f", kept)
    assert code == 1 and "write it in canonical form: https://notes.example" in err, err
    fixed = write(tmp_path, '[[clients]]\nclient_id = "notes-api"\nresources = ["https://notes.example"]\n')
    code, _, err = run("apply", "-f", fixed)
    assert code == 0, err
    assert stored(mongo, "clients")[0]["resources"] == ["https://notes.example"]
