"""``tokensvc gate`` in process: its configuration, the decision (the original request read where
each proxy puts it, the scope its rule requires, the headers of an allowed request, RFC 6750's
refusals), health and readiness. Behind a real nginx: tests/test_gate_nginx.py."""

from __future__ import annotations

import json

import pytest
import tornado.httpserver
import tornado.testing
from tornado.httpclient import AsyncHTTPClient

from tokensvc.cli import main as cli
from tokensvc.gate import GateConfigError, GateSettings, Rule, load
from tokensvc.gate.gate import Gate, normalized
from tokensvc.gate.server import make_app
from tokensvc.gate.settings import from_dict
from tokensvc.resource import Settings, Verifier
from tokensvc.resource.introspection import Introspector

USER = "u" * 43
INSTALLATION = "i" * 43
READER = "r" * 43
ANSWERS = {
    USER: {"active": True, "scope": "read write", "client_id": "webapp", "sub": "u_1", "exp": 2**40,
           "grant_id": "g1", "family_id": "f1"},
    INSTALLATION: {"active": True, "scope": "read", "client_id": "node-agent", "sub": "backyard-scope",
                   "installation_id": "backyard-scope", "exp": 2**40, "grant_id": "g2", "family_id": "f2"},
    READER: {"active": True, "scope": "read", "client_id": "skyplanner", "sub": "u_2", "exp": 2**40,
             "grant_id": "g3", "family_id": "f3"},
}
SETTINGS = {"tokensvc_url": "http://127.0.0.1:9", "client_id": "notes-api", "client_secret": "s" * 32,
            "scope": "read", "rules": [{"prefix": "/admin", "scope": "admin"},
                                       {"prefix": "/notes", "methods": ["POST", "delete"], "scope": "write"},
                                       {"prefix": "/public", "scope": ""}]}


class Scripted(Introspector):
    """tokensvc, as the test says: the answers above, anything else inactive."""

    asked: list[str]

    async def introspect(self, token):
        self.asked.append(token)
        return ANSWERS.get(token)  # None: not active


def gate_of(settings: GateSettings) -> Gate:
    verifier_settings = settings.verifier_settings()
    introspector = Scripted(verifier_settings)
    introspector.asked = []
    return Gate(settings, Verifier(verifier_settings, introspector=introspector))


@pytest.fixture
def served(io_loop):
    """The gate on a port of its own (its feed never opened: readiness says so); yields its base
    URL and the gate."""
    gate = gate_of(from_dict(dict(SETTINGS)))
    sock, port = tornado.testing.bind_unused_port()
    server = tornado.httpserver.HTTPServer(make_app(gate))
    server.add_sockets([sock])
    yield f"http://127.0.0.1:{port}", gate
    server.stop()
    io_loop.run_sync(gate.verifier.close)


async def fetch(url, method="GET", token=None, **headers):
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return await AsyncHTTPClient().fetch(url, method=method, headers=headers, raise_error=False,
                                         allow_nonstandard_methods=True, body=b"" if method in ("POST", "PUT", "PATCH")
                                         else None)


@pytest.mark.gen_test
async def test_an_allowed_request_carries_who_it_is_for_the_proxy_to_pass_upstream(served):
    base, gate = served
    answer = await fetch(base + "/auth/nginx", token=USER, **{"X-Original-URI": "/notes/1?x=y",
                                                              "X-Original-Method": "GET"})
    assert answer.code == 200
    assert (answer.headers["X-Auth-Subject"], answer.headers["X-Auth-Scope"], answer.headers["X-Auth-Client-Id"]) == (
        "u_1", "read write", "webapp")
    assert "X-Auth-Installation-Id" not in answer.headers and answer.headers["Cache-Control"] == "no-store"
    answer = await fetch(base + "/auth/nginx", token=INSTALLATION, **{"X-Original-URI": "/"})
    assert (answer.code, answer.headers["X-Auth-Installation-Id"], answer.headers["X-Auth-Subject"]) == (
        200, "backyard-scope", "backyard-scope")
    for _ in range(3):
        assert (await fetch(base + "/auth/nginx", token=USER, **{"X-Original-URI": "/"})).code == 200
    assert gate.verifier.counts.introspections == 2  # one per token: the others answered from the cache


