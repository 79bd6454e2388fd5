"""tokensvc against a Tornado "Hello, world" started in the same run (``make bench``).

Starts the hello world and tokensvc (memory backend, one process each, tokensvc's access log
at its default level), seeds tokensvc, drives each operation with wrk (32 connections, 10 s,
after a 2 s warm-up), measures the hello world before and after (and, for reference, a bare
Tornado handler that parses a form and answers JSON), and prints one table: operation, the
server's CPU time per request (utime + stime of its process from ``/proc/PID/stat`` over the
measured run, divided by the requests wrk completed) and that as a multiple of the hello
world's, then req/s, p50, p99, the throughput ratio to the hello world, non-2xx responses. The
CPU figure does not move with how fast the host happens to be (wrk shares the two cores); the
throughput ratio does, and is information. A hello world runs between every two
operations, and each operation's ratio is against the mean of the hello-world runs just before
and after it (the first and last appear in the table, against the mean of all of the round's).
Any non-2xx response fails the run (and an introspection that does not answer
``"active":true``). Right after tokensvc's introspection, in each round, comes the peer's:
node-oidc-provider (``bench/peer.py``, installed from the npm registry into a temporary
directory, skipped with a line saying why where node is missing), driven and measured the same
way; the last lines give tokensvc's CPU per introspection divided by the peer's, round by
round. Then the scale figures: introspection with 10k and with 1M live tokens back
to back, between
two hello-world runs, and the memory backend's bytes per stored token (tracemalloc, 100k tokens).

    python bench/run.py [--duration 10] [--connections 32] [--rounds 1] [--skip-scale]

With ``--rounds N`` the whole table runs N times and the medians are printed, with the range of
the rounds' ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import peer

HERE = Path(__file__).resolve().parent
THREADS = 2


@dataclass
class Result:
    name: str
    rps: float
    p50_ms: float
    p99_ms: float
    non2xx: int
    cpu_us: float  # the server process's CPU time per request


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far (``/proc/PID/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def need_wrk() -> str:
    wrk = shutil.which("wrk")
    if wrk:
        return wrk
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("installing wrk (Debian package)...", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, stdout=subprocess.DEVNULL)
        wrk = shutil.which("wrk")
    if not wrk:
        sys.exit("bench: wrk is required (apt-get install wrk)")
    return wrk


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"bench: server did not start (exit {process.poll()})")
        time.sleep(0.1)


def wait_port(port: int, process: subprocess.Popen) -> None:
    for _ in range(200):
        if process.poll() is not None:
            sys.exit("bench: hello world did not start")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("bench: hello world did not start")


def parse_latency(text: str, percentile: str) -> float:
    match = re.search(rf"^\s+{percentile}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    if not match:
        return float("nan")
    value, unit = float(match.group(1)), match.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def wrk_run(wrk: str, name: str, url: str, script: str, env: dict[str, str], duration: int, connections: int,
            round_: int = 1, warmup: int = 2, *, pid: int) -> Result:
    base = [wrk, f"-t{THREADS}", f"-c{connections}", "--latency", "-s", str(HERE / "lua" / script), url]
    if warmup:
        subprocess.run(base[:1] + [f"-d{warmup}s"] + base[1:], env={**env, "BENCH_PHASE": f"warmup{round_}"},
                       capture_output=True, text=True, check=True)
    cpu_before = cpu_seconds(pid)
    out = subprocess.run(base[:1] + [f"-d{duration}s"] + base[1:], env={**env, "BENCH_PHASE": f"main{round_}"},
                         capture_output=True, text=True, check=True).stdout
    cpu = cpu_seconds(pid) - cpu_before
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non2xx_match = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: .*", out)
    non2xx = int(non2xx_match.group(1)) if non2xx_match else 0
    if errors:
        non2xx += sum(int(n) for n in re.findall(r"\d+", errors.group(0)))
    return Result(name, rps, parse_latency(out, "50"), parse_latency(out, "99"), non2xx, cpu / max(requests, 1) * 1e6)


def start_seeded(port: int, out: Path, **counts: int) -> subprocess.Popen:
    args = [sys.executable, str(HERE / "seeded.py"), str(port), str(out)]
    for key, value in counts.items():
        args += [f"--{key}", str(value)]
    with open(out / "server.err", "w") as errors:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=errors)
    wait_for(out / "ready", process)
    return process


def bytes_per_token(count: int = 100_000) -> float:
    """The memory store's bytes per live token: a family holds a pair (an access and a
    refresh token), so half of what one family takes."""
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    from seeded import new_family, settings

    from tokensvc.bootstrap import make_context
    from tokensvc.records import Grant, utcnow
    from tokensvc.storage.memory import MemoryStore

    store = MemoryStore()
    ctx = make_context(settings(8080), store)
    now = utcnow()
    grant = Grant("grant-1", "bench", "u_bench", None, ["read", "write"], now)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]

    async def store_all() -> None:
        for _ in range(count):
            await store.create_family(new_family(ctx, grant, now)[1])

    asyncio.run(store_all())
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count / 2


INTROSPECTION = "introspection (client_secret_basic)"
# (name, server, path, wrk script), in the order they run in each round.
OPERATIONS = [
    ("hello world (before)", "hello", "/", "hello.lua"),
    ("reference: bare Tornado form POST", "hello", "/floor", "floor.lua"),
    (INTROSPECTION, "svc", "", "introspect.lua"),
    ("GET /v1/me (bearer)", "svc", "", "me.lua"),
    ("code exchange (PKCE)", "svc", "", "exchange.lua"),
    ("refresh with rotation", "svc", "", "refresh.lua"),
    ("GET /oauth/clients/{id}", "svc", "", "client.lua"),
    ("hello world (after)", "hello", "/", "hello.lua"),
]
BIG = "introspection, 1M live tokens"


@dataclass
class Row:
    """One operation over all rounds: medians, and each round's ratio to its own hello world."""

    name: str
    runs: list[Result]
    ratios: list[float]
    cpu_ratios: list[float]

    def median(self, attribute: str) -> float:
        return statistics.median(getattr(run, attribute) for run in self.runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the whole table this many times and print medians (the machine's noise)")
    parser.add_argument("--skip-scale", action="store_true", help="leave out the 1M-token run")
    args = parser.parse_args()
    wrk = need_wrk()
    work = Path(tempfile.mkdtemp(prefix="tokensvc-bench-"))
    processes: list[subprocess.Popen] = []
    peers: list[peer.Peer] = []
    try:
        hello_port, svc_port = free_port(), free_port()
        hello = subprocess.Popen([sys.executable, str(HERE / "hello.py"), str(hello_port)])
        processes.append(hello)
        wait_port(hello_port, hello)
        svc_dir = work / "svc"
        svc_dir.mkdir()
        codes = 4000 * (args.duration + 4)
        processes.append(start_seeded(svc_port, svc_dir, tokens=10_000, codes=codes, refresh=8 * args.connections,
                                      rounds=args.rounds))
        env = {**os.environ, "BENCH_LUA": str(HERE / "lua"), "BENCH_DIR": str(svc_dir),
               "BENCH_THREADS": str(THREADS), "BENCH_VERIFIER": "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk",
               "BENCH_BASIC": "Basic " + base64.b64encode(b"bench:bench-client-secret-0123456789abcdef").decode()}
        urls = {"hello": f"http://127.0.0.1:{hello_port}", "svc": f"http://127.0.0.1:{svc_port}"}

        pids = {"hello": hello.pid, "svc": processes[-1].pid}
        envs = {"hello": env, "svc": env}
        operations = list(OPERATIONS)
        # The peer: node-oidc-provider's introspection, right after tokensvc's in each round.
        started = peer.start(work, free_port())
        if isinstance(started, str):
            skipped = f"bench: node-oidc-provider skipped: {started}"
            print(skipped, file=sys.stderr)
        else:
            skipped = ""
            peers.append(started)
            urls["peer"], pids["peer"] = started.url + peer.PATH, started.process.pid
            envs["peer"] = {**env, "BENCH_DIR": str(started.directory), "BENCH_INTROSPECT_PATH": peer.PATH}
            after = next(index for index, (name, *_) in enumerate(operations) if name == INTROSPECTION)
            operations.insert(after + 1, (peer.NAME, "peer", "", "introspect.lua"))
        rows = {name: Row(name, [], [], []) for name, *_ in operations}
        for round_ in range(1, args.rounds + 1):
            # A hello world between every two operations, and each ratio against the hello world
            # measured just before and just after it: the machine's drift over a round (up to
            # 20 % here) then does not land on whichever operations run last.
            hellos = [wrk_run(wrk, "hello world", urls["hello"] + "/", "hello.lua", env, args.duration,
                              args.connections, pid=pids["hello"])]
            for name, server, path, script in operations[1:-1]:
                result = wrk_run(wrk, name, urls[server] + path, script, envs[server], args.duration,
                                 args.connections, round_, pid=pids[server])
                hellos.append(wrk_run(wrk, "hello world", urls["hello"] + "/", "hello.lua", env, args.duration,
                                      args.connections, pid=pids["hello"]))
                rows[name].runs.append(result)
                rows[name].ratios.append(result.rps / ((hellos[-2].rps + hellos[-1].rps) / 2))
                rows[name].cpu_ratios.append(result.cpu_us / ((hellos[-2].cpu_us + hellos[-1].cpu_us) / 2))
            mean_hello = statistics.mean(hello.rps for hello in hellos)
            mean_hello_cpu = statistics.mean(hello.cpu_us for hello in hellos)
            for name, hello in ((OPERATIONS[0][0], hellos[0]), (OPERATIONS[-1][0], hellos[-1])):
                rows[name].runs.append(hello)
                rows[name].ratios.append(hello.rps / mean_hello)
                rows[name].cpu_ratios.append(hello.cpu_us / mean_hello_cpu)

        scale_line = ""
        if not args.skip_scale:
            # Each round: hello world, introspection at 10k and at 1M tokens back to back, hello
            # world; the 1M ratio is against that round's hello world, 1M / 10k within the round.
            big_dir = work / "big"
            big_dir.mkdir()
            big_port = free_port()
            processes.append(start_seeded(big_port, big_dir, tokens=1_000_000))
            big_env = {**env, "BENCH_DIR": str(big_dir)}
            big, scale = Row(BIG, [], [], []), []
            for round_ in range(1, args.rounds + 1):
                before = wrk_run(wrk, "hello", urls["hello"] + "/", "hello.lua", env, args.duration, args.connections,
                                 pid=pids["hello"])
                small = wrk_run(wrk, "10k", urls["svc"], "introspect.lua", env, args.duration, args.connections,
                                pid=pids["svc"])
                run = wrk_run(wrk, BIG, f"http://127.0.0.1:{big_port}", "introspect.lua", big_env, args.duration,
                              args.connections, round_, pid=processes[-1].pid)
                after = wrk_run(wrk, "hello", urls["hello"] + "/", "hello.lua", env, args.duration, args.connections,
                                pid=pids["hello"])
                big.runs.append(run)
                big.ratios.append(run.rps / ((before.rps + after.rps) / 2))
                big.cpu_ratios.append(run.cpu_us / ((before.cpu_us + after.cpu_us) / 2))
                scale.append(run.cpu_us / small.cpu_us)
            order = list(rows)
            order.insert(order.index(INTROSPECTION) + 1, BIG)
            rows = {name: big if name == BIG else rows[name] for name in order}
            spread = f" ({min(scale):.2f}-{max(scale):.2f} over the rounds)" if args.rounds > 1 else ""
            scale_line = (f"introspection at 1M tokens / at 10k, CPU per request, back to back: "
                          f"{statistics.median(scale):.2f}{spread}")

        medians = "medians of " + str(args.rounds) + " rounds, " if args.rounds > 1 else ""
        print(f"\ntokensvc benchmark: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"{medians}wrk -t{THREADS} -c{args.connections} -d{args.duration}s")
        spread = args.rounds > 1  # then also the range of the rounds' ratios
        print(f"{'operation':40} {'CPU µs':>7} {'× hello':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>6} "
              + (f"{'ratios':>10} " if spread else "") + f"{'non-2xx':>8}")
        for row in rows.values():
            ratios = f"{min(row.ratios):4.2f}-{max(row.ratios):4.2f} " if spread else ""
            print(f"{row.name:40} {row.median('cpu_us'):7.0f} {statistics.median(row.cpu_ratios):7.2f} "
                  f"{row.median('rps'):9.0f} {row.median('p50_ms'):8.2f} {row.median('p99_ms'):8.2f} "
                  f"{statistics.median(row.ratios):6.2f} {ratios}{sum(run.non2xx for run in row.runs):8d}")
        if scale_line:
            print(scale_line)
        if skipped:
            print(skipped)
        else:
            # tokensvc's introspection against the peer's, run next to it in each round.
            against = [ours.cpu_us / theirs.cpu_us for ours, theirs in zip(rows[INTROSPECTION].runs,
                                                                          rows[peer.NAME].runs, strict=True)]
            spread = f" ({min(against):.2f}-{max(against):.2f} over the rounds)" if args.rounds > 1 else ""
            print(f"introspection / node-oidc-provider {peer.VERSION}'s, server CPU per request, same round: "
                  f"{statistics.median(against):.2f}{spread}")
        print(f"memory backend: {bytes_per_token():.0f} bytes per stored token (tracemalloc, 100k tokens)")
        failed = [row.name for row in rows.values() if any(run.non2xx for run in row.runs)]
        if failed:
            print("bench: FAILED, non-2xx responses in: " + ", ".join(failed), file=sys.stderr)
            return 1
        return 0
    finally:
        for running in peers:
            running.stop()
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    sys.exit(main())
