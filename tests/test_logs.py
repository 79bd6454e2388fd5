"""logs.write(): the same line whether it is written directly or as a LogRecord, and when each
way is taken; the service handler's once-per-iteration flush."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from tokensvc.telemetry import logs

ACCESS = {"status": 200, "method": "POST", "path": "/oauth/token", "ms": 1.5, "client_id": "webapp",
          "remote_ip": "127.0.0.1"}
AUDIT = {"event": "token_issued", "client_id": "webapp", "subject": "u_1", "outcome": "success"}


class Stream(io.StringIO):
    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


@pytest.fixture
def service_log():
    """logs.configure() into a StringIO; the root logger is put back as it was afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = Stream()
    handler = logs.configure("text", "info", stream=stream)
    yield stream, handler
    root.handlers[:], level = saved
    root.setLevel(level)


def alone(handler: logging.Handler) -> None:
    """Make ``handler`` the root logger's only one (pytest adds its capture handlers to each test)."""
    logging.getLogger().handlers[:] = [handler]


def without_time(line: str, fmt: str) -> str:
    if fmt == "json":
        entry = json.loads(line)
        assert entry.pop("time").endswith("+00:00")
        return json.dumps(entry)
    stamp, rest = line.split(" ", 1)
    assert len(stamp) == 24 and stamp[10] == "T" and stamp[19] == "." and stamp.endswith("Z")  # UTC, ISO 8601
    return rest


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("logger,kind,fields", [(logs.access_log, "access", ACCESS), (logs.audit_log, "audit", AUDIT)])
def test_a_direct_line_is_the_line_of_the_record(service_log, fmt, logger, kind, fields):
    stream, handler = service_log
    handler.setFormatter(logs.JsonFormatter() if fmt == "json" else logs.TextFormatter())
    alone(handler)
    made = []
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *args, **kwargs: made.append(1) or factory(*args, **kwargs))
    try:
        logs.write(logger, logging.INFO, "the message", kind, fields)
        assert made == []  # the service's handler alone: the line is written without a record
        direct = stream.getvalue()
        capture = logging.Handler()
        capture.emit = lambda record: None
        logging.getLogger().addHandler(capture)  # now a record is made, and formatted by the handler
        logs.write(logger, logging.INFO, "the message", kind, fields)
        assert made == [1]
    finally:
        logging.setLogRecordFactory(factory)
    by_record = stream.getvalue()[len(direct):]
    assert direct.endswith("\n") and by_record.endswith("\n")
    assert without_time(direct.rstrip("\n"), fmt) == without_time(by_record.rstrip("\n"), fmt)
    assert "the message" in direct and (fmt == "json" or kind == "access" or "event=token_issued" in direct)


def test_records_are_made_whenever_something_else_listens(service_log, caplog):
    with caplog.at_level(logging.INFO):
        logs.audit("login", {"outcome": "failure"}, logging.WARNING, "login failed")
    record = next(r for r in caplog.records if r.name == "tokensvc.audit")
    assert record.levelno == logging.WARNING and record.getMessage() == "login failed"
    assert record.audit == {"event": "login", "outcome": "failure"}


@pytest.mark.parametrize("listener", ["handler on the logger", "filter on the logger", "filter on the handler",
                                      "another formatter"])
def test_the_direct_way_is_only_taken_when_the_service_handler_is_alone(service_log, listener):
    stream, handler = service_log
    alone(handler)
    seen = []
    if listener == "handler on the logger":
        extra = logging.Handler()
        extra.emit = seen.append
        logs.access_log.addHandler(extra)
        undo = lambda: logs.access_log.removeHandler(extra)  # noqa: E731
    elif listener == "filter on the logger":
        logs.access_log.addFilter(seen.append)
        undo = lambda: logs.access_log.removeFilter(seen.append)  # noqa: E731
    elif listener == "filter on the handler":
        handler.addFilter(seen.append)
        undo = lambda: handler.removeFilter(seen.append)  # noqa: E731
    else:
        formatter = logging.Formatter()
        formatter.format = lambda record: seen.append(record) or "formatted"
        handler.setFormatter(formatter)
        undo = lambda: None  # noqa: E731
    try:
        logs.write(logs.access_log, logging.INFO, "200 GET /healthz 0.10ms", "access", ACCESS)
    finally:
        undo()
    assert len(seen) == 1 and isinstance(seen[0], logging.LogRecord)


