"""The layering ARCHITECTURE.md states, checked: the protocol layer (``tokensvc.oauth``) loads
neither the configuration nor a web framework, a database driver or a metrics library, and
reports what it counts through an interface the service's metrics implement."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

from tokensvc.metrics import Metrics
from tokensvc.oauth.metrics import ProtocolMetrics

# What importing every module of tokensvc.oauth must not load.
FOREIGN = ("tokensvc.config", "prometheus_client", "tornado", "pymongo", "bson", "motor", "tokensvc.metrics",
           "tokensvc.handlers", "tokensvc.app")

PROGRAM = """
import importlib, json, pkgutil, sys
import tokensvc.oauth
for module in pkgutil.iter_modules(tokensvc.oauth.__path__):
    importlib.import_module("tokensvc.oauth." + module.name)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.process
def test_the_protocol_layer_loads_no_configuration_framework_driver_or_metrics_library():
    """In a fresh interpreter (this one has loaded everything already)."""
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120,
                            check=True)
    loaded = json.loads(result.stdout)
    assert "tokensvc.oauth.grants" in loaded and "tokensvc.oauth.metrics" in loaded  # the walk imported them
    assert [name for name in loaded if name.split(".")[0] in FOREIGN or name.startswith(FOREIGN)] == []


def test_the_services_metrics_implement_what_the_protocol_reports():
    reported = {name: inspect.signature(member) for name, member in vars(ProtocolMetrics).items()
                if inspect.isfunction(member) and not name.startswith("_")}
    assert len(reported) >= 8
    for name, signature in reported.items():
        assert inspect.signature(getattr(Metrics, name)) == signature, name


def test_each_report_reaches_its_series():
    metrics = Metrics()
    reports: ProtocolMetrics = metrics
    reports.issued("refresh_token")
    reports.revoked_families("reuse", 3)
    reports.revoked_access_token()
    reports.reused_code()
    reports.reused_refresh_token()
    reports.failed_client_auth()
    reports.failed_login()
    reports.refused_by_limit("login")
    value = metrics.registry.get_sample_value
    assert value("tokensvc_tokens_issued_total", {"grant": "refresh_token"}) == 1
    assert value("tokensvc_token_families_revoked_total", {"reason": "reuse"}) == 3
    assert value("tokensvc_access_tokens_revoked_total") == 1
    assert value("tokensvc_code_reuse_total") == value("tokensvc_refresh_reuse_total") == 1
    assert value("tokensvc_client_auth_failures_total") == value("tokensvc_login_failures_total") == 1
    assert value("tokensvc_rate_limited_total", {"kind": "login"}) == 1
