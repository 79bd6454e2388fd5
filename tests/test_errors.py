"""The error edge: a store that does not answer gives 503, redaction of the access log."""

import ast
import importlib
import inspect
import logging
import re
import socket
import textwrap
import types
from pathlib import Path

import pytest
from helpers import WEBAPP_REDIRECT, WEBAPP_SECRET, basic, json_of, make_config, post_form

import tokensvc
from tokensvc.bootstrap import make_store
from tokensvc.config import StorageSettings
from tokensvc.handlers.edge.access_log import redact
from tokensvc.storage.base import StorageError
from tokensvc.storage.memory import MemoryStore


class DownStore(MemoryStore):
    """A store whose every call fails as an unreachable database would."""

    down = False

    def __getattribute__(self, name):
        attr = super().__getattribute__(name)
        if name.startswith("_") or not inspect.iscoroutinefunction(attr) or not self.down:
            return attr  # only the calls to the database fail (what a store knows of itself stays)

        async def fail(*args, **kwargs):
            raise StorageError("server selection timed out")

        return fail


@pytest.fixture
def store():
    return DownStore()


@pytest.mark.gen_test
async def test_store_outage_is_503_detail_everywhere(http_client, base_url, store, browser):
    store.down = True
    requests = [
        ("GET", "/oauth/clients", None, {}),
        ("GET", "/oauth/clients/webapp", None, {}),
        ("POST", "/oauth/token", "grant_type=authorization_code&code=x&redirect_uri=" + WEBAPP_REDIRECT,
         {"Authorization": basic("webapp", WEBAPP_SECRET)}),
        ("POST", "/oauth/token/refresh", "refresh_token=x", {"Authorization": basic("webapp", WEBAPP_SECRET)}),
        ("POST", "/oauth/token/introspect", "token=x", {"Authorization": basic("webapp", WEBAPP_SECRET)}),
        ("POST", "/oauth/token/revoke", "token=x", {"Authorization": basic("webapp", WEBAPP_SECRET)}),
        ("GET", "/readyz", None, {}),
    ]
    for method, path, body, headers in requests:
        response = await http_client.fetch(base_url + path, method=method, body=body, headers=headers,
                                           raise_error=False)
        assert response.code == 503, (path, response.body)
        if path == "/readyz":  # says why
            assert json_of(response)["reason"] == "the store has not answered a ping for 30 s"
        else:
            assert set(json_of(response)) == {"detail"}
        assert b"Traceback" not in response.body
    page = await browser.fetch("/oauth/authorize?client_id=webapp")
    assert page.code == 503 and page.headers["Content-Type"].startswith("text/html")
    assert (await http_client.fetch(base_url + "/healthz")).code == 200


SKY_ORIGIN = "http://127.0.0.1:9000"  # skyplanner's redirect URI's origin, listed as a browser app's


def with_a_browser_app():
    config = make_config()
    clients = [{"client_id": c.client_id, "name": c.name, "redirect_uris": c.redirect_uris,
                "allowed_scopes": c.allowed_scopes, "first_party": c.first_party, "client_secret": c.client_secret,
                "allowed_origins": [SKY_ORIGIN] if c.client_id == "skyplanner" else None} for c in config.clients]
    return make_config(clients=clients)


@pytest.mark.gen_test
@pytest.mark.parametrize("config", [with_a_browser_app()])
async def test_revoke_with_nothing_to_revoke_is_200_while_the_store_is_down(http_client, base_url, store, ctx, config):
    """The interface's "always 200": a call carrying no token has nothing to do, so the store's
    state does not matter, nor does the CORS decision of a browser's Origin: the origins read
    before the outage stand while it lasts."""
    for origin in (SKY_ORIGIN, "https://evil.example", None):
        headers = {"Origin": origin} if origin else {}
        store.down = False
        await http_client.fetch(base_url + "/oauth/revoke", method="POST", body="", headers=headers)
        store.down = True
        ctx.origins.forget()  # their time is up: the next request reads them again, and fails
        for _ in range(2):
            response = await http_client.fetch(base_url + "/oauth/revoke", method="POST", body="", headers=headers)
            assert response.code == 200 and json_of(response) == {}
            assert response.headers.get("Access-Control-Allow-Origin") == (SKY_ORIGIN if origin == SKY_ORIGIN
                                                                           else None)


@pytest.mark.gen_test
@pytest.mark.parametrize("config", [with_a_browser_app()])
async def test_a_cors_decision_never_waits_for_a_store_that_was_never_up(http_client, base_url, store, config):
    store.down = True
    response = await http_client.fetch(base_url + "/oauth/revoke", method="POST", body="",
                                       headers={"Origin": SKY_ORIGIN})
    assert response.code == 200 and "Access-Control-Allow-Origin" not in response.headers
    assert response.headers["Vary"] == "Origin"
    preflight = await http_client.fetch(base_url + "/oauth/revoke", method="OPTIONS", headers={
        "Origin": SKY_ORIGIN, "Access-Control-Request-Method": "POST"})
    assert preflight.code == 204 and "Access-Control-Allow-Origin" not in preflight.headers


