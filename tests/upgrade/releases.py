"""The previous release, from the project's own history: the newest tag ``v<version>`` on this
branch older than the package's version (a development version, ``0.11.0.dev0``, comes after
0.10.0), its tree taken out with ``git archive``; and the oldest release whose store this one
still reads (:func:`oldest`), for what only that release does.

It runs from that tree with this environment's interpreter and packages (``PYTHONPATH`` names
the tree, the working directory is the tree, so its ``tokensvc`` is the one imported) when this
environment satisfies what its ``setup.cfg`` requires; otherwise it is installed into a virtual
environment of its own, kept in ``.venv/releases/<version>`` for the next run.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import io
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from tokensvc import __version__
from tokensvc.storage.mongo.format import HISTORY, release_key

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Release:
    version: str
    tag: str
    commit: str


@dataclass(frozen=True)
class Installed:
    """How to run a release: its interpreter, what it adds to the environment, where to start it
    from."""

    version: str
    python: str
    env: dict[str, str]
    cwd: Path


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


# Each release's commit, as its tag names it: a checkout that came without tags (a CI system
# that fetches the branch alone) still finds the previous release in the history it has.
RELEASED = {"0.9.0": "d4258688babc12003c53eb7cedce5822dd5b3650",
            "0.10.0": "a6c35a84df343ff6f5b368181275c51964f876b4"}


def _tags() -> dict[str, str]:
    return {tag[1:]: tag for tag in _git("tag", "--list", "v*", "--merged", "HEAD").split()}


def previous(current: str = __version__) -> Release:
    tags = _tags()
    versions = [version for version in {*tags, *RELEASED} if release_key(version) < release_key(current)]
    if not versions:
        raise AssertionError(f"no release before {current} is known: tag it v<version> and add it to RELEASED")
    return named(max(versions, key=release_key), tags)


def oldest() -> Release:
    """The release that first wrote the oldest format this one reads (0.9.0: format 1), whose
    store this release still upgrades."""
    return named(HISTORY.first_release_of(HISTORY.oldest))


def named(version: str, tags: dict[str, str] | None = None) -> Release:
    """The release ``version``, by its tag or by its commit in :data:`RELEASED`."""
    tags = _tags() if tags is None else tags
    if version in tags:
        return Release(version, tags[version], _git("rev-parse", f"{tags[version]}^{{commit}}").strip())
    commit = RELEASED[version]
    if subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT).returncode != 0:
        raise AssertionError(f"release {version} ({commit}) is not in this checkout's history: the upgrade tier "
                             "needs it (git fetch --unshallow --tags)")
    return Release(version, f"v{version}", commit)


def unmet(requirements: list[str]) -> list[str]:
    """The requirements this environment does not satisfy."""
    missing = []
    for line in requirements:
        requirement = Requirement(line)
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(line)
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            missing.append(line)
    return missing


def install(release: Release, into: Path) -> Installed:
    """The release's tree under ``into``, and how to run it."""
    tree = into / release.version
    archive = subprocess.run(["git", "archive", "--format=tar", release.commit, "tokensvc", "setup.cfg",
                              "pyproject.toml"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        # The project's own history; the "data" filter where this Python has it (3.11.4 on).
        tar.extractall(tree, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    setup = configparser.ConfigParser()
    setup.read(tree / "setup.cfg")
    requirements = [line.strip() for line in setup["options"]["install_requires"].splitlines() if line.strip()]
    if not unmet(requirements):
        return Installed(release.version, sys.executable, {"PYTHONPATH": str(tree)}, tree)
    venv = ROOT / ".venv" / "releases" / release.version
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(tree)], check=True)
        (venv / ".installed").touch()
    return Installed(release.version, str(venv / "bin" / "python"), {"PYTHONPATH": ""}, tree.parent)
