"""``make_app``: the route table and the Tornado application."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import tornado.routing
import tornado.web
from tornado.httputil import HTTPServerRequest

from tokensvc.bootstrap import make_context
from tokensvc.config import Settings
from tokensvc.handlers import admin, clients, feed, me, meta, pages, token, ws
from tokensvc.handlers.edge.exit import Edge
from tokensvc.handlers.edge.json_handler import NotFoundHandler, serve
from tokensvc.handlers.edge.lifecycle import MAX_BODY_BYTES, Lifecycle
from tokensvc.handlers.edge.routes import UNMATCHED, Route
from tokensvc.handlers.edge.web_handler import StaticFiles
from tokensvc.oauth.context import OAuthContext
from tokensvc.storage.base import Store

HERE = Path(__file__).parent

# The one route table: every path the service answers, written as the OpenAPI document writes
# it ({name} is one path segment). JSON routes are JsonHandlers; pages, the socket and static
# files RequestHandlers (handlers/edge/web_handler.py); every one is entered through the request lifecycle.
# tests/test_openapi.py checks that the document describes exactly these routes and methods.
ROUTES: list[Route] = [Route.of(path, handler) for path, handler in (
    ("/oauth/token/introspect", token.IntrospectHandler),
    ("/oauth/token", token.TokenHandler),
    ("/oauth/token/refresh", token.RefreshHandler),
    ("/oauth/token/revoke", token.RevokeHandler),
    ("/oauth/revoke", token.GrantRevokeHandler),
    ("/oauth/sign-out", token.SignOutHandler),
    ("/oauth/revocations", feed.RevocationFeedSocket),
    ("/oauth/clients", clients.ClientListHandler),
    ("/oauth/clients/{client_id}", clients.ClientHandler),
    ("/v1/me", me.MeHandler),
    ("/v1/me/connected-apps", me.ConnectedAppsHandler),
    ("/v1/me/connected-apps/{client_id}", me.ConnectedAppHandler),
    ("/v1/me/sessions", me.SessionsHandler),
    ("/v1/me/sessions/{session_id}", me.SessionHandler),
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
# The admin listener's route table: never routed from the public port.
ADMIN_ROUTES: list[Route] = [Route.of(path, handler) for path, handler in (
    ("/admin", admin.IndexHandler),
    ("/admin/clients", admin.ClientsHandler),
    ("/admin/clients/{client_id}", admin.ClientHandler),
    ("/admin/clients/{client_id}/secret", admin.ClientSecretHandler),
    ("/admin/users", admin.UsersHandler),
    ("/admin/users/{username}", admin.UserHandler),
    ("/admin/users/{username}/password", admin.PasswordHandler),
    ("/admin/users/{username}/sessions", admin.UserSessionsHandler),
    ("/admin/users/{username}/sessions/{session_id}", admin.UserSessionHandler),
    ("/admin/installations", admin.InstallationsHandler),
    ("/admin/installations/{installation_id}", admin.InstallationHandler),
    ("/admin/grants", admin.GrantsHandler),
    ("/admin/grants/{grant_id}", admin.GrantHandler),
    ("/admin/tokens/revoke", admin.TokenRevokeHandler),
    ("/admin/tokens/introspect", admin.TokenIntrospectHandler),
    ("/admin/purge", admin.PurgeHandler),
    ("/admin/plan", admin.PlanHandler),
    ("/openapi.json", admin.AdminOpenAPIHandler),
)]
# The pages' own files (not API resources: the OpenAPI document leaves them out).
STATIC_ROUTES = [Route.of("/static/{path}", StaticFiles), Route.of("/favicon.ico", StaticFiles)]
NOT_FOUND = Route.of(UNMATCHED, NotFoundHandler)
STATIC_PATH = HERE / "static"


class Target(tornado.routing.Router):
    """What the application's routing finds for a route: the request lifecycle, which serves a
    JSON route itself and a ``RequestHandler`` route through Tornado's own delegate."""

    def __init__(self, application: tornado.web.Application, edge: Edge, route: Route) -> None:
        self.application, self.edge, self.route = application, edge, route
        self.json = not issubclass(route.handler, tornado.web.RequestHandler)
        self.kwargs: dict[str, Any] = {"path": str(STATIC_PATH)} if route.handler is StaticFiles else {}

    def find_handler(self, request: HTTPServerRequest, **kwargs: Any) -> Lifecycle:
        path_args = kwargs.get("path_args") or []
        if self.json:
            return Lifecycle(self.edge, self.route, request, path_args, start=serve)
        handler = cast(type[tornado.web.RequestHandler], self.route.handler)
        inner = self.application.get_handler_delegate(request, handler, self.kwargs, path_args)
        return Lifecycle(self.edge, self.route, request, path_args, inner=inner)


class TokenService(tornado.web.Application):
    """Tornado's application over the route table."""

    def __init__(self, edge: Edge, static: bool = True, **settings: Any) -> None:
        self.edge = edge
        routes = [*edge.routes, *STATIC_ROUTES] if static else edge.routes
        rules: list[Any] = [(route.pattern, Target(self, edge, route)) for route in routes]
        rules.append((r".*", Target(self, edge, NOT_FOUND)))
        super().__init__(rules, **settings)


def make_app(config: Settings, store: Store, ctx: OAuthContext | None = None,
             routes: list[Route] = ROUTES) -> TokenService:
    """The service over ``store``; ``routes`` replaces the route table only in the benchmark's
    A/B of the JSON adapter (bench/twin.py)."""
    ctx = ctx or make_context(config, store)
    static = {"static_path": str(STATIC_PATH), "static_url_prefix": "/static/"}
    edge = Edge(ctx, config, routes, HERE / "templates", static, StaticFiles)
    return TokenService(
        edge,
        template_path=str(HERE / "templates"),
        cookie_secret=config.cookie_secret,
        xsrf_cookies=True,  # Tornado calls WebHandler.check_xsrf_cookie: the lifecycle's rule
        log_function=exit_logs,
        serve_traceback=False,
        compress_response=False,
        # A WebSocket message is capped as a body is (Tornado's default is 10 MiB): one larger
        # closes the socket with 1009, before it is read whole.
        websocket_max_message_size=MAX_BODY_BYTES,
    )


def make_admin_app(config: Settings, store: Store, ctx: OAuthContext) -> TokenService:
    """The admin listener's application: the admin API over the same store and context as the
    public one (so it works on the memory backend too), and no page."""
    static = {"static_path": str(STATIC_PATH), "static_url_prefix": "/static/"}
    edge = Edge(ctx, config, ADMIN_ROUTES, HERE / "templates", static, StaticFiles, admin=True)
    return TokenService(edge, static=False, log_function=exit_logs, serve_traceback=False,
                        compress_response=False)


def exit_logs(handler: tornado.web.RequestHandler) -> None:
    """The application's ``log_function``: none of Tornado's own access lines. Every response's
    access line is its exit's (handlers/edge/exit.py)."""
