"""The JSON endpoints' own HTTP layer (handlers.json_api over the lifecycle): methods, framing, faults."""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import re

import pytest
from helpers import WEBAPP_SECRET, basic, check_oauth_error, check_validation_error, json_of, make_config, post_form

from tokensvc import __version__

HEALTH = b'{"status":"ok","version":"%s"}' % __version__.encode()  # /healthz's body, as written

# -- over HTTP ----------------------------------------------------------------------------

NAME = 'Sternwarte Zürich 望遠鏡 "\\" \u2028 \U0001F52D'


@pytest.mark.gen_test
@pytest.mark.parametrize("config", [make_config(clients=[{
    "client_id": "zurich", "name": NAME, "redirect_uris": ["https://zurich.example/cb"]}])])
async def test_bodies_are_compact_utf8_json_whatever_they_hold(http_client, base_url, config):
    """What a client sees: one line of compact JSON in UTF-8, every character a name may hold
    kept as it is (non-ASCII, quotes, backslashes, a line separator, an emoji) and read back
    exactly."""
    response = await http_client.fetch(base_url + "/oauth/clients/zurich")
    assert response.headers["Content-Type"] == "application/json"
    assert json.loads(response.body.decode("utf-8"))["name"] == NAME
    assert "Zürich 望遠鏡".encode() in response.body and b"\\u00fc" not in response.body  # not escaped
    assert b", " not in response.body and b": " not in response.body and b"\n" not in response.body


@pytest.mark.gen_test
async def test_other_methods_are_405_with_allow(http_client, base_url):
    for method, path, allow in (("GET", "/oauth/token/introspect", "POST"), ("HEAD", "/oauth/token", "OPTIONS, POST"),
                                ("DELETE", "/oauth/clients/webapp", "GET, HEAD"), ("PUT", "/healthz", "GET, HEAD")):
        response = await http_client.fetch(base_url + path, method=method, raise_error=False,
                                           allow_nonstandard_methods=True, body=b"" if method == "PUT" else None)
        assert response.code == 405, (method, path)
        assert response.headers["Allow"] == allow
        if method != "HEAD":
            assert json_of(response) == {"detail": "Method Not Allowed"}


GET_ROUTES = ["/", "/login", "/account", "/oauth/authorize?client_id=webapp", "/healthz", "/readyz", "/openapi.json",
              "/.well-known/oauth-authorization-server", "/oauth/clients", "/oauth/clients/webapp",
              "/oauth/clients/nobody", "/v1/me", "/v1/me/connected-apps", "/v1/ws", "/nothing", "/favicon.ico",
              "/static/style.css"]


@pytest.mark.gen_test
@pytest.mark.parametrize("path", GET_ROUTES)
async def test_head_is_answered_wherever_get_is(http_client, base_url, path):
    get = await http_client.fetch(base_url + path, raise_error=False, follow_redirects=False)
    head = await http_client.fetch(base_url + path, method="HEAD", raise_error=False, follow_redirects=False)
    assert head.code == get.code != 405, path
    assert head.body == b""
    for name in ("Content-Type", "Content-Length", "Location", "Cache-Control", "Content-Security-Policy"):
        assert head.headers.get(name) == get.headers.get(name), (path, name)


