"""GET /oauth/clients and /oauth/clients/{client_id}, and the server metadata."""

import pytest
from helpers import check_schema, check_validation_error, json_of

from tokensvc import __version__, schemas


@pytest.mark.gen_test
async def test_list_clients(http_client, base_url):
    response = await http_client.fetch(base_url + "/oauth/clients")
    body = json_of(response)
    assert isinstance(body, list)
    check_schema(schemas.oauth_clients, body)
    assert [client["clientId"] for client in body] == ["node-agent", "partner", "skyplanner", "tokensvc-cli", "webapp"]
    for client in body:
        assert set(client) == {"clientId", "name", "redirectUris", "allowedScopes", "createdAt",
                               "description", "logoUrl"}


@pytest.mark.gen_test
async def test_one_client_in_camel_case_without_secrets(http_client, base_url):
    response = await http_client.fetch(base_url + "/oauth/clients/skyplanner")
    body = check_schema(schemas.oauth_client, json_of(response))
    assert body["clientId"] == "skyplanner" and body["name"] == "SkyPlanner"
    assert body["redirectUris"] == ["http://127.0.0.1:9000/callback"]
    assert body["allowedScopes"] == ["read", "observations:write"]
    assert body["logoUrl"] == "https://skyplanner.example/logo.png"
    assert body["createdAt"].endswith("+00:00")
    partner = json_of(await http_client.fetch(base_url + "/oauth/clients/partner"))
    text = repr(partner).lower()
    assert "secret" not in text and "first" not in text
    assert partner["allowedScopes"] == ["read"] and partner["description"] is None  # registered without scopes


@pytest.mark.gen_test
async def test_a_client_shows_the_same_scopes_in_the_public_and_admin_apis(http_client, base_url, ctx, config):
    from tokensvc.admin import operator

    admin = operator.Operator(ctx, config)
    for client in json_of(await http_client.fetch(base_url + "/oauth/clients")):
        assert client["allowedScopes"] == (await admin.get_client(client["clientId"]))["allowedScopes"]


@pytest.mark.gen_test
async def test_unknown_client_is_404(http_client, base_url):
    response = await http_client.fetch(base_url + "/oauth/clients/nobody", raise_error=False)
    assert response.code == 404
    assert check_schema(schemas.DetailSchema(), json_of(response))["detail"]


@pytest.mark.parametrize("client_id,type_", [("a" * 129, "string_too_long"), ("bad%20id", "value_error"),
                                              ("semi;colon", "value_error"), ("newline%0A", "value_error"),
                                              ("", "missing")])
@pytest.mark.gen_test
async def test_impossible_client_id_is_422(http_client, base_url, client_id, type_):
    response = await http_client.fetch(base_url + "/oauth/clients/" + client_id, raise_error=False)
    if client_id == "":
        # "/oauth/clients/" names no client at all.
        check_validation_error(response, ["path", "client_id"], "missing")
    else:
        check_validation_error(response, ["path", "client_id"], type_)


@pytest.mark.gen_test
async def test_metadata(http_client, base_url):
    response = await http_client.fetch(base_url + "/.well-known/oauth-authorization-server")
    body = check_schema(schemas.metadata, json_of(response))
    assert body["issuer"] == "http://127.0.0.1:8080"
    assert body["authorization_endpoint"] == "http://127.0.0.1:8080/oauth/authorize"
    assert body["token_endpoint"] == "http://127.0.0.1:8080/oauth/token"
    assert body["introspection_endpoint"] == "http://127.0.0.1:8080/oauth/token/introspect"
    assert body["revocation_endpoint"] == "http://127.0.0.1:8080/oauth/token/revoke"
    assert body["response_types_supported"] == ["code"]
    assert body["grant_types_supported"] == ["authorization_code"]
    assert body["code_challenge_methods_supported"] == ["S256"]
    assert set(body["token_endpoint_auth_methods_supported"]) == {"client_secret_basic", "client_secret_post", "none"}
    assert {"read", "write", "observations:write"} <= set(body["scopes_supported"])


@pytest.mark.gen_test
async def test_unknown_path_is_404_detail(http_client, base_url):
    response = await http_client.fetch(base_url + "/no/such/thing", raise_error=False)
    assert response.code == 404 and "detail" in json_of(response)


@pytest.mark.gen_test
async def test_health(http_client, base_url):
    assert json_of(await http_client.fetch(base_url + "/healthz")) == {"status": "ok", "version": __version__}
    assert json_of(await http_client.fetch(base_url + "/readyz")) == {"status": "ok"}
