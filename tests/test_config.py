"""Config loading: TOML, environment overrides, and one clear message naming the bad key."""

import json
import os
from pathlib import Path

import pytest
from helpers import PASSWORD_HASHES

from tokensvc import config, identifiers
from tokensvc.config import ConfigError

REPO = Path(__file__).resolve().parent.parent

SECRET = 'cookie_secret = "0123456789abcdef0123456789abcdef"\n'


def write(tmp_path, text):
    path = tmp_path / "tokensvc.toml"
    path.write_text(text)
    return path


def test_demo_config_loads_and_generates_a_cookie_secret():
    settings = config.load(REPO / "config" / "tokensvc.toml", environ={})
    assert settings.demo and settings.generated_cookie_secret and len(settings.cookie_secret) >= 32
    assert settings.storage.backend == "memory"
    assert {c.client_id for c in settings.clients} >= {"webapp", "skyplanner"}
    assert any(c.first_party and c.client_secret for c in settings.clients)
    assert any(not c.first_party and not c.client_secret for c in settings.clients)
    assert any(u.admin for u in settings.users) and any(not u.admin for u in settings.users)
    assert settings.installations


def test_defaults_need_only_a_cookie_secret():
    settings = config.from_dict({"cookie_secret": "x" * 32})
    assert settings.port == 8080 and settings.tokens.code_ttl == 300 and settings.tokens.refresh_grace_seconds == 0
    assert settings.session_cookie == "tokensvc_session"


def test_cookie_secret_required_outside_demo():
    with pytest.raises(ConfigError, match="^cookie_secret"):
        config.from_dict({})


def test_environment_overrides(tmp_path):
    path = write(tmp_path, SECRET + '[storage]\nbackend = "memory"\n')
    settings = config.load(path, environ={
        "TOKENSVC_STORAGE_BACKEND": "mongodb", "TOKENSVC_STORAGE_MONGODB_URI": "mongodb://db.internal:27017",
        "TOKENSVC_PORT": "9001", "TOKENSVC_TOKENS_ACCESS_TTL": "60", "TOKENSVC_DEMO": "false",
        "TOKENSVC_XHEADERS": "true", "TOKENSVC_PROXY_TRUSTED_NETWORKS": "10.0.0.0/8, 192.168.0.0/16",
        "TOKENSVC_LIMITS_FAILED_LOGINS_PER_USERNAME": "3",
        "TOKENSVC_TEST_MONGODB_URI": "ignored: not a setting", "OTHER": "x"})
    assert settings.storage.backend == "mongodb" and settings.storage.mongodb_uri == "mongodb://db.internal:27017"
    assert settings.port == 9001 and settings.tokens.access_ttl == 60
    assert settings.xheaders is True and settings.limits.failed_logins_per_username == 3
    assert settings.proxy.trusted_networks == ("10.0.0.0/8", "192.168.0.0/16")


@pytest.mark.parametrize("text,key", [
    (SECRET + 'bogus = 1\n', "bogus: unknown key"),
    (SECRET + '[storage]\nbackedn = "memory"\n', "storage.backedn: unknown key"),
    (SECRET + 'port = "eighty"\n', "port: expected an integer"),
    (SECRET + 'demo = "yes"\n', "demo: expected a boolean"),
    (SECRET + 'base_url = "ftp://x"\n', "base_url: not a valid http/https URL"),
    (SECRET + '[tokens]\naccess_ttl = 0\n', "tokens.access_ttl: must be at least 1"),
    (SECRET + '[storage]\nbackend = "redis"\n', "storage.backend"),
    (SECRET + '[storage]\nmongodb_uri = "http://x"\n', "storage.mongodb_uri"),
    (SECRET + '[storage]\nheartbeat_seconds = 0\n',
     "storage.heartbeat_seconds: must be positive"),
    (SECRET + '[[clients]]\nclient_id = "a"\nname = "A"\n'
     'redirect_uris = ["not a url"]\n', "clients[0].redirect_uris"),
    (SECRET + '[[clients]]\nclient_id = "a b"\nname = "A"\n'
     'redirect_uris = ["https://a/cb"]\n', "clients[0].client_id"),
    (SECRET + '[[clients]]\nname = "A"\nredirect_uris = ["https://a/cb"]\n',
     "clients[0].client_id: a value is required"),
    (SECRET + '[[users]]\nusername = "a"\n', "users[0]: give exactly one"),
    (SECRET + '[[installations]]\ninstallation_id = "i"\nname = "I"\n'
     'kind = "telescope"\noperators = ["alice"]\n', "installations[0].operators[0]: unknown user 'alice'"),
    (SECRET + '[[clients]]\nclient_id = "a"\nname = "A"\nredirect_uris = ["https://a/cb"]\nclient_secret = " "\n',
     "clients[0].client_secret: expected a secret that is not empty or blank"),
    (SECRET + '[[clients]]\nclient_id = "a"\nname = "A"\nredirect_uris = ["https://a/cb"]\n'
     'client_secret_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"\n',
     "clients[0].client_secret_sha256: expected the SHA-256 of a secret that is not empty"),
    (SECRET + '[tokens]\nsuccessor_keys = ["' + "k" * 32 + '", "short"]\n',
     "tokens.successor_keys[1]: expected a secret of at least 32 characters, not 5"),
    # A list's entry at fault is named by its place.
    (SECRET + '[[clients]]\nclient_id = "a"\nname = "A"\n'
     'redirect_uris = ["https://a/cb", "not a url"]\n', "clients[0].redirect_uris[1]: not a valid redirect URI"),
    (SECRET + '[[clients]]\nclient_id = "a"\nname = "A"\nredirect_uris = ["https://a/cb"]\n'
     'allowed_scopes = ["read", "a b"]\n', "clients[0].allowed_scopes[1]: not a valid scope"),
    (SECRET + '[[clients]]\nclient_id = "a"\nname = "A"\nredirect_uris = ["https://a/cb"]\n'
     'allowed_origins = ["https://a.example", "https://*.a.example"]\n', "clients[0].allowed_origins[1]: not a web"),
    (SECRET + '[metrics]\nallow = ["127.0.0.0/8", "nowhere"]\n', "metrics.allow[1]: not a network"),
    (SECRET + 'xheaders = true\n[proxy]\ntrusted_networks = ["10.0.0.0/8", "ten"]\n',
     "proxy.trusted_networks[1]: not a network"),
    (SECRET + '[server]\nallowed_hosts = ["tokensvc", "https://auth.example"]\n',
     "server.allowed_hosts[1]: a host name or address as a request's Host names it"),
    (SECRET + '[server]\nallowed_hosts = ["tokensvc:8080"]\n', "server.allowed_hosts[0]"),
    (SECRET + 'installation_kinds = ["telescope", "Radio Dish!"]\n', "installation_kinds[1]: "),
    (SECRET + '[tokens]\nsuccessor_keys = ["' + "k" * 32 + '", "' + "k" * 32 + '"]\n',
     "tokens.successor_keys: a key is listed twice"),
    ("not toml [", "not valid TOML"),
])
def test_config_errors_name_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, text), environ={})
    assert key in str(info.value)


