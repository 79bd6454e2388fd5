"""The benchmark's peer: node-oidc-provider's introspection, measured as tokensvc's is.

``make bench`` (``bench/run.py``) installs the pinned version from the npm registry into a
temporary directory of its own (``npm install``: nothing of the library is kept in this
repository), starts it there with ``bench/peer/oidc-provider.mjs`` (one confidential client,
opaque access tokens, each of a grant of its own, 10,000 of them) and drives its introspection
endpoint with the same wrk script, connections and duration as tokensvc's, its CPU time read
from ``/proc`` as tokensvc's is. Where node or npm is missing, or the install fails, the peer
is skipped with a line that says why.

The pinned version is the newest whose declared engines include the Node.js this machine has
(20): 8.x declares ``node >= 18``; 9.x declares none and warns at start that it wants Node.js 22.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "oidc-provider"
VERSION = "8.8.1"
NAME = f"node-oidc-provider {VERSION}: introspection"
PATH = "/token/introspection"  # the library's default route


@dataclass
class Peer:
    process: subprocess.Popen
    url: str
    directory: Path  # its access.txt, for the wrk script

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start(work: Path, port: int, tokens: int = 10_000) -> Peer | str:
    """The running peer, or the reason it is skipped."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return "node and npm are not installed (Node.js 18 or later runs it)"
    directory = work / "peer"
    directory.mkdir()
    (directory / "package.json").write_text(json.dumps(
        {"private": True, "type": "module", "dependencies": {PACKAGE: VERSION}}))
    installed = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--omit=dev"],
                               cwd=directory, capture_output=True, text=True)
    if installed.returncode != 0:
        return f"npm install {PACKAGE}@{VERSION} failed: {installed.stderr.strip().splitlines()[-1:]}"
    shutil.copy(HERE / "peer" / "oidc-provider.mjs", directory)
    out = directory / "out"
    out.mkdir()
    with open(out / "server.err", "w") as errors:
        process = subprocess.Popen([node, "oidc-provider.mjs", str(port), str(out), str(tokens)], cwd=directory,
                                   env={**os.environ, "NODE_ENV": "production"}, stdout=errors, stderr=errors)
    deadline = time.monotonic() + 300
    while not (out / "ready").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            return f"it did not start: {(out / 'server.err').read_text().strip()[-300:]}"
        time.sleep(0.1)
    return Peer(process, f"http://127.0.0.1:{port}", out)
