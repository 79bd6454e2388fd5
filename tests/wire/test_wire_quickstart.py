"""docs/quickstart.md runs as written, steps 1 to 4: its secrets and configuration pass
``config check --strict``; on an empty store (the wire tier's replica set, its URI in place of
the page's) the first administrator is made, the service started with the page's command, and
the administrator signs in through the admin API and finds themselves there; the probes and a
scrape answer. The service's ports and public URL are moved to the test's own through the
environment, as an operator moves them. Step 5 (mongodump, mongorestore) needs MongoDB's tools
and a real server: it is not run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from primary import ReplicaSet
from service import end, free_port, spawn, wait_for_http
from terminal import run_in_terminal

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "quickstart.md"
ROOT_PASSWORD = "saffron-lighthouse-meridian"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)


def environment(**more: str) -> dict[str, str]:
    """The operator's shell: no TOKENSVC_ variable of the caller's, tokensvc on the PATH."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    bin_dir = str(Path(sys.executable).parent)
    return {**environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], **more}


def bash(script: str, cwd: Path, environ: dict[str, str]) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=180,
                            cwd=cwd, env=environ)
    assert result.returncode == 0, result.stderr + result.stdout
    return result


def browser(tmp_path: Path, typed: Path) -> Path:
    """What the operator does in the browser ``tokensvc login`` opens: signs in as root, and
    reads the confirmation code off the page (into ``typed``, which the terminal then types)."""
    stand_in = tmp_path / "browser"
    stand_in.write_text(f"#!{sys.executable}\n"
                        "import sys\n"
                        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                        "import requests\n"
                        "from service import user_agent_authorize\n"
                        f"landed = user_agent_authorize(sys.argv[1], username='root', password={ROOT_PASSWORD!r},\n"
                        f"                              read=open({str(typed)!r}, 'w').write)\n"
                        "requests.get(landed, timeout=10)\n")
    stand_in.chmod(0o755)
    return stand_in


def test_an_operators_first_day_runs_as_written(tmp_path):
    secrets, check, first_admin, start, ready, sign_in, scrape = blocks("sh")[:7]
    (tmp_path / "tokensvc.toml").write_text(blocks("toml")[0])
    # Steps 1 and 2 as written: the page's URI, which config check reads without connecting.
    bash(secrets + check, tmp_path, environment())
    primary = ReplicaSet().start()
    port = free_port()
    admin_port = free_port(port)
    base = f"http://127.0.0.1:{port}"
    moved = {"TOKENSVC_STORAGE_MONGODB_URI": primary.uri(), "TOKENSVC_HOST": "127.0.0.1", "TOKENSVC_PORT": str(port),
             "TOKENSVC_ADMIN_PORT": str(admin_port), "TOKENSVC_BASE_URL": base, "TOKENSVC_AUTH_URL": base}
    exports = "".join(f"export {name}='{value}'\n" for name, value in moved.items())
    try:
        # Step 3: the first administrator in the empty store, then the service.
        bash(secrets + exports + first_admin, tmp_path, environment(ROOT_PASSWORD=ROOT_PASSWORD))
        log = tmp_path / "tokensvc.log"
        with open(log, "w") as output:
            process = spawn(["bash", "-euo", "pipefail", "-c", secrets + exports + "exec " + start], cwd=tmp_path,
                            env=environment(), stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_for_http(base + "/readyz", process, log.read_text)
            # In the operator's terminal: tokensvc login asks there for the code the page shows.
            typed = tmp_path / "typed"
            done = run_in_terminal(ready + sign_in + scrape, environment(
                BASE=base, TOKENSVC_ADMIN_URL=f"http://127.0.0.1:{admin_port}", BROWSER=str(browser(tmp_path, typed)),
                TOKENSVC_CREDENTIALS=str(tmp_path / "credentials.json")), typed, tmp_path, cwd=tmp_path, seconds=180)
            assert done.returncode == 0, done.stderr + done.stdout
        finally:
            end(process)
        lines = done.stdout.splitlines()
        assert lines[0] == '{"status":"ok"}', lines
        assert lines[1].startswith(f"signed in to http://127.0.0.1:{admin_port} as root"), lines
        assert any(re.fullmatch(r"root\s+u_[0-9a-f]+\s+yes", line.strip()) for line in lines), lines
        assert int(lines[-1]) > 10  # the scrape's tokensvc_ series
        assert "Traceback" not in log.read_text()
    finally:
        primary.stop()
