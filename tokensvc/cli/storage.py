"""``tokensvc storage status|migrate|finalize``: the MongoDB store's format, as an upgrade
needs it (docs/guide/operations.md, Upgrading; the work itself is ``tokensvc/storage/mongo/upgrade.py``).

They talk to the store of ``--config`` directly, beside the running service (which they never
stop). Progress goes to stderr, one line per batch; the result to stdout (``--json``: one JSON
object). The memory backend keeps nothing across a restart: it has no format, and these
commands say so and do nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from tokensvc.bootstrap import make_store
from tokensvc.cli.admin import CommandError, StoreFactory, load_settings, table
from tokensvc.config import Settings

MEMORY = ("the memory backend keeps nothing across a restart: it stores no format, and upgrading it needs no "
          "migration and no finalize (a restart with the new release is the whole upgrade)")


def _store(settings: Settings, factory: StoreFactory | None) -> Any:
    from tokensvc.storage.mongo import MongoStore

    store = factory(settings) if factory is not None else make_store(settings.storage)
    if not isinstance(store, MongoStore):
        raise CommandError(MEMORY)
    return store


def runner(factory: StoreFactory | None,
           action: Callable[[Any, argparse.Namespace], Awaitable[int]]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        settings = load_settings(args)
        if factory is None and settings.storage.backend == "memory":
            if args.json:
                print(json.dumps({"backend": "memory", "format": None, "message": MEMORY}))
            else:
                print(MEMORY, file=sys.stderr)
            return 0

        async def body() -> int:
            from tokensvc.storage.mongo.upgrade import Refused

            store = _store(settings, factory)
            try:
                return await action(store, args)
            except Refused as exc:
                raise CommandError(str(exc)) from None
            finally:
                await store.close()

        return asyncio.run(body())

    return run


def _progress(name: str, collection: str, rows: int) -> None:
    print(f"{name}: {rows} rows converted (now in {collection})", file=sys.stderr, flush=True)


# -- status --------------------------------------------------------------------------------------


def _status_json(found: Any) -> dict[str, Any]:
    state, history = found.state, found.history
    return {
        "format": state.format, "compatibility": state.compatibility,
        "release": history.release, "reads": [history.oldest, history.newest],
        "migrations": {
            "done": {name: {"doneAt": _when(done.get("done_at")), "rows": done.get("rows")}
                     for name, done in state.migrations.items()},
            "runnable": [{"name": m.name, "rowsLeft": found.left.get(m.name), "summary": m.summary}
                         for m in found.runnable],
            "atFinalize": [{"name": m.name, "rowsLeft": found.left.get(m.name), "summary": m.summary}
                           for m in found.waiting],
            "progress": {name: {"rows": where.get("rows"), "collection": where.get("collection")}
                         for name, where in state.progress.items()},
        },
        "releasesSeen": [{"release": seen.release, "firstSeen": None if seen.since is None else _when(seen.since),
                          "how": seen.how} for seen in found.seen],
        "finalized": [{"compatibility": entry.get("compatibility"), "at": _when(entry.get("at")),
                       "release": entry.get("release")} for entry in state.finalized],
        "running": [{"release": seen.release, "where": seen.where, "writes": seen.writes,
                     "seenAt": _when(seen.seen_at)} for seen in found.running],
        "connections": None if found.connections is None else [
            {"release": seen.release, "client": seen.where} for seen in found.connections],
        "finalizeBlockers": found.blockers,
        "warnings": found.warnings,
    }


def _when(value: Any) -> str:
    """A time as the logs write it (ISO 8601, UTC, to the second)."""
    if not isinstance(value, datetime):
        return "-" if value is None else str(value)
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def _how(seen: Any) -> str:
    """How a release is known to have used the store (opening it: since when)."""
    from tokensvc.storage.mongo import upgrade

    return ", ".join(f"{how} {_when(seen.since)}" if how == upgrade.OPENED else how for how in seen.how)


def _status_text(found: Any) -> str:
    state, history = found.state, found.history
    lines = [
        f"format:         {state.format} (the newest format of a release that opened the store)",
        f"compatibility:  {state.compatibility} (written by every process; every running release must read it)",
        f"this release:   tokensvc {history.release}, reads formats {history.oldest} to {history.newest}",
    ]
    for name, done in state.migrations.items():
        lines.append(f"migration done: {name} ({done.get('rows')} rows, {_when(done.get('done_at'))})")
    for migration in found.runnable:
        lines.append(f"migration due:  {migration.name}, {found.left.get(migration.name)} rows left: "
                     "tokensvc storage migrate (the service also runs it in the background)")
    for migration in found.waiting:
        lines.append(f"at finalize:    {migration.name}: {migration.summary} ({found.left.get(migration.name)} rows)")
    seen = ", ".join(f"{seen.name} ({_how(seen)})" for seen in found.seen)
    lines.append(f"releases seen:  {seen or '-'}")
    for entry in state.finalized:
        lines.append(f"finalized:      to {entry.get('compatibility')} at {_when(entry.get('at'))} by "
                     f"{entry.get('release')}")
    rows = [[f"tokensvc {seen.name}", seen.where, str(seen.writes), _when(seen.seen_at)] for seen in found.running]
    lines += ["", "running processes:", table(rows, ["release", "host:pid", "writes", "last heartbeat"])
              if rows else "  none registered"]
    if found.connections is None:
        lines += ["", "connections: the server does not list them ($currentOp)"]
    else:
        counts: dict[str, set[str]] = {}
        for connection in found.connections:
            counts.setdefault(f"tokensvc {connection.name}", set()).add(connection.where)
        lines += ["", "connected now:"] + ([f"  {name}: {len(where)} connections ({', '.join(sorted(where)[:5])}"
                                            f"{', ...' if len(where) > 5 else ''})"
                                            for name, where in sorted(counts.items())] or ["  none"])
    if state.compatibility < history.newest:
        lines += ["", "finalize: " + ("ready (tokensvc storage finalize)" if not found.blockers
                                      else "not yet:\n  - " + "\n  - ".join(found.blockers))]
    lines += [f"\nWARNING: {warning}" for warning in found.warnings]
    return "\n".join(lines)


async def storage_status(store: Any, args: argparse.Namespace) -> int:
    from tokensvc.storage.mongo import upgrade

    found = await upgrade.status(store, args.previous_release_stopped)
    print(json.dumps(_status_json(found), indent=2) if args.json else _status_text(found))
    return 0


# -- migrate, finalize ---------------------------------------------------------------------------------


def _converted(converted: dict[str, int]) -> str:
    return "; ".join(f"{name}: {rows} rows converted" for name, rows in converted.items())


async def storage_migrate(store: Any, args: argparse.Namespace) -> int:
    from tokensvc.storage.mongo import upgrade

    converted = await upgrade.migrate(store, None if args.json else _progress)
    waiting = store.history.waiting(store.format)
    problems = store.indexes.problems  # what opening the store could not make (indexes.py)
    if args.json:
        print(json.dumps({"converted": converted, "atFinalize": [m.name for m in waiting], "problems": problems}))
    else:
        print(_converted(converted) if converted else "no migration due")
        for migration in waiting:
            print(f"{migration.name} runs at finalize (tokensvc storage finalize): {migration.summary}")
        for problem in problems:
            print(f"WARNING: {problem}", file=sys.stderr)
    return 1 if problems else 0


async def storage_finalize(store: Any, args: argparse.Namespace) -> int:
    from tokensvc.storage.mongo import upgrade

    before, converted = await upgrade.finalize(store, args.previous_release_stopped,
                                               None if args.json else _progress)
    after = store.format.compatibility
    if args.json:
        print(json.dumps({"compatibility": after, "from": before, "converted": converted}))
    elif before == after:
        print(f"already finalized: compatibility {after}" + (f"; {_converted(converted)}" if converted else ""))
    else:
        print(f"finalized: compatibility {before} -> {after}; every process writes format {after}"
              + (f"; {_converted(converted)}" if converted else ""))
    return 0


def add_commands(commands: argparse._SubParsersAction, factory: StoreFactory | None) -> None:
    group = commands.add_parser("storage", help="the MongoDB store's format: status, migrate, finalize",
                                description="The MongoDB store's format, for upgrades (docs/guide/operations.md, "
                                            "Upgrading). The memory backend has none.")
    subs = group.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    for name, help_text, action in (
            ("status", "print the store's format, compatibility version, migrations, and the releases seen "
                       "connected", storage_status),
            ("migrate", "run the migrations the compatibility version allows (resumable; progress on stderr)",
             storage_migrate),
            ("finalize", "raise the compatibility version to this release's format, then migrate: refused while a "
                         "process of an older release is connected or a migration is unfinished; irreversible",
             storage_finalize)):
        sub = subs.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--config", default="config/tokensvc.toml",
                         help="TOML config file naming the store (default: %(default)s)")
        sub.add_argument("--json", action="store_true", help="print JSON for scripts instead of text")
        if name != "migrate":
            sub.add_argument("--previous-release-stopped", action="store_true",
                             help="where the server does not list its connections ($currentOp): you confirm "
                                  "that no process of a release that cannot read the new format runs")
        else:
            sub.set_defaults(previous_release_stopped=False)
        sub.set_defaults(func=runner(factory, action))