def test_levels_apply_to_direct_lines(service_log):
    stream, handler = service_log
    alone(handler)
    logging.getLogger().setLevel(logging.WARNING)
    logs.write(logs.access_log, logging.INFO, "200 GET /healthz", "access", ACCESS)
    assert stream.getvalue() == ""
    logs.write(logs.access_log, logging.WARNING, "404 GET /nowhere", "access", ACCESS)
    assert "WARNING tokensvc.access: 404 GET /nowhere" in stream.getvalue()
    handler.setLevel(logging.ERROR)
    logs.write(logs.access_log, logging.WARNING, "401 POST /oauth/token", "access", ACCESS)
    assert "401" not in stream.getvalue()


def test_outside_an_event_loop_every_line_is_flushed_at_once(service_log):
    stream, handler = service_log
    alone(handler)
    logs.audit("client_added", {"client_id": "svc"})
    assert stream.flushes == 1


def test_inside_an_event_loop_lines_are_flushed_once_per_iteration(service_log):
    stream, handler = service_log
    alone(handler)

    async def busy_iteration():
        for _ in range(5):
            logs.write(logs.access_log, logging.INFO, "200 GET /healthz", "access", ACCESS)
        logging.getLogger("tokensvc").warning("a plain record")
        flushes_during = stream.flushes
        await asyncio.sleep(0)  # the loop runs the scheduled flush
        return flushes_during

    assert asyncio.run(busy_iteration()) == 0
    assert stream.flushes == 1
    assert stream.getvalue().count("\n") == 6


def test_a_stream_that_went_away_does_not_break_logging(service_log):
    stream, handler = service_log
    stream.close()
    handler.flush_now()  # nothing raised


def test_tornado_lines_withhold_what_a_client_sent():
    w = logs.withhold_client_input
    assert w("Malformed HTTP message from 127.0.0.1: Invalid header value 'Bearer abc\\x01'") == \
        "Malformed HTTP message from 127.0.0.1: Invalid header value '(withheld)'"
    assert w("Invalid cookie signature b'c2Vzc2lvbg==|1|00'") == "Invalid cookie signature '(withheld)'"
    assert w("GET /v1/ws?access_token=T&x=1") == "GET /v1/ws?access_token=***&x=1"
    nested = "/login?next=%2Foauth%2Fauthorize%3Fstate%3DS%26client_id%3Dw and %253Fcode%253DC%2526y"
    assert w(nested) == "/login?next=%2Foauth%2Fauthorize%3Fstate%3D***%26client_id%3Dw and %253Fcode%253D***%2526y"
    assert w("Authorization: Basic d2ViYXBwOnM= and bearer xyz") == "Authorization: Basic *** and bearer ***"
    assert w("mytoken=kept") == "mytoken=kept"


def test_configure_puts_the_filter_on_tornados_loggers(service_log, caplog):
    with caplog.at_level(logging.INFO, logger="tornado.general"):
        logging.getLogger("tornado.general").warning("Tampered cookie %r", "c2VjcmV0")
    assert caplog.records[-1].getMessage() == "Tampered cookie '(withheld)'"


DRIVER_LOGGERS = ("pymongo", "pymongo.command", "pymongo.serverSelection", "pymongo.connection", "pymongo.topology")


@pytest.mark.parametrize("level", ["debug", "info", "warning"])
def test_the_mongodb_drivers_loggers_never_log_below_info(level):
    """At debug the service's own loggers log debug, the driver's do not: pymongo logs whole
    commands and replies at debug, and the documents hold password hashes and secrets' digests.
    Above info the driver follows the configured level."""
    root, driver = logging.getLogger(), logging.getLogger("pymongo")
    saved = root.handlers[:], root.level, driver.level
    try:
        logs.configure("text", level, stream=Stream())
        for name in DRIVER_LOGGERS:
            logger = logging.getLogger(name)
            assert logger.getEffectiveLevel() == max(logging.INFO, logging.getLevelName(level.upper())), name
            assert not logger.isEnabledFor(logging.DEBUG), name
        assert logging.getLogger("tokensvc.store").isEnabledFor(logging.DEBUG) == (level == "debug")
    finally:
        root.handlers[:], root_level, driver_level = saved
        root.setLevel(root_level)
        driver.setLevel(driver_level)


def test_the_modules_moved_into_packages_log_under_the_names_their_lines_always_carried():
    """A line names its logger, and operators filter on it: the web edge's machinery and the
    supervisor moved into packages, and their lines kept their names."""
    from tokensvc.cli import supervisor
    from tokensvc.handlers.edge import exit, headers, recheck

    assert [module.log.name for module in (exit, headers, recheck, supervisor)] == [
        "tokensvc.handlers.exit", "tokensvc.handlers.headers", "tokensvc.handlers.recheck", "tokensvc.supervisor"]
