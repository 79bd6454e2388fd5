"""The README's hand-run flow runs top to bottom as written, against the demo configuration."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from service import end, start_demo

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


def hand_run_flow() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("A whole flow by hand"):]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


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
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Using a stock client"):readme.index("## Endpoints")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.mark.parametrize("library", ["authlib", "requests-oauthlib"])
def test_the_stock_client_programs_run_as_written(demo_service, tmp_path, library):
    """Each program of "Using a stock client", as written: the test plays the browser (sign in
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
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Administration"):]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_adding_a_client_to_the_running_demo_runs_as_written(tmp_path):
    """The README's administration block, with a browser stand-in (BROWSER) that signs in as
    root with the demo's password, as the operator would in the browser tokensvc login opens."""
    from service import free_port

    stand_in = tmp_path / "browser"
    stand_in.write_text(f"#!{sys.executable}\n"
                        "import sys\n"
                        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                        "import requests\n"
                        "from service import user_agent_authorize\n"
                        "landed = user_agent_authorize(sys.argv[1], username='root', password='granite-harbor-ember')\n"
                        "requests.get(landed, timeout=10)\n")
    stand_in.chmod(0o755)
    admin_port = free_port()
    process, _ = start_demo(admin_port, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
        bin_dir = str(Path(sys.executable).parent)  # where `make run` installed tokensvc
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", admin_block()], capture_output=True, text=True,
                                timeout=120, env={**environ, "BROWSER": str(stand_in),
                                                  "TOKENSVC_ADMIN_URL": f"http://127.0.0.1:{admin_port}",
                                                  "TOKENSVC_CREDENTIALS": str(tmp_path / "credentials.json"),
                                                  "PATH": bin_dir + os.pathsep + os.environ["PATH"]})
    finally:
        end(process)
    assert result.returncode == 0, result.stderr + result.stdout
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"signed in to http://127.0.0.1:{admin_port} as root")
    assert lines[1] == "client_id: dome-camera" and lines[2].startswith("client_secret: ")
    assert "name: Dome camera" in lines and "confidential: yes" in lines


def protecting_programs() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Protecting your API"):readme.index("## OpenAPI")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def revoke_as_webapp(base: str, token: str) -> None:
    import requests

    answer = requests.post(base + "/oauth/token/revoke", data={"token": token},
                           auth=("webapp", "webapp-demo-secret"), timeout=10)
    assert answer.status_code == 200


def test_the_tornado_api_of_protecting_your_api_runs_as_written(demo_service, tmp_path):
    """The Tornado program, as written, against the demo service: a token works, none is 401,
    a scope it lacks is 403, and once revoked the token is refused (the feed dropped it). The
    refused WebSocket handshake's token, in its query, is logged by Tornado (a 4xx is a
    WARNING, written to stderr with no logging configured) masked, never as it is."""
    import requests
    from helpers import wait_until
    from service import access_token, free_port, spawn

    program = tmp_path / "notes.py"
    program.write_text(protecting_programs()[0])
    port = free_port()
    process = spawn([sys.executable, str(program)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    env={**os.environ, "TOKENSVC_URL": demo_service, "PORT": str(port)})
    try:
        assert process.stdout is not None and process.stdout.readline() == "listening\n", process.stderr
        api = f"http://127.0.0.1:{port}/notes"
        token = access_token(demo_service, "webapp", "http://127.0.0.1:8000/callback", "read", "alice",
                             "amber-comet-lantern", "webapp-demo-secret")
        bearer = {"Authorization": f"Bearer {token}"}
        assert requests.get(api, headers=bearer, timeout=10).json()["notes"] == []
        refused = requests.get(api, timeout=10)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == 'Bearer realm="api"'
        assert requests.post(api, headers=bearer, timeout=10).json()["error"] == "insufficient_scope"
        revoke_as_webapp(demo_service, token)
        wait_until(lambda: requests.get(api, headers=bearer, timeout=10).status_code == 401,
                   "the revoked token refused")
        live = f"http://127.0.0.1:{port}/live?access_token={token}"
        assert requests.get(live, headers={"Connection": "Upgrade", "Upgrade": "websocket"},
                            timeout=10).status_code == 401
        # Tornado logs a request just after sending its answer; one more answer from the same
        # event loop means that line is written before the program is ended.
        assert requests.get(api, timeout=10).status_code == 401
    finally:
        out, err = end(process)
    assert "GET /live?access_token=*** " in err
    assert token not in out + err


@pytest.mark.gen_test(timeout=90)
async def test_the_asgi_api_of_protecting_your_api_runs_as_written(demo_service):
    """The ASGI program, as written, driven as an ASGI server drives it: start-up opens the
    feed, a token works, and once revoked it is refused."""
    import asyncio

    from helpers import DEADLINE, eventually
    from service import access_token

    os.environ["TOKENSVC_URL"] = demo_service
    try:
        namespace: dict = {}
        exec(compile(protecting_programs()[1], "notes_asgi.py", "exec"), namespace)
    finally:
        del os.environ["TOKENSVC_URL"]
    app, verifier = namespace["app"], namespace["verifier"]
    lifespan: asyncio.Queue = asyncio.Queue()
    said: list = []

    async def say(message):
        said.append(message)

    lifespan.put_nowait({"type": "lifespan.startup"})
    running = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}}, lifespan.get, say))
    await eventually(lambda: said, DEADLINE, what="the start-up")
    assert said[0]["type"] == "lifespan.startup.complete"
    await asyncio.wait_for(verifier.connected.wait(), DEADLINE)
    token = await asyncio.get_running_loop().run_in_executor(None, lambda: access_token(
        demo_service, "webapp", "http://127.0.0.1:8000/callback", "read", "alice", "amber-comet-lantern",
        "webapp-demo-secret"))

    async def get_notes():
        sent: list = []
        request: asyncio.Queue = asyncio.Queue()
        request.put_nowait({"type": "http.request", "body": b""})

        async def send(message):
            sent.append(message)

        await app({"type": "http", "method": "GET", "path": "/notes", "raw_path": b"/notes", "query_string": b"",
                   "headers": [(b"authorization", f"Bearer {token}".encode())], "scheme": "http",
                   "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "root_path": "", "http_version": "1.1",
                   "asgi": {"version": "3.0"}}, request.get, send)
        return sent[0]["status"], json.loads(sent[1]["body"])

    assert await get_notes() == (200, {"notes": [], "for": json.loads(requests_me(demo_service, token))["id"]})
    await asyncio.get_running_loop().run_in_executor(None, revoke_as_webapp, demo_service, token)
    await eventually(lambda: verifier.cached == 0, DEADLINE, what="the revocation heard")
    assert (await get_notes())[0] == 401
    lifespan.put_nowait({"type": "lifespan.shutdown"})
    await asyncio.wait_for(running, DEADLINE)


def requests_me(base: str, token: str) -> str:
    import requests

    return requests.get(base + "/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=10).text
