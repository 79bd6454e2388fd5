"""Starting the real service as a process, on a free port, with a generated config."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html as html_module
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import children
import requests
from helpers import confirmation_shown, wait_until

WEBAPP_SECRET = "e2e-webapp-secret-0123456789abcdef"
# Bounds for a hang, not speeds: on a busy 2-core machine a start (the imports, the store)
# takes many times what it takes on an idle one, and a graceful stop drains what is in flight.
START_SECONDS = 60.0
STOP_SECONDS = 30.0


# Ports for processes to listen on are picked below the range the kernel hands to outgoing
# connections (ip_local_port_range, 32768-60999 by default): a port picked there, free when it
# is picked, can become the local end of a connection before the process binds it.
# Under pytest-xdist each worker picks from its own slice of that range, so that workers never
# hand out the same port.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
PORTS = range(20000 + _WORKER, 32768, _WORKERS)
_handed_out: set[int] = set()
_handing = threading.Lock()
_pick = random.Random()


def free_port(*taken: int) -> int:
    """A port free now, other than ``taken`` and never handed out before in this test run (so
    that processes started together, from several threads, never pick the same one)."""
    with _handing:
        while True:
            port = _pick.choice(PORTS)
            if port in taken or port in _handed_out:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port


CONFIG = """
service_name = "tokensvc"
base_url = "{base}"
auth_url = "{base}"
host = "127.0.0.1"
port = {port}
cookie_secret = "e2e-cookie-secret-0123456789abcdef"
{storage}

[scopes]
"observations:write" = "Create and change your observations"

[[clients]]
client_id = "webapp"
name = "Web app"
redirect_uris = ["{callback[webapp]}"]
allowed_scopes = ["read", "write"]
first_party = true
client_secret = "{secret}"

[[clients]]
client_id = "skyplanner"
name = "SkyPlanner"
redirect_uris = ["{callback[skyplanner]}"]
allowed_scopes = ["read", "observations:write"]
description = "Plans your observing nights from your telescope's schedule."
logo_url = "{base}/static/demo-client.svg"
allowed_origins = {sky_origins}

[[clients]]
client_id = "node-agent"
name = "Node installation agent"
redirect_uris = ["{callback[node-agent]}"]
allowed_scopes = ["read", "write"]
first_party = true

[[users]]
username = "alice"
password = "violet-tide-anchor"

[[users]]
username = "bob"
password = "copper-fern-meadow"

