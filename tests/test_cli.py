"""The operator CLI, through its entry point, against a mongomock-backed Store."""

from __future__ import annotations

import argparse
import io
import json
import logging
import subprocess
import sys

import pytest
from helpers import eventually
from mongomock_motor import AsyncMongoMockClient

from tokensvc.cli import main as cli
from tokensvc.oauth import hashing
from tokensvc.storage.mongo import MongoStore

CONFIG = """
cookie_secret = "cli-test-cookie-secret-0123456789abcdef"
[storage]
backend = "mongodb"
mongodb_uri = "mongodb://127.0.0.1:1"
timeout_ms = 200
"""


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "tokensvc.toml"
    path.write_text(CONFIG)
    return str(path)


@pytest.fixture
def mongo():
    from yielding import Yielding

    return Yielding(AsyncMongoMockClient(tz_aware=True))


@pytest.fixture
def run(config_path, mongo, capsys, monkeypatch):
    """Run ``tokensvc ARGS`` against the mock database; returns (exit code, stdout, stderr)."""

    def run(*args, stdin=None, json_out=False):
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin or ""))
        argv = [*args, "--config", config_path] + (["--json"] if json_out else [])
        code = cli.main(argv, store_factory=lambda settings: MongoStore(mongo, settings.storage.database))
        out, err = capsys.readouterr()
        return code, (json.loads(out) if json_out and code == 0 else out), err

    return run


def stored(mongo, collection):
    import asyncio

    return asyncio.run(mongo["tokensvc"][collection].find({}).to_list(None))


def test_clients_round_trip(run, mongo):
    code, out, err = run("clients", "add", "--name", "Planner", "--redirect-uri", "https://planner.example/cb",
                         "--redirect-uri", "https://planner.example/cb2", "--scope", "read", "--scope",
                         "observations:write", "--confidential", "--description", "Plans nights", json_out=True)
    assert code == 0, err
    client_id, secret = out["clientId"], out["clientSecret"]
    assert len(secret) >= 43 and out["confidential"] and out["allowedScopes"] == ["read", "observations:write"]
    # Only the hash is stored.
    docs = stored(mongo, "clients")
    assert secret not in repr(docs) and docs[0]["secret_hash"] == hashing.digest(secret)

    code, out, _ = run("clients", "list")
    assert code == 0 and client_id in out and "Planner" in out and "confidential" in out
    code, out, _ = run("clients", "show", client_id, json_out=True)
    assert out["redirectUris"] == ["https://planner.example/cb", "https://planner.example/cb2"]
    assert "clientSecret" not in out and secret not in json.dumps(out)

    code, out, _ = run("clients", "rotate-secret", client_id, json_out=True)
    assert code == 0 and out["clientSecret"] != secret
    assert stored(mongo, "clients")[0]["secret_hash"] == hashing.digest(out["clientSecret"])

    code, out, _ = run("clients", "remove", client_id)
    assert code == 0 and f"removed client {client_id}" in out
    assert stored(mongo, "clients") == []


def test_secret_shown_once_in_text_mode(run):
    code, out, _ = run("clients", "add", "--name", "Svc", "--redirect-uri", "https://svc.example/cb",
                       "--confidential", "--first-party")
    assert code == 0 and "client_secret: " in out and "shown once" in out
    client_id = out.split("client_id: ")[1].split()[0]
    code, out, _ = run("clients", "show", client_id)
    # No secret, nor its hash: only until when a previous one works (none here).
    assert "previous_secret_expires_at: -\nprevious_secret_last_used_at: -" in out
    assert "secret" not in out.replace("confidential", "").replace("previous_secret_", "") and "first_party: yes" in out
    # What a person reads: no Python None, True or list brackets.
    assert "None" not in out and "True" not in out and "[" not in out and "description: -" in out


def test_a_client_with_allowed_origins(run):
    code, out, err = run("clients", "add", "--name", "Planner", "--redirect-uri", "https://planner.example/cb",
                         "--allowed-origin", "https://app.planner.example", json_out=True)
    assert code == 0, err
    assert out["allowedOrigins"] == ["https://app.planner.example"]
    code, _, err = run("clients", "add", "--name", "Bad", "--redirect-uri", "https://bad.example/cb",
                       "--allowed-origin", "https://bad.example/path")
    assert code == 1 and "not a valid web origin" in err
    code, _, err = run("clients", "add", "--name", "Wild", "--redirect-uri", "https://wild.example/cb",
                       "--allowed-origin", "https://*.evil.example")
    assert code == 1 and "not a valid web origin (a host name of letters" in err and "no wildcard" in err


