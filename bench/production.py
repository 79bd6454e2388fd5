"""What a request costs on the production path: ``tokensvc serve`` on MongoDB, beside the
memory backend.

Two ``tokensvc serve`` processes run side by side, configured alike (the test harness's
configuration, ``tests/service.py``): one on the memory backend, one on MongoDB, where the
MongoDB is the wire tier's three-member replica set (``tests/wire/primary.py``: mockupdb
servers answering as MongoDB 8 does, run in threads of this process, so their CPU is not the
service's). A plain blocking client sends one kind of request after another through one
keep-alive session, over several signed-in tokens in rotation, and reads each response whole.

For each block of requests it takes:

- the service's CPU time per request: utime + stime of the serving process from
  ``/proc/PID/stat`` over the block, less what the process spends idle over as long (its
  relay, its heartbeat, its timers: measured before the blocks, with no request), divided by
  the requests;
- the store commands per request: every command the replica set's members receive over the
  block, less the idle rate of commands (the relay's polling, the driver's monitoring), divided
  by the requests.

The figures are medians over ``--rounds`` rounds; the two backends' blocks alternate within a
round. ``/proc`` counts in clock ticks (10 ms), so a block lasts a second or more.

    python bench/production.py [OPERATION ...] [--rounds 3] [--requests 150] [--ab TREE]

``--ab TREE`` serves MongoDB a third time, from the ``tokensvc`` of ``TREE`` (an export of
another commit: ``git archive``), on a replica set of its own, its blocks alternating with the
others in each round: a change of the MongoDB path is compared inside one run, each block of
this tree's paired with the other's beside it, and the median of the paired ratios printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import requests

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "wire")]

from helpers import CHALLENGE, VERIFIER  # noqa: E402
from primary import ReplicaSet  # noqa: E402
from run import cpu_seconds  # noqa: E402
from service import NOWHERE, WEBAPP_SECRET, Service, hidden_fields, start_service  # noqa: E402

OPERATIONS = ("introspect", "me", "client", "refresh", "exchange")
TOKENS = 8  # signed-in tokens in rotation
IDLE_SECONDS = 3.0
NOT_A_REQUEST = {"endSessions", "killCursors"}
REDIRECT = NOWHERE["webapp"]
OTHER = "mongodb-other"  # the backend --ab serves from another tree
WEBAPP = ("webapp", WEBAPP_SECRET)


class Backend:
    """One serving process, its tokens and (MongoDB) the replica set it is served from."""

    def __init__(self, name: str, service: Service, replica_set: ReplicaSet | None) -> None:
        self.name, self.service, self.replica_set = name, service, replica_set
        self.http = requests.Session()  # the measured requests' one keep-alive connection
        self.agent = requests.Session()  # a browser, signed in once: the codes
        self.tokens: list[dict] = []
        self.idle_cpu = self.idle_commands = 0.0
        self.pid = service.process.pid

    def commands(self) -> int:
        if self.replica_set is None:
            return 0
        with self.replica_set.lock:
            return sum(1 for name, _ in self.replica_set.commands if name not in NOT_A_REQUEST)

    def sign_in(self) -> None:
        base = self.service.base
        page = self.agent.get(base + "/login?next=/")
        form = hidden_fields(page.text)
        form.update(username="alice", password="violet-tide-anchor", next="/")
        response = self.agent.post(base + "/login", data=form, allow_redirects=False)
        assert response.status_code == 302, response.text

    def code(self) -> str:
        url = self.service.base + "/oauth/authorize?" + urlencode({
            "response_type": "code", "client_id": "webapp", "redirect_uri": REDIRECT, "scope": "read write",
            "state": "s", "code_challenge": CHALLENGE, "code_challenge_method": "S256"})
        response = self.agent.get(url, allow_redirects=False)
        assert response.status_code == 302 and "code=" in response.headers["Location"], response.text
        return response.headers["Location"].split("code=")[1].split("&")[0]

    def exchange(self, code: str, session: requests.Session | None = None) -> dict:
        response = (session or self.agent).post(self.service.base + "/oauth/token", auth=WEBAPP, data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "code_verifier": VERIFIER})
        assert response.status_code == 200, response.text
        return response.json()

    def idle(self) -> None:
        """What the process and the replica set do with no request, per second."""
        cpu, commands, started = cpu_seconds(self.pid), self.commands(), time.monotonic()
        time.sleep(IDLE_SECONDS)
        elapsed = time.monotonic() - started
        self.idle_cpu = (cpu_seconds(self.pid) - cpu) / elapsed
        self.idle_commands = (self.commands() - commands) / elapsed


def requests_of(backend: Backend, operation: str, count: int) -> list[Callable[[], None]]:
    """``count`` requests of ``operation``, ready to send (what they need made beforehand)."""
    base, http = backend.service.base, backend.http
    tokens = backend.tokens

    def check(response: requests.Response) -> None:
        assert response.status_code == 200, (operation, response.status_code, response.text[:200])

    def introspect(index: int) -> Callable[[], None]:
        return lambda: check(http.post(base + "/oauth/token/introspect", auth=WEBAPP,
                                       data={"token": tokens[index % len(tokens)]["access_token"]}))

    def me(index: int) -> Callable[[], None]:
        return lambda: check(http.get(base + "/v1/me", headers={
            "Authorization": "Bearer " + tokens[index % len(tokens)]["access_token"]}))

    def client(index: int) -> Callable[[], None]:
        return lambda: check(http.get(base + "/oauth/clients/skyplanner"))

    def refresh(index: int) -> Callable[[], None]:
        def request() -> None:
            held = tokens[index % len(tokens)]
            response = http.post(base + "/oauth/token/refresh", auth=WEBAPP, data={
                "grant_type": "refresh_token", "refresh_token": held["refresh_token"]})
            check(response)
            tokens[index % len(tokens)] = response.json()
        return request

    if operation == "exchange":
        codes = [backend.code() for _ in range(count)]
        return [lambda code=code: backend.exchange(code, http) and None for code in codes]
    made = {"introspect": introspect, "me": me, "client": client, "refresh": refresh}[operation]
    return [made(index) for index in range(count)]


def block(backend: Backend, operation: str, count: int) -> tuple[float, float]:
    """CPU ms and store commands per request of one block, the idle rates taken out."""
    ready = requests_of(backend, operation, count)
    cpu, commands, started = cpu_seconds(backend.pid), backend.commands(), time.monotonic()
    for request in ready:
        request()
    elapsed = time.monotonic() - started
    spent = cpu_seconds(backend.pid) - cpu - backend.idle_cpu * elapsed
    sent = backend.commands() - commands - backend.idle_commands * elapsed
    return spent / count * 1000, max(0.0, sent / count)


def start(tmp: Path, name: str, tree: Path | None = None) -> Backend:
    """The backend ``name`` served, from this tree's tokensvc or from ``tree``'s."""
    replica_set = ReplicaSet(size=3).start() if name != "memory" else None
    storage = "" if replica_set is None else (
        f'[storage]\nbackend = "mongodb"\nmongodb_uri = "{replica_set.uri()}"\n')
    folder = tmp / name
    folder.mkdir()
    other = {} if tree is None else {"env": {"PYTHONPATH": str(tree)}, "cwd": tree}
    backend = Backend(name, start_service(folder, storage, **other).wait_ready(), replica_set)
    backend.sign_in()
    backend.tokens = [backend.exchange(backend.code()) for _ in range(TOKENS)]
    for token in backend.tokens:  # each pair's first use recorded: the steady state writes nothing
        backend.http.get(backend.service.base + "/v1/me",
                         headers={"Authorization": "Bearer " + token["access_token"]})
    return backend


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("operations", nargs="*", metavar="OPERATION", help=", ".join(OPERATIONS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=150, help="requests per block")
    parser.add_argument("--ab", type=Path, metavar="TREE", help="MongoDB served from TREE's tokensvc too, paired")
    args = parser.parse_args()
    operations = args.operations or list(OPERATIONS)
    with tempfile.TemporaryDirectory(prefix="tokensvc-production-") as folder:
        backends = [start(Path(folder), name) for name in ("memory", "mongodb")]
        if args.ab is not None:
            backends.append(start(Path(folder), OTHER, args.ab.resolve()))
        try:
            for backend in backends:
                block(backend, "introspect", 50)  # warm-up
                backend.idle()
            figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for _ in range(args.rounds):
                for operation in operations:
                    for backend in backends:
                        measured = block(backend, operation, args.requests)
                        figures.setdefault((operation, backend.name), []).append(measured)
                        print(f"{operation} {backend.name}: {measured[0]:.3f} ms, {measured[1]:.2f} commands",
                              file=sys.stderr, flush=True)
            report(operations, figures)
            if args.ab is not None:
                paired(operations, figures)
        finally:
            for backend in backends:
                backend.service.stop()
                if backend.replica_set is not None:
                    backend.replica_set.stop()
    return 0


def report(operations: list[str], figures: dict[tuple[str, str], list[tuple[float, float]]]) -> None:
    print(f"{'operation':<12} {'MongoDB ms':>11} {'commands':>9} {'memory ms':>10} {'ratio':>6}")
    for operation in operations:
        mongo = statistics.median(cpu for cpu, _ in figures[(operation, "mongodb")])
        commands = statistics.median(sent for _, sent in figures[(operation, "mongodb")])
        memory = statistics.median(cpu for cpu, _ in figures[(operation, "memory")])
        print(f"{operation:<12} {mongo:>11.3f} {commands:>9.2f} {memory:>10.3f} {mongo / memory:>6.2f}")


def paired(operations: list[str], figures: dict[tuple[str, str], list[tuple[float, float]]]) -> None:
    """This tree's MongoDB CPU a request against the other tree's, block by block in each round."""
    print(f"{'operation':<12} {'this tree ms':>13} {'other tree ms':>14} {'median of paired ratios':>24}")
    for operation in operations:
        mine, other = figures[(operation, "mongodb")], figures[(operation, OTHER)]
        ratios = [ours / theirs for (ours, _), (theirs, _) in zip(mine, other, strict=True) if theirs > 0]
        print(f"{operation:<12} {statistics.median(cpu for cpu, _ in mine):>13.3f} "
              f"{statistics.median(cpu for cpu, _ in other):>14.3f} {statistics.median(ratios):>24.3f}")


if __name__ == "__main__":
    sys.exit(main())
