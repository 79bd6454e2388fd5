"""Prometheus metrics (``GET /metrics``), made with ``prometheus_client``.

One :class:`Metrics` per service, in a registry of its own, carried by the protocol context:
the protocol layer reports what it decides (tokens issued and revoked, reuse, failed
authentications, 429s) through the interface it declares (``tokensvc.oauth.metrics``), which
this class implements; the two handler bases count requests, the WebSocket route its open
sockets, the error renderer the store's failures.

With ``tokensvc serve --processes N`` every process writes its values to files in one
directory (the library's multiprocess mode) and a scrape of any process reads them all: one
consistent view. The request metrics, which every request adds to, are plain numbers folded
into the exposition when it is scraped (:mod:`tokensvc.telemetry.request_metrics`).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from tokensvc.telemetry.request_metrics import FILE_PREFIX, RequestCollector, RequestCounts

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Request latencies of an OAuth server: a token request takes about a millisecond in process,
# tens of milliseconds with a store across a network, a sign-in (scrypt) about a tenth.
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0)


def use_multiprocess_dir(directory: str) -> None:
    """Write every metric made from now on to files in ``directory`` (before the processes
    fork; the directory is emptied first)."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if name.endswith(".db") or name.startswith(FILE_PREFIX):
            os.remove(os.path.join(directory, name))
    os.environ[MULTIPROCESS_ENV] = directory
    prometheus_values.ValueClass = prometheus_values.get_value_class()


def process_died(pid: int) -> None:
    """Forget the live gauges of a process that has ended (multiprocess mode; the supervisor
    tells of each worker that left), so that they are no longer summed."""
    directory = os.environ.get(MULTIPROCESS_ENV)
    if directory:
        mark_process_dead(pid, directory)


