"""deploy/ kept honest without a container engine: the Dockerfile, the systemd unit and the
Kubernetes example name commands and flags the command line takes, mount a config that passes
``tokensvc config check``, and give a stop the time the supervisor's drain needs. (The image's
build and install steps are run for real in ``tests/wire/test_wire_deploy.py``.)"""

from __future__ import annotations

import configparser
import fnmatch
import importlib.metadata
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tokensvc import config
from tokensvc.cli import main as cli
from tokensvc.cli.supervisor import STOP_MARGIN
from tokensvc.handlers.edge import guards
from tokensvc.identifiers import is_loopback

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SECRETS = {"TOKENSVC_COOKIE_SECRET": "a-cookie-secret-of-the-tests-0123456789",
           "TOKENSVC_STORAGE_MONGODB_URI": "mongodb://tokensvc:pw@db-0.db,db-1.db/?replicaSet=rs0"}


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [value for key, value in self.instructions if key == keyword]

    def last(self, keyword: str) -> str:
        return self.all(keyword)[-1]


def dockerfile() -> list[Stage]:
    """deploy/Dockerfile's stages: comments dropped, continued lines joined."""
    stages: list[Stage] = []
    logical = ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        logical += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if line.endswith("\\"):
            continue
        keyword, _, value = logical.partition(" ")
        logical = ""
        if keyword == "FROM":
            image, _, name = value.partition(" AS ")
            stages.append(Stage(image.strip(), name.strip() or None))
        else:
            stages[-1].instructions.append((keyword, value.strip()))
    return stages


