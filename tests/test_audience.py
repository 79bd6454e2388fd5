"""Audience-bound tokens (RFC 8707, resource indicators): a resource server declares the APIs it
serves; an authorization request, a code exchange and a refresh may name ``resource`` (each
declared, else ``invalid_target``), an exchange or a refresh only narrowing what was granted;
introspection says ``aud``, and answers ``active: false`` to a resource server the token is not
meant for; tokensvc's own ``/v1`` API refuses a token bound only to others, and
``tokensvc.resource``'s verifier refuses a token meant for another API. A token that names no
resource works where it worked before. On MongoDB, tokens are bound only once the store's
compatibility version is format 3 (tokens/upgrade/ runs that with 0.10.0)."""

from __future__ import annotations

import html as html_module
import json
import re
from urllib.parse import urlencode

import pytest
from backends import open_store
from helpers import (
    CHALLENGE,
    NODE_REDIRECT,
    PARTNER_REDIRECT,
    SKY_REDIRECT,
    VERIFIER,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    basic,
    check_oauth_error,
    handed_over,
    make_config,
    post_form,
    query_of,
)
from test_resource import started

from tokensvc import config as config_module
from tokensvc.admin.operator import Operator
from tokensvc.bootstrap import make_context, seed
from tokensvc.handlers.edge import pace
from tokensvc.oauth import audience, authorization, confirmation, grants, introspection, revocation
from tokensvc.oauth.errors import InvalidTarget, RedirectError
from tokensvc.resource import InvalidToken, Settings, Verifier
from tokensvc.storage.mongo.format import StoreFormat

NOTES, PHOTOS = "https://notes.example", "https://photos.example/api"
NOTES_SECRET, PHOTOS_SECRET = "notes-api-secret-0123456789abcdef", "photos-api-secret-0123456789abcdef"
OWN = "http://127.0.0.1:8080/v1"  # make_config's base_url + /v1

pytestmark = pytest.mark.gen_test(timeout=60)


def apis() -> list[dict]:
    return [{"client_id": "notes-api", "name": "Notes API", "kind": "resource-server", "client_secret": NOTES_SECRET,
             "resources": [NOTES]},
            {"client_id": "photos-api", "name": "Photos API", "kind": "resource-server",
             "client_secret": PHOTOS_SECRET, "resources": [PHOTOS]}]


def with_apis() -> config_module.Settings:
    base = make_config()
    raw_clients = [{"client_id": c.client_id, "name": c.name, "redirect_uris": list(c.redirect_uris),
                    "allowed_scopes": None if c.allowed_scopes is None else list(c.allowed_scopes),
                    "first_party": c.first_party, "client_secret": c.client_secret,
                    **({"description": c.description} if c.description else {}),
                    **({"logo_url": c.logo_url} if c.logo_url else {})}
                   for c in base.clients]
    return make_config(clients=[{k: v for k, v in c.items() if v is not None} for c in raw_clients] + apis())


@pytest.fixture
def config():
    return with_apis()


def request_args(*resources: str, client_id: str = "webapp", redirect_uri: str = WEBAPP_REDIRECT,
                 scope: str = "read") -> dict[str, list[str]]:
    args = {name: [value] for name, value in {
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "state": "s",
        "code_challenge": CHALLENGE, "code_challenge_method": "S256", "scope": scope}.items()}
    if resources:
        args["resource"] = list(resources)
    return args


async def code_for(ctx, *resources: str, username: str = "alice") -> str:
    request = await authorization.validate(ctx, request_args(*resources))
    subject, _ = await authorization.resolve_subject(ctx, request, await ctx.store.get_user_by_username(username))
    return query_of(await authorization.issue_code(ctx, request, subject))["code"]


async def tokens_for(ctx, *resources: str, narrowed_to: list[str] | None = None):
    code = await code_for(ctx, *resources)
    return await grants.exchange_code(ctx, await ctx.store.get_client("webapp"), code, WEBAPP_REDIRECT, VERIFIER,
                                      resources=narrowed_to)


async def exchange_for(http_client, base_url, code, resources):
    form = [("grant_type", "authorization_code"), ("code", code), ("redirect_uri", WEBAPP_REDIRECT),
            ("code_verifier", VERIFIER), *(("resource", resource) for resource in resources)]
    return await http_client.fetch(base_url + "/oauth/token", method="POST", body=urlencode(form), raise_error=False,
                                   headers={"Authorization": basic("webapp", WEBAPP_SECRET)})


async def introspect_as(http_client, base_url, token, client_id, secret):
    response = await post_form(http_client, base_url + "/oauth/token/introspect", {"token": token},
                               {"Authorization": basic(client_id, secret)})
    assert response.code == 200, response.body
    return json.loads(response.body)


# -- declaring resources -------------------------------------------------------------------------


def test_a_resource_server_declares_absolute_uris_without_a_fragment_and_a_client_none():
    bad = [{**apis()[0], "resources": ["https://notes.example/#part", "/relative", "no scheme"]}]
    with pytest.raises(config_module.ConfigError) as refused:
        make_config(clients=bad)
    said = str(refused.value)
    assert "resources[0]" in said and "no fragment" in said
    assert "resources[1]" in said and "resources[2]" in said
    with pytest.raises(config_module.ConfigError) as refused:
        make_config(clients=[{"client_id": "app", "name": "App", "redirect_uris": [WEBAPP_REDIRECT],
                              "resources": [NOTES]}])
    assert "only a resource server serves resources" in str(refused.value)


async def test_the_admin_api_takes_a_resource_servers_resources_and_shows_them(app, ctx, config):
    operator = Operator(ctx, handed_over(config))
    created, _ = await operator.put_client("calendar-api", {"name": "Calendar API", "kind": "resource-server",
                                                            "resources": ["https://calendar.example/v2"]})
    assert created["resources"] == ["https://calendar.example/v2"]
    assert (await operator.get_client("calendar-api"))["resources"] == ["https://calendar.example/v2"]
    assert await ctx.store.declared_resources(["https://calendar.example/v2", NOTES, "https://x.example"]) == {
        "https://calendar.example/v2", NOTES}
    from tokensvc.admin.actions import AdminError

    with pytest.raises(AdminError) as refused:
        await operator.patch_client("calendar-api", {"resources": ["https://calendar.example/#x"]})
    assert refused.value.field == "resources"
    with pytest.raises(AdminError) as refused:
        await operator.put_client("an-app", {"name": "An app", "redirectUris": [WEBAPP_REDIRECT],
                                             "resources": [NOTES]})
    assert refused.value.field == "resources"
    assert (await operator.patch_client("calendar-api", {"resources": []}))["resources"] == []
    assert await ctx.store.declared_resources(["https://calendar.example/v2"]) == set()


