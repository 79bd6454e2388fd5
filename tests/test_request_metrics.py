"""The request metrics as plain numbers: the exposition is the one ``prometheus_client``'s own
Counter and Histogram give for the same requests (names, labels, bucket bounds, ``_created``),
and with several processes a scrape of any of them counts every process's requests."""

from __future__ import annotations

import os
import re

import pytest
import requests
from helpers import wait_until
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from service import start_service

from tokensvc.telemetry import metrics, request_metrics
from tokensvc.telemetry.request_metrics import RequestCollector, RequestCounts

# (route, method, status, seconds): on a bound, between bounds, past the last one, zero.
REQUESTS = [("/oauth/token", "POST", 200, 0.0005), ("/oauth/token", "POST", 400, 0.0007),
            ("/oauth/clients/{client_id}", "GET", 200, 0.01), ("/oauth/token", "POST", 200, 20.0),
            ("(unmatched)", "other", 404, 0.0), ("/oauth/token", "POST", 200, 0.0031)]


def created_masked(text: str) -> str:
    """The exposition with the value of every _created sample left out (the time a series began)."""
    return re.sub(r"^(\w+_created\{.*\}) \S+$", r"\1 (a time)", text, flags=re.M)


def library_exposition(observations) -> str:
    registry = CollectorRegistry()
    counter = Counter("tokensvc_http_requests_total", request_metrics.REQUESTS_HELP, ["method", "route", "status"],
                      registry=registry)
    histogram = Histogram(request_metrics.DURATION, request_metrics.DURATION_HELP, ["route"],
                          buckets=metrics.DURATION_BUCKETS, registry=registry)
    for route, method, status, seconds in observations:
        counter.labels(method, route, str(status)).inc()
        histogram.labels(route).observe(seconds)
    return generate_latest(registry).decode()


def plain_exposition(observations) -> str:
    counts = RequestCounts(metrics.DURATION_BUCKETS)
    for observation in observations:
        counts.record(*observation)
    registry = CollectorRegistry()
    registry.register(RequestCollector(counts))
    return generate_latest(registry).decode()


def test_the_exposition_is_the_librarys_for_the_same_requests():
    library, plain = library_exposition(REQUESTS), plain_exposition(REQUESTS)
    assert "_created{" in plain and 'le="+Inf"' in plain and 'le="0.0005",route="/oauth/token"} 1.0' in plain
    assert created_masked(plain) == created_masked(library)
    assert created_masked(plain_exposition([])) == created_masked(library_exposition([]))  # HELP and TYPE only


def test_created_series_follow_the_librarys_setting(monkeypatch):
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "true")
    assert "_created" not in plain_exposition(REQUESTS)


def test_the_service_counts_through_plain_numbers():
    """Metrics.request adds to the plain numbers, which its exposition shows."""
    service_metrics = metrics.Metrics()
    for route, method, status, seconds in REQUESTS:
        service_metrics.request(route, method, status, seconds)
    text = service_metrics.render().decode()
    assert 'tokensvc_http_requests_total{method="POST",route="/oauth/token",status="200"} 3.0' in text
    assert 'tokensvc_http_request_duration_seconds_count{route="/oauth/token"} 4.0' in text
    assert "process_cpu_seconds_total" in text


def test_each_process_writes_its_numbers_and_reads_the_others(tmp_path, monkeypatch):
    """In one process, standing for several: a file per process, its own numbers from memory,
    a file being replaced never read half-written."""
    mine = RequestCounts(metrics.DURATION_BUCKETS, str(tmp_path))
    other = RequestCounts(metrics.DURATION_BUCKETS, str(tmp_path))
    other.record("/oauth/token", "POST", 200, 0.002)
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    other.publish()  # the other process's file
    monkeypatch.undo()
    mine.record("/oauth/token", "POST", 200, 0.02)  # outside a loop: its file written at once
    (tmp_path / "tokensvc_http_77.partial").write_text('{"requests": [[')  # a write in progress
    total = mine.everyone()
    assert total.counts == {("POST", "/oauth/token", 200): 2}
    durations = total.durations["/oauth/token"]
    assert sum(durations.buckets) == 2 and durations.total == pytest.approx(0.022)
    assert {path.name for path in tmp_path.iterdir()} == {
        "tokensvc_http_4242.json", f"tokensvc_http_{os.getpid()}.json", "tokensvc_http_77.partial"}


# -- real processes -----------------------------------------------------------------------------


def scraped(base: str) -> dict[str, float]:
    """The request metrics of ``GET /oauth/clients/{client_id}`` in one scrape."""
    text = requests.get(base + "/metrics", timeout=10).text
    route = 'route="/oauth/clients/{client_id}"'
    found = {}
    for line in text.splitlines():
        if route in line and line.startswith(("tokensvc_http_requests_total", "tokensvc_http_request_duration")):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def wait_for_counts(base: str, ok: int, missing: int, deadline_seconds: float = 20) -> dict[str, float]:
    """Scrape until the route's 200s and 404s are ``ok`` and ``missing`` (another process's
    numbers arrive within a second), with a deadline."""
    def counted() -> dict[str, float] | None:
        found = scraped(base)
        route = 'tokensvc_http_requests_total{method="GET",route="/oauth/clients/{client_id}",status='
        return found if (found.get(route + '"200"}', 0), found.get(route + '"404"}', 0)) == (ok, missing) else None

    return wait_until(counted, f"{ok} 200s and {missing} 404s scraped at {base}", deadline_seconds, interval=0.1)


@pytest.mark.e2e
def test_a_scrape_of_any_process_counts_every_process(tmp_path_factory):
    """Two real ``tokensvc serve`` processes sharing one metrics directory (the multiprocess
    mode): each answers some requests; a scrape of either counts them all, and a process
    that stopped still counts."""
    directory = tmp_path_factory.mktemp("metrics")
    environment = {metrics.MULTIPROCESS_ENV: str(directory)}
    first = start_service(tmp_path_factory.mktemp("first"), env=environment)
    second = start_service(tmp_path_factory.mktemp("second"), env=environment)
    try:
        for _ in range(3):
            assert requests.get(first.base + "/oauth/clients/webapp", timeout=10).status_code == 200
        for _ in range(5):
            assert requests.get(second.base + "/oauth/clients/webapp", timeout=10).status_code == 200
        assert requests.get(second.base + "/oauth/clients/nobody", timeout=10).status_code == 404
        for service in (first, second):
            found = wait_for_counts(service.base, 8, 1)
            count = 'tokensvc_http_request_duration_seconds_count{route="/oauth/clients/{client_id}"}'
            assert found[count] == 9
            assert found['tokensvc_http_request_duration_seconds_bucket{le="+Inf",'
                         'route="/oauth/clients/{client_id}"}'] == 9
        second.stop()  # SIGTERM: it writes its numbers as it exits
        requests.get(first.base + "/oauth/clients/webapp", timeout=10)
        wait_for_counts(first.base, 9, 1)
        assert len(list(directory.glob("tokensvc_http_*.json"))) == 2
    finally:
        for service in (first, second):
            if service.returncode is None:
                service.stop()