def check_config(path: Path, environ: dict[str, str]) -> subprocess.CompletedProcess:
    """``tokensvc config check --strict``: what no production deployment wants is refused too."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("TOKENSVC_")}
    return subprocess.run([sys.executable, "-m", "tokensvc", "config", "check", "--strict", "--config", str(path),
                           "--json"], capture_output=True, text=True, timeout=60, env={**clean, **environ})


def serve_args(argv: list[str]) -> object:
    """``argv`` (after the program) parsed by the command line: a serve with the supervisor."""
    args = cli.build_parser().parse_args(argv)
    assert args.func is cli.cmd_serve and args.processes >= 2, argv
    return args


def kubernetes() -> dict[str, dict]:
    return {document["kind"]: document for document in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text())}


# A pod as Kubernetes would start it: its namespace and address (the Downward API's).
NAMESPACE, POD_IP = "observatory", "10.42.3.17"


def pod_environment(secrets: dict[str, str] | None = None, namespace: str = NAMESPACE,
                    pod_ip: str = POD_IP) -> dict[str, str]:
    """The container's environment as the kubelet fills it from the manifest: each Secret's key
    from ``secrets`` (by the variable it fills: SECRETS unless given), each field of the pod,
    and each ``value``'s references ``$(NAME)`` to a variable listed before it expanded
    (``$$`` is a ``$``; a reference to no such variable stays as written)."""
    secrets = SECRETS if secrets is None else secrets
    fields = {"metadata.namespace": namespace, "status.podIP": pod_ip}
    environ: dict[str, str] = {}
    for item in kubernetes()["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]:
        source = item.get("valueFrom", {})
        if "secretKeyRef" in source:
            environ[item["name"]] = secrets[item["name"]]
        elif "fieldRef" in source:
            environ[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
        else:
            environ[item["name"]] = re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                           lambda found: "$" if found.group(0) == "$$"
                                           else environ.get(found.group(1), found.group(0)), item["value"])
    return environ


def service_names(namespace: str = NAMESPACE) -> list[str]:
    """The names the cluster's DNS gives the manifest's Service, seen from a pod of any namespace."""
    name = kubernetes()["Service"]["metadata"]["name"]
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


# -- the image ------------------------------------------------------------------------------------------


def test_the_image_is_slim_python_3_11_run_by_a_user_of_its_own_with_the_supervisor():
    stages = dockerfile()
    assert [stage.image for stage in stages] == ["python:3.11-slim", "python:3.11-slim"]
    build, runtime = stages
    assert build.last("RUN") == "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ."
    assert runtime.all("COPY")[0] == "--from=build /wheels /wheels"
    assert runtime.all("RUN")[0].startswith("pip install --no-cache-dir --constraint /tmp/requirements.lock "
                                            "/wheels/*.whl && rm -rf /wheels /tmp/requirements.lock && useradd")
    assert "deploy/requirements.lock /tmp/requirements.lock" in runtime.all("COPY")  # the pinned dependencies
    user = runtime.last("USER")
    assert user.split(":")[0] not in ("root", "0") and f"--uid {user.split(':')[0]}" in runtime.all("RUN")[0]
    entrypoint, command = json.loads(runtime.last("ENTRYPOINT")), json.loads(runtime.last("CMD"))
    assert entrypoint == ["tokensvc", "serve"] and runtime.last("STOPSIGNAL") == "SIGTERM"
    args = serve_args([*entrypoint[1:], *command])
    # The config it serves is the one the image copies in, and every file it copies exists.
    copies = [value.split() for stage in stages for value in stage.all("COPY") if not value.startswith("--from")]
    assert ["deploy/tokensvc.toml", args.config] in copies  # type: ignore[attr-defined]
    assert all((ROOT / source).exists() for *sources, _ in copies for source in sources), copies
    # The build context leaves out what a checkout holds besides (.dockerignore), never what is copied.
    ignored = [line.rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line and not line.startswith("#")]
    assert {".git", ".venv", "tests", "build"} <= set(ignored)
    for *sources, _ in copies:
        for source in sources:
            assert not any(fnmatch.fnmatch(source, pattern) or source.startswith(pattern + "/")
                           for pattern in ignored), (source, ignored)
    port = config.load(DEPLOY / "tokensvc.toml", environ=SECRETS).port
    assert runtime.last("EXPOSE") == str(port)


def lock_tool():
    """deploy/lock.py, which writes deploy/requirements.lock."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lock", DEPLOY / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_image_installs_a_pinned_dependency_set_that_setup_cfg_allows_and_the_tests_ran():
    """deploy/requirements.lock pins every package the run-time requirements bring, each at a
    version setup.cfg allows and at the version installed where these tests run: what is shipped
    is what was tested (regenerate it with deploy/lock.py when either changes)."""
    lock = lock_tool()
    pinned = lock.read((DEPLOY / "requirements.lock").read_text())
    assert pinned == lock.resolved(), "deploy/requirements.lock is stale: .venv/bin/python deploy/lock.py > " \
                                      "deploy/requirements.lock"
    for requirement in lock.install_requires():
        assert requirement.specifier.contains(pinned[lock.canonicalize_name(requirement.name)]), requirement
    for name, version in pinned.items():
        assert importlib.metadata.version(name) == version, name
    assert (DEPLOY / "requirements.lock").read_text() == lock.render(pinned)


@pytest.mark.process
def test_the_config_of_the_image_and_the_pods_passes_config_check():
    checked = check_config(DEPLOY / "tokensvc.toml", SECRETS)
    assert checked.returncode == 0, checked.stderr
    settings = json.loads(checked.stdout)
    assert settings["storage"]["backend"] == "mongodb" and settings["storage"]["mongodb_uri"].startswith(
        "mongodb://***@")  # the URI's password masked
    assert is_loopback(settings["admin"]["host"])  # the admin API never leaves the pod
    # The ConfigMap mounts that very file.
    assert kubernetes()["ConfigMap"]["data"]["tokensvc.toml"] == (DEPLOY / "tokensvc.toml").read_text()
    # Without either of the Secret's values, start-up stops, naming it.
    uri, cookie = "TOKENSVC_STORAGE_MONGODB_URI", "TOKENSVC_COOKIE_SECRET"
    assert "storage.mongodb_uri: required" in check_config(DEPLOY / "tokensvc.toml", {cookie: SECRETS[cookie]}).stderr
    assert "cookie_secret: required" in check_config(DEPLOY / "tokensvc.toml", {uri: SECRETS[uri]}).stderr


