"""Routes and their method tables: what an entry of a route table is (:class:`Route`), which
methods a route answers (:func:`methods_of`), and which handler method serves a request
(:func:`handler_method`).

HEAD is answered wherever GET is, by GET's handler method: the one HEAD rule is that, and the
one exit (:mod:`.exit`) sending the headers a GET would, with no body.

The route tables themselves are the composition root's (``tokensvc.app``: the public
listener's ``ROUTES``, the admin listener's ``ADMIN_ROUTES``); this module knows no handler.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import tornado.web

if TYPE_CHECKING:
    from tokensvc.handlers.edge.inputs import RequestInput

STANDARD_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
UNMATCHED = "(unmatched)"  # the metrics' route label of a request no route matched


def methods_of(handler: type) -> frozenset[str]:
    """The methods ``handler`` answers: those it defines (HEAD aside), HEAD wherever GET is,
    and OPTIONS on a route that answers other origins' preflights (handlers/edge/cors.py)."""
    unimplemented = tornado.web.RequestHandler.get  # how Tornado's base says "not answered"
    found = {method for method in STANDARD_METHODS if method != "HEAD"
             and callable(defined := getattr(handler, method.lower(), None)) and defined is not unimplemented}
    if "GET" in found:
        found.add("HEAD")
    if getattr(handler, "cors", False):
        found.add("OPTIONS")
    return frozenset(found)


def handler_method(method: str) -> str:
    """The name of the handler method that serves ``method`` (a method of the route's table)."""
    return "get" if method == "HEAD" else method.lower()


@dataclass(frozen=True, slots=True)
class Route:
    """One entry of a route table."""

    path: str  # as the OpenAPI document writes it ({name}: one path segment); the metrics' label
    handler: type[RequestInput]
    methods: frozenset[str]
    parameters: tuple[str, ...] = field(init=False)  # the names of its {name} segments, in order

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", tuple(re.findall(r"\{([^}]+)\}", self.path)))

    @classmethod
    def of(cls, path: str, handler: type[RequestInput]) -> Route:
        return cls(path, handler, methods_of(handler))

    @property
    def pattern(self) -> str:
        """The route's regular expression: the path as written, each ``{name}`` one segment."""
        return "".join("([^/]*)" if part.startswith("{") else re.escape(part)
                       for part in re.split(r"(\{[^}]+\})", self.path)) + "$"

    @property
    def allow(self) -> str:
        return ", ".join(sorted(self.methods))
