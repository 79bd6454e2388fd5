"""Operating the service: Prometheus metrics after real flows, request ids through every line
of a request, and access lines an operator can use."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re

import pytest
from helpers import (
    PAST_CONCURRENT,
    VERIFIER,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    basic,
    exchange,
    json_of,
    make_config,
    post_form,
)
from tornado.httpclient import HTTPRequest

from tokensvc.telemetry import logs, metrics


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the exposition (0 when it is not there)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        found_name, _, found_labels = metric.partition("{")
        if found_name == name and ",".join(sorted(found_labels.rstrip("}").split(","))) == wanted:
            return float(value)
        if found_name == name and not labels and not found_labels:
            return float(value)
    return 0.0


async def scrape(http_client, base_url) -> str:
    response = await http_client.fetch(base_url + "/metrics")
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return response.body.decode()


@pytest.mark.gen_test(timeout=30)
async def test_metrics_count_real_flows(browser, http_client, base_url, clock):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    tokens = json_of(await exchange(http_client, base_url, code))
    auth = {"Authorization": basic("webapp", WEBAPP_SECRET)}
    refreshed = await post_form(http_client, base_url + "/oauth/token/refresh",
                                {"refresh_token": tokens["refresh_token"]}, auth)
    assert refreshed.code == 200
    clock.advance(PAST_CONCURRENT)
    reuse = await post_form(http_client, base_url + "/oauth/token/refresh",
                            {"refresh_token": tokens["refresh_token"]}, auth)
    assert reuse.code == 400
    replay = await exchange(http_client, base_url, code)
    assert replay.code == 400
    wrong = await post_form(http_client, base_url + "/oauth/token/introspect", {"token": "x"},
                            {"Authorization": basic("webapp", "wrong")})
    assert wrong.code == 401
    await http_client.fetch(base_url + "/oauth/clients/webapp")
    await http_client.fetch(base_url + "/oauth/clients/nobody", raise_error=False)
    text = await scrape(http_client, base_url)

    assert sample(text, "tokensvc_tokens_issued_total", grant="authorization_code") == 1
    assert sample(text, "tokensvc_tokens_issued_total", grant="refresh_token") == 1
    assert sample(text, "tokensvc_refresh_reuse_total") == 1
    assert sample(text, "tokensvc_token_families_revoked_total", reason="refresh_reuse") == 1
    assert sample(text, "tokensvc_client_auth_failures_total") == 1
    assert sample(text, "tokensvc_http_requests_total", method="POST", route="/oauth/token", status="200") == 1
    assert sample(text, "tokensvc_http_requests_total", method="POST", route="/oauth/token", status="400") == 1
    # The route's pattern, never the raw path.
    assert sample(text, "tokensvc_http_requests_total", method="GET", route="/oauth/clients/{client_id}",
                  status="200") == 1
    assert sample(text, "tokensvc_http_requests_total", method="GET", route="/oauth/clients/{client_id}",
                  status="404") == 1
    assert "/oauth/clients/webapp" not in text and "nobody" not in text
    assert sample(text, "tokensvc_http_request_duration_seconds_count", route="/oauth/token") == 2
    assert sample(text, "tokensvc_http_requests_total", method="GET", route="/login", status="200") == 1
    for name in ("tokensvc_code_reuse_total", "tokensvc_login_failures_total", "tokensvc_rate_limited_total",
                 "tokensvc_store_errors_total", "tokensvc_websockets_open", "process_cpu_seconds_total"):
        assert f"# TYPE {name.removesuffix('_total')}" in text or f"# TYPE {name}" in text, name


@pytest.mark.gen_test(timeout=30)
async def test_code_reuse_login_failures_and_429s_are_counted(browser, http_client, base_url, store):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    assert (await exchange(http_client, base_url, code)).code == 200
    assert (await exchange(http_client, base_url, code)).code == 400
    stranger = type(browser)(http_client, base_url)
    for _ in range(6):  # the test config allows 5 failed sign-ins per (username, address)
        await stranger.fetch("/login", "POST", {"username": "alice", "password": "nope", "next": "/",
                                               "_xsrf": await stranger.xsrf()})
    text = await scrape(http_client, base_url)
    assert sample(text, "tokensvc_code_reuse_total") == 1
    assert sample(text, "tokensvc_token_families_revoked_total", reason="code_reuse") == 1
    assert sample(text, "tokensvc_login_failures_total") == 5
    assert sample(text, "tokensvc_rate_limited_total", kind="login") == 1


@pytest.mark.gen_test(timeout=30)
async def test_open_websockets_and_store_errors_are_counted(browser, http_client, base_url, store, monkeypatch):
    from tornado.websocket import websocket_connect

    from tokensvc.storage.base import StorageError

    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    access = json_of(await exchange(http_client, base_url, code))["access_token"]
    connection = await websocket_connect(base_url.replace("http", "ws") + "/v1/ws?access_token=" + access)
    await connection.read_message()
    assert sample(await scrape(http_client, base_url), "tokensvc_websockets_open") == 1
    connection.close()

    async def away(*args, **kwargs):
        raise StorageError("away")

    monkeypatch.setattr(store, "get_client", away)
    assert (await http_client.fetch(base_url + "/oauth/clients/webapp", raise_error=False)).code == 503
    text = await scrape(http_client, base_url)
    assert sample(text, "tokensvc_store_errors_total", kind="unavailable") == 1
    assert sample(text, "tokensvc_websockets_open") == 0


@pytest.mark.gen_test
@pytest.mark.parametrize("config,status", [
    (make_config(metrics={"allow": ["10.0.0.0/8"]}), 404),  # loopback is not in it: a path that is not there
    (make_config(metrics={"allow": ["127.0.0.0/8"], "enabled": False}), 404),
    (make_config(metrics={"allow": ["127.0.0.0/8"]}), 200),
], ids=["outside", "disabled", "allowed"])
async def test_metrics_are_404_outside_the_allowed_networks_and_when_disabled(http_client, base_url, config, status):
    response = await http_client.fetch(base_url + "/metrics", raise_error=False)
    assert response.code == status
    if status == 404:
        assert json_of(response) == {"detail": "No resource at /metrics"}


def test_the_address_rule():
    rule = metrics.AddressRule(make_config().metrics.allow)
    for allowed in ("127.0.0.1", "127.3.4.5", "::1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "fd00::1",
                    "::ffff:10.0.0.1"):
        assert rule.allows(allowed), allowed
    for refused in ("8.8.8.8", "172.32.0.1", "2001:db8::1", "", None, "not-an-address"):
        assert not rule.allows(refused), refused


def test_disabled_metrics_are_not_there():
    from tokensvc.config import ConfigError

    assert make_config(metrics={"enabled": False}).metrics.enabled is False
    with pytest.raises(ConfigError, match="metrics.allow"):
        make_config(metrics={"allow": ["10.0.0.0/33"]})


def _child(directory: str, count: int) -> None:
    registry_metrics = metrics.Metrics()
    for _ in range(count):
        registry_metrics.tokens_issued.labels("authorization_code").inc()
    registry_metrics.websockets_open.inc()


@pytest.mark.process
def test_several_processes_give_one_view(tmp_path, monkeypatch):
    from prometheus_client import values

    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    monkeypatch.delenv(metrics.MULTIPROCESS_ENV, raising=False)
    metrics.use_multiprocess_dir(str(tmp_path))
    try:
        context = multiprocessing.get_context("fork")
        children = [context.Process(target=_child, args=(str(tmp_path), n)) for n in (2, 3)]
        for child in children:
            child.start()
        for child in children:
            child.join(60)  # a bound for a hang, not a speed
            assert child.exitcode == 0
        text = metrics.Metrics().render().decode()
    finally:
        # Not monkeypatch: it would put back, when the test ends, the value set here.
        os.environ.pop(metrics.MULTIPROCESS_ENV, None)
    assert sample(text, "tokensvc_tokens_issued_total", grant="authorization_code") == 5
    assert "process_cpu_seconds_total" in text


# -- request ids and access lines -------------------------------------------------------


@pytest.fixture
def service_stream():
    """The service's own handler, text format, into a string."""
    import io

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    logs.configure("text", "info", stream=stream)
    root.handlers[:] = [h for h in root.handlers if isinstance(h, logs.ServiceHandler)]
    yield stream
    root.handlers[:], level = saved
    root.setLevel(level)


