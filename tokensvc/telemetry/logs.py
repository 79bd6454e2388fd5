"""Logging set-up and the service's own log lines: one line per record, as text or JSON
(``--log-format json``).

Access lines (logger ``tokensvc.access``) carry an ``access`` dict and audit records (logger
``tokensvc.audit``) an ``audit`` dict; the JSON formatter lifts those dicts into the line.
Neither ever holds a secret. Both are written through :func:`write`, one call per line.
Times are UTC, ISO 8601. Every line written while a request is served carries its request id
(:data:`REQUEST_ID`, set by the handler bases), so one request can be followed through the
access, audit and error lines.

Why :func:`write` and not ``logger.info(...)``: a token request writes one or two lines, and
going through the logging module (a LogRecord, the logger hierarchy, the handler lock, the
formatter, a flush) is a large share of it (docs/performance.md has the figure). When the
service's own handler (installed by :func:`configure`) is the only place such a line can go,
:func:`write` formats it with the same formatter code and hands it to the handler directly;
in every other case (a test's capture, a handler added by an embedding program) it logs a
normal record. The output is the same either way (``tests/test_logs.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
import time
from contextvars import ContextVar
from typing import Any, BinaryIO, TextIO

from tokensvc.telemetry import redaction

# The MongoDB driver's loggers (pymongo.command, .serverSelection, .connection, .topology): never
# below INFO, see configure.
DRIVER_LOGGER = "pymongo"
access_log = logging.getLogger("tokensvc.access")
audit_log = logging.getLogger("tokensvc.audit")

EXTRA_KINDS = ("access", "audit")
# The id of the request being served (the X-Request-ID it came with, or a new one).
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)

# Request parameters whose values are secrets: never written to a log line (however their
# names are written: tokensvc.telemetry.redaction).
SECRET_PARAMETERS = redaction.SECRET_PARAMETERS
TORNADO_LOGGERS = ("tornado.access", "tornado.application", "tornado.general")

# A value Tornado quotes with %r (a header, a cookie, a request's repr), and a parameter written
# into a message, also percent-encoded once or twice inside another parameter (next=): its name
# (letters, digits, escapes, brackets, characters beyond ASCII: what a name may be written
# with), then "=" however it is escaped, then its value. Whether the name is a secret's is
# tokensvc.telemetry.redaction's to say.
_QUOTED = re.compile(r"b?'(?:[^'\\]|\\.)*'" "|" r'b?"(?:[^"\\]|\\.)*"')
_ENDS = r"%3D|%253D|%26|%2526|%3F|%253F"  # escaped "=", "&", "?": where a name written in a value ends
_NAME = re.compile(
    r"(?:^|(?<=[?&;,\s(])|(?<=%3F)|(?<=%26)|(?<=%253F)|(?<=%2526))"
    rf"((?:(?!{_ENDS})[A-Za-z0-9_.~%+\-\[\]\u0080-\U0010ffff])+)(?:=|%3D|%253D)", re.IGNORECASE)
_VALUE = re.compile(r"(?:(?!%26|%2526)[^&;\s'\"])*", re.IGNORECASE)
_CREDENTIALS = re.compile(r"\b(Bearer|Basic)\s+[^\s'\"]+", re.IGNORECASE)

# C0, DEL, C1 and the Unicode line and paragraph separators: what could start a line of its
# own in a text log, or be taken by a terminal as a command (CWE-117).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
MAX_VALUE = 256  # characters of a value a request supplied, in a line


def escape(text: str) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\u0000``,
    ``\\u2028``): whatever a request supplied stays inside the line it is written in."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda found: _ESCAPES.get(found.group()) or f"\\u{ord(found.group()):04x}", text)


def clip(value: str, limit: int = MAX_VALUE) -> str:
    """``value``, cut after ``limit`` characters with a marker that says how much was left out."""
    return value if len(value) <= limit else f"{value[:limit]}...({len(value) - limit} more)"


def withhold_client_input(message: str) -> str:
    """``message`` with whatever a client sent that may be a secret withheld: quoted values
    (Tornado quotes header values, cookies and requests with ``%r``), secret parameters and
    credentials."""
    message = _withhold_parameters(message)
    message = _CREDENTIALS.sub(r"\1 ***", message)
    message = _QUOTED.sub("'(withheld)'", message)
    return redaction.SECRET_SHAPED.sub("***", message)


def _withhold_parameters(message: str) -> str:
    """``message`` with the value of every parameter whose name is a secret's withheld. A name is
    found wherever one may start, inside another parameter's value too (a value is not taken
    whole, so the names in it are looked at)."""
    kept: list[str] = []
    upto = 0
    for name in _NAME.finditer(message):
        start = name.end()
        if start < upto or not redaction.secret_name(name.group(1)):
            continue
        end = _VALUE.match(message, start).end()  # type: ignore[union-attr]  # it matches the empty string
        if end > start:
            kept += (message[upto:start], "***")
            upto = end
    return "".join(kept) + message[upto:] if kept else message


class WithholdClientInput(logging.Filter):
    """On Tornado's own loggers: their lines (malformed requests, cookie warnings, uncaught
    exceptions) quote what a client sent, which may hold a token, a password or a session."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = withhold_client_input(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


