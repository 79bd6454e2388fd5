"""Test helpers: the test configuration, a controllable clock, and a small browser-like
driver of the authorization flow over real HTTP (cookies, XSRF tokens, redirects)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import html as html_module
import re
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from marshmallow import Schema
from tornado.httpclient import AsyncHTTPClient, HTTPResponse

from tokensvc import config as config_module
from tokensvc import schemas
from tokensvc.oauth import pkce

VERIFIER = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
CHALLENGE = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"

WEBAPP_SECRET = "webapp-test-secret-0123456789abcdef"
PARTNER_SECRET = "partner-test-secret-0123456789abcdef"
WEBAPP_REDIRECT = "http://127.0.0.1:8080/callback"
SKY_REDIRECT = "http://127.0.0.1:9000/callback"
PARTNER_REDIRECT = "https://partner.example/cb"
NODE_REDIRECT = "http://127.0.0.1:8765/paired"
CLI_REDIRECT = "http://127.0.0.1:53817/callback"  # tokensvc login's loopback port

# scrypt hashes of "alice-password", "bob-password" and "root-password", computed once so
# that seeding a fresh store per test costs nothing.
PASSWORD_HASHES = {
    "alice": "scrypt$16384$8$1$4pgpzRgnB5m5X4DyolsTdQ==$rAnorOvHi7+Odq5pp2P6c0/24oPV4G0bm3SIbMzpnag=",
    "root": "scrypt$16384$8$1$3FJVbMSrexvkAxG8iKMd0g==$v+8BeGLUAj7LR2SEVfqw/dvFFV1TNvcz9WwG9TSbV2M=",
}
PASSWORDS = {"alice": "alice-password", "root": "root-password"}


DIGEST = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")  # a SHA-256 digest in hex: a stored hash


ROOT = Path(__file__).resolve().parent.parent


def source_copy(destination: Path) -> Path:
    """What deploy/Dockerfile's build stage copies from the repository (the package and its
    packaging files), copied to ``destination``: a wheel is built there, as the image builds
    it, and never in the repository, which other tests read at the same time."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        shutil.copy2(ROOT / name, destination / name)
    shutil.copytree(ROOT / "tokensvc", destination / "tokensvc")
    return destination


def hashes_of(secrets: set[str]) -> set[str]:
    """Each secret's hash as the store keeps it (hex; a refresh token's family id is the hash of
    its first part), and its 32 bytes as Python prints them: none may reach a log line."""
    found = set()
    for value in secrets:
        for part in {value, value.split(".")[0]}:
            digest = hashlib.sha256(part.encode()).hexdigest()
            found |= {digest, repr(bytes.fromhex(digest))}
    return found


def make_config(**overrides: Any) -> config_module.Settings:
    raw: dict[str, Any] = {
        "service_name": "tokensvc",
        "base_url": "http://127.0.0.1:8080",
        "auth_url": "http://127.0.0.1:8080",
        "cookie_secret": "test-cookie-secret-0123456789abcdef",
        "clients": [
            {"client_id": "webapp", "name": "Web app", "redirect_uris": [WEBAPP_REDIRECT],
             "allowed_scopes": ["read", "write", "connected-apps:write", "admin"], "first_party": True,
             "client_secret": WEBAPP_SECRET, "description": "The official web app"},
            {"client_id": "skyplanner", "name": "SkyPlanner", "redirect_uris": [SKY_REDIRECT],
             "allowed_scopes": ["read", "observations:write"], "first_party": False,
             "description": "Plans your observing nights", "logo_url": "https://skyplanner.example/logo.png"},
            {"client_id": "partner", "name": "Partner service", "redirect_uris": [PARTNER_REDIRECT],
             "first_party": False, "client_secret": PARTNER_SECRET},
            {"client_id": "node-agent", "name": "Node agent", "redirect_uris": [NODE_REDIRECT],
             "allowed_scopes": ["read", "write"], "first_party": True},
        ],
        "scopes": {"observations:write": "Create and change your observations"},
        "users": [
            {"username": "alice", "password_hash": PASSWORD_HASHES["alice"]},
            {"username": "root", "password_hash": PASSWORD_HASHES["root"], "admin": True},
        ],
        "installations": [
            {"installation_id": "backyard-scope", "name": "Backyard telescope", "kind": "telescope",
             "operators": ["alice"]},
        ],
    }
    raw.update(overrides)
    return config_module.from_dict(raw)


