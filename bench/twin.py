"""A ``RequestHandler`` twin of every JSON route, for the A/B that decides the JSON adapter
(``python bench/inprocess.py --ab delegate requesthandler``).

A twin runs the same endpoint code (the same class, the same request lifecycle: its method
table, body limit, request id, XSRF rule, renderer, exit and access line) but is served the way
pages are: Tornado's ``RequestHandler`` with its own body parsing, dispatch, error handling and
response writing (through the exit's ``write_headers``), instead of
:class:`tokensvc.handlers.edge.json_handler.JsonHandler`'s whole answers.
"""

from __future__ import annotations

from typing import Any

import tornado.web

from tokensvc.app import ROUTES
from tokensvc.handlers.edge.json_handler import JsonHandler
from tokensvc.handlers.edge.routes import Route
from tokensvc.handlers.edge.web_handler import WebHandler


class Twin:
    """The JSON endpoint's code over a ``RequestHandler``: built, dispatched and answered by Tornado."""

    def __init__(self, application: tornado.web.Application, request: Any, **kwargs: Any) -> None:
        tornado.web.RequestHandler.__init__(self, application, request, **kwargs)  # type: ignore[arg-type]

    def initialize(self) -> None:
        WebHandler.initialize(self)  # type: ignore[arg-type]
        self.answered = False

    def send(self, status: int, body: bytes, content_type: str | None, extra: dict[str, str] | None = None,
             base: dict[str, str] | None = None) -> None:
        self.answered = True
        self.set_status(status)
        for name, value in (extra or {}).items():
            self.set_header(name, value)
        if content_type:
            self.set_header("Content-Type", content_type)
        self.finish(body)


def twin(handler: type) -> type:
    if not issubclass(handler, JsonHandler):
        return handler
    return type(handler.__name__ + "Twin", (Twin, handler, WebHandler), {})


TWIN_ROUTES = [Route(route.path, twin(route.handler), route.methods) for route in ROUTES]