def test_the_configuration_refuses_tokensvcs_own_api_and_a_resource_two_servers_declare():
    """A resource URI is one resource server's, compared canonically, and never tokensvc's own
    API: ``config check`` and start-up refuse the file, naming both clients."""
    own = [{**apis()[0], "resources": [NOTES, "HTTP://127.0.0.1:8080/v1"]}]
    with pytest.raises(config_module.ConfigError) as refused:
        make_config(clients=own)
    assert "clients[0].resources[1]" in str(refused.value) and "tokensvc's own API" in str(refused.value)
    assert "'notes-api'" in str(refused.value)
    shared = [apis()[0], {**apis()[1], "resources": [PHOTOS, "https://NOTES.example:443/"]}]
    with pytest.raises(config_module.ConfigError) as refused:
        make_config(clients=shared)
    said = str(refused.value)
    assert "clients[1].resources[1]" in said and "'notes-api'" in said and "'photos-api'" in said
    assert "one resource server's" in said


def test_config_check_says_which_clients_share_a_resource(tmp_path, capsys):
    from tokensvc.cli import main as cli

    path = tmp_path / "tokensvc.toml"
    path.write_text('cookie_secret = "a-cookie-secret-of-32-characters"\n' + "".join(
        f'[[clients]]\nclient_id = "{client_id}"\nname = "{client_id}"\nkind = "resource-server"\n'
        f'client_secret = "{client_id}-secret-0123456789abcdef"\nresources = ["https://notes.example"]\n'
        for client_id in ("notes-api", "notes-copy")))
    assert cli.main(["config", "check", "--config", str(path)]) != 0
    err = capsys.readouterr().err
    assert "'notes-api'" in err and "'notes-copy'" in err and "https://notes.example" in err


async def test_the_admin_api_refuses_tokensvcs_own_api_and_another_servers_resource(app, http_server, http_client,
                                                                                    ctx, config):
    """422 HTTPValidationError at ``resources``, whether it is written as declared (naming the
    other client) or in another spelling of the same URI (naming the canonical form to write),
    at a registration, a replacement and a change."""
    from tokensvc.admin.actions import AdminError

    operator = Operator(ctx, handed_over(config))
    await ctx.store.set_owners("client", {})  # the operator's to change, as the admin API changes it
    body = {"name": "Calendar API", "kind": "resource-server"}
    for taken, said in ((OWN, "tokensvc's own API"), (NOTES, "'notes-api'"),
                        ("https://Notes.Example:443", "write it in canonical form: https://notes.example"),
                        (PHOTOS, "'photos-api'")):
        changed = ("photos-api", [taken]) if taken.lower().startswith(NOTES) else ("notes-api", [NOTES, taken])
        for write, args in ((operator.put_client, ("calendar-api", {**body, "resources": [taken]})),
                            (operator.create_client, ({**body, "clientId": "calendar-api", "resources": [taken]},)),
                            (operator.patch_client, (changed[0], {"resources": changed[1]}))):
            with pytest.raises(AdminError) as refused:
                await write(*args)
            assert refused.value.status_code == 422 and refused.value.field == "resources", taken
            assert refused.value.body()["detail"][0]["loc"] == ["body", "resources"]
            assert said in str(refused.value), (taken, str(refused.value))
    assert await ctx.store.get_client("calendar-api") is None
    assert (await ctx.store.get_client("photos-api")).resources == [PHOTOS]
    # Its own again, and one set free by its server.
    assert (await operator.patch_client("notes-api", {"resources": [NOTES, "https://notes.example/v2"]}))[
        "resources"] == [NOTES, "https://notes.example/v2"]
    await operator.patch_client("notes-api", {"resources": ["https://notes.example/v2"]})
    created, _ = await operator.put_client("calendar-api", {**body, "resources": [NOTES]})
    assert created["resources"] == [NOTES]


async def test_a_write_that_loses_the_race_for_a_resource_is_422_and_writes_nothing(app, ctx, config):
    """The checks read the store before the write; another writer landing in between is the
    store's to refuse (ResourceTaken), told as the same 422."""
    from tokensvc.admin.actions import AdminError
    from tokensvc.records import RESOURCE_SERVER, Client

    operator = Operator(ctx, handed_over(config))
    real_list, lists = ctx.store.list_clients, []

    async def listed_before_the_other_landed(*args, **kwargs):
        found = await real_list(*args, **kwargs)
        lists.append(found)
        if len(lists) == 2:  # the resources' check (admin.check_resources), the last read before the write
            await ctx.store.add_client(Client("other-api", "Other API", [], [], secret_hash="h", kind=RESOURCE_SERVER,
                                              resources=["https://calendar.example"]))
        return found

    ctx.store.list_clients = listed_before_the_other_landed
    with pytest.raises(AdminError) as refused:
        await operator.create_client({"clientId": "calendar-api", "name": "Calendar API", "kind": "resource-server",
                                      "resources": ["https://calendar.example"]})
    assert refused.value.field == "resources" and "'https://calendar.example'" in str(refused.value)
    assert "written meanwhile" in str(refused.value) and len(lists) == 2
    del ctx.store.list_clients
    assert await ctx.store.get_client("calendar-api") is None


async def test_start_up_refuses_a_file_resource_another_client_declares(app, ctx, config):
    """The file's resource server declares a URI a client the admin API registered declares:
    seeding stops start-up (StoreFault) naming both, and writes nothing of it."""
    from tokensvc.records import RESOURCE_SERVER, Client
    from tokensvc.storage.base import StoreFault

    store = ctx.store
    await store.set_owners("client", {})
    await store.update_client("notes-api", {"resources": ["https://notes.example/v2"]})
    await store.add_client(Client("notes-copy", "Notes copy", [], [], secret_hash="h", kind=RESOURCE_SERVER,
                                  resources=["https://NOTES.example/"]))
    with pytest.raises(StoreFault) as refused:
        await seed(store, config)
    assert "'notes-api'" in str(refused.value) and "'notes-copy'" in str(refused.value)
    assert (await store.get_client("notes-api")).resources == ["https://notes.example/v2"]


# Spellings of a URI that RFC 3986 §6.2.2-6.2.3 makes one, each with the canonical form to use.
NOT_CANONICAL = (
    ("HTTPS://Notes.Example", "https://notes.example"),
    ("https://notes.example.", "https://notes.example"),
    ("https://notes.example:443", "https://notes.example"),
    ("https://notes.example:0443", "https://notes.example"),
    ("https://notes.example:", "https://notes.example"),
    ("https://notes.example/", "https://notes.example"),
    ("https://notes.example/.", "https://notes.example"),
    ("https://notes.example/a/./b/../c", "https://notes.example/a/c"),
    ("https://notes.example/%7Euser/%61", "https://notes.example/~user/a"),
    ("https://notes.example/a%2fb", "https://notes.example/a%2Fb"),
    ("https://notes.example:8443/x?%41=1", "https://notes.example:8443/x?A=1"),
    ("http://127.0.0.1:8080/%76%31", OWN),
    ("http://127.0.0.1:8080/./v1", OWN),
    ("http://127.0.0.1:8080/v1/../v1", OWN),
)