[[installations]]
installation_id = "backyard-scope"
name = "Backyard telescope"
kind = "telescope"
operators = ["alice"]
{extra}
"""

# Where each client's redirect_uri points unless a test serves its own callback: ports where
# nothing listens, so a redirect is read from the Location header and never followed.
NOWHERE = {"webapp": "http://127.0.0.1:1/callback", "skyplanner": "http://127.0.0.1:2/callback",
           "node-agent": "http://127.0.0.1:3/paired"}


class Service:
    """A running ``tokensvc serve``; its output goes to a file (a pipe nobody reads would fill
    up and stall the server once it had logged 64 KiB)."""

    def __init__(self, process: subprocess.Popen, base: str, log_path: Path, admin: str,
                 config: Path | None = None) -> None:
        self.process, self.base, self.log_path, self.admin = process, base, log_path, admin
        self.config = config  # the config file it serves, when the harness wrote one

    def output(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> str:
        """SIGTERM (to every worker of ``--processes N`` too), wait until none of them runs
        (SIGKILL past the deadline), and return everything the service printed."""
        end(self.process)
        return self.output()

    def wait_ready(self) -> Service:
        """The service, once ``/readyz`` says its store is prepared (indexes made, configuration
        seeded); ended if it never does."""
        wait_for_http(self.base + "/readyz", self.process, self.output)
        return self

    @property
    def returncode(self) -> int | None:
        return self.process.returncode


def start_service(tmp_path: Path, storage: str = "", *, callback: str | None = None, extra: str = "",
                  env: dict[str, str] | None = None, python: str = sys.executable,
                  cwd: Path | None = None, args: tuple[str, ...] = (), prefix: tuple[str, ...] = ()) -> Service:
    """Start ``tokensvc serve`` on a free port, its admin listener on another. ``callback`` (a
    base URL) gives every client the redirect_uri ``{callback}/{client_id}``; ``extra`` is
    appended to the config file; ``env`` adds to the environment; ``python`` and ``cwd`` run
    another release (tests/upgrade); ``args`` are added to the command (``--processes N``:
    its workers are of the service's process group, which stop() ends whole), and ``prefix``
    runs it through another command (``unshare ...``)."""
    port = free_port()
    admin_port = free_port(port)
    base = f"http://127.0.0.1:{port}"
    redirects = {name: f"{callback}/{name}" for name in NOWHERE} if callback else NOWHERE
    config = tmp_path / "tokensvc.toml"
    # A test's callback server is also SkyPlanner's browser app, whose pages call the service
    # (CORS): its loopback origin is listed, as a browser app on a development machine lists it.
    config.write_text(CONFIG.format(base=base, port=port, secret=WEBAPP_SECRET, storage=storage,
                                    callback=redirects, extra=extra,
                                    sky_origins=f'["{callback}"]' if callback else "[]"))
    log_path = tmp_path / "tokensvc.log"
    with open(log_path, "w") as log:
        process = spawn([*prefix, python, "-m", "tokensvc", "serve", "--config", str(config), *args],
                        stdout=log, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                        env={**os.environ, "TOKENSVC_ADMIN_PORT": str(admin_port), **(env or {})})
    service = Service(process, base, log_path, f"http://127.0.0.1:{admin_port}", config)
    wait_for_http(base + "/healthz", process, service.output)
    return service


DEMO_CONFIG = Path(__file__).resolve().parent.parent / "config" / "tokensvc.toml"


def start_demo(admin_port: int | None = None, config: Path = DEMO_CONFIG,
               **popen: object) -> tuple[subprocess.Popen, str]:
    """``tokensvc serve`` with the demo config as it ships (or ``config``), moved to a free port with
    ``TOKENSVC_PORT`` and its admin listener to ``admin_port`` (default: another free one) with
    ``TOKENSVC_ADMIN_PORT``, and no other TOKENSVC_ variable; returns the process and its base
    URL once it answers."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    environ.update(TOKENSVC_PORT=str(port), TOKENSVC_ADMIN_PORT=str(admin_port or free_port(port)))
    process = spawn([sys.executable, "-m", "tokensvc", "serve", "--config", str(config)], env=environ, **popen)
    wait_for_http(base + "/healthz", process)
    return process, base


def spawn(args: list[str], **popen: object) -> subprocess.Popen:
    """A process in a session (so a process group) of its own: :func:`end` reaches whatever it
    starts in turn, and a signal meant for the test run never reaches it."""
    return subprocess.Popen(args, start_new_session=True, **popen)  # type: ignore[call-overload]


def end(process: subprocess.Popen, grace: float = STOP_SECONDS) -> tuple[Any, Any]:
    """SIGTERM ``process``'s group (it and whatever it started: the workers of ``--processes
    N``), wait until none of it runs, SIGKILL what is left after ``grace`` seconds; returns
    what ``process`` wrote to its pipes (if any), once it is reaped, whatever happened."""
    if process.returncode is not None:  # reaped already (its group's id may be another's by now)
        with contextlib.suppress(subprocess.TimeoutExpired):
            return process.communicate(timeout=grace)  # what it wrote before it ended: why it did
        return None, None
    group, ending = process.pid, time.monotonic() + grace
    try:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        try:
            written = process.communicate(timeout=grace)  # reads the pipes: a full one would stall it
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
            written = process.communicate()
        # The workers drain on their own: the group outlives its leader (and keeps its id)
        # while one of them runs.
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not children.group_running(group), "the workers' end",
                       max(0.0, ending - time.monotonic()))
        return written
    finally:
        if process.returncode is None or children.group_running(group):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
            process.wait()


