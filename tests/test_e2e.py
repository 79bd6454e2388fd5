"""End to end: the real service started as a process, driven by an unmodified OAuth client
library (Authlib's ``OAuth2Session``, S256 PKCE) and a requests-based user agent."""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from authlib.common.security import generate_token
from authlib.integrations.requests_client import OAuth2Session
from helpers import wait_until
from service import WEBAPP_SECRET, free_port, start_service, user_agent_authorize

from tokensvc.cli import main as cli

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    service = start_service(tmp_path_factory.mktemp("e2e"))
    yield service.base
    output = service.stop()
    # The service logs no secret, and shuts down cleanly on SIGTERM.
    assert WEBAPP_SECRET not in output and "violet-tide-anchor" not in output
    assert service.returncode == 0, output


def run_full_flow(base: str, client: OAuth2Session, scope: str) -> None:
    verifier = generate_token(64)
    url, state = client.create_authorization_url(base + "/oauth/authorize", code_verifier=verifier)
    callback = user_agent_authorize(url)
    assert parse_qs(urlsplit(callback).query)["state"] == [state]

    token = client.fetch_token(base + "/oauth/token", authorization_response=callback, code_verifier=verifier)
    assert token["token_type"] == "Bearer" and token["scope"] == scope and token["expires_in"] == 3600

    refreshed = client.refresh_token(base + "/oauth/token/refresh")
    assert refreshed["refresh_token"] != token["refresh_token"]
    assert refreshed["access_token"] != token["access_token"]

    introspector = OAuth2Session("webapp", WEBAPP_SECRET)
    info = introspector.introspect_token(base + "/oauth/token/introspect", token=refreshed["access_token"]).json()
    assert info["active"] is True and info["username"] == "alice" and info["scope"] == scope
    assert info["client_id"] == client.client_id

    # The rotated-out refresh token is dead.
    old = introspector.introspect_token(base + "/oauth/token/introspect", token=token["refresh_token"]).json()
    assert old == {"active": False}

    revoked = client.revoke_token(base + "/oauth/token/revoke", token=refreshed["refresh_token"],
                                  token_type_hint="refresh_token")
    assert revoked.status_code == 200 and revoked.json() == {}
    for dead in (refreshed["refresh_token"], refreshed["access_token"]):
        info = introspector.introspect_token(base + "/oauth/token/introspect", token=dead).json()
        assert info == {"active": False}


def test_first_party_confidential_client_flow(service):
    client = OAuth2Session("webapp", WEBAPP_SECRET, scope="read write", redirect_uri="http://127.0.0.1:1/callback",
                           code_challenge_method="S256", token_endpoint_auth_method="client_secret_basic")
    run_full_flow(service, client, "read write")


def test_third_party_public_client_flow_through_consent(service):
    client = OAuth2Session("skyplanner", None, scope="read", redirect_uri="http://127.0.0.1:2/callback",
                           code_challenge_method="S256", token_endpoint_auth_method="none")
    run_full_flow(service, client, "read")


def test_third_party_client_denied(service):
    client = OAuth2Session("skyplanner", None, scope="read", redirect_uri="http://127.0.0.1:2/callback",
                           code_challenge_method="S256", token_endpoint_auth_method="none")
    verifier = generate_token(64)
    url, state = client.create_authorization_url(service + "/oauth/authorize", code_verifier=verifier)
    callback = user_agent_authorize(url, decision="deny")
    query = parse_qs(urlsplit(callback).query)
    assert query["error"] == ["access_denied"] and query["state"] == [state]
    assert "code" not in query
    with pytest.raises(Exception, match="access_denied|code"):
        client.fetch_token(service + "/oauth/token", authorization_response=callback, code_verifier=verifier)


def test_metadata_is_usable_by_a_client(service):
    metadata = requests.get(service + "/.well-known/oauth-authorization-server").json()
    assert metadata["token_endpoint"] == service + "/oauth/token"
    assert metadata["code_challenge_methods_supported"] == ["S256"]


def test_service_starts_without_its_database_and_answers_503(tmp_path):
    port = free_port()  # nothing listens there
    storage = (f'[storage]\nbackend = "mongodb"\nmongodb_uri = "mongodb://127.0.0.1:{port}"\n'
               'timeout_ms = 200\n')
    service = start_service(tmp_path, storage)
    base = service.base
    try:
        assert requests.get(base + "/healthz").status_code == 200
        ready = requests.get(base + "/readyz")
        assert ready.status_code == 503 and ready.json()["reason"] == "start-up has not prepared the store yet"
        clients = requests.get(base + "/oauth/clients")
        assert clients.status_code == 503 and set(clients.json()) == {"detail"}
        # Discovery comes from the configuration and the code: it answers without the database.
        metadata = requests.get(base + "/.well-known/oauth-authorization-server")
        assert metadata.status_code == 200 and metadata.json()["issuer"] == base
        assert requests.get(base + "/openapi.json").status_code == 200
        assert requests.head(base + "/.well-known/oauth-authorization-server").status_code == 200
        # Start-up's first try ends when the driver gives up on the server (it waits in steps
        # of half a second): it says so, and tries again.
        wait_until(lambda: "store not ready" in service.output(), "start-up saying the store is not ready")
    finally:
        output = service.stop()
    assert "Traceback" not in output
    assert "store not ready" in output


def test_demo_mode_says_so_and_never_logs_its_generated_secret(tmp_path):
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    from service import end, spawn, wait_for_http

    port = free_port()
    demo = Path(__file__).resolve().parent.parent / "config" / "tokensvc.toml"
    process = spawn([sys.executable, "-m", "tokensvc", "serve", "--config", str(demo), "--port", str(port),
                     "--log-format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    env={**os.environ, "TOKENSVC_ADMIN_PORT": str(free_port())})
    try:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", process)
        requests.post(f"http://127.0.0.1:{port}/oauth/revoke?token=SECRET-TOKEN&code=SECRET-CODE")
    finally:
        out, err = end(process)
    # The JSON log mode writes JSON lines only: the banner is one of them.
    assert out == ""
    entries = [json.loads(line) for line in err.splitlines()]
    messages = [entry["message"] for entry in entries]
    assert any(message.startswith(f"tokensvc is running on http://127.0.0.1:{port}; home page: ")
               for message in messages), messages
    assert any(message.startswith("DEMO MODE: this configuration is for trying tokensvc out") for message in messages)
    assert f"DEMO MODE: {cli.GENERATED_SECRET_NOTICE}" in messages  # the notice, never the secret
    assert not re.search(r"[A-Za-z0-9_-]{40,}", err)  # a generated secret is 43 such characters
    access = [entry["access"] for entry in entries if entry["logger"] == "tokensvc.access"]
    assert access and access[-1]["path"] == "/oauth/revoke?token=***&code=***" and access[-1]["status"] == 200
    assert "SECRET-TOKEN" not in err and "SECRET-CODE" not in err


def test_non_demo_config_without_cookie_secret_refuses_to_start(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "prod.toml"
    config.write_text('demo = false\n[storage]\nbackend = "memory"\n')
    result = subprocess.run([sys.executable, "-m", "tokensvc", "serve", "--config", str(config)],
                            capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 1
    assert result.stderr.startswith("tokensvc: cookie_secret: required outside demo mode")
    assert "Traceback" not in result.stderr
