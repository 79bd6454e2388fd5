"""The OpenAPI document: generated from the schemas, served, and kept current in docs/."""

import json
from pathlib import Path

import pytest
from helpers import json_of

from tokensvc import openapi
from tokensvc.app import ROUTES

DEMO_BASE = "http://127.0.0.1:8080"  # config/tokensvc.toml
CHECKED_IN = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def test_checked_in_copy_is_current():
    assert CHECKED_IN.read_text() == openapi.render(ROUTES, DEMO_BASE), \
        "docs/openapi.json is stale: run `.venv/bin/tokensvc openapi > docs/openapi.json`"


def test_document_shape():
    document = openapi.build(ROUTES, DEMO_BASE)
    assert document["openapi"] == "3.1.0"
    schemas = document["components"]["schemas"]
    assert schemas["TokenRequest"]["required"] == ["code", "grant_type", "redirect_uri"]
    assert schemas["TokenRequest"]["properties"]["code"]["maxLength"] == 512
    assert set(schemas["OAuthClient"]["properties"]) == {"clientId", "name", "redirectUris", "allowedScopes",
                                                         "createdAt", "description", "logoUrl"}
    assert schemas["HTTPValidationError"]["properties"]["detail"]["items"]["$ref"].endswith("/ValidationError")
    for path in ("/oauth/token", "/oauth/token/refresh", "/oauth/token/introspect", "/oauth/token/revoke",
                 "/oauth/revoke", "/oauth/sign-out", "/oauth/clients", "/oauth/clients/{client_id}",
                 "/oauth/authorize", "/v1/me", "/v1/me/connected-apps", "/v1/me/connected-apps/{client_id}",
                 "/.well-known/oauth-authorization-server", "/account"):
        assert path in document["paths"], path


def test_the_document_describes_the_route_table():
    """One route table: every (path, method) served is documented, and nothing else is."""
    paths = openapi.build(ROUTES, DEMO_BASE)["paths"]
    documented = {(path, method.upper()) for path, item in paths.items() for method in item}
    served = {(route.path, method) for route in ROUTES for method in route.methods if method != "HEAD"}
    assert documented == served
    assert ("/login", "POST") in documented and ("/oauth/authorize", "POST") in documented


def test_a_route_without_its_documentation_stops_the_build():
    from tokensvc.app import ROUTES
    from tokensvc.handlers.lifecycle import Route

    with pytest.raises(ValueError, match="/undocumented"):
        openapi.build([*ROUTES, Route("/undocumented", object, frozenset({"GET", "HEAD"}))], DEMO_BASE)
    with pytest.raises(ValueError, match="documented but not routed"):
        openapi.build(ROUTES[1:], DEMO_BASE)


@pytest.mark.gen_test
async def test_served_at_openapi_json(http_client, base_url):
    response = await http_client.fetch(base_url + "/openapi.json")
    assert json_of(response) == json.loads(openapi.render(ROUTES, DEMO_BASE))
    assert json_of(response)["servers"] == [{"url": "http://127.0.0.1:8080"}]  # the config's base_url


ADMIN_CHECKED_IN = CHECKED_IN.parent / "admin-openapi.json"
DEMO_ADMIN = "http://127.0.0.1:8081"  # the demo's admin listener: the public port + 1


def test_the_admin_apis_checked_in_copy_is_current():
    from tokensvc.app import ADMIN_ROUTES

    assert ADMIN_CHECKED_IN.read_text() == openapi.render(ADMIN_ROUTES, DEMO_ADMIN, admin=True), \
        "docs/admin-openapi.json is stale: run `.venv/bin/tokensvc openapi --admin > docs/admin-openapi.json`"


def test_the_admin_document_describes_the_admin_route_table_and_its_shapes():
    from tokensvc.app import ADMIN_ROUTES

    document = openapi.build(ADMIN_ROUTES, DEMO_ADMIN, admin=True)
    documented = {(path, method.upper()) for path, item in document["paths"].items() for method in item}
    assert documented == {(route.path, method) for route in ADMIN_ROUTES for method in route.methods
                          if method != "HEAD"}
    schemas = document["components"]["schemas"]
    assert set(schemas["AdminClient"]["properties"]) == {
        "clientId", "name", "redirectUris", "allowedScopes", "firstParty", "confidential", "description", "logoUrl",
        "allowedOrigins", "createdAt"}
    assert schemas["ClientBody"]["properties"]["redirectUris"]["maxItems"] == 100
    operation = document["paths"]["/admin/users/{username}"]["patch"]
    assert operation["security"] == [{"bearer": []}] and set(operation["responses"]) >= {
        "200", "401", "403", "404", "422", "429", "503"}
    assert not [path for path in document["paths"] if path.startswith("/oauth")]