def test_bad_environment_values_name_the_variable(tmp_path):
    path = write(tmp_path, SECRET)
    with pytest.raises(ConfigError, match="TOKENSVC_PORT: expected an integer"):
        config.load(path, environ={"TOKENSVC_PORT": "x"})
    with pytest.raises(ConfigError, match="TOKENSVC_STORAGE_BOGUS: unknown key storage.bogus"):
        config.load(path, environ={"TOKENSVC_STORAGE_BOGUS": "x"})


def test_missing_file():
    with pytest.raises(ConfigError, match="config file not found"):
        config.load("/no/such/file.toml", environ={})


def test_a_file_that_never_ends_is_refused_in_one_line_and_nothing_hangs(tmp_path):
    """``--config /dev/zero`` (any device, pipe or socket) read without end; a config file is a
    regular file, and anything else is refused before it is read."""
    with pytest.raises(ConfigError) as info:
        config.load("/dev/zero", environ={})
    assert str(info.value) == "/dev/zero: not a regular file (give the TOML file with --config)"
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        config.load(fifo, environ={})


def test_a_file_that_starts_with_a_byte_order_mark_is_named_so(tmp_path):
    """A UTF-8 byte order mark (an editor's) made a TOML error at line 1 that named nothing."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + SECRET.encode())
    with pytest.raises(ConfigError) as info:
        config.load(path, environ={})
    assert str(info.value) == (f"{path}: starts with a UTF-8 byte order mark, which TOML does not take: save it "
                               "as UTF-8 without one")


def test_every_secret_given_by_hand_has_the_one_minimum_length_outside_demo_mode(tmp_path):
    """One rule (identifiers.MIN_SECRET_LENGTH, 32 characters) for each cookie_secret key, each
    successor key and each client_secret, the failing entry of a list named: every visitor gets
    a cookie signed with the cookie secret, on which guesses are tested offline, and the
    successor key is derived from it unless successor_keys are given. Demo mode takes weak
    secrets (and generates a long cookie secret)."""
    assert identifiers.MIN_SECRET_LENGTH == 32
    short, long = "0123456789abcdef0123", "c" * 32
    with pytest.raises(ConfigError, match=r"^cookie_secret: expected a secret of at least 32 characters, not 20"):
        config.load(write(tmp_path, f'cookie_secret = "{short}"\n'), environ={})
    # Successor keys of their own do not make a short cookie secret any harder to guess.
    with pytest.raises(ConfigError, match=r"^cookie_secret: expected a secret of at least 32"):
        config.load(write(tmp_path, f'cookie_secret = "{short}"\n[tokens]\nsuccessor_keys = ["{"k" * 32}"]\n'),
                    environ={})
    with pytest.raises(ConfigError, match=r"^cookie_secret\[1\]: expected a secret of at least 32 characters"):
        config.load(write(tmp_path, f'cookie_secret = ["{long}", "{short[:15]}"]\n'), environ={})
    # A key 0.10.0 took (16 or more) verifies after the first and signs nothing: warned, not refused.
    config.load(write(tmp_path, f'cookie_secret = ["{long}", "{short}"]\n'), environ={})
    with pytest.raises(ConfigError, match=r"^cookie_secret\[0\]: expected a secret"):
        config.load(write(tmp_path, SECRET), environ={"TOKENSVC_COOKIE_SECRET": f'["{short}", "{long}"]'})
    client = '[[clients]]\nclient_id = "a"\nname = "A"\nredirect_uris = ["https://a/cb"]\nclient_secret = "{}"\n'
    with pytest.raises(ConfigError, match=r"^clients\[0\].client_secret: expected a secret of at least 32 characters, "
                                          "not 1"):
        config.load(write(tmp_path, SECRET + client.format("x")), environ={})
    assert config.load(write(tmp_path, SECRET + client.format(long)), environ={}).clients[0].client_secret == long
    assert config.load(write(tmp_path, f'cookie_secret = "{long}"\n'), environ={}).tokens.successor_keys == ()
    demo = config.load(write(tmp_path, f'demo = true\ncookie_secret = "{short}"\n' + client.format("x")), environ={})
    assert demo.demo and demo.cookie_secret == short and demo.clients[0].client_secret == "x"
    assert config.load(write(tmp_path, "demo = true\n"), environ={}).demo


MONGODB = 'cookie_secret = "0123456789abcdef0123456789abcdef"\n[storage]\nbackend = "mongodb"\n'


def test_the_mongodb_uri_is_required_outside_demo_mode(tmp_path):
    """Unset, it would name this host alone: a forgotten Secret would leave a production service
    waiting for a database that is not there."""
    with pytest.raises(ConfigError, match=r'^storage.mongodb_uri: required with storage.backend = "mongodb" outside '
                                          "demo mode"):
        config.load(write(tmp_path, MONGODB), environ={})
    with pytest.raises(ConfigError, match="^storage.mongodb_uri: required"):
        config.load(write(tmp_path, SECRET), environ={"TOKENSVC_STORAGE_BACKEND": "mongodb"})
    given = config.load(write(tmp_path, MONGODB), environ={"TOKENSVC_STORAGE_MONGODB_URI": "mongodb://db1,db2/"})
    assert given.storage.mongodb_uri == "mongodb://db1,db2/"
    demo = config.load(write(tmp_path, "demo = true\n" + MONGODB), environ={})
    assert demo.storage.mongodb_uri == "mongodb://127.0.0.1:27017"  # trying it out on this machine


@pytest.mark.parametrize("uri,warned", [
    ("mongodb://tokensvc:pw@db-0.db,db-1.db,db-2.db/?replicaSet=rs0&authSource=admin", None),
    ("mongodb+srv://tokensvc:pw@cluster0.example.net/?retryWrites=true", None),
    ("mongodb://127.0.0.1:27017", "storage.mongodb_uri: names this machine alone (127.0.0.1)"),
    ("mongodb://tokensvc:pw@localhost,[::1]:27018/?replicaSet=rs0", "names this machine alone (localhost, ::1)"),
    ("mongodb://db1.example:27017/?directConnection=true", "storage.mongodb_uri: directConnection=true"),
    ("mongodb://db1.example/tokensvc?replicaSet=rs0&DirectConnection=true", "directConnection=true"),
])
def test_a_mongodb_uri_no_production_store_has_is_warned_of(tmp_path, uri, warned):
    settings = config.load(write(tmp_path, MONGODB), environ={"TOKENSVC_STORAGE_MONGODB_URI": uri})
    found = config.warnings(settings)
    assert (found == []) if warned is None else any(warned in warning for warning in found), found


def test_what_no_production_deployment_wants_is_warned_of_demo_mode_alone_in_a_demo():
    replica_set = {"backend": "mongodb", "mongodb_uri": "mongodb://db1,db2,db3/?replicaSet=rs0"}
    assert config.warnings(config.from_dict({"cookie_secret": "x" * 32, "base_url": "https://auth.example",
                                             "storage": replica_set, "xheaders": True,
                                             "proxy": {"trusted_networks": ["10.0.0.0/8"]}})) == []
    memory = config.warnings(config.from_dict({"cookie_secret": "x" * 32}))
    assert memory == ['storage.backend: "memory" keeps nothing across a restart and serves one process alone; '
                      'production uses "mongodb"']
    plain = config.warnings(config.from_dict({"cookie_secret": "x" * 32, "base_url": "http://auth.example",
                                              "auth_url": "http://login.example"}))
    assert [warning.split(":")[0] for warning in plain] == ["storage.backend", "base_url", "auth_url"]
    assert config.warnings(config.from_dict({"demo": True, "base_url": "http://auth.example"})) == [
        "demo: true: weak secrets are taken and a cookie secret may be generated; for trying tokensvc out, not for "
        "production"]


def test_successor_keys_come_from_the_environment_too_and_are_never_shown(tmp_path):
    new, old = "n" * 40, "o" * 40
    settings = config.load(write(tmp_path, SECRET),
                           environ={"TOKENSVC_TOKENS_SUCCESSOR_KEYS": f"{new},{old}"})
    assert settings.tokens.successor_keys == (new, old)
    assert new not in repr(settings) and new not in repr(config.masked(settings))
    assert config.masked(settings)["tokens"]["successor_keys"] == ["***", "***"]


def test_masked_hides_every_secret():
    settings = config.load(REPO / "config" / "tokensvc.toml", environ={})
    masked = repr(config.masked(settings))
    assert settings.cookie_secret not in masked
    for client in settings.clients:
        if client.client_secret:
            assert client.client_secret not in masked
    for user in settings.users:
        assert user.password not in masked


@pytest.mark.parametrize("uri,problem", [
    ("javascript:alert(1)", "the javascript: scheme is never a redirect target"),
    ("data:text/html,x", "the data: scheme is never a redirect target"),
    ("file:///etc/passwd", "the file: scheme is never a redirect target"),
    ("JavaScript:alert(1)", "the javascript: scheme is never a redirect target"),
    ("http://client.example/cb", "http only to a loopback host (127.0.0.1, [::1], localhost); use https"),
    ("https://client.example/cb#frag", "a fragment is not allowed (RFC 6749 §3.1.2)"),
    ("https:///cb", "an https URI needs a host"),
    ("/relative/cb", "an absolute URI is required"),
    ("https://user@client.example/cb", "no user info before the host"),
    ("myapp://user@host/cb", "no user info before the host"),
    *((uri, identifiers.URI_RULE) for uri in (
        "HTTPS://client.example/cb", "https://client.example:0/cb", "https://client.example:99999/cb",
        "https://clïent.example/cb", "https://client.example/<cb>", "https://client.example/a|b",
        "https://client.example/{cb}", "https://client_1.example/cb", "https://[::1]/cb", "com.example.App:/cb",
        "http://LOCALHOST/cb", "myapp:/path^x")),
])
def test_redirect_uris_are_refused_with_one_clear_message(tmp_path, uri, problem):
    path = tmp_path / "c.toml"
    path.write_text(f'demo = true\n[[clients]]\nclient_id = "a"\nname = "A"\nredirect_uris = ["{uri}"]\n')
    with pytest.raises(config.ConfigError) as error:
        config.load(path, environ={})
    assert str(error.value) == f"clients[0].redirect_uris[0]: not a valid redirect URI ({problem}): {uri!r}"


@pytest.mark.parametrize("uri", ["https://client.example/cb?x=1", "http://127.0.0.1:9000/cb", "http://127.8.0.1/cb",
                                 "http://[::1]:8000/cb", "http://localhost/cb", "com.example.app:/oauth2redirect",
                                 "myapp://cb"])
def test_redirect_uris_that_are_allowed(tmp_path, uri):
    path = tmp_path / "c.toml"
    path.write_text(f'demo = true\n[[clients]]\nclient_id = "a"\nname = "A"\nredirect_uris = ["{uri}"]\n')
    assert config.load(path, environ={}).clients[0].redirect_uris == (uri,)


@pytest.mark.parametrize("weak", ["password", "12345678", "carol2024", "tokensvc12",
                                  # the username or the service's name, whatever separators, digits or case
                                  "tokensvc-carol", "carol_tokensvc_2026", "CAROL-orbit-lantern",
                                  "orbit.lantern.tokens-vc"])
def test_a_weak_password_in_the_config_is_refused(weak):
    with pytest.raises(ConfigError, match=r"^users\[0\]\.password: this password is too easy to guess"):
        config.from_dict({"demo": True, "users": [{"username": "carol", "password": weak}]})


@pytest.mark.parametrize("username,password", [
    ("carol", "c4rol-t0kensvc-2026"),  # digits for letters
    ("carol", "\u0107arol-t\u00f3kensvc-99"),  # accents: ćarol-tókensvc-99
    ("carol", "\u0441arol-orbit-lantern"),  # a Cyrillic с for c
    ("carol", "ca\u0301rol-orbit-lantern"),  # a combining accent
    ("carol", "C@R0L-orbit-lantern"),
    ("r00t", "r00t-granite-harbor"),  # a username of fewer than 3 letters, read as "root"
    ("r00t", "root-granite-harbor"),
    ("alice", "a1ice-granite-harbor"),  # 1, l and i read alike
    ("dave", "granite-harbor-tok3nsvc"),  # the service's name
    ("dora.smith", "dora-granite-harbor"),  # a part of the username
    ("dora.smith", "granite-harbor-5mith"),
    ("dora_smith@example.org", "dora-granite-harbor"),
    ("carol", "lorac-granite-harbor"),  # reversed
    ("dora.smith", "granite-htims-harbor"),
    ("dave", "cvsnekot-granite-harbor"),
    ("carol", "\u1d04\u1d00\u0280\u1d0f\u029f-granite-harbor"),  # small capitals: ᴄᴀʀᴏʟ
    ("dave", "granite-\u1d1b\u1d0f\u1d0b\u1d07\u0274\ua731\u1d20\u1d04-harbor"),  # ᴛᴏᴋᴇɴꜱᴠᴄ
    ("carol", "c\u2c65r\u00f8l-granite-harbor"),  # strokes, which no decomposition takes off: cⱥrøl
])
def test_a_password_holding_the_username_however_written_is_refused(username, password):
    """The username or the service's name is found in a password however it is written: digits,
    signs, accents or letters of another script that read as its letters (all passed before)."""
    with pytest.raises(ConfigError, match=r"it holds the username or the service's name"):
        config.from_dict({"demo": True, "users": [{"username": username, "password": password}]})


@pytest.mark.parametrize("username,password", [("carol", "violet-comet-harbor"), ("r00t", "granite-harbor-ember"),
                                               ("al", "alpine-granite-harbor"), ("al.bo", "alpine-bonfire-harbor"),
                                               ("dora@example.org", "gorgeous-granite-harbor")])
def test_a_password_of_unrelated_words_passes_the_context_rule(username, password):
    """No composition rule (NIST SP 800-63B §5.1.1.2), and a username of fewer than 3 letters as
    it reads (``al``), or a part of one (``al.bo``), is part of too many words to refuse; an
    address's domain is no part of the person's name (``org`` in ``gorgeous``)."""
    settings = config.from_dict({"demo": True, "users": [{"username": username, "password": password}]})
    assert settings.users[0].password == password


def test_the_demo_passwords_pass_the_password_rule():
    settings = config.load("config/tokensvc.toml", environ={})
    assert {user.username for user in settings.users if user.password} >= {"alice", "root"}


@pytest.mark.parametrize("logo,problem", [
    ("ftp://client.example/logo.png", "an absolute http(s) URL with a host"),
    ("https://user@client.example/logo.png", identifiers.URI_RULE),
    ("https://client.example:99999/logo.png", identifiers.URI_RULE),
    ("https://client.example/logo|1.png", identifiers.URI_RULE),
    ("https://clïent.example/logo.png", identifiers.URI_RULE),
])
def test_a_logo_url_follows_the_admin_apis_rule_in_the_config(logo, problem):
    """The configuration's logo URLs meet the rule of the command line and the admin API (it
    only asked for an http(s) URL with a host); a path stays one served by the service."""
    client = {"client_id": "a", "name": "A", "redirect_uris": ["https://client.example/cb"]}
    with pytest.raises(ConfigError) as error:
        config.from_dict({"demo": True, "clients": [{**client, "logo_url": logo}]})
    assert str(error.value) == f"clients[0].logo_url: not a valid logo URL ({problem}): {logo!r}"
    served = config.from_dict({"demo": True, "clients": [{**client, "logo_url": "/static/demo-client.svg"}]})
    assert identifiers.logo_url_problem(served.clients[0].logo_url) is None


@pytest.mark.parametrize("dots", [".", ".."])
def test_a_dot_segment_names_nothing_in_the_config(dots):
    with pytest.raises(ConfigError, match=r"^users\[0\]\.username: "):
        config.from_dict({"demo": True, "users": [{"username": dots, "password_hash": "scrypt$x"}]})
    with pytest.raises(ConfigError, match=r"^clients\[0\]\.client_id: "):
        config.from_dict({"demo": True, "clients": [{"client_id": dots, "name": "A",
                                                     "redirect_uris": ["https://client.example/cb"]}]})
    with pytest.raises(ConfigError, match=r"^installations\[0\]\.installation_id: "):
        config.from_dict({"demo": True, "installations": [{"installation_id": dots, "name": "I",
                                                           "kind": "telescope"}]})


def test_allowed_scopes_follow_the_scope_grammar_of_the_cli():
    with pytest.raises(ConfigError, match=r"clients\[0\]\.allowed_scopes\[1\]: not a valid scope"):
        config.from_dict({"demo": True, "clients": [{"client_id": "c", "name": "C",
                                                      "redirect_uris": ["https://c.example/cb"],
                                                      "allowed_scopes": ["read", 'bad"scope']}]})


@pytest.mark.parametrize("origin,fine", [("https://app.example", True), ("http://127.0.0.1:8001", True),
                                         ("https://app.example:8443", True), ("http://app.example", False),
                                         ("https://app.example/", False), ("https://app.example/x", False),
                                         ("app.example", False), ("*", False),
                                         # a pattern is no origin: a browser never sends one
                                         ("https://*.evil.example", False), ("https://app.*", False),
                                         # written as a browser writes it, or not at all
                                         ("https://App.example", False), ("https://app.example:443", False),
                                         ("https://user@app.example", False), ("https://app..example", False),
                                         ("https://-app.example", False), ("https://bücher.example", False),
                                         ("https://xn--bcher-kva.example", True), ("http://[::1]:8001", True)])
def test_allowed_origins_are_web_origins(origin, fine):
    raw = {"demo": True, "clients": [{"client_id": "c", "name": "C", "redirect_uris": ["https://c.example/cb"],
                                      "allowed_origins": [origin]}]}
    if fine:
        assert config.from_dict(raw).clients[0].allowed_origins == (origin,)
    else:
        with pytest.raises(ConfigError, match=r"clients\[0\]\.allowed_origins\[0\]: not a web origin"):
            config.from_dict(raw)


def test_usernames_are_one_per_key_in_the_config():
    """ROOT and root are one user (NFKC, case folded): the file may not name both, and an
    installation's operator is found whatever the case it is written in."""
    with pytest.raises(ConfigError, match=r"^users\[1\]\.username: duplicate username 'ROOT'"):
        config.from_dict({"demo": True, "users": [{"username": "root", "password_hash": PASSWORD_HASHES["root"]},
                                                  {"username": "ROOT", "password_hash": PASSWORD_HASHES["alice"]}]})
    settings = config.from_dict({"demo": True,
                                 "users": [{"username": "Root", "password_hash": PASSWORD_HASHES["root"]}],
                                 "installations": [{"installation_id": "i", "name": "I", "kind": "telescope",
                                                    "operators": ["ROOT"]}]})
    assert settings.installations[0].operators == ("ROOT",)


