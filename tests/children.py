"""The processes of the test run, as Linux lists them (``/proc``): for ``service.end``, which
waits for a whole process group, and for the guard in conftest.py: every test must end every
process it started (a server left running holds a port and a store, and
outlives the run with init as its parent).

The run makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): a process whose
parent ends before it (a server whose starter was killed, a browser's helper) is adopted by the
run rather than by init, so the guard still finds it among the run's descendants.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from helpers import wait_until

PR_SET_CHILD_SUBREAPER = 36
PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class Child:
    pid: int
    started: int  # clock ticks after boot: with the pid, one process (a pid is reused)
    parent: int = field(compare=False)
    group: int = field(compare=False)
    state: str = field(compare=False)
    command: str = field(compare=False)

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")  # a zombie has ended; only its parent's wait is missing


def become_subreaper() -> bool:
    """Adopt the orphans of this process's descendants (Linux only: elsewhere, False)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _read(pid: int) -> Child | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        command = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:  # ended meanwhile
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (name) ": the name may hold anything
    return Child(pid, int(fields[19]), int(fields[1]), int(fields[2]), fields[0], command or stat.split()[1])


def _children_of(pid: int) -> list[int]:
    found = []
    with contextlib.suppress(OSError):
        for task in (PROC / str(pid) / "task").iterdir():  # each thread's children are its own
            with contextlib.suppress(OSError):
                found += [int(child) for child in (task / "children").read_text().split()]
    return found


def group_running(group: int) -> list[int]:
    """The processes of process group ``group`` that run (zombies aside), anywhere."""
    running = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # after "pid (name)"
                if int(fields[2]) == group and fields[0] not in ("Z", "X"):
                    running.append(int(entry.name))
    return running


def descendants(root: int | None = None) -> set[Child]:
    """Every process below ``root`` (this one), zombies included."""
    found: set[Child] = set()
    pending = _children_of(root or os.getpid())
    while pending:
        child = _read(pending.pop())
        if child is not None and child not in found:
            found.add(child)
            pending += _children_of(child.pid)
    return found


def left_behind(before: set[Child], grace: float, *, beneath_before: bool = False) -> list[Child]:
    """The processes started since ``before`` that are still running after ``grace`` seconds
    (one that is ending, a browser's helper after the browser quit, gets that long); those
    are then killed, and every new zombie of this process is reaped. With ``beneath_before``,
    a process started by one of ``before`` (a renderer of a browser a module shares) is that
    process's own, not counted."""
    earlier = {child.pid for child in before}

    def started_by_earlier(child: Child, parents: dict[int, int]) -> bool:
        pid = child.parent
        while pid in parents and pid not in earlier:
            pid = parents[pid]
        return pid in earlier

    def running() -> list[Child]:
        now = descendants() - before
        parents = {child.pid: child.parent for child in now}
        return [child for child in now
                if child.alive and not (beneath_before and started_by_earlier(child, parents))]

    try:
        wait_until(lambda: not running(), "the end of what the test started", grace, interval=0.02)
        left = []
    except AssertionError:
        left = running()
        for child in left:
            end(child)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not running(), "the end of what the test started", grace, interval=0.02)
    for child in descendants() - before:
        if child.parent == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, os.WNOHANG)
    return left


def end(child: Child) -> None:
    """SIGKILL ``child``, and its process group when it leads one (never this run's group)."""
    with contextlib.suppress(ProcessLookupError):
        if child.group == child.pid and child.group != os.getpgid(0):
            os.killpg(child.group, signal.SIGKILL)
        else:
            os.kill(child.pid, signal.SIGKILL)
