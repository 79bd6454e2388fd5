"""The ``tokensvc`` command line: ``serve`` and the operator commands."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tokensvc import __version__, admin, logs
from tokensvc import config as config_module
from tokensvc.admin import AdminError
from tokensvc.bootstrap import make_context
from tokensvc.config import ConfigError, Settings
from tokensvc.identifiers import KINDS
from tokensvc.oauth.context import OAuthContext
from tokensvc.records import Client
from tokensvc.storage import StorageError, Store, StoreFault, make_store

log = logging.getLogger("tokensvc")
GENERATED_SECRET_NOTICE = ("generated a random cookie secret: sessions and XSRF tokens end when the process "
                           "restarts; set cookie_secret to keep them")


class CommandError(Exception):
    """A fault the operator made or can fix: one line on stderr, exit 1."""


def load_settings(args: argparse.Namespace) -> Settings:
    """The config file, the environment, then the command line's flags, validated together
    (so ``--port 9000`` moves an unset base_url and auth_url with it)."""
    return config_module.load(args.config, overrides={
        "host": getattr(args, "host", None) or None, "port": getattr(args, "port", None),
        "log_format": getattr(args, "log_format", None)})


# -- serve ----------------------------------------------------------------------------

def bind(settings: Settings) -> list[socket.socket]:
    """The listening sockets for ``settings.host:port``; a fault the operator can fix is one
    line that says what to do."""
    import errno

    import tornado.netutil

    where = f"{settings.host}:{settings.port}"
    try:
        return tornado.netutil.bind_sockets(settings.port, settings.host)
    except socket.gaierror:
        raise CommandError(f"cannot listen on {settings.host!r}: the host does not resolve; "
                           "choose another with --host or TOKENSVC_HOST") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CommandError(f"{where} is already in use; choose another with --port or TOKENSVC_PORT") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise CommandError(f"cannot listen on {settings.host!r}: not an address of this machine; "
                               "choose another with --host or TOKENSVC_HOST") from None
        if exc.errno == errno.EACCES:
            raise CommandError(f"not allowed to listen on {where} (ports below 1024 need privileges); "
                               "choose another with --port or TOKENSVC_PORT") from None
        raise CommandError(f"cannot listen on {where}: {exc.strerror or exc}") from None


async def serve(settings: Settings, sockets: list[socket.socket]) -> None:
    """Run the service on ``sockets`` (see :func:`bind`) until SIGINT/SIGTERM."""
    import tornado.httpserver
    import tornado.process

    from tokensvc.app import make_app
    from tokensvc.bootstrap import prepare, purge_periodically
    from tokensvc.oauth import events

    if settings.demo:
        log.warning("DEMO MODE: this configuration is for trying tokensvc out, not for production.")
        if settings.generated_cookie_secret:
            # The secret itself is never logged: it signs every session cookie and XSRF token.
            log.warning("DEMO MODE: %s", GENERATED_SECRET_NOTICE)
    store = make_store(settings.storage)
    store.prepared = False
    preparing = asyncio.create_task(prepare(store, settings))
    if settings.storage.backend == "memory":
        await preparing  # nothing to wait for: serve seeded from the first request
    ctx = make_context(settings, store)
    app = make_app(settings, store, ctx)
    # One relay per process: revocations made by the other processes sharing the store
    # reach this process's WebSockets within a second.
    relaying = asyncio.create_task(events.relay(store, ctx.events))
    housekeeping = [asyncio.create_task(purge_periodically(store))] if settings.storage.backend == "memory" else []
    # Bodies are counted by the request lifecycle, which answers 413 (handlers/lifecycle.py).
    # The client's address behind proxies is the request lifecycle's (handlers/proxies.py).
    server = tornado.httpserver.HTTPServer(app,
                                           idle_connection_timeout=settings.server.idle_timeout,
                                           body_timeout=settings.server.body_timeout)
    server.add_sockets(sockets)
    local = config_module.listen_url(settings.host, settings.port)
    log.info("tokensvc %s listening on %s (storage: %s)", __version__, local, settings.storage.backend)
    if tornado.process.task_id() in (None, 0):  # one banner for a group of processes
        print(f"tokensvc is running on {local}\n"
              f"  home page:          {local}/\n"
              f"  authorization:      {settings.auth_url}/oauth/authorize\n"
              f"  token endpoint:     {settings.base_url}/oauth/token\n"
              f"  server metadata:    {settings.base_url}/.well-known/oauth-authorization-server\n"
              f"  registered clients: {settings.base_url}/oauth/clients\n"
              "Press Ctrl+C to stop.", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    preparing.add_done_callback(lambda _: stop.set() if _failed(preparing) else None)
    await stop.wait()
    preparing.cancel()
    relaying.cancel()
    for task in housekeeping:
        task.cancel()
    server.stop()
    await store.close()
    if _failed(preparing):
        raise CommandError(str(preparing.exception()))
    log.info("tokensvc stopped")


def _failed(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None


def cmd_serve(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    logs.configure(settings.log_format, settings.log_level)
    processes = args.processes
    if processes == 1:
        asyncio.run(serve(settings, bind(settings)))
        return 0
    if settings.storage.backend == "memory":
        raise CommandError("--processes needs the MongoDB backend: the memory backend's state lives in one "
                           "process, so several processes would each see different clients, codes and tokens")
    import tempfile

    import tornado.process

    from tokensvc import metrics

    # Bind before forking so every process accepts on the same sockets (tornado's multi-process
    # recipe); each child then builds its own event loop, store client and application.
    sockets = bind(settings)
    # Every process writes its metrics to files in one directory, which a scrape of any of
    # them reads whole (prometheus_client's multiprocess mode).
    directory = os.environ.get(metrics.MULTIPROCESS_ENV) or tempfile.mkdtemp(prefix="tokensvc-metrics-")
    metrics.use_multiprocess_dir(directory)
    tornado.process.fork_processes(processes)
    asyncio.run(serve(settings, sockets))
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    if args.json:
        print(json.dumps(config_module.masked(settings), indent=2))
    else:
        for line in _flatten(config_module.masked(settings)):
            print(line)
    print(f"{args.config}: OK", file=sys.stderr)
    return 0


def _flatten(data: Any, prefix: str = "") -> list[str]:
    if isinstance(data, dict):
        return [line for key, value in data.items() for line in _flatten(value, f"{prefix}{key}.")]
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return [line for i, item in enumerate(data) for line in _flatten(item, f"{prefix[:-1]}[{i}].")]
    return [f"{prefix[:-1]} = {json.dumps(data)}"]


# -- operator commands ---------------------------------------------------------------------

StoreFactory = Callable[[Settings], Store]
MEMORY_STATE = (
    "the memory backend keeps its state inside the running server: clients, users and "
    "installations come from the config file ([[clients]], [[users]], [[installations]]). "
    "Set storage.backend = \"mongodb\" (or TOKENSVC_STORAGE_BACKEND=mongodb) to manage them here.")
MEMORY_PURGES_ITSELF = (
    "the memory backend's store lives inside the running server, which purges its expired codes, "
    "tokens and sessions itself (every few minutes); there is nothing to purge from here. "
    "On MongoDB, TTL indexes remove them and `tokens purge` removes what they have not yet.")


def _store_commands(factory: StoreFactory | None) -> Callable[[argparse.Namespace], int]:
    """Run an async operator command against the configured store."""

    def run(args: argparse.Namespace) -> int:
        settings = load_settings(args)
        if factory is None and settings.storage.backend == "memory":
            raise CommandError(MEMORY_PURGES_ITSELF if args.action is tokens_purge else MEMORY_STATE)
        store = factory(settings) if factory is not None else make_store(settings.storage)
        ctx = make_context(settings, store)
        args.service_name = settings.service_name  # a context word of the password rule

        async def body() -> int:
            try:
                await store.open()
                return await args.action(ctx, args)
            finally:
                await store.close()

        try:
            return asyncio.run(body())
        except AdminError as exc:
            raise CommandError(str(exc)) from None

    return run


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text)


def _client_data(client: Client) -> dict[str, Any]:
    return {"client_id": client.client_id, "name": client.name, "redirect_uris": client.redirect_uris,
            "allowed_scopes": client.scopes, "confidential": client.confidential,
            "first_party": client.first_party, "description": client.description,
            "logo_url": client.logo_url, "allowed_origins": client.allowed_origins or [],
            "created_at": client.created_at.isoformat() if client.created_at else None}


def _text(value: Any) -> str:
    """A value as a person reads it: lists space-separated, yes/no, a dash for nothing."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return " ".join(value) or "-"
    return "-" if value is None else str(value)