def test_a_declared_resource_uri_is_refused_unless_written_in_canonical_form():
    """A resource server declares each URI in its canonical form alone (lower-case scheme and
    host, no default port, no leading zero in the port, no trailing dot in the host, no dot
    segment, no percent-encoded unreserved character, upper-case hex in the others, an empty
    path for ``/``), so that comparing strings compares URIs; the message names the form to
    write. User info is refused outright. The path's case is significant (RFC 3986 §6.2.2.1),
    and a host name is never resolved: ``localhost`` is not ``127.0.0.1``."""
    from tokensvc import identifiers

    for written, canonical in NOT_CANONICAL:
        assert identifiers.declared_resource_problem(written) == f"write it in canonical form: {canonical}", written
        assert identifiers.declared_resource_problem(canonical) is None, canonical
        assert identifiers.resource_key(written) == canonical
    for written in ("https://user@notes.example", "https://user:pw@notes.example/x"):
        assert identifiers.declared_resource_problem(written) == "no user info before the host", written
    for written in ("https://notes.example:0", "https://notes.example:65536", "https://notes.example/%zz",
                    "https://notes.example:x"):
        assert identifiers.declared_resource_problem(written) is not None, written
    for distinct in (NOTES, "https://notes.example/V1", "https://notes.example/v1/", "http://localhost:8080/v1",
                     "https://[::1]:8443/api", "urn-like://host/path"):
        assert identifiers.declared_resource_problem(distinct) is None, distinct
    assert identifiers.resource_key("https://user@notes.example") == NOTES
    with pytest.raises(config_module.ConfigError) as refused:
        make_config(clients=[{**apis()[0], "resources": ["https://NOTES.example:443/"]}])
    assert "clients[0].resources[0]" in str(refused.value)
    assert "write it in canonical form: https://notes.example" in str(refused.value)


async def test_the_admin_api_refuses_another_spelling_of_a_declared_uri_naming_the_form_to_write(app, ctx,
                                                                                                  config):
    """422 at ``resources`` for every spelling that is not canonical, whether it would collide
    (notes-api's, tokensvc's own) or not; a URI within tokensvc's own API is refused too."""
    from tokensvc.admin.actions import AdminError

    operator = Operator(ctx, handed_over(config))
    body = {"name": "Calendar API", "kind": "resource-server", "clientId": "calendar-api"}
    for written, canonical in (*NOT_CANONICAL, ("https://user@notes.example", None),
                               ("http://127.0.0.1:8080/v1/", None), ("http://127.0.0.1:8080/v1/me", None)):
        with pytest.raises(AdminError) as refused:
            await operator.create_client({**body, "resources": [written]})
        assert refused.value.status_code == 422 and refused.value.field == "resources", written
        assert canonical is None or f"write it in canonical form: {canonical}" in str(refused.value), written
    assert await ctx.store.get_client("calendar-api") is None
    created, _ = await operator.put_client("calendar-api", {**body, "resources": ["http://127.0.0.1:8080/V1",
                                                                                  "http://localhost:8080/v1"]})
    assert created["resources"] == ["http://127.0.0.1:8080/V1", "http://localhost:8080/v1"]


async def test_start_up_warns_of_a_stored_resource_uri_not_in_canonical_form(app, ctx, config, caplog):
    """A store written before the rule may hold a URI in another spelling: start-up goes on,
    and says which client declares it and the form to write; the URI binds tokens as written."""
    from tokensvc.records import RESOURCE_SERVER, Client

    await ctx.store.add_client(Client("calendar-api", "Calendar API", [], [], secret_hash="h", kind=RESOURCE_SERVER,
                                      resources=["HTTPS://Calendar.example:443/"]))
    caplog.set_level("WARNING", logger="tokensvc")
    await seed(ctx.store, config)
    said = [record.getMessage() for record in caplog.records if "calendar-api" in record.getMessage()]
    assert said and "'HTTPS://Calendar.example:443/'" in said[0] and "https://calendar.example" in said[0], said
    assert await ctx.store.declared_resources(["HTTPS://Calendar.example:443/"]) == {"HTTPS://Calendar.example:443/"}


async def test_start_up_refuses_a_stored_resource_server_declaring_tokensvcs_own_api(app, ctx, config):
    """``base_url`` changed since a resource server declared what is now tokensvc's own API
    (``base_url`` + ``/v1``) or a URI within it: start-up stops (StoreFault) naming the client,
    since a token meant for tokensvc would pass at that server too."""
    from tokensvc.records import RESOURCE_SERVER, Client
    from tokensvc.storage.base import StoreFault

    for declared in (OWN, OWN + "/me"):
        await ctx.store.put_client(Client("old-api", "Old API", [], [], secret_hash="h", kind=RESOURCE_SERVER,
                                          resources=["https://old.example", declared]))
        with pytest.raises(StoreFault) as refused:
            await seed(ctx.store, config)
        assert "'old-api'" in str(refused.value) and repr(declared) in str(refused.value)
        assert "base_url" in str(refused.value)
    await ctx.store.update_client("old-api", {"resources": ["https://old.example"]})
    await seed(ctx.store, config)


# -- the authorization request, the exchange, the refresh ----------------------------------------


async def test_a_token_bound_to_an_api_says_so_and_is_active_only_for_that_api(app, http_server, http_client,
                                                                                base_url, ctx):
    issued = await tokens_for(ctx, NOTES)
    token = issued.access_token
    assert (await introspection.introspect(ctx, token))["aud"] == [NOTES]
    notes = await introspect_as(http_client, base_url, token, "notes-api", NOTES_SECRET)
    assert notes["active"] is True and notes["aud"] == [NOTES] and notes["scope"] == "read"
    assert await introspect_as(http_client, base_url, token, "photos-api", PHOTOS_SECRET) == {"active": False}
    # A first-party client that may introspect sees the answer, with its audience.
    assert (await introspect_as(http_client, base_url, token, "webapp", WEBAPP_SECRET))["aud"] == [NOTES]
    # A token that names none is every API's: no aud, active for each.
    unbound = (await tokens_for(ctx)).access_token
    assert "aud" not in await introspection.introspect(ctx, unbound)
    for client_id, secret in (("notes-api", NOTES_SECRET), ("photos-api", PHOTOS_SECRET)):
        assert (await introspect_as(http_client, base_url, unbound, client_id, secret))["active"] is True


async def test_tokensvcs_own_api_refuses_a_token_bound_only_to_another(app, http_server, http_client, base_url,
                                                                        ctx):
    async def me(token):
        return await http_client.fetch(base_url + "/v1/me", headers={"Authorization": f"Bearer {token}"},
                                       raise_error=False)

    elsewhere = (await tokens_for(ctx, NOTES)).access_token
    refused = await me(elsewhere)
    assert refused.code == 401 and json.loads(refused.body)["error"] == "invalid_token"
    assert (await me((await tokens_for(ctx, NOTES, OWN)).access_token)).code == 200
    assert (await me((await tokens_for(ctx, OWN)).access_token)).code == 200
    assert (await me((await tokens_for(ctx)).access_token)).code == 200


