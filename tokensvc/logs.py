"""Logging set-up: one line per record, as text or JSON (``--log-format json``).

Access lines carry ``extra={"access": {...}}`` and audit records (logger
``tokensvc.audit``) carry ``extra={"audit": {...}}``; the JSON formatter lifts those
dicts into the record. Neither ever holds a secret.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import datetime, timezone


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("access", "audit"):
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._second: int | None = None
        self._second_text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        # One strftime per second instead of one per line: the access log writes a line per request.
        second = int(record.created)
        if second != self._second:
            self._second, self._second_text = second, time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second))
        return f"{self._second_text},{int(record.msecs):03d}"

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        audit = getattr(record, "audit", None)
        if audit:
            line += " " + " ".join(f"{key}={value}" for key, value in audit.items())
        return line


def configure(fmt: str = "text", level: str = "info") -> None:
    # The service logs a line per request (and an audit record per token): skip the per-record
    # work no format here uses, as the logging HOWTO's "Optimization" section describes
    # (caller's file and line, thread and process names).
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.tokensvc = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    # Replace only a handler installed here before: others (a test's capture) stay.
    root.handlers[:] = [h for h in root.handlers if not getattr(h, "tokensvc", False)] + [handler]
    root.setLevel(level.upper())
    # Tornado's own access log is replaced by tokensvc.access (which redacts secrets).
    logging.getLogger("tornado.access").setLevel(logging.WARNING)
