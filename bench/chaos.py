"""A store chaos run from the command line: ``bench/chaos.py --seconds 60 --seed 7``.

Two ``tokensvc serve`` processes on a three-member replica set while a seeded script takes the
set down and back, steps its primary down and crashes it, and clients sign in, exchange, refresh,
introspect, hold WebSockets and revoke. The replica set is the wire tier's stand-in
(tests/wire/primary.py, mockupdb speaking MongoDB's protocol), not a MongoDB server. It prints the
report, and exits 1 when a request was answered 500 or not at all, a revocation went unheard, a
revoked family kept a live pair, or a process did not stop cleanly on SIGTERM."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "wire"), str(ROOT / "tests")]

import chaos  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the chaos lasts (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="the seed of the store's script and the clients' pauses")
    parser.add_argument("--clients", type=int, default=chaos.CLIENTS, help="concurrent client loops")
    parser.add_argument("--directory", type=Path, help="where the processes' configs and logs go (default: a "
                        "temporary directory, removed at the end)")
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON too")
    options = parser.parse_args()
    if options.directory is not None:
        report = chaos.run(options.seconds, options.seed, options.directory, options.clients)
    else:
        with tempfile.TemporaryDirectory(prefix="tokensvc-chaos-") as directory:
            report = chaos.run(options.seconds, options.seed, Path(directory), options.clients)
    print(chaos.summary(report))
    if options.json:
        print(json.dumps(report, indent=2))
    return 0 if chaos.passed(report) else 1


if __name__ == "__main__":
    sys.exit(main())
