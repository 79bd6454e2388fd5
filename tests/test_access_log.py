"""The access line at a fixed cost: the direct way writes exactly the line the formatter writes
(text and JSON, clean and hostile values, every level), the time is formatted once per
millisecond, and every line, direct or a record's, leaves through one buffer in order."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time

import pytest
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from tokensvc.handlers.edge.access_log import log_access
from tokensvc.telemetry import logs

NOW = 1795617329.0421  # 2026-11-25T14:35:29.042Z


@pytest.fixture
def service_log(monkeypatch):
    """logs.configure() into a StringIO, the time fixed. The test makes the handler the root
    logger's only one (:func:`alone`): pytest adds its capture to each test's call."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    handler = logs.configure("text", "info", stream=stream)
    monkeypatch.setattr(logs, "now", lambda: NOW)
    monkeypatch.setattr(time, "time", lambda: NOW)  # a LogRecord's time
    yield stream, handler
    root.handlers[:], level = saved
    root.setLevel(level)


def alone(handler: logging.Handler) -> None:
    logging.getLogger().handlers[:] = [handler]


def request(method: str = "POST", uri: str = "/oauth/token/introspect", ip: str = "127.0.0.1") -> HTTPServerRequest:
    made = HTTPServerRequest(start_line=RequestStartLine(method, uri, "HTTP/1.1"),
                             headers=HTTPHeaders({"Host": "127.0.0.1"}))
    made.remote_ip = ip
    made._start_time, made._finish_time = NOW - 0.00042, NOW
    return made


@pytest.fixture
def records():
    """Every LogRecord made while the test runs."""
    made: list[logging.LogRecord] = []
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(lambda *args, **kwargs: made.append(record := factory(*args, **kwargs)) or record)
    yield made
    logging.setLogRecordFactory(factory)


def both_ways(stream: io.StringIO, handler: logs.ServiceHandler, write) -> tuple[str, str]:
    """The line ``write()`` makes with the service's handler alone, and as a LogRecord (another
    handler listening), formatted by the same handler."""
    alone(handler)
    write()
    handler.flush_now()
    direct = stream.getvalue()
    listener = logging.Handler()
    listener.emit = lambda record: None
    logging.getLogger().addHandler(listener)
    try:
        write()
    finally:
        logging.getLogger().removeHandler(listener)
    handler.flush_now()
    return direct, stream.getvalue()[len(direct):]


CASES = [
    # (status, method, uri, route, client_id, error, request id)
    (200, "POST", "/oauth/token/introspect", "/oauth/token/introspect", "webapp", None, "0123456789abcdef"),
    (200, "GET", "/oauth/clients/webapp", "/oauth/clients/{client_id}", None, None, "lb-7f3a.2_x"),
    (401, "POST", "/oauth/token", "/oauth/token", "webapp", "invalid_client", "r1"),
    (404, "GET", "/nowhere?code=SECRET&x=1", "(unmatched)", None, None, "r2"),
    (500, "GET", "/", "/", None, None, None),
    (200, "POST", "/oauth/revoke?token=SECRET", "/oauth/revoke", "ünïcode-client", None, "r3"),
    (200, "X" * 40, "/oauth/token", "/oauth/token", None, None, "r4"),  # an invented method, cut
    (200, "P\x1bST", "/x\x1b[31mred?next=\x00", None, "A\nforged line", None, "r5"),  # hostile values
    (400, "GET", "/v1/me\u2028forged", "(unmatched)", "c\x85", "invalid_request", "r6"),
    (200, "GET", "/" + "p" * 3000, None, "c" * 300, None, "r7"),  # cut to their limits
]


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_the_direct_line_is_the_formatters_line(service_log, records, fmt, case):
    stream, handler = service_log
    handler.setFormatter(logs.JsonFormatter() if fmt == "json" else logs.TextFormatter())
    status, method, uri, route, client_id, error, request_id = case
    token = logs.REQUEST_ID.set(request_id)
    try:
        direct, by_record = both_ways(stream, handler,
                                      lambda: log_access(status, request(method, uri), client_id, error, route))
    finally:
        logs.REQUEST_ID.reset(token)
    assert len(records) == 1  # the record of the second way only
    assert direct == by_record and direct.endswith("\n") and direct.count("\n") == 1
    assert "SECRET" not in direct and not any(c in direct[:-1] for c in "\n\r\x00\x1b\x85\u2028")


