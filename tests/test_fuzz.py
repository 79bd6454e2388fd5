"""schemathesis over both OpenAPI documents, against the real service (``tokensvc serve`` on the
memory backend): the public one at ``/openapi.json`` and the admin listener's. Every check
schemathesis has (no 5xx; every status, content type, header and body as documented;
schema-valid requests accepted and schema-violating ones rejected; missing credentials and
headers refused; other methods 405 with Allow ...) in every phase (examples, coverage, fuzzing,
stateful), from a fixed seed, with zero failures. ``tests/schemathesis.toml`` holds the
configuration, and says why each of its few per-operation expectations exists. The admin
API's run is tests/test_fuzz_admin.py's, a file of its own so that the two runs, each on its own
service, go to two workers of ``make test``.

The run acts as real callers: alice's access token (``read write``) for the public API, bob's
for the calls that revoke what they carry, an admin's for the admin API, the XSRF token of
the pages' forms. The service's failure limits are raised for the run (a fuzzer's wrong
credentials would otherwise lock its address out), and a 429 anywhere fails it.

In ``make test`` each operation gets ``EXAMPLES`` cases per phase, from the seed in
tests/schemathesis.toml (about a minute for both runs on two cores). To run it longer, or
from other seeds::

    TOKENSVC_FUZZ_EXAMPLES=1000 TOKENSVC_FUZZ_SEED=7 .venv/bin/python -m pytest tests/test_fuzz*.py

(1,000 cases per operation and phase take some twenty minutes.) A failure prints schemathesis's
report: each case as a curl command, and ``st replay`` to run it again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from service import WEBAPP_SECRET, access_token, start_service

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = int(os.environ.get("TOKENSVC_FUZZ_EXAMPLES", "20"))
ROOT = '\n[[users]]\nusername = "root"\npassword = "quartz-river-beacon"\nadmin = true\n'
# Far above what the run sends, so that it never trips them (the limits' own tests are
# tests/test_limits.py); a 429 would fail the run. An account's failures since its last sign-in
# stay at their most, 100 (NIST): the run's made-up usernames never fail that often each.
LIMITS = """
[limits]
failed_client_auth_per_client = 1000000
failed_client_auth_per_address = 1000000
failed_logins_per_username = 1000000
failed_logins_per_address = 1000000
failed_logins_per_account = 1000000
"""
WEBAPP_REDIRECT = "http://127.0.0.1:1/callback"  # tests/service.py's: nothing listens there


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    service = start_service(tmp_path_factory.mktemp("fuzz"), extra=ROOT + LIMITS)
    yield service
    output = service.stop()
    assert "Traceback" not in output, output[-5000:]
    assert not re.search(r" 429 [A-Z]+ /", output), "the run tripped a failure limit"


@pytest.fixture(scope="module")
def credentials(service):
    base = service.base
    xsrf = requests.get(base + "/login", timeout=10).cookies["_xsrf"]
    return {
        "TOKENSVC_FUZZ_PUBLIC": base,
        "TOKENSVC_FUZZ_REVOKED": access_token(base, "webapp", WEBAPP_REDIRECT, "read write", "bob",
                                              "copper-fern-meadow", WEBAPP_SECRET),
        "TOKENSVC_FUZZ_REMOVER": access_token(base, "node-agent", "http://127.0.0.1:3/paired", "read write", "bob",
                                              "copper-fern-meadow"),
        "TOKENSVC_FUZZ_XSRF": xsrf,
    }


def schemathesis(document: str, credentials: dict[str, str], tmp_path: Path,
                 environ: dict[str, str] | None = None) -> tuple[str, int]:
    """Run schemathesis over ``document``; its output and the number of cases it generated."""
    environ = {**os.environ, **credentials, "SCHEMATHESIS_HOOKS": "fuzz_hooks", "NO_COLOR": "1",
               "PYTHONPATH": str(Path(__file__).parent), "SCHEMATHESIS_TELEMETRY": "false", **(environ or {})}
    command = [str(Path(sys.executable).with_name("st")), "--config-file", str(CONFIG), "run", document,
               "--max-examples", str(EXAMPLES),
               *(["--seed", os.environ["TOKENSVC_FUZZ_SEED"]] if "TOKENSVC_FUZZ_SEED" in os.environ else [])]
    result = subprocess.run(command, capture_output=True, text=True, env=environ, cwd=tmp_path,
                            timeout=30 * max(EXAMPLES, 20))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    generated = re.search(r"(\d+) generated", output)
    assert generated is not None, output
    return output, int(generated.group(1))


@pytest.mark.parametrize(("method", "parameters", "spared"), [
    ("DELETE", {"username": "ROOT"}, True), ("PATCH", {"username": "\uff52\uff4f\uff4f\uff54"}, True),
    ("PUT", {"username": "Root"}, True), ("DELETE", {"client_id": "tokensvc-cli"}, True),
    ("GET", {"username": "root"}, False), ("DELETE", {"username": "rooty"}, False),
    ("DELETE", {"client_id": "TOKENSVC-CLI"}, False), ("DELETE", {"username": 0}, False)])
def test_the_admin_run_spares_the_identity_it_acts_as(monkeypatch, method, parameters, spared):
    """root by its username's key, as the admin API finds a user (``ROOT``, full-width
    letters), the command line's client by its id as it is; reading them is allowed."""
    import fuzz_hooks

    monkeypatch.setattr(fuzz_hooks, "ADMIN", True)
    case = SimpleNamespace(method=method, path_parameters=parameters)
    assert fuzz_hooks.acts_on_itself(case) is spared


def test_the_public_api_is_as_its_document_says(service, credentials, tmp_path):
    output, generated = schemathesis(service.base + "/openapi.json", credentials, tmp_path)
    assert generated >= 30 * EXAMPLES and "Operations:       37 selected / 37 total" in output, output
