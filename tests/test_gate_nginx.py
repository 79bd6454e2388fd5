"""``tokensvc gate`` behind a real nginx (Debian's package), configured by deploy/gate/nginx.conf
as it ships (only its ports moved), in front of a small API: ``tokensvc serve`` (memory backend),
the gate, nginx and the API, each on a port of its own.

Without nginx the module is skipped with the reason, and fails when ``CI`` is set: ``.ci/run``
installs it."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from helpers import DEADLINE, wait_until
from service import NOWHERE, WEBAPP_SECRET, access_token, end, free_port, spawn, start_service

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "gate" / "nginx.conf"
API_SECRET = "gate-api-secret-0123456789abcdef0123456789"
RESOURCE_SERVER = f"""
[[clients]]
client_id = "gate-api"
name = "Gated API"
kind = "resource-server"
client_secret = "{API_SECRET}"
"""
NGINX_MAIN = """daemon off;
worker_processes 1;
pid "{prefix}/nginx.pid";
error_log stderr warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path "{prefix}/temp/body";
    proxy_temp_path "{prefix}/temp/proxy";
    fastcgi_temp_path "{prefix}/temp/fastcgi";
    uwsgi_temp_path "{prefix}/temp/uwsgi";
    scgi_temp_path "{prefix}/temp/scgi";
    include "{prefix}/gate.conf";
}}
"""


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((path for path in ("/usr/sbin/nginx",) if os.access(path, os.X_OK)), None)
    if found is None:
        message = "nginx is not installed (Debian: apt-get install nginx; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


class Api(BaseHTTPRequestHandler):
    """The protected API: answers every request with the X-Auth-* headers it received, and
    records them."""

    seen: list[dict[str, str]] = []

    def _answer(self) -> None:
        headers = {name: value for name, value in self.headers.items() if name.lower().startswith("x-auth-")}
        Api.seen.append(headers)
        body = json.dumps({"path": self.path, "headers": headers}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """tokensvc, the gate, nginx and the API; yields nginx's base URL, tokensvc's and the gate's."""
    nginx = nginx_binary()
    tmp = tmp_path_factory.mktemp("gate nginx")
    service = start_service(tmp, extra=RESOURCE_SERVER)
    api = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    gate_port = free_port()
    nginx_port = free_port(gate_port)
    gate_config = tmp / "gate.toml"
    gate_config.write_text(f"""
tokensvc_url = "{service.base}"
client_id = "gate-api"
host = "127.0.0.1"
port = {gate_port}
scope = "read"

[[rules]]
prefix = "/notes"
methods = ["POST", "PUT", "PATCH", "DELETE"]
scope = "write"

[verifier]
max_ttl = 3600
""")
    gate_log = open(tmp / "gate.log", "w")  # noqa: SIM115 (closed at the end of the module)
    gate = spawn([sys.executable, "-m", "tokensvc", "gate", "--config", str(gate_config)], stdout=gate_log,
                 stderr=subprocess.STDOUT, env={**os.environ, "TOKENSVC_GATE_CLIENT_SECRET": API_SECRET})
    prefix = tmp / "nginx"
    (prefix / "temp").mkdir(parents=True)
    (prefix / "gate.conf").write_text(EXAMPLE.read_text()
                                      .replace("127.0.0.1:8090", f"127.0.0.1:{gate_port}")
                                      .replace("127.0.0.1:8000", f"127.0.0.1:{api.server_port}")
                                      .replace("127.0.0.1:8080", f"127.0.0.1:{nginx_port}"))
    (prefix / "nginx.conf").write_text(NGINX_MAIN.format(prefix=prefix))
    proxy = spawn([nginx, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", "stderr"],
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    gate_base, base = f"http://127.0.0.1:{gate_port}", f"http://127.0.0.1:{nginx_port}"
    try:
        def up(url: str, process: subprocess.Popen, status: int) -> bool:
            if process.poll() is not None:
                written = process.stdout.read() if process.stdout is not None else (tmp / "gate.log").read_text()
                raise AssertionError(f"{process.args} exited with {process.returncode}: {written}")
            return requests.get(url, timeout=5).status_code == status

        wait_until(lambda: up(gate_base + "/readyz", gate, 200), "the gate's feed open", DEADLINE,
                   retry=(requests.RequestException,))
        wait_until(lambda: up(base + "/notes", proxy, 401), "nginx answering", DEADLINE,
                   retry=(requests.RequestException,))
        yield base, service.base, gate_base
    finally:
        end(proxy)
        end(gate)
        gate_log.close()
        service.stop()
        api.shutdown()
        api.server_close()


def token(base: str, scope: str = "read") -> str:
    return access_token(base, "webapp", NOWHERE["webapp"], scope, "alice", "violet-tide-anchor", secret=WEBAPP_SECRET)


def subject(tokensvc: str, access: str) -> str:
    answer = requests.post(tokensvc + "/oauth/token/introspect", data={"token": access},
                           auth=("gate-api", API_SECRET), timeout=10)
    return answer.json()["sub"]


def counts(gate_base: str) -> dict[str, int]:
    return requests.get(gate_base + "/readyz", timeout=10).json()["counts"]


def test_a_valid_token_passes_and_the_api_sees_who_it_is(stack):
    base, tokensvc, _ = stack
    access = token(tokensvc, "read write")
    answer = requests.get(base + "/notes/1", headers={"Authorization": f"Bearer {access}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["headers"] == {"X-Auth-Subject": subject(tokensvc, access), "X-Auth-Scope": "read write",
                                        "X-Auth-Client-Id": "webapp"}
    written = requests.post(base + "/notes", headers={"Authorization": f"Bearer {access}"}, timeout=10)
    assert written.status_code == 200


def test_no_token_or_a_made_up_one_is_refused_with_the_challenge(stack):
    base, _, _ = stack
    calls = len(Api.seen)
    answer = requests.get(base + "/notes", timeout=10)
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"] == 'Bearer realm="api"'
    for made_up in ("garbage", "A" * 43):
        answer = requests.get(base + "/notes", headers={"Authorization": f"Bearer {made_up}"}, timeout=10)
        assert answer.status_code == 401
        assert answer.headers["WWW-Authenticate"] == ('Bearer realm="api", error="invalid_token", '
                                                      'error_description="The access token is not active"')
    assert len(Api.seen) == calls  # the API was never asked


def test_a_token_without_the_scope_a_rule_requires_is_refused_403(stack):
    base, tokensvc, _ = stack
    access = token(tokensvc, "read")
    calls = len(Api.seen)
    answer = requests.post(base + "/notes", headers={"Authorization": f"Bearer {access}"}, timeout=10)
    assert answer.status_code == 403
    assert answer.headers["WWW-Authenticate"] == ('Bearer realm="api", error="insufficient_scope", '
                                                  'error_description="The token lacks the scope write", '
                                                  'scope="write"')
    assert answer.json() == {"error": "insufficient_scope"}
    # A path that only looks like another rule's is judged as nginx routes it (sent as it is
    # written: requests would resolve the dot segments before sending).
    connection = http.client.HTTPConnection(urlsplit(base).netloc, timeout=10)
    connection.request("POST", "/public/../notes", headers={"Authorization": f"Bearer {access}"})
    assert connection.getresponse().status == 403
    connection.close()
    assert len(Api.seen) == calls
    assert requests.get(base + "/notes", headers={"Authorization": f"Bearer {access}"}, timeout=10).status_code == 200


def test_a_revoked_token_is_refused_once_the_feed_names_it(stack):
    """The gate caches the answer (max_ttl an hour): only the feed's message can end it, and the
    refusal's one introspection says so."""
    base, tokensvc, gate_base = stack
    access = token(tokensvc)
    auth = {"Authorization": f"Bearer {access}"}
    assert requests.get(base + "/notes", headers=auth, timeout=10).status_code == 200
    assert requests.get(base + "/notes", headers=auth, timeout=10).status_code == 200
    before = counts(gate_base)
    revoked = requests.post(tokensvc + "/oauth/token/revoke", data={"token": access}, auth=("webapp", WEBAPP_SECRET),
                            timeout=10)
    assert revoked.status_code == 200
    wait_until(lambda: requests.get(base + "/notes", headers=auth, timeout=10).status_code == 401,
               "the revoked token refused", DEADLINE)
    after = counts(gate_base)
    assert after["revocations"] > before["revocations"] and after["flushes"] == before["flushes"]
    assert after["introspections"] == before["introspections"] + 1  # asked again once, after the message


def test_a_client_sent_x_auth_header_never_reaches_the_api(stack):
    base, tokensvc, _ = stack
    access = token(tokensvc)
    forged = {"X-Auth-Subject": "root", "X-Auth-Scope": "admin", "X-Auth-Client-Id": "tokensvc-cli",
              "X-Auth-Installation-Id": "backyard-scope"}
    answer = requests.get(base + "/notes", headers={"Authorization": f"Bearer {access}", **forged}, timeout=10)
    assert answer.status_code == 200
    assert answer.json()["headers"] == {"X-Auth-Subject": subject(tokensvc, access), "X-Auth-Scope": "read",
                                        "X-Auth-Client-Id": "webapp"}
    calls = len(Api.seen)
    assert requests.get(base + "/notes", headers=forged, timeout=10).status_code == 401
    assert len(Api.seen) == calls
