"""The processes of the test run, as Linux lists them (``/proc``)."""

from __future__ import annotations

import contextlib
from pathlib import Path

PROC = Path("/proc")


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
