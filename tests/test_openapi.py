"""The OpenAPI document: generated from the schemas, served, and kept current in docs/."""

import json
import re
from pathlib import Path

import pytest
from helpers import json_of

from tokensvc.app import ROUTES
from tokensvc.openapi import document as openapi

DEMO_BASE = "http://127.0.0.1:8080"  # config/tokensvc.toml
CHECKED_IN = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def test_checked_in_copy_is_current():
    assert CHECKED_IN.read_text() == openapi.render(ROUTES, DEMO_BASE), \
        "docs/openapi.json is stale: run `.venv/bin/tokensvc openapi > docs/openapi.json`"


METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def operations_of(document):
    return {(path, method): operation for path, item in document["paths"].items()
            for method, operation in item.items() if method in METHODS}


def test_document_shape():
    document = openapi.build(ROUTES, DEMO_BASE)
    assert document["openapi"] == "3.1.0" and document["info"]["version"] == "2.0.0"  # the OAuth API's label
    schemas = document["components"]["schemas"]
    assert schemas["TokenRequest"]["required"] == ["client_id", "code", "grant_type", "redirect_uri"]
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
    documented = {(path, method.upper()) for path, method in operations_of(openapi.build(ROUTES, DEMO_BASE))}
    served = {(route.path, method) for route in ROUTES for method in route.methods if method != "HEAD"}
    assert documented == served
    assert ("/login", "POST") in documented and ("/oauth/authorize", "POST") in documented


def test_a_route_without_its_documentation_stops_the_build():
    from tokensvc.app import ROUTES
    from tokensvc.handlers.edge.routes import Route

    with pytest.raises(ValueError, match="/undocumented"):
        openapi.build([*ROUTES, Route("/undocumented", object, frozenset({"GET", "HEAD"}))], DEMO_BASE)
    with pytest.raises(ValueError, match="documented but not routed"):
        openapi.build(ROUTES[1:], DEMO_BASE)


def test_every_token_endpoint_call_names_its_client():
    """The interface: client_id on every token-endpoint call, introspection's too; the document
    says HTTP Basic carries it for a client that authenticates so; an empty value is an absent
    one."""
    document = openapi.build(ROUTES, DEMO_BASE)
    for path in ("/oauth/token", "/oauth/token/refresh", "/oauth/token/revoke", "/oauth/token/introspect"):
        operation = document["paths"][path]["post"]
        form = form_of(document, operation)
        assert "client_id" in form["required"], path
        assert "HTTP Basic" in form["properties"]["client_id"]["description"]
        assert all(form["properties"][name]["minLength"] == 1 for name in form["required"])
        assert operation["security"] == [{}, {"clientBasic": []}, *([{"bearer": []}] if "introspect" in path else [])]
    assert document["components"]["schemas"]["TokenRequest"]["properties"]["grant_type"]["enum"] == [
        "authorization_code"]


def form_of(document, operation):
    """The schema of ``operation``'s form body."""
    name = operation["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"]["$ref"]
    return document["components"]["schemas"][name.rsplit("/", 1)[1]]


def test_introspection_takes_a_client_or_an_admins_bearer_token():
    """As authorize_caller does: a client's credentials (Basic, or in the body: the empty
    alternative), or an admin's bearer token, whose call names the token's client in client_id
    (tests/test_introspect.py introspects so)."""
    document = openapi.build(ROUTES, DEMO_BASE)
    operation = document["paths"]["/oauth/token/introspect"]["post"]
    assert operation["security"] == [{}, {"clientBasic": []}, {"bearer": []}]
    form = form_of(document, operation)
    assert form["required"] == ["client_id", "token"] and "bearer" in form["properties"]["client_id"]["description"]
    assert "HTTP Basic" in form["properties"]["client_id"]["description"]
    assert set(operation["responses"]) >= {"401", "403"}


def test_every_path_parameter_is_defined_for_every_operation_of_its_path():
    document = openapi.build(ROUTES, DEMO_BASE)
    for (path, method), operation in operations_of(document).items():
        defined = {p["name"] for p in [*document["paths"][path].get("parameters", []),
                                        *operation.get("parameters", [])] if p["in"] == "path"}
        assert defined == set(re.findall(r"\{([^}]+)\}", path)), (method, path)
    connected = document["paths"]["/v1/me/connected-apps/{client_id}"]
    assert {"delete", "options"} <= set(connected) and connected["parameters"][0]["schema"]["pattern"]


