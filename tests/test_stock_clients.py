"""Stock OAuth client libraries, unchanged apart from being told where refresh lives.

The spec keeps refresh at ``/oauth/token/refresh`` rather than as a ``refresh_token`` grant of
the token endpoint, and RFC 8414 has no field for a separate refresh endpoint, so a client is
given that URL: Authlib as its ``token_endpoint`` (what its automatic refresh uses) or as the
URL of ``refresh_token(url)``; requests-oauthlib as ``auto_refresh_url``. Access tokens here
live one second, so "expired" is real on both sides: the client sees it, and so does the
service. Each test goes on through rotation and reuse detection.
"""

from __future__ import annotations

import base64
import time
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from authlib.common.security import generate_token
from authlib.integrations.base_client.errors import OAuthError as AuthlibError
from authlib.integrations.requests_client import OAuth2Session as AuthlibSession
from helpers import wait_until
from requests_oauthlib import OAuth2Session as RequestsOAuthSession
from service import NOWHERE, WEBAPP_SECRET, start_service, user_agent_authorize

pytestmark = pytest.mark.e2e

ACCESS_TTL = 1


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    service = start_service(tmp_path_factory.mktemp("stock"), extra=f"[tokens]\naccess_ttl = {ACCESS_TTL}\n")
    yield service.base
    service.stop()


def wait_until_expired(base: str, token: dict) -> None:
    """Until the access token has expired for both sides: the library (past the ``expires_at``
    it keeps; oauthlib rounds it to whole seconds) and the service (introspection says inactive)."""
    wait_until(lambda: time.time() > round(float(token["expires_at"]))
               and not introspect(base, token["access_token"])["active"],
               "the access token expired", retry=(requests.RequestException,))


def introspect(base: str, token: str) -> dict:
    return requests.post(base + "/oauth/token/introspect", data={"token": token},
                         auth=("webapp", WEBAPP_SECRET)).json()


# -- Authlib ----------------------------------------------------------------------------


def authlib_session(base: str, client_id: str, saved: list[dict]) -> AuthlibSession:
    """Authlib's session as its documentation sets it up; ``token_endpoint`` is the refresh URL."""
    secret = WEBAPP_SECRET if client_id == "webapp" else None
    return AuthlibSession(client_id, secret, scope="read", redirect_uri=NOWHERE[client_id],
                          code_challenge_method="S256",
                          token_endpoint_auth_method="client_secret_basic" if secret else "none",
                          token_endpoint=base + "/oauth/token/refresh",
                          update_token=lambda token, refresh_token=None, access_token=None: saved.append(token))


def authlib_sign_in(base: str, session: AuthlibSession) -> dict:
    verifier = generate_token(64)
    url, _state = session.create_authorization_url(base + "/oauth/authorize", code_verifier=verifier)
    callback = user_agent_authorize(url)
    return session.fetch_token(base + "/oauth/token", authorization_response=callback, code_verifier=verifier)


@pytest.mark.parametrize("client_id", ["webapp", "skyplanner"])
def test_authlib_refreshes_explicitly_and_automatically(service, client_id):
    saved: list[dict] = []
    session = authlib_session(service, client_id, saved)
    first = authlib_sign_in(service, session)

    # Explicit: refresh_token(url) at the refresh endpoint rotates the pair.
    second = session.refresh_token(service + "/oauth/token/refresh")
    assert second["refresh_token"] != first["refresh_token"] and second["access_token"] != first["access_token"]

    # Automatic: once the access token has expired, the next request renews it first.
    wait_until_expired(service, second)
    assert requests.get(service + "/v1/me", headers={"Authorization": f"Bearer {second['access_token']}"}
                        ).status_code == 401  # the service agrees it has expired
    me = session.get(service + "/v1/me")
    assert me.status_code == 200 and me.json()["username"] == "alice"
    assert saved and saved[-1]["refresh_token"] == session.token["refresh_token"] != second["refresh_token"]

    # Reuse detection: a rotated-out refresh token revokes the whole grant.
    with pytest.raises(AuthlibError) as reused:
        session.refresh_token(service + "/oauth/token/refresh", refresh_token=second["refresh_token"])
    assert reused.value.error == "invalid_grant"
    assert introspect(service, session.token["refresh_token"]) == {"active": False}


