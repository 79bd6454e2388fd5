"""The ``tokensvc`` command line: ``serve`` and the operator commands."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence

from tokensvc import __version__, config as config_module, logs
from tokensvc.config import ConfigError, Settings
from tokensvc.storage import StorageError, make_store

log = logging.getLogger("tokensvc")


class CommandError(Exception):
    """A fault the operator made or can fix: one line on stderr, exit 1."""


def load_settings(args: argparse.Namespace) -> Settings:
    settings = config_module.load(args.config)
    if getattr(args, "host", None):
        settings.host = args.host
    if getattr(args, "port", None) is not None:
        settings.port = args.port
    if getattr(args, "log_format", None):
        settings.log_format = args.log_format
    return settings


# -- serve ----------------------------------------------------------------------------

async def serve(settings: Settings) -> None:
    import tornado.httpserver

    from tokensvc.app import make_app
    from tokensvc.bootstrap import prepare

    if settings.demo:
        log.warning("DEMO MODE: this configuration is for trying tokensvc out, not for production.")
        if settings.generated_cookie_secret:
            log.warning("DEMO MODE: generated cookie secret %s (sessions end when the process restarts)",
                        settings.cookie_secret)
    store = make_store(settings.storage)
    preparing = asyncio.create_task(prepare(store, settings))
    if settings.storage.backend == "memory":
        await preparing  # nothing to wait for: serve seeded from the first request
    app = make_app(settings, store)
    # Bodies over 64 KiB are refused with 413 by the handlers; the server's own limit sits
    # above that so that the refusal is a clear 413, not a dropped connection.
    server = tornado.httpserver.HTTPServer(app, xheaders=False, max_body_size=1024 * 1024)
    server.listen(settings.port, settings.host)
    port = settings.port or next(iter(server._sockets.values())).getsockname()[1]
    local = f"http://{settings.host}:{port}"
    log.info("tokensvc %s listening on %s (storage: %s)", __version__, local, settings.storage.backend)
    print(f"tokensvc is running on {local}\n"
          f"  home page:         {local}/\n"
          f"  authorization:     {settings.auth_url}/oauth/authorize\n"
          f"  token endpoint:    {settings.base_url}/oauth/token\n"
          f"  server metadata:   {settings.base_url}/.well-known/oauth-authorization-server\n"
          f"  registered clients: {settings.base_url}/oauth/clients\n"
          "Press Ctrl+C to stop.", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    preparing.cancel()
    server.stop()
    await store.close()
    log.info("tokensvc stopped")


def cmd_serve(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    logs.configure(settings.log_format, settings.log_level)
    asyncio.run(serve(settings))
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    print(json.dumps(config_module.masked(settings), indent=2))
    print(f"{args.config}: OK", file=sys.stderr)
    return 0


# -- parser ---------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokensvc", description="OAuth 2.0 authorization and token service")
    parser.add_argument("--version", action="version", version=f"tokensvc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve_parser = commands.add_parser("serve", help="run the service", description="Run the service.")
    serve_parser.add_argument("--config", default="config/tokensvc.toml", help="TOML config file")
    serve_parser.add_argument("--host", help="listen address (overrides the config)")
    serve_parser.add_argument("--port", type=int, help="listen port (overrides the config; 0 = any free port)")
    serve_parser.add_argument("--log-format", choices=("text", "json"), help="log line format")
    serve_parser.set_defaults(func=cmd_serve)

    config_parser = commands.add_parser("config", help="configuration commands")
    config_commands = config_parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    check = config_commands.add_parser("check", help="validate a config and print it with secrets masked")
    check.add_argument("--config", default="config/tokensvc.toml", help="TOML config file")
    check.set_defaults(func=cmd_config_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, CommandError) as exc:
        print(f"tokensvc: {exc}", file=sys.stderr)
        return 1
    except StorageError as exc:
        print(f"tokensvc: the store is not answering: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
