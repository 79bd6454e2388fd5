"""GET /oauth/revocations: the revocation feed names, numbered, what a cache of introspection
answers must drop for each revocation (never a token or its hash), resumes a reader that
reconnects or tells it to flush, refuses before the upgrade whoever may not introspect, and
hears what other processes revoke through the relay."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from helpers import (
    DEADLINE,
    PARTNER_SECRET,
    WEBAPP_SECRET,
    basic,
    check_schema,
    eventually,
    family_of,
    hashes_of,
    json_of,
    make_config,
    post_form,
)
from test_ws import HANDSHAKE, tokens
from tornado import gen
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from tokensvc import schemas
from tokensvc.oauth.events import RevocationEvents
from tokensvc.oauth.feed import CLOSE_CREDENTIALS, RevocationFeed, family_label
from tokensvc.storage.base import CLIENT, FAMILY, GRANT, SESSION, SUBJECT, USER, Revocation


def feed_url(base_url, query=""):
    return base_url.replace("http://", "ws://") + "/oauth/revocations" + query


async def connect(base_url, query="", client_id="webapp", secret=WEBAPP_SECRET):
    return await websocket_connect(HTTPRequest(feed_url(base_url, query),
                                               headers={"Authorization": basic(client_id, secret)}))


async def next_message(connection, seconds=DEADLINE):
    """The next message, checked against its documented schema."""
    raw = await gen.with_timeout(timedelta(seconds=seconds), connection.read_message())
    assert raw is not None, "the feed closed"
    message = json.loads(raw)
    return check_schema(schemas.FEED_MESSAGES[message["type"]], message)


async def closed_for_its_credentials(connection):
    """Until the feed closes the reader: with the close code of a reader whose credentials no
    longer hold. The messages it was sent before, in order."""
    messages = []
    while (raw := await gen.with_timeout(timedelta(seconds=DEADLINE), connection.read_message())) is not None:
        messages.append(json.loads(raw))
    assert connection.close_code == CLOSE_CREDENTIALS
    return messages


async def notes_api(ctx):
    """A resource server registered now, and its secret."""
    from tokensvc.admin import actions as admin
    from tokensvc.records import RESOURCE_SERVER

    _, secret = await admin.create_client(ctx.store, admin.ClientSpec("Notes", confidential=True,
                                                                      kind=RESOURCE_SERVER), "notes-api")
    return secret


async def introspected(http_client, base_url, token):
    response = await post_form(http_client, base_url + "/oauth/token/introspect", {"token": token},
                               {"Authorization": basic("webapp", WEBAPP_SECRET)})
    return check_schema(schemas.introspection_response, json_of(response))


@pytest.mark.gen_test(timeout=90)
async def test_each_revocation_names_what_introspection_keyed_the_answer_on(browser, http_client, base_url, ctx):
    first = await tokens(browser, http_client, base_url)
    second = await tokens(browser, http_client, base_url)
    answer = await introspected(http_client, base_url, first["access_token"])
    record = await family_of(ctx.store, first["access_token"])
    assert answer["family_id"] == family_label(record.family_id)
    assert answer["grant_id"] == record.grant_id and answer["client_id"] == "webapp"
    connection = await connect(base_url)
    ready = await next_message(connection)
    assert ready["type"] == "ready" and ready["resumed"] is False and ready["seq"] == 0

    # RFC 7009 revocation of an access token: its family is named.
    response = await post_form(http_client, base_url + "/oauth/token/revoke", {"token": first["access_token"]},
                               {"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert response.code == 200
    assert await next_message(connection) == {"type": "revoked", "seq": 1, "family_id": answer["family_id"]}
    # A web session ending is no bearer token's business: not announced; the grant revocation
    # that follows is the next message.
    signed_out = await browser.fetch("/oauth/sign-out", "POST", {}, {"X-XSRFToken": await browser.xsrf()})
    assert signed_out.code == 200
    second_answer = await introspected(http_client, base_url, second["access_token"])
    response = await http_client.fetch(base_url + "/oauth/revoke", method="POST", body="",
                                       headers={"Authorization": "Bearer " + second["access_token"]})
    assert response.code == 200
    assert await next_message(connection) == {"type": "revoked", "seq": 2, "grant_id": second_answer["grant_id"]}
    # A client's scopes narrowed: its client_id.
    ctx.events.publish(Revocation(CLIENT, "webapp"))
    assert await next_message(connection) == {"type": "revoked", "seq": 3, "client_id": "webapp"}
    # No message holds a token, nor any hash a token or its family is stored under.
    secrets = {value for issued in (first, second) for value in issued.values() if isinstance(value, str)}
    forbidden = secrets | hashes_of(secrets) | {record.family_id}
    for message in ctx.feed._recent:
        assert not forbidden & {str(value) for value in message.values()}
    connection.close()


@pytest.mark.gen_test(timeout=90)
async def test_a_reader_that_reconnects_gets_what_it_missed(http_server, base_url, ctx):
    connection = await connect(base_url)
    ready = await next_message(connection)
    ctx.events.publish(Revocation(GRANT, "g1"))
    seen = await next_message(connection)
    connection.close()
    ctx.events.publish(Revocation(GRANT, "g2"))
    ctx.events.publish(Revocation(GRANT, "g3"))
    again = await connect(base_url, f"?stream={ready['stream']}&after={seen['seq']}")
    assert await next_message(again) == {"type": "ready", "stream": ready["stream"], "seq": 3, "resumed": True}
    assert [await next_message(again) for _ in range(2)] == [
        {"type": "revoked", "seq": 2, "grant_id": "g2"}, {"type": "revoked", "seq": 3, "grant_id": "g3"}]
    ctx.events.publish(Revocation(GRANT, "g4"))  # and then what comes
    assert (await next_message(again))["seq"] == 4
    again.close()
    # Another stream (another process, a restart): flush.
    other = await connect(base_url, f"?stream={'x' * 16}&after=3")
    assert (await next_message(other))["resumed"] is False
    other.close()


def test_resumption_only_while_the_buffer_holds_every_message_since():
    events = RevocationEvents()
    feed = RevocationFeed(events, replay=2)
    received = []
    assert feed.open(received.append).ready["resumed"] is False  # a first connection flushes
    for grant_id in ("g1", "g2", "g3"):
        events.publish(Revocation(GRANT, grant_id))
    assert [message["seq"] for message in received] == [1, 2, 3]
    assert [message["seq"] for message in feed.open(received.append, feed.stream, 1).missed] == [2, 3]
    assert feed.open(received.append, feed.stream, 2).missed == [{"type": "revoked", "grant_id": "g3", "seq": 3}]
    assert feed.open(received.append, feed.stream, 3).ready["resumed"] is True
    assert feed.open(received.append, feed.stream, 0).ready["resumed"] is False  # seq 1 is gone
    assert feed.open(received.append, feed.stream, 4).ready["resumed"] is False  # never sent
    assert feed.open(received.append, None, 3).ready["resumed"] is False


def test_a_narrowed_user_is_named_an_interrupted_relay_is_a_flush_and_sessions_are_not_announced():
    events = RevocationEvents()
    feed = RevocationFeed(events)
    received = []
    feed.open(received.append)
    events.publish(Revocation(SESSION, "a-session-hash"))
    events.publish(Revocation(USER, "u1"))  # every web session of the user ended
    events.publish(Revocation(FAMILY, "f1"))
    events.publish(Revocation(SUBJECT, "u1"))  # some of what the user's tokens may do withdrawn
    events.publish_all()
    assert received == [{"type": "revoked", "family_id": family_label("f1"), "seq": 1},
                        {"type": "revoked", "sub": "u1", "seq": 2}, {"type": "flush", "seq": 3}]


def test_a_reader_that_fails_keeps_the_message_from_no_other():
    events = RevocationEvents()
    feed = RevocationFeed(events)
    received = []

    def broken(message):
        raise RuntimeError("gone")

    feed.open(broken)
    feed.open(received.append)
    events.publish(Revocation(GRANT, "g1"))
    assert received == [{"type": "revoked", "grant_id": "g1", "seq": 1}]


async def refusal(base_url, headers, query=""):
    with pytest.raises(HTTPClientError) as info:
        await websocket_connect(HTTPRequest(feed_url(base_url, query), headers=headers))
    assert info.value.response.headers["Content-Type"] == "application/json"
    return info.value.code, json_of(info.value.response), info.value.response.headers


@pytest.mark.gen_test(timeout=90)
async def test_only_a_client_that_may_introspect_reads_the_feed(http_server, base_url, ctx):
    code, body, headers = await refusal(base_url, {})
    assert (code, body["error"]) == (401, "invalid_client") and headers["WWW-Authenticate"].startswith("Basic")
    code, body, _ = await refusal(base_url, {"Authorization": basic("webapp", "wrong")})
    assert (code, body["error"]) == (401, "invalid_client")
    code, body, _ = await refusal(base_url, {"Authorization": basic("node-agent", "")})  # public
    assert (code, body["error"]) == (401, "invalid_client")
    code, body, _ = await refusal(base_url, {"Authorization": basic("partner", PARTNER_SECRET)})  # third-party
    assert (code, body["error"]) == (403, "access_denied")
    code, body, _ = await refusal(base_url, {"Authorization": basic("webapp", WEBAPP_SECRET)}, "?after=x")
    assert code == 422 and body["detail"][0]["loc"] == ["query", "after"]
    code, body, _ = await refusal(base_url, {"Authorization": basic("webapp", WEBAPP_SECRET),
                                             "Origin": "https://evil.example"})
    assert code == 403 and "other origins" in body["detail"]
    for site in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):  # no Origin
        code, body, _ = await refusal(base_url, {"Authorization": basic("webapp", WEBAPP_SECRET), **site})
        assert code == 403 and "other origins" in body["detail"]
    assert ctx.feed.readers == 0


@pytest.mark.gen_test(timeout=90)
async def test_a_request_that_is_no_websocket_handshake_is_answered_400(http_client, base_url):
    response = await http_client.fetch(base_url + "/oauth/revocations", raise_error=False,
                                       headers={"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert response.code == 400 and json_of(response)["detail"][0]["loc"] == ["header", "Upgrade"]
    response = await http_client.fetch(base_url + "/oauth/revocations", raise_error=False, headers={
        **HANDSHAKE, "Sec-WebSocket-Version": "8", "Authorization": basic("webapp", WEBAPP_SECRET)})
    assert response.code == 426 and response.headers["Sec-WebSocket-Version"] == "13"


@pytest.mark.gen_test(timeout=90)
async def test_a_reader_that_goes_away_is_dropped(http_server, base_url, ctx):
    connection = await connect(base_url)
    await next_message(connection)
    assert ctx.feed.readers == 1
    connection.close()
    await eventually(lambda: ctx.feed.readers == 0, DEADLINE, what="the reader dropped")


@pytest.mark.gen_test(timeout=90)
async def test_a_reader_is_closed_when_its_client_is_removed_or_rotated_or_may_no_longer_read(http_server, base_url,
                                                                                              ctx, monkeypatch):
    """The feed checks its reader again whenever what its client's readers proved changes: a
    rotated secret, a removal, a first-party client made third-party each close it (4403); a
    change that withdraws nothing, a rotation that keeps its secret in force, or another
    client's change, leaves it open. A reconnection with credentials that prove nothing any more
    is refused. None of those changes but the removal is named on the feed: a new secret or a
    first-party flag withdraws nothing from the client's tokens, so no reader (a resource
    server) is told to drop its answers for them; a narrowing of the client's scopes is named."""
    from tokensvc.admin import actions as admin
    from tokensvc.handlers import feed
    from tokensvc.oauth import introspection

    checks, check = [], introspection.still_a_reader

    async def still_a_reader(ctx, request):
        checks.append(await check(ctx, request))
        return checks[-1]

    monkeypatch.setattr(feed.introspection, "still_a_reader", still_a_reader)
    secret = await notes_api(ctx)
    webapp = await connect(base_url)
    assert (await next_message(webapp))["type"] == "ready"
    reader = await connect(base_url, client_id="notes-api", secret=secret)
    assert (await next_message(reader))["type"] == "ready"
    await admin.update_client(ctx, "notes-api", {"description": "Nothing withdrawn"})
    await admin.rotate_secret(ctx, "notes-api", keep_previous_seconds=60)  # the old secret still works
    await eventually(lambda: checks, DEADLINE, what="the reader checked again at the rotation")
    assert all(checks)  # and kept
    new_secret, _ = await admin.rotate_secret(ctx, "notes-api")
    assert await closed_for_its_credentials(reader) == []  # closed, and told of no revocation
    assert checks[-1] is None
    assert (await refusal(base_url, {"Authorization": basic("notes-api", secret)}))[0] == 401
    reader = await connect(base_url, client_id="notes-api", secret=new_secret)
    await next_message(reader)
    await admin.remove_client(ctx, "notes-api")
    await closed_for_its_credentials(reader)
    assert (await refusal(base_url, {"Authorization": basic("notes-api", new_secret)}))[0] == 401
    # Another client's reader stays, and hears of the removal first: of neither rotation.
    assert await next_message(webapp) == {"type": "revoked", "seq": 1, "client_id": "notes-api"}
    await admin.update_client(ctx, "webapp", {"scopes": ["read", "write"]})  # a narrowing: named, and it reads on
    while (message := await next_message(webapp))["client_id"] == "notes-api":  # the removal, told twice
        pass
    assert message == {"type": "revoked", "seq": message["seq"], "client_id": "webapp"}
    await admin.update_client(ctx, "webapp", {"first_party": False})
    assert await closed_for_its_credentials(webapp) == []
    await eventually(lambda: ctx.feed.readers == 0, DEADLINE, what="the readers dropped")


