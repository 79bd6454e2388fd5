"""``make_app``: the route table and the Tornado application settings."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any

import tornado.web
from tokensvc.config import Settings
from tokensvc.handlers import api, clients, meta, pages, token, ws
from tokensvc.handlers.access_log import log_access
from tokensvc.handlers.body_limit import LimitedBody
from tokensvc.handlers.json_api import UNMATCHED, JsonHandler, NotFoundHandler
from tokensvc.handlers.page import TooLargePage
from tokensvc.logs import REQUEST_ID
from tokensvc.oauth.context import OAuthContext
from tokensvc.storage.base import Store

HERE = Path(__file__).parent

# The one route table: every path the service answers, written as the OpenAPI document writes
# it ({name} is one path segment). JSON routes are JsonHandlers, pages PageHandlers, the socket
# a WebSocketHandler. tests/test_openapi.py checks that the document describes exactly these.
ROUTES: list[tuple[str, type]] = [
    ("/oauth/token/introspect", token.IntrospectHandler),
    ("/oauth/token", token.TokenHandler),
    ("/oauth/token/refresh", token.RefreshHandler),
    ("/oauth/token/revoke", token.RevokeHandler),
    ("/oauth/revoke", token.GrantRevokeHandler),
    ("/oauth/sign-out", token.SignOutHandler),
    ("/oauth/clients", clients.ClientListHandler),
    ("/oauth/clients/{client_id}", clients.ClientHandler),
    ("/v1/me", api.MeHandler),
    ("/v1/me/connected-apps", api.ConnectedAppsHandler),
    ("/v1/me/connected-apps/{client_id}", api.ConnectedAppHandler),
    ("/v1/ws", ws.EchoSocket),
    ("/.well-known/oauth-authorization-server", meta.MetadataHandler),
    ("/healthz", meta.HealthHandler),
    ("/readyz", meta.ReadyHandler),
    ("/openapi.json", meta.OpenAPIHandler),
    ("/metrics", meta.MetricsHandler),
    ("/oauth/authorize", pages.AuthorizeHandler),
    ("/login", pages.LoginHandler),
    ("/logout", pages.LogoutHandler),
    ("/account", pages.AccountHandler),
    ("/", pages.HomeHandler),
]


def pattern(path: str) -> str:
    """The route's regular expression: each ``{name}`` matches one path segment."""
    return re.sub(r"\{[^}]+\}", "([^/]*)", path) + "$"


STATIC_ROUTE = "/static/{path}"
TOO_LARGE_ROUTE = "(body too large)"


def log_request(handler: tornado.web.RequestHandler) -> None:
    """The access line and the request metrics of a request served by a RequestHandler
    (JsonHandlers do their own)."""
    status, request = handler.get_status(), handler.request
    log_access(status, request, getattr(handler, "log_client_id", None), getattr(handler, "log_error", None))
    route = STATIC_ROUTE if isinstance(handler, StaticFiles) else getattr(handler, "route", UNMATCHED)
    handler.application.metrics.request(route, request.method or "", status, request.request_time())


class StaticFiles(tornado.web.StaticFileHandler):
    """``/static/...``: Tornado's static files, with the request id every response carries."""

    def set_default_headers(self) -> None:
        self.set_header("X-Request-ID", REQUEST_ID.get() or "")


class TokenService(tornado.web.Application):
    """The application: Tornado's, with the body limit in front of every RequestHandler route
    (pages, the socket, static files); a body over it gets :class:`TooLargePage`'s 413.
    JsonHandlers count their bodies themselves."""

    def __init__(self, routes: list[tuple[Any, ...]], ctx: OAuthContext, page_kwargs: dict[str, Any],
                 **settings: Any) -> None:
        super().__init__(routes, **settings)
        self.metrics = ctx.metrics
        self.page_kwargs = {**page_kwargs, "route": TOO_LARGE_ROUTE}

    def get_handler_delegate(self, request: Any, target_class: type[tornado.web.RequestHandler],
                             target_kwargs: dict[str, Any] | None = None, path_args: list[bytes] | None = None,
                             path_kwargs: dict[str, bytes] | None = None) -> LimitedBody:
        inner = super().get_handler_delegate(request, target_class, target_kwargs, path_args, path_kwargs)
        refusal = partial(super().get_handler_delegate, request, TooLargePage, self.page_kwargs)
        return LimitedBody(request, inner, refusal)


def make_app(config: Settings, store: Store, ctx: OAuthContext | None = None) -> TokenService:
    ctx = ctx or OAuthContext.from_settings(config, store)
    deps = dict(ctx=ctx, config=config)
    routes: list[tuple[Any, ...]] = [
        (pattern(path), handler.target(ctx, config, path)) if issubclass(handler, JsonHandler)
        else (pattern(path), handler, {**deps, "route": path})
        for path, handler in ROUTES
    ]
    routes.append((r".*", NotFoundHandler.target(ctx, config)))
    return TokenService(
        routes,
        ctx,
        deps,
        static_handler_class=StaticFiles,
        template_path=str(HERE / "templates"),
        static_path=str(HERE / "static"),
        cookie_secret=config.cookie_secret,
        xsrf_cookies=True,  # pages: tornado calls PageHandler.check_xsrf_cookie (handlers/xsrf.py)
        log_function=log_request,
        serve_traceback=False,
        compress_response=False,
    )
