"""Hostile input against the running service: no request can write a log line of its own
(CWE-117), whatever it puts in a field that reaches a line, in text and in JSON."""

from __future__ import annotations

import base64
import json
import re
import socket
from urllib.parse import quote, urlencode

import pytest
import requests
from service import start_service

pytestmark = pytest.mark.e2e

FORGED = "2026-01-01T00:00:00.000Z INFO tokensvc.access: 10.0.0.1 200 POST /oauth/token 1.00ms client_id=webapp"
# What each hostile value carries: a line break and a forged line, a NUL, a terminal escape.
PAYLOADS = ["x\n" + FORGED, "x\r\n" + FORGED, "x\x00y", "x\x1b[2J\x1b[31mred", "x\u2028" + FORGED]
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


def raw(port: int, request: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        sock.recv(65536)


def send_everything(base: str) -> None:
    """Every field of a request that reaches a log line, with every payload."""
    port = int(base.rsplit(":", 1)[1])
    for payload in PAYLOADS:
        # client_id in the body, at each token endpoint
        for path in ("/oauth/token", "/oauth/token/refresh", "/oauth/token/introspect", "/oauth/token/revoke"):
            requests.post(base + path, data={"grant_type": "authorization_code", "code": "c", "redirect_uri": "x",
                                             "refresh_token": "r", "token": "t", "client_id": payload,
                                             "client_secret": "s"})
        # client_id in Basic credentials (form-urlencoded before base64, RFC 6749 2.3.1)
        basic = base64.b64encode(f"{quote(payload, safe='')}:secret".encode()).decode()
        requests.post(base + "/oauth/token/introspect", data={"token": "t"},
                      headers={"Authorization": "Basic " + basic})
        # the username typed at sign-in
        agent = requests.Session()
        agent.get(base + "/login")
        agent.post(base + "/login", data={"username": payload, "password": "whatever-it-is",
                                          "_xsrf": agent.cookies["_xsrf"]})
        # scope and redirect_uri of an authorization request, and a user agent
        query = {"response_type": "code", "client_id": "skyplanner", "redirect_uri": payload, "scope": payload,
                 "state": "s", "code_challenge": "x" * 43, "code_challenge_method": "S256"}
        agent_name = payload.replace("\n", "").replace("\r", "").encode().decode("latin-1")
        requests.get(base + "/oauth/authorize?" + urlencode(query), headers={"User-Agent": agent_name},
                     allow_redirects=False)
        query["redirect_uri"] = "http://127.0.0.1:2/callback"
        requests.get(base + "/oauth/authorize?" + urlencode(query), allow_redirects=False)
    # Raw bytes in the method, the path and a header (what a client library would not send).
    raw(port, b"GET /x\x1b[31mred?next=\x00 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    raw(port, b"G\x1bET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    raw(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-ID: a\x1b[2Jb\r\n"
              b"Connection: close\r\n\r\n")
    body = b"token=t&client_secret=s&client_id=" + b"A" * 40 + b"%0A%00%1B1234567"
    raw(port, b"POST /oauth/token/introspect HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
              b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def test_no_request_writes_a_text_line_of_its_own(tmp_path):
    service = start_service(tmp_path)
    try:
        send_everything(service.base)
    finally:
        output = service.stop()
    lines = output.splitlines()
    assert len(lines) > 60  # the requests were logged
    stray = [line for line in lines if not TEXT_LINE.match(line) and not line.startswith(("tokensvc is running",
                                                                                        "  ", "Press Ctrl+C"))]
    assert stray == []
    assert not re.search("[\x00\x1b\r\u2028]", output)
    assert sum(FORGED in line for line in lines) >= 3 * 5  # still there, inside the lines that carried it
    assert "\\n2026-01-01T00:00:00.000Z INFO" in output and "\\u001b[2J" in output and "\\u0000" in output
    assert "username=(unknown)" in output  # what was typed is not written at all
    assert re.search(r"client_id=A{40}\\n\\u0000\\u001b1234567", output)


def test_no_request_breaks_a_json_line(tmp_path):
    service = start_service(tmp_path, 'log_format = "json"')
    try:
        send_everything(service.base)
    finally:
        output = service.stop()
    entries = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    others = [line for line in output.splitlines() if not line.startswith("{")]
    assert len(entries) > 60 and all(line.startswith(("tokensvc is running", "  ", "Press Ctrl+C")) for line in others)
    assert any(FORGED in json.dumps(entry) for entry in entries)