def wait_for_http(url: str, process: subprocess.Popen, output: Callable[[], str] = lambda: "",
                  deadline: float = START_SECONDS) -> None:
    """Return once GET ``url`` answers 200. Any request error (nothing listening yet, a read
    that timed out on a busy machine, a connection reset) means "not yet"; ``process`` ending
    first, or the deadline passing, is a failure, and ``process`` is ended whatever happens."""
    def answered() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"{process.args} exited with {process.returncode}: {output()}")
        return requests.get(url, timeout=5).status_code == 200

    try:
        wait_until(answered, f"{url} answering 200", deadline, retry=(requests.RequestException,))
    except BaseException:
        end(process, grace=0)
        raise


def hidden_fields(html: str) -> dict[str, str]:
    return {name: html_module.unescape(value)
            for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', html)}


def answer_when_read(agent: requests.Session, url: str, page: str, decision: str = "allow") -> requests.Response:
    """Answer a page where the user decides (POST ``url``) as a person does: once it has been
    shown long enough to be read, which the service asks of an "allow" (handlers/edge/pace.py). The
    moment comes from the page's own form, by this host's clock, the service's."""
    from tokensvc.handlers.edge import pace

    form = {**hidden_fields(page), "decision": decision}
    if pace.FIELD in form:  # (a release before it has none)
        readable = int(form[pace.FIELD].partition(".")[0]) / 1000 + pace.MIN_SECONDS
        time.sleep(max(0.0, readable - time.time()))
    return agent.post(url, data=form, allow_redirects=False, timeout=30)


def user_agent_authorize(authorization_url: str, decision: str = "allow", password: str = "violet-tide-anchor",
                         username: str = "alice", read: Callable[[str], None] | None = None) -> str:
    """Follow the authorization URL as a browser would: sign in, answer the page that asks
    (third-party consent, pairing, or the one-click page of a native app or of admin) with one
    click, and return the final redirect to the client (not followed: the caller decides).
    ``read`` is handed the confirmation code the page shows, if it shows one, before the click
    (the person reads it off the page and types it where the app asks)."""
    agent = requests.Session()
    response = agent.get(authorization_url, allow_redirects=False)
    assert response.status_code == 302 and response.headers["Location"].startswith("/login?next=")
    login_url = urljoin(authorization_url, response.headers["Location"])
    page = agent.get(login_url)
    form = hidden_fields(page.text)
    form.update(username=username, password=password)
    response = agent.post(urljoin(authorization_url, "/login"), data=form, allow_redirects=False)
    assert response.status_code == 302, response.text
    response = agent.get(urljoin(authorization_url, response.headers["Location"]), allow_redirects=False)
    if response.status_code == 200:  # the page where the user decides
        assert 'name="decision" value="allow"' in response.text, response.text
        shown = confirmation_shown(response.text)
        if shown is not None and read is not None:
            read(shown)
        response = answer_when_read(agent, urljoin(authorization_url, "/oauth/authorize"), response.text, decision)
    assert response.status_code == 302, response.text
    return response.headers["Location"]


def access_token(base: str, client_id: str, redirect_uri: str, scope: str, username: str, password: str,
                 secret: str | None = None) -> str:
    """An access token as a client gets one: the code flow with PKCE, the browser played by
    requests (sign-in, and the consent page when the client gets one)."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    url = base + "/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "scope": scope,
        "code_challenge": challenge, "code_challenge_method": "S256"})
    browser = requests.Session()
    sign_in = browser.get(urljoin(url, browser.get(url, allow_redirects=False).headers["Location"]), timeout=10)
    answer = browser.post(base + "/login", data={**hidden_fields(sign_in.text), "username": username,
                                                 "password": password}, allow_redirects=False, timeout=10)
    answer = browser.get(urljoin(url, answer.headers["Location"]), allow_redirects=False, timeout=10)
    shown = None
    if answer.status_code == 200:  # a consent (or pairing) page, the confirmation code it shows
        shown = confirmation_shown(answer.text)
        answer = answer_when_read(browser, base + "/oauth/authorize", answer.text)
    code = parse_qs(urlsplit(answer.headers["Location"]).query)["code"][0]
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
            "code_verifier": verifier, "client_id": client_id, **({"client_secret": secret} if secret else {}),
            **({"confirmation_code": shown} if shown else {})}
    issued = requests.post(base + "/oauth/token", data=form, timeout=10)
    assert issued.status_code == 200, issued.text
    return issued.json()["access_token"]
