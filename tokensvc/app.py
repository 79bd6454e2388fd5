"""``make_app``: the route table and the Tornado application settings."""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

import tornado.web

from tokensvc.config import Settings
from tokensvc.handlers import api, clients, meta, pages, token, ws
from tokensvc.oauth.context import OAuthContext
from tokensvc.storage.base import Store

access_log = logging.getLogger("tokensvc.access")

HERE = Path(__file__).parent
REDACTED_PARAMETERS = frozenset({"token", "access_token", "code", "refresh_token", "client_secret",
                                 "code_verifier", "password", "state"})


def redact(uri: str) -> str:
    """``uri`` with the value of every secret-bearing query parameter replaced by ``***``."""
    path, sep, query = uri.partition("?")
    if not sep:
        return uri
    pairs = parse_qsl(query, keep_blank_values=True)
    return path + "?" + urlencode([(key, "***" if key in REDACTED_PARAMETERS else value) for key, value in pairs],
                                  safe="*/:")


def log_request(handler: tornado.web.RequestHandler) -> None:
    """One access-log line per request, query secrets redacted."""
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    if not access_log.isEnabledFor(level):
        return
    request = handler.request
    elapsed_ms = 1000.0 * request.request_time()
    client_id = getattr(handler, "log_client_id", None)
    path = redact(request.uri or "")
    access_log.log(level, "%d %s %s %.2fms%s", status, request.method, path,
                   elapsed_ms, f" client_id={client_id}" if client_id else "",
                   extra={"access": {"status": status, "method": request.method, "path": path,
                                     "ms": round(elapsed_ms, 2), "client_id": client_id,
                                     "remote_ip": request.remote_ip}})


def make_app(config: Settings, store: Store, ctx: OAuthContext | None = None) -> tornado.web.Application:
    ctx = ctx or OAuthContext.from_settings(config, store)
    deps = dict(ctx=ctx, config=config)
    # Tornado tries the rules in order: the busiest endpoints come first.
    routes = [
        (r"/oauth/token/introspect", token.IntrospectHandler, deps),
        (r"/v1/me", api.MeHandler, deps),
        (r"/oauth/token", token.TokenHandler, deps),
        (r"/oauth/token/refresh", token.RefreshHandler, deps),
        (r"/oauth/token/revoke", token.RevokeHandler, deps),
        (r"/oauth/clients/([^/]*)", clients.ClientHandler, deps),
        (r"/oauth/clients", clients.ClientListHandler, deps),
        (r"/oauth/revoke", token.GrantRevokeHandler, deps),
        (r"/oauth/sign-out", token.SignOutHandler, deps),
        (r"/oauth/authorize", pages.AuthorizeHandler, deps),
        (r"/login", pages.LoginHandler, deps),
        (r"/logout", pages.LogoutHandler, deps),
        (r"/", pages.HomeHandler, deps),
        (r"/v1/me/connected-apps", api.ConnectedAppsHandler, deps),
        (r"/v1/me/connected-apps/([^/]*)", api.ConnectedAppHandler, deps),
        (r"/v1/ws", ws.EchoSocket, deps),
        (r"/.well-known/oauth-authorization-server", meta.MetadataHandler, deps),
        (r"/healthz", meta.HealthHandler, deps),
        (r"/readyz", meta.ReadyHandler, deps),
        (r"/openapi.json", meta.OpenAPIHandler, deps),
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