@pytest.mark.parametrize("problem,valid", [(identifiers.id_problem, "client-1"), (identifiers.username_problem, "bob"),
                                           (identifiers.scope_problem, "read"),
                                           (identifiers.secret_sha256_problem, "0" * 64),
                                           (identifiers.password_hash_problem, PASSWORD_HASHES["alice"])])
def test_a_trailing_newline_makes_no_identifier(problem, valid):
    """``$`` would let one through (it matches before a final newline): every rule is a full match."""
    assert problem(valid) is None
    assert problem(valid + "\n") is not None and problem("\n" + valid) is not None


def test_a_pkce_challenge_or_verifier_with_a_trailing_newline_is_refused():
    from tokensvc.oauth import pkce

    assert pkce.is_valid_challenge("a" * 43) and not pkce.is_valid_challenge("a" * 43 + "\n")
    assert pkce.is_valid_verifier("a" * 43) and not pkce.is_valid_verifier("a" * 43 + "\n")


@pytest.mark.parametrize("pattern,accepts", [
    (identifiers.REDIRECT_URI, lambda uri: identifiers.redirect_uri_problem(uri) is None),
    (identifiers.ORIGIN, lambda origin: identifiers.origin_problem(origin) is None),
    (identifiers.WEB_URL, lambda url: identifiers.logo_url_problem(url) is None),
    (identifiers.NAME, lambda name: identifiers.name_problem(name) is None and name.strip() != ""),
])
def test_every_string_a_documented_pattern_admits_is_accepted(pattern, accepts):
    """The OpenAPI document states these expressions as the rules; each rule's function also
    names its faults first (for their messages), and admits every string the expression does,
    so the document and the service agree both ways."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    longest = identifiers.ORIGIN_MAX_LENGTH if pattern is identifiers.ORIGIN else None

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(st.from_regex(pattern, fullmatch=True).filter(lambda value: longest is None or len(value) <= longest))
    def admitted(value):
        assert accepts(value), value

    admitted()


@pytest.mark.parametrize("pattern,problem", [(identifiers.REDIRECT_URI, identifiers.redirect_uri_problem),
                                             (identifiers.WEB_URL, identifiers.logo_url_problem)])
def test_every_string_a_rule_accepts_is_one_its_documented_pattern_admits(pattern, problem):
    """The converse of the test above: no scheme has a way around the stated expression (https
    was accepted after its named checks alone, user info, ports 0 and 99999 and all)."""
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    uris = st.builds("{}://{}{}{}".format, st.sampled_from(["https", "http", "HTTPS", "myapp", "com.example.App"]),
                     st.text("abcXYZ019._-@:[]%~!*'|{}<>\\ä", min_size=1, max_size=20),
                     st.sampled_from(["", ":0", ":443", ":99999", ":65535"]),
                     st.text("/abc?=&#@:%|<>{}^`\"ä ", max_size=12))

    @settings(max_examples=500, derandomize=True, database=None, deadline=None)
    @given(uris)
    @example("https://user@app.example/cb")
    @example("myapp://user@host/cb")
    def accepted_only_as_stated(uri):
        if problem(uri) is None:
            assert pattern.fullmatch(uri), uri

    accepted_only_as_stated()


FULL = """
demo = true
xheaders = true
[tokens]
successor_keys = ["0123456789abcdef0123456789abcdef"]
[server]
allowed_hosts = ["auth.example.org"]
[proxy]
trusted_networks = ["10.0.0.0/8"]
[metrics]
allow = ["127.0.0.0/8"]
[scopes]
"observations:write" = "Create and change your observations"
[[clients]]
client_id = "c"
name = "C"
redirect_uris = ["https://c.example/cb"]
allowed_scopes = ["read"]
allowed_origins = ["https://c.example"]
[[users]]
username = "alice"
password_hash = "scrypt$x"
[[installations]]
installation_id = "i"
name = "I"
kind = "telescope"
operators = ["alice"]
"""


def mutable_parts(value, path="settings"):
    """The paths under ``value`` that hold something that can be changed in place."""
    import dataclasses
    from types import MappingProxyType

    if value is None or isinstance(value, (str, int, float, bytes)):
        return []
    if dataclasses.is_dataclass(value):
        own = [] if type(value).__dataclass_params__.frozen else [path]
        return own + [part for f in dataclasses.fields(value)
                      for part in mutable_parts(getattr(value, f.name), f"{path}.{f.name}")]
    if isinstance(value, (tuple, frozenset)):
        return [part for index, item in enumerate(value) for part in mutable_parts(item, f"{path}[{index}]")]
    if isinstance(value, MappingProxyType):
        return [part for key, item in value.items() for part in mutable_parts(item, f"{path}[{key!r}]")]
    return [path]


def test_the_settings_hold_nothing_mutable_all_the_way_down(tmp_path):
    """Every holder of the settings (the protocol context, each application of the process)
    shares one object: no list, dict or set anywhere in it, from the file, the environment or
    the defaults, whatever a table holds."""
    full = FULL.replace("scrypt$x", PASSWORD_HASHES["alice"])  # a hash as the service writes one
    settings = config.load(write(tmp_path, full), environ={"TOKENSVC_SERVER_ALLOWED_HOSTS": "a.example, b.example"})
    assert settings.server.allowed_hosts == ("a.example", "b.example")
    for sample in (settings, config.from_dict({"demo": True}), config.load(REPO / "config" / "tokensvc.toml",
                                                                            environ={})):
        assert mutable_parts(sample) == []
    with pytest.raises(TypeError):
        settings.scopes["read"] = "anything"
    # The walk finds what it looks for, however deep.
    assert mutable_parts(config.ServerSettings(allowed_hosts=["x"])) == ["settings.allowed_hosts"]
    assert mutable_parts((config.MetricsSettings(), {"read": "x"})) == ["settings[1]"]


@pytest.mark.parametrize("pattern,accepts,starts", [
    (identifiers.REDIRECT_URI, lambda uri: identifiers.redirect_uri_problem(uri) is None,
     ["https://", "https://app.example", "http://127.0.0.1", "com.example.app:/", "HTTPS://app.example"]),
    (identifiers.ORIGIN, lambda origin: identifiers.origin_problem(origin) is None,
     ["https://", "https://app.example", "http://localhost", "http://[::1]"]),
])
def test_no_string_a_documented_pattern_refuses_is_accepted(pattern, accepts, starts):
    """The other way round: what the expression refuses, the rule refuses, whatever named
    fault it checks first (an https URI with a host is no exception: "https://0P8*" has a
    character no host may hold)."""
    import string

    from hypothesis import given, settings
    from hypothesis import strategies as st

    tails = st.text(alphabet=string.ascii_letters[:6] + string.digits[:3] + string.punctuation + " \t\u00e9",
                    max_size=16)

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(st.sampled_from(starts), tails)
    def refused(start, tail):
        value = start + tail
        assert not accepts(value) or pattern.fullmatch(value), value

    refused()
    assert not accepts("https://0P8*") and not accepts("https://user@app.example/cb")


def test_installation_kinds_are_configurable_and_every_installation_is_one_of_them():
    assert config.from_dict({"cookie_secret": "k" * 32}).installation_kinds == ("telescope", "observatory")
    chosen = config.from_dict({"cookie_secret": "k" * 32, "installation_kinds": ["antenna", "weather station"],
                               "installations": [{"installation_id": "dish", "name": "Dish", "kind": "antenna"}]})
    assert chosen.installation_kinds == ("antenna", "weather station")
    for kinds, problem in (([], "installation_kinds: .*at least one kind"),
                           (["Antenna"], r"installation_kinds\[0\]: .*lower-case letters"),
                           (["dish", "dish"], "installation_kinds: .*listed twice")):
        with pytest.raises(ConfigError, match=problem):
            config.from_dict({"cookie_secret": "k" * 32, "installation_kinds": kinds})
    with pytest.raises(ConfigError, match=r"installations\[0\].kind: one of antenna, got 'telescope'"):
        config.from_dict({"cookie_secret": "k" * 32, "installation_kinds": ["antenna"],
                          "installations": [{"installation_id": "scope", "name": "Scope", "kind": "telescope"}]})


def test_a_password_hash_must_be_one_the_service_wrote():
    from tokensvc.oauth import hashing

    good = hashing.hash_password("orbit-lantern-quiet")
    assert config.from_dict({"cookie_secret": "k" * 32, "users": [{"username": "u", "password_hash": good}]})
    with pytest.raises(ConfigError, match=r"users\[0\].password_hash: expected a scrypt hash"):
        config.from_dict({"cookie_secret": "k" * 32, "users": [{"username": "u", "password_hash": "md5$abc"}]})


def test_an_apply_entry_is_checked_key_by_key():
    assert config.entry_problems("clients", {"client_id": "x", "first_party": True}) == []
    assert config.entry_problems("clients", {"client_id": "x", "first_partyy": True, "name": 3}) == [
        ("first_partyy", "unknown key (the keys of [[clients]]: client_id, name, redirect_uris, kind, allowed_scopes, "
                         "first_party, client_secret, client_secret_sha256, description, logo_url, allowed_origins, "
                         "resources)"),
        ("name", "expected a string, got 3")]
    assert config.entry_problems("users", "alice") == [(None, "expected a table, got 'alice'")]


def test_cookie_secret_may_be_the_keys_of_a_rotation(tmp_path):
    keys = ["the-new-cookie-secret-0123456789", "the-old-cookie-secret-0123456789"]  # 32: successor keys too
    settings = config.from_dict({"cookie_secret": keys})
    assert settings.cookie_secret == keys[0] and settings.cookie_secrets == tuple(keys)
    assert config.from_dict({"cookie_secret": keys[0]}).cookie_secrets == (keys[0],)
    from_env = config.load(None, environ={"TOKENSVC_COOKIE_SECRET": json.dumps(keys)})
    assert from_env.cookie_secrets == tuple(keys)
    masked = config.masked(settings)
    assert masked["cookie_secret"] == ["***", "***"] and "cookie_secrets" not in masked
    for wrong, problem in (([keys[0], "too-short-15-ch"], r"\[1\]: expected a secret of at least 32"),
                           ([keys[0], keys[0]], ": .*listed twice"), ([], ": .*required"),
                           ([keys[0], 3], ": .*a string or a list of strings")):
        with pytest.raises(ConfigError, match=f"^cookie_secret{problem}"):
            config.from_dict({"cookie_secret": wrong})
    with pytest.raises(ConfigError, match="TOKENSVC_COOKIE_SECRET: a list of keys is a JSON array"):
        config.load(None, environ={"TOKENSVC_COOKIE_SECRET": '["unterminated'})
    with pytest.raises(ConfigError, match="cookie_secrets: unknown key"):
        config.from_dict({"cookie_secret": keys, "cookie_secrets": keys})


# -- every problem at once ---------------------------------------------------------------------

SEVERAL = SECRET + """port = "eighty"
bogus = 1
[tokens]
access_ttl = 0
[metrics]
allow = ["127.0.0.0/8", "nowhere"]
[storage]
backend = "mongodb"
mongodb_uri = "mongodb://db1,db2,db3/?replicaSet=rs0&tsl=true"
[[clients]]
client_id = "a"
name = "A"
redirect_uris = "https://a.example/cb"
[[clients]]
client_id = "b c"
name = "B"
redirect_uris = ["https://b.example/cb#x"]
[[users]]
username = "alice"
password_hash = "md5$abc"
"""


def test_every_problem_of_a_configuration_is_named_at_once(tmp_path):
    """A reading of the settings goes on past the first problem and names each, its key first,
    in the order of the file's stages (types, then rules); what follows from a value refused
    (a client whose redirect_uris were refused has none) is not said again."""
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, SEVERAL), environ={"TOKENSVC_LIMITS_WINDOW_SECONDS": "soon",
                                                       "TOKENSVC_FEED_BOGUS": "1"})
    problems = info.value.problems
    assert [problem.split(":")[0] for problem in problems] == [
        "TOKENSVC_LIMITS_WINDOW_SECONDS", "TOKENSVC_FEED_BOGUS", "port", "bogus", "clients[0].redirect_uris",
        "storage.mongodb_uri", "tokens.access_ttl", "metrics.allow[1]", "clients[1].client_id",
        "clients[1].redirect_uris[0]", "users[0].password_hash"], problems
    assert str(info.value) == "\n".join(problems)
    assert "at least one redirect URI" not in str(info.value)  # clients[0]'s followed from its refused list
    # A problem alone is the one line it was.
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, SECRET + '[tokens]\naccess_ttl = 0\n'), environ={})
    assert info.value.problems == ["tokens.access_ttl: must be at least 1, got 0"]


def test_a_port_out_of_range_is_said_once_not_again_through_what_follows_from_it():
    """base_url, auth_url and a logo's URL follow from the port when unset: the port alone is named."""
    with pytest.raises(ConfigError) as info:
        config.from_dict({"demo": True, "port": 99999, "clients": [
            {"client_id": "c", "name": "C", "redirect_uris": ["https://c.example/cb"], "logo_url": "/static/x.svg"}]})
    assert info.value.problems == ["port: 99999 is outside 1-65535; choose another with --port or TOKENSVC_PORT"]


