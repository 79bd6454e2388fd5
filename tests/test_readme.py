"""The command blocks of the README and of the pages it sends readers to run as written, against
the demo configuration: the README's two commands and its flow by hand, the client guide's stock
clients, the command line's sign-in, the gate guide's registration, and every block of the
resource-server guide (tests/docblocks.py says how a block is read and which test runs it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docblocks import blocks, section_text
from service import end, start_demo

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


README = "README.md"
CLIENTS = "docs/guide/clients.md"
COMMAND_LINE = "docs/reference/command-line.md"
RESOURCE_SERVERS = "docs/guide/resource-servers.md"


def test_the_readme_starts_with_its_two_commands_and_stays_short():
    """What a reader sees first: ``make run`` and ``make test``, the Makefile's targets (``make
    test`` is what CI runs, .ci/run); the README at most 150 lines and 12 KB, the rest in docs/."""
    readme = (ROOT / README).read_text()
    first = blocks(README, "sh", "tokensvc")
    assert readme.startswith("# tokensvc\n\n```sh\n" + first[0] + "```\n") and len(first) == 1
    assert [line.split()[:2] for line in first[0].splitlines()] == [["make", "run"], ["make", "test"]]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert len(readme.splitlines()) <= 150 and len(readme.encode()) <= 12 * 1024


def test_make_run_serves_the_demo_as_the_readme_says():
    """``make run``, as the README's first block writes it, moved to free ports with
    TOKENSVC_PORT as the README says: the demo answers, on its release."""
    import requests
    from service import free_port, spawn, wait_for_http

    command = blocks(README, "sh", "tokensvc")[0].splitlines()[0].split("#")[0].strip()
    assert command == "make run"
    port = free_port()
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    environ.update(TOKENSVC_PORT=str(port), TOKENSVC_ADMIN_PORT=str(free_port(port)))
    process = spawn(["bash", "-euo", "pipefail", "-c", command], cwd=ROOT, env=environ,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", process)
        from tokensvc import __version__

        health = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json()
        assert health == {"status": "ok", "version": __version__}, health
        clients = {client["clientId"] for client in
                   requests.get(f"http://127.0.0.1:{port}/oauth/clients", timeout=10).json()}
        assert {"webapp", "skyplanner", "node-agent", "notes-api"} <= clients, clients
    finally:
        end(process)


def hand_run_blocks() -> list[str]:
    """The README's flow by hand: steps 1 to 3 (a token in $ACCESS), then 4 and 5."""
    found = blocks(README, "sh", "A whole flow by hand")
    assert len(found) == 2, found
    return found


def hand_run_flow() -> str:
    return "".join(hand_run_blocks())


@pytest.fixture
def demo_service():
    process, base = start_demo(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield base
    end(process)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the README's flow uses curl")
def test_the_hand_run_flow_runs_as_written(demo_service):
    bin_dir = str(Path(sys.executable).parent)  # the flow's python3 is whatever is on PATH
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", hand_run_flow()], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "BASE": demo_service,
                                             "PATH": bin_dir + os.pathsep + os.environ["PATH"]})
    assert result.returncode == 0, result.stderr + result.stdout
    lines = result.stdout.splitlines()
    assert lines[0] == "wants access to your account <strong>alice</strong></p>"
    tokens = json.loads(lines[1])
    assert tokens["token_type"] == "Bearer" and tokens["scope"] == "read"
    me = json.loads(lines[2])
    assert me["username"] == "alice" and me["clientId"] == "skyplanner"
    active = json.loads(lines[3])
    assert active["active"] is True and active["client_id"] == "skyplanner"
    assert json.loads(lines[4]) == {}
    assert json.loads(lines[5]) == {"active": False}


def stock_client_programs() -> list[str]:
    """The client guide's programs: Authlib's, then requests-oauthlib's."""
    found = blocks(CLIENTS, "python", "Stock clients")
    assert len(found) == 2, found
    return found