@pytest.mark.gen_test
async def test_refusals_are_rfc_6750s(served):
    base, _ = served
    original = {"X-Original-URI": "/notes"}
    answer = await fetch(base + "/auth/nginx", **original)
    assert (answer.code, answer.headers["WWW-Authenticate"]) == (401, 'Bearer realm="api"')
    assert json.loads(answer.body) == {"error_description": "A bearer token is required"}
    for made_up in ("garbage", "x" * 43):
        answer = await fetch(base + "/auth/nginx", token=made_up, **original)
        assert answer.code == 401
        assert answer.headers["WWW-Authenticate"] == ('Bearer realm="api", error="invalid_token", '
                                                      'error_description="The access token is not active"')
    answer = await fetch(base + "/auth/nginx", token=READER, **{"X-Original-URI": "/notes/3",
                                                                "X-Original-Method": "DELETE"})
    assert answer.code == 403
    assert answer.headers["WWW-Authenticate"] == ('Bearer realm="api", error="insufficient_scope", '
                                                  'error_description="The token lacks the scope write", scope="write"')
    assert json.loads(answer.body)["scope"] == "write"
    for header in ("X-Auth-Subject", "X-Auth-Scope", "X-Auth-Client-Id"):
        assert header not in answer.headers


@pytest.mark.gen_test
async def test_each_proxy_is_read_where_it_puts_the_original_request_and_nowhere_else(served):
    """nginx's X-Original-*, Traefik's X-Forwarded-*, Envoy's own method and path after the
    prefix. A header of another proxy's convention is never taken: a client behind Traefik
    sending X-Original-URI: /public gets no rule of /public."""
    base, _ = served
    post = {"X-Original-URI": "/notes", "X-Original-Method": "POST"}
    assert (await fetch(base + "/auth/nginx", token=READER, **post)).code == 403
    assert (await fetch(base + "/auth/nginx", token=USER, **post)).code == 200
    forwarded = {"X-Forwarded-Uri": "/notes", "X-Forwarded-Method": "POST"}
    assert (await fetch(base + "/auth/traefik", token=READER, **forwarded)).code == 403
    assert (await fetch(base + "/auth/traefik", token=READER, **forwarded, **{"X-Original-URI": "/public"})).code == 403
    assert (await fetch(base + "/auth/envoy/notes/1", "DELETE", token=READER)).code == 403
    assert (await fetch(base + "/auth/envoy/notes/1", "GET", token=READER)).code == 200
    assert (await fetch(base + "/auth/envoy/admin", "GET", token=USER,
                        **{"X-Forwarded-Uri": "/public", "X-Original-URI": "/public"})).code == 403
    assert (await fetch(base + "/auth/envoy/public/x", "GET", token=USER)).code == 200
    # Without the original request the gate cannot know the rule: an error, never an allow.
    assert (await fetch(base + "/auth/nginx", token=USER, **forwarded)).code == 500
    assert (await fetch(base + "/auth/traefik", token=USER, **post)).code == 500


@pytest.mark.gen_test
async def test_a_client_sent_x_auth_header_is_never_read_nor_echoed(served):
    base, _ = served
    forged = {"X-Auth-Subject": "root", "X-Auth-Scope": "admin", "X-Auth-Installation-Id": "backyard-scope"}
    answer = await fetch(base + "/auth/nginx", token=READER, **{"X-Original-URI": "/admin"}, **forged)
    assert answer.code == 403 and "X-Auth-Subject" not in answer.headers
    answer = await fetch(base + "/auth/nginx", token=READER, **{"X-Original-URI": "/"}, **forged)
    assert (answer.code, answer.headers["X-Auth-Subject"], answer.headers["X-Auth-Scope"]) == (200, "u_2", "read")
    assert "X-Auth-Installation-Id" not in answer.headers
    assert (await fetch(base + "/auth/nginx", **{"X-Original-URI": "/"}, **forged)).code == 401


