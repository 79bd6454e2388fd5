"""``tokensvc serve``: a clean start and stop, and public URLs that follow the listen address."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from service import end, free_port, start_demo

from tokensvc import config
from tokensvc.cli import main as cli

DEMO = Path(__file__).resolve().parent.parent / "config" / "tokensvc.toml"


def serve(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    environ["TOKENSVC_ADMIN_PORT"] = str(free_port())  # never the public port + 1 another test holds
    return subprocess.run([sys.executable, "-m", "tokensvc", "serve", "--config", str(DEMO), *args],
                          capture_output=True, text=True, timeout=30, env={**environ, **(env or {})})


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.process
def test_a_busy_port_is_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_line(serve(["--port", str(port)]))
    assert line == f"tokensvc: 127.0.0.1:{port} is already in use; choose another with --port or TOKENSVC_PORT"


@pytest.mark.process
def test_the_json_log_mode_writes_a_refusal_as_a_json_line_too(tmp_path):
    """A log collector reads one JSON line per line: the refusal of a busy port, and of a
    configuration that is refused whole (its log_format read from the file all the same)."""
    import json

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = json.loads(one_line(serve(["--port", str(port), "--log-format", "json"])))
    assert (line["level"], line["logger"]) == ("error", "tokensvc")
    assert line["message"] == f"127.0.0.1:{port} is already in use; choose another with --port or TOKENSVC_PORT"
    broken = tmp_path / "broken.toml"
    broken.write_text('log_format = "json"\n[storage]\nbackend = "mongodb"\n')
    result = subprocess.run([sys.executable, "-m", "tokensvc", "serve", "--config", str(broken)], capture_output=True,
                            text=True, timeout=30, env={key: value for key, value in os.environ.items()
                                                        if not key.startswith("TOKENSVC_")})
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]  # every problem, a JSON line each
    assert [line["message"].split(":")[0] for line in lines] == ["storage.mongodb_uri", "cookie_secret"], lines
    assert {(line["level"], line["logger"]) for line in lines} == {("error", "tokensvc")}


@pytest.mark.process
def test_start_up_names_every_problem_of_the_configuration_at_once(tmp_path):
    """The refusal to start lists every problem the configuration has, one line each naming its
    key, as ``config check`` does: an operator fixes them in one pass, not one per restart."""
    broken = tmp_path / "broken.toml"
    broken.write_text('cookie_secret = "short"\n[tokens]\naccess_ttl = 0\n[storage]\nbackend = "mongodb"\n'
                      'mongodb_uri = "mongodb://db1,db2/?replicaSet=rs0&tsl=true"\n')
    result = subprocess.run([sys.executable, "-m", "tokensvc", "serve", "--config", str(broken)], capture_output=True,
                            text=True, timeout=30, env={**{key: value for key, value in os.environ.items()
                                                           if not key.startswith("TOKENSVC_")},
                                                        "TOKENSVC_SERVER_DRAIN_SECONDS": "soon"})
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr
    assert [line.split(":")[:2] for line in result.stderr.splitlines()] == [
        ["tokensvc", " TOKENSVC_SERVER_DRAIN_SECONDS"], ["tokensvc", " cookie_secret"],
        ["tokensvc", " storage.mongodb_uri"], ["tokensvc", " tokens.access_ttl"]], result.stderr


@pytest.mark.process
def test_a_host_that_does_not_resolve_is_one_line():
    line = one_line(serve(["--host", "no-such-host.invalid"]))
    assert line.startswith("tokensvc: cannot listen on 'no-such-host.invalid': the host does not resolve")
    assert "--host or TOKENSVC_HOST" in line


@pytest.mark.process
def test_an_address_not_of_this_machine_is_one_line():
    line = one_line(serve(["--host", "192.0.2.1", "--port", str(free_port())]))  # TEST-NET-1: never local
    assert "not an address of this machine" in line


@pytest.mark.process
@pytest.mark.parametrize("how", ["flag", "env", "file"])
@pytest.mark.parametrize("port", ["-1", "0", "65536", "99999"])
def test_a_port_outside_the_range_is_one_line(tmp_path, how, port):
    if how == "flag":
        result = serve(["--port", port])
    elif how == "env":
        result = serve([], {"TOKENSVC_PORT": port})
    else:
        path = tmp_path / "bad.toml"
        path.write_text(f"demo = true\nport = {port}\n")
        result = subprocess.run([sys.executable, "-m", "tokensvc", "serve", "--config", str(path)],
                                capture_output=True, text=True, timeout=30)
    assert one_line(result) == (f"tokensvc: port: {port} is outside 1-65535; "
                                "choose another with --port or TOKENSVC_PORT")


def test_unset_public_urls_follow_the_listen_address():
    settings = config.load(DEMO, environ={}, overrides={"port": 9000})
    assert settings.base_url == settings.auth_url == "http://127.0.0.1:9000"
    # A logo given as a path is served by the service itself, wherever it listens.
    sky = next(client for client in settings.clients if client.client_id == "skyplanner")
    assert sky.logo_url == "http://127.0.0.1:9000/static/demo-client.svg"
    assert config.load(DEMO, environ={"TOKENSVC_PORT": "9001"}).base_url == "http://127.0.0.1:9001"
    demo = {"demo": True}
    assert config.load(None, environ={}, overrides={**demo, "host": "0.0.0.0"}).base_url == "http://127.0.0.1:8080"
    assert config.load(None, environ={}, overrides={**demo, "host": "::1"}).base_url == "http://[::1]:8080"
    # Set explicitly, they stay as given.
    explicit = config.load(None, environ={"TOKENSVC_BASE_URL": "https://auth.example/"},
                           overrides={**demo, "port": 9000})
    assert explicit.base_url == "https://auth.example" and explicit.auth_url == "http://127.0.0.1:9000"


@pytest.mark.process
def test_demo_config_on_another_port_works_end_to_end():
    admin_port = free_port()
    process, base = start_demo(admin_port, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metadata = requests.get(base + "/.well-known/oauth-authorization-server").json()
        assert metadata["issuer"] == base and metadata["authorization_endpoint"] == base + "/oauth/authorize"
        assert metadata["token_endpoint"] == base + "/oauth/token"
        sky = requests.get(base + "/oauth/clients/skyplanner").json()
        assert sky["logoUrl"] == base + "/static/demo-client.svg"
        logo = requests.get(sky["logoUrl"])
        assert logo.status_code == 200 and logo.headers["Content-Type"] == "image/svg+xml"
    finally:
        out, err = end(process)
    assert process.returncode == 0, err
    assert f"tokensvc is running on {base}" in out
    assert f"authorization:      {base}/oauth/authorize" in out and f"token endpoint:     {base}/oauth/token" in out
    admin = f"http://127.0.0.1:{admin_port}"
    assert f"admin API:          {admin}/admin (tokensvc login --url {admin})" in out
    assert "Traceback" not in err


def test_in_process_listen_errors_are_command_errors(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["serve", "--config", str(DEMO), "--port", str(port)]) == 1
    assert capsys.readouterr().err == (f"tokensvc: 127.0.0.1:{port} is already in use; "
                                       "choose another with --port or TOKENSVC_PORT\n")


@pytest.mark.process
def test_a_client_that_stops_mid_headers_is_dropped(tmp_path):
    from service import start_service

    service = start_service(tmp_path, extra="[server]\nidle_timeout = 1\nbody_timeout = 1\n")
    try:
        port = int(service.base.rsplit(":", 1)[1])
        for partial in (b"GET /healthz HTTP/1.1\r\nHost: x\r\n",  # headers never finished
                        b"POST /oauth/token HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\ngrant"):  # body
            with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
                slow.sendall(partial)
                started = time.monotonic()
                assert slow.recv(1024) in (b"", b"HTTP/1.1 400 Bad Request\r\n\r\n")  # closed by the server
                assert time.monotonic() - started < 5
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:  # keep-alive, then idle
            idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert idle.recv(4096).startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            assert idle.recv(1024) == b"" and time.monotonic() - started < 5
    finally:
        service.stop()


def test_connection_timeouts_have_defaults_and_are_checked():
    settings = config.load(None, environ={}, overrides={"demo": True})
    assert (settings.server.idle_timeout, settings.server.body_timeout) == (60, 30)
    loaded = config.load(None, environ={"TOKENSVC_SERVER_IDLE_TIMEOUT": "5"}, overrides={"demo": True})
    assert loaded.server.idle_timeout == 5
    with pytest.raises(config.ConfigError, match="server.body_timeout: must be at least 1 second"):
        config.load(None, environ={"TOKENSVC_SERVER_BODY_TIMEOUT": "0"}, overrides={"demo": True})


@pytest.mark.process
def test_a_long_address_or_large_header_fields_get_an_answer_in_the_documented_shape(tmp_path):
    """A target over 64 KiB is 414 and header fields over 64 KiB are 431, in the route's shape
    (a JSON route's {"detail"}, a browser's navigation included; a page's error page), on both
    listeners: Tornado closed such a connection without a word. What fits is served as before."""
    from service import start_service

    service = start_service(tmp_path)
    try:
        long_query = "?q=" + "a" * (64 * 1024)
        for base, path in ((service.base, "/oauth/clients"), (service.base, "/no-such-page"),
                           (service.admin, "/admin/users")):
            for accept in ("application/json", "text/html"):
                answer = requests.get(base + path + long_query, headers={"Accept": accept}, timeout=10)
                assert answer.status_code == 414 and answer.headers["Content-Type"] == "application/json"
                assert answer.json()["detail"].startswith("URI Too Long"), (path, accept)
            large = requests.get(base + path, headers={"X-Padding": "a" * (64 * 1024)}, timeout=10)
            assert large.status_code == 431 and large.json()["detail"].startswith("Request Header Fields"), path
        page = requests.get(service.base + "/oauth/authorize" + long_query, timeout=10)
        assert page.status_code == 414 and page.headers["Content-Type"] == "text/html; charset=UTF-8"
        assert "What was sent is too large." in page.text
        fits = requests.get(service.base + "/oauth/clients?q=" + "a" * (60 * 1024), timeout=10)
        assert fits.status_code == 200 and fits.json()
        posted = requests.post(service.base + "/oauth/token" + long_query, data={"grant_type": "x"}, timeout=10)
        assert posted.status_code == 414 and set(posted.json()) == {"detail"}
    finally:
        assert "Traceback" not in service.stop()


async def answer_on(reader: asyncio.StreamReader) -> tuple[str, dict[str, str]]:
    """One response's status line and headers (its body read by its Content-Length)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin1")
    status, *lines = head.split("\r\n")[:-2]
    headers = dict(line.lower().split(": ", 1) for line in lines)
    await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers


async def ended(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether the server has ended the connection: a request sent now is answered (kept) or
    meets the connection's end, one or the other, so nothing is waited for a fixed time."""
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
        return False
    except (asyncio.IncompleteReadError, ConnectionError):
        return True


@pytest.mark.gen_test
async def test_once_stopping_each_connection_ends_with_the_next_answer_it_carries(app, http_server, http_port,
                                                                                   monkeypatch):
    """A stop answers the requests in flight, and a request a kept-alive connection sends
    meanwhile, each connection's last (``Connection: close``): four clients sending one request
    after another held the drain whole, one of theirs always in flight (issue #47). A JSON
    route's answer and a page's alike."""
    from tokensvc.handlers import meta

    entered, release = asyncio.Event(), asyncio.Event()
    health = meta.HealthHandler.get

    async def held(self):  # the request in flight when the stop comes
        if not release.is_set():
            entered.set()
            await release.wait()
        await health(self)

    monkeypatch.setattr(meta.HealthHandler, "get", held)
    busy = await asyncio.open_connection("127.0.0.1", http_port)
    idle = await asyncio.open_connection("127.0.0.1", http_port)
    try:
        idle[1].write(b"GET /.well-known/oauth-authorization-server HTTP/1.1\r\nHost: localhost\r\n\r\n")
        status, headers = await answer_on(idle[0])
        assert status == "HTTP/1.1 200 OK" and "connection" not in headers  # kept alive
        busy[1].write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await entered.wait()
        cli.stop_accepting([http_server])
        with pytest.raises(ConnectionError):  # no new connection
            await asyncio.open_connection("127.0.0.1", http_port)
        release.set()
        status, _ = await answer_on(busy[0])
        assert status == "HTTP/1.1 200 OK"  # the request in flight is answered
        for (reader, writer), path in ((busy, "/oauth/clients"), (idle, "/login")):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            status, headers = await answer_on(reader)
            assert status == "HTTP/1.1 200 OK" and headers["connection"] == "close", path
            assert await ended(reader, writer), path
    finally:
        for _, writer in (busy, idle):
            writer.close()


# A service's event loop ending while a call of the MongoDB driver still runs: one the store's
# close could not wait out (a reply the driver still waits for). ``main`` returns, or fails.
LEFT_RUNNING = """
import asyncio, sys
from tokensvc.cli import main as cli
from tokensvc.telemetry import logs
from tokensvc.storage.mongo.calls import Calls

async def call():  # as the driver waits for a reply
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        print("cancelled inside the driver", flush=True)
        raise

async def main():
    Calls().start(call())
    await asyncio.sleep(0)
    print("serve ended", flush=True)
    if sys.argv[2] == "failed":
        raise cli.CommandError("start-up failed")

logs.configure("text", "info")
(asyncio.run if sys.argv[1] == "asyncio.run" else cli.run)(main())
print("the interpreter's exit", flush=True)
"""


@pytest.mark.process
@pytest.mark.parametrize("ending, code", [("returned", 0), ("failed", 1)])
def test_a_driver_call_still_running_when_serve_ends_is_not_cancelled(ending, code):
    """The process leaves at once instead, cancelling nothing and finalizing nothing (a driver
    call's coroutine closed where it waits): asyncio.run cancels every task still running, and a
    cancellation delivered inside PyMongo's server selection leaves its lock broken and logs a
    traceback (issue #47)."""
    result = subprocess.run([sys.executable, "-c", LEFT_RUNNING, "cli.run", ending], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == code, result
    assert result.stdout == "serve ended\n", result
    assert ("ERROR tokensvc: start-up failed" in result.stderr) == (ending == "failed"), result.stderr
    assert "Traceback" not in result.stderr and "destroyed" not in result.stderr, result.stderr
    if ending == "returned":  # what asyncio.run does with it
        cancelled = subprocess.run([sys.executable, "-c", LEFT_RUNNING, "asyncio.run", ending], capture_output=True,
                                   text=True, timeout=60)
        assert "cancelled inside the driver" in cancelled.stdout, cancelled


def test_the_banner_says_a_wildcard_listener_listens_everywhere():
    """Bound to every address, the banner names it so beside the URL this machine reaches it by
    (before, it showed 127.0.0.1 alone, as if nothing else could reach the service)."""
    demo = {"demo": True, "port": 9000}
    for host, words in (("0.0.0.0", "every IPv4 address (0.0.0.0)"), ("::", "every address (::)")):
        settings = config.load(None, environ={}, overrides={**demo, "host": host})
        first = cli.banner(settings, cli.Listeners([], [])).splitlines()[0]
        loopback = "http://127.0.0.1:9000" if host == "0.0.0.0" else "http://[::1]:9000"
        assert first == f"tokensvc is running on {loopback} (listening on {words}, port 9000)"
    settings = config.load(None, environ={}, overrides={**demo, "host": "127.0.0.1"})
    assert cli.banner(settings, cli.Listeners([], [])).splitlines()[0] == "tokensvc is running on http://127.0.0.1:9000"
