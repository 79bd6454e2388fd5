"""``make_app``: the route table and the Tornado application settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tornado.web
from tornado.httputil import HTTPServerRequest
from tornado.routing import Router

from tokensvc.config import Settings
from tokensvc.handlers import api, clients, meta, pages, token, ws
from tokensvc.handlers.access_log import log_access
from tokensvc.handlers.json_api import NotFoundHandler
from tokensvc.oauth.context import OAuthContext
from tokensvc.storage.base import Store

HERE = Path(__file__).parent


def log_request(handler: tornado.web.RequestHandler) -> None:
    """The access-log line of a request served by a RequestHandler (JsonHandlers log their own)."""
    log_access(handler.get_status(), handler.request, getattr(handler, "log_client_id", None))


class Application(tornado.web.Application):
    """Tornado's Application, plus one dict lookup for the JSON endpoints with a fixed path.

    Tornado's router tries its rules in order, a regular-expression match and a few calls
    per rule; the busiest endpoints have fixed paths, so they are found by ``request.path``
    first, and every other path goes through the rules as usual.
    """

    def __init__(self, endpoints: dict[str, Router], routes: list, **settings: Any) -> None:
        super().__init__(routes, **settings)
        self.endpoints = endpoints

    def find_handler(self, request: HTTPServerRequest, **kwargs: Any) -> Any:
        endpoint = self.endpoints.get(request.path)
        if endpoint is not None:
            return endpoint.find_handler(request)
        return super().find_handler(request, **kwargs)


def make_app(config: Settings, store: Store, ctx: OAuthContext | None = None) -> Application:
    ctx = ctx or OAuthContext.from_settings(config, store)
    deps = dict(ctx=ctx, config=config)
    # The JSON API is made of Endpoints (handlers.endpoint); the rest are RequestHandlers
    # (handlers.base). Fixed paths first, by the busiest.
    endpoints = {path: endpoint.route(ctx, config) for path, endpoint in [
        ("/oauth/token/introspect", token.IntrospectHandler),
        ("/v1/me", api.MeHandler),
        ("/oauth/token", token.TokenHandler),
        ("/oauth/token/refresh", token.RefreshHandler),
        ("/oauth/token/revoke", token.RevokeHandler),
        ("/oauth/clients", clients.ClientListHandler),
        ("/oauth/revoke", token.GrantRevokeHandler),
        ("/v1/me/connected-apps", api.ConnectedAppsHandler),
        ("/.well-known/oauth-authorization-server", meta.MetadataHandler),
        ("/healthz", meta.HealthHandler),
        ("/readyz", meta.ReadyHandler),
        ("/openapi.json", meta.OpenAPIHandler),
    ]}
    routes = [
        (r"/oauth/clients/([^/]*)", clients.ClientHandler.route(ctx, config)),
        (r"/oauth/sign-out", token.SignOutHandler.route(ctx, config)),
        (r"/oauth/authorize", pages.AuthorizeHandler, deps),
        (r"/login", pages.LoginHandler, deps),
        (r"/logout", pages.LogoutHandler, deps),
        (r"/account", pages.AccountHandler, deps),
        (r"/", pages.HomeHandler, deps),
        (r"/v1/me/connected-apps/([^/]*)", api.ConnectedAppHandler.route(ctx, config)),
        (r"/v1/ws", ws.EchoSocket, deps),
        (r".*", NotFoundHandler.route(ctx, config)),
    ]
    app = Application(
        endpoints,
        routes,
        template_path=str(HERE / "templates"),
        static_path=str(HERE / "static"),
        cookie_secret=config.cookie_secret,
        xsrf_cookies=True,
        xsrf_cookie_kwargs={"httponly": False, "samesite": "Lax", "secure": config.secure_cookies},
        log_function=log_request,
        serve_traceback=False,
        compress_response=False,
    )
    app.ctx = ctx  # type: ignore[attr-defined]
    return app
