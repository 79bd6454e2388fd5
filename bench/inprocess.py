"""CPU time per request on one endpoint, measured in process: the figure a speed-up must earn
its place by.

The benchmark's seeded application (``bench/seeded.py``: ``make_app`` over a ``MemoryStore``,
the access log at its default level into a file) is served by Tornado's own ``HTTPServer``
on an event loop in a thread of its own; a plain blocking client in the main thread sends one
kind of request after another over one keep-alive loopback connection and reads each response
whole. What is measured is the service thread's CPU time (``time.thread_time`` read on that
thread before and after a block of requests): the endpoint's own cost, parsing and writing
included, the client's excluded.

A VM's speed drifts by ±10 % from one minute to the next, more than the 3 % a speed-up has
to show. So, as ``make bench`` does with wrk, every block is paired with Tornado's "Hello,
world" (``bench/hello.py``) served the same way just before and after it, in many short
blocks; the figure that compares across runs is the median of the blocks' CPU time as a
multiple of the hello world's (``× hello``), and their mean (``mean``: the share of the
blocks a garbage collection or another pause fell in). µs are given at the hello world's
median speed.

    python bench/inprocess.py [--requests 400] [--repeat 25] [--tokens 10000] [OPERATION ...]

``--ab A B`` measures two variants in one process, their blocks alternating: ``delegate`` (the
service as it is), ``same`` (the same again: the null A/B, the pairs' noise), ``requesthandler``
(every JSON route on a ``RequestHandler`` twin, ``bench/twin.py``), and the switches, which
leave a part of the request's observability out around their own blocks only (an experiment,
never a setting): ``no-access-line``, ``no-metrics``, ``no-request-id`` (one fixed id, none
made), ``quiet`` (all three), ``no-nodelay-toggle`` (Tornado's two ``setsockopt`` calls per
response), ``tornado-writer`` (every JSON answer through Tornado's ``write_headers``, as an
HTTP/1.0 one is, instead of the response writer's one block: with ``requesthandler``, the JSON
adapter alone); and the plain idioms the current mechanisms replaced (``bench/plain.py``):
``plain-access-line``, ``library-metrics``, ``urandom-request-id``, ``plain-observability``
(all three); ``unbounded-feed`` (the revocation feed's reader without the bound on what it has
not taken, for ``revoke-feed``). ``delegate`` against a switch is what that part costs, or saves.

Operations: introspect, me, exchange, refresh, client (all by default), and ``floor``: the
bare Tornado form POST of ``bench/hello.py`` (parse a form, set the no-store headers, write a
small JSON body), the least any form-posting JSON endpoint costs in Tornado, for reference; and
``revoke-feed``: RFC 7009 revocations of distinct access tokens with ``--readers`` revocation
feed readers open (each revocation one message to every reader, its fan-out in the service's
CPU; the readers are read by a thread of their own, outside it; ``--readers 0`` is the
revocation alone). Run it before and
after a change, on the same machine, and compare the operation the change targets.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import tornado.httpserver
import tornado.iostream
import tornado.netutil
import tornado.web

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hello import FloorHandler, MainHandler
from seeded import CLIENT_SECRET, REDIRECT, VERIFIER, fill, settings
from variants import VARIANTS, Variant

from tokensvc.app import make_app
from tokensvc.bootstrap import make_context, seed
from tokensvc.storage.memory import MemoryStore
from tokensvc.telemetry import logs

OPERATIONS = ("introspect", "me", "exchange", "refresh", "client")
FLOOR = "floor"
FEED = "revoke-feed"
BASIC = "Basic " + base64.b64encode(f"bench:{CLIENT_SECRET}".encode()).decode()
REFRESH_TOKEN = re.compile(rb'"refresh_token":"([^"]+)"')
CONTENT_LENGTH = re.compile(rb"\r\nContent-Length: (\d+)", re.I)


def post(path: str, body: str, authorization: str = BASIC) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {authorization}\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode()


def get(path: str, authorization: str | None = None) -> bytes:
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode()


class Connection:
    """A blocking keep-alive client connection."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def send(self, request: bytes) -> bytes:
        self.sock.sendall(request)
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._recv()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status = int(head[9:12])
        if not 200 <= status < 300:
            raise RuntimeError(f"{request.split(b' ', 2)[1]!r} answered {status}: {head!r}")
        match = CONTENT_LENGTH.search(head)
        length = int(match.group(1)) if match else 0
        while len(self.buffer) < length:
            self.buffer += self._recv()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return body

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed the connection")
        return chunk