def _removed(args: argparse.Namespace, kind: str, name: str, revoked: int) -> int:
    _emit(args, {"removed": name, "families_revoked": revoked},
          f"removed {kind} {name} ({revoked} token families revoked)")
    return 0


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


async def clients_add(ctx: OAuthContext, args: argparse.Namespace) -> int:
    client, secret = await admin.create_client(
        ctx.store, name=args.name, redirect_uris=args.redirect_uri, scopes=args.scope,
        first_party=args.first_party, confidential=args.confidential, description=args.description,
        logo_url=args.logo_url, client_id=args.client_id, allowed_origins=args.allowed_origin)
    data = {**_client_data(client), "client_secret": secret}
    text = f"client_id: {client.client_id}"
    if secret:
        text += f"\nclient_secret: {secret}\n(shown once: store it now; only its hash is kept)"
    _emit(args, data, text)
    return 0


async def clients_list(ctx: OAuthContext, args: argparse.Namespace) -> int:
    clients = await ctx.store.list_clients()
    rows = [[c.client_id, c.name, "confidential" if c.confidential else "public",
             "yes" if c.first_party else "no", " ".join(c.scopes)] for c in clients]
    _emit(args, [_client_data(c) for c in clients],
          _table(rows, ["CLIENT ID", "NAME", "TYPE", "FIRST-PARTY", "SCOPES"]) if rows else "no clients")
    return 0