class Metrics:
    def __init__(self) -> None:
        self.multiprocess = bool(os.environ.get(MULTIPROCESS_ENV))
        registry = self.registry = CollectorRegistry()

        def counter(name: str, text: str, labels: Iterable[str] = ()) -> Counter:
            return Counter(name, text, list(labels), registry=registry)

        # Every request counts here: plain numbers, made into metrics when scraped.
        self.requests = RequestCounts(DURATION_BUCKETS, os.environ.get(MULTIPROCESS_ENV) or None)
        self._request_collector = RequestCollector(self.requests)
        registry.register(self._request_collector)
        self.tokens_issued = counter("tokensvc_tokens_issued_total", "Token pairs issued, by grant", ("grant",))
        self.families_revoked = counter("tokensvc_token_families_revoked_total",
                                        "Token families revoked (a refresh and an access token each), by reason",
                                        ("reason",))
        self.access_tokens_revoked = counter("tokensvc_access_tokens_revoked_total",
                                             "Access tokens revoked alone by their client (RFC 7009)")
        self.refresh_reuse = counter("tokensvc_refresh_reuse_total",
                                     "Rotated-out refresh tokens presented again (their family revoked)")
        self.code_reuse = counter("tokensvc_code_reuse_total",
                                  "Redeemed authorization codes presented again (their family revoked)")
        self.client_auth_failures = counter("tokensvc_client_auth_failures_total", "Failed client authentications")
        self.login_failures = counter("tokensvc_login_failures_total", "Failed sign-ins")
        self.confirmation_failures = counter("tokensvc_confirmation_failures_total",
                                             "Confirmation codes refused at a code's exchange (not its page's, "
                                             "or past the code's presentations)")
        self.rate_limited = counter("tokensvc_rate_limited_total", "Requests refused by a failure limit (429)",
                                    ("kind",))
        self.store_errors = counter("tokensvc_store_errors_total",
                                    "Requests the store failed (503: not answering; 500: refused)", ("kind",))
        self.websockets_open = Gauge("tokensvc_websockets_open", "Open WebSocket connections",
                                     registry=registry, multiprocess_mode="livesum")
        # The revocation feed's readers (GET /oauth/revocations): how many, what they were sent,
        # how they came back, and who was refused or closed, and why (docs/reference/metrics.md).
        self.feed_readers = Gauge("tokensvc_feed_readers", "Open revocation feed readers", registry=registry,
                                  multiprocess_mode="livesum")
        self.feed_messages = counter("tokensvc_feed_messages_sent_total",
                                     "Revocation feed messages handed to readers (one per reader)")
        self.feed_openings = counter("tokensvc_feed_openings_total",
                                     "Revocation feed readers opened: resumed where they left off, or told to flush",
                                     ("outcome",))
        self.feed_refusals = counter("tokensvc_feed_refusals_total",
                                     "Revocation feed readers refused (before the upgrade) or closed for their "
                                     "credentials (4403), by reason", ("reason",))
        self.feed_closed = counter("tokensvc_feed_closed_total",
                                   "Revocation feed readers the service closed: too slow (1008), the process "
                                   "stopping (1012), no pong in time (1000)", ("reason",))
        # The store's own work (MongoDB): what each operation costs, how it fails, what the
        # driver's pool and topology do, and whether revocations of other processes arrive.
        self.store_seconds = Histogram("tokensvc_store_operation_seconds",
                                       "Time a store operation took, its retries included", ["operation"],
                                       buckets=DURATION_BUCKETS, registry=registry)
        self.store_attempt_errors = counter("tokensvc_store_attempt_errors_total",
                                            "Store operation attempts that failed, by the server's code or the "
                                            "error's class", ("operation", "code"))
        self.store_retries = counter("tokensvc_store_retries_total",
                                     "Store operations tried again after a transient error", ("operation",))
        self.store_pool_checked_out = Gauge("tokensvc_store_pool_checked_out", "Connections in use",
                                            registry=registry, multiprocess_mode="livesum")
        self.store_pool_wait = Histogram("tokensvc_store_pool_wait_seconds", "Time to check a connection out",
                                         buckets=DURATION_BUCKETS, registry=registry)
        self.store_topology_changes = counter("tokensvc_store_topology_changes_total",
                                              "Changes of a server's state seen by the driver (elections, failures)")
        self.feed_state = Gauge("tokensvc_revocation_feed_state",
                                "How revocations of other processes arrive: 1 for the current state",
                                ["state"], registry=registry, multiprocess_mode="livemax")
        self.feed_interruptions = counter("tokensvc_revocation_feed_interruptions_total",
                                          "Times the revocation feed stopped and started again")
        self.feed_last_event = Gauge("tokensvc_revocation_feed_last_event_timestamp_seconds",
                                     "When the revocation feed last delivered a revocation (Unix time)",
                                     registry=registry, multiprocess_mode="livemax")
        # The store's format as each process last read it (MongoDB): where an upgrade stands.
        self.store_format = Gauge("tokensvc_store_format",
                                  "The store's format (of=store) and compatibility version (of=compatibility)",
                                  ["of"], registry=registry, multiprocess_mode="livemax")
        self.migration_rows = Gauge("tokensvc_store_migration_rows",
                                    "Rows a migration has converted so far, store-wide", ["migration"],
                                    registry=registry, multiprocess_mode="livemax")
        self.migration_pending = Gauge("tokensvc_store_migration_pending", "1 while a migration is not done",
                                       ["migration"], registry=registry, multiprocess_mode="livemax")
        # What a release that cannot read the store leaves (0.9.0 started after finalize): 0 always.
        self.old_release_connections = Gauge(
            "tokensvc_store_old_release_connections",
            "Connections of a release that cannot read the store's compatibility version", registry=registry,
            multiprocess_mode="livemax")
        self.old_format_rows = Gauge("tokensvc_store_old_format_rows",
                                     "Rows of an older format written after their migration was done",
                                     registry=registry, multiprocess_mode="livemax")
        if not self.multiprocess:
            ProcessCollector(registry=registry)

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One answered request. ``route`` is the route's pattern, never the raw path."""
        self.requests.record(route, method, status, seconds)

    # What the protocol reports (tokensvc.oauth.metrics.ProtocolMetrics).

    def issued(self, grant: str) -> None:
        self.tokens_issued.labels(grant).inc()

    def revoked_families(self, reason: str, count: int = 1) -> None:
        self.families_revoked.labels(reason).inc(count)

    def revoked_access_token(self) -> None:
        self.access_tokens_revoked.inc()

    def reused_code(self) -> None:
        self.code_reuse.inc()

    def reused_refresh_token(self) -> None:
        self.refresh_reuse.inc()

    def failed_client_auth(self) -> None:
        self.client_auth_failures.inc()

    def failed_login(self) -> None:
        self.login_failures.inc()

    def failed_confirmation(self) -> None:
        self.confirmation_failures.inc()

    def refused_by_limit(self, kind: str) -> None:
        self.rate_limited.labels(kind).inc()

    def feed_sent(self, count: int) -> None:
        self.feed_messages.inc(count)

    def feed_opened(self, resumed: bool) -> None:
        self.feed_openings.labels("resumed" if resumed else "flush").inc()

    def render(self) -> bytes:
        """The text exposition: this process's registry, or, in multiprocess mode, every
        process's values (and the process metrics of the one answering)."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        registry.register(self._request_collector)
        ProcessCollector(registry=registry)
        return generate_latest(registry)


class AddressRule:
    """Who may scrape ``/metrics``: remote addresses within the ``metrics.allow`` networks."""

    def __init__(self, networks: Iterable[str]) -> None:
        self.networks = [ipaddress.ip_network(network, strict=False) for network in networks]

    def allows(self, address: str | None) -> bool:
        try:
            ip = ipaddress.ip_address((address or "").split("%")[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in network for network in self.networks)