async def test_a_resource_no_api_declares_or_a_malformed_one_is_invalid_target(app, ctx):
    for resources in (["https://unknown.example"], ["https://notes.example#x"], ["notes.example"],
                      [NOTES, "https://unknown.example"], ["https://NOTES.example"], ["https://notes.example/"],
                      ["http://127.0.0.1:8080/v1/"]):  # another spelling of a declared URI, or of tokensvc's own
        with pytest.raises(RedirectError) as refused:
            await authorization.validate(ctx, request_args(*resources))
        assert refused.value.error.error == "invalid_target", resources
        assert query_of(refused.value.location)["error"] == "invalid_target"
    request = await authorization.validate(ctx, request_args(NOTES, PHOTOS, NOTES))
    assert request.audience == [NOTES, PHOTOS]  # each once, in order
    assert request.hidden_fields()["resource"] == [NOTES, PHOTOS]  # what a consent page posts back


async def test_an_empty_resource_is_left_out_at_the_authorization_request_as_at_the_token_endpoints(app, ctx):
    """RFC 6749 §3.1: a parameter sent without a value is treated as omitted."""
    assert (await authorization.validate(ctx, request_args(""))).audience is None
    request = await authorization.validate(ctx, request_args("", NOTES, ""))
    assert request.audience == [NOTES] and request.hidden_fields()["resource"] == [NOTES]