def test_clients_add_kind_resource_server_on_the_store(run, mongo, capsys):
    """``clients add --kind resource-server`` against a stopped service's store, as over the
    admin API: a secret made and shown once, nothing of the flow; anything of it refused."""
    code, out, err = run("clients", "add", "--kind", "resource-server", "--name", "Notes API", "--client-id",
                         "notes-api", json_out=True)
    assert code == 0, err
    assert (out["kind"], out["redirectUris"], out["allowedScopes"], out["firstParty"], out["confidential"]) == (
        "resource-server", [], [], False, True)
    assert stored(mongo, "clients")[0]["secret_hash"] == hashing.digest(out["clientSecret"])
    for option, what in ((("--redirect-uri", "https://notes.example/cb"), "redirect URI"),
                         (("--scope", "read"), "scope"), (("--first-party",), "first-party flag"),
                         (("--allowed-origin", "https://notes.example"), "web origin")):
        code, _, err = run("clients", "add", "--kind", "resource-server", "--name", "Other API", *option)
        assert code == 1 and err == (f"tokensvc: a resource server has no {what}: it only introspects tokens and "
                                     "reads the revocation feed\n")
    # The APIs it serves, as tokens name them (RFC 8707): a resource server's only.
    code, out, err = run("clients", "add", "--kind", "resource-server", "--name", "Photos API", "--client-id",
                         "photos-api", "--resource", "https://photos.example", "--resource",
                         "https://photos.example/v2", json_out=True)
    assert code == 0 and out["resources"] == ["https://photos.example", "https://photos.example/v2"], err
    code, _, err = run("clients", "add", "--kind", "resource-server", "--name", "Bad API", "--resource",
                       "https://bad.example/#part")
    assert code == 1 and "resource URI" in err
    code, _, err = run("clients", "add", "--name", "An app", "--redirect-uri", "https://app.example/cb",
                       "--resource", "https://app.example")
    assert code == 1 and "only a resource server serves resources" in err
    with pytest.raises(SystemExit) as refused:
        run("clients", "add", "--kind", "api", "--name", "Other API")
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--kind: invalid choice: 'api'" in err and "resource-server" in err
    assert [client["_id"] for client in stored(mongo, "clients")] == ["notes-api", "photos-api"]


def test_public_client_has_no_secret(run):
    code, out, _ = run("clients", "add", "--name", "App", "--redirect-uri", "myapp://cb", "--client-id", "app",
                       json_out=True)
    assert code == 0 and out["clientSecret"] is None and out["allowedScopes"] == ["read"]
    code, _, err = run("clients", "rotate-secret", "app")
    assert code == 1 and err == "tokensvc: client 'app' is public: it has no secret to rotate\n"


@pytest.mark.parametrize("args,message", [
    (("clients", "show", "ghost"), "tokensvc: no client with id 'ghost'\n"),
    (("clients", "remove", "ghost"), "tokensvc: no client with id 'ghost'\n"),
    (("clients", "add", "--name", "X", "--redirect-uri", "not a url"),
     "tokensvc: not a valid redirect URI (an absolute URI is required): 'not a url'\n"),
    (("clients", "add", "--name", "X", "--redirect-uri", "https://x/cb", "--logo-url", "ftp://x/logo"),
     "tokensvc: not a valid logo URL (an absolute http(s) URL with a host): 'ftp://x/logo'\n"),
    (("users", "remove", "ghost"), "tokensvc: no user named 'ghost'\n"),
    (("installations", "remove", "ghost"), "tokensvc: no installation with id 'ghost'\n"),
])
def test_mistakes_end_with_one_line_and_exit_1(run, args, message):
    code, _, err = run(*args)
    assert code == 1 and err == message


def test_duplicate_client_name_and_username(run):
    assert run("clients", "add", "--name", "Dup", "--redirect-uri", "https://d/cb")[0] == 0
    code, _, err = run("clients", "add", "--name", "dup", "--redirect-uri", "https://d/cb")
    assert code == 1 and err == "tokensvc: a client named 'dup' already exists\n"
    assert run("users", "add", "carol", "--password-stdin", stdin="meadow-planet-violin\n")[0] == 0
    code, _, err = run("users", "add", "carol", "--password-stdin", stdin="other-password\n")
    assert code == 1 and err == "tokensvc: a user named 'carol' already exists\n"
    code, _, err = run("users", "add", "CAROL", "--password-stdin", stdin="other-password\n")  # one per key
    assert code == 1 and err == "tokensvc: a user named 'CAROL' already exists\n"


def test_users_round_trip(run, mongo):
    code, out, err = run("users", "add", "dave", "--admin", "--password-stdin", stdin="telescope-night-harbor\n",
                         json_out=True)
    assert code == 0, err
    assert out["username"] == "dave" and out["admin"] is True
    doc = stored(mongo, "users")[0]
    assert doc["password_hash"].startswith("scrypt$") and "telescope-night-harbor" not in repr(doc)
    assert hashing.verify_password("telescope-night-harbor", doc["password_hash"])
    code, out, _ = run("users", "list")
    assert "dave" in out and "yes" in out
    code, out, _ = run("users", "set-password", "dave", "--password-stdin", stdin="orbit-lantern-quiet\n",
                       json_out=True)
    assert code == 0 and out == {"username": "dave", "sessionsEnded": 0, "familiesRevoked": 0}
    assert hashing.verify_password("orbit-lantern-quiet", stored(mongo, "users")[0]["password_hash"])
    code, out, _ = run("users", "set-password", "dave", "--keep-grants", "--password-stdin", stdin="third-password\n")
    assert code == 0 and out == "password of dave changed; 0 web sessions ended, 0 token families revoked\n"
    code, out, _ = run("users", "remove", "dave")
    assert code == 0 and stored(mongo, "users") == []


def test_password_never_from_a_flag_and_not_from_a_pipe_without_the_option(run):
    with pytest.raises(SystemExit):
        run("users", "add", "eve", "--password", "x")
    code, _, err = run("users", "add", "eve")  # stdin is not a terminal
    assert code == 1 and "use --password-stdin" in err
    code, _, err = run("users", "add", "eve", "--password-stdin", stdin="short\n")
    assert code == 1 and "at least 8 characters" in err


