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
from tokensvc.handlers.json_api import JsonHandler, NotFoundHandler
from tokensvc.handlers.page import TooLargePage
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
    ("/oauth/authorize", pages.AuthorizeHandler),
    ("/login", pages.LoginHandler),
    ("/logout", pages.LogoutHandler),
    ("/account", pages.AccountHandler),
    ("/", pages.HomeHandler),
]


def pattern(path: str) -> str:
    """The route's regular expression: each ``{name}`` matches one path segment."""
    return re.sub(r"\{[^}]+\}", "([^/]*)", path) + "$"


def log_request(handler: tornado.web.RequestHandler) -> None:
    """The access-log line of a request served by a RequestHandler (JsonHandlers log their own)."""
    log_access(handler.get_status(), handler.request, getattr(handler, "log_client_id", None))


class TokenService(tornado.web.Application):
    """The application: Tornado's, with the body limit in front of every RequestHandler route
    (pages, the socket, static files); a body over it gets :class:`TooLargePage`'s 413.
    JsonHandlers count their bodies themselves."""

    def __init__(self, routes: list[tuple[Any, ...]], page_kwargs: dict[str, Any], **settings: Any) -> None:
        super().__init__(routes, **settings)
        self.page_kwargs = page_kwargs

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
        (pattern(path), handler.route(ctx, config)) if issubclass(handler, JsonHandler)
        else (pattern(path), handler, deps)
        for path, handler in ROUTES
    ]
    routes.append((r".*", NotFoundHandler.route(ctx, config)))
    return TokenService(
        routes,
        deps,
        template_path=str(HERE / "templates"),
        static_path=str(HERE / "static"),
        cookie_secret=config.cookie_secret,
        xsrf_cookies=True,  # pages: tornado calls PageHandler.check_xsrf_cookie (handlers/xsrf.py)
        log_function=log_request,
        serve_traceback=False,
        compress_response=False,
    )