async def test_a_consent_page_carries_the_resources_through(app, http_server, browser, ctx):
    """A third-party client's request naming resources: the consent form posts them back, and
    the code is bound to them."""
    await browser.login("alice")
    page = await browser.fetch("/oauth/authorize?" + urlencode([
        ("response_type", "code"), ("client_id", "skyplanner"), ("redirect_uri", SKY_REDIRECT), ("state", "s"),
        ("code_challenge", CHALLENGE), ("code_challenge_method", "S256"), ("scope", "read"),
        ("resource", NOTES), ("resource", PHOTOS)]))
    assert page.code == 200
    html = page.body.decode()
    assert html.count('name="resource"') == 2
    # As a browser posts the form: every hidden field, repeated ones each (helpers' Browser keeps one).
    fields = [(name, html_module.unescape(value))
              for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', html)]
    browser.clock.advance(pace.REVEAL_SECONDS)
    answered = await browser.fetch("/oauth/authorize", "POST", [*fields, ("decision", "allow")])
    assert answered.code == 302, answered.body
    code = query_of(answered.headers["Location"])["code"]
    from tokensvc.oauth import hashing

    stored = await ctx.store.get_code(hashing.digest(code))
    assert stored.audience == [NOTES, PHOTOS]


async def test_an_exchange_narrows_and_never_widens_and_a_refusal_spends_no_code(app, http_server, http_client,
                                                                                  base_url, ctx):
    code = await code_for(ctx, NOTES, PHOTOS)
    wider = await exchange_for(http_client, base_url, code, [NOTES, "https://other.example"])
    check_oauth_error(wider, 400, "invalid_target")
    narrowed = await exchange_for(http_client, base_url, code, [PHOTOS])
    assert narrowed.code == 200, narrowed.body
    body = json.loads(narrowed.body)
    assert (await introspection.introspect(ctx, body["access_token"]))["aud"] == [PHOTOS]
    # RFC 8707 §2.2: the refresh token keeps what the authorization granted; a refresh may name the other.
    assert (await introspection.introspect(ctx, body["refresh_token"]))["aud"] == [NOTES, PHOTOS]
    other = await grants.refresh(ctx, await ctx.store.get_client("webapp"), body["refresh_token"], resources=[NOTES])
    assert (await introspection.introspect(ctx, other.access_token))["aud"] == [NOTES]
    # A code whose request named none: an exchange may bind it to a declared API.
    bound = await exchange_for(http_client, base_url, await code_for(ctx), [NOTES])
    assert (await introspection.introspect(ctx, json.loads(bound.body)["access_token"]))["aud"] == [NOTES]


async def test_a_refresh_narrows_its_access_token_only_so_the_next_may_name_another(app, http_server, http_client,
                                                                                      base_url, ctx):
    """RFC 8707 §2.2: one refresh token serves several resources in turn. ``resource`` at a
    refresh binds the access token it issues, never the refresh token, which keeps what the
    authorization granted: the next refresh may name another of those, or none to get the
    whole set back; never one beyond it. Introspection tells each token's own audience."""
    issued = await tokens_for(ctx, NOTES, PHOTOS)

    async def refresh(refresh_token, *resources):
        return await http_client.fetch(
            base_url + "/oauth/token/refresh", method="POST", raise_error=False,
            headers={"Authorization": basic("webapp", WEBAPP_SECRET)},
            body=urlencode([("refresh_token", refresh_token), *(("resource", r) for r in resources)]))

    async def aud(token):
        return (await introspection.introspect(ctx, token)).get("aud")

    kept = json.loads((await refresh(issued.refresh_token)).body)
    assert await aud(kept["access_token"]) == await aud(kept["refresh_token"]) == [NOTES, PHOTOS]
    check_oauth_error(await refresh(kept["refresh_token"], "https://other.example"), 400, "invalid_target")
    for_notes = json.loads((await refresh(kept["refresh_token"], NOTES)).body)
    assert await aud(for_notes["access_token"]) == [NOTES]
    assert await aud(for_notes["refresh_token"]) == [NOTES, PHOTOS]
    assert await introspect_as(http_client, base_url, for_notes["access_token"], "photos-api", PHOTOS_SECRET) == {
        "active": False}
    for_photos = json.loads((await refresh(for_notes["refresh_token"], PHOTOS)).body)  # the other, in turn
    assert await aud(for_photos["access_token"]) == [PHOTOS]
    assert (await introspect_as(http_client, base_url, for_photos["access_token"], "photos-api",
                                PHOTOS_SECRET))["active"] is True
    assert await introspect_as(http_client, base_url, for_photos["access_token"], "notes-api", NOTES_SECRET) == {
        "active": False}
    # A refresh token is told to a resource server of any audience of its authorization.
    assert (await introspect_as(http_client, base_url, for_photos["refresh_token"], "notes-api",
                                NOTES_SECRET))["aud"] == [NOTES, PHOTOS]
    whole = json.loads((await refresh(for_photos["refresh_token"])).body)  # naming none: the whole set back
    assert await aud(whole["access_token"]) == [NOTES, PHOTOS]
    check_oauth_error(await refresh(whole["refresh_token"], NOTES, "https://other.example"), 400, "invalid_target")

    # A family that names none may bind each access token to a declared API, and then to none again.
    unbound = await tokens_for(ctx)
    bound = json.loads((await refresh(unbound.refresh_token, PHOTOS)).body)
    assert await aud(bound["access_token"]) == [PHOTOS] and await aud(bound["refresh_token"]) is None
    rebound = json.loads((await refresh(bound["refresh_token"], NOTES)).body)
    assert await aud(rebound["access_token"]) == [NOTES]
    free = json.loads((await refresh(rebound["refresh_token"])).body)
    assert await aud(free["access_token"]) is None


async def test_tokensvcs_own_api_takes_an_access_token_a_refresh_bound_to_it(app, http_server, http_client, base_url,
                                                                            ctx):
    """An authorization for an API and tokensvc's own: an access token narrowed to the API is
    refused at /v1, the next refresh's for /v1 taken there."""
    async def me(token):
        return (await http_client.fetch(base_url + "/v1/me", headers={"Authorization": f"Bearer {token}"},
                                        raise_error=False)).code

    webapp = await ctx.store.get_client("webapp")
    issued = await tokens_for(ctx, NOTES, OWN, narrowed_to=[NOTES])
    assert await me(issued.access_token) == 401
    own = await grants.refresh(ctx, webapp, issued.refresh_token, resources=[OWN])
    assert await me(own.access_token) == 200
    assert await me((await grants.refresh(ctx, webapp, own.refresh_token)).access_token) == 200


async def test_a_concurrent_presentation_gets_the_pair_only_for_the_resources_it_was_issued_for(app, ctx, clock):
    """A presentation of the refresh token just rotated out, within the window in which it gets
    the same pair again: that pair's access token is bound to what the rotation named, so
    naming another of the granted resources is ``invalid_target``; naming the same, or none (as
    a scope left out), is the same pair."""
    webapp = await ctx.store.get_client("webapp")
    issued = await tokens_for(ctx, NOTES, PHOTOS)
    first = await grants.refresh(ctx, webapp, issued.refresh_token, resources=[NOTES])
    with pytest.raises(InvalidTarget) as refused:
        await grants.refresh(ctx, webapp, issued.refresh_token, resources=[PHOTOS])
    assert "concurrent" in refused.value.description
    for resources in ([NOTES], None):
        same = await grants.refresh(ctx, webapp, issued.refresh_token, resources=resources)
        assert same.access_token == first.access_token and same.refresh_token == first.refresh_token


async def test_a_reused_refresh_token_revokes_its_family_whatever_resource_it_names(app, ctx, clock):
    """Reuse is told before the request's ``resource`` is judged: a refresh token rotated out
    twice, presented with a resource its authorization never granted, is ``invalid_grant`` and
    ends its family, as it does with none (RFC 9700 §4.14.2)."""
    from tokensvc.oauth.errors import InvalidGrant

    webapp = await ctx.store.get_client("webapp")
    for asked in (["https://other.example"], [PHOTOS], [NOTES]):
        issued = await tokens_for(ctx, NOTES)
        first = await grants.refresh(ctx, webapp, issued.refresh_token)
        second = await grants.refresh(ctx, webapp, first.refresh_token)
        with pytest.raises(InvalidGrant) as refused:
            await grants.refresh(ctx, webapp, issued.refresh_token, resources=asked)
        assert refused.value.description == "The refresh token was already used", asked
        with pytest.raises(InvalidGrant) as ended:
            await grants.refresh(ctx, webapp, second.refresh_token)
        assert ended.value.description == "The refresh token is revoked", asked
    # The token rotated out last, presented again after the concurrent window and the grace.
    issued = await tokens_for(ctx, NOTES)
    first = await grants.refresh(ctx, webapp, issued.refresh_token)
    clock.advance(ctx.tokens.refresh_grace_seconds + 60)
    with pytest.raises(InvalidGrant) as refused:
        await grants.refresh(ctx, webapp, issued.refresh_token, resources=["https://other.example"])
    assert refused.value.description == "The refresh token was already used"
    with pytest.raises(InvalidGrant):
        await grants.refresh(ctx, webapp, first.refresh_token)


async def test_a_concurrent_presentation_naming_the_same_resources_in_another_order_gets_the_pair(app, ctx, clock):
    """Resources name a set: ``[N, P]`` and ``[P, N]`` are one target."""
    webapp = await ctx.store.get_client("webapp")
    issued = await tokens_for(ctx, NOTES, PHOTOS)
    first = await grants.refresh(ctx, webapp, issued.refresh_token, resources=[NOTES, PHOTOS])
    same = await grants.refresh(ctx, webapp, issued.refresh_token, resources=[PHOTOS, NOTES])
    assert same.access_token == first.access_token and same.refresh_token == first.refresh_token


# -- the verifier --------------------------------------------------------------------------------


async def test_the_verifier_refuses_a_token_meant_for_another_api_and_may_require_one(app, http_server, base_url,
                                                                                      ctx):
    for_notes, for_photos, unbound = [(await tokens_for(ctx, *resources)).access_token
                                      for resources in ((NOTES,), (PHOTOS,), ())]
    # notes-api's verifier: tokensvc answers it inactive for another API's token, and its own
    # audience refuses one whatever introspection said.
    notes = await started(Verifier(Settings(base_url, "notes-api", NOTES_SECRET, audience=NOTES)))
    # A first-party client's verifier, which tokensvc tells every token: its audience decides.
    webapp = await started(Verifier(Settings(base_url, "webapp", WEBAPP_SECRET, audience=NOTES)))
    strict = await started(Verifier(Settings(base_url, "notes-api", NOTES_SECRET, audience=NOTES,
                                             require_audience=True)))
    try:
        for verifier in (notes, webapp, strict):
            assert (await verifier.check(for_notes, "read")).subject is not None
            with pytest.raises(InvalidToken) as refused:
                await verifier.check(for_photos)
            assert refused.value.status == 401
            assert 'error="invalid_token"' in refused.value.challenge("api")
        assert (await notes.check(unbound, "read")).subject is not None
        assert (await webapp.check(unbound, "read")).subject is not None
        with pytest.raises(InvalidToken):
            await strict.check(unbound)
    finally:
        for verifier in (notes, webapp, strict):
            await verifier.close()


# -- the store's format --------------------------------------------------------------------------


@pytest.fixture
def mongo(io_loop, config):
    store, cleanup = open_store("mongodb", io_loop)
    io_loop.run_sync(lambda: seed(store, config))
    yield store
    cleanup()


@pytest.mark.mongodb
async def test_on_mongodb_tokens_are_bound_only_once_the_store_is_at_format_3(mongo, config, clock):
    store = mongo
    if True:
        ctx = make_context(config, store, clock=clock)
        store.connection.format = StoreFormat(3, 2)  # expanded by this release, 0.10.0 still allowed
        with pytest.raises(RedirectError) as refused:
            await authorization.validate(ctx, request_args(NOTES))
        assert refused.value.error.error == "invalid_target"
        assert "tokensvc storage finalize" in refused.value.error.description
        issued = await tokens_for(ctx)  # naming none: as before
        with pytest.raises(InvalidTarget):
            await grants.refresh(ctx, await store.get_client("webapp"), issued.refresh_token, resources=[NOTES])
        store.connection.format = StoreFormat(3, 3)  # finalized
        bound = await tokens_for(ctx, NOTES)
        assert (await introspection.introspect(ctx, bound.access_token))["aud"] == [NOTES]
        rotated = await grants.refresh(ctx, await store.get_client("webapp"), bound.refresh_token)
        assert (await introspection.introspect(ctx, rotated.access_token))["aud"] == [NOTES]


def test_the_own_api_is_base_url_and_v1(ctx):
    assert audience.own(ctx) == OWN


# -- the feed by audience ------------------------------------------------------------------------


def test_a_resource_server_reads_the_revocations_of_its_tokens_and_of_those_naming_none():
    """Each view is numbered on its own, so a reader never sees a gap; a revocation whose
    audience is unknown (a mark of an older release) and a flush reach every reader; a reader
    that is no resource server reads every revocation."""
    from tokensvc.oauth.events import RevocationEvents
    from tokensvc.oauth.feed import RevocationFeed, family_label
    from tokensvc.storage.base import FAMILY, GRANT, Revocation

    events = RevocationEvents()
    feed = RevocationFeed(events)
    everything, notes, photos, both = [], [], [], []
    feed.open(everything.append)
    notes_ready = feed.open(notes.append, serves=[NOTES]).ready
    feed.open(photos.append, serves=[PHOTOS])
    feed.open(both.append, serves=[PHOTOS, NOTES])
    events.publish(Revocation(FAMILY, "f-notes", (NOTES,)))
    events.publish(Revocation(FAMILY, "f-photos", (PHOTOS, OWN)))
    events.publish(Revocation(FAMILY, "f-any"))  # names no audience: every API's
    events.publish(Revocation(GRANT, "g1"))  # its audience unknown: every reader
    events.publish(Revocation(FAMILY, "f-own", (OWN,)))
    events.publish_all()
    label = family_label
    assert [m.get("family_id") or m.get("grant_id") or m["type"] for m in everything] == [
        label("f-notes"), label("f-photos"), label("f-any"), "g1", label("f-own"), "flush"]
    assert notes == [{"type": "revoked", "family_id": label("f-notes"), "seq": 1},
                     {"type": "revoked", "family_id": label("f-any"), "seq": 2},
                     {"type": "revoked", "grant_id": "g1", "seq": 3}, {"type": "flush", "seq": 4}]
    assert [m.get("family_id") or m.get("grant_id") or m["type"] for m in photos] == [
        label("f-photos"), label("f-any"), "g1", "flush"]
    assert [m["seq"] for m in both] == [1, 2, 3, 4, 5]
    # A reader of the same resources resumes in their view; another view's stream flushes.
    assert [m["seq"] for m in feed.open([].append, notes_ready["stream"], 2, serves=[NOTES]).missed] == [3, 4]
    assert feed.open([].append, notes_ready["stream"], 2, serves=[PHOTOS]).ready["resumed"] is False
    assert feed.open([].append, notes_ready["stream"], 2).ready["resumed"] is False
    assert notes_ready["stream"] != feed.stream


async def test_a_resource_servers_feed_reader_hears_no_revocation_of_another_apis_tokens(
        app, http_server, http_client, base_url, ctx):
    from test_feed import connect, next_message

    notes = await connect(base_url, client_id="notes-api", secret=NOTES_SECRET)
    webapp = await connect(base_url)
    for reader in (notes, webapp):
        assert (await next_message(reader))["seq"] == 0
    for_photos, for_notes = (await tokens_for(ctx, PHOTOS)), (await tokens_for(ctx, NOTES))
    for issued in (for_photos, for_notes):
        revoked = await post_form(http_client, base_url + "/oauth/token/revoke", {"token": issued.refresh_token},
                                  {"Authorization": basic("webapp", WEBAPP_SECRET)})
        assert revoked.code == 200
    labels = [(await introspection.introspect(ctx, issued.access_token)) for issued in (for_photos, for_notes)]
    assert labels == [{"active": False}, {"active": False}]
    heard_by_webapp = [await next_message(webapp), await next_message(webapp)]
    assert [message["seq"] for message in heard_by_webapp] == [1, 2]
    # notes-api's first message is the notes token's revocation, numbered 1: no gap, nothing of photos.
    first = await next_message(notes)
    assert first == {"type": "revoked", "seq": 1, "family_id": heard_by_webapp[1]["family_id"]}
    notes.close()
    webapp.close()


async def test_a_familys_revocation_reaches_readers_of_every_audience_its_refresh_token_has(
        app, http_server, http_client, base_url, ctx):
    """Its access token narrowed to one API (RFC 8707 §2.2), a family still holds a refresh
    token for each it was granted: its revocation is told to each API's readers."""
    from test_feed import connect, next_message

    notes = await connect(base_url, client_id="notes-api", secret=NOTES_SECRET)
    assert (await next_message(notes))["seq"] == 0
    narrowed = await tokens_for(ctx, NOTES, PHOTOS, narrowed_to=[PHOTOS])
    label = (await introspection.introspect(ctx, narrowed.refresh_token))["family_id"]
    for_notes = await tokens_for(ctx, NOTES)
    for issued in (narrowed, for_notes):
        revoked = await post_form(http_client, base_url + "/oauth/token/revoke", {"token": issued.refresh_token},
                                  {"Authorization": basic("webapp", WEBAPP_SECRET)})
        assert revoked.code == 200
    assert await next_message(notes) == {"type": "revoked", "seq": 1, "family_id": label}
    notes.close()


async def test_a_reader_whose_resources_change_reconnects(app, http_server, base_url, ctx, config):
    """Its view is what it served when it connected: a change of its resources (a change of what
    its feed readers read, marked and announced as a change of their credentials is) closes it
    with 1012, and it reconnects to read what it serves now."""
    from test_feed import connect, next_message

    from tokensvc.oauth.feed import CLOSE_RESTART

    await ctx.store.set_owners("client", {})  # the operator's to change, as the admin API changes it
    notes = await connect(base_url, client_id="notes-api", secret=NOTES_SECRET)
    await next_message(notes)
    await Operator(ctx, handed_over(config)).patch_client("notes-api", {"resources": [NOTES, "https://a.example"]})
    assert await notes.read_message() is None and notes.close_code == CLOSE_RESTART
    again = await connect(base_url, client_id="notes-api", secret=NOTES_SECRET)
    assert (await next_message(again))["resumed"] is False
    again.close()


def test_a_resource_servers_stream_is_its_own_and_a_view_without_readers_is_dropped():
    """A URI given to another resource server: the new one reads a stream of its own, never the
    one the URI's former resource server read (resuming it would replay what was told to that
    one). A view whose last reader left is kept for a reader that resumes, then dropped."""
    from tokensvc.oauth.events import RevocationEvents
    from tokensvc.oauth.feed import RevocationFeed
    from tokensvc.storage.base import GRANT, Revocation

    events, now = RevocationEvents(), [0.0]
    feed = RevocationFeed(events, clock=lambda: now[0], idle_seconds=60)
    ra: list[dict] = []
    ra_ready = feed.open(ra.append, serves=[NOTES], owner="notes-api").ready
    events.publish(Revocation(GRANT, "g-ra", (NOTES,)))
    feed.close(ra.append)
    rb: list[dict] = []
    taken_over = feed.open(rb.append, ra_ready["stream"], 0, serves=[NOTES], owner="other-api")
    assert taken_over.ready["resumed"] is False and taken_over.missed == []
    assert taken_over.ready["stream"] != ra_ready["stream"] and taken_over.ready["seq"] == 0
    events.publish(Revocation(GRANT, "g-rb", (NOTES,)))
    assert [message["grant_id"] for message in rb] == ["g-rb"]
    feed.close(rb.append)
    back = feed.open(ra.append, ra_ready["stream"], 1, serves=[NOTES], owner="notes-api")
    assert back.ready["resumed"] is True and [message["grant_id"] for message in back.missed] == ["g-rb"]
    feed.close(ra.append)
    assert feed.views == 2  # kept for readers that resume
    now[0] = 59.0
    feed.close([].append)  # (any opening or closing drops what outlived the bound)
    assert feed.views == 2
    now[0] = 60.0
    feed.close([].append)
    assert feed.views == 0
    again = feed.open(ra.append, ra_ready["stream"], 2, serves=[NOTES], owner="notes-api")
    assert again.ready["resumed"] is False and again.ready["stream"] != ra_ready["stream"]


async def test_a_resource_server_given_another_ones_uri_never_resumes_its_stream(app, http_server, base_url, ctx,
                                                                               config):
    """notes-api hears a grant's revocation, then leaves; its URI is given to photos-api (serving
    it alone, as notes-api did). photos-api connecting with notes-api's stream and ``after=0`` is
    not resumed (it flushes), and hears none of what notes-api was told: its first message is the
    revocation of a grant that follows."""
    from test_feed import connect, next_message

    await ctx.store.set_owners("client", {})  # the operator's to change, as the admin API changes it
    notes = await connect(base_url, client_id="notes-api", secret=NOTES_SECRET)
    stream = (await next_message(notes))["stream"]
    told = await grant_of(ctx, await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT, NOTES))
    await revocation.revoke_grant(ctx, told, "test")
    assert (await next_message(notes))["grant_id"] == told
    notes.close()
    operator = Operator(ctx, handed_over(config))
    await operator.patch_client("notes-api", {"resources": ["https://a.example"]})
    await operator.patch_client("photos-api", {"resources": [NOTES]})  # the very resources notes-api served
    photos = await connect(base_url, f"?stream={stream}&after=0", client_id="photos-api", secret=PHOTOS_SECRET)
    ready = await next_message(photos)
    assert ready["resumed"] is False and ready["stream"] != stream, ready
    later = await grant_of(ctx, await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, NOTES))
    await revocation.revoke_grant(ctx, later, "test")
    first = await next_message(photos)
    assert first.get("grant_id") == later, f"photos-api was told what notes-api heard: {first}"
    photos.close()


