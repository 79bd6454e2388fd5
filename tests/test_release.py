"""Releases: one version number (semantic versioning) in the package's metadata, on the command
line, at /healthz, and at the head of the CHANGELOG, whose every release after the first says
how to upgrade to it from the one before."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from tokensvc import __version__
from tokensvc.cli import main

CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")


def releases() -> list[str]:
    """The releases the CHANGELOG lists, newest first (``## Unreleased``, what the next one will
    hold, is none)."""
    return [version for version in re.findall(r"^## (\S+)$", CHANGELOG.read_text(), re.MULTILINE)
            if version != "Unreleased"]


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
