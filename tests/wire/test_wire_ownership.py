"""One source of truth for clients and users (docs/guide/administration.md, "Who owns an entry"):
the entries the configuration file names are the file's, and the admin API refuses to change
them (409, naming the file); every other entry is the admin API's, and no start-up writes it.
So no restart, of one worker, of an instance, or of all of them, brings back anything an admin
change did: a demotion, a password reset, a secret rotation, narrowed scopes, a removal. Two
instances (``--processes 2`` and one process) with one configuration, on the wire tier's MongoDB,
changed through the admin API as an operator does (the command line with ``--url``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from helpers import wait_until
from primary import ReplicaSet
from service import WEBAPP_SECRET, Service, access_token, hidden_fields, start_service

pytestmark = pytest.mark.e2e

OPS_SECRET = "ops-console-secret-0123456789abcdef-0123"
PASSWORDS = {"root": "quartz-river-beacon", "dana": "amber-falcon-ridge", "alice": "violet-tide-anchor",
             "erin": "maple-harbor-signal", "gil": "cobalt-willow-stream", "frank": "saffron-delta-lantern"}
NEW_PASSWORD = "indigo-glacier-compass"
# The file: service.CONFIG's clients and users (webapp, skyplanner, node-agent; alice, bob), and these.
FILE = f'''
[[users]]
username = "root"
password = "{PASSWORDS["root"]}"
admin = true

[[users]]
username = "dana"
password = "{PASSWORDS["dana"]}"
admin = true

[[clients]]
client_id = "ops-console"
name = "Ops console"
redirect_uris = ["https://ops.example/cb"]
allowed_scopes = ["read", "admin"]
first_party = true
client_secret = "{OPS_SECRET}"
'''


def storage(primary: ReplicaSet) -> str:
    return f'[storage]\nbackend = "mongodb"\nmongodb_uri = "{primary.uri()}"\ntimeout_ms = 3000\n'


def tokensvc(service: Service, token: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """An operator command against ``service``'s admin API with ``token``."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    return subprocess.run([sys.executable, "-m", "tokensvc", *args, "--url", service.admin], input=stdin,
                          capture_output=True, text=True, timeout=120,
                          env={**environ, "TOKENSVC_ADMIN_TOKEN": token})


def admin(service: Service, token: str, method: str, path: str, body: dict | None = None,
          status: int = 200) -> dict:
    """A call of ``service``'s admin API with ``token``, answered ``status``."""
    answer = requests.request(method, service.admin + path, json=body, timeout=30,
                              headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == status, (method, path, answer.status_code, answer.text)
    return answer.json()


def signs_in(service: Service, username: str, password: str) -> bool:
    """Whether the sign-in form takes ``password`` for ``username``."""
    browser = requests.Session()
    form = hidden_fields(browser.get(service.base + "/login", timeout=30).text)
    answer = browser.post(service.base + "/login", data={**form, "username": username, "password": password},
                          allow_redirects=False, timeout=30)
    assert answer.status_code in (302, 303, 401), answer.text
    return answer.status_code != 401


def proves(service: Service, client_id: str, secret: str) -> bool:
    """Whether ``secret`` authenticates ``client_id`` (RFC 7009's endpoint: 200 for any token,
    401 for wrong credentials)."""
    answer = requests.post(service.base + "/oauth/token/revoke", timeout=30,
                           data={"token": "x" * 43, "client_id": client_id, "client_secret": secret})
    assert answer.status_code in (200, 401), answer.text
    return answer.status_code == 200


def scopes(service: Service, client_id: str) -> list[str] | None:
    answer = requests.get(f"{service.base}/oauth/clients/{client_id}", timeout=30)
    return answer.json()["allowedScopes"] if answer.status_code == 200 else None


def seeded(service: Service) -> int:
    """How many processes of ``service`` have seeded the store from the file (a worker started
    again seeds too, before it serves)."""
    return service.output().count("seeded ")


def start(tmp_path: Path, name: str, primary: ReplicaSet, *args: str) -> Service:
    directory = tmp_path / name
    directory.mkdir()
    return start_service(directory, storage(primary), extra=FILE, args=args).wait_ready()


def test_no_restart_brings_back_what_an_admin_change_did(tmp_path):
    primary = ReplicaSet().start()
    services: list[Service] = []
    try:
        first = start(tmp_path, "a", primary, "--processes", "2")
        second = start(tmp_path, "b", primary)
        services += [first, second]
        token = access_token(first.base, "ops-console", "https://ops.example/cb", "read admin", "root",
                             PASSWORDS["root"], OPS_SECRET)

        # Entries of the admin API's own, made through it.
        for name, is_admin in (("erin", True), ("gil", False), ("frank", False)):
            admin(first, token, "POST", "/admin/users", {"username": name, "password": PASSWORDS[name],
                                                         "admin": is_admin}, 201)
        old_secret = admin(first, token, "POST", "/admin/clients", {
            "clientId": "api-app", "name": "API app", "redirectUris": ["https://api-app.example/cb"],
            "allowedScopes": ["read", "write"], "confidential": True}, 201)["clientSecret"]
        admin(first, token, "POST", "/admin/clients", {"clientId": "gone-app", "name": "Gone app",
                                                       "redirectUris": ["https://gone.example/cb"]}, 201)

        # Each change to an entry of the file is refused, naming the file; nothing is changed.
        changes = [("PATCH", "/admin/users/{}", {"admin": False}),
                   ("PUT", "/admin/users/{}/password", {"password": NEW_PASSWORD}),
                   ("POST", "/admin/clients/{}/secret", {}),
                   ("PATCH", "/admin/clients/{}", {"allowedScopes": ["read"]}),
                   ("DELETE", "/admin/clients/{}", None), ("DELETE", "/admin/users/{}", None)]
        for (method, path, body), name in zip(changes, ("dana", "alice", "webapp", "skyplanner", "node-agent", "bob"),
                                              strict=True):
            refused = admin(second, token, method, path.format(name), body, 409)["detail"]
            assert "written by the configuration file" in refused and str(second.config) in refused, refused
        # The command line says so too, apply included.
        narrowed = tmp_path / "narrowed.toml"
        narrowed.write_text('[[clients]]\nclient_id = "skyplanner"\nallowed_scopes = ["read"]\n')
        for command in (["users", "set-admin", "dana", "no"], ["apply", "-f", str(narrowed)]):
            refused = tokensvc(second, token, *command)
            assert refused.returncode == 1 and "is written by the configuration file" in refused.stderr, refused

        # The same changes to the admin API's entries.
        new_secret = ""
        for (method, path, body), name in zip(changes, ("erin", "gil", "api-app", "api-app", "gone-app", "frank"),
                                              strict=True):
            answer = admin(second, token, method, path.format(name), body)
            new_secret = answer.get("clientSecret") or new_secret

        def nothing_came_back(service: Service) -> None:
            users = {user["username"]: user["admin"] for user in admin(service, token, "GET", "/admin/users")["items"]}
            assert users["erin"] is False and users["dana"] is True and "frank" not in users and "bob" in users
            assert signs_in(service, "gil", NEW_PASSWORD) and not signs_in(service, "gil", PASSWORDS["gil"])
            assert signs_in(service, "alice", PASSWORDS["alice"]) and not signs_in(service, "alice", NEW_PASSWORD)
            assert proves(service, "api-app", new_secret) and not proves(service, "api-app", old_secret)
            assert proves(service, "webapp", WEBAPP_SECRET)
            assert scopes(service, "api-app") == ["read"]
            assert scopes(service, "skyplanner") == ["read", "observations:write"]
            assert scopes(service, "gone-app") is None and scopes(service, "node-agent") is not None

        nothing_came_back(first)

        # A worker of the first instance dies (a crash, an out-of-memory kill) and is started again.
        before = seeded(first)
        worker = int(first.output().split("worker 0 started (pid ")[1].split(")")[0])
        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: seeded(first) > before, "the worker started again, having seeded the store")
        nothing_came_back(first)

        # The second instance is restarted.
        second.stop()
        services.remove(second)
        second = start(tmp_path, "b-again", primary)
        services.append(second)
        nothing_came_back(second)

        # Every one of them is restarted.
        for service in services:
            service.stop()
        services.clear()
        services += [start(tmp_path, "a-again", primary, "--processes", "2"), start(tmp_path, "b-third", primary)]
        for service in services:
            nothing_came_back(service)
    finally:
        for service in services:
            output = service.stop()
            assert "Traceback" not in output, output
        primary.stop()