def request_lines(stream, request_id: str) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if line.endswith(f"request_id={request_id}")]


@pytest.mark.gen_test
async def test_an_incoming_request_id_is_kept_returned_and_on_every_line(http_client, base_url, service_stream):
    response = await http_client.fetch(HTTPRequest(
        base_url + "/oauth/token", method="POST", headers={"X-Request-ID": "lb-7f3a.2_x",
                                                          "Authorization": basic("webapp", "wrong")},
        body="grant_type=authorization_code&code=c&redirect_uri=x&code_verifier=" + VERIFIER), raise_error=False)
    assert response.code == 401 and response.headers["X-Request-ID"] == "lb-7f3a.2_x"
    mine = request_lines(service_stream, "lb-7f3a.2_x")
    assert any("tokensvc.audit: client authentication failed" in line for line in mine)  # audit
    access = next(line for line in mine if "tokensvc.access" in line)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING tokensvc.access: 127\.0\.0\.1 401 POST "
                    r"/oauth/token [\d.]+ms client_id=webapp error=invalid_client request_id=lb-7f3a\.2_x$", access)


@pytest.mark.gen_test
@pytest.mark.parametrize("incoming", [None, "", "has space", "x" * 65, "semi;colon", "ünï"])
async def test_a_missing_or_malformed_request_id_is_replaced(http_client, base_url, incoming):
    headers = {} if incoming is None else {"X-Request-ID": incoming}
    for path in ("/healthz", "/", "/static/style.css", "/nowhere"):
        response = await http_client.fetch(base_url + path, headers=headers, raise_error=False)
        assert re.fullmatch(r"[0-9a-f]{16}", response.headers["X-Request-ID"]), (path, response.headers)


