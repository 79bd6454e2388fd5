"""Workers for the supervisor's tests, run as a process of their own:
``python tests/supervised.py BEHAVIOUR DIRECTORY`` supervises two workers that behave so
(what each does is written to files in DIRECTORY, its log to standard error)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from tokensvc.cli.supervisor import Supervisor
from tokensvc.telemetry import logs


def wait_for_sigterm(directory: Path, slot: int) -> None:
    """Say so (``ready-SLOT-PID``) once SIGTERM is sure to be waited for, then wait for it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    (directory / f"ready-{slot}-{os.getpid()}").touch()
    signal.sigwait({signal.SIGTERM})


def main() -> int:
    behaviour, directory = sys.argv[1], Path(sys.argv[2])
    logs.configure("text", "info")

    def work(slot: int) -> int:
        if behaviour == "drain":  # takes a moment to finish what it holds
            wait_for_sigterm(directory, slot)
            time.sleep(0.3)
            (directory / f"drained-{slot}").write_text(str(os.getpid()))
            return 0
        if behaviour == "orphan":  # leaves a process behind (a double fork), then serves on
            if os.fork() == 0:
                if os.fork() == 0:
                    (directory / f"orphan-{slot}-{os.getpid()}").touch()
                    signal.pause()
                os._exit(0)
            wait_for_sigterm(directory, slot)
            return 0
        if behaviour == "stubborn":  # never stops when asked
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            # The process id is in the name: a file is whole the moment it exists.
            (directory / f"deaf-{slot}-{os.getpid()}").touch()
            while True:
                signal.pause()
        return 3  # "crash": dies as soon as it starts

    # The drain's bound: short where a worker will not stop (it is killed after it), a bound for
    # a hang where every worker drains (a busy machine may hold a drain up for seconds).
    stop_seconds = 2.0 if behaviour == "stubborn" else 30.0
    supervisor = Supervisor(2, work, stop_seconds=stop_seconds, first_delay=0.1, stable_seconds=30.0,
                            give_up_after=4)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
