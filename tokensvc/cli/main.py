"""The ``tokensvc`` command line: ``serve``, ``config check``, ``openapi``; the operator
commands are ``tokensvc/cli/admin.py``'s."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from tokensvc import __version__
from tokensvc import config as config_module
from tokensvc.bootstrap import make_context, make_store
from tokensvc.cli import admin as cli_admin
from tokensvc.cli import storage as cli_storage
from tokensvc.cli.admin import CommandError, StoreFactory, load_settings
from tokensvc.config import ConfigError, Settings
from tokensvc.config.reading import read_file
from tokensvc.identifiers import is_loopback
from tokensvc.storage import StorageError, StoreFault
from tokensvc.telemetry import logs

if TYPE_CHECKING:
    from tornado.httpserver import HTTPServer

log = logging.getLogger("tokensvc")
GENERATED_SECRET_NOTICE = ("generated a random cookie secret: sessions and XSRF tokens end when the process "
                           "restarts; set cookie_secret to keep them")


# -- serve ----------------------------------------------------------------------------

@dataclass(slots=True)
class Listeners:
    """The sockets ``serve`` accepts on: the public port's and the admin listener's (none when
    ``admin.port = 0``)."""

    public: list[socket.socket]
    admin: list[socket.socket]


def bind(settings: Settings) -> Listeners:
    """The listening sockets of the public port and of the admin listener; a fault the
    operator can fix is one line that says what to do."""
    public = _bind(settings.host, settings.port, "--host or TOKENSVC_HOST", "--port or TOKENSVC_PORT")
    if settings.server.unix_socket:
        try:
            public.append(_bind_unix(settings.server.unix_socket, settings.server.unix_socket_mode))
        except CommandError:
            for sock in public:
                sock.close()
            raise
    if not settings.admin.port:
        return Listeners(public, [])
    try:
        admin = _bind(settings.admin.host, settings.admin.port, "admin.host or TOKENSVC_ADMIN_HOST",
                      "admin.port or TOKENSVC_ADMIN_PORT (0: no admin listener)")
    except CommandError:
        for sock in public:
            sock.close()
        raise
    return Listeners(public, admin)


def _bind(host: str, port: int, host_setting: str, port_setting: str) -> list[socket.socket]:
    import errno

    import tornado.netutil

    where = f"{host}:{port}"
    try:
        return tornado.netutil.bind_sockets(port, host)
    except socket.gaierror:
        raise CommandError(f"cannot listen on {host!r}: the host does not resolve; choose another with "
                           f"{host_setting}") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CommandError(f"{where} is already in use; choose another with {port_setting}") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise CommandError(f"cannot listen on {host!r}: not an address of this machine; "
                               f"choose another with {host_setting}") from None
        if exc.errno == errno.EACCES:
            raise CommandError(f"not allowed to listen on {where} (ports below 1024 need privileges); "
                               f"choose another with {port_setting}") from None
        raise CommandError(f"cannot listen on {where}: {exc.strerror or exc}") from None


def _bind_unix(path: str, mode: int) -> socket.socket:
    """The unix socket at ``path`` (a leftover socket file there is replaced), with ``mode``."""
    import tornado.netutil

    try:
        return tornado.netutil.bind_unix_socket(path, mode)
    except ValueError:  # Tornado's: something other than a socket is there
        raise CommandError(f"cannot listen on unix:{path}: a file that is not a socket is there; choose another "
                           "path with server.unix_socket") from None
    except OSError as exc:
        raise CommandError(f"cannot listen on unix:{path}: {exc.strerror or exc}; choose another path with "
                           "server.unix_socket") from None


def banner(settings: Settings, listeners: Listeners) -> str:
    """What ``serve`` prints once it listens: where everything is."""
    local = config_module.listen_url(settings.host, settings.port)
    admin_url = config_module.listen_url(settings.admin.host, settings.admin.port) if listeners.admin else None
    wildcard = config_module.wildcard_of(settings.host)
    return (f"tokensvc is running on {local}"
            + (f" (listening on {wildcard}, port {settings.port})" if wildcard else "") + "\n"
            f"  home page:          {local}/\n"
            f"  authorization:      {settings.auth_url}/oauth/authorize\n"
            f"  token endpoint:     {settings.base_url}/oauth/token\n"
            f"  server metadata:    {settings.base_url}/.well-known/oauth-authorization-server\n"
            f"  registered clients: {settings.base_url}/oauth/clients\n"
            + (f"  admin API:          {admin_url}/admin (tokensvc login --url {admin_url})\n" if admin_url
               else "  admin API:          off (admin.port = 0)\n")
            + "Press Ctrl+C to stop.")


async def serve(settings: Settings, listeners: Listeners, *, show_banner: bool = True) -> None:
    """Run the service on ``listeners`` (see :func:`bind`) until SIGINT/SIGTERM; the banner is
    the supervisor's to print when there are several processes."""
    import tornado.httpserver

    from tokensvc.app import make_admin_app, make_app
    from tokensvc.bootstrap import expire_previous_secrets_periodically, prepare, purge_periodically
    from tokensvc.handlers.edge.lifecycle import READ_HEAD_BYTES
    from tokensvc.oauth import events

    if settings.demo:
        log.warning("DEMO MODE: this configuration is for trying tokensvc out, not for production.")
        if settings.generated_cookie_secret:
            # The secret itself is never logged: it signs every session cookie and XSRF token.
            log.warning("DEMO MODE: %s", GENERATED_SECRET_NOTICE)
    store = make_store(settings.storage, serving=True)
    store.prepared = False
    preparing = asyncio.create_task(prepare(store, settings))
    if settings.storage.backend == "memory":
        await preparing  # nothing to wait for: serve seeded from the first request

    async def upkeep() -> None:  # the store's background work, once it is prepared
        with contextlib.suppress(Exception):  # a failed start-up is reported by preparing
            await preparing
        if store.prepared:
            await store.upkeep()

    upkeeping = asyncio.create_task(upkeep())
    ctx = make_context(settings, store)
    app = make_app(settings, store, ctx)
    # One relay per process: revocations made by the other processes sharing the store
    # reach this process's WebSockets within a second.
    relaying = asyncio.create_task(events.relay(store, ctx.events))
    housekeeping = [asyncio.create_task(purge_periodically(store))] if settings.storage.backend == "memory" else []
    housekeeping.append(asyncio.create_task(expire_previous_secrets_periodically(store)))
    # Bodies are counted by the request lifecycle, which answers 413 (handlers/edge/lifecycle.py);
    # a long target or large header fields get 414 or 431 there too, read up to READ_HEAD_BYTES.
    # The client's address behind proxies is the request lifecycle's (handlers/edge/proxies.py).
    servers = []
    # The admin API answers on its own listener only: the public one has no route to it.
    admin_app = make_admin_app(settings, store, ctx)
    for application, sockets in ((app, listeners.public), (admin_app, listeners.admin)):
        if sockets:
            server = tornado.httpserver.HTTPServer(application,
                                                   idle_connection_timeout=settings.server.idle_timeout,
                                                   body_timeout=settings.server.body_timeout,
                                                   max_header_size=READ_HEAD_BYTES)
            server.add_sockets(sockets)
            servers.append(server)
    local = config_module.listen_url(settings.host, settings.port)
    admin_url = config_module.listen_url(settings.admin.host, settings.admin.port) if listeners.admin else None
    wildcard = config_module.wildcard_of(settings.host)
    if wildcard:
        log.info("tokensvc %s listening on %s, port %d (on this machine: %s; storage: %s)", __version__, wildcard,
                 settings.port, local, settings.storage.backend)
    else:
        log.info("tokensvc %s listening on %s (storage: %s)", __version__, local, settings.storage.backend)
    if settings.server.unix_socket:
        log.info("also listening on unix:%s (mode %#o)", settings.server.unix_socket, settings.server.unix_socket_mode)
    if admin_url:
        log.info("admin API listening on %s", admin_url)
        if not is_loopback(settings.admin.host):
            log.warning("the admin API listens on %s, beyond this machine: keep it behind TLS and a network "
                        "policy that lets only operators reach it", admin_url)
    if show_banner:
        say_banner(settings, listeners)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    preparing.add_done_callback(lambda _: stop.set() if _failed(preparing) else None)
    # The store's format moved past what this release writes (a later release finalized): stop.
    upkeeping.add_done_callback(lambda _: stop.set() if _failed(upkeeping) else None)
    await stop.wait()
    # A graceful stop: no new connection, the requests in flight answered (for at most
    # server.drain_seconds), idle keep-alive connections closed; only then the store.
    stop_accepting(servers)
    # Readers of the revocation feed would hold this process until the end: told to go now
    # (1012), they reconnect to another process.
    ended = ctx.feed.end_all()
    if ended:
        log.info("stopping: %d revocation feed readers told to reconnect elsewhere", ended)
    edges = [app.edge, *([admin_app.edge] if listeners.admin else [])]
    # So are the WebSockets of /v1/ws (1012), which nothing else would close with a frame.
    told = sum(edge.end_sockets() for edge in edges)
    if told:
        log.info("stopping: %d WebSocket%s told to reconnect elsewhere", told, "" if told == 1 else "s")
    try:
        await asyncio.wait_for(asyncio.gather(*(edge.drained() for edge in edges)), settings.server.drain_seconds)
    except TimeoutError:
        log.warning("stopping with %d requests still in flight after %ds", sum(edge.in_flight for edge in edges),
                    settings.server.drain_seconds)
    for server in servers:  # idle keep-alive connections (an open WebSocket is not waited for)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.close_all_connections(), 2)
    preparing.cancel()
    upkeeping.cancel()
    relaying.cancel()
    for task in housekeeping:
        task.cancel()
    await store.close()
    for task in (preparing, upkeeping):
        if _failed(task):
            raise CommandError(str(task.exception()))
    log.info("tokensvc stopped")


