"""A shell block run as an operator runs it: in a terminal of its own (a pseudo-terminal, where
``tokensvc login`` asks for the confirmation code), the code typed once a browser stand-in has
read it off the page and written it to a file."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from pathlib import Path


def run_in_terminal(block: str, environ: dict[str, str], typed: Path, output: Path,
                    cwd: Path | None = None, seconds: float = 120) -> subprocess.CompletedProcess:
    """``block`` under ``bash -euo pipefail`` with a pseudo-terminal as its terminal, its standard
    output and error kept apart in files under ``output``; what ``typed`` holds, once it holds
    something, is typed on the terminal followed by Enter. Bounded by ``seconds``."""
    import pty

    out, err = output / "stdout", output / "stderr"
    pid, terminal = pty.fork()
    if pid == 0:  # the operator's shell, the pseudo-terminal its terminal; its output kept apart
        if cwd is not None:
            os.chdir(cwd)
        os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
        os.execve("/bin/bash", ["bash", "-euo", "pipefail", "-c", block], environ)
    deadline, said, status = time.monotonic() + seconds, False, None
    try:
        while status is None:
            ended, code = os.waitpid(pid, os.WNOHANG)
            if ended:
                status = os.waitstatus_to_exitcode(code)
                break
            assert time.monotonic() < deadline, f"the block did not end within {seconds:g} s"
            if select.select([terminal], [], [], 0.1)[0]:
                with contextlib.suppress(OSError):
                    os.read(terminal, 4096)  # the question, on the terminal
            if not said and typed.exists() and typed.read_text():
                os.write(terminal, typed.read_text().encode() + b"\n")  # the operator types the code
                said = True
    finally:
        if status is None:  # not reaped: still ours to end
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(terminal)
    return subprocess.CompletedProcess(block, status, out.read_text(), err.read_text())
