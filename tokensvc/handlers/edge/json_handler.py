"""The JSON adapter: every JSON route is a :class:`JsonHandler`, served straight from
Tornado's HTTP layer by the request lifecycle (:mod:`.lifecycle`).

A ``JsonHandler`` is a plain object made for one request: the lifecycle has counted its body
and checked its method; the handler parses the body, runs the route's method and writes one
response through the response writer (:mod:`.response_writer`). Routing, connection handling
and keep-alive stay Tornado's; the answer leaves through the request's exit (:mod:`.exit`).

Why not ``RequestHandler``: its per-request machinery (output transforms, flush and finish
futures, per-header validation, a Task per request) costs more than the OAuth work of a token
request; docs/performance.md has the A/B.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from http.cookies import SimpleCookie
from typing import Any, ClassVar, cast
from urllib.parse import quote

import tornado.httputil
from marshmallow import Schema

from tokensvc.errors import NotFound, ValidationFailed
from tokensvc.handlers.edge import cors
from tokensvc.handlers.edge.exit import Exit, dumps, log_failure
from tokensvc.handlers.edge.guards import check_xsrf
from tokensvc.handlers.edge.headers import JSON_HEADERS
from tokensvc.handlers.edge.inputs import JSON, RequestInput
from tokensvc.handlers.edge.lifecycle import MAX_BODY_BYTES
from tokensvc.handlers.edge.routes import handler_method
from tokensvc.schemas import load


class JsonHandler(RequestInput):
    """One request to a JSON route. Subclasses define ``async def get/post/delete``.

    Path groups of the route arrive as the method's arguments, decoded as UTF-8.
    """

    default_headers: ClassVar[dict[str, str]] = JSON_HEADERS
    output: ClassVar[str] = JSON
    max_body: ClassVar[int | None] = MAX_BODY_BYTES
    reads_session: ClassVar[bool] = True
    path_schema: ClassVar[Schema | None] = None  # what the path's {name} segments may be (422 otherwise)

    def __init__(self, way_out: Exit) -> None:
        self.exit, self.edge, self.route, self.request = way_out, way_out.edge, way_out.route, way_out.request
        self.ctx, self.config = self.edge.ctx, self.edge.config
        way_out.handler = self
        self.log_client_id: str | None = None
        self.cookies: SimpleCookie | None = None  # cookies this response sets or clears
        self.cross_origin: dict[str, str] | None = None  # the CORS headers of every answer
        self.answered = False

    async def serve(self, path_args: list[bytes]) -> None:
        try:
            method = self.request.method or ""
            allowed = await self._cross_origin() if self.cors else None
            if self.cors and method == "OPTIONS":
                self._path_arguments(path_args)
                self.send(204, b"", None, cors.preflight(allowed, self.route.methods) if allowed else None)
                return
            if self.request.body:
                self._parse_body()
            check_xsrf(self)
            await getattr(self, handler_method(method))(*self._path_arguments(path_args))
            if not self.answered:
                raise RuntimeError(f"{type(self).__name__}.{method.lower()} sent no response")
        except Exception as exc:  # every failure becomes a response in the documented shape
            self.send_failure(exc)

    async def _cross_origin(self) -> str | None:
        """Set the CORS headers of this request's answers; the request's origin if it is an
        allowed one."""
        origin = self.request.headers.get("Origin")
        allowed = origin is not None and await self.ctx.origins.allows(self.ctx.store, origin)
        self.cross_origin = cors.allowed(origin) if allowed and origin else cors.VARY
        return origin if allowed else None

    def _parse_body(self) -> None:
        request = self.request
        try:
            tornado.httputil.parse_body_arguments(request.headers.get("Content-Type", ""), request.body,
                                                  request.body_arguments, request.files, request.headers)
        except tornado.httputil.HTTPInputError as exc:
            raise self.unparseable_body(str(exc)) from None

    def unparseable_body(self, reason: str) -> Exception:
        """The answer to a body that cannot be parsed as its ``Content-Type`` says: a
        validation fault of the body (the token endpoints answer as OAuth does)."""
        return ValidationFailed.one(["body"], f"The body could not be parsed: {reason}", "body_parsing")

    def _path_arguments(self, path_args: list[bytes]) -> list[str]:
        """The path's ``{name}`` segments as text, checked by the route's ``path_schema`` (an
        empty one is missing): every method and the preflight see only a valid path."""
        if not path_args:
            return []
        decoded = {}
        for name, arg in zip(self.route.parameters, path_args, strict=True):
            try:
                decoded[name] = arg.decode("utf-8")
            except UnicodeDecodeError:
                raise ValidationFailed.one(["path", name], "Input should be a valid string: not UTF-8",
                                           "string_unicode", quote(arg, safe="")) from None
        if self.path_schema is not None:
            load(self.path_schema, {name: value for name, value in decoded.items() if value}, "path")
        return list(decoded.values())

    # -- answering ----------------------------------------------------------------------

    def send_failure(self, exc: Exception) -> None:
        log_failure(self.request, exc, self.edge.metrics)
        status, base, extra, body = self.exit.render(exc)
        self.send(status, body, None, extra, base)

    def send_json(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.send(status, dumps(body).encode("utf-8"), "application/json", headers)

    def send(self, status: int, body: bytes, content_type: str | None, extra: Mapping[str, str] | None = None,
             base: Mapping[str, str] | None = None) -> None:
        """Write the whole response (once; later calls are ignored): the route's headers (or
        ``base``), then ``extra``."""
        if self.answered:
            return
        self.answered = True
        headers = dict(extra) if extra else {}
        if self.cross_origin:
            headers.update(self.cross_origin)
        if content_type:
            headers["Content-Type"] = content_type
        cookies = [morsel.OutputString() for morsel in self.cookies.values()] if self.cookies else ()
        self.exit.send(status, self.default_headers if base is None else base, headers, body, cookies)

    def clear_cookie(self, name: str) -> None:
        """Tell the browser to drop cookie ``name`` (path ``/``)."""
        if self.cookies is None:
            self.cookies = SimpleCookie()
        self.cookies[name] = ""
        self.cookies[name].update({"path": "/", "max-age": "0", "expires": "Thu, 01 Jan 1970 00:00:00 GMT"})
        if self.config.secure_cookies:  # a browser ignores a __Host- cookie's clearing without it
            self.cookies[name]["secure"] = True


class NotFoundHandler(JsonHandler):
    """Every path no route matches: 404 ``{"detail"}``, whatever the method."""

    async def get(self, *_: str) -> None:
        raise NotFound(f"No resource at {self.request.path}")

    post = put = patch = delete = options = get


def serve(way_out: Exit, path_args: list[bytes]) -> None:
    """Serve a JSON route's request (the lifecycle's ``start``), in an asyncio Task of its own."""
    handler = cast(type[JsonHandler], way_out.route.handler)(way_out)
    task = asyncio.get_running_loop().create_task(handler.serve(path_args))
    _serving.add(task)  # held until it is done, as asyncio asks of a task nobody awaits
    task.add_done_callback(_serving.discard)


_serving: set[asyncio.Task[None]] = set()