def test_an_entry_that_is_no_table_is_named_once():
    with pytest.raises(ConfigError) as info:
        config.from_dict({"cookie_secret": "k" * 32, "clients": ["webapp"], "users": [{"name": "x"}],
                          "server": 3})
    assert info.value.problems == ["clients[0]: expected a table, got 'webapp'", "users[0].name: unknown key",
                                   "users[0].username: a value is required", "server: expected a table, got 3"]


# -- the MongoDB URI, as PyMongo reads it --------------------------------------------------------


@pytest.mark.parametrize("options,problems", [
    ("replicaSet=rs0&tsl=true", ["storage.mongodb_uri: option 2 of the query, not named (it may be credential "
                                 "text): Unknown option. Did you mean one of (tls, ssl, tlscafile)"]),
    ("tls=maybe", ["storage.mongodb_uri: option tls: The value of tls must be 'true' or 'false'"]),
    ("bogusOption=1&replicaSet=rs0", ["storage.mongodb_uri: option 1 of the query, not named"]),
    ("tls=true&tls=false", ["storage.mongodb_uri: Duplicate URI option 'tls'."]),
    # Given three times, named once (the driver says it once per extra copy).
    ("replicaSet=rs0&w=1&w=1&w=2", ["storage.mongodb_uri: Duplicate URI option 'w'."]),
    ("ssl=true&tls=false", ["storage.mongodb_uri: Can not specify conflicting values for URI options ssl and tls"]),
    ("tsl=true&journal=maybe&w=majority&w=1", [
        "storage.mongodb_uri: option 1 of the query, not named", "storage.mongodb_uri: option journal: ",
        "storage.mongodb_uri: Duplicate URI option 'w'."]),
])
def test_the_mongodb_uri_is_read_by_pymongos_own_parser(tmp_path, options, problems):
    """A misspelt option (PyMongo's own ``tsl``), a value it does not take, an option given
    twice: each a problem naming the key, as start-up would meet it in the driver (or not at
    all: a duplicate's last value wins silently). An unknown option is named by its place (it
    may be credential text); the password never appears; nothing is written to standard error
    as a warning."""
    import warnings

    uri = f"mongodb://tokensvc:hunter2-secret@db1,db2,db3/?{options}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning PyMongo issued would fail the test here
        with pytest.raises(ConfigError) as info:
            config.load(write(tmp_path, MONGODB), environ={"TOKENSVC_STORAGE_MONGODB_URI": uri})
    found = info.value.problems
    assert len(found) == len(problems), found
    assert all(line.startswith(expected) for line, expected in zip(found, problems, strict=True)), found
    assert "hunter2" not in str(info.value) and "tsl" not in str(info.value) and "bogus" not in str(info.value)


