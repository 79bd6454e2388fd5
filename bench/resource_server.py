"""What protecting an API with ``tokensvc.resource`` costs and saves, and how fast a revocation
reaches it (docs/performance.md, "Protecting an API").

    python bench/resource_server.py cached [--checks 200000]
    python bench/resource_server.py run [--tokens 500] [--requests 20000] [--revoked 0.02]
    python bench/resource_server.py latency [--tokens 1000] [--workers 3] [--services 2] [--revocations 200]
    python bench/resource_server.py flush [--watches 8000] [--revoked 0.01]
    python bench/resource_server.py gate [--checks 20000] [--revocations 100]

``cached``: CPU time per check of a cached token (``Verifier.check``) with the feed up (the
answer current: a hit, checked to be one), in process, against a real tokensvc on the memory
backend (``time.process_time`` over the loop; the introspection that filled the cache is not
counted). ``run``: a realistic run in process: ``--tokens`` users'
tokens, ``--requests`` checks spread over them by a Zipf-like popularity (a few busy clients,
a long tail), a share of the tokens revoked along the way (each revocation then makes its
token's next check ask again); it counts the introspections the verifier made against the
checks. ``latency``: ``--services`` ``tokensvc serve`` processes on the wire tier's scripted
MongoDB primary (tests/wire/primary.py; change streams, so each process's relay hears the
others), ``--tokens`` access tokens, ``--workers`` resource-server processes (each a Verifier,
the workers spread over the services, every token cached in every worker), then
``--revocations`` tokens revoked one after another (RFC 7009) through the first service; each
worker records when its check of a revoked token is refused (the feed dropped the entry, the
check asked tokensvc again and was told "inactive"). Latency: that moment minus the moment the
revocation was sent, over every (token, worker); p50 and p99. ``flush``: ``--watches`` watched
connections (``Verifier.watch``, every token its own family) on one verifier in process, a share
of their tokens revoked without the feed hearing of it, then a flush (the relay interrupted):
how many connections were closed, rightly and wrongly, and how long asking again took.
``gate``: ``tokensvc gate``'s server (its Tornado application) on a thread and event loop of its
own, beside a tokensvc on the memory backend in the main thread: the gate thread's CPU time per
check of a cached token (``--checks`` nginx checks over one kept-alive connection, sent by a third
thread), beside a Tornado "Hello, world" handler served the same way; then ``--revocations``
tokens, each cached at the gate, revoked (RFC 7009 through the protocol core) and checked again
until refused: from the revocation's start to the gate's first 401, p50 and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "wire")]

RESOURCE_SERVER = ('\n[[clients]]\nclient_id = "bench-api"\nname = "Bench API"\nkind = "resource-server"\n'
                   'client_secret = "bench-api-secret-0123456789abcdef0123456789"\n')
API_SECRET = "bench-api-secret-0123456789abcdef0123456789"
TEST_WEBAPP_SECRET = "webapp-test-secret-0123456789abcdef"  # tests/helpers.py's configuration, which runs in process


def issue(base: str, count: int) -> list[str]:
    """``count`` access tokens of alice through the web app (the code flow with PKCE, signed in
    once): each its own family."""
    import requests
    from helpers import CHALLENGE, VERIFIER
    from service import NOWHERE, WEBAPP_SECRET, hidden_fields

    browser = requests.Session()
    page = browser.get(base + "/login", timeout=30)
    browser.post(base + "/login", data={**hidden_fields(page.text), "username": "alice",
                                        "password": "violet-tide-anchor"}, allow_redirects=False, timeout=30)
    issued = []
    for _ in range(count):
        answer = browser.get(base + "/oauth/authorize", allow_redirects=False, timeout=30, params={
            "response_type": "code", "client_id": "webapp", "redirect_uri": NOWHERE["webapp"], "scope": "read",
            "state": "s", "code_challenge": CHALLENGE, "code_challenge_method": "S256"})
        code = answer.headers["Location"].split("code=")[1].split("&")[0]
        tokens = requests.post(base + "/oauth/token", auth=("webapp", WEBAPP_SECRET), timeout=30, data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": NOWHERE["webapp"],
            "code_verifier": VERIFIER}).json()
        issued.append(tokens["access_token"])
    return issued


def revoke(base: str, token: str, secret: str | None = None) -> None:
    """RFC 7009, as the web app; ``secret``: the web app's, when not the e2e configuration's."""
    import requests
    from service import WEBAPP_SECRET

    answer = requests.post(base + "/oauth/token/revoke", data={"token": token},
                           auth=("webapp", secret or WEBAPP_SECRET), timeout=30)
    assert answer.status_code == 200, answer.text


# -- in process ------------------------------------------------------------------------------------


async def in_process(action: Any) -> Any:
    """``action(base, issue, ctx)`` beside a tokensvc on the memory backend, served in this
    process (``ctx``: its context)."""
    import tornado.httpserver
    import tornado.testing
    from helpers import make_config

    from tokensvc.app import make_app
    from tokensvc.bootstrap import make_context, seed
    from tokensvc.config import ClientSeed
    from tokensvc.storage.memory import MemoryStore

    sock, port = tornado.testing.bind_unused_port()
    base = f"http://127.0.0.1:{port}"
    base_config = make_config(base_url=base, auth_url=base)
    config = make_config(base_url=base, auth_url=base, clients=[
        *[{name: getattr(client, name) for name in ClientSeed.__dataclass_fields__} for client in base_config.clients],
        {"client_id": "bench-api", "name": "Bench API", "kind": "resource-server", "client_secret": API_SECRET}])
    store = MemoryStore()
    await seed(store, config)
    ctx = make_context(config, store)
    server = tornado.httpserver.HTTPServer(make_app(config, store, ctx))
    server.add_sockets([sock])

    async def issue_tokens(count: int) -> list[str]:
        from helpers import issue_tokens as issue_one
        return [(await issue_one(ctx, "alice", "read")).access_token for _ in range(count)]

    try:
        return await action(base, issue_tokens, ctx)
    finally:
        server.stop()


def verifier_for(base: str, **settings: Any) -> Any:
    from tokensvc.resource import Settings, Verifier

    return Verifier(Settings(base, "bench-api", API_SECRET, **settings))


async def cached(args: argparse.Namespace) -> None:
    async def measure(base: str, issue_tokens: Any, ctx: Any) -> None:
        token = (await issue_tokens(1))[0]
        verifier = verifier_for(base)
        await verifier.start()  # the feed up: a cached answer is current (no offline_ttl bound to check)
        await asyncio.wait_for(verifier.connected.wait(), 30)
        await verifier.check(token, "read")
        figures = []
        try:
            for _ in range(5):
                hits, started = verifier.counts.hits, time.process_time()
                for _ in range(args.checks):
                    await verifier.check(token, "read")
                figures.append((time.process_time() - started) / args.checks * 1e6)
                assert verifier.feed_up and verifier.counts.hits - hits == args.checks, "not a feed-up cache hit"
        finally:
            await verifier.close()
        print(f"cached check, feed up: {statistics.median(figures):.2f} µs of CPU (median of 5 rounds of "
              f"{args.checks}; {min(figures):.2f}-{max(figures):.2f})")

    await in_process(measure)


async def run(args: argparse.Namespace) -> None:
    async def measure(base: str, issue_tokens: Any, ctx: Any) -> None:
        tokens = await issue_tokens(args.tokens)
        verifier = verifier_for(base)
        await verifier.start()
        await asyncio.wait_for(verifier.connected.wait(), 30)
        chooser = random.Random(40)
        weights = [1 / (rank + 1) for rank in range(len(tokens))]  # Zipf, s = 1
        revoke_at = set(chooser.sample(range(args.requests), int(args.tokens * args.revoked)))
        refused = 0
        from tokensvc.resource import InvalidToken
        for number, token in enumerate(chooser.choices(tokens, weights, k=args.requests)):
            if number in revoke_at:
                victim = chooser.choice(tokens)
                await asyncio.get_running_loop().run_in_executor(None, revoke, base, victim, TEST_WEBAPP_SECRET)
            try:
                await verifier.check(token, "read")
            except InvalidToken:
                refused += 1
        counts = verifier.counts
        await verifier.close()
        print(f"{args.requests} checks of {args.tokens} tokens (Zipf), {len(revoke_at)} revocations: "
              f"{counts.introspections} introspections ({counts.introspections / args.requests:.1%} of the checks; "
              f"{args.requests - counts.introspections} saved), {counts.revocations} feed revocations, "
              f"{refused} checks refused")

    await in_process(measure)


async def flush(args: argparse.Namespace) -> None:
    async def measure(base: str, issue_tokens: Any, ctx: Any) -> None:
        from tokensvc.resource import Unavailable

        tokens = await issue_tokens(args.watches)
        verifier = verifier_for(base, max_entries=args.watches + 10)
        await verifier.start()
        await asyncio.wait_for(verifier.connected.wait(), 30)

        async def authorized(token: str) -> Any:
            while True:
                try:
                    return await verifier.check(token, "read")
                except Unavailable:
                    await asyncio.sleep(0.1)

        answers = []
        for start in range(0, len(tokens), 8):
            answers += await asyncio.gather(*(authorized(token) for token in tokens[start:start + 8]))
        ended: set[str] = set()
        for token, answer in zip(tokens, answers, strict=True):
            verifier.watch(token, answer, lambda token=token: ended.add(token))
        revoked = set(random.Random(40).sample(tokens, int(len(tokens) * args.revoked)))
        publish, ctx.events.publish = ctx.events.publish, lambda revocation: None  # missed by the feed
        try:
            for token in revoked:
                await revoke_in_process(ctx, token)
        finally:
            ctx.events.publish = publish
        asked, started = verifier.counts.introspections, time.monotonic()
        ctx.events.publish_all()  # the relay was interrupted: the feed says flush
        while verifier.counts.flushes < 2 or verifier.reverifying:
            await asyncio.sleep(0.05)
        took = time.monotonic() - started
        await verifier.close()
        print(f"{len(tokens)} watched connections, a flush, {len(revoked)} of the tokens revoked unannounced: "
              f"{len(ended & revoked)} revoked closed, {len(ended - revoked)} closed wrongly, "
              f"{verifier.counts.introspections - asked} introspections in {took:.1f} s")

    await in_process(measure)


async def revoke_in_process(ctx: Any, token: str) -> None:
    """RFC 7009 through the protocol core, as the web app."""
    from tokensvc.oauth import revocation

    await revocation.revoke_token(ctx, token, await ctx.store.get_client("webapp"))


async def gate(args: argparse.Namespace) -> None:
    import http.client
    import threading

    import tornado.httpserver
    import tornado.web

    from tokensvc.gate import Gate
    from tokensvc.gate.server import make_app
    from tokensvc.gate.settings import from_dict

    class Hello(tornado.web.RequestHandler):
        def get(self) -> None:
            self.write("Hello, world")

    async def measure(base: str, issue_tokens: Any, ctx: Any) -> None:
        settings = from_dict({"tokensvc_url": base, "client_id": "bench-api", "client_secret": API_SECRET,
                              "scope": "read", "verifier": {"max_entries": args.revocations + 10}})
        served: dict[str, Any] = {}
        started = threading.Event()

        def gate_thread() -> None:
            async def run() -> None:
                from tokensvc.resource import Verifier
                verifier = Verifier(settings.verifier_settings())
                await verifier.start()
                app = make_app(Gate(settings, verifier))
                app.add_handlers(r".*", [(r"/hello", Hello)])
                server = tornado.httpserver.HTTPServer(app)
                sock, port = tornado.testing.bind_unused_port()
                server.add_sockets([sock])
                served.update(port=port, verifier=verifier, loop=asyncio.get_running_loop(), stop=asyncio.Event())
                await asyncio.wait_for(verifier.connected.wait(), 30)
                started.set()
                await served["stop"].wait()
                await verifier.close()
                server.stop()
            asyncio.run(run())

        import tornado.testing
        thread = threading.Thread(target=gate_thread, daemon=True)
        thread.start()
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        gate_loop = served["loop"]

        def gate_cpu() -> float:  # the gate thread's CPU time, read on that thread
            return asyncio.run_coroutine_threadsafe(_thread_time(), gate_loop).result()

        def requests_over_one_connection(path: str, headers: dict[str, str], count: int) -> list[int]:
            connection = http.client.HTTPConnection("127.0.0.1", served["port"])
            statuses = []
            for _ in range(count):
                connection.request("GET", path, headers=headers)
                answer = connection.getresponse()
                answer.read()
                statuses.append(answer.status)
            connection.close()
            return statuses

        loop = asyncio.get_running_loop()
        token = (await issue_tokens(1))[0]
        check = {"Authorization": f"Bearer {token}", "X-Original-URI": "/notes/1", "X-Original-Method": "GET"}
        figures: dict[str, list[float]] = {"check": [], "hello": []}
        for _ in range(5):
            for name, path, headers in (("check", "/auth/nginx", check), ("hello", "/hello", {})):
                before = await loop.run_in_executor(None, gate_cpu)
                statuses = await loop.run_in_executor(None, requests_over_one_connection, path, headers, args.checks)
                spent = await loop.run_in_executor(None, gate_cpu) - before
                assert set(statuses) == {200}, set(statuses)
                figures[name].append(spent / args.checks * 1e6)
        counts = served["verifier"].counts
        assert counts.introspections == 1, "every check but the first a cache hit"
        check_us, hello_us = statistics.median(figures["check"]), statistics.median(figures["hello"])
        print(f"a cached check at the gate: {check_us:.1f} µs of the gate thread's CPU (median of 5 rounds of "
              f"{args.checks}; {min(figures['check']):.1f}-{max(figures['check']):.1f}); hello world "
              f"{hello_us:.1f} µs; {check_us / hello_us:.2f} x hello", flush=True)

        tokens = await issue_tokens(args.revocations)
        for each in tokens:
            headers = {**check, "Authorization": f"Bearer {each}"}
            assert (await loop.run_in_executor(None, requests_over_one_connection, "/auth/nginx", headers, 1)) == [200]
        latencies = []
        for each in tokens:
            headers = {**check, "Authorization": f"Bearer {each}"}
            began = time.perf_counter()
            await revoke_in_process(ctx, each)
            while True:  # a benchmark, not a test: asks at once, again and again
                status = (await loop.run_in_executor(None, requests_over_one_connection, "/auth/nginx", headers,
                                                     1))[0]
                if status == 401:
                    break
                await asyncio.sleep(0)
            latencies.append((time.perf_counter() - began) * 1000)
        latencies.sort()
        gate_loop.call_soon_threadsafe(served["stop"].set)
        thread.join(30)
        p50, p99 = latencies[len(latencies) // 2], latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(f"revocation to refusal at the gate ({len(latencies)} tokens): p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
              f"max {latencies[-1]:.1f} ms", flush=True)

    await in_process(measure)


async def _thread_time() -> float:
    return time.thread_time()


# -- several processes ---------------------------------------------------------------------------


async def worker(args: argparse.Namespace) -> None:
    """A resource-server process: caches every token, then records, for each token a feed
    message names, when its entry was dropped (from then on no check is served from the cache)
    and when the check that follows was refused. Says ``ready``; on ``done`` prints its records
    (JSON)."""
    import hashlib

    from tokensvc.resource import InvalidToken, Settings, Unavailable, Verifier
    from tokensvc.resource.cache import AnswerCache

    tokens = Path(args.tokens_file).read_text().split()
    dropped_at: dict[int, float] = {}
    refused: dict[int, float] = {}
    by_key: dict[bytes, int] = {}

    class Recording(AnswerCache):
        def revoke(self, named: tuple[str, str]) -> list[bytes]:
            dropped = super().revoke(named)
            now = time.time()
            for index in (by_key[key] for key in dropped if key in by_key):
                dropped_at[index] = now
                asyncio.ensure_future(refusal(index))
            return dropped

    async def refusal(index: int) -> None:
        try:
            await verifier.check(tokens[index])
        except InvalidToken:
            refused[index] = time.time()

    settings = Settings(args.base, "bench-api", API_SECRET, max_entries=len(tokens) + 10, timeout=60)
    verifier = Verifier(settings, cache=Recording(settings, time.monotonic))
    await verifier.start()
    await asyncio.wait_for(verifier.connected.wait(), 60)
    for index, token in enumerate(tokens):
        by_key[hashlib.sha256(token.encode()).digest()] = index
    async def cache(token: str) -> None:
        for _ in range(5):  # the wire tier's scripted primary, busy, may answer 503 for a while
            try:
                await verifier.check(token)
                return
            except Unavailable:
                await asyncio.sleep(1)
        raise RuntimeError("tokensvc kept answering 503")

    for start in range(0, len(tokens), 4):  # cache every token, 4 introspections at a time
        await asyncio.gather(*(cache(token) for token in tokens[start:start + 4]))
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    print(json.dumps({"dropped": dropped_at, "refused": refused}), flush=True)
    await verifier.close()


def latency(args: argparse.Namespace) -> None:
    from primary import ReplicaSet
    from service import end

    primary = ReplicaSet().start()
    storage = (f'[storage]\nbackend = "mongodb"\nmongodb_uri = "{primary.uri()}"\ntimeout_ms = 5000\n'
               if args.services > 1 else "")
    services, workers = [], []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            measure_latency(args, Path(tmp), storage, services, workers)
        finally:
            for process in workers:
                end(process)
            for service in services:
                service.stop()
            primary.stop()


def measure_latency(args: argparse.Namespace, tmp: Path, storage: str, services: list, workers: list) -> None:
    from service import spawn, start_service

    for number in range(args.services):
        folder = tmp / f"service{number}"
        folder.mkdir()
        services.append(start_service(folder, storage, extra=RESOURCE_SERVER))
    started = time.monotonic()
    tokens = issue(services[0].base, args.tokens)
    print(f"{len(tokens)} tokens issued in {time.monotonic() - started:.0f} s", flush=True)
    tokens_file = tmp / "tokens"
    tokens_file.write_text("\n".join(tokens))
    started = time.monotonic()
    for number in range(args.workers):
        base = services[number % len(services)].base
        workers.append(spawn([sys.executable, __file__, "worker", "--base", base, "--tokens-file",
                              str(tokens_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}))
    for process in workers:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    print(f"{args.workers} workers ready in {time.monotonic() - started:.0f} s, every token cached in each",
          flush=True)
    chooser = random.Random(40)
    sent: dict[int, tuple[float, float]] = {}  # when each revocation was sent, and answered
    for index in chooser.sample(range(len(tokens)), args.revocations):
        before = time.time()
        revoke(services[0].base, tokens[index])
        sent[index] = (before, time.time())
    time.sleep(5)  # a benchmark, not a test: the last refusals arrive
    figures: dict[str, list[float]] = {"sent to dropped": [], "answered to dropped": [], "sent to refused": []}
    missing = 0
    for process in workers:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write("done\n")
        process.stdin.flush()
        report = json.loads(process.stdout.readline())
        dropped = {int(index): moment for index, moment in report["dropped"].items()}
        refused = {int(index): moment for index, moment in report["refused"].items()}
        for index, (before, answered) in sent.items():
            if index not in dropped or index not in refused:
                missing += 1
                continue
            figures["sent to dropped"].append((dropped[index] - before) * 1000)
            figures["answered to dropped"].append((dropped[index] - answered) * 1000)
            figures["sent to refused"].append((refused[index] - before) * 1000)
    print(f"{args.revocations} revocations x {args.workers} workers, {args.services} tokensvc processes; "
          f"{missing} never refused", flush=True)
    for name, samples in figures.items():
        samples.sort()
        p50 = samples[len(samples) // 2]
        p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
        print(f"  {name}: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {samples[-1]:.1f} ms ({len(samples)})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    subs = parser.add_subparsers(dest="what", required=True)
    sub = subs.add_parser("cached")
    sub.add_argument("--checks", type=int, default=200_000)
    sub = subs.add_parser("run")
    sub.add_argument("--tokens", type=int, default=500)
    sub.add_argument("--requests", type=int, default=20_000)
    sub.add_argument("--revoked", type=float, default=0.02)
    sub = subs.add_parser("latency")
    sub.add_argument("--tokens", type=int, default=1000)
    sub.add_argument("--workers", type=int, default=3)
    sub.add_argument("--services", type=int, default=2, help="1: the memory backend, one process")
    sub.add_argument("--revocations", type=int, default=200)
    sub = subs.add_parser("flush")
    sub.add_argument("--watches", type=int, default=8000)
    sub.add_argument("--revoked", type=float, default=0.01)
    sub = subs.add_parser("gate")
    sub.add_argument("--checks", type=int, default=20_000)
    sub.add_argument("--revocations", type=int, default=100)
    sub = subs.add_parser("worker")
    sub.add_argument("--base", required=True)
    sub.add_argument("--tokens-file", required=True)
    args = parser.parse_args()
    if args.what == "latency":
        latency(args)
    else:
        asyncio.run({"cached": cached, "run": run, "flush": flush, "gate": gate, "worker": worker}[args.what](args))


if __name__ == "__main__":
    main()
