"""CPU time per request, measured in process: the figure a speed-up must earn its place by.

Serves the benchmark's seeded application (``bench/seeded.py``: ``make_app`` over a
``MemoryStore``, the access log at its default level into a file) with Tornado's own
``HTTPServer`` over a socket pair in this process, and sends one kind of request after
another over that one keep-alive connection, reading each response whole. It prints the
process's CPU time (``time.process_time``) per request: the median of the repetitions, with
the lowest and highest. The client's share (writing a request, reading a response) is the same
for every version of the service, so the difference between two runs is the service's.

A VM's speed drifts by ±10 % from one minute to the next, more than the 3 % a speed-up has
to show. So, as ``make bench`` does with wrk, each repetition is paired with Tornado's "Hello,
world" (``bench/hello.py``) served the same way, in the same process, just before and after
it; the figure that compares across runs is the request's CPU time as a multiple of the hello
world's (``× hello``), and µs are given at the hello world's median speed.

    python bench/inprocess.py [--requests 400] [--repeat 25] [--tokens 10000] [OPERATION ...]

Operations: introspect, me, exchange, refresh, client (all by default). Run it before and
after a change, on the same machine, and compare the operation the change targets.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import re
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import tornado.httpserver
import tornado.iostream
import tornado.web

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hello import MainHandler  # noqa: E402
from seeded import CLIENT_SECRET, REDIRECT, VERIFIER, fill, settings  # noqa: E402
from tokensvc import logs  # noqa: E402
from tokensvc.app import make_app  # noqa: E402
from tokensvc.bootstrap import seed  # noqa: E402
from tokensvc.oauth.context import OAuthContext  # noqa: E402
from tokensvc.storage.memory import MemoryStore  # noqa: E402

OPERATIONS = ("introspect", "me", "exchange", "refresh", "client")
BASIC = "Basic " + base64.b64encode(f"bench:{CLIENT_SECRET}".encode()).decode()
REFRESH_TOKEN = re.compile(rb'"refresh_token":"([^"]+)"')


def post(path: str, body: str, authorization: str = BASIC) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: {authorization}\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode()


def get(path: str, authorization: str | None = None) -> bytes:
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\n{auth}\r\n".encode()


class Client:
    """One keep-alive connection to the server, over a socket pair."""

    def __init__(self, server: tornado.httpserver.HTTPServer) -> None:
        ours, theirs = socket.socketpair()
        server.handle_stream(tornado.iostream.IOStream(theirs), ("127.0.0.1", 50000))
        self.stream = tornado.iostream.IOStream(ours)

    async def send(self, request: bytes) -> bytes:
        await self.stream.write(request)
        head = await self.stream.read_until(b"\r\n\r\n")
        status = int(head[9:12])
        if not 200 <= status < 300:
            raise RuntimeError(f"{request.split(b' ', 2)[1]!r} answered {status}: {head!r}")
        length = int(re.search(rb"\r\nContent-Length: (\d+)", head).group(1))
        return await self.stream.read_bytes(length) if length else b""


async def cpu_per_request(client: Client, requests: int, request) -> float:
    """CPU µs per request for ``requests`` requests made by ``request(i)``."""
    started = time.process_time()
    for i in range(requests):
        await client.send(request(i))
    return (time.process_time() - started) / requests * 1e6


async def measure(operation: str, requests: int, repeat: int, tokens: int) -> list[tuple[float, float]]:
    """(CPU µs per request, the hello world's around it) for each measured repetition."""
    out = Path(tempfile.mkdtemp(prefix="tokensvc-inprocess-"))
    config = settings(8080)
    logs.configure(config.log_format, config.log_level, stream=open(out / "access.log", "w"))  # noqa: SIM115
    store = MemoryStore()
    ctx = OAuthContext.from_settings(config, store)
    await seed(store, config)
    runs = repeat + 1  # the first run warms up
    await fill(ctx, out, tokens, codes=requests * runs if operation == "exchange" else 0,
               refresh=1 if operation == "refresh" else 0)
    access = (out / "access.txt").read_text().split()
    codes = iter((out / "codes-main1.txt").read_text().split()) if operation == "exchange" else iter(())
    refresh = (out / "refresh-main1.txt").read_text().split()[0] if operation == "refresh" else ""
    redirect = quote(REDIRECT, safe="")

    def request(i: int) -> bytes:
        nonlocal refresh
        if operation == "introspect":
            return post("/oauth/token/introspect", f"token={access[i % len(access)]}")
        if operation == "me":
            return get("/v1/me", f"Bearer {access[i % len(access)]}")
        if operation == "exchange":
            return post("/oauth/token", f"grant_type=authorization_code&code={next(codes)}"
                                        f"&redirect_uri={redirect}&code_verifier={VERIFIER}")
        if operation == "refresh":
            return post("/oauth/token/refresh", f"refresh_token={refresh}")
        return get("/oauth/clients/bench")

    server = tornado.httpserver.HTTPServer(make_app(config, store, ctx))
    client = Client(server)
    hello_server = tornado.httpserver.HTTPServer(tornado.web.Application([(r"/", MainHandler)]))
    hello = Client(hello_server)
    hello_request = get("/")
    results = []
    for run in range(runs):
        before = await cpu_per_request(hello, requests // 2, lambda i: hello_request)
        started = time.process_time()
        for i in range(requests):
            body = await client.send(request(run * requests + i))
            if operation == "refresh":
                refresh = REFRESH_TOKEN.search(body).group(1).decode()
        spent = time.process_time() - started
        after = await cpu_per_request(hello, requests // 2, lambda i: hello_request)
        if run:
            results.append((spent / requests * 1e6, (before + after) / 2))
    server.stop()
    hello_server.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("operations", nargs="*", metavar="OPERATION", help=", ".join(OPERATIONS))
    parser.add_argument("--requests", type=int, default=400, help="requests per repetition")
    parser.add_argument("--repeat", type=int, default=25, help="repetitions measured, after one warm-up")
    parser.add_argument("--tokens", type=int, default=10_000, help="live access tokens in the store")
    parser.add_argument("--raw", action="store_true", help="µs as measured, not at the hello world's median speed")
    args = parser.parse_args()
    unknown = set(args.operations) - set(OPERATIONS)
    if unknown:
        parser.error(f"unknown operation(s): {', '.join(sorted(unknown))}")
    print(f"{'operation':<12} {'× hello':>8} {'min':>6} {'max':>6} {'µs CPU/request':>15} {'hello µs':>9}")
    for operation in args.operations or OPERATIONS:
        pairs = asyncio.run(measure(operation, args.requests, args.repeat, args.tokens))
        ratios = [us / hello for us, hello in pairs]
        typical = statistics.median(hello for _, hello in pairs)
        us = statistics.median(us for us, _ in pairs) if args.raw else statistics.median(ratios) * typical
        print(f"{operation:<12} {statistics.median(ratios):>8.3f} {min(ratios):>6.3f} {max(ratios):>6.3f} "
              f"{us:>15.1f} {typical:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
