"""Releases: one version number (semantic versioning) in the package's metadata, on the command
line, at /healthz, and at the head of the CHANGELOG, whose every release after the first says
how to upgrade to it from the one before, pointing at UPGRADE.md's checklist for it. Between
releases the number is the next release's as a development version (PEP 440, ``0.11.0.dev0``),
after the newest release and before its own, and the CHANGELOG's head is ``## Unreleased``,
saying how to upgrade from the newest release."""

from __future__ import annotations

import configparser
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tokensvc import __version__
from tokensvc.cli.main import main
from tokensvc.storage.mongo.format import release_key

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"
UPGRADE = ROOT / "UPGRADE.md"
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
DEVELOPMENT = re.compile(SEMVER.pattern + r"\.dev(0|[1-9]\d*)")  # PEP 440: between releases


def releases() -> list[str]:
    """The releases the changelog lists, newest first: not the section of what is not released yet
    (``## Unreleased``, at the top, if any)."""
    listed = re.findall(r"^## (\S+)$", CHANGELOG.read_text(), re.MULTILINE)
    return listed[1:] if listed[:1] == ["Unreleased"] else listed


def test_the_package_and_the_command_say_the_same_version(capsys):
    assert SEMVER.fullmatch(__version__) or DEVELOPMENT.fullmatch(__version__)
    assert importlib.metadata.version("tokensvc") == __version__
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"tokensvc {__version__}\n"


def test_the_changelog_starts_with_this_release_and_each_says_how_to_upgrade_from_the_one_before():
    listed = releases()
    assert listed[-1] == "0.9.0"
    assert all(SEMVER.fullmatch(version) for version in listed)
    numbers = [tuple(int(part) for part in version.split(".")) for version in listed]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)
    text = CHANGELOG.read_text()
    if DEVELOPMENT.fullmatch(__version__):
        unreleased = text.split("\n## Unreleased\n", 1)[1].split(f"\n## {listed[0]}\n", 1)[0]
        assert f"### Upgrading from {listed[0]}" in unreleased
        assert "(UPGRADE.md#" in unreleased.split(f"### Upgrading from {listed[0]}", 1)[1].split("\n### ", 1)[0]
    else:
        assert listed[0] == __version__
    for newer, older in zip(listed, listed[1:], strict=False):
        section = text.split(f"## {newer}\n", 1)[1].split(f"## {older}\n", 1)[0]
        assert f"### Upgrading from {older}" in section
        assert "(UPGRADE.md#" in section.split(f"### Upgrading from {older}", 1)[1].split("\n### ", 1)[0]


def test_upgrade_md_has_a_checklist_before_during_and_after_for_each_upgrade():
    """UPGRADE.md holds one section for each upgrade the CHANGELOG lists, newest first, the one to
    the release under way included; each starts with its checklist, in the order an operator
    works: before the upgrade, during it, after it."""
    listed = releases()
    wanted = list(zip(listed, listed[1:], strict=False))
    if DEVELOPMENT.fullmatch(__version__):
        wanted.insert(0, (__version__.split(".dev")[0], listed[0]))
    text = UPGRADE.read_text()
    found = re.findall(r"^## (\S+?)(?: \(unreleased\))?, from (\S+)$", text, re.MULTILINE)
    assert found == wanted
    for newer, older in wanted:
        section = re.split(rf"^## {re.escape(newer)}(?: \(unreleased\))?, from {re.escape(older)}$", text,
                           flags=re.MULTILINE)[1].split("\n## ", 1)[0]
        assert section.lstrip().startswith("### Checklist\n")
        checklist = section.split("### Checklist\n", 1)[1].split("\n### ", 1)[0]
        steps = [checklist.find(when) for when in ("Before the upgrade:", "During the upgrade:", "After the upgrade:")]
        assert -1 not in steps and steps == sorted(steps), (newer, steps)


def test_one_version_in_the_package_its_metadata_and_the_changelogs_newest_release():
    """``tokensvc.__version__`` is the one place: setup.cfg reads it (``attr:``), the package's
    metadata and ``tokensvc --version`` say it, and the CHANGELOG's newest release heading is it
    (so a release whose number was never raised, as 0.9.0's 0.1.0, fails here); between
    releases, the CHANGELOG's head is ``## Unreleased`` and the version a development version
    after its newest release, so nothing claims to be that release."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert setup["metadata"]["version"] == "attr: tokensvc.__version__"
    assert __version__ == importlib.metadata.version("tokensvc")
    headings = re.findall(r"^## (\S+)$", CHANGELOG.read_text(), re.MULTILINE)
    if DEVELOPMENT.fullmatch(__version__):
        assert headings[0] == "Unreleased"
        assert release_key(releases()[0]) < release_key(__version__) < release_key(__version__.split(".dev")[0])
    else:
        assert releases()[0] == __version__


def test_a_development_version_comes_after_the_release_before_it_and_before_its_own():
    ordered = ["0.9.0", "0.10.0", "0.11.0.dev0", "0.11.0.dev1", "0.11.0", "0.11.1.dev0", "0.11.1", "1.0.0.dev0"]
    assert sorted(reversed(ordered), key=release_key) == ordered
    assert release_key("0") < release_key("0.9.0")  # a release that names none sorts first


def test_every_earlier_release_is_known_to_the_upgrade_tier_by_its_commit():
    """No git tag is pushed: RELEASED names each release before this one, so the upgrade tier
    finds the previous release in any checkout with the history (the CHANGELOG says so)."""
    module = sys.modules.get("releases")  # as the upgrade tier imports it
    if module is None:
        spec = importlib.util.spec_from_file_location("releases", ROOT / "tests" / "upgrade" / "releases.py")
        assert spec is not None and spec.loader is not None
        module = sys.modules["releases"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
        spec.loader.exec_module(module)
    assert {version for version in releases() if version != __version__} <= set(module.RELEASED)
    assert all(re.fullmatch(r"[0-9a-f]{40}", commit) for commit in module.RELEASED.values())
    text = CHANGELOG.read_text().split("\n## ", 1)[0]
    assert "RELEASED" in text and "tagged" not in text


def test_the_readme_names_the_released_version_and_this_trees_version():
    """The README's Releases section names the newest release, and between releases the
    development version ``tokensvc --version`` prints, so it never claims to be a release it
    is not."""
    text = (ROOT / "README.md").read_text().split("\n## Releases\n", 1)[1].split("\n## ", 1)[0]
    assert f"The released version is tokensvc **{releases()[0]}**." in text
    if DEVELOPMENT.fullmatch(__version__):
        assert f"`tokensvc --version` prints `{__version__}`" in text
    else:
        assert releases()[0] == __version__
