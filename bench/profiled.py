"""Where one endpoint's CPU time goes, in process: cProfile on the service thread.

The service is served as ``bench/inprocess.py`` serves it (the seeded application on an event
loop in a thread of its own, one keep-alive client connection); after a warm-up, the profiler
runs on the service thread only, with ``time.thread_time`` as its clock, so the client's work
is not counted. The profiler inflates small calls several times over: the shares are the
figure, not the µs.

    python bench/profiled.py [OPERATION] [--requests 3000] [--top 25]

Prints the share of the service thread's time spent in each named part of a request (each
part's cumulative time), then the functions with the most time of their own.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inprocess import FLOOR, OPERATIONS, Service, ServiceThread, cpu_per_request

# The named parts of a request: (what it is, the file it is in, its function).
PARTS = [
    ("Tornado's parsing of the request line and headers", "httputil.py", "parse"),
    ("the event loop's wait for the socket (epoll)", "selectors.py", "select"),
    ("Tornado's routing", "web.py", "find_handler"),
    ("the request lifecycle's start (request id, host, method, body)", "lifecycle.py", "finish"),
    ("· the request id", "lifecycle.py", "request_id_for"),
    ("the handler's coroutine, whole", "json_api.py", "serve"),
    ("· the body's parsing (the form)", "json_api.py", "_parse_body"),
    ("· client authentication", "clientauth.py", "authenticate_request"),
    ("· the protocol function (introspect)", "introspection.py", "introspect"),
    ("· the exit, whole (Exit.send)", "exit.py", "send"),
    ("  · the response writer (the send included)", "response_writer.py", "write_response"),
    ("  · the access line and the metrics (Edge.finished)", "lifecycle.py", "finished"),
    ("    · the access line", "access_log.py", "log_access"),
    ("    · the request metrics", "telemetry/metrics.py", "request"),
    ("the log lines' write, once per loop iteration", "telemetry/logs.py", "flush_now"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("operation", nargs="?", default="introspect", choices=[*OPERATIONS, FLOOR])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--top", type=int, default=25, help="functions listed by their own time")
    args = parser.parse_args()
    import inprocess

    inprocess.configure_logs()
    thread = ServiceThread()
    service = Service(thread, "delegate", args.operation, args.requests, 2, 10_000)
    cpu_per_request(thread, service.connection, 300, service.request, service.seen)  # warm-up
    profiler = cProfile.Profile(time.thread_time)

    async def switch(on: bool) -> None:
        profiler.enable() if on else profiler.disable()

    thread.run(switch(True))
    cpu_per_request(thread, service.connection, args.requests, lambda i: service.request(300 + i), service.seen)
    thread.run(switch(False))
    thread.stop()
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"{args.operation}: {args.requests} requests, {total / args.requests * 1e6:.0f} µs a request under the "
          f"profiler\n")
    print(f"{'share':>7}  part")
    entries = stats.stats  # type: ignore[attr-defined]
    for label, filename, function in PARTS:
        cumulative = sum(value[3] for (path, _, name), value in entries.items()
                         if path.endswith(filename) and name == function)
        print(f"{cumulative / total * 100:6.1f} %  {label}")
    print(f"\nby own time (top {args.top}):")
    for (path, line, name), value in sorted(entries.items(), key=lambda item: -item[1][2])[:args.top]:
        print(f"{value[2] / total * 100:6.1f} %  {value[1]:>7} calls  {name} ({Path(path).name}:{line})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
