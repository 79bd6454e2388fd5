"""``tokensvc serve`` processes on the MongoDB backend, their store the scripted primary: a
deploy's SIGTERM lets the requests in flight finish, the failure limits hold across
processes, a scrape of any worker of ``--processes N`` counts every worker's requests, and the
supervisor of ``--processes N`` stops, restarts and reaps its workers."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlencode

import pytest
import requests
from helpers import CHALLENGE, VERIFIER, eventually, wait_until
from primary import Fault, ReplicaSet
from service import NOWHERE, WEBAPP_SECRET, start_service, user_agent_authorize
from test_request_metrics import scraped
from tornado.websocket import websocket_connect

from tokensvc.telemetry import metrics

pytestmark = pytest.mark.e2e


def mongodb(primary: ReplicaSet) -> str:
    return f'[storage]\nbackend = "mongodb"\nmongodb_uri = "{primary.uri()}"\ntimeout_ms = 3000\n'


def code_for(base: str) -> str:
    url = base + "/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": "webapp", "redirect_uri": NOWHERE["webapp"], "scope": "read",
        "state": "s", "code_challenge": CHALLENGE, "code_challenge_method": "S256"})
    landed = user_agent_authorize(url)
    return landed.split("code=")[1].split("&")[0]


def exchange(base: str, code: str) -> requests.Response:
    return requests.post(base + "/oauth/token", auth=("webapp", WEBAPP_SECRET), timeout=30, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": NOWHERE["webapp"],
        "code_verifier": VERIFIER})


@pytest.fixture
def primary():
    server = ReplicaSet().start()
    yield server
    server.stop()


def test_sigterm_lets_the_requests_in_flight_finish_before_the_store_closes(tmp_path, primary):
    service = start_service(tmp_path, mongodb(primary)).wait_ready()
    code = code_for(service.base)
    # The exchange's consumption takes 1.5 s; the deploy's SIGTERM comes while the store has it.
    primary.script(Fault("findAndModify", "delay", collection="codes", seconds=1.5))
    answer: list[requests.Response] = []
    request = threading.Thread(target=lambda: answer.append(exchange(service.base, code)))
    request.start()
    wait_until(lambda: primary.sent("findAndModify", "codes"), "the exchange at the store")
    started = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    request.join(30)
    output = service.stop()
    assert answer and answer[0].status_code == 200, (answer and answer[0].text, output)
    assert "access_token" in answer[0].json()
    assert service.returncode == 0 and time.monotonic() - started < 10
    assert "Traceback" not in output and "store fault" not in output and " 500 " not in output


def test_failure_limits_hold_across_real_processes(tmp_path_factory, primary):
    """40 concurrent wrong client secrets and 40 wrong passwords from one address, spread over
    three processes: at most the limit's worth are answered 401, the rest 429."""
    services = []
    try:
        for index in range(3):
            services.append(start_service(tmp_path_factory.mktemp(f"p{index}"), mongodb(primary)))
            services[-1].wait_ready()

        def wrong_secret(index: int) -> int:
            base = services[index % 3].base
            return requests.post(base + "/oauth/token", auth=("webapp", f"wrong-{index}"), timeout=30, data={
                "grant_type": "authorization_code", "code": "x", "redirect_uri": NOWHERE["webapp"],
                "code_verifier": VERIFIER}).status_code

        def wrong_password(index: int) -> int:
            agent = requests.Session()
            base = services[index % 3].base
            agent.get(base + "/login", timeout=30)
            return agent.post(base + "/login", timeout=30, allow_redirects=False, data={
                "username": "bob", "password": f"wrong-{index}", "_xsrf": agent.cookies["_xsrf"]}).status_code

        with ThreadPoolExecutor(40) as pool:
            secrets_answered = list(pool.map(wrong_secret, range(40)))
            passwords_answered = list(pool.map(wrong_password, range(40)))
    finally:
        outputs = [service.stop() for service in services]
    assert set(secrets_answered) <= {401, 429} and set(passwords_answered) <= {401, 429}, outputs
    assert 1 <= secrets_answered.count(401) <= 10  # limits.failed_client_auth_per_client
    assert 1 <= passwords_answered.count(401) <= 5  # limits.failed_logins_per_username


def test_a_process_that_disagrees_on_the_cli_client_with_a_running_one_warns(tmp_path_factory, primary):
    """Two ``tokensvc serve`` on one store, the second with ``admin.cli_client`` off: it warns
    at start-up that the running one says otherwise (its entry among the running processes says
    so); the first, started alone, did not."""
    services = []
    try:
        services.append(start_service(tmp_path_factory.mktemp("on"), mongodb(primary)).wait_ready())
        services.append(start_service(tmp_path_factory.mktemp("off"), mongodb(primary),
                                      env={"TOKENSVC_ADMIN_CLI_CLIENT": "false"}).wait_ready())
    finally:
        on, off = (service.stop() for service in services)
    assert "admin.cli_client is false here and true at 1 running instance of this store" in off, off
    assert "admin.cli_client" not in on, on


