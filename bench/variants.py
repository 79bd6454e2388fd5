"""The variants an A/B of ``bench/inprocess.py`` compares (``--ab A B``) and ``bench/seeded.py``
serves for a whole run (``--switch``): the service as it is, its ``RequestHandler`` twin, the
switches that leave a part of the request's observability out, and the plain idioms the current
mechanisms replaced (``bench/plain.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import plain
import tornado.iostream
import twin

from tokensvc.app import ROUTES
from tokensvc.handlers.edge import lifecycle, response_writer
from tokensvc.telemetry import metrics


def _quiet_access(*args: object, **kwargs: object) -> None:
    """No access line (an experiment of the A/B, never a setting)."""


def _quiet_metrics(self: object, *args: object) -> None:
    """No request metrics (as above)."""


def _fixed_request_id(request: object) -> str:
    """One request id for every request, none made (as above)."""
    return "0123456789abcdef"


# What the switch variants leave out: (the object, its attribute, what replaces it), swapped in
# around the variant's own blocks only.
SWITCHES = {
    "no-access-line": [(lifecycle, "log_access", _quiet_access)],
    "no-metrics": [(metrics.Metrics, "request", _quiet_metrics)],
    "no-request-id": [(lifecycle, "request_id_for", _fixed_request_id)],
}
SWITCHES["quiet"] = [patch for name in ("no-access-line", "no-metrics", "no-request-id") for patch in SWITCHES[name]]
# The plain idioms the current mechanisms replaced (bench/plain.py).
SWITCHES["plain-access-line"] = [(lifecycle, "log_access", plain.log_access)]
SWITCHES["library-metrics"] = [(metrics.Metrics, "request", plain.library_request)]
SWITCHES["urandom-request-id"] = [(lifecycle, "request_id_for", plain.request_id_for)]
SWITCHES["plain-observability"] = [patch for name in ("plain-access-line", "library-metrics", "urandom-request-id")
                                   for patch in SWITCHES[name]]


def _no_nodelay(self: object, value: bool) -> None:
    """Tornado's TCP_NODELAY toggle (two setsockopt calls per response) left out."""


SWITCHES["no-nodelay-toggle"] = [(tornado.iostream.IOStream, "set_nodelay", _no_nodelay)]


def _never_one_block(connection: object, request: object) -> bool:
    """Every JSON answer through Tornado's write_headers (the response writer left out)."""
    return False


SWITCHES["tornado-writer"] = [(response_writer, "in_one_block", _never_one_block)]


@dataclass(frozen=True)
class Variant:
    """One side of an A/B: the route table it serves, and what is switched off around its blocks."""

    routes: Callable[[], list]
    patches: tuple = ()

    @contextlib.contextmanager
    def switched(self) -> Iterator[None]:
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in self.patches]
        for owner, name, replacement in self.patches:
            setattr(owner, name, replacement)
        try:
            yield
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)


# The variants an A/B compares: the service as it is (delegate), every JSON route on a
# RequestHandler twin (requesthandler), and the switches above.
VARIANTS = {
    "delegate": Variant(lambda: ROUTES),
    "requesthandler": Variant(lambda: twin.TWIN_ROUTES),
    "same": Variant(lambda: ROUTES),  # the service as it is again: the null A/B's other side
    "unbounded-feed": Variant(lambda: plain.unbounded_feed_routes(ROUTES)),  # for revoke-feed
    **{name: Variant(lambda: ROUTES, tuple(patches)) for name, patches in SWITCHES.items()},
}
