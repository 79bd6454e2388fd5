"""GET /v1/ws: three token sources, 401 before the upgrade, and close (4401) on revocation."""

import asyncio
import json
from datetime import timedelta

import pytest
from helpers import (
    NODE_REDIRECT,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    basic,
    check_schema,
    exchange,
    hand_over,
    json_of,
    make_config,
    post_form,
)
from tornado import gen
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from tokensvc import schemas

# The service's own origin is that of its public URL (what its pages send as Origin), which
# in the tests is not the address the test server listens on.
OWN_ORIGIN = make_config().base_url


def ws_url(base_url, query=""):
    return base_url.replace("http://", "ws://") + "/v1/ws" + query


async def tokens(browser, http_client, base_url, **kwargs):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT, **kwargs)
    return json_of(await exchange(http_client, base_url, code))


# How long a read may wait for its message: a bound for a hang, not a speed (the service closes
# a socket as soon as the revocation reaches it; a busy machine only delays that).
READ = timedelta(seconds=30)


async def welcome_of(connection):
    message = await gen.with_timeout(READ, connection.read_message())
    return check_schema(schemas.welcome, json.loads(message))


async def closed_as_revoked(connection):
    message = await gen.with_timeout(READ, connection.read_message())
    assert message is None
    assert connection.close_code == 4401


@pytest.mark.gen_test
async def test_token_in_the_query_string(browser, http_client, base_url, store):
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    connection = await websocket_connect(ws_url(base_url, "?access_token=" + access))
    alice = await store.get_user_by_username("alice")
    assert await welcome_of(connection) == {"type": "welcome", "subjectType": "user", "id": alice.user_id,
                                            "scopes": ["read"]}
    connection.write_message("hello")
    echo = json.loads(await connection.read_message())
    assert echo == {"type": "echo", "data": "hello"}
    connection.close()


@pytest.mark.gen_test
async def test_a_message_is_capped_as_a_body_is_and_read_as_text(browser, http_client, base_url):
    """A message may be as large as an HTTP body (64 KiB), no larger: one byte more closes the
    socket with 1009 (message too big, RFC 6455 §7.4.1), before it is read whole (2 MiB were
    taken). A message is text, never parsed: JSON nested past any depth comes back as it went."""
    from tokensvc.handlers.edge.lifecycle import MAX_BODY_BYTES

    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    connection = await websocket_connect(ws_url(base_url, "?access_token=" + access))
    await welcome_of(connection)
    for text in ("x" * MAX_BODY_BYTES, "[" * 60_000):
        connection.write_message(text)
        assert json.loads(await gen.with_timeout(READ, connection.read_message())) == {"type": "echo", "data": text}
    connection.write_message("x" * (MAX_BODY_BYTES + 1))
    assert await gen.with_timeout(READ, connection.read_message()) is None
    assert connection.close_code == 1009


@pytest.mark.gen_test
async def test_token_in_the_authorization_header(browser, http_client, base_url):
    access = (await tokens(browser, http_client, base_url))["access_token"]
    connection = await websocket_connect(HTTPRequest(ws_url(base_url), headers={"Authorization": f"Bearer {access}"}))
    assert (await welcome_of(connection))["subjectType"] == "user"
    connection.close()


@pytest.mark.gen_test
async def test_session_cookie(browser, base_url):
    await browser.login("alice")
    cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())
    request = HTTPRequest(ws_url(base_url), headers={"Cookie": cookie, "Origin": OWN_ORIGIN})
    connection = await websocket_connect(request)
    assert (await welcome_of(connection))["scopes"] == ["read", "write"]
    connection.close()


@pytest.mark.parametrize("where", [
    {"Origin": "https://evil.example"}, {"Origin": "null"},
    {"Origin": OWN_ORIGIN, "Sec-Fetch-Site": "cross-site"},  # the browser's word first, as for XSRF
])
@pytest.mark.gen_test
async def test_cookie_socket_from_another_origin_is_refused(http_server, browser, base_url, where):
    await browser.login("alice")
    cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())
    request = HTTPRequest(ws_url(base_url), headers={"Cookie": cookie, **where})
    with pytest.raises(HTTPClientError) as info:
        await websocket_connect(request)
    assert info.value.code == 403
    assert info.value.response.headers["Content-Type"] == "application/json"
    assert "own origin" in json_of(info.value.response)["detail"]