@pytest.mark.parametrize("uri", [
    "mongodb://tokensvc:pw@db-0.db,db-1.db,db-2.db/?replicaSet=rs0&authSource=admin",
    "mongodb+srv://tokensvc:pw@cluster0.invalid/?retryWrites=true&w=majority",  # never looked up
    "mongodb://db1:27017,db2:27018/tokensvc?replicaSet=rs0&readPreferenceTags=dc:ny&readPreferenceTags=&tls=true",
    "mongodb://db1/?appName=tokensvc;replicaSet=rs0",
])
def test_a_mongodb_uri_pymongo_takes_passes(tmp_path, uri):
    settings = config.load(write(tmp_path, MONGODB), environ={"TOKENSVC_STORAGE_MONGODB_URI": uri})
    assert settings.storage.mongodb_uri == uri


# -- a file that cannot be read ----------------------------------------------------------------


def test_a_config_path_that_cannot_be_read_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as info:
        config.load(tmp_path, environ={})
    assert info.value.problems == [f"{tmp_path}: a directory, not a config file (give the TOML file with --config)"]
    latin = tmp_path / "latin-1.toml"
    latin.write_bytes(SECRET.encode() + 'service_name = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        config.load(latin, environ={})
    where = len(SECRET.encode()) + len(b'service_name = "caf')
    assert info.value.problems == [f"{latin}: not UTF-8 text (byte {where}): a config file is TOML in UTF-8"]
    locked = write(tmp_path, SECRET)

    def refused(self, *args, **kwargs):  # as a file of another user's reads (the tests may run as root)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refused)
    with pytest.raises(ConfigError) as info:
        config.load(locked, environ={})
    assert info.value.problems == [f"{locked}: cannot be read: Permission denied"]


# -- lists from the environment ----------------------------------------------------------------


def test_a_list_from_the_environment_is_a_json_array_or_comma_separated(tmp_path):
    """``TOKENSVC_TOKENS_SUCCESSOR_KEYS='["a...", "b..."]'`` was split on its comma: two keys
    with brackets and quotes in them, each long enough to be taken, neither the one meant."""
    new, old = "n" * 40, "o,ld" + "o" * 36  # a comma in a key: the JSON form alone can hold it
    path = write(tmp_path, SECRET)
    settings = config.load(path, environ={"TOKENSVC_TOKENS_SUCCESSOR_KEYS": json.dumps([new, old])})
    assert settings.tokens.successor_keys == (new, old)
    settings = config.load(path, environ={"TOKENSVC_TOKENS_SUCCESSOR_KEYS": f" [ {json.dumps(new)} ] "})
    assert settings.tokens.successor_keys == (new,)
    settings = config.load(path, environ={"TOKENSVC_TOKENS_SUCCESSOR_KEYS": f"{new},{'p' * 40}"})
    assert settings.tokens.successor_keys == (new, "p" * 40)  # the comma form, as before
    hosts = config.load(path, environ={"TOKENSVC_SERVER_ALLOWED_HOSTS": "[::1],tokensvc",
                                       "TOKENSVC_METRICS_ALLOW": '["10.0.0.0/8", "::1/128"]'})
    assert hosts.server.allowed_hosts == ("[::1]", "tokensvc") and hosts.metrics.allow == ("10.0.0.0/8", "::1/128")
    for broken in (f'["{new}", "{old}"', f'["{new}", 3]', '{"a": 1}'.replace("{", "[", 1).replace("}", "]")):
        with pytest.raises(ConfigError) as info:
            config.load(path, environ={"TOKENSVC_TOKENS_SUCCESSOR_KEYS": broken})
        assert info.value.problems == ["TOKENSVC_TOKENS_SUCCESSOR_KEYS: a list is a JSON array of strings, or "
                                       "comma-separated, got a value not shown (it holds keys)"], broken
    with pytest.raises(ConfigError, match=r"^TOKENSVC_PROXY_TRUSTED_NETWORKS: a list is a JSON array of strings, or "
                                          r"comma-separated, got '\[\"10.0.0.0/8\"'$"):
        config.load(path, environ={"TOKENSVC_PROXY_TRUSTED_NETWORKS": '["10.0.0.0/8"'})


# -- no problem shows a secret -----------------------------------------------------------------


@pytest.mark.parametrize("uri", [
    "mongdb://tokensvc:S3cr3tPW@db1.example/?replicaSet=rs0",  # a scheme misspelt
    '"mongodb://tokensvc:S3cr3tPW@db1.example/?replicaSet=rs0"',  # quoted, as docker --env-file keeps it
    "'mongodb://tokensvc:S3cr3tPW@db1.example/?replicaSet=rs0'",
    "mongodb://tokensvc:S3cr3t/PW@db1.example/?replicaSet=rs0",  # a '/' in the password, not escaped
    "mongodb://tokensvc:S3cr3tPW@db1.example:notaport/?replicaSet=rs0",
])
def test_no_problem_of_the_mongodb_uri_shows_its_user_or_password(tmp_path, uri):
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MONGODB), environ={"TOKENSVC_STORAGE_MONGODB_URI": uri})
    said = str(info.value)
    assert "S3cr3t" not in said and "tokensvc:" not in said and info.value.problems, said
    assert all(line.startswith("storage.mongodb_uri: ") for line in info.value.problems), said
    if uri[0] in "\"'":
        assert "***@db1.example" in said and "remove the quotes" in said
    assert "S3cr3t" not in json.dumps(config.masked(config.load(write(tmp_path, MONGODB), environ={
        "TOKENSVC_STORAGE_MONGODB_URI": "mongodb://tokensvc:S3cr3tPW@db1,db2/?replicaSet=rs0"})))


