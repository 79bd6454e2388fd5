"""deploy/Dockerfile's steps run for real, without a container engine: the wheel built by the
build stage's command, installed by the runtime stage's into a virtual environment of its own,
and the image's entrypoint started from it with the config the image carries, on the wire
tier's MongoDB, until it is ready; then stopped as a container is (SIGTERM)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import requests
from primary import ReplicaSet
from service import free_port
from test_deploy import DEPLOY, ROOT, SECRETS, dockerfile

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A virtual environment holding tokensvc as the image does: from its wheel. Offline: the
    wheel is installed without its dependencies, which come from the tests' environment."""
    build, runtime = dockerfile()
    work = tmp_path_factory.mktemp("image")
    wheels = work / "wheels"
    # The build stage's command, its paths made this machine's (after splitting: a path here may
    # hold a space).
    command = [str(wheels) if arg == "/wheels" else arg for arg in shlex.split(build.last("RUN"))]
    built = subprocess.run([sys.executable, "-m", *command[:-1], str(ROOT)], capture_output=True, text=True,
                           timeout=300, cwd=work)
    assert built.returncode == 0, built.stderr[-2000:]
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = str(next(wheels.glob("*.whl")))
    install = [wheel if arg == "/wheels/*.whl" else arg for arg in shlex.split(runtime.all("RUN")[0].split("&&")[0])]
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", *install, "--no-deps", "--no-index"],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import tokensvc; print(tokensvc.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd=work)
    assert where.stdout.startswith(str(site)), where  # the wheel's, not the source tree's
    return venv


def test_the_images_entrypoint_serves_from_the_wheel_and_stops_on_sigterm(installed, tmp_path):
    primary = ReplicaSet().start()
    try:
        runtime = dockerfile()[-1]
        argv = [*json.loads(runtime.last("ENTRYPOINT")), *json.loads(runtime.last("CMD"))]
        argv = [str(DEPLOY / "tokensvc.toml") if arg == "/etc/tokensvc/tokensvc.toml" else arg for arg in argv]
        port = free_port()
        environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
        environ.update(SECRETS, TOKENSVC_STORAGE_MONGODB_URI=primary.uri(), TOKENSVC_HOST="127.0.0.1",
                       TOKENSVC_PORT=str(port), TOKENSVC_ADMIN_PORT=str(free_port(port)),
                       PATH=f"{installed / 'bin'}{os.pathsep}{environ.get('PATH', '')}")
        log = tmp_path / "container.log"
        with open(log, "w") as output:
            process = subprocess.Popen(argv, env=environ, stdout=output, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 60
            while True:
                assert process.poll() is None, log.read_text()
                try:
                    if requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                        break
                except (requests.ConnectionError, requests.Timeout):
                    pass
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
        text = log.read_text()
        assert text.count('"message":"worker') >= 4 and '"message":"every worker has stopped"' in text  # JSON lines
        assert "Traceback" not in text
    finally:
        primary.stop()