def on_the_store(config: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """An operator command straight on the store of ``config`` (no ``--url``)."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    return subprocess.run([sys.executable, "-m", "tokensvc", *args, "--config", str(config)], input=stdin,
                          capture_output=True, text=True, timeout=120, env=environ)


def test_a_command_on_the_store_given_another_file_changes_no_entry_of_the_deployments_file(tmp_path):
    """The command line on a store reads the file it is given (``--config``), not the running
    deployment's. Given another, which names none of the deployment's entries, it changed them
    all the same, and the next restart wrote the file's values back (a rotated secret reverted,
    with the new one handed out). The store says which entries a file writes: each change is
    refused in one line naming the deployment's file, nothing changes, and a restart changes
    nothing either."""
    primary = ReplicaSet().start()
    services: list[Service] = []
    try:
        service = start(tmp_path, "a", primary)
        services.append(service)
        other = tmp_path / "other.toml"
        other.write_text(f'cookie_secret = "another-file-cookie-secret-0123456789"\n{storage(primary)}')
        narrowed = tmp_path / "narrowed.toml"
        narrowed.write_text('[[clients]]\nclient_id = "skyplanner"\nallowed_scopes = ["read"]\n')
        for command, stdin in ((["clients", "rotate-secret", "webapp"], None),
                               (["clients", "remove", "node-agent"], None),
                               (["users", "set-admin", "dana", "no"], None),
                               (["users", "set-password", "alice", "--password-stdin"], NEW_PASSWORD + "\n"),
                               (["users", "remove", "bob"], None),
                               (["apply", "-f", str(narrowed)], None)):
            refused = on_the_store(other, *command, stdin=stdin)
            assert refused.returncode == 1, refused
            assert f"is written by the configuration file {service.config} at every start" in refused.stderr, refused
            assert "Traceback" not in refused.stderr, refused.stderr
            if command[0] != "apply":  # which says how many problems its file has, then each
                assert refused.stderr.count("\n") == 1, refused.stderr

        def nothing_changed(service: Service) -> None:
            listed = on_the_store(other, "users", "list", "--json")
            assert listed.returncode == 0, listed
            users = {user["username"]: user["admin"] for user in json.loads(listed.stdout)}
            assert users["dana"] is True and "bob" in users
            assert proves(service, "webapp", WEBAPP_SECRET)
            assert signs_in(service, "alice", PASSWORDS["alice"]) and not signs_in(service, "alice", NEW_PASSWORD)
            assert scopes(service, "skyplanner") == ["read", "observations:write"]
            assert scopes(service, "node-agent") is not None

        nothing_changed(service)
        service.stop()
        services.remove(service)
        service = start(tmp_path, "a-again", primary)
        services.append(service)
        nothing_changed(service)
    finally:
        for service in services:
            output = service.stop()
            assert "Traceback" not in output, output
        primary.stop()