def test_a_scrape_of_any_worker_counts_every_workers_requests(tmp_path, primary):
    """``--processes 2``: 30 requests on connections of their own, each taken by whichever
    worker the kernel hands it to. A worker's own requests count in its scrape at once, the
    other's within a second: soon every scrape, whichever worker answers it, counts all 30."""
    directory = tmp_path / "metrics"
    service = start_service(tmp_path, mongodb(primary), args=("--processes", "2"),
                            env={metrics.MULTIPROCESS_ENV: str(directory)}).wait_ready()
    try:
        for _ in range(30):
            assert requests.get(service.base + "/oauth/clients/webapp", timeout=30).status_code == 200
        deadline, agreeing = time.monotonic() + 20, 0
        while agreeing < 8:  # scrapes in a row, on connections of their own, that count all 30
            agreeing = agreeing + 1 if counted(service.base) == 30 else 0
            assert time.monotonic() < deadline, counted(service.base)
        # A worker writes its numbers within a second of a change: one that took every request
        # and every scrape counted them from memory, and may not have written them yet.
        while not (workers := {path.name for path in directory.glob("tokensvc_http_*.json")}):
            assert time.monotonic() < deadline + 10, "no worker wrote its numbers"
            time.sleep(0.05)
    finally:
        output = service.stop()
    assert 1 <= len(workers) <= 2 and "Traceback" not in output, output


def counted(base: str) -> float:
    return scraped(base).get('tokensvc_http_requests_total{method="GET",route="/oauth/clients/{client_id}",'
                             'status="200"}', 0)


def refresh(base: str, token: str) -> requests.Response:
    return requests.post(base + "/oauth/token/refresh", auth=("webapp", WEBAPP_SECRET), timeout=30,
                         data={"refresh_token": token})


def introspect(base: str, token: str) -> bool:
    return requests.post(base + "/oauth/token/introspect", auth=("webapp", WEBAPP_SECRET), timeout=30,
                         data={"token": token}).json()["active"]


def test_concurrent_presentations_over_three_processes(tmp_path_factory, primary):
    """2, 5 and 50 presentations at once, spread over three processes: of one refresh token,
    every one gets the same successor and the family lives on; of one code, exactly one is
    exchanged and every other is an error that revokes what it gave."""
    services = []
    try:
        for index in range(3):
            services.append(start_service(tmp_path_factory.mktemp(f"p{index}"), mongodb(primary)))
            services[-1].wait_ready()
        with ThreadPoolExecutor(50) as pool:
            for presentations in (2, 5, 50):
                first = exchange(services[0].base, code_for(services[1].base)).json()
                answers = list(pool.map(lambda index, token=first["refresh_token"]: refresh(
                    services[index % 3].base, token), range(presentations)))
                assert [answer.status_code for answer in answers] == [200] * presentations, answers[0].text
                pairs = {(answer.json()["access_token"], answer.json()["refresh_token"]) for answer in answers}
                assert len(pairs) == 1
                access, renewed = pairs.pop()
                assert introspect(services[2].base, access) and refresh(services[1].base, renewed).status_code == 200

                code = code_for(services[2].base)
                answers = list(pool.map(lambda index, code=code: exchange(services[index % 3].base, code),
                                        range(presentations)))
                statuses = sorted(answer.status_code for answer in answers)
                assert statuses == [200] + [400] * (presentations - 1), statuses
                issued = next(answer.json() for answer in answers if answer.status_code == 200)
                assert not introspect(services[0].base, issued["access_token"])  # revoked by the replays
    finally:
        outputs = [service.stop() for service in services]
    assert not any("Traceback" in output for output in outputs), outputs


def reuse_seen(base: str) -> float:
    """``tokensvc_refresh_reuse_total`` as the process at ``base`` counts it."""
    return sum(float(line.split()[-1]) for line in requests.get(base + "/metrics", timeout=10).text.splitlines()
               if line.startswith("tokensvc_refresh_reuse_total"))


