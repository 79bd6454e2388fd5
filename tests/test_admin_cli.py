"""The admin listener and the command line on top of it, as an operator meets them: a running
``tokensvc serve`` (memory backend) in a process of its own, ``tokensvc login`` through a
loopback redirect, and the operator commands run as processes with ``--url``."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import secrets
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session
from service import free_port, start_service, user_agent_authorize

from tokensvc import config
from tokensvc.app import ADMIN_ROUTES
from tokensvc.cli import main as cli

pytestmark = pytest.mark.e2e

ROOT = '\n[[users]]\nusername = "root"\npassword = "quartz-river-beacon"\nadmin = true\n'


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    service = start_service(tmp_path_factory.mktemp("admin"), extra=ROOT)
    yield service
    output = service.stop()
    assert service.returncode == 0, output
    assert "quartz-river-beacon" not in output


def sign_in_in_a_browser(url: str, username: str = "root", password: str = "quartz-river-beacon",
                         typing: TextIO | None = None) -> None:
    """What the operator does in the browser ``tokensvc login`` opened: sign in, type the
    confirmation code the page shows where the command line reads it (``typing``), answer the
    page, and land on the command line's loopback port (in a thread: the command line serves it
    meanwhile)."""

    def typed(code: str) -> None:
        if typing is not None:
            typing.write(code + "\n")
            typing.flush()

    def browse() -> None:
        landed = user_agent_authorize(url, username=username, password=password, read=typed)
        requests.get(landed, timeout=10)

    threading.Thread(target=browse, daemon=True).start()


@contextlib.contextmanager
def keyboard(patch: pytest.MonkeyPatch) -> Iterator[TextIO]:
    """Standard input of ``tokensvc login --confirmation-stdin`` in this process: a pipe whose
    other end the test types into; closed at the end, so that a question left open ends."""
    reading, writing = (os.fdopen(end, mode) for end, mode in zip(os.pipe(), ("r", "w"), strict=True))
    patch.setattr("sys.stdin", reading)
    try:
        yield writing
    finally:
        writing.close()


@pytest.fixture(scope="module")
def credentials(service, tmp_path_factory):
    """``tokensvc login`` as root, in process (its browser played by requests, the confirmation
    code typed on its standard input); the file it keeps."""
    path = tmp_path_factory.mktemp("home") / "tokensvc" / "credentials.json"
    with pytest.MonkeyPatch.context() as patch, keyboard(patch) as typing:
        patch.setenv("TOKENSVC_CREDENTIALS", str(path))
        patch.setattr("webbrowser.open", lambda url: sign_in_in_a_browser(url, typing=typing))
        assert cli.main(["login", "--url", service.admin, "--confirmation-stdin", "--json"]) == 0
    return path


def tokensvc(*args: str, credentials: Path | None = None, stdin: str | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    if credentials is not None:
        environ["TOKENSVC_CREDENTIALS"] = str(credentials)
    return subprocess.run([sys.executable, "-m", "tokensvc", *args], capture_output=True, text=True, timeout=60,
                          input=stdin, env={**environ, **(env or {})})


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def example(path: str) -> str:
    return re.sub(r"\{[a-z_]+\}", "x", path)


# -- the listener -------------------------------------------------------------------------------


def test_serve_starts_the_admin_listener_and_says_where(service):
    index = requests.get(service.admin + "/admin", timeout=10)
    assert index.status_code == 200 and index.json()["cliClientId"] == "tokensvc-cli"
    assert f"admin API:          {service.admin}/admin (tokensvc login --url {service.admin})" in service.output()


def test_the_public_port_never_serves_an_admin_path(service):
    for route in ADMIN_ROUTES:
        if route.path == "/openapi.json":
            continue
        for method in sorted(route.methods - {"HEAD", "OPTIONS"}):
            response = requests.request(method, service.base + example(route.path), timeout=10,
                                        headers={"Accept": "application/json"})
            assert response.status_code == 404, (method, route.path)
    document = requests.get(service.base + "/openapi.json", timeout=10).json()
    assert not [path for path in document["paths"] if path.startswith("/admin")]


def test_a_busy_admin_port_is_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = tokensvc("serve", "--config", "config/tokensvc.toml", "--port", str(free_port()),
                          env={"TOKENSVC_ADMIN_PORT": str(port)})
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (f"tokensvc: 127.0.0.1:{port} is already in use; choose another with admin.port or "
                             "TOKENSVC_ADMIN_PORT (0: no admin listener)\n")


def test_a_remote_admin_listener_must_be_asked_for(tmp_path):
    with pytest.raises(config.ConfigError, match="admin.host: '0.0.0.0' is not a loopback address"):
        config.load(None, environ={"TOKENSVC_ADMIN_HOST": "0.0.0.0"}, overrides={"demo": True})
    service = start_service(tmp_path, env={"TOKENSVC_ADMIN_HOST": "0.0.0.0", "TOKENSVC_ADMIN_ALLOW_REMOTE": "true"})
    try:
        assert requests.get(service.admin + "/admin", timeout=10).status_code == 200
    finally:
        output = service.stop()
    assert "beyond this machine: keep it behind TLS and a network policy" in output


def test_admin_port_zero_turns_the_listener_off():
    settings = config.load(None, environ={"TOKENSVC_ADMIN_PORT": "0"}, overrides={"demo": True,
                                                                                  "port": free_port()})
    listeners = cli.bind(settings)
    try:
        assert listeners.admin == [] and len(listeners.public) >= 1
    finally:
        for sock in listeners.public:
            sock.close()
    # Beside the public port unless told otherwise, and never on it.
    assert config.load(None, overrides={"demo": True, "port": 9000}).admin.port == 9001
    with pytest.raises(config.ConfigError, match="a port of its own"):
        config.load(None, environ={"TOKENSVC_ADMIN_PORT": "9000"}, overrides={"demo": True, "port": 9000})


# -- tokensvc login -----------------------------------------------------------------------------


def test_login_keeps_the_refresh_token_for_its_owner_alone(service, credentials):
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert stat.S_IMODE(credentials.parent.stat().st_mode) == 0o700
    stored = json.loads(credentials.read_text())[service.admin]
    assert stored["client_id"] == "tokensvc-cli" and len(stored["refresh_token"]) > 40
    # Each command refreshes it, and keeps the rotated one (the old one is spent).
    listed = json.loads(ok(tokensvc("users", "list", "--url", service.admin, "--json", credentials=credentials)))
    assert "root" in [user["username"] for user in listed]
    assert json.loads(credentials.read_text())[service.admin]["refresh_token"] != stored["refresh_token"]
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600


def test_the_command_line_reaches_a_loopback_service_whatever_proxy_the_environment_names(service, credentials):
    """A proxy in the operator's environment (here one that refuses every connection), with no
    no_proxy to exempt loopback, never carries the command line's requests to a service on this
    host."""
    dead = "http://127.0.0.1:9"
    proxies = {name: dead for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                                       "ALL_PROXY")}
    listed = json.loads(ok(tokensvc("users", "list", "--url", service.admin, "--json", credentials=credentials,
                                    env={**proxies, "no_proxy": "", "NO_PROXY": ""})))
    assert "root" in [user["username"] for user in listed]


def test_login_as_someone_who_is_not_an_admin_is_refused_in_one_line(service, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOKENSVC_CREDENTIALS", str(tmp_path / "credentials.json"))
    monkeypatch.setattr("webbrowser.open", lambda url: sign_in_in_a_browser(url, "alice", "violet-tide-anchor"))
    with keyboard(monkeypatch):
        assert cli.main(["login", "--url", service.admin, "--confirmation-stdin"]) == 1
    prompt, address, *asked, refusal = capsys.readouterr().err.splitlines()
    assert prompt == "Sign in as an administrator in your browser:"
    assert address.strip().startswith(service.base + "/oauth/authorize?response_type=code&client_id=tokensvc-cli")
    assert asked[0].startswith("The page shows a confirmation code: type it here")
    assert refusal == "tokensvc: the service refused: The admin scope is for administrators only"
    assert not (tmp_path / "credentials.json").exists()


def test_without_a_sign_in_the_command_says_how(service, tmp_path):
    result = tokensvc("clients", "list", "--url", service.admin, credentials=tmp_path / "none.json")
    assert result.returncode == 1
    assert result.stderr == (f"tokensvc: not signed in to {service.admin}: run `tokensvc login --url "
                             f"{service.admin}` (or give --token)\n")


# -- the operator commands against the running service -------------------------------------------


def test_a_client_through_its_whole_life_from_the_command_line(service, credentials, tmp_path):
    admin = ["--url", service.admin, "--json"]
    added = json.loads(ok(tokensvc("clients", "add", "--name", "Dome camera", "--redirect-uri",
                                   "http://127.0.0.1:4/cb", "--scope", "read", "--first-party", "--confidential",
                                   *admin, credentials=credentials)))
    client_id, secret = added["clientId"], added["clientSecret"]

    def authorize() -> dict:
        app = OAuth2Session(client_id, secret, scope="read", redirect_uri="http://127.0.0.1:4/cb",
                            code_challenge_method="S256")
        verifier = secrets.token_urlsafe(48)
        url, _ = app.create_authorization_url(service.base + "/oauth/authorize", code_verifier=verifier)
        return app.fetch_token(service.base + "/oauth/token", authorization_response=user_agent_authorize(url),
                               code_verifier=verifier)

    def works(token: str) -> bool:
        return requests.get(service.base + "/v1/me", headers={"Authorization": f"Bearer {token}"},
                            timeout=10).status_code == 200

    first = authorize()
    assert works(first["access_token"])
    grants = json.loads(ok(tokensvc("grants", "list", "--client", client_id, *admin, credentials=credentials)))
    assert len(grants) == 1 and grants[0]["scopes"] == ["read"]
    ok(tokensvc("grants", "revoke", grants[0]["grantId"], "--url", service.admin, credentials=credentials))
    assert not works(first["access_token"])

    second = authorize()
    assert works(second["access_token"])
    removed = json.loads(ok(tokensvc("clients", "remove", client_id, *admin, credentials=credentials)))
    assert removed == {"removed": client_id, "grantsRevoked": 1}
    assert not works(second["access_token"])
    refreshed = requests.post(service.base + "/oauth/token/refresh", auth=(client_id, secret), timeout=10,
                              data={"grant_type": "refresh_token", "refresh_token": second["refresh_token"]})
    assert refreshed.status_code == 401
    missing = tokensvc("clients", "show", client_id, "--url", service.admin, credentials=credentials)
    assert missing.returncode == 1 and missing.stderr == f"tokensvc: no client with id '{client_id}'\n"


def test_users_sessions_and_tokens_from_the_command_line(service, credentials):
    admin = ["--url", service.admin]
    ok(tokensvc("users", "add", "carol", "--password-stdin", *admin, stdin="violet-comet-harbor\n",
                credentials=credentials))
    browser = requests.Session()
    login = browser.get(service.base + "/login", timeout=10)
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', login.text)[1]
    browser.post(service.base + "/login", data={"username": "carol", "password": "violet-comet-harbor",
                                                 "_xsrf": xsrf, "next": "/account"}, timeout=10)
    assert browser.get(service.base + "/account", allow_redirects=False, timeout=10).status_code == 200
    listed = json.loads(ok(tokensvc("sessions", "list", "carol", *admin, "--json", credentials=credentials)))
    assert len(listed) == 1 and listed[0]["browser"]
    assert "1 session of carol ended" in ok(tokensvc("sessions", "end", "carol", listed[0]["id"], *admin,
                                                     credentials=credentials))
    signed_out = browser.get(service.base + "/account", allow_redirects=False, timeout=10)
    assert signed_out.status_code == 303 and signed_out.headers["Location"].startswith("/login")
    assert "is an administrator" in ok(tokensvc("users", "set-admin", "carol", "yes", *admin, credentials=credentials))
    ok(tokensvc("users", "remove", "carol", *admin, credentials=credentials))

    app = OAuth2Session("webapp", "e2e-webapp-secret-0123456789abcdef", scope="read", redirect_uri="http://127.0.0.1:1/callback",
                        code_challenge_method="S256")
    verifier = secrets.token_urlsafe(48)
    url, _ = app.create_authorization_url(service.base + "/oauth/authorize", code_verifier=verifier)
    tokens = app.fetch_token(service.base + "/oauth/token", authorization_response=user_agent_authorize(url),
                             code_verifier=verifier)
    assert ok(tokensvc("tokens", "revoke", "--token-stdin", *admin, stdin=tokens["refresh_token"] + "\n",
                       credentials=credentials)).strip() == "revoked"
    assert requests.get(service.base + "/v1/me", headers={"Authorization": f"Bearer {tokens['access_token']}"},
                        timeout=10).status_code == 401
    purged = ok(tokensvc("tokens", "purge", *admin, credentials=credentials))
    assert purged.startswith("purged ") and "purges its expired codes, tokens and sessions itself" in purged


def cli_tokens(service) -> dict:
    """The command line client's tokens for root: one authorization (the one-click page
    answered), its code exchanged with the confirmation code the page showed."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    redirect = "http://127.0.0.1:5/callback"  # any loopback port of the CLI's client
    url = service.base + "/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": "tokensvc-cli", "redirect_uri": redirect, "scope": "admin",
        "state": "s", "code_challenge": challenge, "code_challenge_method": "S256"})
    shown: list[str] = []
    landed = user_agent_authorize(url, username="root", password="quartz-river-beacon", read=shown.append)
    code = parse_qs(urlsplit(landed).query)["code"]
    return requests.post(service.base + "/oauth/token", timeout=10, data={
        "grant_type": "authorization_code", "code": code[0], "redirect_uri": redirect, "code_verifier": verifier,
        "client_id": "tokensvc-cli", "confirmation_code": shown[0]}).json()