@pytest.mark.gen_test
async def test_revoke_with_a_token_while_the_store_is_down_is_503(http_client, base_url, store):
    """The one departure from "always 200" (docs/security.md): a token that may be in force
    cannot be said revoked while the store does not answer; the caller is told to retry."""
    store.down = True
    for headers, query in (({"Authorization": "Bearer some-token"}, ""), ({}, "?token=some-token")):
        response = await http_client.fetch(base_url + "/oauth/revoke" + query, method="POST", body="",
                                           headers=headers, raise_error=False)
        assert response.code == 503 and set(json_of(response)) == {"detail"}
        assert int(response.headers["Retry-After"]) > 0


@pytest.mark.gen_test
async def test_discovery_answers_while_the_store_is_down(http_client, base_url, store):
    store.down = True
    metadata = await http_client.fetch(base_url + "/.well-known/oauth-authorization-server")
    assert metadata.code == 200
    body = json_of(metadata)
    assert body["token_endpoint"] == "http://127.0.0.1:8080/oauth/token"
    assert body["scopes_supported"] == sorted({"admin", "read", "write", "connected-apps:write"} | {
        scope for client in make_config().clients for scope in client.allowed_scopes or ["read"]})
    openapi = await http_client.fetch(base_url + "/openapi.json")
    assert openapi.code == 200 and json_of(openapi)["openapi"].startswith("3.")
    assert (await http_client.fetch(base_url + "/readyz", raise_error=False)).code == 503  # it really is down


@pytest.mark.gen_test
async def test_store_recovers(http_client, base_url, store):
    store.down = True
    assert (await http_client.fetch(base_url + "/oauth/clients", raise_error=False)).code == 503
    store.down = False
    assert (await http_client.fetch(base_url + "/oauth/clients")).code == 200


def test_redact():
    assert redact("/oauth/revoke?token=abc&x=1") == "/oauth/revoke?token=***&x=1"
    assert redact("/cb?code=c&state=s&access_token=t&refresh_token=r&client_secret=cs&code_verifier=v") == \
        "/cb?code=***&state=***&access_token=***&refresh_token=***&client_secret=***&code_verifier=***"
    assert redact("/plain") == "/plain"
    # Inside another parameter's value: the sign-in's next= carries the authorization request.
    nested = redact("/login?next=%2Foauth%2Fauthorize%3Fclient_id%3Dw%26state%3DSECRET-STATE%26code_challenge%3Dx")
    assert "SECRET-STATE" not in nested and "client_id%3Dw" in nested and "state%3D***" in nested


@pytest.mark.gen_test
async def test_access_log_redacts_query_secrets(http_client, base_url, caplog):
    with caplog.at_level(logging.INFO, logger="tokensvc.access"):
        await http_client.fetch(base_url + "/oauth/revoke?token=SECRET-TOKEN-VALUE", method="POST", body="")
        await http_client.fetch(base_url + "/oauth/authorize?client_id=webapp&code=SECRET-CODE-VALUE",
                                raise_error=False, follow_redirects=False)
    text = "\n".join(record.getMessage() + repr(getattr(record, "access", "")) for record in caplog.records)
    assert "/oauth/revoke?token=***" in text
    assert "SECRET-TOKEN-VALUE" not in text and "SECRET-CODE-VALUE" not in text


@pytest.mark.gen_test
async def test_no_secret_reaches_any_log(browser, http_client, base_url, caplog):
    from helpers import exchange

    with caplog.at_level(logging.DEBUG):
        code = await browser.code_for("webapp", WEBAPP_REDIRECT)
        tokens = json_of(await exchange(http_client, base_url, code))
        await post_form(http_client, base_url + "/oauth/token/refresh", {"refresh_token": tokens["refresh_token"]},
                        {"Authorization": basic("webapp", WEBAPP_SECRET)})
    text = "\n".join(f"{r.getMessage()} {getattr(r, 'audit', '')} {getattr(r, 'access', '')}" for r in caplog.records)
    for secret in (code, tokens["access_token"], tokens["refresh_token"], WEBAPP_SECRET,
                   browser.cookies["tokensvc_session"], "alice-password"):
        assert secret not in text
    assert "token_issued" in text and "token_refreshed" in text


# -- outages ------------------------------------------------------------------------

def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.gen_test(timeout=30)
async def test_unreachable_server_is_503_never_500(http_client, io_loop, config):
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    from tokensvc.app import make_app

    down = make_store(StorageSettings(
        backend="mongodb", mongodb_uri=f"mongodb://127.0.0.1:{closed_port()}", timeout_ms=150))
    sock, port = bind_unused_port()
    server = HTTPServer(make_app(config, down))
    server.add_sockets([sock])
    try:
        url = f"http://127.0.0.1:{port}"
        for path in ("/oauth/clients", "/oauth/clients/webapp", "/readyz"):
            response = await http_client.fetch(url + path, raise_error=False)
            assert response.code == 503, response.body
            assert set(json_of(response)) == ({"detail", "reason"} if path == "/readyz" else {"detail"})
        response = await post_form(http_client, url + "/oauth/token/introspect", {"token": "x"},
                                   {"Authorization": basic("webapp", WEBAPP_SECRET)})
        assert response.code == 503 and set(json_of(response)) == {"detail"}
        assert (await http_client.fetch(url + "/healthz")).code == 200
    finally:
        server.stop()
        await down.close()