def _new_ids(count: int, queue=None) -> list[str]:
    from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

    from tokensvc.handlers.edge.lifecycle import request_id_for

    request = HTTPServerRequest(start_line=RequestStartLine("GET", "/", "HTTP/1.1"),
                                headers=HTTPHeaders({"Host": "127.0.0.1"}))
    made = [request_id_for(request) for _ in range(count)]
    if queue is not None:
        queue.put(made)
    return made


@pytest.mark.process
def test_new_request_ids_differ_in_every_worker():
    """Ids come from the process's pseudo-random generator: distinct, and not repeated by a
    forked worker (the generator is reseeded in the child)."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    children = [context.Process(target=_new_ids, args=(1000, queue)) for _ in range(2)]
    for child in children:
        child.start()
    theirs = [queue.get(timeout=30) for _ in children]
    for child in children:
        child.join(10)
    mine = _new_ids(1000)
    every = [*mine, *theirs[0], *theirs[1]]
    assert len(set(every)) == 3000 and all(re.fullmatch(r"[0-9a-f]{16}", made) for made in every)


@pytest.mark.gen_test
async def test_pages_and_errors_carry_the_request_id(http_client, base_url, service_stream, monkeypatch):
    from tokensvc.handlers import pages

    async def broken(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(pages.HomeHandler, "get", broken)
    response = await http_client.fetch(base_url + "/", headers={"X-Request-ID": "page-1"}, raise_error=False)
    assert response.code == 500 and response.headers["X-Request-ID"] == "page-1"
    mine = request_lines(service_stream, "page-1")
    assert any("Uncaught exception GET /" in line for line in mine)  # the error line
    assert any("tokensvc.access: 127.0.0.1 500 GET /" in line for line in mine)


@pytest.mark.gen_test
async def test_a_failed_token_request_names_the_client_of_its_body(http_client, base_url, service_stream):
    # Fails validation before any client is read: the access line still names the claimed one.
    await post_form(http_client, base_url + "/oauth/token", {"grant_type": "authorization_code",
                                                              "client_id": "skyplanner"})
    access = [line for line in service_stream.getvalue().splitlines() if "tokensvc.access" in line][-1]
    assert " 422 POST /oauth/token " in access and "client_id=skyplanner" in access
    await post_form(http_client, base_url + "/oauth/token", {"grant_type": "authorization_code",
                                                              "client_id": "bad id\nforged line"})
    access = [line for line in service_stream.getvalue().splitlines() if "tokensvc.access" in line][-1]
    assert "client_id=" not in access and "forged" not in access


@pytest.mark.gen_test
async def test_json_lines_carry_the_same_fields(http_client, base_url, service_stream):
    logs.configure("json", "info", stream=service_stream)
    await post_form(http_client, base_url + "/oauth/token/refresh",
                    {"refresh_token": "nope", "client_id": "skyplanner"},
                    headers={"X-Request-ID": "json-1"})
    entries = [json.loads(line) for line in service_stream.getvalue().splitlines() if line.startswith("{")]
    access = next(entry for entry in entries if entry["logger"] == "tokensvc.access")
    assert access["request_id"] == "json-1" and access["time"].endswith("+00:00")
    assert access["access"] == {"remote_ip": "127.0.0.1", "status": 400, "method": "POST",
                                "path": "/oauth/token/refresh", "ms": access["access"]["ms"],
                                "client_id": "skyplanner", "error": "invalid_grant"}


def test_audit_values_are_plain_text(service_stream):
    logs.audit("consent", {"client_id": "skyplanner", "scopes": ["read", "observations:write"]})
    line = service_stream.getvalue().strip()
    assert line.endswith("event=consent client_id=skyplanner scopes=read observations:write")


@pytest.mark.gen_test(timeout=60)
async def test_invented_methods_and_paths_add_no_series(http_client, base_url):
    """Every label comes from a closed set: a method outside the standard ones is ``other``, a
    path is its route's pattern (``(unmatched)`` for none), a status is a number. So 1,000
    requests with invented methods and paths leave the exposition as large as 100 did."""
    import random
    import string

    def series(text: str) -> set[str]:
        return {line.rsplit(" ", 1)[0] for line in text.splitlines()
                if line.startswith(("tokensvc_http_requests_total{", "tokensvc_http_request_duration_seconds"))}

    rng = random.Random(7)

    async def invent(count: int) -> None:
        for _ in range(count):
            method = "X" + "".join(rng.choices(string.ascii_uppercase, k=8))
            path = rng.choice(["/healthz", "/oauth/clients/" + "".join(rng.choices(string.ascii_lowercase, k=12)),
                               "/" + "".join(rng.choices(string.ascii_lowercase, k=12))])
            response = await http_client.fetch(base_url + path, method=method, allow_nonstandard_methods=True,
                                               raise_error=False)
            assert response.code in (404, 405)

    await scrape(http_client, base_url)  # the scrape's own series, from here on
    await invent(100)
    after_100 = series(await scrape(http_client, base_url))
    await invent(900)
    after_1000 = series(await scrape(http_client, base_url))
    assert after_1000 == after_100
    assert 'method="other"' in " ".join(after_1000) and "XA" not in " ".join(after_1000)
    routes = {re.search(r'route="([^"]*)"', line).group(1) for line in after_1000 if 'route="' in line}
    assert routes <= {"/healthz", "/oauth/clients/{client_id}", "(unmatched)", "/metrics"}