def handed_over(config: config_module.Settings) -> config_module.Settings:
    """``config`` without its ``[[clients]]``, ``[[users]]`` and ``[[installations]]``: the
    settings of a service whose store holds what ``config`` seeded but whose file names none of
    it any more, so that the entries are the admin API's to change (docs/guide/administration.md,
    "Who owns an entry"). The tests of what the admin API does to an entry use it; a file's own
    entries are refused (tests/test_ownership.py). The store marks what a file wrote until a
    start whose file names it no more: :func:`hand_over` is that start."""
    return dataclasses.replace(config, clients=(), users=(), installations=())


async def hand_over(store, config: config_module.Settings) -> config_module.Settings:
    """A start with :func:`handed_over`'s file on ``store``, which ``config`` seeded: the store's
    marks of the entries ``config`` names are cleared, and they are the admin API's from then
    on. Its settings."""
    from tokensvc.bootstrap import seed

    await seed(store, handed_over(config))
    return handed_over(config)


# Seconds after a rotation past which a presentation of the rotated-out token is no longer
# taken as concurrent with it (tokensvc.oauth.successors.CONCURRENT_SECONDS).
PAST_CONCURRENT = 3


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        from tokensvc.records import utcnow

        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


# A wait's deadline: a bound for a hang, not a speed (on a busy 2-core machine a step takes many
# times what it takes on an idle one).
DEADLINE = 30.0


@asynccontextmanager
async def relaying(store: Any, revocation_events: Any, **options: Any) -> AsyncIterator[None]:
    """This process's relay (:func:`tokensvc.oauth.events.relay`) running on ``store`` for the
    block, then cancelled and awaited: its poll ended, not left to the collector."""
    from tokensvc.oauth import events

    relay = asyncio.ensure_future(events.relay(store, revocation_events, **options))
    try:
        yield
    finally:
        relay.cancel()
        await asyncio.gather(relay, return_exceptions=True)


async def eventually(predicate: Any, seconds: float = DEADLINE, what: str = "the condition") -> None:
    """Wait until ``predicate()`` (a function, or a coroutine function) holds: the event a
    test waits for, with a deadline, never a fixed sleep."""
    import asyncio
    import inspect
    import time

    deadline = time.monotonic() + seconds
    while True:
        held = predicate()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds:g} s"
        await asyncio.sleep(0.02)


def wait_until(condition: Callable[[], Any], what: str = "the condition", seconds: float = DEADLINE,
               retry: tuple[type[BaseException], ...] = (), interval: float = 0.05) -> Any:
    """The same, blocking (for a process, a server in a thread: anything outside an event
    loop), returning the first true value of ``condition()``. An exception of ``retry`` (a
    request's: the server is busy or not listening yet) means "not yet"; the last one is
    chained to the AssertionError at the deadline."""
    import time

    deadline = time.monotonic() + seconds
    last: BaseException | None = None
    while True:
        try:
            value = condition()
        except retry as exc:
            value, last = None, exc
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {seconds:g} s") from last
        time.sleep(interval)


def serve_refusal(settings: Any, seconds: float = 20.0) -> str:
    """The one line ``tokensvc serve`` stops with on these settings (start-up refused), run in
    this process on a listening socket of its own."""
    import asyncio
    import socket

    import pytest

    from tokensvc.cli import main as cli

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        with pytest.raises(cli.CommandError) as stopped:
            asyncio.run(asyncio.wait_for(cli.serve(settings, cli.Listeners([sock], [])), seconds))
    return str(stopped.value)


def basic(client_id: str, secret: str) -> str:
    return "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()


def json_of(response: HTTPResponse) -> Any:
    import json

    return json.loads(response.body)


def check_schema(schema: Schema, body: Any) -> Any:
    """Assert that ``body`` is exactly what ``schema`` describes (no field missing or extra)."""
    errors = schema.validate(body)
    assert errors == {}, errors
    return body


def check_validation_error(response: HTTPResponse, loc: list[str], type_: str) -> dict[str, Any]:
    assert response.code == 422, response.body
    body = check_schema(schemas.http_validation_error, json_of(response))
    matching = [item for item in body["detail"] if item["loc"] == loc]
    assert matching, body
    assert matching[0]["type"] == type_, body
    assert set(matching[0]) == {"loc", "msg", "type", "input", "ctx"}
    return matching[0]


