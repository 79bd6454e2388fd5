"""``bench/production.py`` (``make bench``'s first part) runs: both backends served, each
operation measured, its store commands counted. A short run: the figures are the bench's, not
the test's, so only that they are there is checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

BENCH = Path(__file__).resolve().parents[2] / "bench" / "production.py"


def test_the_production_bench_measures_both_backends_and_counts_the_commands():
    result = subprocess.run([sys.executable, str(BENCH), "introspect", "--rounds", "1", "--requests", "20"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    header, row = result.stdout.strip().splitlines()[-2:]
    assert header.split() == ["operation", "MongoDB", "ms", "commands", "memory", "ms", "ratio"], result.stdout
    name, mongodb, commands, memory, ratio = row.split()
    assert name == "introspect" and float(memory) > 0 and float(mongodb) > 0, result.stdout
    assert 0.5 < float(commands) < 2, result.stdout  # one a request, less the idle rate's noise