def test_authlib_pointed_at_the_token_endpoint_is_told_where_refresh_is(service):
    session = authlib_session(service, "skyplanner", [])
    authlib_sign_in(service, session)
    with pytest.raises(AuthlibError) as wrong:
        session.refresh_token(service + "/oauth/token")
    assert wrong.value.error == "unsupported_grant_type"
    assert "/oauth/token/refresh" in wrong.value.description
    assert session.refresh_token(service + "/oauth/token/refresh")["access_token"]


# -- requests-oauthlib --------------------------------------------------------------------


@pytest.fixture
def insecure_transport(monkeypatch):
    # oauthlib refuses plain http unless told this is a local test (its documented switch).
    monkeypatch.setenv("OAUTHLIB_INSECURE_TRANSPORT", "1")


@pytest.mark.usefixtures("insecure_transport")
@pytest.mark.parametrize("client_id", ["webapp", "skyplanner"])
def test_requests_oauthlib_refreshes_explicitly_and_automatically(service, client_id):
    secret = WEBAPP_SECRET if client_id == "webapp" else None
    credentials = {"client_id": client_id, **({"client_secret": secret} if secret else {})}
    saved: list[dict] = []
    session = RequestsOAuthSession(client_id, redirect_uri=NOWHERE[client_id], scope=["read"], pkce="S256",
                                   auto_refresh_url=service + "/oauth/token/refresh",
                                   auto_refresh_kwargs=credentials, token_updater=saved.append)
    url, state = session.authorization_url(service + "/oauth/authorize")
    callback = user_agent_authorize(url)
    assert parse_qs(urlsplit(callback).query)["state"] == [state]
    first = session.fetch_token(service + "/oauth/token", authorization_response=callback,
                                include_client_id=True, client_secret=secret)
    assert first["token_type"] == "Bearer" and first["scope"] == ["read"]

    # Explicit: refresh_token(url).
    second = session.refresh_token(service + "/oauth/token/refresh")
    assert second["refresh_token"] != first["refresh_token"]

    # Automatic: an expired token is renewed on the next request, and handed to token_updater.
    wait_until_expired(service, second)
    me = session.get(service + "/v1/me")
    assert me.status_code == 200 and me.json()["clientId"] == client_id
    assert saved and saved[-1]["refresh_token"] not in (first["refresh_token"], second["refresh_token"])

    # Reuse detection through the same library.
    from oauthlib.oauth2.rfc6749.errors import InvalidGrantError

    with pytest.raises(InvalidGrantError):
        session.refresh_token(service + "/oauth/token/refresh", refresh_token=second["refresh_token"])
    assert introspect(service, saved[-1]["refresh_token"]) == {"active": False}


@pytest.mark.usefixtures("insecure_transport")
def test_requests_oauthlib_as_a_public_client_is_never_refused_by_a_limit(tmp_path):
    """requests-oauthlib, left to its defaults, authenticates a public client with HTTP Basic and
    an empty secret (``Basic base64("skyplanner:")``): that is a public client naming itself,
    with nothing to guess, and an address over its failure limit does not refuse it (it was
    counted as a short hand-set secret: 429)."""
    service = start_service(tmp_path, extra="[limits]\nfailed_client_auth_per_address = 3\n")
    try:
        wrong = [requests.post(service.base + "/oauth/token/introspect", data={"token": "x"},
                               auth=("webapp", "a-wrong-secret")).status_code for _ in range(4)]
        assert wrong == [401, 401, 401, 429]  # this address is over its limit
        session = RequestsOAuthSession("skyplanner", redirect_uri=NOWHERE["skyplanner"], scope=["read"],
                                       pkce="S256")
        url, _state = session.authorization_url(service.base + "/oauth/authorize")
        callback = user_agent_authorize(url)
        sent = []
        session.hooks["response"].append(lambda answer, *args, **kwargs: sent.append(answer.request.headers))
        token = session.fetch_token(service.base + "/oauth/token", authorization_response=callback)
        assert sent[-1]["Authorization"] == "Basic " + base64.b64encode(b"skyplanner:").decode()
        assert token["scope"] == ["read"] and token["access_token"]
    finally:
        service.stop()