def test_the_mongodb_uri_is_masked_before_its_problems_are_said_not_in_their_text(tmp_path):
    """A user ``u`` replaced in the text made "Duplicate" "D***plicate", and gave a password
    away by its context."""
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MONGODB), environ={"TOKENSVC_STORAGE_MONGODB_URI":
                                                       "mongodb://u:ption@db1,db2/?replicaSet=rs0&w=1&w=2"})
    assert info.value.problems == ["storage.mongodb_uri: Duplicate URI option 'w'."]


def test_a_tls_file_the_mongodb_uri_names_that_cannot_be_read_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, MONGODB), environ={
            "TOKENSVC_STORAGE_MONGODB_URI": f"mongodb://db1,db2/?replicaSet=rs0&tlsCAFile={tmp_path}/missing.pem"})
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("storage.mongodb_uri: option tlsCAFile: ")
    assert "not readable" in info.value.problems[0]


@pytest.mark.parametrize("text", [
    '[tokens]\nsuccessor_keys = "S3cr3t-successor-key-0123456789abcdef"\n',
    '[[clients]]\nclient_id = "webapp"\nname = "W"\nclient_secret = ["S3cr3t-client"]\n'
    'redirect_uris = ["https://w.example/cb"]\n',
    '[[users]]\nusername = "alice"\npassword = ["S3cr3t-password"]\n',
])
def test_a_secret_of_the_wrong_type_is_not_shown(tmp_path, text):
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, SECRET + text), environ={})
    assert "S3cr3t" not in str(info.value) and "not shown" in str(info.value), info.value.problems