@pytest.mark.parametrize("weak", ["password", "12345678", "aaaaaaaa", "eve12345", "tokensvc1", "Password1",
                                  "tokensvc-eve-planet-lantern", "Eve_2026_quiet_harbor", "quiet-harbor-TOKEN-svc"])
def test_common_and_context_passwords_are_refused_with_a_reason(run, weak):
    """NIST SP 800-63B §5.1.1.2: common and breached passwords, and ones built from the
    username or the service's name, are refused in one line that says why."""
    code, _, err = run("users", "add", "eve", "--password-stdin", stdin=weak + "\n")
    assert code == 1 and "too easy to guess" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run("users", "add", "eve", "--password-stdin", stdin="violet-comet-harbor\n")
    assert code == 0, err
    code, _, err = run("users", "set-password", "eve", "--password-stdin", stdin=weak + "\n")
    assert code == 1 and "too easy to guess" in err
    run("users", "remove", "eve")


def test_installations_round_trip(run):
    run("users", "add", "frank", "--password-stdin", stdin="lantern-quiet-meadow\n")
    code, out, err = run("installations", "add", "dome-1", "--name", "Dome 1", "--kind", "observatory",
                         "--operator", "frank", json_out=True)
    assert code == 0, err
    assert out == {"installationId": "dome-1", "name": "Dome 1", "kind": "observatory", "operators": ["frank"]}
    code, out, _ = run("installations", "list", json_out=True)
    assert out == [{"installationId": "dome-1", "name": "Dome 1", "kind": "observatory", "operators": ["frank"]}]
    code, _, err = run("installations", "add", "dome-2", "--name", "D2", "--kind", "observatory",
                       "--operator", "ghost")
    assert code == 1 and err == "tokensvc: no user named 'ghost'\n"
    assert run("installations", "remove", "dome-1")[0] == 0
    assert run("installations", "list")[1].strip() == "no installations"


def test_tokens_purge_prints_counts(run, mongo):
    import asyncio
    from datetime import timedelta

    from tokensvc.records import AuthorizationCode, utcnow

    async def seed_expired():
        store = MongoStore(mongo, "tokensvc")
        await store.open()  # as the service does: it records the store's format
        now = utcnow()
        # Expired codes stay an hour past expiry under the TTL index (for replay detection):
        # purge removes them at once.
        for i in range(3):
            await store.add_code(AuthorizationCode(f"c{i}", "app", "https://a/cb", ["read"], "u", None, "x" * 43,
                                                   "S256", now - timedelta(seconds=1)))
        await store.add_code(AuthorizationCode("live", "app", "https://a/cb", ["read"], "u", None, "x" * 43,
                                               "S256", now + timedelta(minutes=5)))

    asyncio.run(seed_expired())
    code, out, _ = run("tokens", "purge", json_out=True)
    assert code == 0 and out == {"codes": 3, "families": 0, "sessions": 0}
    assert [doc["_id"] for doc in stored(mongo, "codes")] == ["live"]
    code, out, _ = run("tokens", "purge")
    assert out.strip() == "purged 0 expired codes, 0 expired token families, 0 expired sessions"


def test_memory_backend_explains_where_clients_come_from(tmp_path, capsys):
    path = tmp_path / "memory.toml"
    path.write_text('cookie_secret = "0123456789abcdef0123456789abcdef"\n')
    assert cli.main(["clients", "list", "--config", str(path)]) == 1
    assert "come from the config file" in capsys.readouterr().err


