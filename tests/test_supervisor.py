"""The supervisor of ``serve --processes``, with real processes and workers of the tests' own
(``tests/supervised.py``): it stops when its workers have drained, kills one that will not,
restarts a worker that dies and gives up on one that keeps dying, and reaps every child,
orphans included. Every wait is for an event, with a deadline."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import wait_until

HERE = Path(__file__).resolve().parent


class Supervised:
    def __init__(self, behaviour: str, directory: Path) -> None:
        self.directory, self.log = directory, directory / "supervisor.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen([sys.executable, str(HERE / "supervised.py"), behaviour, str(directory)],
                                            stderr=log, stdout=log, env={**os.environ, "PYTHONPATH": str(HERE.parent)})

    def output(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float = 30) -> int:
        return self.process.wait(timeout)


def until(condition: Callable[[], object], what: str, timeout: float = 20) -> None:
    wait_until(condition, what, timeout, interval=0.02)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process, or a zombie nobody has reaped (both keep /proc/PID)."""
    return Path(f"/proc/{pid}").exists()


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^PPid:\s+(\d+)", status, re.M)[1])


def orphans(directory: Path, slot: int | str = "*") -> list[int]:
    return [int(path.name.rsplit("-", 1)[1]) for path in directory.glob(f"orphan-{slot}-*")]


def deaf(directory: Path, slot: int) -> list[int]:
    """The workers of ``slot`` that ignore SIGTERM and SIGINT (each says so itself), by pid."""
    return [int(path.name.rsplit("-", 1)[1]) for path in directory.glob(f"deaf-{slot}-*")]


def ready(directory: Path, slot: int) -> list[int]:
    """The workers of ``slot`` that have started so far (each says so itself), by pid."""
    return [int(path.name.rsplit("-", 1)[1]) for path in directory.glob(f"ready-{slot}-*")]


@pytest.mark.process
def test_a_stop_waits_for_every_worker_to_drain(tmp_path):
    supervised = Supervised("drain", tmp_path)
    until(lambda: ready(tmp_path, 0) and ready(tmp_path, 1), "two workers")
    pids = ready(tmp_path, 0) + ready(tmp_path, 1)
    supervised.process.send_signal(signal.SIGTERM)
    assert supervised.wait() == 0, supervised.output()
    # Each drained before the supervisor left, and none is left behind.
    assert sorted(int((tmp_path / f"drained-{slot}").read_text()) for slot in (0, 1)) == sorted(pids)
    assert not any(alive(pid) for pid in pids)
    assert "every worker has stopped" in supervised.output()


@pytest.mark.process
def test_a_worker_that_will_not_stop_is_killed_and_the_exit_code_says_so(tmp_path):
    supervised = Supervised("stubborn", tmp_path)
    until(lambda: deaf(tmp_path, 0) and deaf(tmp_path, 1), "two workers that will not stop")
    pids = deaf(tmp_path, 0) + deaf(tmp_path, 1)
    supervised.process.send_signal(signal.SIGINT)
    assert supervised.wait() == 1
    assert supervised.output().count("did not stop within 2s: killed") == 2
    assert not any(alive(pid) for pid in pids)


@pytest.mark.process
def test_a_worker_that_keeps_dying_is_restarted_with_backoff_then_given_up(tmp_path):
    supervised = Supervised("crash", tmp_path)
    assert supervised.wait() == 1
    output = supervised.output()
    slot = re.search(r"worker (\d) \(pid \d+\) exited with code 3; it died 4 times in a row, each within 30s of "
                     r"starting: giving up", output)[1]
    delays = re.findall(rf"worker {slot} \(pid \d+\) exited with code 3; restarting it in ([\d.]+)s", output)
    assert delays == ["0.1", "0.2", "0.4"]  # doubling from the first delay
    assert not any(alive(pid) for pid in map(int, re.findall(r"started \(pid (\d+)\)", output)))


@pytest.mark.process
def test_orphans_are_reaped_and_a_killed_worker_is_restarted(tmp_path):
    supervised = Supervised("orphan", tmp_path)
    until(lambda: orphans(tmp_path, 0) and len(list(tmp_path.glob("ready-*"))) == 2, "the workers and an orphan")
    orphan = orphans(tmp_path, 0)[0]
    # Re-parented to the supervisor (its reaper, as PID 1 is in a container), which reaps it.
    until(lambda: parent_of(orphan) == supervised.process.pid, "the orphan re-parented")
    os.kill(orphan, signal.SIGKILL)
    until(lambda: not alive(orphan), "the orphan reaped")
    first = ready(tmp_path, 1)[0]
    os.kill(first, signal.SIGKILL)
    until(lambda: len(ready(tmp_path, 1)) == 2, "worker 1 started again")
    assert f"worker 1 (pid {first}) was killed by SIGKILL; restarting it in 0.1s" in supervised.output()
    supervised.process.send_signal(signal.SIGTERM)
    assert supervised.wait() == 0, supervised.output()


@pytest.fixture(autouse=True)
def no_stray_processes(tmp_path):
    yield
    for pid in orphans(tmp_path):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
