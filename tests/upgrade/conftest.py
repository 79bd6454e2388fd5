"""The upgrade tier: the previous release (from the project's history) and this tree as real
``tokensvc serve`` processes on one wire-tier primary (tests/wire/primary.py). What only the
oldest release whose store this tree still reads does (0.9.0: its format, its ways) is tested
against that release (``oldest``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "wire"))  # primary.py

import releases
from primary import ReplicaSet


def pytest_collection_modifyitems(items):
    for item in items:
        if "/upgrade/" in str(item.fspath):
            for marker in ("upgrade", "e2e", "mongodb"):
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(scope="session")
def previous(tmp_path_factory) -> releases.Installed:
    """The release before this one, ready to run."""
    return releases.install(releases.previous(), tmp_path_factory.mktemp("releases"))


@pytest.fixture(scope="session")
def oldest(tmp_path_factory) -> releases.Installed:
    """The oldest release whose store this one still reads (0.9.0), ready to run."""
    return releases.install(releases.oldest(), tmp_path_factory.mktemp("releases"))


@pytest.fixture
def primary():
    server = ReplicaSet().start()
    yield server
    server.stop()