def test_a_second_tab_through_another_process_while_the_first_rotation_waits_on_the_store(tmp_path_factory,
                                                                                         primary):
    """The first presentation's rotation waits 2.5 s at the server (a lagging majority, an
    election); a second presentation of the same token arrives at another process 10 ms later.
    Both are judged by when they arrived, not by when the store answered: one pair for both,
    no reuse, and the family lives on."""
    services = [start_service(tmp_path_factory.mktemp(f"p{index}"), mongodb(primary)).wait_ready()
                for index in range(2)]
    try:
        first = exchange(services[0].base, code_for(services[1].base)).json()
        primary.script(Fault("findAndModify", "delay", collection="families", seconds=2.5))
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(refresh, services[0].base, first["refresh_token"])
            wait_until(lambda: primary.sent("findAndModify", "families"), "the first rotation at the store")
            second = pool.submit(refresh, services[1].base, first["refresh_token"])
            answers = [held.result(), second.result()]
        assert [answer.status_code for answer in answers] == [200, 200], [answer.text for answer in answers]
        pairs = {(answer.json()["access_token"], answer.json()["refresh_token"]) for answer in answers}
        assert len(pairs) == 1
        access, renewed = pairs.pop()
        assert introspect(services[1].base, access) and refresh(services[0].base, renewed).status_code == 200
        assert [reuse_seen(service.base) for service in services] == [0, 0]
    finally:
        outputs = [service.stop() for service in services]
    assert not any("Traceback" in output for output in outputs), outputs


HEARD_SECONDS = 1.0  # the bound: a revocation closes its WebSockets at every process this soon
STREAM_OPEN = 'tokensvc_revocation_feed_state{state="stream"} 1.0'


def revoke_until_served(base: str, refresh_token: str) -> None:
    """The revocation, sent again while the store answers 503 (a write that waited on the crashed
    primary), until it is answered 200."""
    while (answer := requests.post(base + "/oauth/token/revoke", auth=("webapp", WEBAPP_SECRET), timeout=30,
                                   data={"token": refresh_token})).status_code == 503:
        pass
    assert answer.status_code == 200, answer.text


def test_a_revocation_right_after_an_election_closes_the_socket_at_another_process_within_a_second(
        tmp_path_factory):
    """The primary crashes (it answers nothing, closes nothing) and another member is elected
    1.5 s later. A token is revoked at process A right after: its WebSocket at process B closes
    4401 within a second of the revocation, the issue's bound. B's relay had its change stream
    on the crashed member, whose getMore never comes back: it follows the new primary where it
    stood as soon as the driver knows of it, not when its watchdog (the stream's wait and
    storage.timeout_ms, 4 s here) gives up on the old one."""
    replica_set = ReplicaSet(size=3).start()
    storage = f'[storage]\nbackend = "mongodb"\nmongodb_uri = "{replica_set.uri()}"\ntimeout_ms = 3000\n'
    services = []
    try:
        for name in ("a", "b"):
            services.append(start_service(tmp_path_factory.mktemp(name), storage).wait_ready())
        a, b = services
        tokens = exchange(a.base, code_for(a.base)).json()
        wait_until(lambda: STREAM_OPEN in requests.get(b.base + "/metrics", timeout=10).text, "B's change stream open")

        async def across_the_election() -> None:
            loop = asyncio.get_running_loop()
            url = b.base.replace("http://", "ws://") + "/v1/ws?access_token=" + tokens["access_token"]
            socket = await websocket_connect(url)

            async def hold() -> None:  # its messages (a welcome first) read until the service closes it
                while await socket.read_message() is not None:
                    pass

            holding = asyncio.ensure_future(hold())
            elected = replica_set.crash(elect=1, after=1.5)
            await loop.run_in_executor(None, elected.wait, 10)
            await loop.run_in_executor(None, revoke_until_served, a.base, tokens["refresh_token"])
            await eventually(holding.done, seconds=HEARD_SECONDS,
                             what="the socket at B closed within a second of the revocation at A")
            assert socket.close_code == 4401, socket.close_code

        asyncio.run(across_the_election())
    finally:
        outputs = [service.stop() for service in services]
        replica_set.stop()
    assert not any("Traceback" in output for output in outputs), outputs


def test_a_process_stops_with_one_line_when_a_later_release_finalizes_the_store(tmp_path, primary):
    """Its heartbeat finds a compatibility version it cannot write: /readyz goes 503 and the
    process ends as a start on that store would, with the line that says which release to run."""
    service = start_service(tmp_path, mongodb(primary), env={"TOKENSVC_STORAGE_HEARTBEAT_SECONDS": "1"}).wait_ready()
    primary.db["tokensvc"]["meta"].update_one({"_id": "format"}, {"$set": {"format": 4, "compatibility": 4}})
    try:
        service.process.wait(timeout=30)
    finally:
        output = service.stop()
    assert service.returncode == 1, output
    assert "tokensvc: the store holds format 4 (its compatibility version), which tokensvc" in output, output
    assert "Traceback" not in output, output


# -- tokensvc serve --processes: the supervisor --------------------------------------------------


def workers(service) -> dict[int, int]:
    """The live workers of a supervisor by slot, as its log tells of them."""
    return {int(slot): int(pid) for slot, pid in re.findall(r"worker (\d+) started \(pid (\d+)\)", service.output())}


def gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def refused(base: str) -> bool:
    try:
        requests.get(base + "/healthz", timeout=5)
    except requests.ConnectionError:
        return True
    return False


def test_sigterm_to_the_supervisor_drains_every_worker_then_frees_the_port(tmp_path, primary):
    service = start_service(tmp_path, mongodb(primary), args=("--processes", "2")).wait_ready()
    wait_until(lambda: len(workers(service)) == 2, "two workers")
    pids = list(workers(service).values())
    codes = [code_for(service.base) for _ in range(4)]
    # Every consumption takes 1.5 s; the deploy's SIGTERM comes while all four are in flight.
    primary.script(Fault("findAndModify", "delay", collection="codes", seconds=1.5, times=4))
    primary.forget()
    with ThreadPoolExecutor(4) as pool:
        answers = [pool.submit(exchange, service.base, code) for code in codes]
        wait_until(lambda: len(primary.sent("findAndModify", "codes")) == 4, "four exchanges in flight")
        service.process.send_signal(signal.SIGTERM)
        statuses = [answer.result(30).status_code for answer in answers]
    assert service.process.wait(30) == 0, service.output()
    output = service.output()
    assert statuses == [200] * 4, output
    assert output.count("tokensvc stopped") == 2 and output.count("stopped (exited with code 0)") == 2
    assert "every worker has stopped" in output and "Traceback" not in output
    assert all(gone(pid) for pid in pids) and refused(service.base)


def test_a_worker_that_dies_is_started_again_and_the_service_goes_on(tmp_path, primary):
    service = start_service(tmp_path, mongodb(primary), args=("--processes", "2")).wait_ready()
    wait_until(lambda: len(workers(service)) == 2, "two workers")
    first = workers(service)[0]
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: workers(service)[0] != first, "worker 0 started again")
    assert f"worker 0 (pid {first}) was killed by SIGKILL; restarting it in 0.5s" in service.output()
    for _ in range(8):  # whichever worker answers
        assert exchange(service.base, code_for(service.base)).status_code == 200
    pids = list(workers(service).values())
    service.process.send_signal(signal.SIGTERM)
    assert service.process.wait(30) == 0, service.output()
    assert all(gone(pid) for pid in pids)


def test_workers_that_keep_dying_end_the_supervisor_with_exit_code_1(tmp_path, primary):
    # A store that refuses every index (a role without createIndex): no restart mends it.
    primary.script(Fault("createIndexes", "error", code=13, times=10_000))
    service = start_service(tmp_path, mongodb(primary), args=("--processes", "2"))
    assert service.process.wait(60) == 1, service.output()
    output = service.output()
    assert re.search(r"worker \d \(pid \d+\) exited with code 1; it died 5 times in a row, each within 10s of "
                     r"starting: giving up", output)
    assert "tokensvc: MongoDB refused" in output and "restarting it in 4.0s" in output
    started = [int(pid) for pid in re.findall(r"started \(pid (\d+)\)", output)]
    assert all(gone(pid) for pid in started) and refused(service.base)


def test_as_pid_1_the_supervisor_takes_signals_and_reaps_orphans(tmp_path, primary):
    """In a PID namespace of its own, as in a container: PID 1 gets no default signal
    handling from the kernel, and every orphan of the namespace becomes its child."""
    service = start_service(tmp_path, mongodb(primary), args=("--processes", "2"),
                            prefix=("unshare", "--pid", "--fork", "--kill-child")).wait_ready()
    wait_until(lambda: len(workers(service)) == 2, "two workers")
    supervisor = children(service.process.pid)[0]
    assert namespace_pids(supervisor)[-1] == 1  # PID 1 where it runs
    # An orphan in its namespace: a shell started there leaves a sleep behind.
    subprocess.run(["nsenter", "--target", str(supervisor), "--pid", "--", "sh", "-c", "sleep 300 &"], check=True,
                   timeout=30)
    wait_until(lambda: any(command(pid) == "sleep" for pid in children(supervisor)), "the orphan re-parented to PID 1")
    orphan = next(pid for pid in children(supervisor) if command(pid) == "sleep")
    os.kill(orphan, signal.SIGKILL)
    wait_until(lambda: gone(orphan), "the orphan reaped")
    pids = children(supervisor)  # the workers (the log names them by their pids in the namespace)
    assert len(pids) == 2
    os.kill(supervisor, signal.SIGTERM)
    assert service.process.wait(30) == 0, service.output()
    assert "every worker has stopped" in service.output()
    assert all(gone(pid) for pid in [supervisor, *pids])


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def namespace_pids(pid: int) -> list[int]:
    status = Path(f"/proc/{pid}/status").read_text()
    return [int(value) for value in re.search(r"^NSpid:\s+(.+)$", status, re.M)[1].split()]


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return ""