@pytest.mark.parametrize("library", ["authlib", "requests-oauthlib"])
def test_the_stock_client_programs_run_as_written(demo_service, tmp_path, library):
    """Each program of the client guide's "Stock clients", as written: the test plays the browser (sign in
    as alice, allow) and pastes where it landed."""
    from service import user_agent_authorize

    program = stock_client_programs()[["authlib", "requests-oauthlib"].index(library)]
    process = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               env={**os.environ, "BASE": demo_service})
    try:
        assert process.stdout is not None
        prompt = process.stdout.readline()
        assert prompt.startswith("Open this, sign in and allow: "), prompt + process.stderr.read()
        landed = user_agent_authorize(prompt.split(": ", 1)[1].strip(), password="amber-comet-lantern")
        out, err = process.communicate(landed + "\n", timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "'username': 'alice'" in out
    kept = json.loads(next(tmp_path.glob("*-token.json")).read_text())
    assert kept["refresh_token"] and kept["access_token"]


def admin_block() -> str:
    """The command line reference's sign-in and first client, on the demo."""
    (found,) = blocks(COMMAND_LINE, "sh", "Adding a client to the demo")
    return found


def run_as_operator(block: str, tmp_path: Path, config: Path | None = None) -> tuple[subprocess.CompletedProcess, int]:
    """A block that signs in with ``tokensvc login`` and runs commands, against the demo, as the
    operator runs it: in a terminal of its own (a pseudo-terminal, where ``tokensvc login`` asks
    for the confirmation code), with a browser stand-in (BROWSER) that signs in as root with the
    demo's password, as the operator would in the browser tokensvc login opens, and reads the
    confirmation code off the page, which the operator types on the terminal; what it did
    (standard output and error apart) and the admin port. ``config``: another than the demo's."""
    from service import free_port
    from terminal import run_in_terminal

    typed = tmp_path / "typed"
    stand_in = tmp_path / "browser"
    stand_in.write_text(f"#!{sys.executable}\n"
                        "import sys\n"
                        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                        "import requests\n"
                        "from service import user_agent_authorize\n"
                        "landed = user_agent_authorize(sys.argv[1], username='root', password='granite-harbor-ember',\n"
                        f"                              read=open({str(typed)!r}, 'w').write)\n"
                        "requests.get(landed, timeout=10)\n")
    stand_in.chmod(0o755)
    admin_port = free_port()
    process, _ = start_demo(admin_port, **({"config": config} if config else {}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
        bin_dir = str(Path(sys.executable).parent)  # where `make run` installed tokensvc
        environ.update({"BROWSER": str(stand_in), "TOKENSVC_ADMIN_URL": f"http://127.0.0.1:{admin_port}",
                        "TOKENSVC_CREDENTIALS": str(tmp_path / "credentials.json"),
                        "PATH": bin_dir + os.pathsep + os.environ["PATH"]})
        result = run_in_terminal(block, environ, typed, tmp_path)
    finally:
        end(process)
    assert result.returncode == 0, result.stderr + result.stdout
    return result, admin_port


def test_adding_a_client_to_the_running_demo_runs_as_written(tmp_path):
    result, admin_port = run_as_operator(admin_block(), tmp_path)
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"signed in to http://127.0.0.1:{admin_port} as root")
    assert lines[1] == "client_id: dome-camera" and lines[2].startswith("client_secret: ")
    assert "name: Dome camera" in lines and "confidential: yes" in lines


GATE = "docs/guide/gate.md"


def test_registering_the_gates_resource_server_runs_as_written(tmp_path):
    """The gate guide's registration, as written, once signed in as the command line reference
    says, on a deployment that has no notes-api yet (the demo's, without its entry): the
    resource server with the API it declares."""
    import tomllib

    from service import DEMO_CONFIG

    demo = DEMO_CONFIG.read_text()
    entry = '[[clients]]\nclient_id = "notes-api"\nname = "Notes API"\nkind = "resource-server"\n' \
            'client_secret = "notes-api-demo-secret"\n'
    assert demo.count(entry) == 1
    config = tmp_path / "tokensvc.toml"
    config.write_text(demo.replace(entry, ""))
    assert "notes-api" not in {client["client_id"] for client in tomllib.loads(config.read_text())["clients"]}
    (register,) = blocks(GATE, "sh", "Register the gate's resource server")
    lines = admin_block().splitlines()
    sign_in = "\n".join(lines[:lines.index("tokensvc login") + 1])
    result, admin_port = run_as_operator(sign_in + "\n" + register + "tokensvc clients show notes-api --json\n",
                                         tmp_path, config)
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"signed in to http://127.0.0.1:{admin_port} as root")
    assert lines[1] == "client_id: notes-api" and lines[2].startswith("client_secret: ")
    shown = json.loads("\n".join(lines[lines.index("{"):]))
    assert shown["kind"] == "resource-server" and shown["resources"] == ["https://notes.example"], shown


def protecting_blocks(language: str) -> list[str]:
    """The resource-server guide's blocks in ``language``: python, the Tornado, the ASGI and the
    Starlette programs; sh, the registration, the uvicorn command and the calls; toml, the
    demo's entry."""
    found = blocks(RESOURCE_SERVERS, language)
    assert len(found) == {"python": 3, "sh": 3, "toml": 1}[language], found
    return found


def test_the_resource_server_the_readme_shows_is_the_demos():
    """The resource-server guide's entry is the demo's, as it says."""
    import tomllib

    shown = tomllib.loads(protecting_blocks("toml")[0])["clients"]
    demo = tomllib.loads((ROOT / "config" / "tokensvc.toml").read_text())["clients"]
    assert len(shown) == 1 and shown[0] in demo and shown[0]["kind"] == "resource-server"


def test_registering_a_resource_server_runs_as_written(tmp_path):
    """On the demo as it ships: the guide's resource server is not one the demo has."""
    result, admin_port = run_as_operator(protecting_blocks("sh")[0], tmp_path)
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"signed in to http://127.0.0.1:{admin_port} as root")
    assert lines[1] == "client_id: orders-api" and lines[2].startswith("client_secret: ")