@pytest.mark.gen_test
async def test_health_always_and_readiness_once_the_feed_is_current(served):
    base, gate = served
    health = await fetch(base + "/healthz")
    assert (health.code, json.loads(health.body)) == (200, {"status": "ok"})
    ready = await fetch(base + "/readyz")
    assert ready.code == 503  # the feed never opened here
    body = json.loads(ready.body)
    assert body["counts"]["checks"] == 0 and body["cached"] == 0
    assert not gate.verifier.feed_up


@pytest.mark.parametrize(("path", "judged"), [
    ("/notes", "/notes"), ("/notes/", "/notes/"), ("/public/../admin", "/admin"), ("/public/%2e%2e/admin", "/admin"),
    ("//admin", "/admin"), ("/a//b/./c?x=/public", "/a/b/c"), ("/public/..%2Fadmin", "/admin"), ("", "/"),
    ("/../../admin", "/admin"),
])
def test_a_path_is_judged_as_a_proxy_routes_it(path, judged):
    assert normalized(path) == judged


@pytest.mark.gen_test
async def test_a_path_an_api_may_route_otherwise_is_refused_not_judged(served):
    """A path the gate would judge one way and an API behind the proxy may route another is
    refused (403), whatever the token: Tomcat and Spring drop ``;...`` (``/public/..;/notes``
    is their ``/notes``), some servers take a backslash for a slash, an escaped ``%`` may be
    decoded twice, a raw ``#`` reaches the API. A rule matches in any case: many frameworks
    route ``/NOTES`` as ``/notes``."""
    base, _ = served
    for path in ("/notes;x", "/public/..;/notes", "/public\\..\\notes", "/public/%252e%252e/notes",
                 "/public#/../notes", "/notes%3bx", "/public/%5c../notes"):
        answer = await fetch(base + "/auth/nginx", token=USER, **{"X-Original-URI": path, "X-Original-Method": "GET"})
        assert answer.code == 403, path
        assert json.loads(answer.body)["error"] == "invalid_request" and "X-Auth-Subject" not in answer.headers
    for path in ("/NOTES", "/Notes/1"):
        post = {"X-Original-URI": path, "X-Original-Method": "POST"}
        answer = await fetch(base + "/auth/nginx", token=READER, **post)
        assert answer.code == 403 and json.loads(answer.body)["scope"] == "write", path
    assert (await fetch(base + "/auth/nginx", token=READER, **{"X-Original-URI": "/ADMIN"})).code == 403
    assert (await fetch(base + "/auth/nginx", token=USER, **{"X-Original-URI": "/notes/1?q=a;b#c"})).code == 200


def test_the_verifier_table_takes_an_audience():
    """``[verifier] audience`` and ``require_audience`` are the library's: the gate of an API
    that requires its tokens bound to it (RFC 8707)."""
    settings = from_dict({**SETTINGS, "verifier": {"audience": "https://notes.example", "require_audience": True}})
    verifier = settings.verifier_settings()
    assert (verifier.audience, verifier.require_audience) == ("https://notes.example", True)
    with pytest.raises(GateConfigError) as info:
        from_dict({**SETTINGS, "verifier": {"audience": 3, "require_audience": 1}})
    assert info.value.problems == ["verifier.audience: the resource URI this API serves (a string)",
                                   "verifier.require_audience: true or false"]


def test_the_first_rule_that_matches_decides_by_whole_segments():
    settings = from_dict(dict(SETTINGS))
    assert settings.required_scope("GET", "/admin/users") == "admin"
    assert settings.required_scope("GET", "/adminx") == "read"  # no rule: the default
    assert settings.required_scope("POST", "/notes") == "write"
    assert settings.required_scope("DELETE", "/notes/1") == "write"
    assert settings.required_scope("GET", "/notes/1") == "read"
    assert settings.required_scope("GET", "/public/x") == ""
    assert Rule("/", "admin").matches("GET", "/anything")