# -- a grant, a client or a user revoked: heard by the readers of its tokens' audiences ------------


async def issued_as(ctx, username: str, client_id: str, redirect_uri: str, *resources: str):
    """Tokens of ``username`` for ``client_id``, meant for ``resources`` (none: every API)."""
    request = await authorization.validate(ctx, request_args(*resources, client_id=client_id,
                                                             redirect_uri=redirect_uri))
    subject, _ = await authorization.resolve_subject(ctx, request, await ctx.store.get_user_by_username(username))
    shown = (confirmation.new() if authorization.needs_confirmation(request.client, request.redirect_uri,
                                                                    request.scopes) else None)
    code = query_of(await authorization.issue_code(ctx, request, subject, shown))["code"]
    return await grants.exchange_code(ctx, await ctx.store.get_client(client_id), code, redirect_uri, VERIFIER,
                                      shown)


async def grant_of(ctx, issued) -> str:
    return (await introspection.introspect(ctx, issued.access_token))["grant_id"]


async def feed_readers(base_url):
    """A reader of notes-api (a resource server serving NOTES) and one of the first-party web
    app, each past its ``ready``."""
    from test_feed import connect, next_message

    notes = await connect(base_url, client_id="notes-api", secret=NOTES_SECRET)
    webapp = await connect(base_url)
    for reader in (notes, webapp):
        assert (await next_message(reader))["type"] == "ready"
    return notes, webapp


