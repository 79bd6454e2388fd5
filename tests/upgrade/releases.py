"""The previous release, from the project's own history: the newest tag ``v<version>`` on this
branch older than the package's version, its tree taken out with ``git archive``.

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
from tokensvc.storage.format import release_key

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


def previous(current: str = __version__) -> Release:
    tags = [tag for tag in _git("tag", "--list", "v*", "--merged", "HEAD").split()
            if release_key(tag[1:]) < release_key(current)]
    if not tags:
        raise AssertionError(f"no release tag v<version> before {current} on this branch: the upgrade tier needs "
                             "the previous release's tag (git fetch --tags)")
    tag = max(tags, key=lambda name: release_key(name[1:]))
    return Release(tag[1:], tag, _git("rev-parse", f"{tag}^{{commit}}").strip())


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