@pytest.mark.gen_test
async def test_a_bearer_socket_may_come_from_any_origin(browser, http_client, base_url):
    """The token is explicit, unlike the cookie: a browser app of another origin opens one."""
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    request = HTTPRequest(ws_url(base_url, "?access_token=" + access), headers={"Origin": "https://app.example"})
    connection = await websocket_connect(request)
    assert (await welcome_of(connection))["scopes"] == ["read"]
    connection.close()


HANDSHAKE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
             "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}  # RFC 6455 §1.3's


@pytest.mark.parametrize("changed,status", [
    ({"Upgrade": None}, 400), ({"Upgrade": "h2c"}, 400), ({"Connection": "keep-alive"}, 400),
    ({"Sec-WebSocket-Key": None}, 400), ({"Sec-WebSocket-Key": "short"}, 400),
    ({"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZR=="}, 400),  # 16 bytes and 2 bits more
    ({"Sec-WebSocket-Version": None}, 426), ({"Sec-WebSocket-Version": "8"}, 426),
    ({"Connection": "keep-alive, Upgrade"}, 101),  # Firefox's
])
@pytest.mark.gen_test
async def test_every_refused_handshake_is_json(browser, http_client, base_url, changed, status):
    """Tornado answers these in plain text; the service answers in its JSON shape, headers and
    all, as docs/openapi.json says."""
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    headers = {name: value for name, value in {**HANDSHAKE, **changed}.items() if value is not None}
    if status == 101:  # on a socket of its own: Tornado's client writes its own Connection header
        host, port = base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        lines = [f"GET /v1/ws?access_token={access} HTTP/1.1", f"Host: {host}:{port}",
                 *(f"{name}: {value}" for name, value in headers.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        assert (await reader.readline()).startswith(b"HTTP/1.1 101 ")
        writer.close()
        return
    answer = await http_client.fetch(base_url + "/v1/ws?access_token=" + access, headers=headers,
                                     raise_error=False)
    assert answer.code == status and answer.headers["Content-Type"] == "application/json"
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
    # A fault of the request's input: HTTPValidationError naming the header (the interface),
    # with the status RFC 6455 §4.2 names.
    [fault] = check_schema(schemas.http_validation_error, json_of(answer))["detail"]
    assert fault["loc"] == ["header", next(iter(changed))] and fault["input"] == changed[next(iter(changed))]
    if status == 426:
        assert answer.headers["Sec-WebSocket-Version"] == "13" and answer.headers["Upgrade"] == "websocket"
        assert "upgrade" in answer.headers["Connection"].lower()  # RFC 9110 §7.8
    # The request's shape is checked before its caller, as on every route.
    anonymous = await http_client.fetch(base_url + "/v1/ws", headers=headers, raise_error=False)
    assert anonymous.code == status


async def raw_answer(base_url, request_line, headers):
    """The status line, headers and body of the answer to a request written by hand."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(("\r\n".join([request_line, *(f"{name}: {value}" for name, value in headers.items())])
                      + "\r\n\r\n").encode())
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin1").split("\r\n")
        fields = dict(line.split(": ", 1) for line in head[1:] if line)
        return head[0], fields, await reader.readexactly(int(fields["Content-Length"]))
    finally:
        writer.close()


@pytest.mark.parametrize("host", [None, "localhost"])
@pytest.mark.gen_test
async def test_a_handshake_of_http_1_0_is_refused_in_json(browser, http_client, base_url, host):
    """Tornado would answer it "Missing/Invalid WebSocket headers" in plain text (RFC 6455 §4.1:
    HTTP/1.1 and a Host)."""
    access = (await tokens(browser, http_client, base_url, scope="read"))["access_token"]
    headers = {**HANDSHAKE, **({"Host": host} if host else {})}
    status, fields, body = await raw_answer(base_url, f"GET /v1/ws?access_token={access} HTTP/1.0", headers)
    assert status.startswith("HTTP/1.1 400 ") and fields["Content-Type"] == "application/json"
    assert "HTTP/1.1" in check_schema(schemas.DetailSchema(), json.loads(body))["detail"]


@pytest.mark.parametrize("query,headers", [
    ("", {}), ("?access_token=nope", {}), ("", {"Authorization": "Bearer nope"}),
])
@pytest.mark.gen_test
async def test_no_valid_token_is_401_before_the_upgrade(http_server, base_url, query, headers):
    with pytest.raises(HTTPClientError) as info:
        await websocket_connect(HTTPRequest(ws_url(base_url, query), headers=headers))
    assert info.value.code == 401
    assert 'error="invalid_token"' in info.value.response.headers["WWW-Authenticate"]


@pytest.mark.gen_test
async def test_installation_socket(browser, http_client, base_url):
    code = await browser.code_for("node-agent", NODE_REDIRECT, installation_id="backyard-scope")
    access = json_of(await exchange(http_client, base_url, code, client_id="node-agent", secret=None,
                                    redirect_uri=NODE_REDIRECT))["access_token"]
    connection = await websocket_connect(ws_url(base_url, "?access_token=" + access))
    welcome = await welcome_of(connection)
    assert welcome["subjectType"] == "installation" and welcome["id"] == "backyard-scope"
    connection.close()


async def revoke_rfc7009(http_client, base_url, issued, browser):
    await post_form(http_client, base_url + "/oauth/token/revoke", {"token": issued["access_token"]},
                    {"Authorization": basic("webapp", WEBAPP_SECRET)})


async def revoke_grant(http_client, base_url, issued, browser):
    await http_client.fetch(base_url + "/oauth/revoke", method="POST", body="",
                            headers={"Authorization": "Bearer " + issued["refresh_token"]})


async def revoke_connected_app(http_client, base_url, issued, browser):
    response = await browser.fetch("/v1/me/connected-apps/webapp", "DELETE",
                                   headers={"X-XSRFToken": browser.cookies["_xsrf"]})
    assert response.code == 204


async def reuse_refresh(http_client, base_url, issued, browser):
    url, auth = base_url + "/oauth/token/refresh", {"Authorization": basic("webapp", WEBAPP_SECRET)}
    second = json_of(await post_form(http_client, url, {"refresh_token": issued["refresh_token"]}, auth))
    await post_form(http_client, url, {"refresh_token": second["refresh_token"]}, auth)
    await post_form(http_client, url, {"refresh_token": issued["refresh_token"]}, auth)  # older than the last


async def sign_out_with_token(http_client, base_url, issued, browser):
    await browser.fetch("/oauth/sign-out?token=" + issued["refresh_token"], "POST", {},
                        headers={"X-XSRFToken": browser.cookies["_xsrf"]})


@pytest.mark.parametrize("revoke", [revoke_rfc7009, revoke_grant, revoke_connected_app, reuse_refresh,
                                    sign_out_with_token])
@pytest.mark.gen_test
async def test_revocation_closes_the_socket_within_a_second(browser, http_client, base_url, revoke):
    issued = await tokens(browser, http_client, base_url, scope="read write")
    connection = await websocket_connect(ws_url(base_url, "?access_token=" + issued["access_token"]))
    await welcome_of(connection)
    await revoke(http_client, base_url, issued, browser)
    await closed_as_revoked(connection)


def revoked_after_authenticating(monkeypatch, source, revoke):
    """The next handshake authenticated from ``source`` (``from_bearer``, ``from_session``):
    ``revoke()`` lands just after its credential was read, before the socket subscribes."""
    from tokensvc.oauth import principal as principals

    authenticate, pending = getattr(principals, source), [revoke]

    async def then_revoked(ctx, presented):
        found = await authenticate(ctx, presented)
        if found is not None and pending:
            await pending.pop()()
        return found

    monkeypatch.setattr(principals, source, then_revoked)


@pytest.mark.gen_test
async def test_a_revocation_during_the_handshake_closes_the_socket_before_the_welcome(browser, http_client, base_url,
                                                                                    monkeypatch):
    """The handshake reads the token before the upgrade, and the socket hears of revocations
    only once open: one that lands in between was announced before the socket listened, so the
    socket checks before its welcome and is closed (4401) having been told nothing (it stayed
    open, nothing checking it again until the token expired)."""
    issued = await tokens(browser, http_client, base_url)
    revoked_after_authenticating(monkeypatch, "from_bearer",
                                 lambda: revoke_rfc7009(http_client, base_url, issued, browser))
    connection = await websocket_connect(ws_url(base_url, "?access_token=" + issued["access_token"]))
    await closed_as_revoked(connection)


@pytest.mark.gen_test
async def test_a_sign_out_during_the_handshake_closes_the_cookie_socket_before_the_welcome(browser, base_url,
                                                                                         monkeypatch):
    await browser.login("alice")
    cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())

    async def sign_out():
        response = await browser.fetch("/oauth/sign-out", "POST", {}, headers={"X-XSRFToken": browser.cookies["_xsrf"]})
        assert response.code == 200

    revoked_after_authenticating(monkeypatch, "from_session", sign_out)
    connection = await websocket_connect(HTTPRequest(ws_url(base_url), headers={"Cookie": cookie,
                                                                                 "Origin": OWN_ORIGIN}))
    await closed_as_revoked(connection)


@pytest.mark.gen_test
async def test_a_handshake_no_revocation_touched_checks_nothing_more(browser, http_client, base_url, monkeypatch):
    """Only a revocation of what the socket stands on, during its handshake, makes it check
    before its welcome: another family's costs the handshake no second read of the store."""
    from tokensvc.oauth import principal as principals

    other = await tokens(browser, http_client, base_url)
    issued = await tokens(browser, http_client, base_url)
    checked, still_valid = [], principals.still_valid

    async def counting(ctx, principal):
        checked.append(principal.token.family_id)
        return await still_valid(ctx, principal)

    monkeypatch.setattr(principals, "still_valid", counting)
    revoked_after_authenticating(monkeypatch, "from_bearer",
                                 lambda: revoke_rfc7009(http_client, base_url, other, browser))
    connection = await websocket_connect(ws_url(base_url, "?access_token=" + issued["access_token"]))
    await welcome_of(connection)
    assert checked == []
    connection.close()


@pytest.mark.gen_test
async def test_a_narrowed_client_closes_the_sockets_that_lost_read(browser, http_client, base_url, ctx, config):
    """Narrowing a client's allowed_scopes revokes nothing, but a socket whose token no longer
    has read in force closes at once (before, only a revocation made sockets re-check)."""
    from tokensvc.admin.operator import Operator

    issued = await tokens(browser, http_client, base_url, scope="read write")
    connection = await websocket_connect(ws_url(base_url, "?access_token=" + issued["access_token"]))
    await welcome_of(connection)
    await Operator(ctx, await hand_over(ctx.store, config)).patch_client("webapp", {"allowedScopes": ["admin"]})
    await closed_as_revoked(connection)


@pytest.mark.gen_test
async def test_sign_out_closes_cookie_sockets(browser, base_url):
    await browser.login("alice")
    cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())
    request = HTTPRequest(ws_url(base_url), headers={"Cookie": cookie, "Origin": OWN_ORIGIN})
    connection = await websocket_connect(request)
    await welcome_of(connection)
    response = await browser.fetch("/oauth/sign-out", "POST", {}, headers={"X-XSRFToken": browser.cookies["_xsrf"]})
    assert response.code == 200
    await closed_as_revoked(connection)


@pytest.mark.gen_test
async def test_expired_token_closes_its_socket(browser, http_client, base_url, clock, ctx):
    issued = await tokens(browser, http_client, base_url)
    connection = await websocket_connect(ws_url(base_url, "?access_token=" + issued["access_token"]))
    await welcome_of(connection)
    clock.advance(3601)
    ctx.events.publish_all()  # any re-check now finds the token expired
    await closed_as_revoked(connection)


@pytest.mark.gen_test
async def test_other_sockets_stay_open(browser, http_client, base_url):
    first = await tokens(browser, http_client, base_url)
    other = type(browser)(browser.client, browser.base_url)
    code = await other.code_for("webapp", WEBAPP_REDIRECT, user="root", scope="read")
    second = json_of(await exchange(http_client, base_url, code))
    keep = await websocket_connect(ws_url(base_url, "?access_token=" + second["access_token"]))
    drop = await websocket_connect(ws_url(base_url, "?access_token=" + first["access_token"]))
    await welcome_of(keep)
    await welcome_of(drop)
    await revoke_rfc7009(http_client, base_url, first, browser)
    await closed_as_revoked(drop)
    keep.write_message("still here")
    assert json.loads(await gen.with_timeout(READ, keep.read_message()))["data"] == "still here"
    keep.close()


@pytest.mark.gen_test
async def test_only_the_sockets_a_revocation_concerns_re_check(browser, http_client, base_url, monkeypatch):
    """Two families of the same user and app: revoking one's refresh token closes its socket,
    and the other socket is not even asked to re-check (it stands on another family)."""
    from tokensvc.oauth import principal as principals

    first = await tokens(browser, http_client, base_url)
    second = await tokens(browser, http_client, base_url)
    checked = []
    still_valid = principals.still_valid

    async def counting(ctx, principal):
        checked.append(principal.token.family_id)
        return await still_valid(ctx, principal)

    monkeypatch.setattr(principals, "still_valid", counting)
    keep = await websocket_connect(ws_url(base_url, "?access_token=" + second["access_token"]))
    drop = await websocket_connect(ws_url(base_url, "?access_token=" + first["access_token"]))
    await welcome_of(keep)
    await welcome_of(drop)
    await revoke_rfc7009(http_client, base_url, first, browser)
    await closed_as_revoked(drop)
    assert len(checked) == 1
    # A revocation that changes nothing (the same token again) announces nothing: the next
    # re-check is the one the revocation of the other family makes, which closes its socket.
    await revoke_rfc7009(http_client, base_url, first, browser)
    await revoke_rfc7009(http_client, base_url, second, browser)
    await closed_as_revoked(keep)
    assert len(checked) == 2 and checked[1] != checked[0]


@pytest.mark.gen_test
async def test_a_refresh_is_no_revocation_for_an_open_socket(browser, http_client, base_url):
    """A socket stands on its token's family: refreshing replaces the access token it opened
    with, and the socket goes on until the family is revoked."""
    issued = await tokens(browser, http_client, base_url)
    connection = await websocket_connect(ws_url(base_url, "?access_token=" + issued["access_token"]))
    await welcome_of(connection)
    refreshed = await post_form(http_client, base_url + "/oauth/token/refresh",
                                {"refresh_token": issued["refresh_token"]},
                                {"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert refreshed.code == 200
    connection.write_message("after the refresh")
    assert json.loads(await gen.with_timeout(READ, connection.read_message()))["type"] == "echo"
    # Revoking the new access token alone is not this socket's token; revoking the family is.
    await revoke_rfc7009(http_client, base_url, json_of(refreshed), browser)
    connection.write_message("still")
    assert json.loads(await gen.with_timeout(READ, connection.read_message()))["type"] == "echo"
    await post_form(http_client, base_url + "/oauth/token/revoke", {"token": json_of(refreshed)["refresh_token"]},
                    {"Authorization": basic("webapp", WEBAPP_SECRET)})
    await closed_as_revoked(connection)


@pytest.mark.process
def test_a_graceful_stop_closes_every_socket_with_1012(tmp_path):
    """SIGTERM: each open socket is told to go (1012, service restart) as the feed's readers
    are, so that its client reconnects to another process: a close frame, never a connection
    that just drops."""
    import signal

    from service import NOWHERE, access_token, start_service
    from service import WEBAPP_SECRET as SERVED_SECRET

    from tokensvc.oauth.feed import CLOSE_RESTART

    service = start_service(tmp_path).wait_ready()
    try:
        token = access_token(service.base, "webapp", NOWHERE["webapp"], "read", "alice", "violet-tide-anchor",
                             SERVED_SECRET)

        async def read_through_the_stop() -> int | None:
            connection = await websocket_connect(ws_url(service.base, "?access_token=" + token))
            await welcome_of(connection)
            service.process.send_signal(signal.SIGTERM)
            while await gen.with_timeout(READ, connection.read_message()) is not None:
                pass
            return connection.close_code

        assert asyncio.run(read_through_the_stop()) == CLOSE_RESTART
    finally:
        output = service.stop()
    assert "1 WebSocket told to reconnect elsewhere" in output