@pytest.mark.gen_test
async def test_an_uncaught_exception_on_a_page_logs_the_uri_redacted(http_client, base_url, caplog, monkeypatch):
    from tokensvc.handlers import pages

    async def broken(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(pages.HomeHandler, "get", broken)
    with caplog.at_level(logging.ERROR):
        response = await http_client.fetch(base_url + "/?access_token=SECRET-IN-QUERY&password=SECRET-PASSWORD",
                                           raise_error=False)
    assert response.code == 500 and b"Traceback" not in response.body
    assert "SECRET-IN-QUERY" not in caplog.text and "SECRET-PASSWORD" not in caplog.text
    assert "Uncaught exception GET /?access_token=***&password=***" in caplog.text and "boom" in caplog.text


@pytest.mark.gen_test
async def test_an_uncaught_exception_on_the_socket_logs_the_uri_redacted(browser, http_client, base_url, caplog,
                                                                        monkeypatch):
    from helpers import exchange
    from tornado.websocket import websocket_connect

    from tokensvc.handlers import ws

    async def broken(self, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(ws.EchoSocket, "open", broken)
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    access = json_of(await exchange(http_client, base_url, code))["access_token"]
    with caplog.at_level(logging.ERROR):
        connection = await websocket_connect(base_url.replace("http", "ws") + "/v1/ws?access_token=" + access)
        assert await connection.read_message() is None  # closed by the failure
    assert access not in caplog.text
    assert "Uncaught exception GET /v1/ws?access_token=***" in caplog.text and "boom" in caplog.text


# RFC 6749 §5.2 and RFC 6750 §3: error_description = 1*( %x20-21 / %x23-5B / %x5D-7E )
DESCRIPTION_CHARS = re.compile(r"^[\x20-\x21\x23-\x5b\x5d-\x7e]*$")


def _described_errors() -> set[str]:
    """The names of every error whose text becomes an ``error_description``: OAuth's, and a
    resource server's refusals."""
    from tokensvc.oauth import errors as oauth_errors
    from tokensvc.resource import errors as resource_errors

    found = set()
    for module, base in ((oauth_errors, oauth_errors.OAuthError), (resource_errors, resource_errors.Refusal)):
        found |= {name for name, value in vars(module).items() if isinstance(value, type) and issubclass(value, base)}
    return found


def _said(node: ast.AST, module: types.ModuleType) -> list[str]:
    """The fixed text an error's argument holds: its literals, the literal parts of an f-string
    or a sum, and the module constants (or another module's) it names."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.JoinedStr):
        return [part for value in node.values for part in _said(value, module)]
    if isinstance(node, ast.FormattedValue):
        return _said(node.value, module)
    if isinstance(node, ast.BinOp):
        return _said(node.left, module) + _said(node.right, module)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
        return _said(node.func.value, module)
    if isinstance(node, ast.Name) and isinstance(getattr(module, node.id, None), str):
        return [getattr(module, node.id)]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner = getattr(module, node.value.id, None)
        if isinstance(owner, types.ModuleType) and isinstance(getattr(owner, node.attr, None), str):
            return [getattr(owner, node.attr)]
    return []


def _returned(function: types.FunctionType) -> list[str]:
    """The literal text a function returns or raises with: what a problem function says."""
    module = inspect.getmodule(function)
    said = []
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(function)))):
        if isinstance(node, ast.Return) and node.value is not None:
            said += _said(node.value, module)
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            said += [text for argument in node.exc.args for text in _said(argument, module)]
    return said


def test_every_error_description_the_code_defines_is_of_the_characters_rfc_6749_allows():
    """Every message an OAuth error or a resource server's refusal carries, and what each
    problem function it quotes says, is plain ASCII of RFC 6749 §5.2's grammar: it reaches the
    client as written, never percent-encoded (a section sign written as ``%C2%A7``)."""
    from tokensvc import identifiers
    from tokensvc.oauth import scopes

    described, texts = _described_errors(), []
    for path in sorted(Path(tokensvc.__file__).parent.rglob("*.py")):
        if path.name == "__main__.py":
            continue  # runs the command line when imported
        name = ".".join(path.relative_to(Path(tokensvc.__file__).parent.parent).with_suffix("").parts)
        module = importlib.import_module(name.removesuffix(".__init__"))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = node.func.id if isinstance(node.func, ast.Name) else \
                    node.func.attr if isinstance(node.func, ast.Attribute) else None
                if called in described:
                    texts += [(f"{name}:{node.lineno}", text) for argument in node.args for text in
                              _said(argument, module)]
    for function in (identifiers.resource_uri_problem, scopes.parse):
        texts += [(function.__qualname__, text) for text in _returned(function)]
    assert len(texts) > 100  # the walk found the messages
    outside = [(where, text) for where, text in texts if not DESCRIPTION_CHARS.fullmatch(text)]
    assert outside == []