def stop_accepting(servers: Sequence[HTTPServer]) -> None:
    """A graceful stop's first step, on each of ``servers`` (Tornado's ``HTTPServer``): no new
    connection, and a request read from now on is its connection's last (``Connection:
    close``). A client keeping its connection alive would otherwise hold the drain for its
    whole length with requests sent one after the other, each one in flight in turn; it
    connects again instead, to another process."""
    for server in servers:
        server.stop()
        server.conn_params.no_keep_alive = True


def _failed(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` (:func:`serve`) on an event loop of its own, as ``asyncio.run`` does, but
    never cancel a call of the MongoDB driver. ``asyncio.run`` cancels every task still running
    when ``main`` ends, and a cancellation delivered inside the driver can leave its lock held
    by no one, with a traceback (storage/mongo/calls.py). The store's close waits for its
    calls; should one still be running after that (a reply the driver still waits for, within
    its socket timeout), the process leaves at once instead, its log written, cancelling
    nothing: with exit code 0, or 1 once it has logged why ``main`` failed."""
    with asyncio.Runner() as runner:
        try:
            runner.run(main)
        except Exception as exc:
            if _driver_calls_running(runner.get_loop()):
                log.error("%s", exc)
                _leave(1)
            raise
        if _driver_calls_running(runner.get_loop()):
            _leave(0)


def _driver_calls_running(loop: asyncio.AbstractEventLoop) -> int:
    """How many calls of the MongoDB driver are still running on ``loop``: none in a process
    that never loaded the MongoDB store (the memory backend does not import the driver)."""
    calls = sys.modules.get("tokensvc.storage.mongo.calls")
    return calls.running(loop) if calls is not None else 0


def _leave(code: int) -> NoReturn:
    """End the process now, its log and output written: no task is cancelled, and none is
    finalized (a driver call's coroutine closed where it waits, as the interpreter's exit would)."""
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    logs.configure(settings.log_format, settings.log_level)
    processes = args.processes
    if processes == 1:
        listeners = bind(settings)
        warn(settings)
        run(serve(settings, listeners))
        return 0
    if processes < 0:
        raise CommandError("--processes: 0 (one per core) or more")
    if settings.storage.backend == "memory":
        raise CommandError("--processes needs the MongoDB backend: the memory backend's state lives in one "
                           "process, so several processes would each see different clients, codes and tokens")
    import tempfile

    from tokensvc.cli.supervisor import STOP_MARGIN, Supervisor
    from tokensvc.telemetry import metrics

    # The cores this process may run on (a container's CPU set, not the host's count).
    processes = processes or len(os.sched_getaffinity(0))
    # Bind before forking so every worker accepts on the same sockets; each then builds its
    # own event loop, store client and application.
    listeners = bind(settings)
    warn(settings)
    # Every process writes its metrics to files in one directory, which a scrape of any of
    # them reads whole (prometheus_client's multiprocess mode).
    directory = os.environ.get(metrics.MULTIPROCESS_ENV) or tempfile.mkdtemp(prefix="tokensvc-metrics-")
    metrics.use_multiprocess_dir(directory)
    say_banner(settings, listeners)

    def work(slot: int) -> int:
        try:
            run(serve(settings, listeners, show_banner=False))
        except (CommandError, StoreFault) as exc:
            return _error(args, str(exc))
        return 0

    supervisor = Supervisor(processes, work, stop_seconds=settings.server.drain_seconds + STOP_MARGIN,
                            died=metrics.process_died, sockets=[*listeners.public, *listeners.admin])
    return supervisor.run()


def warn(settings: Settings) -> None:
    """What ``config check`` warns of, logged once as the service starts (demo mode has lines of
    its own)."""
    for warning in [] if settings.demo else config_module.warnings(settings):
        log.warning("configuration: %s", warning)


def say_banner(settings: Settings, listeners: Listeners) -> None:
    """The banner, on standard output; in the JSON log mode, which writes JSON lines only, one
    log line instead."""
    text = banner(settings, listeners)
    if settings.log_format == "json":
        log.info("%s", "; ".join(" ".join(line.split()) for line in text.splitlines()[:-1]))
    else:
        print(text, flush=True)


def cmd_config_check(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    warnings = config_module.warnings(settings)
    if args.strict and warnings:
        refusal = f"{len(warnings)} warning{'s' if len(warnings) > 1 else ''}, refused by --strict"
        if args.json:  # the lines of a run without --strict, the verdict last: ok false, and why
            for warning in warnings:
                print(json.dumps({"warning": warning}), file=sys.stderr)
            print(json.dumps({"config": args.config, "ok": False, "warnings": len(warnings), "error": refusal}),
                  file=sys.stderr)
            return 1
        for warning in warnings:
            _error(args, f"{args.config}: {warning}")
        raise CommandError(f"{args.config}: {refusal}")
    if args.json:  # every line JSON: the settings on one line, each line of standard error an object
        print(json.dumps(config_module.masked(settings)))
    else:
        for line in _flatten(config_module.masked(settings)):
            print(line)
    for warning in warnings:
        print(json.dumps({"warning": warning}) if args.json else f"tokensvc: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps({"config": args.config, "ok": True, "warnings": len(warnings)}), file=sys.stderr)
    else:
        print(f"{args.config}: OK" + (f" ({len(warnings)} warning{'s' if len(warnings) > 1 else ''})" if warnings
                                       else ""), file=sys.stderr)
    return 0


# Settings whose value is a file mode: shown as TOML writes it (0o660), not as a decimal number.
_MODES = frozenset({"server.unix_socket_mode"})


def _flatten(data: Any, prefix: str = "") -> list[str]:
    if isinstance(data, dict):
        return [line for key, value in data.items() for line in _flatten(value, f"{prefix}{key}.")]
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return [line for i, item in enumerate(data) for line in _flatten(item, f"{prefix[:-1]}[{i}].")]
    if prefix[:-1] in _MODES and isinstance(data, int):
        return [f"{prefix[:-1]} = {data:#o}"]
    return [f"{prefix[:-1]} = {json.dumps(data)}"]


# -- parser ---------------------------------------------------------------------------

def build_parser(store_factory: StoreFactory | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokensvc", description="OAuth 2.0 authorization and token service")
    parser.add_argument("--version", action="version", version=f"tokensvc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve_parser = commands.add_parser("serve", help="run the service", description="Run the service.")
    serve_parser.add_argument("--config", default="config/tokensvc.toml", help="TOML config file")
    serve_parser.add_argument("--host", help="listen address (overrides the config)")
    serve_parser.add_argument("--port", type=int, help="listen port, 1-65535 (overrides the config)")
    serve_parser.add_argument("--log-format", choices=("text", "json"), help="log line format")
    serve_parser.add_argument("--processes", type=int, default=1, metavar="N",
                              help="worker processes sharing the port (0 = one per core); MongoDB backend only")
    serve_parser.set_defaults(func=cmd_serve)

    cli_admin.add_commands(commands, store_factory)
    cli_storage.add_commands(commands, store_factory)

    gate = commands.add_parser("gate", help="answer forward-auth checks (nginx, Traefik, Envoy) for an API",
                               description="Answer the forward-auth checks of nginx auth_request, Traefik's "
                                           "ForwardAuth and Envoy's ext_authz with a resource server's "
                                           "credentials (docs/guide/gate.md).")
    gate.add_argument("--config", required=True, help="the gate's TOML file (deploy/gate/gate.toml is an example)")
    gate.add_argument("--host", help="listen address (overrides the file)")
    gate.add_argument("--port", type=int, help="listen port, 1-65535 (overrides the file)")
    gate.set_defaults(func=cmd_gate)

    config_commands = commands.add_parser("config", help="configuration commands",
                                          description="configuration commands")
    check = config_commands.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND").add_parser(
        "check", help="validate a config and print it with secrets masked",
        description="Validate a config and print the effective settings, every secret masked.")
    check.add_argument("--config", default="config/tokensvc.toml", help="TOML config file (default: %(default)s)")
    check.add_argument("--json", action="store_true", help="print JSON for scripts instead of text")
    check.add_argument("--strict", action="store_true",
                       help="refuse what a production deployment does not want (the warnings), exit 1")
    check.set_defaults(func=cmd_config_check)

    document = commands.add_parser("openapi", help="print the OpenAPI document of every endpoint",
                                   description="Print the OpenAPI 3.1 document the service serves at "
                                               "/openapi.json (with --admin: the admin listener's).")
    document.add_argument("--config", default="config/tokensvc.toml",
                          help="TOML config file whose addresses the document names (default: %(default)s)")
    document.add_argument("--admin", action="store_true", help="the admin API's document instead")
    document.set_defaults(func=cmd_openapi)
    return parser


def cmd_gate(args: argparse.Namespace) -> int:
    from tokensvc import gate
    from tokensvc.gate import server

    try:
        settings = gate.load(args.config, host=args.host, port=args.port)
    except gate.GateConfigError as exc:
        raise ConfigError(*exc.problems) from None
    logs.configure(settings.log_format, settings.log_level)
    try:
        sockets = server.bind(settings)
    except OSError as exc:
        raise CommandError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}; choose another "
                           "with --host and --port") from None
    run(server.serve(settings, sockets))
    return 0


def cmd_openapi(args: argparse.Namespace) -> int:
    from tokensvc.app import ADMIN_ROUTES, ROUTES
    from tokensvc.openapi import document as openapi

    settings = load_settings(args)
    if args.admin:
        url = config_module.listen_url(settings.admin.host, settings.admin.port)
        sys.stdout.write(openapi.render(ADMIN_ROUTES, url, admin=True, kinds=settings.installation_kinds))
    else:
        sys.stdout.write(openapi.render(ROUTES, settings.base_url, auth_url=settings.auth_url,
                                        session_cookie=settings.session_cookie))
    return 0


def _error(args: argparse.Namespace, message: str, code: int = 1) -> int:
    """An error on standard error: one line, or with ``--json`` one JSON object; ``serve`` in
    the JSON log mode writes it as a log line of that mode."""
    if getattr(args, "func", None) is cmd_serve and _log_format(args) == "json":
        print(logs.JsonFormatter().format(logging.makeLogRecord(
            {"name": "tokensvc", "levelno": logging.ERROR, "levelname": "ERROR", "msg": message})), file=sys.stderr,
            flush=True)
    elif getattr(args, "json", False):
        print(json.dumps({"error": message}), file=sys.stderr)
    else:
        print(f"tokensvc: {message}", file=sys.stderr)
    return code


def _log_format(args: argparse.Namespace) -> str:
    """The log format ``serve`` runs (or would have run) with: the flag's, the environment's, the
    file's, even when the configuration as a whole is refused."""
    if getattr(args, "log_format", None):
        return str(args.log_format)
    if os.environ.get("TOKENSVC_LOG_FORMAT"):
        return os.environ["TOKENSVC_LOG_FORMAT"]
    try:  # read as the settings are: a device or a pipe (/dev/zero) is refused, never read
        return str(read_file(args.config).get("log_format", "text"))
    except ConfigError:
        return "text"


def main(argv: Sequence[str] | None = None, *, store_factory: StoreFactory | None = None) -> int:
    """The ``tokensvc`` command. ``store_factory`` replaces the configured store (tests)."""
    parser = build_parser(store_factory)
    args = parser.parse_args(argv)
    if args.func is not cmd_serve:
        logs.configure("text", "warning")
        logging.getLogger("tokensvc.audit").setLevel(logging.INFO)
    try:
        return args.func(args)
    except ConfigError as exc:  # every problem found, one line (or JSON object) each
        for problem in exc.problems:
            _error(args, problem)
        return 1
    except (CommandError, StoreFault) as exc:
        return _error(args, str(exc))
    except StorageError as exc:
        return _error(args, f"the store is not answering: {exc}")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head -1): stop quietly, as a killed pipe does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 128 + signal.SIGPIPE