class Clock:
    """The time a line shows (UTC, ISO 8601, to the millisecond, without the zone), formatted
    at most once per millisecond: a busy service writes several lines in one (and ``strftime``
    runs at most once per second)."""

    __slots__ = ("_tick", "_stamp", "_second", "_second_text")

    def __init__(self) -> None:
        self._tick = self._second = -1
        self._stamp = self._second_text = ""

    def stamp(self, created: float) -> str:
        """``2026-11-23T10:00:00.123`` for the Unix time ``created``."""
        tick = int(created * 1000)
        if tick != self._tick:
            second, millisecond = divmod(tick, 1000)
            if second != self._second:
                self._second, self._second_text = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._tick, self._stamp = tick, f"{self._second_text}.{millisecond:03d}"
        return self._stamp


CLOCK = Clock()  # every formatter's, and the access line's
now = time.time  # the time of a line written directly


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = {kind: getattr(record, kind) for kind in EXTRA_KINDS if getattr(record, kind, None) is not None}
        if record.exc_info:
            extras["exception"] = self.formatException(record.exc_info)
        return self.line(record.created, record.levelname, record.name, record.getMessage(), extras)

    def line(self, created: float, levelname: str, name: str, message: str, extras: dict[str, Any]) -> str:
        entry = {
            "time": CLOCK.stamp(created) + "+00:00",
            "level": levelname.lower(),
            "logger": name,
            "message": message,
            **extras,
        }
        request_id = REQUEST_ID.get()
        if request_id is not None:
            entry["request_id"] = request_id
        return json.dumps(entry, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``2026-11-23T10:00:00.123Z INFO tokensvc.access: 127.0.0.1 200 POST /oauth/token 1.20ms
    request_id=...``: UTC, audit fields appended as ``key=value``, the request id last."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        audit = getattr(record, "audit", None)
        line = self.line(record.created, record.levelname, record.name, record.getMessage(),
                         {"audit": audit} if audit else {})
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line

    def line(self, created: float, levelname: str, name: str, message: str, extras: dict[str, Any]) -> str:
        line = f"{CLOCK.stamp(created)}Z {levelname} {name}: {escape(message)}"
        audit = extras.get("audit")
        if audit:
            line += " " + " ".join([f"{key}={escape(str(value))}" for key, value in audit.items()])
        request_id = REQUEST_ID.get()
        if request_id is not None:
            line += f" request_id={request_id}"
        return line


class ServiceHandler(logging.StreamHandler):
    """The service's handler: gathers the lines of an event-loop iteration as bytes, and writes
    them in one go (one ``write`` system call) at the start of the next.

    A busy service writes many lines per iteration of the loop; one write for all of them
    instead of one per line. Outside a running loop (the CLI, start-up, shut-down) every line
    is written at once. A line is never held past the end of the loop iteration that wrote it,
    so ``tail -f`` sees each request at once. Every line, a record's (Tornado's lines, a
    traceback) as well as a direct one, goes through the same buffer: they stay in order.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._flush_on: asyncio.AbstractEventLoop | None = None  # the loop a flush is scheduled on
        self._pending: list[bytes] = []
        # Where the bytes go: the stream's binary layer where it encodes UTF-8 (a file, standard
        # error); a stream of text only (a test's StringIO) is given text.
        binary = getattr(stream, "buffer", None)
        utf8 = (getattr(stream, "encoding", None) or "").lower().replace("-", "") == "utf8"
        self._binary: BinaryIO | None = binary if utf8 and binary is not None else None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write_line(self.format(record))
        except RecursionError:  # as logging.StreamHandler does
            raise
        except Exception:
            self.handleError(record)

    def write_line(self, line: str) -> None:
        self.append((line + self.terminator).encode("utf-8", "backslashreplace"))

    def append(self, data: bytes) -> None:
        """Add whole lines (``data``, UTF-8, each ending in a newline) to the next write."""
        with self.lock:  # type: ignore[union-attr]
            self._pending.append(data)
        self.flush()

    def flush(self) -> None:
        scheduled = self._flush_on
        if scheduled is not None and scheduled.is_running():
            return  # the flush due on a running loop takes this line too
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush_now()
            return
        self._flush_on = loop
        loop.call_soon(self.flush_now)

    def flush_now(self) -> None:
        self._flush_on = None
        with self.lock, contextlib.suppress(OSError, ValueError):  # type: ignore[union-attr]
            # (the stream went away: closed, or a broken pipe)
            data = b"".join(self._pending)
            self._pending.clear()
            if self._binary is not None:
                self._binary.write(data)
                self._binary.flush()
            else:
                self.stream.write(data.decode("utf-8"))
                self.stream.flush()


def write(logger: logging.Logger, level: int, message: str, kind: str, fields: dict[str, Any]) -> None:
    """Log ``message`` with its ``access`` or ``audit`` fields (``kind``) at ``level``."""
    if not logger.isEnabledFor(level):
        return
    handler = sole_service_handler(logger, level)
    if handler is None:
        logger.log(level, "%s", message, extra={kind: fields})
        return
    formatter: TextFormatter | JsonFormatter = handler.formatter  # type: ignore[assignment]
    handler.write_line(formatter.line(now(), logging.getLevelName(level), logger.name, message,
                                      {kind: fields}))


def audit(event: str, fields: dict[str, Any], level: int = logging.INFO, message: str | None = None) -> None:
    """One audit record: ``event`` plus ``fields`` (never a secret), every value plain text (a
    list, such as scopes, space-separated as OAuth writes it; a string that holds a space, a
    quote or ``=`` in double quotes, so that it cannot pass for another field), cut at
    :data:`MAX_VALUE` characters."""
    plain = {key: " ".join(value) if isinstance(value, (list, tuple)) else _plain(value)
             for key, value in fields.items()}
    write(audit_log, level, message or event.replace("_", " "), "audit", {"event": event, **plain})


def _plain(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    value = clip(value)
    return json.dumps(value, ensure_ascii=False) if _NEEDS_QUOTES.search(value) else value


_NEEDS_QUOTES = re.compile(r'[\s"=]')


def sole_service_handler(logger: logging.Logger, level: int) -> ServiceHandler | None:
    """The service's handler, if a record of ``logger`` would reach it and nothing else."""
    found: ServiceHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if found is not None or not isinstance(handler, ServiceHandler) or handler.filters \
                    or handler.level > level or not isinstance(handler.formatter, (TextFormatter, JsonFormatter)):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


def configure(fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> ServiceHandler:
    """Send every log record to ``stream`` (standard error by default) in ``fmt`` ("text" or
    "json") from ``level`` up, through a :class:`ServiceHandler` on the root logger."""
    # The records that do go through the logging module skip the work no format here uses,
    # as the logging HOWTO's "Optimization" section describes (caller's file and line,
    # thread and process names).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = ServiceHandler(stream or _buffered_stderr())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    # Replace only a handler installed here before: others (a test's capture) stay.
    for old in root.handlers:
        if isinstance(old, ServiceHandler):
            old.flush_now()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, ServiceHandler)] + [handler]
    root.setLevel(level.upper())
    # Tornado's own access log is replaced by tokensvc.access (which redacts secrets).
    logging.getLogger("tornado.access").setLevel(logging.WARNING)
    # The MongoDB driver logs whole commands and replies at DEBUG (pymongo.command and its
    # siblings): the documents they hold carry password hashes and client secrets' digests,
    # which are never logged. So its loggers stay at INFO whatever ``level`` says.
    logging.getLogger(DRIVER_LOGGER).setLevel(max(logging.INFO, root.level))
    for name in TORNADO_LOGGERS:
        tornado_logger = logging.getLogger(name)
        if not any(isinstance(f, WithholdClientInput) for f in tornado_logger.filters):
            tornado_logger.addFilter(WithholdClientInput())
    return handler


def _buffered_stderr() -> TextIO:
    """Standard error without line buffering (Python's is line-buffered), so that the handler
    decides when to flush; standard error itself where it has no file descriptor."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.stderr
    return open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
