"""Packaging: the wheel builds without a packaging warning and holds the templates and static files."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest
from helpers import source_copy


@pytest.mark.e2e
def test_the_wheel_builds_without_warnings_and_holds_the_data(tmp_path):
    # Built as pip builds it for an install: in an isolated environment with a current setuptools,
    # from what the image's build copies (the package's __pycache__ directories included).
    source = source_copy(tmp_path / "src")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-v", "-w", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "BuildBackendWarning" not in output and "SetuptoolsDeprecationWarning" not in output, \
        [line for line in output.splitlines() if "Warning" in line]
    wheel = next(tmp_path.glob("tokensvc-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("tokensvc/templates/login.html", "tokensvc/static/style.css", "tokensvc/static/favicon.ico"):
        assert expected in names
    assert not any("__pycache__" in name for name in names)