@pytest.mark.gen_test(timeout=60)
async def test_a_reader_sending_more_than_a_body_is_closed_as_too_big(http_server, base_url, ctx):
    """What a reader sends is ignored, and capped as every message the service takes: past
    64 KiB the reader is closed with 1009 (message too big), its seat given back."""
    from tokensvc.handlers.edge.lifecycle import MAX_BODY_BYTES

    reader = await connect(base_url)
    assert (await next_message(reader))["type"] == "ready"
    reader.write_message("x" * MAX_BODY_BYTES)  # ignored
    reader.write_message("x" * (MAX_BODY_BYTES + 1))
    assert await gen.with_timeout(timedelta(seconds=DEADLINE), reader.read_message()) is None
    assert reader.close_code == 1009
    await eventually(lambda: ctx.feed.readers == 0, DEADLINE, what="the reader dropped")


@pytest.mark.gen_test(timeout=90)
async def test_a_reader_on_a_previous_secret_is_closed_when_its_time_is_up(http_server, base_url, ctx, monkeypatch):
    """A reader that proved its client with the previous secret a rotation kept is closed when
    that secret's time is up, at its expiry: it was left to the check every 30 s, so it read on
    for up to half a minute past it (the periodic check is made an hour here, so only the
    expiry can close it). A reader on the current secret is given the same end when a rotation
    makes its secret the previous one; a reader on the new secret reads on."""
    from tokensvc.admin import actions as admin
    from tokensvc.handlers import feed

    monkeypatch.setattr(feed, "RECHECK_SECONDS", 3600.0)
    old = await notes_api(ctx)
    new, _ = await admin.rotate_secret(ctx, "notes-api", keep_previous_seconds=1)
    on_the_old = await connect(base_url, client_id="notes-api", secret=old)
    on_the_new = await connect(base_url, client_id="notes-api", secret=new)
    for reader in (on_the_old, on_the_new):
        assert (await next_message(reader))["type"] == "ready"
    assert await closed_for_its_credentials(on_the_old) == []
    newest, _ = await admin.rotate_secret(ctx, "notes-api", keep_previous_seconds=1)  # new becomes the previous
    assert await closed_for_its_credentials(on_the_new) == []
    assert (await refusal(base_url, {"Authorization": basic("notes-api", old)}))[0] == 401
    reader = await connect(base_url, client_id="notes-api", secret=newest)
    assert (await next_message(reader))["type"] == "ready"
    await eventually(lambda: ctx.feed.readers == 1, DEADLINE, what="the closed readers dropped")
    reader.close()