def test_the_line_as_operators_read_it(service_log):
    stream, handler = service_log
    alone(handler)
    token = logs.REQUEST_ID.set("0123456789abcdef")
    try:
        log_access(200, request(), "webapp", None, "/oauth/token/introspect")
        log_access(401, request(uri="/oauth/token"), "webapp", "invalid_client", "/oauth/token", 0.0125)
        log_access(200, request("GET", "/cb?code=c&state=s&next=%2Fa%3Fcode%3Dd"), None, None, "/cb")
    finally:
        logs.REQUEST_ID.reset(token)
    handler.flush_now()
    assert stream.getvalue().splitlines() == [
        "2026-11-25T14:35:29.042Z INFO tokensvc.access: 127.0.0.1 200 POST /oauth/token/introspect 0.42ms "
        "client_id=webapp request_id=0123456789abcdef",
        "2026-11-25T14:35:29.042Z WARNING tokensvc.access: 127.0.0.1 401 POST /oauth/token 12.50ms "
        "client_id=webapp error=invalid_client request_id=0123456789abcdef",
        "2026-11-25T14:35:29.042Z INFO tokensvc.access: 127.0.0.1 200 GET /cb?code=***&state=***&next=/a%3Fcode%3D***"
        " 0.42ms request_id=0123456789abcdef",
    ]


def test_a_hostile_value_is_escaped_whichever_way(service_log):
    stream, handler = service_log
    alone(handler)
    log_access(200, request("GET", "/x\x1b[2J"), "a\nb", None, None)
    handler.flush_now()
    line = stream.getvalue()
    assert line.count("\n") == 1 and "/x\\u001b[2J" in line and "client_id=a\\nb" in line


def test_levels_apply_to_access_lines(service_log):
    stream, handler = service_log
    alone(handler)
    logs.access_log.setLevel(logging.WARNING)
    try:
        log_access(200, request(), "webapp", None, "/oauth/token/introspect")
        log_access(401, request(), "webapp", "invalid_client", "/oauth/token/introspect")
    finally:
        logs.access_log.setLevel(logging.NOTSET)
    handler.flush_now()
    assert stream.getvalue().count("\n") == 1 and " 401 " in stream.getvalue()


def test_the_time_is_formatted_once_per_millisecond(monkeypatch):
    formatted = []
    strftime = time.strftime
    monkeypatch.setattr(time, "strftime", lambda *args: formatted.append(args) or strftime(*args))
    clock = logs.Clock()
    first = clock.stamp(NOW)
    assert first == "2026-11-25T14:35:29.042"
    assert clock.stamp(NOW + 0.0005) is first  # the same millisecond: the same text, not made again
    assert clock.stamp(NOW + 0.001) == "2026-11-25T14:35:29.043"
    assert clock.stamp(NOW + 1) == "2026-11-25T14:35:30.042"
    assert len(formatted) == 2  # once per second
    assert logs.TextFormatter().line(NOW, "INFO", "x", "m", {}).startswith("2026-11-25T14:35:29.042Z INFO x: m")
    assert json.loads(logs.JsonFormatter().line(NOW, "INFO", "x", "m", {}))["time"] == "2026-11-25T14:35:29.042+00:00"


class Counted(io.BytesIO):
    """A binary stream that counts its writes."""

    writes = 0

    def write(self, data) -> int:  # type: ignore[override]
        self.writes += 1
        return super().write(data)


@pytest.mark.parametrize("kind", ["file", "counted"])
def test_direct_lines_and_records_leave_in_order_in_one_write(tmp_path, kind):
    """Access lines and a Tornado record between them leave in the order they were written, in
    one write for the iteration, to the stream's binary layer (UTF-8)."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    binary = Counted()
    stream = open(tmp_path / "service.log", "w", encoding="utf-8") if kind == "file" \
        else io.TextIOWrapper(binary, encoding="utf-8")  # noqa: SIM115 (closed below)
    handler = logs.configure("text", "info", stream=stream)
    alone(handler)

    def written() -> str:
        return (tmp_path / "service.log").read_text() if kind == "file" else binary.getvalue().decode()

    async def iteration() -> str:
        log_access(200, request(), "webapp", None, "/oauth/token/introspect")
        logging.getLogger("tornado.general").warning("a record between")
        log_access(200, request(uri="/oauth/token"), "ünï", None, "/oauth/token")
        assert written() == ""  # nothing before the iteration ends
        await asyncio.sleep(0)
        return written()

    try:
        lines = asyncio.run(iteration()).splitlines()
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        stream.close()
    assert len(lines) == 3 and "/oauth/token/introspect" in lines[0] and "a record between" in lines[1]
    assert lines[2].endswith("client_id=ünï")
    if kind == "counted":
        assert binary.writes == 1


def test_a_flush_due_on_a_stopped_loop_does_not_hold_lines(service_log):
    """A loop closed with the flush still due (its callback never ran) holds nothing back: the
    next line outside a loop writes everything."""
    stream, handler = service_log
    alone(handler)
    loop = asyncio.new_event_loop()

    def last_callback():
        log_access(200, request(), "webapp", None, "/oauth/token/introspect")
        loop.stop()  # the loop ends with this iteration: the flush due on the next never runs

    try:
        loop.call_soon(last_callback)
        loop.run_forever()
    finally:
        loop.close()
    assert stream.getvalue() == ""
    logs.audit("client_added", {"client_id": "svc"})
    assert stream.getvalue().count("\n") == 2