@pytest.mark.gen_test
async def test_responses_are_framed_and_dated(http_client, base_url):
    response = await post_form(http_client, base_url + "/oauth/token/introspect", {"token": "x"},
                               {"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert response.code == 200 and json_of(response) == {"active": False}
    assert response.headers["Content-Length"] == str(len(response.body))
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["Cache-Control"] == "no-store" and response.headers["Pragma"] == "no-cache"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert email.utils.parsedate_to_datetime(response.headers["Date"]) is not None


@pytest.mark.gen_test
@pytest.mark.parametrize("path,loc", [("/oauth/clients/%FF", ["path", "client_id"]),
                                      ("/v1/me/sessions/a%E0%A4", ["path", "session_id"])])
async def test_a_path_that_is_not_utf8_is_a_validation_error(http_client, base_url, path, loc):
    response = await http_client.fetch(base_url + path, method="DELETE" if "sessions" in path else "GET",
                                       raise_error=False)
    assert response.code == 422
    assert json_of(response) == {"detail": [{"loc": loc, "msg": "Input should be a valid string: not UTF-8",
                                             "type": "string_unicode", "input": path.rsplit("/", 1)[1],
                                             "ctx": {}}]}


@pytest.mark.gen_test
@pytest.mark.parametrize("path", ["/oauth/token", "/oauth/token/refresh", "/oauth/token/introspect",
                                  "/oauth/token/revoke", "/oauth/sign-out"])
async def test_a_body_that_cannot_be_parsed_is_the_documented_error(http_client, base_url, path):
    """At a token endpoint the OAuth error (RFC 6749 §5.2: invalid_request); elsewhere a
    validation fault of the body."""
    response = await http_client.fetch(base_url + path, method="POST", raise_error=False,
                                       body=b'--x\r\nContent-Disposition: form-data; name="token"\r\n\r\nabc',
                                       headers={"Content-Type": "multipart/form-data; boundary=y"})
    if path == "/oauth/sign-out":
        assert response.code == 422 and json_of(response)["detail"][0]["loc"] == ["body"]
        assert json_of(response)["detail"][0]["type"] == "body_parsing"
    else:
        check_oauth_error(response, 400, "invalid_request")
        assert json_of(response)["error_description"].startswith("The body could not be parsed: ")


def routes_with_a_body() -> list[tuple[str, str]]:
    from tokensvc.app import ROUTES

    return [(route.path, method) for route in ROUTES for method in sorted(route.methods)
            if method in ("POST", "PUT", "PATCH", "DELETE")]


@pytest.mark.gen_test
@pytest.mark.parametrize("path,method", routes_with_a_body())
async def test_json_nested_past_any_depth_is_never_a_fault_at_a_public_route(http_client, base_url, path, method):
    """No public route reads a JSON body (forms, queries and the socket's text), so 60,000
    ``[`` sent as JSON are never parsed: whatever each answers, never a 5xx, and ``/oauth/revoke``
    200 as the interface says."""
    response = await http_client.fetch(base_url + re.sub(r"\{[a-z_]+\}", "webapp", path), method=method,
                                       raise_error=False, body="[" * 60_000, allow_nonstandard_methods=True,
                                       headers={"Content-Type": "application/json"})
    assert response.code < 500, response.body
    if path == "/oauth/revoke":
        assert response.code == 200 and json_of(response) == {}


@pytest.mark.gen_test
@pytest.mark.parametrize("query,type_", [("token=%FF", "string_unicode"), ("token=a&token=b", "value_error")])
async def test_a_fault_of_sign_outs_query_is_a_validation_error(http_client, base_url, query, type_):
    """Sign-out is no token endpoint: a token that is not UTF-8 or is sent twice is the
    interface's HTTPValidationError at [query, token], not an OAuth invalid_request."""
    response = await http_client.fetch(base_url + "/oauth/sign-out?" + query, method="POST", body=b"",
                                       raise_error=False)
    check_validation_error(response, ["query", "token"], type_)


@pytest.mark.gen_test
async def test_an_unexpected_fault_is_500_in_the_documented_shape_and_logged(http_client, base_url, store, caplog):
    async def broken(client_id):
        raise RuntimeError("a bug")

    store.get_client = broken
    with caplog.at_level(logging.ERROR, logger="tokensvc.handlers.exit"):
        response = await http_client.fetch(base_url + "/oauth/clients/webapp", raise_error=False)
    assert response.code == 500
    assert json_of(response) == {"detail": "Internal server error"}
    assert "Traceback" not in response.body.decode()
    record = next(r for r in caplog.records if r.name == "tokensvc.handlers.exit")
    assert "GET /oauth/clients/webapp" in record.getMessage() and record.exc_info[0] is RuntimeError


@pytest.mark.gen_test
async def test_keep_alive_serves_many_requests_on_one_connection(http_client, base_url):
    # Tornado's simple client reuses nothing; a raw socket shows the connection stays usable.
    host, port = base_url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for _ in range(3):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            assert await reader.readexactly(length) == HEALTH
    finally:
        writer.close()


async def _exchange_raw(base_url: str, request: bytes) -> tuple[bytes, bytes, bytes]:
    """Send one raw request; return the response's head, its body and what follows (b"" once
    the server has closed the connection)."""
    host, port = base_url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        body = await reader.readexactly(length)
        rest = await asyncio.wait_for(reader.read(), 5) if b"close" in request.lower() else b"?"
        return head, body, rest
    finally:
        writer.close()


@pytest.mark.gen_test
async def test_the_connection_headers_tornado_adds_reach_the_client(http_server, base_url):
    # Endpoints hand Tornado a ResponseHeaders dict; the connection still adds its own.
    head, body, rest = await _exchange_raw(base_url, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert b"\r\nConnection: close\r\n" in head and body == HEALTH
    assert rest == b""  # and closes it
    head, body, _ = await _exchange_raw(base_url, b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"\r\nConnection: Keep-Alive\r\n" in head
    assert b"Transfer-Encoding" not in head and body == HEALTH


@pytest.mark.gen_test
async def test_fixed_paths_match_exactly(http_client, base_url):
    for path in ("/oauth/token/introspect/", "/v1/me/", "/healthz/x", "/HEALTHZ"):
        response = await http_client.fetch(base_url + path, raise_error=False)
        assert response.code == 404, path
        assert json_of(response) == {"detail": f"No resource at {path}"}
    response = await http_client.fetch(base_url + "/healthz?probe=1")
    assert json_of(response) == {"status": "ok", "version": __version__}


def test_a_body_holding_a_lone_surrogate_is_written_in_ascii_never_failing_to_encode():
    """The one JSON renderer: a lone surrogate (no text, which UTF-8 does not encode) in what an
    answer echoes is written as its escape, so the answer is sent; other bodies keep their
    characters as they are."""
    from tokensvc.handlers.edge.exit import dumps

    body = {"detail": [{"input": {"x": "Gen \ud800", "\udc00": "Zürich"}}]}
    written = dumps(body).encode("utf-8")
    assert written.isascii() and json.loads(written) == body
    assert dumps({"name": "Zürich \U0001F52D"}) == '{"name":"Zürich \U0001F52D"}'


@pytest.mark.gen_test
@pytest.mark.parametrize("config", [make_config(clients=[{
    "client_id": "gen1", "name": "Gen \ud800", "redirect_uris": ["https://gen.example/cb"]}])])
async def test_a_stored_lone_surrogate_never_stops_a_public_answer(http_client, base_url, config):
    """A name holding a lone surrogate that a store holds (an older release took one through the
    admin API) is answered, escaped, by the public listing and the client's own page: no 500."""
    for path in ("/oauth/clients", "/oauth/clients/gen1"):
        response = await asyncio.wait_for(http_client.fetch(base_url + path, raise_error=False), 10)
        assert response.code == 200, (path, response.body)
        assert b'"Gen \\ud800"' in response.body and response.body.isascii()


@pytest.mark.gen_test
async def test_a_lone_surrogates_bytes_in_a_form_a_path_or_a_query_are_a_4xx(http_client, base_url):
    """Tornado reads form fields, paths and queries as UTF-8: the bytes of a lone surrogate
    (``%ED%A0%80``) never reach a handler as one. Each answer is a 4xx, never a 500, and it comes."""
    surrogate = "%ED%A0%80"
    answers = [
        http_client.fetch(base_url + "/oauth/token", method="POST", raise_error=False,
                          headers={"Authorization": basic("webapp", WEBAPP_SECRET)},
                          body=f"grant_type=authorization_code&code={surrogate}&redirect_uri={surrogate}"),
        http_client.fetch(base_url + "/oauth/token/introspect", method="POST", raise_error=False,
                          body=f"token=t&client_id={surrogate}"),
        http_client.fetch(base_url + f"/oauth/clients/{surrogate}", raise_error=False),
        http_client.fetch(base_url + f"/oauth/authorize?client_id={surrogate}&response_type=code",
                          raise_error=False, follow_redirects=False),
    ]
    for response in await asyncio.wait_for(asyncio.gather(*answers), 10):
        assert 400 <= response.code < 500, (response.effective_url, response.code, response.body)