class ServiceThread:
    """An event loop in a thread of its own, serving Tornado applications."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def cpu(self) -> float:
        """This thread's CPU seconds so far."""
        return self.run(_thread_time())

    def serve(self, app: tornado.web.Application) -> int:
        async def start() -> int:
            sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
            tornado.httpserver.HTTPServer(app).add_sockets(sockets)
            return sockets[0].getsockname()[1]
        return self.run(start())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


async def _thread_time() -> float:
    return time.thread_time()


def cpu_per_request(service: ServiceThread, connection: Connection, requests: int,
                    request: Callable[[int], bytes], seen: Callable[[bytes], None] = lambda body: None) -> float:
    """The service thread's CPU µs per request, over ``requests`` requests."""
    started = service.cpu()
    for i in range(requests):
        seen(connection.send(request(i)))
    return (service.cpu() - started) / requests * 1e6


class Service:
    """One variant of the service, seeded for one operation, and its requests."""

    def __init__(self, thread: ServiceThread, variant: str, operation: str, requests: int, runs: int,
                 tokens: int, readers: int = 0) -> None:
        self.operation = operation
        if operation == FLOOR:
            self.variant = Variant(lambda: [])
            self.connection = Connection(thread.serve(tornado.web.Application([(r"/floor", FloorHandler)])))
            return
        self.variant = VARIANTS[variant]
        self.routes = self.variant.routes()
        out = Path(tempfile.mkdtemp(prefix="tokensvc-inprocess-"))
        config = settings(8080)
        if operation == FEED and hasattr(config, "feed"):  # room for every reader (a release without caps: none)
            # The bench's readers answer no ping: none is sent while it runs.
            caps = {"max_readers": max(readers, 1), "max_readers_per_client": max(readers, 1),
                    "ping_seconds": 3600, "ping_timeout_seconds": 3600}
            config = dataclasses.replace(config, feed=dataclasses.replace(config.feed, **caps))
        store = MemoryStore()
        ctx = make_context(config, store)

        async def prepare() -> None:
            await seed(store, config)
            await fill(ctx, out, tokens, codes=requests * runs if operation == "exchange" else 0,
                       refresh=1 if operation == "refresh" else 0)

        thread.run(prepare())
        self.access = (out / "access.txt").read_text().split()
        self.codes = iter((out / "codes-main1.txt").read_text().split()) if operation == "exchange" else iter(())
        self.chain = [(out / "refresh-main1.txt").read_text().split()[0]] if operation == "refresh" else []
        port = thread.serve(make_app(config, store, ctx, self.routes))
        self.connection = Connection(port)
        if operation == FEED:
            self.readers = FeedReaders(port, readers)

    def request(self, i: int) -> bytes:
        if self.operation == FLOOR:
            return post("/floor", "token=x")
        access, redirect = self.access, quote(REDIRECT, safe="")
        if self.operation == "introspect":
            return post("/oauth/token/introspect", f"token={access[i % len(access)]}")
        if self.operation == "me":
            return get("/v1/me", f"Bearer {access[i % len(access)]}")
        if self.operation == "exchange":
            return post("/oauth/token", f"grant_type=authorization_code&code={next(self.codes)}"
                                        f"&redirect_uri={redirect}&code_verifier={VERIFIER}")
        if self.operation == "refresh":
            return post("/oauth/token/refresh", f"refresh_token={self.chain[-1]}")
        if self.operation == FEED:
            return post("/oauth/token/revoke", f"token={access[i]}")
        return get("/oauth/clients/bench")

    def seen(self, body: bytes) -> None:
        if self.operation == "refresh":
            self.chain.append(REFRESH_TOKEN.search(body).group(1).decode())


READERS = 100  # --readers