def test_the_configuration_says_every_problem_at_once(tmp_path):
    with pytest.raises(GateConfigError) as info:
        from_dict({"tokensvc_url": "ftp://x", "port": 0, "scope": "a b", "colour": "red", "verifier": {"ttl": 1},
                   "rules": [{"prefix": "notes", "scope": "read", "methods": ["FETCH"], "why": 1}]})
    assert info.value.problems == [
        "colour: not a setting of the gate", "client_id: required (a string)",
        "client_secret: required (or in TOKENSVC_GATE_CLIENT_SECRET)", "tokensvc_url: an http:// or https:// URL",
        "scope: one scope", "port: 1-65535", "rules[0].why: not a setting of a rule (prefix, scope, methods)",
        "rules[0].prefix: a path that starts with /",
        "rules[0].methods: a list of HTTP methods (DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT)",
        "verifier.ttl: not a setting of the verifier (one of max_entries, max_negative, max_ttl, negative_ttl, "
        "offline_ttl, timeout, ping_seconds, retry_seconds, introspection_concurrency, introspection_queue, "
        "reverify_concurrency, reverify_spread, audience, require_audience)"]
    config = tmp_path / "gate.toml"
    config.write_text('tokensvc_url = "https://auth.example/"\nclient_id = "notes-api"\n[verifier]\noffline_ttl = 10\n')
    settings = load(str(config), port=9001, environ={"TOKENSVC_GATE_CLIENT_SECRET": "from-the-environment"})
    assert (settings.tokensvc_url, settings.client_secret, settings.port) == ("https://auth.example",
                                                                             "from-the-environment", 9001)
    assert settings.verifier_settings() == Settings("https://auth.example", "notes-api", "from-the-environment",
                                                    offline_ttl=10)


def test_the_command_line_says_what_is_wrong_with_the_file(tmp_path, capsys):
    config = tmp_path / "gate.toml"
    config.write_text('client_id = "notes-api"\n')
    assert cli.main(["gate", "--config", str(config)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"tokensvc: {config}: tokensvc_url: required (a string)",
        f"tokensvc: {config}: client_secret: required (or in TOKENSVC_GATE_CLIENT_SECRET)"]


def test_a_file_that_never_ends_or_starts_with_a_byte_order_mark_is_one_line(tmp_path, capsys):
    """The gate reads its file as the service reads ``--config``: a device or a pipe is refused
    before it is read (``/dev/zero`` was read without end, a pipe waited for a writer), a byte
    order mark is named (it was a TOML error at line 1)."""
    import os

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        assert cli.main(["gate", "--config", path]) == 1
        assert capsys.readouterr().err == f"tokensvc: {path}: not a regular file (give the TOML file with --config)\n"
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + b'tokensvc_url = "https://auth.example"\n')
    assert cli.main(["gate", "--config", str(bom)]) == 1
    assert capsys.readouterr().err == (f"tokensvc: {bom}: starts with a UTF-8 byte order mark, which TOML does not "
                                       "take: save it as UTF-8 without one\n")


def test_the_deploy_examples_name_what_the_gate_reads():
    """deploy/gate/: gate.toml loads; Traefik asks /auth/traefik, sets the X-Forwarded-* headers
    itself and takes every X-Auth-* header from the gate alone (the client's stripped first).
    nginx's example is run as it ships in tests/test_gate_nginx.py."""
    import re
    from pathlib import Path

    import yaml

    deploy = Path(__file__).resolve().parent.parent / "deploy" / "gate"
    settings = load(str(deploy / "gate.toml"), environ={"TOKENSVC_GATE_CLIENT_SECRET": "s" * 32})
    assert settings.required_scope("POST", "/notes/1") == "write" and settings.required_scope("GET", "/x") == "read"
    traefik = yaml.safe_load((deploy / "traefik.yml").read_text())["http"]
    forward = traefik["middlewares"]["tokensvc-gate"]["forwardAuth"]
    assert forward["address"].endswith(":8090/auth/traefik") and forward["trustForwardHeader"] is False
    pattern = re.compile(forward["authResponseHeadersRegex"])
    assert all(pattern.match(name) for name in ("X-Auth-Subject", "X-Auth-Scope", "X-Auth-Client-Id",
                                                 "X-Auth-Installation-Id"))
    assert not pattern.match("Authorization")
    assert traefik["routers"]["protected-api"]["middlewares"] == ["tokensvc-gate"]
    nginx = (deploy / "nginx.conf").read_text()
    for header in ("X-Auth-Subject", "X-Auth-Scope", "X-Auth-Client-Id", "X-Auth-Installation-Id"):
        assert f"proxy_set_header {header} $auth_" in nginx