def test_the_session_cookie_is_a_security_scheme_and_the_pages_are_at_auth_url():
    document = openapi.build(ROUTES, "https://api.example", auth_url="https://login.example",
                             session_cookie="__Host-tokensvc_session")
    scheme = document["components"]["securitySchemes"]["session"]
    assert scheme == {**scheme, "type": "apiKey", "in": "cookie", "name": "__Host-tokensvc_session"}
    assert {"session": []} in document["paths"]["/v1/ws"]["get"]["security"]
    assert {"session": []} in document["paths"]["/v1/me"]["get"]["security"]
    assert document["servers"][0]["url"] == "https://api.example"
    for path in ("/oauth/authorize", "/login"):
        assert [server["url"] for server in document["paths"][path]["servers"]] == ["https://login.example"]
    assert "servers" not in document["paths"]["/oauth/token"]


def test_the_websocket_refusals_are_documented_as_served():
    responses = openapi.build(ROUTES, DEMO_BASE)["paths"]["/v1/ws"]["get"]["responses"]
    assert set(responses) == {"101", "400", "401", "403", "426", "503"}
    for status in ("400", "401", "403", "426", "503"):
        assert set(responses[status]["content"]) == {"application/json"}, status
    assert responses["426"]["headers"]["Sec-WebSocket-Version"]["schema"]["enum"] == ["13"]
    # A fault of the handshake's headers; a request not HTTP/1.1 with a Host (tests/test_ws.py).
    assert responses["426"]["content"]["application/json"]["schema"]["$ref"].endswith("/HTTPValidationError")
    assert [shape["$ref"].rsplit("/", 1)[1] for shape in responses["400"]["content"]["application/json"]["schema"][
        "anyOf"]] == ["HTTPValidationError", "Detail"]


def test_the_page_forms_state_what_they_require():
    """The account page's action and the authorization request's parameters are checked
    before anything else (422 page, or the error page): the forms say they are required."""
    document = openapi.build(ROUTES, DEMO_BASE)

    def form(path):
        return document["paths"][path]["post"]["requestBody"]["content"]["application/x-www-form-urlencoded"][
            "schema"]

    account = form("/account")
    assert account["required"] == ["action"] and account["properties"]["action"]["minLength"] == 1
    authorize = form("/oauth/authorize")
    assert authorize["required"] == sorted(p["name"] for p in document["paths"]["/oauth/authorize"]["get"][
        "parameters"] if p["required"])
    assert authorize["required"] == ["client_id", "code_challenge", "code_challenge_method", "redirect_uri",
                                     "response_type"]


@pytest.mark.gen_test
async def test_served_at_openapi_json(http_client, base_url, config):
    response = await http_client.fetch(base_url + "/openapi.json")
    assert json_of(response) == json.loads(openapi.render(ROUTES, DEMO_BASE, auth_url=config.auth_url,
                                                          session_cookie=config.session_cookie))
    assert json_of(response)["servers"][0]["url"] == "http://127.0.0.1:8080"  # the config's base_url


ADMIN_CHECKED_IN = CHECKED_IN.parent / "admin-openapi.json"
DEMO_ADMIN = "http://127.0.0.1:8081"  # the demo's admin listener: the public port + 1


def test_the_admin_apis_checked_in_copy_is_current():
    from tokensvc.app import ADMIN_ROUTES

    assert ADMIN_CHECKED_IN.read_text() == openapi.render(ADMIN_ROUTES, DEMO_ADMIN, admin=True), \
        "docs/admin-openapi.json is stale: run `.venv/bin/tokensvc openapi --admin > docs/admin-openapi.json`"


def test_the_admin_document_describes_the_admin_route_table_and_its_shapes():
    from tokensvc.app import ADMIN_ROUTES

    document = openapi.build(ADMIN_ROUTES, DEMO_ADMIN, admin=True)
    documented = {(path, method.upper()) for path, method in operations_of(document)}
    assert documented == {(route.path, method) for route in ADMIN_ROUTES for method in route.methods
                          if method != "HEAD"}
    schemas = document["components"]["schemas"]
    assert set(schemas["AdminClient"]["properties"]) == {
        "clientId", "name", "redirectUris", "allowedScopes", "firstParty", "confidential", "description", "logoUrl",
        "allowedOrigins", "createdAt", "kind", "resources"}
    assert schemas["ClientBody"]["properties"]["redirectUris"]["maxItems"] == 100
    operation = document["paths"]["/admin/users/{username}"]["patch"]
    assert operation["security"] == [{"bearer": []}] and set(operation["responses"]) >= {
        "200", "401", "403", "404", "422", "429", "503"}
    assert not [path for path in document["paths"] if path.startswith("/oauth")]


