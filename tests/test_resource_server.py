"""The resource-server client kind: confidential, no redirect URI, no scope; it introspects and
reads the revocation feed and may do nothing else (no authorization, no code exchange, no
refresh, no RFC 7009 revocation); configured, registered through the admin API and the command
line; and a release that drops its kind (0.9.0 rewrites whole client documents) leaves a client
that may do nothing at all."""

from __future__ import annotations

import dataclasses

import pytest
from backends import open_store
from helpers import CHALLENGE, WEBAPP_REDIRECT, basic, check_oauth_error, json_of, make_config, post_form
from test_feed import connect, feed_url, next_message
from test_ws import tokens
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from tokensvc import config as config_module
from tokensvc.admin.actions import AdminError, ClientSpec
from tokensvc.bootstrap import seed
from tokensvc.config import ConfigError
from tokensvc.records import Client
from tokensvc.storage.mongo import CLIENTS

API_SECRET = "api-test-secret-0123456789abcdef0123456789"
API = {"client_id": "notes-api", "name": "Notes API", "kind": "resource-server", "client_secret": API_SECRET}


@pytest.fixture
def config():
    base = make_config()
    return make_config(clients=[*[dataclasses.asdict(client) for client in base.clients], API])


async def introspected(http_client, base_url, token, client_id="notes-api", secret=API_SECRET):
    return await post_form(http_client, base_url + "/oauth/token/introspect", {"token": token},
                           {"Authorization": basic(client_id, secret)})


@pytest.mark.gen_test(timeout=90)
async def test_a_resource_server_introspects_and_reads_the_feed(browser, http_client, base_url, store):
    stored = await store.get_client("notes-api")
    assert (stored.kind, stored.redirect_uris, stored.allowed_scopes, stored.first_party, stored.confidential) == (
        "resource-server", [], [], False, True)
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    answer = json_of(await introspected(http_client, base_url, access))
    assert answer["active"] is True and answer["scope"] == "read"
    reader = await connect(base_url, client_id="notes-api", secret=API_SECRET)
    assert (await next_message(reader))["type"] == "ready"
    reader.close()
    response = await introspected(http_client, base_url, access, secret="wrong")
    check_oauth_error(response, 401, "invalid_client")


@pytest.mark.gen_test(timeout=90)
async def test_a_resource_server_may_do_nothing_else(browser, http_client, base_url):
    issued = await tokens(browser, http_client, base_url)
    auth = {"Authorization": basic("notes-api", API_SECRET)}
    for path, form in (("/oauth/token", {"grant_type": "authorization_code", "code": "c" * 43,
                                         "redirect_uri": WEBAPP_REDIRECT, "code_verifier": "v" * 43}),
                       ("/oauth/token/refresh", {"refresh_token": issued["refresh_token"]}),
                       ("/oauth/token/revoke", {"token": issued["access_token"]})):
        body = check_oauth_error(await post_form(http_client, base_url + path, form, auth), 400,
                                 "unauthorized_client")
        assert "resource server" in body["error_description"]
    page = await browser.fetch("/oauth/authorize?response_type=code&client_id=notes-api&redirect_uri="
                               f"{WEBAPP_REDIRECT}&code_challenge={CHALLENGE}&code_challenge_method=S256&state=s")
    assert page.code == 400 and b"cannot ask for authorization" in page.body
    response = await post_form(http_client, base_url + "/oauth/token/introspect", {"token": issued["access_token"]},
                               {"Authorization": basic("webapp", "webapp-test-secret-0123456789abcdef")})
    assert json_of(response)["active"] is True  # its refused revocation revoked nothing


@pytest.mark.parametrize(("entry", "key"), [
    ({**API, "redirect_uris": ["https://a.example/cb"]}, "clients[0].redirect_uris"),
    ({**API, "allowed_scopes": ["read"]}, "clients[0].allowed_scopes"),
    ({**API, "first_party": True}, "clients[0].first_party"),
    ({key: value for key, value in API.items() if key != "client_secret"}, "clients[0]: a resource server is "
                                                                           "confidential"),
    ({**API, "kind": "api"}, "clients[0].kind"),
    ({key: value for key, value in API.items() if key != "kind"}, "clients[0].redirect_uris"),
])
def test_the_configuration_holds_a_resource_server_to_its_shape(entry, key):
    with pytest.raises(ConfigError) as info:
        config_module.from_dict({"cookie_secret": "x" * 32, "clients": [entry]})
    assert str(info.value).startswith(key)


