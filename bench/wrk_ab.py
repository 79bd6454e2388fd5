"""An A/B under wrk: the service as it is against one of ``bench/inprocess.py``'s switch
variants, each in a process of its own, their runs alternating, the CPU time per request of
each server read from ``/proc`` as ``make bench`` reads it.

In process (``bench/inprocess.py``) every request is a loop iteration of its own, so what is
done once per iteration (the log lines' write) is paid by every request; under wrk's 32
connections the requests served together share it. This gives the figure under that load.

    python bench/wrk_ab.py SWITCH [--rounds 6] [--duration 10] [OPERATION]

Prints each round's CPU µs per request of both, and the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import tempfile
from pathlib import Path

from run import HERE, free_port, need_wrk, start_seeded, wrk_run

SCRIPTS = {"introspect": "introspect.lua", "me": "me.lua", "client": "client.lua"}
BENCH_CREDENTIALS = b"bench:bench-client-secret-0123456789abcdef"  # seeded.py's client


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("switch")
    parser.add_argument("operation", nargs="?", default="introspect", choices=sorted(SCRIPTS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    wrk = need_wrk()
    work = Path(tempfile.mkdtemp(prefix="tokensvc-wrk-ab-"))
    servers = {}
    try:
        for name, switch in (("delegate", None), (args.switch, args.switch)):
            out = work / name
            out.mkdir()
            port = free_port()
            process = start_seeded(port, out, tokens=10_000, **({"switch": switch} if switch else {}))
            servers[name] = (process, f"http://127.0.0.1:{port}", out)
        ratios = []
        for round_ in range(1, args.rounds + 1):
            order = list(servers) if round_ % 2 else list(reversed(servers))
            spent = {}
            for name in order:
                process, url, out = servers[name]
                env = {**os.environ, "BENCH_LUA": str(HERE / "lua"), "BENCH_DIR": str(out),
                       "BENCH_BASIC": "Basic " + base64.b64encode(BENCH_CREDENTIALS).decode()}
                result = wrk_run(wrk, name, url, SCRIPTS[args.operation], env, args.duration, args.connections,
                                 pid=process.pid)
                if result.non2xx:
                    sys.exit(f"wrk_ab: {result.non2xx} failed requests against {name}")
                spent[name] = result.cpu_us
            ratios.append(spent["delegate"] / spent[args.switch])
            print(f"round {round_}: delegate {spent['delegate']:.1f} µs, {args.switch} {spent[args.switch]:.1f} µs, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
        ratio = statistics.median(ratios)
        print(f"{args.operation} under wrk: delegate / {args.switch}: median of {args.rounds} rounds {ratio:.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f}); {args.switch} is {abs(1 - 1 / ratio) * 100:.1f} % "
              f"{'less' if ratio > 1 else 'more'} than delegate")
        return 0
    finally:
        for process, _, _ in servers.values():
            process.terminate()
            process.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