def test_a_python_list_of_keys_in_the_environment_is_refused_not_split(tmp_path):
    """``"['a...', 'b...']"`` was taken as the keys ``['a...'`` and ``'b...']``."""
    new, old = "n" * 40, "o" * 40
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, SECRET), environ={"TOKENSVC_TOKENS_SUCCESSOR_KEYS": f"['{new}', '{old}']"})
    assert info.value.problems == ["TOKENSVC_TOKENS_SUCCESSOR_KEYS: a list is a JSON array of strings, or "
                                   "comma-separated, got a value not shown (it holds keys)"]


def test_a_short_cookie_secret_of_0_10_0_is_kept_to_verify_only(tmp_path):
    """0.10.0 took a 16-character cookie_secret; this release signs with 32 or more. Kept after
    a new key, the short one verifies what it signed (nobody is signed out) and never signs."""
    new, old = "n" * 32, "o" * 16
    settings = config.load(write(tmp_path, f'cookie_secret = ["{new}", "{old}"]\n'), environ={})
    assert settings.cookie_secret == new and settings.cookie_secrets == (new, old)
    assert [line for line in config.warnings(settings) if line.startswith("cookie_secret[1]: 16 characters")]
    for keys in ([old, new], [new, "o" * 15], [old]):
        with pytest.raises(ConfigError, match=r"cookie_secret(\[\d\])?: expected a secret of at least 32"):
            config.load(write(tmp_path, f"cookie_secret = {json.dumps(keys)}\n"), environ={})


@pytest.mark.parametrize("listener", ['host = "127.0.0.1"\n',
                                      'host = "0.0.0.0"\n[server]\nunix_socket = "/run/t.sock"\n'])
def test_an_https_service_behind_a_proxy_on_this_host_without_xheaders_is_warned_of(tmp_path, listener):
    """Every client then has the proxy's address: 21 wrong sign-ins lock everyone out."""
    text = SECRET + 'base_url = "https://auth.example.org"\n' + listener
    warned = config.warnings(config.load(write(tmp_path, text), environ={}))
    assert [line for line in warned if line.startswith("xheaders: false while base_url is https")], warned
    trusted = text.replace("[server]", "[proxy]\ntrusted_networks = [\"unix\"]\n[server]") if "[server]" in text \
        else text + '[proxy]\ntrusted_networks = ["127.0.0.1/32"]\n'
    warned = config.warnings(config.load(write(tmp_path, "xheaders = true\n" + trusted), environ={}))
    assert not [line for line in warned if line.startswith("xheaders")], warned
    plain = config.load(write(tmp_path, SECRET + 'host = "127.0.0.1"\n'), environ={})  # the loopback demo
    assert not [line for line in config.warnings(plain) if line.startswith("xheaders")]
