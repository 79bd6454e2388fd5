"""deploy/Dockerfile's steps run for real, without a container engine: the wheel built by the
build stage's command, installed by the runtime stage's into a virtual environment of its own,
and the image's entrypoint started from it with the config the image carries, on the wire
tier's MongoDB, until it is ready; then stopped as a container is (SIGTERM). And the pods'
configuration as the manifest fills it in, called as in-cluster callers call it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import requests
from helpers import source_copy, wait_until
from primary import ReplicaSet
from service import end, free_port, spawn, wait_for_http
from test_deploy import DEPLOY, POD_IP, ROOT, SECRETS, dockerfile, pod_environment, service_names
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

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
    source = source_copy(work / "src")  # the build stage's WORKDIR, holding what it copies
    built = subprocess.run([sys.executable, "-m", *command[:-1], str(source)], capture_output=True, text=True,
                           timeout=300, cwd=work)
    assert built.returncode == 0, built.stderr[-2000:]
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = str(next(wheels.glob("*.whl")))
    copied = {value.split()[1]: str(ROOT / value.split()[0]) for value in runtime.all("COPY")
              if not value.startswith("--from")}  # the image's paths, made the tree's
    install = [wheel if arg == "/wheels/*.whl" else copied.get(arg, arg)
               for arg in shlex.split(runtime.all("RUN")[0].split("&&")[0])]
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
            def ready() -> bool:
                assert process.poll() is None, log.read_text()
                return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200

            wait_until(ready, "the container's /readyz", 60, retry=(requests.ConnectionError, requests.Timeout),
                       interval=0.1)
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
        text = log.read_text()
        assert text.count('"message":"worker') >= 4 and '"message":"every worker has stopped"' in text  # JSON lines
        assert "Traceback" not in text
        # JSON lines only, the banner among them: a log collector reads every line of the container's output.
        lines = [json.loads(line) for line in text.splitlines()]
        assert any(line["message"].startswith("tokensvc is running on ") for line in lines)
    finally:
        primary.stop()


def feed_opens(port: int, host: str, client_id: str, secret: str) -> int | dict:
    """The revocation feed opened at ``port`` naming ``host``: its first message, or the status
    of the refusal before the upgrade."""
    async def opened() -> int | dict:
        credentials = base64.b64encode(f"{client_id}:{secret}".encode()).decode()
        request = HTTPRequest(f"ws://127.0.0.1:{port}/oauth/revocations", request_timeout=30,
                              headers={"Host": host, "Authorization": f"Basic {credentials}"})
        try:
            connection = await websocket_connect(request)
        except HTTPClientError as refused:
            return refused.code
        try:
            return json.loads(await asyncio.wait_for(connection.read_message(), 30))
        finally:
            connection.close()

    return asyncio.run(opened())


def test_in_cluster_callers_reach_the_pods_as_the_manifest_configures_them(tmp_path):
    """deploy/tokensvc.toml, its environment filled in as the manifest fills it, served as the
    pods serve it (the supervisor and two workers): a scrape names the pod's address, a
    resource server introspects and reads the revocation feed through each name of the
    Service (the fully qualified one with its final dot too); a name nobody listed is still
    refused (DNS rebinding), on each of those routes. An operator's ``kubectl port-forward`` to
    the admin listener names 127.0.0.1 or localhost, which it answers."""
    primary = ReplicaSet().start()
    port = free_port()
    admin_port = free_port(port)
    environ = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    environ.update(pod_environment({**SECRETS, "TOKENSVC_STORAGE_MONGODB_URI": primary.uri()}),
                   TOKENSVC_HOST="127.0.0.1", TOKENSVC_PORT=str(port), TOKENSVC_ADMIN_PORT=str(admin_port))
    command = [sys.executable, "-m", "tokensvc"]
    config = ["--config", str(DEPLOY / "tokensvc.toml")]
    try:
        # A resource server, registered as an operator does before its first deploy.
        added = subprocess.run([*command, "clients", "add", "--kind", "resource-server", "--name", "Notes API",
                                "--client-id", "notes-api", *config, "--json"],
                               env=environ, capture_output=True, text=True, timeout=120)
        assert added.returncode == 0, added.stderr
        secret = json.loads(added.stdout)["clientSecret"]
        log = tmp_path / "pod.log"
        with open(log, "w") as output:
            process = spawn([*command, "serve", *config, "--processes", "2"], env=environ, stdout=output,
                            stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for_http(base + "/readyz", process, log.read_text)
            scraped = requests.get(base + "/metrics", headers={"Host": f"{POD_IP}:{port}"}, timeout=30)
            assert scraped.status_code == 200 and "tokensvc_http_requests_total" in scraped.text
            for name in [*service_names(), service_names()[-1] + "."]:
                introspected = requests.post(base + "/oauth/token/introspect", headers={"Host": name},
                                             auth=("notes-api", secret), data={"token": "x" * 43}, timeout=30)
                assert introspected.status_code == 200 and introspected.json() == {"active": False}, name
                ready = feed_opens(port, name, "notes-api", secret)
                assert isinstance(ready, dict) and ready["type"] == "ready", (name, ready)
            # No name nobody listed, on any of these routes: "*" is not how in-cluster callers get in.
            for host in ("evil.example", f"evil.example:{port}"):
                assert requests.get(base + "/metrics", headers={"Host": host}, timeout=30).status_code == 400
                assert requests.post(base + "/oauth/token/introspect", headers={"Host": host},
                                     auth=("notes-api", secret), data={"token": "x" * 43},
                                     timeout=30).status_code == 400
                assert feed_opens(port, host, "notes-api", secret) == 400
            # kubectl port-forward deploy/tokensvc 8081:8081, then tokensvc login --url http://127.0.0.1:8081.
            for host in (f"127.0.0.1:{admin_port}", f"localhost:{admin_port}"):
                index = requests.get(f"http://127.0.0.1:{admin_port}/admin", headers={"Host": host}, timeout=30)
                assert index.status_code == 200 and index.json()["cliClientId"] == "tokensvc-cli", host
            assert requests.get(f"http://127.0.0.1:{admin_port}/admin", headers={"Host": "evil.example"},
                                timeout=30).status_code == 400
            # The probes answer the kubelet, which names the pod's address too.
            assert requests.get(base + "/readyz", headers={"Host": f"{POD_IP}:{port}"}, timeout=30).status_code == 200
        finally:
            end(process)
        assert "Traceback" not in log.read_text()
        assert all(json.loads(line) for line in log.read_text().splitlines())  # the JSON log mode: JSON lines only
    finally:
        primary.stop()
