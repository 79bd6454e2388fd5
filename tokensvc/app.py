"""``make_app``: the route table and the Tornado application settings."""

from __future__ import annotations

from pathlib import Path

import tornado.web

from tokensvc.config import Settings
from tokensvc.handlers import api, clients, meta, pages, token, ws
from tokensvc.handlers.common import log_access
from tokensvc.oauth.context import OAuthContext
from tokensvc.storage.base import Store

HERE = Path(__file__).parent


def log_request(handler: tornado.web.RequestHandler) -> None:
    """The access-log line of a request served by a RequestHandler (Endpoints log their own)."""
    log_access(handler.get_status(), handler.request, getattr(handler, "log_client_id", None))


def make_app(config: Settings, store: Store, ctx: OAuthContext | None = None) -> tornado.web.Application:
    ctx = ctx or OAuthContext.from_settings(config, store)
    deps = dict(ctx=ctx, config=config)
    # Tornado tries the rules in order: the busiest endpoints come first. The JSON API is made
    # of Endpoints (handlers.endpoint); the rest are RequestHandlers (handlers.base).
    routes = [
        (r"/oauth/token/introspect", token.IntrospectHandler.route(ctx, config)),
        (r"/v1/me", api.MeHandler.route(ctx, config)),
        (r"/oauth/token", token.TokenHandler.route(ctx, config)),
        (r"/oauth/token/refresh", token.RefreshHandler.route(ctx, config)),
        (r"/oauth/token/revoke", token.RevokeHandler.route(ctx, config)),
        (r"/oauth/clients/([^/]*)", clients.ClientHandler.route(ctx, config)),
        (r"/oauth/clients", clients.ClientListHandler.route(ctx, config)),
        (r"/oauth/revoke", token.GrantRevokeHandler.route(ctx, config)),
        (r"/oauth/sign-out", token.SignOutHandler, deps),
        (r"/oauth/authorize", pages.AuthorizeHandler, deps),
        (r"/login", pages.LoginHandler, deps),
        (r"/logout", pages.LogoutHandler, deps),
        (r"/", pages.HomeHandler, deps),
        (r"/v1/me/connected-apps", api.ConnectedAppsHandler.route(ctx, config)),
        (r"/v1/me/connected-apps/([^/]*)", api.ConnectedAppHandler, deps),
        (r"/v1/ws", ws.EchoSocket, deps),
        (r"/.well-known/oauth-authorization-server", meta.MetadataHandler.route(ctx, config)),
        (r"/healthz", meta.HealthHandler.route(ctx, config)),
        (r"/readyz", meta.ReadyHandler.route(ctx, config)),
        (r"/openapi.json", meta.OpenAPIHandler.route(ctx, config)),
    ]
    app = tornado.web.Application(
        routes,
        default_handler_class=meta.NotFoundHandler,
        default_handler_args=deps,
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