@pytest.mark.gen_test
async def test_two_applications_in_one_process_each_publish_their_own_server(http_client):
    """The document is the application's, not the process's: two services (and their admin
    listeners) in one process, each asked in turn, each name their own URL."""
    import tornado.httpserver
    import tornado.testing
    from helpers import make_config

    from tokensvc.app import make_admin_app, make_app
    from tokensvc.bootstrap import make_context
    from tokensvc.storage.memory import MemoryStore

    servers, published = [], {}
    try:
        for name, admin_port in (("one", 9101), ("two", 9102)):
            config = make_config(base_url=f"https://{name}.example", admin={"port": admin_port})
            store = MemoryStore()
            ctx = make_context(config, store)
            for kind, app in (("public", make_app(config, store, ctx)), ("admin", make_admin_app(config, store, ctx))):
                sock, port = tornado.testing.bind_unused_port()
                server = tornado.httpserver.HTTPServer(app)
                server.add_sockets([sock])
                servers.append(server)
                response = await http_client.fetch(f"http://127.0.0.1:{port}/openapi.json",
                                                   headers={"Host": f"{name}.example"})
                published[name, kind] = [server["url"] for server in json_of(response)["servers"]]
    finally:
        for server in servers:
            server.stop()
    assert published == {("one", "public"): ["https://one.example"],
                         ("one", "admin"): ["http://127.0.0.1:9101"],
                         ("two", "public"): ["https://two.example"],
                         ("two", "admin"): ["http://127.0.0.1:9102"]}


def test_the_admin_document_states_its_listings_limit_and_only_its_own_scheme():
    """limit 1-200, as the admin API enforces it (tests/test_admin_api.py); only the bearer
    scheme, the one every admin operation names."""
    from tokensvc.app import ADMIN_ROUTES

    document = openapi.build(ADMIN_ROUTES, DEMO_ADMIN, admin=True)
    listings = {path for (path, method), operation in operations_of(document).items()
                if any(p["name"] == "limit" for p in operation.get("parameters", []))}
    assert listings == {"/admin/clients", "/admin/users", "/admin/installations", "/admin/grants"}
    for path in listings:
        limit = next(p for p in document["paths"][path]["get"]["parameters"] if p["name"] == "limit")
        assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 200}, path
    assert set(document["components"]["securitySchemes"]) == {"bearer"}
    session = document["paths"]["/admin/users/{username}/sessions/{session_id}"]["delete"]["parameters"][1]
    assert session["schema"]["pattern"] == "^[0-9a-f]{24}$"  # as at /v1/me/sessions/{session_id}
    assert {scheme for operation in operations_of(document).values()
            for alternative in operation.get("security", []) for scheme in alternative} == {"bearer"}