CHANGES_OF_WEBAPP = {
    "rotated": lambda admin, ctx: admin.rotate_secret(ctx, "webapp"),
    "made-third-party": lambda admin, ctx: admin.update_client(ctx, "webapp", {"first_party": False}),
    "removed": lambda admin, ctx: admin.remove_client(ctx, "webapp"),
}


def changed_after_authenticating(monkeypatch, change):
    """Every reader's handshake: ``change(ctx)`` lands just after the client's credentials were
    read, before the reader subscribes to their changes."""
    from tokensvc.handlers import feed

    authorize = feed.introspection.authorize_reader

    async def then_changed(ctx, caller):
        reader = await authorize(ctx, caller)
        await change(ctx)
        return reader

    monkeypatch.setattr(feed.introspection, "authorize_reader", then_changed)


@pytest.mark.parametrize("change", sorted(CHANGES_OF_WEBAPP))
@pytest.mark.gen_test(timeout=60)
async def test_a_change_during_the_handshake_closes_the_reader_before_ready(http_server, base_url, ctx, monkeypatch,
                                                                          change):
    """The handshake reads the client's credentials before the upgrade, and the reader hears of
    their changes only once open: a change that lands in between was announced before the reader
    listened, so the reader checks before ``ready`` and is closed (4403) having been told nothing,
    not kept until the periodic check (made an hour here, so only the handshake's can close it)."""
    from tokensvc.admin import actions as admin
    from tokensvc.handlers import feed

    monkeypatch.setattr(feed, "RECHECK_SECONDS", 3600.0)
    changed_after_authenticating(monkeypatch, lambda ctx: CHANGES_OF_WEBAPP[change](admin, ctx))
    reader = await connect(base_url)
    assert await closed_for_its_credentials(reader) == []
    await eventually(lambda: ctx.feed.readers == 0, DEADLINE, what="no reader registered")