async def clients_show(ctx: OAuthContext, args: argparse.Namespace) -> int:
    data = _client_data(await admin.get_client(ctx.store, args.client_id))
    _emit(args, data, "\n".join(f"{key}: {_text(value)}" for key, value in data.items()))
    return 0


async def clients_remove(ctx: OAuthContext, args: argparse.Namespace) -> int:
    return _removed(args, "client", args.client_id, await admin.remove_client(ctx, args.client_id))


async def clients_rotate_secret(ctx: OAuthContext, args: argparse.Namespace) -> int:
    secret = await admin.rotate_secret(ctx.store, args.client_id)
    _emit(args, {"client_id": args.client_id, "client_secret": secret},
          f"client_secret: {secret}\n(shown once: the old secret no longer works)")
    return 0


def read_password(args: argparse.Namespace) -> str:
    """From standard input with --password-stdin, else from a prompt (never from a flag)."""
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Repeat password: ") != password:
            raise CommandError("the passwords do not match")
    else:
        raise CommandError("no terminal to ask for a password: use --password-stdin")
    if not password:
        raise CommandError("empty password")
    return password


async def users_add(ctx: OAuthContext, args: argparse.Namespace) -> int:
    user = await admin.create_user(ctx.store, args.username, args.password, admin=args.admin,
                                   service_name=args.service_name)
    _emit(args, {"user_id": user.user_id, "username": user.username, "admin": user.admin},
          f"user_id: {user.user_id}")
    return 0


async def users_list(ctx: OAuthContext, args: argparse.Namespace) -> int:
    users = await ctx.store.list_users()
    _emit(args, [{"user_id": u.user_id, "username": u.username, "admin": u.admin} for u in users],
          _table([[u.username, u.user_id, "yes" if u.admin else "no"] for u in users],
                 ["USERNAME", "USER ID", "ADMIN"]) if users else "no users")
    return 0


async def users_remove(ctx: OAuthContext, args: argparse.Namespace) -> int:
    return _removed(args, "user", args.username, await admin.remove_user(ctx, args.username))


