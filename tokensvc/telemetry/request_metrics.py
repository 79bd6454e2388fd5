"""The request metrics as plain numbers, folded into the Prometheus exposition when it is scraped.

Every answered request counts once in ``tokensvc_http_requests_total`` (by method, route and
status) and once in ``tokensvc_http_request_duration_seconds`` (by route). Kept as
``prometheus_client`` children, each request paid for their label look-ups, locks and
per-bucket loop; here the lifecycle adds to plain numbers (a count per label set, per route
a list of bucket counts and a sum) and :class:`RequestCollector` makes them into the same
metric families, with the same names, labels, bucket bounds and ``_created`` series, only when
``/metrics`` is scraped (``tests/test_request_metrics.py`` compares the two expositions).

With several processes (``tokensvc serve --processes N``, the library's multiprocess mode)
each process writes its numbers to a file of its own in the metrics directory at most a
second after they changed (and when it exits), and a scrape of any process adds up every
process's file, its own numbers read from memory: one view, as the library's multiprocess
files give for the other metrics. A process killed outright loses at most its last second.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import time
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

REQUESTS = "tokensvc_http_requests"  # the counter's family (its samples end in _total)
REQUESTS_HELP = "HTTP requests answered, by route pattern"
DURATION = "tokensvc_http_request_duration_seconds"
DURATION_HELP = "Time to answer a request"
FILE_PREFIX = "tokensvc_http_"  # a process's numbers in the multiprocess directory: tokensvc_http_<pid>.json
PUBLISH_SECONDS = 1.0


def _created_series() -> bool:
    """Whether counters and histograms carry ``_created`` series (the library's setting)."""
    return os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1", "t")


class Durations:
    """One route's duration histogram: the count of each bucket (not cumulative; the last is
    +Inf) and the sum."""

    __slots__ = ("buckets", "total", "created")

    def __init__(self, size: int, created: float) -> None:
        self.buckets = [0] * size
        self.total = 0.0
        self.created = created


class RequestCounts:
    """The request metrics of one process, as plain numbers."""

    def __init__(self, bounds: tuple[float, ...], directory: str | None = None) -> None:
        self.bounds = bounds
        self.counts: dict[tuple[str, str, int], int] = {}  # (method, route, status): requests
        self.created: dict[tuple[str, str, int], float] = {}  # when each label set was first seen
        self.durations: dict[str, Durations] = {}  # by route
        # Multiprocess mode: where this process's numbers are written for the others' scrapes.
        self.directory = directory
        self._publishing = directory is None  # True while a write is due (never without a directory)
        if directory is not None:
            atexit.register(self.publish)

    def record(self, route: str, method: str, status: int, seconds: float) -> None:
        """One answered request. ``route`` is the route's pattern, never the raw path."""
        key = (method, route, status)
        count = self.counts.get(key)
        if count is None:
            count = 0
            self.created[key] = time.time()
        self.counts[key] = count + 1
        durations = self.durations.get(route)
        if durations is None:
            durations = self.durations[route] = Durations(len(self.bounds) + 1, time.time())
        # The first bound the duration is at most (as the library's le=): the last slot is +Inf.
        durations.buckets[bisect_left(self.bounds, seconds)] += 1
        durations.total += seconds
        if not self._publishing:
            self._publish_soon()

    # -- several processes ------------------------------------------------------------------

    def _publish_soon(self) -> None:
        self._publishing = True
        try:
            asyncio.get_running_loop().call_later(PUBLISH_SECONDS, self.publish)
        except RuntimeError:  # no loop (a request is always served on one): at once
            self.publish()

    def snapshot(self) -> dict[str, list]:
        return {"requests": [[*key, count] for key, count in self.counts.items()],
                "durations": [[route, d.buckets, d.total] for route, d in self.durations.items()]}

    def publish(self) -> None:
        """Write this process's numbers to its file (whole: a reader never sees half of it)."""
        if self.directory is None:
            return
        self._publishing = False
        path = Path(self.directory) / f"{FILE_PREFIX}{os.getpid()}.json"
        partial = path.with_suffix(".partial")
        with contextlib.suppress(OSError):  # the directory went away: the next write tries again
            partial.write_text(json.dumps(self.snapshot()))
            os.replace(partial, path)

    def everyone(self) -> RequestCounts:
        """Every process's numbers added up: this one's from memory, the others' from their files."""
        if self.directory is None:
            return self
        total = RequestCounts(self.bounds)
        total.add(self.snapshot())
        mine = f"{FILE_PREFIX}{os.getpid()}.json"
        for path in sorted(Path(self.directory).glob(f"{FILE_PREFIX}*.json")):
            if path.name != mine:
                with contextlib.suppress(OSError, ValueError):
                    total.add(json.loads(path.read_text()))
        return total

    def add(self, snapshot: dict[str, list]) -> None:
        for method, route, status, count in snapshot["requests"]:
            key = (method, route, status)
            self.counts[key] = self.counts.get(key, 0) + count
        for route, buckets, total in snapshot["durations"]:
            durations = self.durations.get(route)
            if durations is None:
                durations = self.durations[route] = Durations(len(self.bounds) + 1, 0.0)
            durations.buckets = [mine + theirs for mine, theirs in zip(durations.buckets, buckets, strict=True)]
            durations.total += total


class RequestCollector:
    """The request metrics in the exposition, made from :class:`RequestCounts` at scrape time."""

    def __init__(self, counts: RequestCounts) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self.counts.everyone()
        # The library's multiprocess view has no _created series: neither has this one there.
        created = self.counts.directory is None and _created_series()
        requests = CounterMetricFamily(REQUESTS, REQUESTS_HELP, labels=("method", "route", "status"))
        for key, count in counts.counts.items():
            method, route, status = key
            requests.add_metric((method, route, str(status)), count,
                                created=counts.created.get(key) if created else None)
        yield requests
        duration = HistogramMetricFamily(DURATION, DURATION_HELP, labels=("route",))
        for route, durations in counts.durations.items():
            cumulative, buckets = 0, []
            for bound, count in zip((*counts.bounds, float("inf")), durations.buckets, strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            duration.add_metric((route,), buckets, durations.total)
            if created:
                duration.samples.append(Sample(DURATION + "_created", {"route": route}, durations.created))
        yield duration