def check_oauth_error(response: HTTPResponse, status: int, error: str) -> dict[str, Any]:
    assert response.code == status, response.body
    body = check_schema(schemas.OAuthErrorSchema(), json_of(response))
    assert body["error"] == error, body
    return body


def query_of(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}


def confirmation_shown(html: str) -> str | None:
    """The confirmation code a page shows (``K7QM-3XPD``: oauth/confirmation.py), as a person
    reads it off the page; None when it shows none."""
    found = re.search(r'<p class="code"><code>([0-9A-Z]{4}-[0-9A-Z]{4})</code></p>', html)
    return found[1] if found else None


@dataclass
class Browser:
    """Drives the HTML side of the service the way a user agent does; with the service's
    ``clock``, a person who reads a page before answering it (handlers/edge/pace.py)."""

    client: AsyncHTTPClient
    base_url: str
    clock: Clock | None = None
    cookies: dict[str, str] = field(default_factory=dict)
    address: str | None = None  # the loopback address it connects from (127.0.0.0/8), if not the default
    confirmation: str | None = None  # the confirmation code the last page answered showed

    async def fetch(self, path: str, method: str = "GET", body: dict[str, str] | None = None,
                    headers: dict[str, str] | None = None) -> HTTPResponse:
        all_headers = dict(headers or {})
        if self.cookies:
            all_headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        url = path if path.startswith("http") else self.base_url + path
        response = await self.client.fetch(
            url, method=method, body=urlencode(body) if body is not None else None,
            headers=all_headers, follow_redirects=False, raise_error=False, network_interface=self.address)
        for header in response.headers.get_list("Set-Cookie"):
            jar = SimpleCookie()
            jar.load(header)
            for name, morsel in jar.items():
                if morsel["expires"] and "1970" in morsel["expires"] or morsel.value == "":
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return response

    @staticmethod
    def form_fields(html: str) -> dict[str, str]:
        return {name: html_module.unescape(value)
            for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', html)}

    async def xsrf(self) -> str:
        if "_xsrf" not in self.cookies:
            await self.fetch("/login")
        return self.cookies["_xsrf"]

    async def login(self, username: str, password: str | None = None, next_path: str = "/") -> HTTPResponse:
        page = await self.fetch("/login?" + urlencode({"next": next_path}))
        assert page.code == 200
        return await self.fetch("/login", "POST", {
            "username": username, "password": password or PASSWORDS[username],
            "next": next_path, "_xsrf": self.cookies["_xsrf"]})

    async def authorize(self, client_id: str, redirect_uri: str, *, scope: str | None = None,
                        state: str = "st4te", challenge: str = CHALLENGE, method: str = "S256",
                        **extra: str) -> HTTPResponse:
        params = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri,
                  "state": state, "code_challenge": challenge, "code_challenge_method": method, **extra}
        if scope is not None:
            params["scope"] = scope
        return await self.fetch("/oauth/authorize?" + urlencode(params))

    async def decide(self, consent_page: HTTPResponse, decision: str) -> HTTPResponse:
        """Answer a page where the user decides, once it was shown long enough to be read."""
        from tokensvc.handlers.edge import pace

        fields = self.form_fields(consent_page.body.decode())
        fields["decision"] = decision
        self.confirmation = confirmation_shown(consent_page.body.decode())
        if self.clock is not None:
            self.clock.advance(pace.REVEAL_SECONDS)
        return await self.fetch("/oauth/authorize", "POST", fields)

    async def code_for(self, client_id: str, redirect_uri: str, user: str = "alice", **kwargs: Any) -> str:
        """Sign in (if needed), authorize (approving consent), and return the code."""
        if not any(name.endswith("_session") for name in self.cookies):
            await self.login(user)
        response = await self.authorize(client_id, redirect_uri, **kwargs)
        if response.code == 200:  # a consent page
            response = await self.decide(response, "allow")
        assert response.code == 302, response.body
        location = response.headers["Location"]
        assert location.startswith(redirect_uri), location
        return query_of(location)["code"]