@pytest.mark.gen_test(timeout=60)
async def test_a_handshake_its_clients_credentials_did_not_change_during_checks_nothing_more(http_server, base_url,
                                                                                            ctx, monkeypatch):
    """Only a change of the reader's own client during its handshake makes it check before
    ``ready``: none, or another client's, costs the handshake no second read of the store. The
    reader then hears its own client's changes."""
    from tokensvc.admin import actions as admin
    from tokensvc.handlers import feed

    checks, check = [], feed.introspection.still_a_reader

    async def still_a_reader(ctx, request):
        checks.append(request.credentials().client_id)
        return await check(ctx, request)

    monkeypatch.setattr(feed.introspection, "still_a_reader", still_a_reader)
    reader = await connect(base_url)
    assert (await next_message(reader))["type"] == "ready"
    await notes_api(ctx)
    changed_after_authenticating(monkeypatch, lambda ctx: admin.rotate_secret(ctx, "notes-api"))
    other = await connect(base_url)
    assert (await next_message(other))["type"] == "ready"
    assert checks == []
    await admin.rotate_secret(ctx, "webapp")
    assert await closed_for_its_credentials(other) == []
    assert await closed_for_its_credentials(reader) == []
    assert checks == ["webapp", "webapp"]


@pytest.mark.parametrize("config", [make_config(feed={"max_readers": 2, "max_readers_per_client": 1})])
@pytest.mark.gen_test(timeout=90)
async def test_every_refusal_is_as_the_document_says(http_server, base_url, ctx):
    """Each refusal's status is documented, with the headers the document says it carries (a
    401's challenge is the scheme the document names: Basic, which the feed asked for), and its
    body has one of the documented shapes."""
    from tokensvc.app import ROUTES
    from tokensvc.openapi import document as openapi

    document = openapi.build(ROUTES, base_url)
    documented = document["paths"]["/oauth/revocations"]["get"]["responses"]
    shapes = document["components"]["schemas"]
    secret = await notes_api(ctx)
    webapp = {"Authorization": basic("webapp", WEBAPP_SECRET)}
    readers = [await connect(base_url)]  # webapp's one reader (of two in all)

    async def as_documented(headers):
        code, body, served = await refusal(base_url, headers)
        response = documented[str(code)]
        for name, header in response.get("headers", {}).items():
            if header.get("required") or name in served:
                assert re.match(header["schema"].get("pattern", ""), served[name]), (code, name, served.get(name))
        schema = response["content"]["application/json"]["schema"]
        names = [shape["$ref"].rsplit("/", 1)[1] for shape in schema.get("anyOf", [schema])]
        assert any(set(shapes[name].get("required", [])) <= set(body) <= set(shapes[name]["properties"])
                   for name in names), (code, body)
        return code

    assert [await as_documented(headers) for headers in (
        {}, {"Authorization": basic("webapp", "wrong")}, {"Authorization": basic("node-agent", "")},
        {"Authorization": basic("partner", PARTNER_SECRET)}, webapp)] == [401, 401, 401, 403, 429]
    readers.append(await connect(base_url, client_id="notes-api", secret=secret))  # two of two
    assert await as_documented({"Authorization": basic("notes-api", secret)}) == 503
    for reader in readers:
        reader.close()


