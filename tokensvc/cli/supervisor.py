"""The supervisor of ``tokensvc serve --processes N``: it forks the workers, restarts one that
dies, and stops them all together.

- **Stopping**: SIGTERM or SIGINT is forwarded to every worker, which drains (stops accepting,
  lets its requests in flight finish within ``server.drain_seconds``, closes its store); the
  supervisor closes its own copy of the listening sockets at once, so the port is free when
  the last worker has left, and exits 0 once every worker has. A worker still there past the
  drain and a margin is killed, and the exit code is 1. SIGQUIT is forwarded as it is (the
  workers stop at once).
- **Restarting**: a worker that dies while nobody asked it to stop is forked again after a
  delay that doubles with each death in a row of that worker (0.5 s, 1 s, 2 s, ... at most
  30 s); a worker that ran for :data:`STABLE_SECONDS` starts the count again. When one dies
  :data:`GIVE_UP_AFTER` times in a row, each within :data:`STABLE_SECONDS` of starting (a
  fault a restart will not mend: a store that refuses, a broken install), the supervisor
  stops the others and exits 1, for the orchestrator to see.
- **PID 1**: in a container the supervisor is the first process. Signals are taken
  synchronously (blocked, then waited for with ``sigtimedwait``), so none is lost or
  ignored whatever the process's number; every child is reaped, workers and the orphans
  re-parented to the supervisor (which asks to be their reaper, ``PR_SET_CHILD_SUBREAPER``,
  on Linux: so it reaps the same way when it is not PID 1).

Nothing here knows the service: :class:`Supervisor` runs ``work(slot)`` in each child, and
``tokensvc/cli/main.py`` gives it the service.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger("tokensvc.supervisor")

FIRST_DELAY = 0.5  # seconds before the first restart of a worker that died
MAX_DELAY = 30.0
STABLE_SECONDS = 10.0  # a worker that ran this long and died is restarted as if for the first time
GIVE_UP_AFTER = 5  # deaths in a row of one worker, each soon after its start: the supervisor exits 1
STOP_MARGIN = 10.0  # past the drain: for the store to close and the process to leave
GRACEFUL = (signal.SIGTERM, signal.SIGINT)
WATCHED = (*GRACEFUL, signal.SIGQUIT, signal.SIGCHLD)
PR_SET_CHILD_SUBREAPER = 36


@dataclass(slots=True)
class Worker:
    slot: int
    pid: int
    started: float


class Supervisor:
    """``workers`` children each running ``work(slot)`` (its return value is the exit code),
    kept running until a signal stops them; :meth:`run` returns the supervisor's exit code.
    ``died(pid)`` is told of every worker that has left (the metrics' files of a dead
    process)."""

    def __init__(self, workers: int, work: Callable[[int], int], *, stop_seconds: float,
                 died: Callable[[int], None] = lambda pid: None, sockets: Sequence[socket.socket] = (),
                 first_delay: float = FIRST_DELAY, max_delay: float = MAX_DELAY,
                 stable_seconds: float = STABLE_SECONDS, give_up_after: int = GIVE_UP_AFTER) -> None:
        self.count, self.work, self.stop_seconds, self.died = workers, work, stop_seconds, died
        self.sockets = list(sockets)  # the listening sockets the workers share: closed when stopping
        self.first_delay, self.max_delay = first_delay, max_delay
        self.stable_seconds, self.give_up_after = stable_seconds, give_up_after
        self.workers: dict[int, Worker] = {}  # by pid
        self.deaths = [0] * workers  # deaths in a row, each soon after its start, by slot
        self.due: dict[int, float] = {}  # slot -> when it is forked again
        self.stopping_since: float | None = None
        self.killed = False
        self.code = 0

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        try:
            _become_subreaper()
            for slot in range(self.count):
                self._fork(slot, previous)
            while True:
                self._reap()
                now = time.monotonic()
                if self.stopping_since is None:
                    for slot, when in sorted(self.due.items()):
                        if when <= now:
                            del self.due[slot]
                            self._fork(slot, previous)
                elif now - self.stopping_since > self.stop_seconds and not self.killed:
                    self._kill_the_rest()
                if not self.workers and not self.due:
                    if self.code == 0:
                        log.info("every worker has stopped")
                    return self.code
                received = signal.sigtimedwait(WATCHED, self._timeout(now))
                if received is not None and received.si_signo != signal.SIGCHLD:
                    self._signalled(received.si_signo)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _timeout(self, now: float) -> float:
        """How long to wait for a signal: until the next restart, or the end of the stop."""
        if self.killed:
            return 1.0
        if self.stopping_since is not None:
            return max(0.05, self.stopping_since + self.stop_seconds - now)
        return max(0.05, min(self.due.values(), default=now + 60) - now)

    def _signalled(self, signum: int) -> None:
        if signum in GRACEFUL:
            if self.stopping_since is None:
                log.info("stopping: %s sent to %d workers, which drain (at most %.0fs)",
                         signal.Signals(signum).name, len(self.workers), self.stop_seconds)
            self._stop(signum)
        elif signum == signal.SIGQUIT:
            log.warning("SIGQUIT: the workers stop at once")
            self._stop(signum)

    def _stop(self, signum: int) -> None:
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            self.due.clear()
            for sock in self.sockets:  # the port is free once the last worker has closed its copy
                with contextlib.suppress(OSError):
                    sock.close()
        for pid in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _kill_the_rest(self) -> None:
        for pid, worker in self.workers.items():
            log.error("worker %d (pid %d) did not stop within %.0fs: killed", worker.slot, pid, self.stop_seconds)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.code, self.killed = 1, True

    # -- children ----------------------------------------------------------------------------

    def _fork(self, slot: int, mask: set[int | signal.Signals]) -> None:
        for handler in logging.getLogger().handlers:  # nothing buffered is written twice
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(self._child(slot, mask))
        self.workers[pid] = Worker(slot, pid, time.monotonic())
        log.info("worker %d started (pid %d)", slot, pid)

    def _child(self, slot: int, mask: set[int | signal.Signals]) -> int:
        """In the worker: the signals as a process starts with them, then the work."""
        code = 1
        try:
            for signum in WATCHED:
                signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            code = self.work(slot)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except KeyboardInterrupt:
            code = 128 + signal.SIGINT
        except BaseException:
            log.exception("worker %d failed", slot)
        finally:
            logging.shutdown()
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
        return code

    def _reap(self) -> None:
        """Every child that has ended: a worker (restarted, unless stopping), or an orphan that
        was re-parented here (reaped, nothing more)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = self.workers.pop(pid, None)
            if worker is None:
                continue
            self.died(pid)
            how = _how(status)
            if self.stopping_since is not None:
                log.info("worker %d (pid %d) stopped (%s)", worker.slot, pid, how)
                continue
            self._restart_later(worker, how)

    def _restart_later(self, worker: Worker, how: str) -> None:
        now = time.monotonic()
        lived = now - worker.started
        self.deaths[worker.slot] = self.deaths[worker.slot] + 1 if lived < self.stable_seconds else 1
        deaths = self.deaths[worker.slot]
        if deaths >= self.give_up_after:
            log.error("worker %d (pid %d) %s; it died %d times in a row, each within %.0fs of starting: "
                      "giving up", worker.slot, worker.pid, how, deaths, self.stable_seconds)
            self.code = 1
            self._stop(signal.SIGTERM)
            return
        delay = min(self.first_delay * 2 ** (deaths - 1), self.max_delay)
        log.warning("worker %d (pid %d) %s; restarting it in %.1fs", worker.slot, worker.pid, how, delay)
        self.due[worker.slot] = now + delay


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with code {os.WEXITSTATUS(status)}"


def _become_subreaper() -> None:
    """Ask Linux to re-parent the orphans of the workers here (as it does to PID 1)."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