async def exchange(client: AsyncHTTPClient, base_url: str, code: str, *, client_id: str = "webapp",
                   secret: str | None = WEBAPP_SECRET, redirect_uri: str = WEBAPP_REDIRECT,
                   verifier: str | None = VERIFIER, use_basic: bool = True,
                   confirmation: str | None = None) -> HTTPResponse:
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri}
    if verifier is not None:
        form["code_verifier"] = verifier
    if confirmation is not None:
        form["confirmation_code"] = confirmation
    headers = {}
    if secret is not None and use_basic:
        headers["Authorization"] = basic(client_id, secret)
    else:
        form["client_id"] = client_id
        if secret is not None:
            form["client_secret"] = secret
    return await client.fetch(base_url + "/oauth/token", method="POST", body=urlencode(form),
                              headers=headers, raise_error=False)


async def post_form(client: AsyncHTTPClient, url: str, form: dict[str, str],
                    headers: dict[str, str] | None = None) -> HTTPResponse:
    return await client.fetch(url, method="POST", body=urlencode(form), headers=headers or {},
                              raise_error=False)


async def family_of(store: Any, token: str) -> Any:
    """The family record a token (access or refresh) belongs to, or None; read straight from
    the store, whatever the token's state."""
    from tokensvc.oauth import hashing, tokens

    if tokens.is_refresh_format(token):
        return (await store.get_family(tokens.family_id(token.split(tokens.SEPARATOR)[0])))[0]
    return (await store.find_access(hashing.digest(token)))[0]


async def delete_client_by_hand(store: Any, client_id: str) -> None:
    """A client's document and previous secret deleted around its removal, as nothing of this
    release does (0.9.0's removal cut short after its deletion, a hand in the database): the
    store's own collections, memory's or MongoDB's."""
    if hasattr(store, "registry"):
        await store.registry.clients.delete_one({"_id": client_id})
        await store.registry.previous_secrets.delete_one({"_id": client_id})
    else:
        store._clients.pop(client_id, None)
        store._previous_secrets.pop(client_id, None)


def new_verifier() -> tuple[str, str]:
    import secrets

    verifier = secrets.token_urlsafe(48)
    return verifier, pkce.s256(verifier)


async def issue_tokens(ctx: Any, username: str, scope: str, client_id: str = "webapp",
                       redirect_uri: str = WEBAPP_REDIRECT) -> Any:
    """A token response for ``username`` through the protocol core (an authorization the user
    allowed, its code redeemed, with the confirmation code its page showed where it needs
    one), without HTTP: for tests of what a token opens."""
    from tokensvc.oauth import authorization, confirmation, grants

    args = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "state": "s",
            "code_challenge": CHALLENGE, "code_challenge_method": "S256", "scope": scope}
    request = await authorization.validate(ctx, {name: [value] for name, value in args.items()})
    subject, _ = await authorization.resolve_subject(ctx, request, await ctx.store.get_user_by_username(username))
    shown = (confirmation.new() if authorization.needs_confirmation(request.client, request.redirect_uri,
                                                                    request.scopes) else None)
    code = (await authorization.issue_code(ctx, request, subject, shown)).split("code=")[1].split("&")[0]
    return await grants.exchange_code(ctx, await ctx.store.get_client(client_id), code, redirect_uri, VERIFIER,
                                      shown)


async def confirmed_code(ctx: Any, username: str = "root", client_id: str = "tokensvc-cli",
                         redirect_uri: str = CLI_REDIRECT, scope: str = "admin") -> tuple[str, str]:
    """A code ``username`` allowed on the page of an authorization that would grant admin to a
    native app, through the protocol core, and the confirmation code that page showed."""
    from tokensvc.oauth import authorization

    args = {name: [value] for name, value in {
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "state": "s",
        "code_challenge": CHALLENGE, "code_challenge_method": "S256", "scope": scope}.items()}
    user = await ctx.store.get_user_by_username(username)
    page = await authorization.decide(ctx, args, user)
    assert page.confirmation is not None, page
    issued = await authorization.decide(ctx, args, user, "allow", page.confirmation)
    return query_of(issued.location)["code"], page.confirmation


def another_confirmation(shown: str) -> str:
    """A confirmation code that is not ``shown``: its last character changed."""
    from tokensvc.oauth import confirmation

    last = confirmation.ALPHABET[(confirmation.ALPHABET.index(shown[-1]) + 1) % len(confirmation.ALPHABET)]
    return shown[:-1] + last