@pytest.mark.parametrize("client_id", ["webapp", "skyplanner"])  # confidential, public
@pytest.mark.gen_test(timeout=60)
async def test_a_removal_cut_short_is_named_once_recorded(http_server, base_url, ctx, monkeypatch, client_id):
    """The store fails once the removal is recorded, its grants not yet revoked: the feed has
    named the client all the same, public or confidential, and an introspection after the
    message says inactive."""
    from helpers import SKY_REDIRECT, WEBAPP_REDIRECT, issue_tokens

    from tokensvc.admin import actions as admin
    from tokensvc.oauth import introspection
    from tokensvc.storage.base import StorageError

    issued = await issue_tokens(ctx, "alice", "read", client_id,
                                WEBAPP_REDIRECT if client_id == "webapp" else SKY_REDIRECT)
    secret = await notes_api(ctx)
    listening = await connect(base_url, client_id="notes-api", secret=secret)
    assert (await next_message(listening))["type"] == "ready"

    async def cut_short(*args):
        raise StorageError("the store went away")

    monkeypatch.setattr(ctx.store, "revoke_client_grants", cut_short)
    with pytest.raises(StorageError):
        await admin.remove_client(ctx, client_id)
    assert await next_message(listening) == {"type": "revoked", "seq": 1, "client_id": client_id}
    assert await introspection.introspect(ctx, issued.access_token) == {"active": False}