async def users_set_password(ctx: OAuthContext, args: argparse.Namespace) -> int:
    ended = await admin.set_password(ctx, args.username, args.password, keep_grants=args.keep_grants,
                                     service_name=args.service_name)
    _emit(args, {"username": args.username, "password_set": True, **ended},
          f"password of {args.username} changed; {ended['sessions_ended']} web sessions ended, "
          f"{ended['families_revoked']} token families revoked")
    return 0


async def installations_add(ctx: OAuthContext, args: argparse.Namespace) -> int:
    inst = await admin.create_installation(ctx.store, args.installation_id, args.name, args.kind, args.operator)
    _emit(args, {"installation_id": inst.installation_id, "name": inst.name, "kind": inst.kind,
                 "operators": args.operator}, f"installation_id: {inst.installation_id}")
    return 0


async def installations_list(ctx: OAuthContext, args: argparse.Namespace) -> int:
    installations = await ctx.store.list_installations()
    names = {user.user_id: user.username for user in await ctx.store.list_users()}
    data: list[dict[str, Any]] = [{"installation_id": i.installation_id, "name": i.name, "kind": i.kind,
             "operators": [names.get(op, op) for op in i.operators]} for i in installations]
    _emit(args, data, _table([[d["installation_id"], d["name"], d["kind"], ", ".join(d["operators"])] for d in data],
                             ["INSTALLATION ID", "NAME", "KIND", "OPERATORS"]) if data else "no installations")
    return 0


async def installations_remove(ctx: OAuthContext, args: argparse.Namespace) -> int:
    return _removed(args, "installation", args.installation_id,
                    await admin.remove_installation(ctx, args.installation_id))


async def tokens_purge(ctx: OAuthContext, args: argparse.Namespace) -> int:
    counts = await admin.purge(ctx.store)
    _emit(args, counts, "purged {codes} expired codes, {families} expired token families, {sessions} expired sessions"
          .format(**counts))
    return 0


# -- parser ---------------------------------------------------------------------------