def test_headless_automation_with_a_refresh_token_file(service, tmp_path):
    """The spec's recipe: one authorization as a known admin, then the stored refresh token."""
    tokens = cli_tokens(service)
    # An access token alone, from the environment (until a refresh replaces it).
    with_token = tokensvc("clients", "show", "webapp", "--url", service.admin,
                          env={"TOKENSVC_ADMIN_TOKEN": tokens["access_token"]})
    assert "Web app" in ok(with_token)
    stored = tmp_path / "refresh-token"
    stored.write_text(tokens["refresh_token"] + "\n")
    args = ["clients", "show", "webapp", "--url", service.admin, "--refresh-token", str(stored)]
    assert "Web app" in ok(tokensvc(*args, env={"TOKENSVC_ADMIN_CLIENT_ID": "tokensvc-cli"}))
    assert stored.read_text().strip() != tokens["refresh_token"]  # rotated, and kept
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert "Web app" in ok(tokensvc(*args, "--token-client-id", "tokensvc-cli"))
    refused = tokensvc("clients", "show", "webapp", "--url", service.admin, "--token", "made-up")
    assert refused.returncode == 1 and refused.stderr.startswith("tokensvc: not allowed (401)")


def test_parallel_commands_share_one_chain(service, credentials):
    """Each command rotates the stored refresh token: eight at once on one credentials file
    take turns under its lock, each refreshing from the token the one before kept, so none
    presents a spent one (which would revoke the chain and sign the operator out)."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    environ["TOKENSVC_CREDENTIALS"] = str(credentials)
    running = [subprocess.Popen([sys.executable, "-m", "tokensvc", "users", "list", "--url", service.admin, "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
               for _ in range(8)]
    for process in running:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        assert "root" in [user["username"] for user in json.loads(out)]
    assert "root" in ok(tokensvc("users", "list", "--url", service.admin, credentials=credentials))
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600


def test_a_kept_token_is_written_0600_whatever_was_there_and_never_through_a_link(service, tmp_path):
    stored = tmp_path / "refresh-token"
    stored.write_text(cli_tokens(service)["refresh_token"] + "\n")
    stored.chmod(0o666)  # as a careless copy left it
    victim = tmp_path / "elsewhere"
    victim.write_text("untouched\n")
    (tmp_path / "refresh-token.partial").symlink_to(victim)  # planted where the new text is written
    args = ["clients", "show", "webapp", "--url", service.admin, "--refresh-token", str(stored),
            "--token-client-id", "tokensvc-cli"]
    assert "Web app" in ok(tokensvc(*args))
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600 and not stored.is_symlink()
    assert victim.read_text() == "untouched\n" and not (tmp_path / "refresh-token.partial").exists()
    linked = tmp_path / "linked-token"
    linked.symlink_to(stored)  # a link in the token's place is not read through
    refused = tokensvc(*[str(linked) if arg == str(stored) else arg for arg in args])
    assert refused.returncode == 1 and "a link is never followed" in refused.stderr
    assert "Web app" in ok(tokensvc(*args))  # the chain is whole


def test_a_resource_server_from_the_command_line(service, credentials):
    """``clients add --kind resource-server`` needs no redirect URI: a secret, and nothing else."""
    admin = ["--url", service.admin]
    text = ok(tokensvc("clients", "add", "--kind", "resource-server", "--name", "Telemetry API", *admin,
                       credentials=credentials))
    client_id = text.split("client_id: ")[1].split("\n")[0]
    assert "client_secret: " in text
    shown = ok(tokensvc("clients", "show", client_id, *admin, credentials=credentials))
    assert "kind: resource-server" in shown and "redirect_uris: " in shown
    refused = tokensvc("clients", "add", "--name", "No redirect", *admin, credentials=credentials)
    assert refused.returncode != 0 and "redirect URI" in refused.stderr


SERVICE_ACCOUNT = '''
[[users]]
username = "ci-deploy"
password = "granite-harbor-lantern-ci"
admin = true

[[clients]]
client_id = "ci-deploy"
name = "CI deploys"
redirect_uris = ["http://127.0.0.1:{port}/callback"]
allowed_scopes = ["admin"]
first_party = true
client_secret_sha256 = "{digest}"
'''


def test_a_service_account_signs_in_once_then_automation_runs_without_anyone(service, credentials, tmp_path,
                                                                              monkeypatch):
    """docs/guide/administration.md's recipe, step by step: the account made by apply, one sign-in
    that keeps the refresh token in a file, unattended runs that rotate it, the client secret
    rotated, the password retired, then the account revoked."""
    secret = "ci-client-secret-0123456789abcdef"
    account = tmp_path / "service-account.toml"
    port = free_port()
    account.write_text(SERVICE_ACCOUNT.format(digest=hashlib.sha256(secret.encode()).hexdigest(), port=port))
    ok(tokensvc("apply", "-f", str(account), "--url", service.admin, credentials=credentials))
    kept = tmp_path / "ci-refresh-token"
    monkeypatch.setenv("TOKENSVC_ADMIN_CLIENT_SECRET", secret)
    monkeypatch.setattr("webbrowser.open", lambda url: sign_in_in_a_browser(url, "ci-deploy",
                                                                            "granite-harbor-lantern-ci"))
    assert cli.main(["login", "--url", service.admin, "--token-client-id", "ci-deploy", "--refresh-token", str(kept),
                     "--callback-port", str(port), "--json"]) == 0
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    monkeypatch.delenv("TOKENSVC_ADMIN_CLIENT_SECRET")

    def unattended(client_secret: str = secret) -> subprocess.CompletedProcess:
        return tokensvc("clients", "show", "ci-deploy", "--url", service.admin, "--refresh-token", str(kept),
                        env={"TOKENSVC_ADMIN_CLIENT_ID": "ci-deploy", "TOKENSVC_ADMIN_CLIENT_SECRET": client_secret})

    before = kept.read_text()
    assert "CI deploys" in ok(unattended())
    assert kept.read_text() != before and "CI deploys" in ok(unattended())  # rotated in place, and kept
    # The refresh token alone is not enough: the client's secret is the second half.
    wrong = unattended("not-the-secret")
    assert wrong.returncode == 1 and "refused: Client authentication failed" in wrong.stderr, wrong.stderr
    # Rotating the client's secret keeps the refresh chain; the old secret stops.
    rotated = json.loads(ok(tokensvc("clients", "rotate-secret", "ci-deploy", "--url", service.admin, "--json",
                                     credentials=credentials)))["clientSecret"]
    assert unattended(secret).returncode == 1
    assert "CI deploys" in ok(unattended(rotated))
    # The password served the one sign-in: replaced by one nobody keeps, the chain goes on.
    ok(tokensvc("users", "set-password", "ci-deploy", "--keep-grants", "--password-stdin", "--url", service.admin,
                stdin=secrets.token_urlsafe(32) + "\n", credentials=credentials))
    assert "CI deploys" in ok(unattended(rotated))
    # Revoking the account's grant ends it at once, and the next run says what to do.
    grants = json.loads(ok(tokensvc("grants", "list", "--user", "ci-deploy", "--client", "ci-deploy", "--json",
                                    "--url", service.admin, credentials=credentials)))
    ok(tokensvc("grants", "revoke", grants[0]["grantId"], "--url", service.admin, credentials=credentials))
    refused = unattended(rotated)
    assert refused.returncode == 1
    assert f"the refresh token in {kept} no longer works for ci-deploy: sign in again with `tokensvc login" \
        in refused.stderr


def test_login_takes_a_callback_port_of_1_to_65535(capsys):
    for wrong in ("0", "65536", "http"):
        with pytest.raises(SystemExit) as ended:
            cli.main(["login", "--url", "http://127.0.0.1:9", "--callback-port", wrong])
        assert ended.value.code == 2
        assert f"argument --callback-port: not a port (1 to 65535): {wrong!r}" in capsys.readouterr().err


def test_a_secret_rotated_with_keep_previous_works_beside_the_new_one(service, credentials):
    """`clients rotate-secret --keep-previous 15m` against the running service: both secrets
    prove the client at the token endpoints, `clients show` tells until when (never a hash);
    a rotation without it ends the old one at once."""
    added = json.loads(ok(tokensvc("clients", "add", "--name", "Rolling app", "--client-id", "rolling", "--first-party",
                                   "--confidential", "--redirect-uri", "https://rolling.example/cb", "--json",
                                   "--url", service.admin, credentials=credentials)))

    def proves(secret: str) -> bool:
        answer = requests.post(service.base + "/oauth/token/introspect", data={"token": "not-a-token"},
                               auth=("rolling", secret), timeout=10)
        assert answer.status_code in (200, 401), answer.text
        return answer.status_code == 200

    old = added["clientSecret"]
    out = ok(tokensvc("clients", "rotate-secret", "rolling", "--keep-previous", "15m", "--url", service.admin,
                      credentials=credentials))
    new = re.search(r"client_secret: (\S+)", out)[1]
    until = re.search(r"the old secret works until (\S+)\)", out)[1]
    assert proves(old) and proves(new)
    shown = ok(tokensvc("clients", "show", "rolling", "--url", service.admin, credentials=credentials))
    assert f"previous_secret_expires_at: {until}" in shown and "previous_secret_last_used_at: " in shown
    assert hashlib.sha256(old.encode()).hexdigest() not in shown
    out = ok(tokensvc("clients", "rotate-secret", "rolling", "--url", service.admin, credentials=credentials))
    assert "the old secret no longer works" in out
    newest = re.search(r"client_secret: (\S+)", out)[1]
    assert proves(newest) and not proves(new) and not proves(old)
    for wrong in ("15x", "5.5m", "m"):
        refused = tokensvc("clients", "rotate-secret", "rolling", "--keep-previous", wrong, "--url", service.admin,
                           credentials=credentials)
        assert refused.returncode == 2 and "not a duration (90s, 15m, 12h, 7d)" in refused.stderr
    for too_long in ("31d", "2592001"):
        refused = tokensvc("clients", "rotate-secret", "rolling", "--keep-previous", too_long, "--url",
                           service.admin, credentials=credentials)
        assert refused.returncode == 2 and "keepPreviousSeconds" not in refused.stderr
        assert f"argument --keep-previous: at most 30d (2592000 seconds): '{too_long}'" in refused.stderr
    assert "the old secret works until" in ok(tokensvc("clients", "rotate-secret", "rolling", "--keep-previous",
                                                       "30d", "--url", service.admin, credentials=credentials))
    newest = re.search(r"client_secret: (\S+)", ok(tokensvc(
        "clients", "rotate-secret", "rolling", "--url", service.admin, credentials=credentials)))[1]
    assert proves(newest)


# -- tokensvc login as a process: the confirmation code the page shows ---------------------------


def login_environment(credentials: Path) -> dict[str, str]:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    return {**environ, "TOKENSVC_CREDENTIALS": str(credentials)}


def test_tokensvc_login_takes_the_pages_confirmation_code_on_standard_input(service, tmp_path):
    """``tokensvc login --confirmation-stdin`` as a process, end to end: it says where to sign
    in and that the page shows a code; what cannot be a code is asked again at once, a code the
    service says is not the page's is asked again (the code may be presented three times), and
    the page's own code signs in as root with admin, kept for the operator commands."""
    from helpers import another_confirmation

    credentials = tmp_path / "credentials.json"
    login = subprocess.Popen([sys.executable, "-m", "tokensvc", "login", "--url", service.admin, "--no-browser",
                              "--confirmation-stdin", "--json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=login_environment(credentials))
    try:
        assert login.stderr.readline() == "Sign in as an administrator in your browser:\n"
        url = login.stderr.readline().strip()
        shown: list[str] = []
        landed = user_agent_authorize(url, username="root", password="quartz-river-beacon", read=shown.append)
        login.stdin.write("nope\n" + another_confirmation(shown[0]) + "\n" + shown[0].lower() + "\n")
        login.stdin.close()
        page = requests.get(landed, timeout=10)
        login.wait(60)
        out, err = login.stdout.read(), login.stderr.read()  # the rest (a line read is not read again)
    finally:
        if login.poll() is None:
            login.kill()
            login.communicate()
    assert login.returncode == 0, err
    assert page.status_code == 200
    assert err.splitlines() == [
        "The page shows a confirmation code: type it here (it is not shown as you type), then choose Continue on "
        "the page.", "Confirmation code:",
        "That is not a confirmation code (8 letters and digits, as the page shows them). Type it again:",
        "That is not the code the page showed. Type it again (2 tries left):"]
    signed_in = json.loads(out)
    assert (signed_in["username"], signed_in["clientId"], signed_in["scope"]) == ("root", "tokensvc-cli", "admin")
    assert "root" in ok(tokensvc("users", "list", "--url", service.admin, credentials=credentials))


def test_tokensvc_login_asks_for_the_code_on_the_terminal_without_echoing_it(service, tmp_path):
    """``tokensvc login`` as a person runs it, on a terminal of its own (a pseudo-terminal): the
    page answered first, the command line's page says to type the code; the code typed is not
    echoed, the sign-in goes through, and the terminal echoes again after."""
    import pty
    import select
    import termios
    import time

    argv = [sys.executable, "-m", "tokensvc", "login", "--url", service.admin, "--no-browser"]
    environ = login_environment(tmp_path / "credentials.json")
    pid, terminal = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pseudo-terminal
        os.execve(sys.executable, argv, environ)
    seen, status = b"", None

    def read_until(wanted: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + 60
        while wanted not in seen:
            assert time.monotonic() < deadline, seen
            if select.select([terminal], [], [], 0.5)[0]:
                try:
                    seen += os.read(terminal, 4096)
                except OSError:  # the child closed the terminal
                    break

    try:
        read_until(b"Confirmation code: ")
        url = re.search(rb"(http://\S+/oauth/authorize\?\S+)", seen)[1].decode()
        assert not termios.tcgetattr(terminal)[3] & termios.ECHO  # while it asks
        shown: list[str] = []
        landed = user_agent_authorize(url, username="root", password="quartz-river-beacon", read=shown.append)
        # Continue before the code is typed: the command line's page says where to type it.
        page = requests.get(landed, timeout=10)
        assert "<title>Type the code in the command line · tokensvc</title>" in page.text
        before = len(seen)
        os.write(terminal, shown[0].encode() + b"\n")
        read_until(b"signed in to ")
        assert shown[0].encode() not in seen[before:]  # never echoed
        assert termios.tcgetattr(terminal)[3] & termios.ECHO  # the terminal as it was found
        status = os.waitpid(pid, 0)[1]
    finally:
        if status is None:  # not reaped: still ours to end
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0, seen


def test_tokensvc_login_without_a_terminal_says_so_before_the_sign_in(service, tmp_path):
    """No terminal to ask on (a session without one, as a job runs): said at once, with the way
    out, rather than after the operator signed in."""
    result = subprocess.run([sys.executable, "-m", "tokensvc", "login", "--url", service.admin, "--no-browser"],
                            capture_output=True, text=True, timeout=60, start_new_session=True,
                            env=login_environment(tmp_path / "credentials.json"))
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == ("tokensvc: no terminal to type the confirmation code on: give it on "
                                              "standard input with --confirmation-stdin")
    assert not (tmp_path / "credentials.json").exists()


# -- what cannot be reached ----------------------------------------------------------------------


@contextlib.contextmanager
def an_index_naming(token_endpoint: str) -> Iterator[str]:
    """An admin listener's index (``GET /admin``) whose token endpoint is ``token_endpoint``:
    the admin listener answers while the public URL does not. Its URL is yielded."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Index(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            body = json.dumps({"issuer": "http://127.0.0.1:9", "authorizationEndpoint": "http://127.0.0.1:9/oauth/"
                               "authorize", "tokenEndpoint": token_endpoint, "cliClientId": "tokensvc-cli"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_what_does_not_answer_is_named_with_what_to_check(tmp_path):
    """Nothing at the admin listener's address (the service stopped, no port-forward, a wrong
    port): every command's one line names the admin listener at that URL and what to check. It
    said "the store is not answering" where a token was given, and where the public URL did
    not answer, that the refresh token no longer worked."""
    url = f"http://127.0.0.1:{free_port()}"
    state = tmp_path / "state.toml"
    state.write_text('[[users]]\nusername = "dora"\n')
    token = {"TOKENSVC_ADMIN_TOKEN": "x" * 43}
    for args, env in ((["users", "list", "--url", url], {}),  # signs in first: asks the listener's index
                      (["users", "list", "--url", url], token),  # straight to the admin API
                      (["clients", "rotate-secret", "webapp", "--url", url], token),
                      (["apply", "-f", str(state), "--url", url], token),
                      (["login", "--url", url, "--no-browser"], {})):
        result = tokensvc(*args, credentials=tmp_path / "credentials.json", env=env)
        assert result.returncode == 1 and result.stdout == "", (args, result.stderr)
        assert result.stderr == (f"tokensvc: the admin listener at {url} does not answer (Connection refused): check "
                                 "that tokensvc serve runs with its admin listener there (admin.host, admin.port; with "
                                 "kubectl port-forward or an SSH tunnel, that the tunnel is open), and that --url or "
                                 "TOKENSVC_ADMIN_URL names it\n"), (args, result.stderr)
    # The admin listener answers, the public URL (its token endpoint) does not.
    endpoint = f"http://127.0.0.1:{free_port()}/oauth/token"
    with an_index_naming(endpoint) as index:
        credentials = tmp_path / "signed-in.json"
        credentials.write_text(json.dumps({index: {"client_id": "tokensvc-cli", "refresh_token": "r" * 43}}))
        kept = tmp_path / "refresh-token"
        kept.write_text("r" * 43 + "\n")
        for args in (["users", "list", "--url", index],
                     ["users", "list", "--url", index, "--refresh-token", str(kept), "--token-client-id", "ci"]):
            result = tokensvc(*args, credentials=credentials)
            assert result.returncode == 1 and result.stderr == (
                f"tokensvc: the token endpoint at {endpoint}/refresh does not answer (Connection refused): it is "
                "the service's public URL (base_url); check that this machine reaches it\n"), result.stderr
