"""No secret in any log line: every flow runs against ``tokensvc serve`` at debug level, then
the whole output (the service's lines and Tornado's own) is searched for every token, code,
state, verifier, password, client secret, session and XSRF token the flows used, for the hash
of each (what the store keeps), and for anything shaped like a hash."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import socket
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import pytest
import requests
from helpers import DIGEST, another_confirmation, hashes_of
from service import WEBAPP_SECRET, answer_when_read, hidden_fields, start_service, user_agent_authorize
from tornado.websocket import websocket_connect

pytestmark = pytest.mark.e2e

NOWHERE = {"webapp": "http://127.0.0.1:1/callback", "skyplanner": "http://127.0.0.1:2/callback",
           "node-agent": "http://127.0.0.1:3/paired", "tokensvc-cli": "http://127.0.0.1:4/callback"}
ROOT = '\n[[users]]\nusername = "root"\npassword = "quartz-river-beacon"\nadmin = true\n'


class Flows:
    """Runs the flows and remembers every secret they handled."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.used: set[str] = {WEBAPP_SECRET, "violet-tide-anchor"}
        self.agent = requests.Session()

    def secret(self, value: str) -> str:
        self.used.add(value)
        return value

    def authorize(self, client_id: str, scope: str, **extra: str) -> str:
        verifier = self.secret(secrets.token_urlsafe(48))
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        state = self.secret("state-" + secrets.token_urlsafe(16))
        query = {"response_type": "code", "client_id": client_id, "redirect_uri": NOWHERE[client_id],
                 "scope": scope, "state": state, "code_challenge": challenge, "code_challenge_method": "S256", **extra}
        response = self.agent.get(self.base + "/oauth/authorize?" + urlencode(query), allow_redirects=False)
        if response.status_code == 302 and response.headers["Location"].startswith("/login"):
            page = self.agent.get(urljoin(self.base, response.headers["Location"]))
            form = hidden_fields(page.text)
            self.secret(form["_xsrf"])
            wrong = self.agent.post(self.base + "/login", allow_redirects=False,
                                    data={**form, "username": "alice",
                                          "password": self.secret("wrong-" + secrets.token_hex(8))})
            assert wrong.status_code == 401
            response = self.agent.post(self.base + "/login",
                                       data={**form, "username": "alice", "password": "violet-tide-anchor"},
                                       allow_redirects=False)
            assert response.status_code == 302, response.text
            self.session_cookie()
            response = self.agent.get(urljoin(self.base, response.headers["Location"]), allow_redirects=False)
        if response.status_code == 200:  # consent
            response = answer_when_read(self.agent, self.base + "/oauth/authorize", response.text)
        assert response.status_code == 302, response.text
        returned = parse_qs(urlsplit(response.headers["Location"]).query)
        assert returned["state"] == [state]
        self.verifier = verifier
        return self.secret(returned["code"][0])

    def session_cookie(self) -> None:
        cookie = self.secret(self.agent.cookies["tokensvc_session"].strip('"'))
        # Tornado's signed value: 2|1:0|10:<time>|<n>:<name>|<n>:<base64 session id>|<signature>
        encoded = cookie.split("|")[4].split(":", 1)[1]
        self.secret(encoded)
        self.secret(base64.b64decode(encoded).decode())

    def exchange(self, client_id: str, code: str, auth: tuple[str, str] | None = None) -> dict:
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": NOWHERE[client_id],
                "code_verifier": self.verifier}
        if auth is None:
            form["client_id"] = client_id
        response = requests.post(self.base + "/oauth/token", data=form, auth=auth)
        assert response.status_code == 200, response.text
        tokens = response.json()
        self.secret(tokens["access_token"])
        self.secret(tokens["refresh_token"])
        return tokens


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_no_secret_reaches_any_log_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENSVC_LOG_LEVEL", "debug")
    service = start_service(tmp_path, extra=ROOT)
    base = service.base
    port = int(base.rsplit(":", 1)[1])
    flows = Flows(base)
    webapp = ("webapp", WEBAPP_SECRET)
    try:
        # First-party sign-in (a wrong password first), the exchange, a wrong client secret.
        tokens = flows.exchange("webapp", flows.authorize("webapp", "read write"), auth=webapp)
        bad = requests.post(base + "/oauth/token/introspect", data={"token": tokens["access_token"]},
                            auth=("webapp", flows.secret("wrong-secret-" + secrets.token_hex(8))))
        assert bad.status_code == 401
        # Refresh, introspection, the API with a bearer token and (refused) in the query.
        refreshed = requests.post(base + "/oauth/token/refresh", data={"refresh_token": tokens["refresh_token"]},
                                  auth=webapp).json()
        flows.secret(refreshed["access_token"])
        flows.secret(refreshed["refresh_token"])
        assert requests.post(base + "/oauth/token/introspect", data={"token": refreshed["access_token"]},
                             auth=webapp).json()["active"] is True
        bearer = {"Authorization": "Bearer " + refreshed["access_token"]}
        assert requests.get(base + "/v1/me", headers=bearer).status_code == 200
        requests.get(base + "/v1/me?access_token=" + refreshed["access_token"])
        # The token under every spelling a parser may read as a token parameter's, and under a
        # name no rule knows (its shape withholds it).
        for name in ("ACCESS_TOKEN", "access_token%00", "access_token%20", "Access%5FToken", "TOKEN", "t"):
            requests.get(f"{base}/v1/me?{name}={refreshed['access_token']}")
            requests.post(f"{base}/oauth/revoke?x=1&{name}={refreshed['refresh_token']}")
        # The WebSocket, its token in the query; and a plain GET of it, which is no upgrade.
        async def socket_round() -> None:
            connection = await websocket_connect(f"ws://127.0.0.1:{port}/v1/ws?access_token={refreshed['access_token']}")
            await connection.read_message()
            connection.close()
        asyncio.run(socket_round())
        requests.get(base + "/v1/ws?access_token=" + refreshed["access_token"])
        # Consent for a third-party public client; its refresh token rotated, then the old one reused.
        sky = flows.exchange("skyplanner", flows.authorize("skyplanner", "read"))
        rotated = requests.post(base + "/oauth/token/refresh",
                                data={"refresh_token": sky["refresh_token"], "client_id": "skyplanner"}).json()
        flows.secret(rotated["access_token"])
        flows.secret(rotated["refresh_token"])
        requests.get(base + "/v1/me", headers={"Authorization": "Bearer " + rotated["access_token"]})  # used
        reuse = requests.post(base + "/oauth/token/refresh",
                              data={"refresh_token": sky["refresh_token"], "client_id": "skyplanner"})
        assert reuse.status_code == 400
        # Pairing an installation; its code replayed; its tokens revoked two ways; an app removed.
        code = flows.authorize("node-agent", "read write", installation_id="backyard-scope")
        node = flows.exchange("node-agent", code)
        replay = requests.post(base + "/oauth/token", data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": NOWHERE["node-agent"],
            "code_verifier": flows.verifier, "client_id": "node-agent"})
        assert replay.status_code == 400
        requests.post(base + "/oauth/token/revoke", data={"token": node["refresh_token"], "client_id": "node-agent"})
        requests.post(base + "/oauth/revoke?token=" + node["access_token"])
        assert requests.delete(base + "/v1/me/connected-apps/webapp", headers=bearer).status_code == 204
        # admin for the command line: the confirmation code its page showed, a wrong one first.
        verifier = flows.secret(secrets.token_urlsafe(48))
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        shown: list[str] = []
        landed = user_agent_authorize(base + "/oauth/authorize?" + urlencode({
            "response_type": "code", "client_id": "tokensvc-cli", "redirect_uri": NOWHERE["tokensvc-cli"],
            "scope": "admin", "state": flows.secret("state-" + secrets.token_hex(8)), "code_challenge": challenge,
            "code_challenge_method": "S256"}), username="root", password=flows.secret("quartz-river-beacon"),
            read=shown.append)
        cli = {"grant_type": "authorization_code", "code": flows.secret(parse_qs(urlsplit(landed).query)["code"][0]),
               "redirect_uri": NOWHERE["tokensvc-cli"], "code_verifier": verifier, "client_id": "tokensvc-cli"}
        for typed in (another_confirmation(shown[0]), shown[0]):
            flows.secret(typed)
            flows.secret(typed.replace("-", ""))
            answer = requests.post(base + "/oauth/token", data={**cli, "confirmation_code": typed})
        assert answer.status_code == 200, answer.text
        flows.secret(answer.json()["access_token"])
        flows.secret(answer.json()["refresh_token"])
        # The sign-out form.
        page = flows.agent.get(base + "/account")
        flows.agent.post(base + "/logout", data=hidden_fields(page.text), allow_redirects=False)
        # Malformed requests, each carrying a secret where Tornado would quote it.
        access = refreshed["access_token"]
        raw(port, b"GET /v1/me HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\x01\r\n\r\n" % access.encode())
        raw(port, b"GET /v1/me?access_token=%s HTTP/1.1 extra\r\nHost: 127.0.0.1\r\n\r\n" % access.encode())
        # A session cookie in Tornado's first signed format, with a bad signature: Tornado warns
        # and quotes it (its base64 session id) in full.
        session = next(v for v in flows.used if v.startswith("2|1:0|"))
        encoded = session.split("|")[4].split(":", 1)[1]
        raw(port, b"GET /account HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                  b"Cookie: tokensvc_session=%s|1700000000|%s\r\n\r\n" % (encoded.encode(), b"0" * 40))
        state = flows.secret("state-" + secrets.token_hex(8)).encode()
        raw(port, b"GET /login?next=/oauth/authorize%%3Fstate%%3D%s HTTP/1.1\r\n"
                  b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n" % state)
    finally:
        output = service.stop()
    # The flows happened, and were logged ...
    for evidence in ("token_issued", "token_refreshed", "code_reuse", "refresh_reuse", "client_auth",
                     "code_confirmation", "Malformed HTTP message", "Invalid cookie signature",
                     "/oauth/revoke?token=***"):
        assert evidence in output, evidence
    # ... and not one of their secrets, nor its hash (what the store holds), nor any hash at all.
    leaked = sorted(value for value in flows.used | hashes_of(flows.used) if value in output)
    assert not leaked, leaked
    assert not DIGEST.search(output), DIGEST.search(output)