def build_parser(store_factory: StoreFactory | None = None) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default="config/tokensvc.toml", help="TOML config file (default: %(default)s)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts instead of text")

    parser = argparse.ArgumentParser(prog="tokensvc", description="OAuth 2.0 authorization and token service")
    parser.add_argument("--version", action="version", version=f"tokensvc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = _store_commands(store_factory)

    serve_parser = commands.add_parser("serve", help="run the service", description="Run the service.")
    serve_parser.add_argument("--config", default="config/tokensvc.toml", help="TOML config file")
    serve_parser.add_argument("--host", help="listen address (overrides the config)")
    serve_parser.add_argument("--port", type=int, help="listen port, 1-65535 (overrides the config)")
    serve_parser.add_argument("--log-format", choices=("text", "json"), help="log line format")
    serve_parser.add_argument("--processes", type=int, default=1, metavar="N",
                              help="worker processes sharing the port (0 = one per core); MongoDB backend only")
    serve_parser.set_defaults(func=cmd_serve)

    def group(name: str, help_text: str) -> argparse._SubParsersAction:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        return sub.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

    def command(subs: argparse._SubParsersAction, name: str, help_text: str, action) -> argparse.ArgumentParser:
        sub = subs.add_parser(name, help=help_text, description=help_text, parents=[common])
        sub.set_defaults(func=run, action=action)
        return sub

    clients = group("clients", "manage OAuth clients (MongoDB backend)")
    add = command(clients, "add", "register a client; prints its id and, once, its secret", clients_add)
    add.add_argument("--name", required=True, help="what the consent and account pages call the app")
    add.add_argument("--redirect-uri", action="append", required=True,
                     help="where the app receives its code: https, http on a loopback host, or a private-use "
                          "scheme (com.example.app:/cb); repeat for several")
    add.add_argument("--scope", action="append", help="an allowed scope; repeat for several (none: read)")
    add.add_argument("--first-party", action="store_true", help="no consent prompt")
    add.add_argument("--confidential", action="store_true", help="give the client a secret")
    add.add_argument("--description", help="one sentence for the consent page")
    add.add_argument("--logo-url", help="an https URL of the app's logo, shown on the consent and account pages")
    add.add_argument("--client-id", help="choose the id, 1-128 of [A-Za-z0-9._~-] (default: a random one)")
    add.add_argument("--allowed-origin", action="append",
                     help="a web origin (https://app.example) whose pages may call the token endpoints and "
                          "the API (CORS), besides a public client's redirect URIs; repeat for several")
    command(clients, "list", "list clients", clients_list)
    for name, help_text, action in (("show", "show one client", clients_show),
                                    ("remove", "remove a client and revoke its tokens", clients_remove),
                                    ("rotate-secret", "give a confidential client a new secret",
                                     clients_rotate_secret)):
        command(clients, name, help_text, action).add_argument("client_id", help="the client's id")

    users = group("users", "manage users (MongoDB backend)")
    for name, help_text, action in (("add", "add a user (password from a prompt or --password-stdin)", users_add),
                                    ("set-password", "change a user's password", users_set_password)):
        sub = command(users, name, help_text, action)
        sub.add_argument("username", help="the user's username")
        sub.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
        if name == "add":
            sub.add_argument("--admin", action="store_true", help="an administrator")
        else:
            sub.add_argument("--keep-grants", action="store_true",
                             help="keep the apps the user connected (their sessions still end)")
    command(users, "list", "list users", users_list)
    command(users, "remove", "remove a user and revoke their tokens", users_remove).add_argument(
        "username", help="the user's username")

    installations = group("installations", "manage node installations (MongoDB backend)")
    add = command(installations, "add", "add a telescope or observatory", installations_add)
    add.add_argument("installation_id", help="the installation's id, 1-128 of [A-Za-z0-9._~-]")
    add.add_argument("--name", required=True, help="what the pages call it (\"Backyard telescope\")")
    add.add_argument("--kind", required=True, choices=KINDS, help="what it is")
    add.add_argument("--operator", action="append", default=[], help="a username; repeat for several")
    command(installations, "list", "list installations", installations_list)
    command(installations, "remove", "remove an installation and revoke its tokens",
            installations_remove).add_argument("installation_id", help="the installation's id")

    tokens = group("tokens", "token housekeeping")
    command(tokens, "purge", "delete expired codes, tokens and sessions; prints the counts", tokens_purge)

    config_commands = group("config", "configuration commands")
    check = config_commands.add_parser("check", help="validate a config and print it with secrets masked",
                                       description="Validate a config and print the effective settings, "
                                                   "every secret masked.", parents=[common])
    check.set_defaults(func=cmd_config_check)

    document = commands.add_parser("openapi", help="print the OpenAPI document of every endpoint",
                                   description="Print the OpenAPI 3.1 document the service serves at /openapi.json.")
    document.add_argument("--config", default="config/tokensvc.toml",
                          help="TOML config file whose base_url the document names (default: %(default)s)")
    document.set_defaults(func=cmd_openapi)
    return parser


def cmd_openapi(args: argparse.Namespace) -> int:
    from tokensvc import openapi
    from tokensvc.app import ROUTES

    sys.stdout.write(openapi.render(ROUTES, load_settings(args).base_url))
    return 0


def _error(args: argparse.Namespace, message: str, code: int = 1) -> int:
    """An error on standard error: one line, or with ``--json`` one JSON object."""
    if getattr(args, "json", False):
        print(json.dumps({"error": message}), file=sys.stderr)
    else:
        print(f"tokensvc: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None, *, store_factory: StoreFactory | None = None) -> int:
    """The ``tokensvc`` command. ``store_factory`` replaces the configured store (tests)."""
    parser = build_parser(store_factory)
    args = parser.parse_args(argv)
    if args.func is not cmd_serve:
        logs.configure("text", "warning")
        logging.getLogger("tokensvc.audit").setLevel(logging.INFO)
    try:
        if getattr(args, "password_stdin", None) is not None:
            args.password = read_password(args)
        return args.func(args)
    except (ConfigError, CommandError, StoreFault) as exc:
        return _error(args, str(exc))
    except StorageError as exc:
        return _error(args, f"the store is not answering: {exc}")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head -1): stop quietly, as a killed pipe does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 128 + signal.SIGPIPE