async def heard(reader, count: int) -> list[dict]:
    from test_feed import next_message

    return [{name: value for name, value in (await next_message(reader)).items() if name != "seq"}
            for _ in range(count)]


async def test_a_resource_server_hears_a_grants_revocation_only_when_its_tokens_may_be_meant_for_it(
        app, http_server, base_url, ctx):
    """A grant's revocation carries the audiences of its families together: a resource server
    hears it when one of them is meant for it, or names none; the first-party reader hears every
    one. notes-api's first message is the second revocation: nothing of the photos grant came
    before it."""
    from tokensvc.oauth import revocation

    notes, webapp = await feed_readers(base_url)
    for_photos = await grant_of(ctx, await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT, PHOTOS))
    await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT, PHOTOS, OWN)  # a second family, still not notes'
    for_both = await grant_of(ctx, await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, PHOTOS))
    await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, NOTES)  # one family of it is meant for notes
    for_every_api = await grant_of(ctx, await issued_as(ctx, "alice", "skyplanner", SKY_REDIRECT))
    for grant_id in (for_photos, for_both, for_every_api):
        await revocation.revoke_grant(ctx, grant_id, "test")
    assert await heard(notes, 2) == [{"type": "revoked", "grant_id": for_both},
                                     {"type": "revoked", "grant_id": for_every_api}]
    assert await heard(webapp, 3) == [{"type": "revoked", "grant_id": grant_id}
                                      for grant_id in (for_photos, for_both, for_every_api)]
    notes.close()
    webapp.close()