def call_the_api(base: str, api: str) -> str:
    """Steps 1 to 3 of the README's flow by hand, then the guide's calls of the API at ``api``, as
    written, in one shell: each answer checked; the access token they used."""
    import requests

    bin_dir = str(Path(sys.executable).parent)  # the flow's python3 is whatever is on PATH
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", hand_run_blocks()[0] + protecting_blocks("sh")[2]],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "BASE": base, "API": api,
                                 "PATH": bin_dir + os.pathsep + os.environ["PATH"]})
    assert result.returncode == 0, result.stderr + result.stdout
    lines = result.stdout.splitlines()
    token, me = json.loads(lines[1])["access_token"], json.loads(lines[2])
    assert [json.loads(line) for line in lines[3:]] == [
        {"notes": [], "for": me["id"]}, {"error_description": "A bearer token is required"},
        {"error": "insufficient_scope", "error_description": "The token lacks the scope write", "scope": "write"}]
    answer = requests.get(api + "/notes", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    return token


def revoked_then_refused(base: str, api: str, token: str) -> None:
    """The guide's revocation (skyplanner's, a public client's) is refused by the API within
    the deadline: the feed dropped the answer."""
    import requests
    from helpers import wait_until

    assert requests.post(base + "/oauth/token/revoke", data={"token": token, "client_id": "skyplanner"},
                         timeout=10).status_code == 200
    wait_until(lambda: requests.get(api + "/notes", headers={"Authorization": f"Bearer {token}"},
                                    timeout=10).status_code == 401, "the revoked token refused")


def test_the_tornado_api_of_protecting_your_api_runs_as_written(demo_service, tmp_path):
    """The Tornado program, as written, against the demo service, called as the guide calls it:
    a token works, none is 401, a scope it lacks is 403, and once revoked the token is refused
    (the feed dropped it). The refused WebSocket handshake's token, in its query, is logged by
    Tornado (a 4xx is a WARNING, written to stderr with no logging configured) masked, never as
    it is; so is the token of a path no handler serves (the application's 404)."""
    import requests
    from service import free_port, spawn

    program = tmp_path / "notes.py"
    program.write_text(protecting_blocks("python")[0])
    port = free_port()
    process = spawn([sys.executable, str(program)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    env={**os.environ, "TOKENSVC_URL": demo_service, "PORT": str(port)})
    try:
        assert process.stdout is not None and process.stdout.readline() == "listening\n", process.stderr
        api = f"http://127.0.0.1:{port}"
        token = call_the_api(demo_service, api)
        revoked_then_refused(demo_service, api, token)
        upgrade = {"Connection": "Upgrade", "Upgrade": "websocket"}
        assert requests.get(f"{api}/live?access_token={token}", headers=upgrade, timeout=10).status_code == 401
        for path in ("/live/", "/nope", "/Live"):  # no handler serves these: the application's 404
            for name in ("access_token", "access%5Ftoken"):
                assert requests.get(f"{api}{path}?{name}={token}", headers=upgrade, timeout=10).status_code == 404
        # Tornado logs a request just after sending its answer; one more answer from the same
        # event loop means that line is written before the program is ended.
        assert requests.get(api + "/notes", timeout=10).status_code == 401
    finally:
        out, err = end(process)
    assert "GET /live?access_token=*** " in err
    for path in ("/live/", "/nope", "/Live"):
        assert f"404 GET {path}?access_token=*** " in err
    assert token not in out + err


def asgi_install_line() -> list[str]:
    """What the resource-server guide's ``pip install`` for the ASGI program names."""
    import shlex

    section = section_text(RESOURCE_SERVERS, "Install the library")
    line = re.search(r"`pip install (starlette[^`]*)`", section).group(1)
    return shlex.split(line)


def brought_by(requirements: list[str]) -> set[str]:
    """The distributions that installing ``requirements`` brings (each with its extras), read
    from what is installed here: their canonical names."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [Requirement(text) for text in requirements]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        try:
            entries = requires(name) or []
        except PackageNotFoundError:  # named but not installed here: the caller's check fails
            continue
        for entry in map(Requirement, entries):
            if entry.marker is None or any(entry.marker.evaluate({"extra": extra})
                                           for extra in requirement.extras | {""}):
                pending.append(entry)
    return {name for name, _ in seen}


def test_the_readme_installs_what_its_asgi_program_runs_on():
    """The ASGI program runs on what the guide's install line brings: Starlette, uvicorn, and
    a WebSocket library uvicorn takes (without one it refuses every WebSocket handshake); the
    test extras install the same, so the programs' tests run on it."""
    from importlib.metadata import version

    brought = brought_by(asgi_install_line())
    assert {"starlette", "uvicorn"} <= brought, brought
    assert brought & {"websockets", "wsproto"}, brought
    for name in brought:
        assert version(name)  # installed here, as the test extras name it


async def live_closed_on_revocation(url: str, revoke) -> int | None:
    """The WebSocket at ``url`` greets; ``revoke`` (blocking) revokes its token; the socket's
    close code."""
    import asyncio

    from helpers import DEADLINE
    from tornado.websocket import websocket_connect

    connection = await websocket_connect(url)
    assert await asyncio.wait_for(connection.read_message(), DEADLINE) == "hello"
    await asyncio.get_running_loop().run_in_executor(None, revoke)
    assert await asyncio.wait_for(connection.read_message(), DEADLINE) is None
    return connection.close_code


def served_by_uvicorn_as_written(command: str, demo_service: str, cwd: Path) -> None:
    """``command`` (a uvicorn command line) serving a guide's program from ``cwd`` on a free port
    (UVICORN_PORT, which uvicorn reads for --port): its lifespan opens and closes the feed, the
    health check needs no token, the guide's calls answer as it says, a query token is
    refused over HTTP, its WebSocket greets with a query token and is closed with 4401 once
    the token is revoked, and uvicorn's access log holds the query's token masked."""
    import asyncio

    import requests
    from service import free_port, spawn, wait_for_http

    port = free_port()
    bin_dir = str(Path(sys.executable).parent)  # where the test extras installed uvicorn
    process = spawn(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True,
                    env={**os.environ, "TOKENSVC_URL": demo_service, "UVICORN_PORT": str(port),
                         "PATH": bin_dir + os.pathsep + os.environ["PATH"]})
    api = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(api + "/healthz", process)
        token = call_the_api(demo_service, api)
        assert requests.get(f"{api}/notes?access_token={token}", timeout=10).status_code == 401  # HTTP: header only
        live = api.replace("http://", "ws://") + f"/live?access_token={token}"
        assert asyncio.run(live_closed_on_revocation(live, lambda: revoked_then_refused(demo_service, api, token))) \
            == 4401
    finally:
        out, err = end(process)
    assert "Application startup complete." in err and "Application shutdown complete." in err
    assert '"GET /notes?access_token=*** HTTP/1.1" 401' in out
    assert token not in out + err


def test_the_asgi_api_of_protecting_your_api_runs_under_the_uvicorn_command_as_written(demo_service, tmp_path):
    """The ASGI program, as written, served by the guide's uvicorn command as written, with its
    logging as it ships (served_by_uvicorn_as_written says what is checked)."""
    (tmp_path / "notes_asgi.py").write_text(protecting_blocks("python")[1])
    command = protecting_blocks("sh")[1]
    assert command.split()[0] == "uvicorn"
    served_by_uvicorn_as_written(command, demo_service, tmp_path)


def test_the_starlette_api_of_protecting_your_api_runs_under_uvicorn_as_written(demo_service, tmp_path):
    """The Starlette program (the backend that ``requires`` works with), as written, served by
    ``uvicorn notes_starlette:app`` as the guide says; its refusals are those of ``requires``
    (served_by_uvicorn_as_written says what else is checked)."""
    guide = (ROOT / RESOURCE_SERVERS).read_text()
    assert "it is served by `uvicorn notes_starlette:app`" in guide
    (tmp_path / "notes_starlette.py").write_text(protecting_blocks("python")[2])
    served_by_uvicorn_as_written("uvicorn notes_starlette:app", demo_service, tmp_path)
