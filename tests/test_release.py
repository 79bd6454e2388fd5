"""Releases: one version number (semantic versioning) in the package's metadata, on the command
line, at /healthz, and at the head of the CHANGELOG, whose every release after the first says
how to upgrade to it from the one before."""

from __future__ import annotations

import configparser
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tokensvc import __version__
from tokensvc.cli import main

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")


def releases() -> list[str]:
    """The releases the changelog lists, newest first: not the section of what is not released yet
    (``## Unreleased``, at the top, if any)."""
    listed = re.findall(r"^## (\S+)$", CHANGELOG.read_text(), re.MULTILINE)
    return listed[1:] if listed[:1] == ["Unreleased"] else listed


def test_the_package_and_the_command_say_the_same_version(capsys):
    assert SEMVER.fullmatch(__version__)
    assert importlib.metadata.version("tokensvc") == __version__
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"tokensvc {__version__}\n"


def test_the_changelog_starts_with_this_release_and_each_says_how_to_upgrade_from_the_one_before():
    listed = releases()
    assert listed[0] == __version__ and listed[-1] == "0.9.0"
    assert all(SEMVER.fullmatch(version) for version in listed)
    numbers = [tuple(int(part) for part in version.split(".")) for version in listed]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)
    text = CHANGELOG.read_text()
    for newer, older in zip(listed, listed[1:], strict=False):
        section = text.split(f"## {newer}\n", 1)[1].split(f"## {older}\n", 1)[0]
        assert f"### Upgrading from {older}" in section


def test_one_version_in_the_package_its_metadata_and_the_changelogs_newest_release():
    """``tokensvc.__version__`` is the one place: setup.cfg reads it (``attr:``), the package's
    metadata and ``tokensvc --version`` say it, and the CHANGELOG's newest release heading is it
    (so a release whose number was never raised, as 0.9.0's 0.1.0, fails here)."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert setup["metadata"]["version"] == "attr: tokensvc.__version__"
    assert releases()[0] == __version__ == importlib.metadata.version("tokensvc")


def test_every_earlier_release_is_known_to_the_upgrade_tier_by_its_commit():
    """No git tag is pushed: RELEASED names each release before this one, so the upgrade tier
    finds the previous release in any checkout with the history (the CHANGELOG says so)."""
    module = sys.modules.get("releases")  # as the upgrade tier imports it
    if module is None:
        spec = importlib.util.spec_from_file_location("releases", ROOT / "tests" / "upgrade" / "releases.py")
        assert spec is not None and spec.loader is not None
        module = sys.modules["releases"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
        spec.loader.exec_module(module)
    assert set(releases()[1:]) <= set(module.RELEASED)
    assert all(re.fullmatch(r"[0-9a-f]{40}", commit) for commit in module.RELEASED.values())
    text = CHANGELOG.read_text().split("\n## ", 1)[0]
    assert "RELEASED" in text and "tagged" not in text
