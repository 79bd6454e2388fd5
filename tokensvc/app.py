"""``make_app``: the route table and the Tornado application."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tornado.web
from tornado.httputil import HTTPServerRequest

from tokensvc.config import Settings
from tokensvc.handlers import api, clients, meta, pages, token, ws
from tokensvc.handlers.json_api import JsonHandler, NotFoundHandler
from tokensvc.handlers.lifecycle import UNMATCHED, Edge, Lifecycle, Route
from tokensvc.handlers.web import StaticFiles, log_request
from tokensvc.bootstrap import make_context
from tokensvc.oauth.context import OAuthContext
from tokensvc.storage.base import Store

HERE = Path(__file__).parent

# The one route table: every path the service answers, written as the OpenAPI document writes
# it ({name} is one path segment). JSON routes are JsonHandlers; pages, the socket and static
# files RequestHandlers (handlers/web.py). tests/test_openapi.py checks that the document
# describes exactly these routes and methods.
ROUTES: list[Route] = [Route.of(path, handler) for path, handler in (
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
)]
STATIC = Route.of("/static/{path}", StaticFiles)  # also /favicon.ico and /robots.txt
NOT_FOUND = Route.of(UNMATCHED, NotFoundHandler)


class TokenService(tornado.web.Application):
    """Tornado's application, with every ``RequestHandler`` route (pages, the socket, static
    files) entered through the request lifecycle, as the JSON routes are."""

    def __init__(self, edge: Edge, routes: list[tuple[Any, ...]], **settings: Any) -> None:
        super().__init__(routes, **settings)
        self.edge = edge
        self.routes = {route.path: route for route in [*ROUTES, STATIC]}

    def get_handler_delegate(self, request: HTTPServerRequest, target_class: type[tornado.web.RequestHandler],
                             target_kwargs: dict[str, Any] | None = None, path_args: list[bytes] | None = None,
                             path_kwargs: dict[str, bytes] | None = None) -> Lifecycle:
        inner = super().get_handler_delegate(request, target_class, target_kwargs, path_args, path_kwargs)
        route = self.routes[(target_kwargs or {})["route"]]
        return Lifecycle(self.edge, route, request, path_args or [], inner=inner)


def make_app(config: Settings, store: Store, ctx: OAuthContext | None = None) -> TokenService:
    ctx = ctx or make_context(config, store)
    static = {"static_path": str(HERE / "static"), "static_url_prefix": "/static/",
              "static_handler_class": StaticFiles}
    edge = Edge(ctx, config, ROUTES, HERE / "templates", static, StaticFiles)
    routes: list[tuple[Any, ...]] = [
        (route.pattern, JsonHandler.target(edge, route)) if issubclass(route.handler, JsonHandler)
        else (route.pattern, route.handler, {"edge": edge, "route": route.path})
        for route in ROUTES
    ]
    routes.append((r".*", JsonHandler.target(edge, NOT_FOUND)))
    return TokenService(
        edge,
        routes,
        static_handler_args={"edge": edge, "route": STATIC.path},
        template_path=str(HERE / "templates"),
        cookie_secret=config.cookie_secret,
        xsrf_cookies=True,  # Tornado calls WebHandler.check_xsrf_cookie: the lifecycle's rule
        log_function=log_request,
        serve_traceback=False,
        compress_response=False,
        **static,
    )