def test_an_operator_registers_a_resource_server_with_nothing_of_the_flow():
    spec = ClientSpec("Notes API", kind="resource-server").checked()
    assert spec.confidential and spec.fields()["allowed_scopes"] == [] and spec.fields()["kind"] == "resource-server"
    for wrong in ({"redirect_uris": ["https://a.example/cb"]}, {"scopes": ["read"]}, {"first_party": True},
                  {"allowed_origins": ["https://a.example"]}):
        with pytest.raises(AdminError, match="a resource server has no"):
            ClientSpec("Notes API", kind="resource-server", **wrong).checked()
    with pytest.raises(AdminError, match="kind"):
        ClientSpec("Notes API", ["https://a.example/cb"], kind="api").checked()


@pytest.fixture
def store(io_loop):
    """The MongoDB stand-in: what an older release's whole-document rewrite leaves is stored."""
    opened, cleanup = open_store("mongodb", io_loop)
    yield opened
    cleanup()


@pytest.mark.gen_test(timeout=90)
async def test_a_resource_server_an_older_release_rewrote_may_do_nothing(browser, http_client, base_url, store,
                                                                          config):
    """0.9.0's put_client replaces the whole document with the fields it knows: ``kind`` goes.
    What is left is a third-party confidential client with no redirect URI and no scope: it may
    neither introspect nor read the feed, nor start an authorization."""
    await seed(store, config)
    old_fields = {field.name for field in dataclasses.fields(Client)} - {"kind"}
    current = CLIENTS.doc(await store.get_client("notes-api"))
    await store.db["clients"].replace_one({"_id": "notes-api"}, {key: value for key, value in current.items()
                                                           if key == "_id" or key in old_fields})
    rewritten = await store.get_client("notes-api")
    assert (rewritten.kind, rewritten.scopes, rewritten.redirect_uris, rewritten.first_party) == ("client", [], [],
                                                                                                   False)
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    check_oauth_error(await introspected(http_client, base_url, access), 403, "access_denied")
    with pytest.raises(HTTPClientError) as info:
        await websocket_connect(HTTPRequest(feed_url(base_url), headers={"Authorization": basic("notes-api",
                                                                                              API_SECRET)}))
    assert info.value.code == 403
    page = await browser.fetch("/oauth/authorize?response_type=code&client_id=notes-api&redirect_uri="
                               f"{WEBAPP_REDIRECT}&code_challenge={CHALLENGE}&code_challenge_method=S256&state=s")
    assert page.code == 400


@pytest.mark.gen_test
async def test_the_configuration_seeds_a_resource_server_and_marks_what_its_readers_proved(store):
    """Seeded, a resource server is stored as the admin API makes one; seeded again unchanged,
    nothing is written; a new secret, or a change of kind, is marked (credentials_changed_at),
    which the other processes' relays hear: their feed readers of the client check their
    credentials. Neither withdraws anything from a token (narrowed_at stays unset); a client
    made a resource server again loses its scopes, which is marked as a narrowing too."""

    def configured(**changes):
        return make_config(clients=[{**API, **changes}])

    await seed(store, configured())
    seeded = await store.get_client("notes-api")
    assert (seeded.kind, seeded.redirect_uris, seeded.allowed_scopes, seeded.first_party, seeded.narrowed_at,
            seeded.credentials_changed_at) == ("resource-server", [], [], False, None, None)
    await seed(store, configured())
    assert await store.get_client("notes-api") == seeded
    await seed(store, configured(client_secret=API_SECRET[::-1]))
    rotated = await store.get_client("notes-api")
    assert rotated.credentials_changed_at is not None and rotated.secret_hash != seeded.secret_hash
    assert rotated.narrowed_at is None
    await store.update_client("notes-api", {"credentials_changed_at": None})  # the mark below is the kind's
    await seed(store, configured(client_secret=API_SECRET[::-1], kind="client",
                                 redirect_uris=["https://notes.example/cb"]))
    made_a_client = await store.get_client("notes-api")
    assert (made_a_client.kind, made_a_client.scopes) == ("client", ["read"])
    assert made_a_client.credentials_changed_at is not None and made_a_client.narrowed_at is None
    assert made_a_client.created_at == seeded.created_at
    await store.update_client("notes-api", {"credentials_changed_at": None})  # the marks below are this change's
    await seed(store, configured(client_secret=API_SECRET[::-1]))
    again = await store.get_client("notes-api")
    assert again.kind == "resource-server" and again.narrowed_at is not None
    assert again.credentials_changed_at is not None