def test_unreachable_mongodb_is_one_line(config_path, capsys):
    assert cli.main(["clients", "list", "--config", config_path]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tokensvc: the store is not answering: MongoDB: ServerSelectionTimeoutError")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_config_file(capsys):
    assert cli.main(["clients", "list", "--config", "/no/such.toml"]) == 1
    assert capsys.readouterr().err == "tokensvc: config file not found: /no/such.toml\n"


def test_config_check_masks_secrets(capsys):
    assert cli.main(["config", "check", "--config", "config/tokensvc.toml", "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["cookie_secret"] == "***" and all(c["client_secret"] in (None, "***") for c in data["clients"])
    assert "demo-secret" not in out and json.loads(err.splitlines()[-1])["ok"] is True
    assert "amber-comet-lantern" not in out and "granite-harbor-ember" not in out  # the demo's passwords
    assert cli.main(["config", "check", "--config", "config/tokensvc.toml"]) == 0
    text = capsys.readouterr().out
    assert 'storage.backend = "memory"' in text and 'cookie_secret = "***"' in text


PRODUCTION = """
base_url = "https://auth.example.org"
cookie_secret = "0123456789abcdef0123456789abcdef"
xheaders = true
[proxy]
trusted_networks = ["10.0.0.0/8"]
[storage]
backend = "mongodb"
mongodb_uri = "{uri}"
"""


def test_config_check_is_a_production_gate(tmp_path, capsys):
    """What no production deployment wants is named and passes with a warning; --strict
    refuses it (exit 1); a replica set's configuration passes both."""
    path = tmp_path / "tokensvc.toml"
    path.write_text(PRODUCTION.format(uri="mongodb://tokensvc:pw@db1,db2,db3/?replicaSet=rs0"))
    assert cli.main(["config", "check", "--config", str(path), "--strict"]) == 0
    assert capsys.readouterr().err == f"{path}: OK\n"
    path.write_text(PRODUCTION.format(uri="mongodb://127.0.0.1:27017/?directConnection=true"))
    assert cli.main(["config", "check", "--config", str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("tokensvc: warning: storage.mongodb_uri: names this machine alone (127.0.0.1)")
    assert err[1].startswith("tokensvc: warning: storage.mongodb_uri: directConnection=true")
    assert err[2] == f"{path}: OK (2 warnings)"
    assert cli.main(["config", "check", "--config", str(path), "--strict"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[-1] == f"tokensvc: {path}: 2 warnings, refused by --strict"
    assert f"tokensvc: {path}: storage.mongodb_uri: directConnection=true" in err
    assert cli.main(["config", "check", "--config", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["storage"]["backend"] == "mongodb"
    assert [json.loads(line)["warning"].split(":")[0] for line in err.splitlines()[:-1]] == [
        "storage.mongodb_uri", "storage.mongodb_uri"]
    assert json.loads(err.splitlines()[-1]) == {"config": str(path), "ok": True, "warnings": 2}
    # --json --strict: the same lines, the verdict last says it refused and why.
    assert cli.main(["config", "check", "--config", str(path), "--json", "--strict"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and [json.loads(line)["warning"].split(":")[0] for line in err.splitlines()[:-1]] == [
        "storage.mongodb_uri", "storage.mongodb_uri"]
    assert json.loads(err.splitlines()[-1]) == {"config": str(path), "ok": False, "warnings": 2,
                                                "error": "2 warnings, refused by --strict"}
    # Unset, the URI would name this host alone: refused with or without --strict.
    path.write_text(PRODUCTION.split("mongodb_uri")[0])
    assert cli.main(["config", "check", "--config", str(path)]) == 1
    assert capsys.readouterr().err.startswith('tokensvc: storage.mongodb_uri: required with storage.backend = '
                                              '"mongodb" outside demo mode')


@pytest.mark.process
def test_config_check_in_json_mode_writes_json_lines_only(tmp_path):
    """``--json``: every line the command writes is JSON, on standard output (the settings, on
    one line) and on standard error (each warning, and the verdict that closed it as text:
    ``tokensvc.toml: OK``), whatever it finds, and PyMongo writes no warning of its own."""
    path = tmp_path / "tokensvc.toml"
    for uri in ("mongodb://tokensvc:pw@db1,db2,db3/?replicaSet=rs0",
                "mongodb://127.0.0.1:27017/?directConnection=true",
                "mongodb://db1,db2,db3/?replicaSet=rs0&tls=true&tls=false&tsl=true"):
        path.write_text(PRODUCTION.format(uri=uri))
        for strict in ([], ["--strict"]):
            result = subprocess.run([sys.executable, "-m", "tokensvc", "config", "check", "--config", str(path),
                                     "--json", *strict], capture_output=True, text=True, timeout=60)
            lines = result.stdout.splitlines() + result.stderr.splitlines()
            assert lines and all(isinstance(json.loads(line), dict) for line in lines), (uri, strict, lines)
            if result.returncode == 0:
                assert len(result.stdout.splitlines()) == 1
                verdict = json.loads(result.stderr.splitlines()[-1])
                assert verdict["ok"] is True and verdict["config"] == str(path), verdict
            else:  # each problem an error; or, refused by --strict, each warning and the verdict
                assert result.stdout == "" and all({"error", "warning"} & json.loads(line).keys()
                                                   for line in result.stderr.splitlines())
    assert result.returncode == 1 and [json.loads(line)["error"] for line in result.stderr.splitlines()] == [
        "storage.mongodb_uri: option 4 of the query, not named (it may be credential text): Unknown option. Did you "
        "mean one of (tls, ssl, tlscafile) or maybe a camelCase version of one?",
        "storage.mongodb_uri: Duplicate URI option 'tls'."]


SEVERAL = """
cookie_secret = "short"
base_url = "https://auth.example.org"
port = "8080"
[storage]
backend = "mongodb"
mongodb_uri = "mongodb://db1,db2,db3/?replicaSet=rs0&tls=maybe"
[[clients]]
client_id = "a b"
name = "A"
redirect_uris = ["https://a.example/cb"]
"""


def test_config_check_names_every_problem_at_once(tmp_path, capsys):
    """Each problem on a line of its own naming its key (with ``--json`` an object each), exit 1:
    an operator fixes them all in one pass, not one per run."""
    path = tmp_path / "tokensvc.toml"
    path.write_text(SEVERAL)
    expected = ["port: expected an integer, got '8080'",
                "cookie_secret: expected a secret of at least 32 characters, not 5",
                "storage.mongodb_uri: option tls: The value of tls must be 'true' or 'false'",
                "clients[0].client_id: "]
    assert cli.main(["config", "check", "--config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == len(expected)
    assert all(line.startswith(f"tokensvc: {start}")
               for line, start in zip(err.splitlines(), expected, strict=True)), err
    assert cli.main(["config", "check", "--config", str(path), "--json"]) == 1
    out, err = capsys.readouterr()
    errors = [json.loads(line)["error"] for line in err.splitlines()]
    assert out == "" and len(errors) == len(expected)
    assert all(line.startswith(start) for line, start in zip(errors, expected, strict=True)), errors


def test_serve_given_a_file_that_never_ends_is_one_line_and_nothing_hangs(capsys, monkeypatch):
    """``serve --config /dev/zero``: the log format of the refusal's line is looked up in the
    file too, read as the settings are (it was read without end there)."""
    monkeypatch.delenv("TOKENSVC_LOG_FORMAT", raising=False)
    assert cli.main(["serve", "--config", "/dev/zero"]) == 1
    assert capsys.readouterr().err == "tokensvc: /dev/zero: not a regular file (give the TOML file with --config)\n"


def test_a_config_path_that_cannot_be_read_is_one_line_at_the_command_line(tmp_path, capsys, monkeypatch):
    """A directory, a file that is not UTF-8, a file this user may not read: one line, exit 1,
    as for a file that is not there (each was a traceback)."""
    latin = tmp_path / "latin-1.toml"
    latin.write_bytes('service_name = "caf\xe9"\n'.encode("latin-1"))
    for given, words in ((tmp_path, "a directory, not a config file"), (latin, "not UTF-8 text (byte 19)")):
        for command in (["config", "check"], ["serve"], ["clients", "list"], ["storage", "status"]):
            assert cli.main([*command, "--config", str(given)]) == 1
            out, err = capsys.readouterr()
            assert out == "" and err.startswith(f"tokensvc: {given}: {words}") and err.count("\n") == 1, err
        assert cli.main(["config", "check", "--config", str(given), "--json"]) == 1
        assert words in json.loads(capsys.readouterr().err)["error"]
    locked = tmp_path / "tokensvc.toml"
    locked.write_text(CONFIG)

    def refused(self, *args, **kwargs):  # as another user's file reads (the tests may run as root)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr("pathlib.Path.read_text", refused)
    assert cli.main(["config", "check", "--config", str(locked)]) == 1
    assert capsys.readouterr().err == f"tokensvc: {locked}: cannot be read: Permission denied\n"


@pytest.mark.parametrize("command", [[], ["serve"], ["clients"], ["clients", "add"], ["users"], ["users", "add"],
                                     ["installations"], ["tokens", "purge"], ["config", "check"]])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([*command, "--help"])
    assert info.value.code == 0
    assert "usage: tokensvc" in capsys.readouterr().out


def test_audit_records_for_registry_changes(run, caplog):
    with caplog.at_level(logging.INFO, logger="tokensvc.audit"):
        _, out, _ = run("clients", "add", "--name", "Aud", "--redirect-uri", "https://a/cb", "--confidential",
                        json_out=True)
        run("clients", "rotate-secret", out["clientId"])
        run("clients", "remove", out["clientId"])
    events = [record.audit["event"] for record in caplog.records if hasattr(record, "audit")]
    assert events == ["client_created", "client_secret_rotated", "client_removal_started", "client_removed"]
    assert all(out["clientId"] == record.audit["client_id"] for record in caplog.records if hasattr(record, "audit"))
    assert out["clientSecret"] not in caplog.text


def test_several_processes_need_mongodb(capsys):
    assert cli.main(["serve", "--config", "config/tokensvc.toml", "--processes", "2"]) == 1
    assert "--processes needs the MongoDB backend" in capsys.readouterr().err
    assert cli.main(["serve", "--config", "config/tokensvc.toml", "--processes", "-1"]) == 1
    assert capsys.readouterr().err == "tokensvc: --processes: 0 (one per core) or more\n"


def test_generated_client_ids_are_safe_on_a_command_line(run):
    for _ in range(20):
        code, out, _ = run("clients", "add", "--name", f"App {_}", "--redirect-uri", "https://a/cb", json_out=True)
        assert code == 0 and out["clientId"][0].isalnum()
        assert run("clients", "show", out["clientId"])[0] == 0


def test_clients_add_refuses_a_javascript_redirect_uri(run):
    code, out, err = run("clients", "add", "--name", "X", "--redirect-uri", "javascript:alert(1)")
    assert code == 1 and out == ""
    assert err == "tokensvc: not a valid redirect URI (the javascript: scheme is never a redirect target): " \
                  "'javascript:alert(1)'\n"


def test_tokens_purge_on_the_memory_backend_explains_it_purges_itself(tmp_path, capsys):
    path = tmp_path / "memory.toml"
    path.write_text('cookie_secret = "0123456789abcdef0123456789abcdef"\n')
    assert cli.main(["tokens", "purge", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "lives inside the running server, which purges its expired codes" in err
    assert "come from the config file" not in err


@pytest.mark.gen_test
async def test_the_running_memory_store_purges_itself():
    import asyncio
    from datetime import timedelta

    from helpers import eventually

    from tokensvc.bootstrap import purge_periodically
    from tokensvc.records import Session, utcnow
    from tokensvc.storage.memory import MemoryStore

    store = MemoryStore()
    now = utcnow()
    await store.add_session(Session("old", "u", now - timedelta(hours=2), now - timedelta(hours=1)))
    await store.add_session(Session("live", "u", now, now + timedelta(hours=1)))
    task = asyncio.ensure_future(purge_periodically(store, every=0.01))

    async def purged():
        return await store.get_session("old") is None

    await eventually(purged, what="the expired session purged")
    task.cancel()
    assert await store.get_session("live") is not None


@pytest.mark.gen_test
async def test_a_serving_process_forgets_expired_previous_secrets_and_tells_of_each(caplog):
    import asyncio
    import logging
    from datetime import timedelta

    from tokensvc.bootstrap import expire_previous_secrets_periodically
    from tokensvc.records import PreviousSecret, utcnow
    from tokensvc.storage.memory import MemoryStore

    store = MemoryStore()
    now = utcnow()
    await store.put_previous_secret(PreviousSecret("old", "a" * 64, "b" * 64, now - timedelta(hours=1), now))
    await store.put_previous_secret(PreviousSecret("live", "c" * 64, "d" * 64, now, now + timedelta(hours=1)))
    with caplog.at_level(logging.INFO, logger="tokensvc.audit"):
        task = asyncio.ensure_future(expire_previous_secrets_periodically(store, every=0.01))

        async def expired() -> bool:
            return await store.get_previous_secret("old") is None

        await eventually(expired, seconds=10, what="the expired previous secret's end")
        task.cancel()
    assert await store.get_previous_secret("live") is not None
    told = [record.audit for record in caplog.records if record.name == "tokensvc.audit"]
    assert [(event["event"], event["client_id"], event["last_used_at"]) for event in told] == [
        ("client_previous_secret_expired", "old", None)]


def test_json_errors_are_json_on_stderr_with_the_same_exit_codes(tmp_path, config_path, capsys):
    memory = tmp_path / "memory.toml"
    memory.write_text('cookie_secret = "0123456789abcdef0123456789abcdef"\n')
    cases = [
        (["clients", "list", "--config", str(memory), "--json"], "come from the config file"),
        (["clients", "list", "--config", "/no/such.toml", "--json"], "config file not found"),
        (["clients", "list", "--config", config_path, "--json"], "the store is not answering"),
        (["config", "check", "--config", "/no/such.toml", "--json"], "config file not found"),
    ]
    for argv, words in cases:
        assert cli.main(argv) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.endswith("\n") and err.count("\n") == 1
        assert words in json.loads(err)["error"], err


def test_users_not_found_is_json_too(run):
    code, _, err = run("users", "remove", "nobody", json_out=True)
    assert code == 1 and set(json.loads(err)) == {"error"}


def test_config_check_applies_the_password_rules_of_users_add(tmp_path, capsys, run):
    path = tmp_path / "short.toml"
    path.write_text('demo = true\n[[users]]\nusername = "eve"\npassword = "x"\n')
    assert cli.main(["config", "check", "--config", str(path)]) == 1
    config_error = capsys.readouterr().err
    code, _, add_error = run("users", "add", "eve", "--password-stdin", stdin="x\n")
    assert code == 1
    assert "a password needs at least 8 characters" in config_error and "users[0].password" in config_error
    assert "a password needs at least 8 characters" in add_error


def test_every_option_and_argument_has_help_text():
    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    missing = [f"{parser.prog}: {action.dest}" for parser in parsers(cli.build_parser())
               for action in parser._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) and not action.help]
    assert missing == []


@pytest.mark.process
@pytest.mark.parametrize("command", ["config check --config config/tokensvc.toml", "--help", "openapi"])
def test_a_closed_pipe_ends_the_command_quietly(command):
    """``tokensvc ... | head -1``: the reader goes away after one line; no traceback."""
    result = subprocess.run(f"{sys.executable} -m tokensvc {command} | head -1", shell=True, capture_output=True,
                            text=True, timeout=60, executable="/bin/bash")
    assert result.stdout.count("\n") == 1, result.stdout
    # Whether the reader left before the last line or after, no traceback, no "Exception ignored".
    assert "Traceback" not in result.stderr and "Error" not in result.stderr and "Exception" not in result.stderr


def test_tokens_revoke_takes_the_token_from_an_option_or_standard_input(run):
    """A token may start with "-" (base64url): as an argument it read as an option."""
    import secrets

    token = "-" + secrets.token_urlsafe(32)
    for args, stdin in ((["--value=" + token], None), (["--token-stdin"], token + "\n")):
        code, out, err = run("tokens", "revoke", *args, stdin=stdin)
        assert code == 0 and out == "nothing to revoke: the token was not in force\n", err
    code, _, err = run("tokens", "revoke")
    assert code == 1 and err == "tokensvc: give the token: --value=TOKEN, or on standard input with --token-stdin\n"


@pytest.mark.parametrize("uri", ["https://user@app.example/cb", "HTTPS://app.example/cb", "https://app.example:0/cb",
                                 "https://app.example:99999/cb", "https://äpp.example/cb", "https://app_1.example/cb",
                                 "https://app.example/{cb}", "https://[::1]/cb", "myapp://user@host/cb"])
def test_clients_add_and_apply_hold_a_redirect_uri_to_the_one_rule(run, tmp_path, uri):
    """The command line and apply refuse what the admin API refuses, https and private-use
    schemes included, in one line naming the URI; nothing is written."""
    code, _, err = run("clients", "add", "--name", "Ruled", "--redirect-uri", uri)
    assert code == 1 and err.startswith("tokensvc: not a valid redirect URI (") and repr(uri) in err, err
    plan = tmp_path / "ruled.toml"
    plan.write_text(f'[[clients]]\nclient_id = "ruled"\nname = "Ruled"\nredirect_uris = ["{uri}"]\n')
    code, _, err = run("apply", "-f", str(plan))
    assert code == 1 and "not a valid redirect URI (" in err and repr(uri) in err, err
    assert "ruled" not in run("clients", "list")[1].lower()


@pytest.mark.parametrize("given", [["{token}"], ["-{token}"], ["--value={token}", "{token}"],
                                   ["--token-stdin={token}"], ["--t={token}"], ["--value", "x", "{token}"]])
def test_a_usage_error_of_tokens_revoke_never_repeats_the_token(capsys, given):
    """A token given as a plain argument (or to the wrong option) is a usage error that says
    what to do and never shows the token: stderr ends up in logs and scrollback."""
    import secrets

    # Of a token's 64 first characters, "h" makes "-{token}" argparse's -h (help, exit 0; the
    # token is not shown either): the case is the usage error, so the token starts otherwise.
    token = "k" + secrets.token_urlsafe(32)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["tokens", "revoke", *(part.format(token=token) for part in given)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "tokensvc tokens revoke: error:" in err, err
    assert token not in err and token[:12] not in err, err
    if given[0].startswith(("--token-stdin", "--t=")):
        assert "***" in err, err  # the message itself stays: only the value is masked
    else:
        assert "give the token with --value=TOKEN or --token-stdin" in err, err


def test_apply_holds_a_file_to_the_admin_apis_rules(run, tmp_path):
    """apply runs the operations of the admin API, with their rules: an origin a browser never
    sends is refused in one line naming the rule, and a user named in another case than the
    stored one is that user (no second one)."""
    assert run("users", "add", "carol", "--password-stdin", stdin="meadow-planet-violin\n")[0] == 0
    wild = tmp_path / "wild.toml"
    wild.write_text('[[clients]]\nclient_id = "wild"\nname = "Wild"\nredirect_uris = ["https://w.example/cb"]\n'
                    'allowed_origins = ["https://*.evil.example"]\n')
    code, _, err = run("apply", "-f", str(wild))
    assert code == 1 and "not a valid web origin" in err and "no wildcard" in err
    users = tmp_path / "users.toml"
    users.write_text('[[users]]\nusername = "CAROL"\npassword = "meadow-planet-violin"\n')
    code, out, err = run("apply", "-f", str(users))
    assert code == 0 and out.splitlines() == ["unchanged user CAROL", "nothing to change (1 unchanged)"], err
    assert [line.split()[0] for line in run("users", "list")[1].splitlines()[1:]] == ["carol"]


@pytest.mark.parametrize("message", ["Timeout during request", "Timeout during TLS handshake"])
def test_a_listener_that_accepts_and_never_answers_is_one_line(monkeypatch, message):
    """Tornado raises HTTPTimeoutError even with raise_error=False: it was a traceback."""
    import asyncio

    from tornado.httpclient import AsyncHTTPClient
    from tornado.simple_httpclient import HTTPTimeoutError

    from tokensvc.cli import login as cli_login

    async def never(*args, **kwargs):
        raise HTTPTimeoutError(message)

    monkeypatch.setattr(AsyncHTTPClient, "fetch", never)
    url = "https://auth.example.org/oauth/token"
    with pytest.raises(cli_login.LoginError) as info:
        asyncio.run(cli_login._fetch(url, "POST", {"grant_type": "refresh_token"}))
    assert str(info.value) == (f"the token endpoint at {url} does not answer ({message}): it is the "
                               "service's public URL (base_url); check that this machine reaches it")


def test_a_dead_sign_in_says_to_run_login_again(monkeypatch, tmp_path):
    """"Unknown refresh token" alone left the operator no way forward."""
    import argparse
    import asyncio

    from tokensvc.cli import login as cli_login

    url = "http://127.0.0.1:27999"
    credentials = tmp_path / "credentials.json"
    credentials.write_text(json.dumps({url: {"client_id": "tokensvc-cli", "refresh_token": "r" * 43}}))
    monkeypatch.setenv(cli_login.CREDENTIALS_ENV, str(credentials))

    async def index(at):
        return {"tokenEndpoint": "https://auth.example.org/oauth/token"}

    async def refused(*args, **kwargs):
        raise cli_login.Refused("the token endpoint refused: invalid_grant: Unknown refresh token", "invalid_grant",
                                "Unknown refresh token")

    monkeypatch.setattr(cli_login, "discover", index)
    monkeypatch.setattr(cli_login, "_fetch", refused)

    async def use():
        async with cli_login.access_token(argparse.Namespace(token=None, refresh_token=None), url):
            pass

    with pytest.raises(cli_login.LoginError) as info:
        asyncio.run(use())
    assert str(info.value).endswith(f"no longer works: run `tokensvc login --url {url}` again")
    assert "Unknown refresh token" in str(info.value)


def test_config_check_shows_a_file_mode_as_it_is_written(tmp_path, capsys):
    """``server.unix_socket_mode`` is printed in octal, as the file gives it (it was 432)."""
    path = tmp_path / "tokensvc.toml"
    path.write_text('demo = true\n[server]\nunix_socket = "/run/tokensvc/http.sock"\nunix_socket_mode = 0o660\n')
    assert cli.main(["config", "check", "--config", str(path)]) == 0
    assert "server.unix_socket_mode = 0o660" in capsys.readouterr().out.splitlines()
    assert cli.main(["config", "check", "--config", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["server"]["unix_socket_mode"] == 0o660  # JSON has no octal


def test_a_resource_is_one_resource_servers_at_clients_add_and_apply(run, mongo, tmp_path):
    """RFC 8707: ``clients add --resource`` and ``apply -f`` refuse tokensvc's own API (base_url +
    /v1) and a URI another resource server declares, naming the other, and a URI not in
    canonical form, naming the form to write; an apply whose clients share one is refused whole,
    before anything is written."""
    code, _, err = run("clients", "add", "--kind", "resource-server", "--name", "Notes API", "--client-id",
                       "notes-api", "--resource", "https://notes.example")
    assert code == 0, err
    for taken, said in (("http://127.0.0.1:8080/v1", "tokensvc's own API"),
                        ("https://notes.example", "declared by client 'notes-api'"),
                        ("HTTPS://notes.example:443/", "write it in canonical form: https://notes.example")):
        code, _, err = run("clients", "add", "--kind", "resource-server", "--name", "Copy API", "--resource", taken)
        assert code == 1 and said in err, err
    applied = tmp_path / "apis.toml"
    applied.write_text("".join(
        f'[[clients]]\nclient_id = "{client_id}"\nname = "{client_id}"\nkind = "resource-server"\n'
        f'client_secret = "{client_id}-secret-0123456789abcdef01234"\nresources = ["{uri}"]\n'
        for client_id, uri in (("a-api", "https://shared.example"), ("b-api", "https://shared.example"))))
    code, out, err = run("apply", "-f", str(applied))
    assert code == 1 and "declared by client 'a-api'" in err and "b-api" in err, err
    applied.write_text('[[clients]]\nclient_id = "c-api"\nname = "c-api"\nkind = "resource-server"\n'
                       'client_secret = "c-api-secret-0123456789abcdef01234"\nresources = ["https://notes.example"]\n')
    code, out, err = run("apply", "-f", str(applied))
    assert code == 1 and "declared by client 'notes-api'" in err, err
    assert [client["_id"] for client in stored(mongo, "clients")] == ["notes-api"]


def test_storage_status_names_a_stored_resource_uri_not_in_canonical_form(run, mongo):
    """A store written before declared URIs had to be canonical: ``storage status`` names the
    client, the URI and the form to write, and exits 0 (the URI binds tokens as written)."""
    import asyncio

    asyncio.run(mongo["tokensvc"]["clients"].insert_one({
        "_id": "notes-api", "name": "Notes API", "redirect_uris": [], "allowed_scopes": [], "kind": "resource-server",
        "secret_hash": "h", "resources": ["https://notes.example/v2", "HTTPS://Notes.example:443/"]}))

    async def opened():
        store = MongoStore(mongo, "tokensvc")
        await store.open()  # as the service does (it records the store's format): no failure
        await store.close()

    asyncio.run(opened())
    code, out, err = run("storage", "status")
    assert code == 0, err
    assert ("WARNING: client 'notes-api' declares the resource 'HTTPS://Notes.example:443/', which is not in "
            "canonical form: write it as 'https://notes.example'") in out, out
    assert "'https://notes.example/v2'" not in out


def test_a_store_whose_clients_share_a_resource_opens_and_says_so(run, mongo):
    """A store written before the rule (two clients declaring one resource URI): the unique
    index cannot be made. Opening it does not fail: the index is left unmade, ``storage
    migrate`` and ``storage status`` say which clients share which URI (migrate exits 1), and
    no token is bound to that URI meanwhile. Once one client alone declares it, the next
    opening makes the index."""
    import asyncio

    clients = mongo["tokensvc"]["clients"]
    for client_id, resources in (("notes-api", ["https://notes.example", "https://notes.example/v2"]),
                                 ("copy-api", ["https://notes.example"])):
        asyncio.run(clients.insert_one({"_id": client_id, "name": client_id, "redirect_uris": [], "allowed_scopes": [],
                                        "kind": "resource-server", "secret_hash": "h", "resources": resources}))
    async def declared():
        store = MongoStore(mongo, "tokensvc")
        await store.open()  # as the service does (it records the store's format): no failure
        try:
            return await store.declared_resources(["https://notes.example", "https://notes.example/v2"]), \
                store.indexes.problems
        finally:
            await store.close()

    found, problems = asyncio.run(declared())
    assert found == {"https://notes.example/v2"}  # a shared URI is no one's: no token is bound to it
    assert problems == [problem for problem in problems if "copy-api, notes-api" in problem] != []
    code, out, err = run("storage", "migrate")
    assert code == 1 and "WARNING: index clients.resources is not made" in err, err
    assert "https://notes.example by clients copy-api, notes-api" in err and "v2 by" not in err
    code, out, err = run("storage", "status")
    assert code == 0 and "https://notes.example by clients copy-api, notes-api" in out
    assert "resources" not in asyncio.run(clients.index_information())
    asyncio.run(clients.update_one({"_id": "copy-api"}, {"$set": {"resources": ["https://copy.example"]}}))
    code, out, err = run("storage", "migrate")
    assert code == 0 and "WARNING" not in err, err
    assert asyncio.run(clients.index_information())["resources"]["unique"] is True