class FeedReaders:
    """``count`` readers of the revocation feed (the bench client: first-party, confidential),
    each on a socket of its own, read and discarded by a thread of their own (outside the
    service's CPU), so that none falls behind."""

    def __init__(self, port: int, count: int) -> None:
        import selectors

        self.selector = selectors.DefaultSelector()
        for n in range(count):
            sock = socket.create_connection(("127.0.0.1", port))
            key = base64.b64encode(n.to_bytes(16, "big")).decode()
            sock.sendall((f"GET /oauth/revocations HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n"
                          f"Authorization: {BASIC}\r\n\r\n").encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(4096)
            if not head.startswith(b"HTTP/1.1 101"):
                raise RuntimeError(f"the feed refused reader {n}: {head[:200]!r}")
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            for key, _ in self.selector.select():
                with contextlib.suppress(BlockingIOError):
                    key.fileobj.recv(1 << 20)  # type: ignore[union-attr]


LOG_SINKS = ("file", "pipe")


def configure_logs(sink: str = "file") -> None:
    """The service's logging as ``tokensvc serve`` sets it up: into a file of its own, or into a
    pipe that another process reads (as standard error is under systemd or a container runtime)."""
    config = settings(8080)
    if sink == "pipe":
        reader = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        stream = open(reader.stdin.fileno(), "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    else:
        out = Path(tempfile.mkdtemp(prefix="tokensvc-inprocess-"))
        stream = open(out / "access.log", "w", encoding="utf-8")  # noqa: SIM115
    logs.configure(config.log_format, config.log_level, stream=stream)


def measure(operation: str, requests: int, repeat: int, tokens: int,
            variants: tuple[str, ...] = ("delegate",), sink: str = "file",
            readers: int = 0) -> dict[str, list[tuple[float, float]]]:
    """For each variant, (CPU µs per request, the hello world's around it) of each measured
    block; the variants' blocks alternate, each between two hello world blocks."""
    configure_logs(sink)
    runs = repeat + 1  # the first block warms up
    thread = ServiceThread()
    services = {variant: Service(thread, variant, operation, requests, runs, tokens, readers) for variant in variants}
    hello_connection = Connection(thread.serve(tornado.web.Application([(r"/", MainHandler)])))
    hello_request = get("/")
    results: dict[str, list[tuple[float, float]]] = {variant: [] for variant in variants}
    for run in range(runs):
        offset = run * requests
        before = cpu_per_request(thread, hello_connection, requests // 2, lambda i: hello_request)
        for variant, service in services.items():
            with service.variant.switched():
                spent = cpu_per_request(thread, service.connection, requests,
                                        lambda i, service=service, offset=offset: service.request(offset + i),
                                        service.seen)
            after = cpu_per_request(thread, hello_connection, requests // 2, lambda i: hello_request)
            if run:
                results[variant].append((spent, (before + after) / 2))
            before = after
    thread.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("operations", nargs="*", metavar="OPERATION", help=", ".join(OPERATIONS))
    parser.add_argument("--requests", type=int, default=400, help="requests per block")
    parser.add_argument("--repeat", type=int, default=25, help="blocks measured, after one warm-up")
    parser.add_argument("--tokens", type=int, default=10_000, help="live access tokens in the store")
    parser.add_argument("--readers", type=int, default=READERS, help=f"revocation feed readers open ({FEED})")
    parser.add_argument("--log-sink", choices=LOG_SINKS, default="file",
                        help="where the log lines go: a file (the default), or a pipe another process reads")
    parser.add_argument("--ab", nargs=2, metavar=("A", "B"), choices=sorted(VARIANTS),
                        help="compare two variants, block by block: " + ", ".join(sorted(VARIANTS)))
    args = parser.parse_args()
    unknown = set(args.operations) - {*OPERATIONS, FLOOR, FEED}
    if unknown:
        parser.error(f"unknown operation(s): {', '.join(sorted(unknown))}")
    variants = tuple(args.ab or ("delegate",))
    print(f"{'operation':<12} {'variant':<15} {'× hello':>8} {'mean':>6} {'min':>6} {'max':>6} "
          f"{'µs CPU/request':>15} {'hello µs':>9}")
    for operation in args.operations or OPERATIONS:
        measured = measure(operation, args.requests, args.repeat, args.tokens, variants, args.log_sink, args.readers)
        medians = {}
        for variant, pairs in measured.items():
            ratios = [spent / hello for spent, hello in pairs]
            typical = statistics.median(hello for _, hello in pairs)
            medians[variant] = statistics.median(ratios)
            print(f"{operation:<12} {variant:<15} {medians[variant]:>8.3f} {statistics.mean(ratios):>6.3f} "
                  f"{min(ratios):>6.3f} {max(ratios):>6.3f} "
                  f"{medians[variant] * typical:>15.1f} {typical:>9.1f}", flush=True)
        if args.ab:
            a, b = variants
            paired = [(sa / ha) / (sb / hb) for (sa, ha), (sb, hb) in zip(measured[a], measured[b], strict=True)]
            ratio = statistics.median(paired)
            print(f"{operation:<12} {a} / {b}: median of the paired blocks {ratio:.3f} "
                  f"({a} {'saves' if ratio < 1 else 'costs'} {abs(1 - ratio) * 100:.1f} % of {b}'s CPU)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