def test_the_admin_document_states_the_plan_the_secrets_as_given_and_the_configured_kinds(tmp_path, capsys):
    """What ``tokensvc apply`` sends, with the rules the service applies: a plan's entries each
    of its table's fields (the id required), a client secret as its SHA-256 (which makes the
    client confidential), a password or a hash as stored (one of them), the kinds the service
    is configured with; and a 422 names the field at fault in its loc."""
    from tokensvc import identifiers
    from tokensvc.admin import schemas as admin_schemas
    from tokensvc.app import ADMIN_ROUTES
    from tokensvc.cli import main as cli

    document = openapi.build(ADMIN_ROUTES, DEMO_ADMIN, admin=True, kinds=["antenna", "weather station"])
    schemas = document["components"]["schemas"]
    plan = document["paths"]["/admin/plan"]["post"]
    assert plan["requestBody"] == {"required": False, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/PlanBody"}}}}  # no body: the plan of nothing
    assert set(plan["responses"]) == {"200", "401", "403", "413", "422", "429", "503"}
    assert plan["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Plan"}
    assert "loc names it" in plan["responses"]["422"]["description"]
    entries = {name: schemas["PlanBody"]["properties"][name]["items"] for name in ("clients", "users", "installations")}
    assert entries == {"clients": {"$ref": "#/components/schemas/PlanClient"},
                       "users": {"$ref": "#/components/schemas/PlanUser"},
                       "installations": {"$ref": "#/components/schemas/PlanInstallation"}}
    assert [schemas[name]["required"] for name in ("PlanClient", "PlanUser", "PlanInstallation")] == [
        ["clientId"], ["username"], ["installationId"]]
    assert all(schemas[name]["additionalProperties"] is False
               for name in ("PlanBody", "PlanClient", "PlanUser", "PlanInstallation"))
    step = schemas["PlanStep"]["properties"]
    assert step["action"]["enum"] == ["create", "update", "unchanged", "remove"]
    assert step["changes"]["items"] == {"$ref": "#/components/schemas/PlanChange"}
    for name in ("ClientBody", "ClientPutBody", "ClientPatch", "PlanClient"):
        assert schemas[name]["properties"]["clientSecretSha256"]["pattern"] == identifiers.SHA256_HEX.pattern
        assert schemas[name]["not"] == admin_schemas.SECRET_MAKES_CONFIDENTIAL["not"]
    for name in ("UserBody", "PasswordBody", "PlanUser"):
        assert schemas[name]["properties"]["passwordHash"]["pattern"] == identifiers.PASSWORD_HASH.pattern
    assert schemas["UserBody"]["oneOf"] == schemas["PasswordBody"]["oneOf"] == [
        {"required": ["password"]}, {"required": ["passwordHash"]}]
    assert "password" not in schemas["UserBody"].get("required", [])
    for name in ("InstallationBody", "PlanInstallation"):
        assert schemas[name]["properties"]["kind"]["enum"] == ["antenna", "weather station"]
    # The command line prints the document of the config's kinds.
    config_file = tmp_path / "kinds.toml"
    config_file.write_text('cookie_secret = "a-cookie-secret-of-32-characters"\ninstallation_kinds = ["antenna"]\n')
    assert cli.main(["openapi", "--admin", "--config", str(config_file)]) == 0
    printed = json.loads(capsys.readouterr().out)["components"]["schemas"]
    assert printed["InstallationBody"]["properties"]["kind"]["enum"] == ["antenna"]


def test_resource_indicators_are_documented_where_they_are_taken():
    """RFC 8707: ``resource`` at the authorization request (a repeatable query parameter, and
    the consent form that repeats it), at the code exchange and at the refresh (a repeatable
    form field); ``invalid_target`` among the error codes; the metadata says so."""
    from tokensvc import identifiers
    from tokensvc.oauth import audience

    document = openapi.build(ROUTES, DEMO_BASE)
    schemas = document["components"]["schemas"]
    authorize = next(p for p in document["paths"]["/oauth/authorize"]["get"]["parameters"] if p["name"] == "resource")
    assert authorize["in"] == "query" and authorize["style"] == "form" and authorize["explode"] is True
    assert authorize["schema"]["type"] == "array" and authorize["schema"]["maxItems"] == audience.MAX_RESOURCES
    assert authorize["schema"]["items"]["maxLength"] == identifiers.RESOURCE_MAX_LENGTH
    consent = document["paths"]["/oauth/authorize"]["post"]["requestBody"]["content"][
        "application/x-www-form-urlencoded"]["schema"]
    assert consent["properties"]["resource"]["type"] == "array"
    for name in ("TokenRequest", "RefreshRequest"):
        resource = schemas[name]["properties"]["resource"]
        assert resource["type"] == "array" and resource["maxItems"] == audience.MAX_RESOURCES, name
        assert resource["items"]["maxLength"] == identifiers.RESOURCE_MAX_LENGTH, name
        assert "invalid_target" in resource["description"] and "resource" not in schemas[name].get("required", [])
    assert "access token" in schemas["RefreshRequest"]["properties"]["resource"]["description"]
    assert "invalid_target" in schemas["OAuthError"]["properties"]["error"]["enum"]
    assert "resource_indicators_supported" in schemas["Metadata"]["properties"]
    assert "aud" in schemas["IntrospectionResponse"]["properties"]


def test_the_error_codes_listed_are_every_code_an_error_answers():
    """The OAuthError body's ``error`` enum is every protocol error's code: one added to
    tokensvc.oauth.errors without the list fails here."""
    from tokensvc.oauth import errors
    from tokensvc.ratelimit import TooManyFailures

    def every(cls):
        return {cls, *(found for sub in cls.__subclasses__() for found in every(sub))}

    codes = {cls.error for cls in every(errors.OAuthError)} | {TooManyFailures(1, "login").body()["error"]}
    enum = openapi.build(ROUTES, DEMO_BASE)["components"]["schemas"]["OAuthError"]["properties"]["error"]["enum"]
    assert set(enum) == codes and "invalid_target" in enum


def test_a_repeatable_form_field_is_left_to_its_handler():
    """``resource`` is in the token forms' schemas (so the document lists it) yet may be sent
    more than once: the form reader leaves it to the handler, which reads every value."""
    from tokensvc import schemas
    from tokensvc.handlers.edge.inputs import single_values

    assert "resource" in schemas.refresh_request.fields and "resource" in schemas.token_request.fields
    arguments = {"refresh_token": [b"r"], "resource": [b"https://a.example", b"https://b.example"]}
    assert single_values(arguments, schemas.refresh_request) == {"refresh_token": "r"}
    assert schemas.load(schemas.refresh_request, {"refresh_token": "r"}, "body")["refresh_token"] == "r"


def test_the_admin_document_states_a_resource_servers_resources():
    from tokensvc.app import ADMIN_ROUTES

    schemas = openapi.build(ADMIN_ROUTES, DEMO_ADMIN, admin=True)["components"]["schemas"]
    for name in ("AdminClient", "ClientBody", "ClientPutBody", "ClientPatch", "PlanClient"):
        resources = schemas[name]["properties"]["resources"]
        assert resources["type"] == "array" and resources["items"]["type"] == "string", name
        assert "/v1" in resources["description"] and "another resource server" in resources["description"], name