# -- Kubernetes -------------------------------------------------------------------------------------------


def test_the_pods_are_probed_on_readyz_and_outlast_the_drain():
    documents = kubernetes()
    pod = documents["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    runtime = dockerfile()[-1]
    args = serve_args([*json.loads(runtime.last("ENTRYPOINT"))[1:], *container["args"]])
    mounted = next(mount["mountPath"] for mount in container["volumeMounts"] if mount["name"] == "config")
    assert PurePosixPath(args.config).parent == PurePosixPath(mounted)  # type: ignore[attr-defined]
    settings = config.load(DEPLOY / "tokensvc.toml", environ=SECRETS)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": settings.port}  # the admin listener's port is not there
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > pause + settings.server.drain_seconds + STOP_MARGIN
    secrets = {item["name"]: item["valueFrom"]["secretKeyRef"] for item in container["env"]
               if "secretKeyRef" in item.get("valueFrom", {})}
    assert set(secrets) == set(SECRETS)  # both secrets from the Secret, nothing in the clear
    assert pod["securityContext"]["runAsNonRoot"] and str(pod["securityContext"]["runAsUser"]) == \
        runtime.last("USER").split(":")[0]
    if container["securityContext"]["readOnlyRootFilesystem"]:  # the metrics' files need /tmp
        assert any(mount["mountPath"] == "/tmp" for mount in container["volumeMounts"])
    service = documents["Service"]["spec"]
    assert [port["targetPort"] for port in service["ports"]] == ["http"]


def test_the_pods_run_unprivileged_with_bounded_resources_and_a_disruption_budget():
    """What an operator expects of a manifest (kubernetes-validate --strict takes it, checked by
    hand: no test depends on that tool): non-root, a read-only root file system and no
    privilege to gain, requests and limits, and a budget that keeps a pod serving through a
    node's drain."""
    documents = kubernetes()
    deployment = documents["Deployment"]["spec"]
    pod = deployment["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert any(mount["mountPath"] == "/tmp" for mount in container["volumeMounts"])  # the metrics' files
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
    budget = documents["PodDisruptionBudget"]["spec"]
    assert budget["selector"] == deployment["selector"] and 0 < budget["minAvailable"] < deployment["replicas"]


def test_the_pods_answer_to_the_services_names_and_their_own_address_and_to_no_other():
    """What the manifest fills in makes the service answer to the names in-cluster callers use
    (the Service's, a scrape's pod address) beside its public one, and still to no other
    (tests/wire/test_wire_deploy.py calls a service started so)."""
    settings = config.load(DEPLOY / "tokensvc.toml", environ=pod_environment())
    names = guards.allowed_hosts(settings)
    assert names is not None and "*" not in settings.server.allowed_hosts
    assert {*service_names(), POD_IP, "auth.example.org"} <= names
    assert "evil.example" not in names and not any(name.endswith(".example") for name in names - {"auth.example.org"})
    # Another namespace, another address: the names follow the pod.
    elsewhere = config.load(DEPLOY / "tokensvc.toml", environ=pod_environment(namespace="web", pod_ip="10.9.0.4"))
    assert {*service_names("web"), "10.9.0.4"} <= (guards.allowed_hosts(elsewhere) or set())
    assert f"tokensvc.{NAMESPACE}" not in (guards.allowed_hosts(elsewhere) or set())
    # A scrape by pod address comes from the pods' network, which metrics.allow takes.
    assert any(ipaddress.ip_address(POD_IP) in ipaddress.ip_network(network) for network in settings.metrics.allow)


# -- systemd ----------------------------------------------------------------------------------------------


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(DEPLOY / "tokensvc.service")
    return parser


@pytest.mark.parametrize("key", ["ExecStartPre", "ExecStart"])
def test_the_systemd_units_commands_parse_against_the_command_line(key):
    argv = shlex.split(unit()["Service"][key])
    assert argv[0] == "/opt/tokensvc/bin/tokensvc"
    args = cli.build_parser().parse_args(argv[1:])
    assert args.config == "/etc/tokensvc/tokensvc.toml"
    if key == "ExecStart":
        serve_args(argv[1:])
    else:
        assert args.func is cli.cmd_config_check and args.strict  # a production gate before each start


def test_one_grace_period_everywhere():
    """The pods', the unit's and every one the docs show are the same: an operator copying the
    docs' snippet gets the time deploy/ gives the drain."""
    grace = kubernetes()["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert int(unit()["Service"]["TimeoutStopSec"]) == grace
    shown = [(path.name, int(value)) for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
                                                  *sorted(p for p in DEPLOY.rglob("*") if p.is_file())]
             for value in re.findall(r"terminationGracePeriodSeconds:\s*(\d+)", path.read_text())]
    assert shown and all(value == grace for _, value in shown), shown
    assert f"terminationGracePeriodSeconds: {grace}" in (DEPLOY / "README.md").read_text()


# What `systemd-analyze security` rates "OK": an exposure of 2.0 or below.
OK_EXPOSURE = 2.0


@pytest.mark.process
@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian: apt-get install systemd)")
def test_the_systemd_unit_is_sandboxed_as_systemd_rates_ok(tmp_path):
    unit_file = tmp_path / "tokensvc.service"
    unit_file.write_text((DEPLOY / "tokensvc.service").read_text())
    rated = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit_file)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": ""})
    found = re.search(r"Overall exposure level for tokensvc\.service: (\d+\.\d+) (\w+)", rated.stdout + rated.stderr)
    assert found, rated.stdout + rated.stderr
    assert float(found[1]) <= OK_EXPOSURE and found[2] == "OK", found[0]