async def test_a_resource_server_hears_a_users_change_only_when_their_tokens_may_be_meant_for_it(
        app, http_server, base_url, ctx):
    """A new password, a demotion, a removal: each carries the audiences of the user's families
    together. alice's tokens are meant for photos alone, root's for notes, and the node agent's
    user's for every API."""
    from tokensvc.admin import actions as admin

    notes, webapp = await feed_readers(base_url)
    alice = await ctx.store.get_user_by_username("alice")
    root = await ctx.store.get_user_by_username("root")
    await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT, PHOTOS)
    await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, NOTES)
    await admin.set_password(ctx, "alice", "granite-willow-comet-lantern", keep_grants=True)
    await admin.set_admin(ctx, "root", False)
    assert await heard(notes, 1) == [{"type": "revoked", "sub": root.user_id}]
    assert await heard(webapp, 2) == [{"type": "revoked", "sub": alice.user_id},
                                      {"type": "revoked", "sub": root.user_id}]
    await issued_as(ctx, "alice", "skyplanner", SKY_REDIRECT)  # names no audience: every API's
    await admin.set_password(ctx, "alice", "cobalt-meadow-harbor-quartz", keep_grants=True)
    assert await heard(notes, 1) == [{"type": "revoked", "sub": alice.user_id}]
    notes.close()
    webapp.close()


async def test_a_resource_server_hears_a_clients_narrowing_or_removal_only_when_its_tokens_may_be_meant_for_it(
        app, http_server, base_url, ctx):
    """A client narrowed or removed carries the audiences of its families together: skyplanner's
    tokens are meant for photos alone, partner's for notes, node-agent's name none."""
    from tokensvc.admin import actions as admin

    await ctx.store.set_owners("client", {})  # the operator's to change
    notes, webapp = await feed_readers(base_url)
    sky_grant = await grant_of(ctx, await issued_as(ctx, "alice", "skyplanner", SKY_REDIRECT, PHOTOS))
    await issued_as(ctx, "alice", "partner", PARTNER_REDIRECT, NOTES)
    await issued_as(ctx, "alice", "node-agent", NODE_REDIRECT)
    await admin.update_client(ctx, "skyplanner", {"scopes": ["observations:write"]})
    await admin.update_client(ctx, "partner", {"scopes": ["write"]})
    assert await heard(notes, 1) == [{"type": "revoked", "client_id": "partner"}]
    await admin.remove_client(ctx, "skyplanner")
    await admin.update_client(ctx, "node-agent", {"scopes": ["write"]})
    assert await heard(notes, 1) == [{"type": "revoked", "client_id": "node-agent"}]
    assert [message.get("client_id") or message.get("grant_id") for message in await heard(webapp, 5)] == [
        "skyplanner", "partner", "skyplanner", sky_grant, "node-agent"]
    notes.close()
    webapp.close()


async def test_a_code_presented_twice_is_told_only_to_the_readers_of_its_audience(app, http_server, base_url, ctx):
    """The code's second presentation revokes the family its first started: a family meant for
    photos alone, so notes-api hears nothing of it. Its first message is the revocation of a
    notes token that follows."""
    from tokensvc.oauth.errors import InvalidGrant

    notes, webapp = await feed_readers(base_url)
    webapp_client = await ctx.store.get_client("webapp")
    code = await code_for(ctx, PHOTOS)
    await grants.exchange_code(ctx, webapp_client, code, WEBAPP_REDIRECT, VERIFIER)
    with pytest.raises(InvalidGrant):
        await grants.exchange_code(ctx, webapp_client, code, WEBAPP_REDIRECT, VERIFIER)
    for_notes = await tokens_for(ctx, NOTES)
    await grants_revoked(ctx, for_notes)
    first = (await heard(notes, 1))[0]
    assert "grant_id" in first, f"notes-api heard a revocation of a family meant for photos alone: {first}"
    notes.close()
    webapp.close()


async def test_a_users_new_password_is_not_told_to_an_api_for_a_revoked_family_naming_none(
        app, http_server, http_client, base_url, ctx):
    """alice's only tokens in force are meant for photos: a family of hers that named no
    audience was revoked before. Her new password touches photos' tokens alone, so notes-api
    hears neither her id nor her grant's. Its first message is root's demotion, whose tokens
    are meant for notes."""
    from tokensvc.admin import actions as admin

    notes, webapp = await feed_readers(base_url)
    old = await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT)  # names none: every API's
    revoked = await post_form(http_client, base_url + "/oauth/token/revoke", {"token": old.refresh_token},
                              {"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert revoked.code == 200
    webapp_heard = await heard(webapp, 1)
    assert await heard(notes, 1) == webapp_heard  # a family meant for every API: heard, rightly
    await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT, PHOTOS)
    await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, NOTES)
    alice = await ctx.store.get_user_by_username("alice")
    root = await ctx.store.get_user_by_username("root")
    await admin.set_password(ctx, "alice", "granite-willow-comet-lantern", keep_grants=True)
    await admin.set_admin(ctx, "root", False)
    first = (await heard(notes, 1))[0]
    assert first == {"type": "revoked", "sub": root.user_id}, (
        f"notes-api heard {first}: alice ({alice.user_id}) holds no token in force that may be meant for it")
    notes.close()
    webapp.close()


async def grants_revoked(ctx, issued) -> None:
    from tokensvc.oauth import introspection, revocation

    grant_id = (await introspection.introspect(ctx, issued.access_token))["grant_id"]
    _grants[issued.access_token] = grant_id
    await revocation.revoke_grant(ctx, grant_id, "test")


async def test_a_clients_removal_tells_each_grant_only_to_the_readers_of_that_grants_audience(
        app, http_server, base_url, ctx):
    """skyplanner's grant of alice holds tokens meant for photos alone, its grant of root tokens
    meant for notes. Its removal revokes both: notes-api hears the client and root's grant,
    never alice's grant, before the revocation of a notes grant that follows."""
    from tokensvc.admin import actions as admin

    await ctx.store.set_owners("client", {})  # the operator's to change
    notes, webapp = await feed_readers(base_url)
    photos_grant = await grant_of_issued(ctx, await issued_as(ctx, "alice", "skyplanner", SKY_REDIRECT, PHOTOS))
    notes_grant = await grant_of_issued(ctx, await issued_as(ctx, "root", "skyplanner", SKY_REDIRECT, NOTES))
    delimiter = await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, NOTES)
    await admin.remove_client(ctx, "skyplanner")
    await grants_revoked(ctx, delimiter)
    last = await grant_of_issued(ctx, delimiter, active=False)
    messages = []
    while not messages or messages[-1].get("grant_id") != last:
        messages.append((await heard(notes, 1))[0])
    assert notes_grant in {message.get("grant_id") for message in messages}
    assert photos_grant not in {message.get("grant_id") for message in messages}, (
        f"notes-api heard the grant whose tokens are meant for photos alone: {messages}")
    notes.close()
    webapp.close()


_grants: dict[str, str] = {}


async def grant_of_issued(ctx, issued, active: bool = True) -> str:
    from tokensvc.oauth import introspection

    if active:
        _grants[issued.access_token] = (await introspection.introspect(ctx, issued.access_token))["grant_id"]
    return _grants[issued.access_token]