@pytest.mark.process
def test_the_systemd_unit_stops_the_supervisor_alone_and_waits_for_the_drain():
    service = unit()["Service"]
    assert service["KillMode"] == "mixed" and service["KillSignal"] == "SIGTERM"
    assert service["User"] != "root" and service["Restart"] == "on-failure"
    # The unit's config is config/tokensvc.mongodb.toml installed as /etc/tokensvc/tokensvc.toml,
    # with the secrets of the environment file.
    example = dict(line.split("=", 1) for line in (DEPLOY / "tokensvc.env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert set(example) == set(SECRETS)
    assert check_config(ROOT / "config" / "tokensvc.mongodb.toml", example).returncode == 1  # left empty: stops
    checked = check_config(ROOT / "config" / "tokensvc.mongodb.toml", SECRETS)
    assert checked.returncode == 0, checked.stderr
    drain = json.loads(checked.stdout)["server"]["drain_seconds"]
    assert int(service["TimeoutStopSec"]) > drain + STOP_MARGIN


def test_the_systemd_path_gives_real_client_addresses_through_its_unix_socket():
    """The unit's config listened on loopback behind a proxy with no xheaders: every client had
    the proxy's address, and 21 wrong sign-ins locked everyone out. It serves nginx on the unix
    socket whose directory the unit makes (ProtectSystem=strict leaves /run read-only)."""
    settings = config.load(ROOT / "config" / "tokensvc.mongodb.toml", environ=SECRETS)
    assert settings.xheaders and settings.proxy.trusted_networks == ("unix",)
    socket_dir = Path(settings.server.unix_socket).parent
    assert socket_dir.parent == Path("/run")
    service = unit()["Service"]
    assert service["ProtectSystem"] == "strict" and service["RuntimeDirectory"] == socket_dir.name
    assert not [line for line in config.warnings(settings) if line.startswith("xheaders")]
