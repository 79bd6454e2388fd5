"""The operator commands of ``tokensvc``: clients, users, installations, grants, sessions,
tokens, ``apply`` and ``login``.

Each runs against a running service's admin API (``--url`` or ``TOKENSVC_ADMIN_URL``, with a
token from ``tokensvc login``, ``--token`` or ``--refresh-token``), on any backend; or, without
``--url``, straight against the store of a stopped service on MongoDB (``--config``). Both paths
call the same operations (``tokensvc/admin/operator.py``) and print the same JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import getpass
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tokensvc import config as config_module
from tokensvc.admin import provisioning
from tokensvc.admin.actions import AdminError, Missing
from tokensvc.admin.operator import Json, Operations, Operator, RemoteOperator, Unreachable
from tokensvc.bootstrap import make_context, make_store
from tokensvc.cli import login as cli_login
from tokensvc.config import ConfigError, Settings
from tokensvc.config.reading import read_file
from tokensvc.errors import ValidationFailed
from tokensvc.identifiers import secret_problem
from tokensvc.oauth import hashing
from tokensvc.records import CLIENT_KIND, CLIENT_KINDS, MAX_KEEP_PREVIOUS_SECONDS
from tokensvc.storage import StorageError, Store

StoreFactory = Callable[[Settings], Store]
Action = Callable[[Operations, argparse.Namespace], Awaitable[int]]


def memory_state(settings: Settings) -> str:
    """Why a command without --url cannot manage the memory backend, and what to do instead."""
    url = config_module.listen_url(settings.admin.host, settings.admin.port)
    return ("the memory backend keeps its state inside the running server: its clients, users and installations "
            "come from the config file ([[clients]], [[users]], [[installations]]) or, while it runs, from its "
            f"admin API: tokensvc login --url {url}, then the same command with --url {url}")



MEMORY_PURGES_ITSELF = (
    "the memory backend's store lives inside the running server, which purges its expired codes, "
    "tokens and sessions itself (every few minutes); there is nothing to purge from here. "
    "On MongoDB, TTL indexes remove them and `tokens purge` removes what they have not yet.")


class CommandError(Exception):
    """A fault the operator made or can fix: one line on stderr, exit 1."""


def load_settings(args: argparse.Namespace) -> Settings:
    """The config file, the environment, then the command line's flags, validated together
    (so ``--port 9000`` moves an unset base_url and auth_url with it)."""
    return config_module.load(args.config, overrides={
        "host": getattr(args, "host", None) or None, "port": getattr(args, "port", None),
        "log_format": getattr(args, "log_format", None)})


@asynccontextmanager
async def operations_for(args: argparse.Namespace, factory: StoreFactory | None) -> AsyncIterator[Operations]:
    """The admin API of a running service (``--url``), or the store of a stopped one."""
    url = cli_login.admin_url(args)
    if url:
        async with cli_login.access_token(args, url) as token:  # the token's file stays locked meanwhile
            yield RemoteOperator(url, token)
        return
    settings = load_settings(args)
    if factory is None and settings.storage.backend == "memory":
        raise CommandError(MEMORY_PURGES_ITSELF if args.action is tokens_purge else memory_state(settings))
    store = factory(settings) if factory is not None else make_store(settings.storage)
    try:
        await store.open()
        yield Operator(make_context(settings, store), settings)
    finally:
        await store.close()


def runner(factory: StoreFactory | None) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        async def body() -> int:
            async with operations_for(args, factory) as operations:
                return await args.action(operations, args)

        try:
            return asyncio.run(body())
        except (AdminError, ValidationFailed, cli_login.LoginError, Unreachable) as exc:
            raise CommandError(_reason(exc)) from None

    return run


def _reason(exc: Exception) -> str:
    """An operation's failure in one line: a refused body names each field at fault."""
    if isinstance(exc, ValidationFailed):
        return "; ".join(".".join(str(part) for part in item.get("loc", [])[1:]) + f": {item.get('msg')}"
                         if len(item.get("loc", [])) > 1 else str(item.get("msg")) for item in exc.detail)
    return str(exc)


# -- output ------------------------------------------------------------------------------------


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text)


def text_of(value: Any) -> str:
    """A value as a person reads it: lists space-separated, yes/no, a dash for nothing."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return " ".join(str(item) for item in value) or "-"
    return "-" if value is None else str(value)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


def _snake(name: str) -> str:
    """An API field's name as the config file and a person write it (firstParty: first_party)."""
    return re.sub("([A-Z])", lambda m: "_" + m[1].lower(), name)


def _camel(name: str) -> str:
    return re.sub("_([a-z0-9])", lambda m: m[1].upper(), name)


def record(data: Json) -> str:
    """One ``key: value`` line per field, the keys as a person reads them (first_party)."""
    return "\n".join(f"{_snake(key)}: {text_of(value)}" for key, value in data.items() if key != "created")


async def every(listing: Callable[..., Awaitable[Json]]) -> list[Json]:
    """Every item of a paged listing."""
    items: list[Json] = []
    cursor = None
    while True:
        page = await listing(cursor=cursor)
        items += page["items"]
        cursor = page.get("next")
        if not cursor:
            return items


# -- clients -------------------------------------------------------------------------------------


def client_body(args: argparse.Namespace) -> Json:
    body = {"name": args.name, "redirectUris": args.redirect_uri, "allowedScopes": args.scope,
            "firstParty": args.first_party, "confidential": args.confidential, "description": args.description,
            "logoUrl": args.logo_url, "allowedOrigins": args.allowed_origin, "kind": args.kind,
            "resources": args.resource}
    if args.client_id:
        body["clientId"] = args.client_id
    return {key: value for key, value in body.items() if value is not None}


async def clients_add(op: Operations, args: argparse.Namespace) -> int:
    client = await op.create_client(client_body(args))
    text = f"client_id: {client['clientId']}"
    if client.get("clientSecret"):
        text += f"\nclient_secret: {client['clientSecret']}\n(shown once: store it now; only its hash is kept)"
    emit(args, client, text)
    return 0


async def clients_list(op: Operations, args: argparse.Namespace) -> int:
    clients = await every(op.list_clients)
    rows = [[c["clientId"], c["name"], "confidential" if c["confidential"] else "public",
             text_of(c["firstParty"]), " ".join(c["allowedScopes"])] for c in clients]
    emit(args, clients, table(rows, ["CLIENT ID", "NAME", "TYPE", "FIRST-PARTY", "SCOPES"]) if rows else "no clients")
    return 0


async def clients_show(op: Operations, args: argparse.Namespace) -> int:
    client = await op.get_client(args.client_id)
    emit(args, client, record(client))
    return 0


async def clients_remove(op: Operations, args: argparse.Namespace) -> int:
    done = await op.remove_client(args.client_id)
    emit(args, done, f"removed client {args.client_id}; {done['grantsRevoked']} grants revoked")
    return 0


async def clients_rotate_secret(op: Operations, args: argparse.Namespace) -> int:
    done = await op.rotate_secret(args.client_id, {"keepPreviousSeconds": args.keep_previous})
    until = done.get("previousSecretExpiresAt")
    old = f"the old secret works until {until}" if until else "the old secret no longer works"
    emit(args, done, f"client_secret: {done['clientSecret']}\n(shown once: {old})")
    return 0


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> int:
    """Seconds from ``90``, ``90s``, ``15m``, ``12h`` or ``7d``."""
    number, unit = (text[:-1], text[-1]) if text[-1:] in DURATION_UNITS else (text, "s")
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"not a duration (90s, 15m, 12h, 7d): {text!r}")
    return int(number) * DURATION_UNITS[unit]


def keep_previous(text: str) -> int:
    """``--keep-previous``: a :func:`duration` within the service's bound, refused in the flag's
    terms (not the admin API's field)."""
    seconds = duration(text)
    if seconds > MAX_KEEP_PREVIOUS_SECONDS:
        raise argparse.ArgumentTypeError(f"at most {MAX_KEEP_PREVIOUS_SECONDS // 86400}d "
                                         f"({MAX_KEEP_PREVIOUS_SECONDS} seconds): {text!r}")
    return seconds


# -- users ---------------------------------------------------------------------------------------


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


async def users_add(op: Operations, args: argparse.Namespace) -> int:
    user = await op.create_user({"username": args.username, "password": read_password(args), "admin": args.admin})
    emit(args, user, f"user_id: {user['userId']}")
    return 0


async def users_list(op: Operations, args: argparse.Namespace) -> int:
    users = await every(op.list_users)
    emit(args, users, table([[u["username"], u["userId"], text_of(u["admin"])] for u in users],
                            ["USERNAME", "USER ID", "ADMIN"]) if users else "no users")
    return 0


async def users_remove(op: Operations, args: argparse.Namespace) -> int:
    done = await op.remove_user(args.username)
    emit(args, done, f"removed user {args.username}; {done['familiesRevoked']} token families revoked")
    return 0


async def users_set_password(op: Operations, args: argparse.Namespace) -> int:
    done = await op.set_password(args.username, {"password": read_password(args), "keepGrants": args.keep_grants})
    emit(args, done, f"password of {args.username} changed; {done['sessionsEnded']} web sessions ended, "
                     f"{done['familiesRevoked']} token families revoked")
    return 0


async def users_set_admin(op: Operations, args: argparse.Namespace) -> int:
    user = await op.patch_user(args.username, {"admin": args.admin == "yes"})
    emit(args, user, f"{user['username']} is {'an administrator' if user['admin'] else 'not an administrator'}")
    return 0


# -- installations -------------------------------------------------------------------------------


async def installations_add(op: Operations, args: argparse.Namespace) -> int:
    try:
        await op.get_installation(args.installation_id)
        raise CommandError(f"an installation with id {args.installation_id!r} already exists")
    except Missing:
        pass
    installation, _ = await op.put_installation(args.installation_id, {
        "name": args.name, "kind": args.kind, "operators": args.operator})
    emit(args, installation, f"installation_id: {installation['installationId']}")
    return 0


async def installations_list(op: Operations, args: argparse.Namespace) -> int:
    installations = await every(op.list_installations)
    emit(args, installations,
         table([[i["installationId"], i["name"], i["kind"], ", ".join(i["operators"])] for i in installations],
               ["INSTALLATION ID", "NAME", "KIND", "OPERATORS"]) if installations else "no installations")
    return 0


async def installations_remove(op: Operations, args: argparse.Namespace) -> int:
    done = await op.remove_installation(args.installation_id)
    emit(args, done, f"removed installation {args.installation_id}; {done['familiesRevoked']} token families revoked")
    return 0


# -- grants, sessions, tokens --------------------------------------------------------------------


async def grants_list(op: Operations, args: argparse.Namespace) -> int:
    grants = await every(functools.partial(op.list_grants, args.user, args.client))
    emit(args, grants, table([[g["grantId"], g["clientId"], g["subjectType"], g["subject"], " ".join(g["scopes"])]
                              for g in grants], ["GRANT ID", "CLIENT", "SUBJECT TYPE", "SUBJECT", "SCOPES"])
         if grants else "no grants")
    return 0


async def grants_revoke(op: Operations, args: argparse.Namespace) -> int:
    done = await op.revoke_grant(args.grant_id)
    emit(args, done, f"revoked grant {args.grant_id}; {done['familiesRevoked']} token families revoked")
    return 0


async def sessions_list(op: Operations, args: argparse.Namespace) -> int:
    sessions = await op.list_sessions(args.username)
    emit(args, sessions, table([[s["id"], s["browser"], s["address"] or "-", s["signedInAt"], s["lastSeenAt"] or "-"]
                                for s in sessions], ["SESSION ID", "BROWSER", "ADDRESS", "SIGNED IN", "LAST SEEN"])
         if sessions else "no sessions")
    return 0


async def sessions_end(op: Operations, args: argparse.Namespace) -> int:
    done = await (op.end_session(args.username, args.session_id) if args.session_id else op.end_sessions(args.username))
    emit(args, done, f"{done['ended']} session{'s' if done['ended'] != 1 else ''} of {args.username} ended")
    return 0


async def tokens_revoke(op: Operations, args: argparse.Namespace) -> int:
    token = sys.stdin.readline().strip() if args.token_stdin else args.value
    if not token:
        raise CommandError("give the token: --value=TOKEN, or on standard input with --token-stdin")
    done = await op.revoke_token({"token": token})
    emit(args, done, "revoked" if done["revoked"] else "nothing to revoke: the token was not in force")
    return 0


async def tokens_purge(op: Operations, args: argparse.Namespace) -> int:
    counts = await op.purge()
    text = "purged {codes} expired codes, {families} expired token families, {sessions} expired sessions"
    emit(args, counts, text.format(**counts) + (f"\n({counts['note']})" if counts.get("note") else ""))
    return 0


# -- apply ------------------------------------------------------------------------------------------


class DesiredState:
    """A file of ``tokensvc apply``, read and checked key by key, as the admin API's desired
    state (:mod:`tokensvc.admin.provisioning`): the config file's tables (``[[clients]]``,
    ``[[users]]``, ``[[installations]]``), every key under its API name. A plain
    ``client_secret`` is hashed here: the secret never leaves the command line."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:  # a device or a pipe refused, a byte order mark named, as for --config
            wanted = read_file(path, what="file", option="-f")
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        self.problems = [f"{path}: unknown table [[{table}]] (a file has {', '.join(config_module.TABLES)})"
                         for table in wanted if table not in config_module.TABLES]
        self.entries: dict[str, list[Json]] = {}
        self.keys: dict[tuple[str, int], dict[str, str]] = {}  # the file's key of each API field
        self.ids: dict[tuple[str, int], str] = {}
        for table in provisioning.TABLES:
            if table in wanted and not isinstance(wanted[table], list):
                self.problems.append(f"{path}: [{table}]: expected an array of tables ([[{table}]])")
            elif table in wanted:
                self.entries[table] = [self._entry(table, index, item) for index, item in enumerate(wanted[table])]

    def where(self, table: str | None = None, index: int | None = None) -> str:
        """A problem's place: ``FILE: [[table]] #n (id_key = 'id')``."""
        if table is None:
            return self.path
        if index is None:
            return f"{self.path}: [[{table}]]"
        key = self.ids.get((table, index))
        return (f"{self.path}: [[{table}]] #{index + 1}"
                + (f" ({_snake(provisioning.ID_FIELDS[table])} = {key!r})" if key else ""))

    def _entry(self, table: str, index: int, item: Any) -> Json:
        id_key = _snake(provisioning.ID_FIELDS[table])
        problems = config_module.entry_problems(table, item)
        if isinstance(item, dict):
            if isinstance(item.get(id_key), str):
                self.ids[(table, index)] = item[id_key]
            elif id_key not in item:
                problems.append((id_key, "a value is required (it names what the entry is)"))
            if "client_secret" in item and "client_secret_sha256" in item:
                problems.append(("client_secret", "give client_secret or client_secret_sha256, not both"))
            # The configuration's rule (one length for every secret given by hand): here, where
            # the secret is seen before it is hashed; the service sees only its digest.
            if isinstance(item.get("client_secret"), str) and (problem := secret_problem(item["client_secret"])):
                problems.append(("client_secret", f"expected {problem}"))
        self.problems += [f"{self.where(table, index)}: {key + ': ' if key else ''}{problem}"
                          for key, problem in problems]
        entry: Json = {}
        keys = self.keys[(table, index)] = {}
        for key, value in (item.items() if not problems else ()):
            name = _camel(key)
            if key == "client_secret":
                name, value = "clientSecretSha256", hashing.digest(value)
            elif key == "client_secret_sha256":
                name = "clientSecretSha256"
            entry[name], keys[name] = value, key
        return entry

    def body(self, prune: bool) -> Json:
        return {**self.entries, "prune": prune}

    def index_of(self, step: Json) -> int:
        table = step["kind"] + "s"
        return next((index for (name, index), key in self.ids.items() if name == table and key == step["id"]), -1)

    def entry(self, step: Json) -> Json:
        """The API form of the entry a step carries out, without its id."""
        table = step["kind"] + "s"
        found = self.entries[table][self.index_of(step)]
        return {name: value for name, value in found.items() if name != provisioning.ID_FIELDS[table]}

    def key_of(self, table: str, index: int, api_field: str) -> str:
        """The file's name of an API field (``client_secret`` or ``client_secret_sha256``)."""
        return self.keys.get((table, index), {}).get(api_field) or _snake(api_field)

    def explain(self, detail: list[Json]) -> list[str]:
        """The plan's problems (located as the admin API locates them) in the file's terms."""
        lines = []
        for problem in detail:
            loc = list(problem.get("loc", []))[1:]
            table = loc[0] if loc and loc[0] in provisioning.TABLES else None
            index = loc[1] if table is not None and len(loc) > 1 and isinstance(loc[1], int) else None
            field = loc[2] if index is not None and len(loc) > 2 else None
            key = f": {self.key_of(table, index, str(field))}" if table and index is not None and field else ""
            lines.append(f"{self.where(table, index)}{key}: {problem.get('msg')}")
        return lines


def _plan_lines(steps: list[Json], state: DesiredState) -> list[str]:
    """The plan as an operator reads it: one line per step, the fields it sets below (a
    secret only "changed", never a value)."""
    lines = []
    for step in steps:
        lines.append(f"{step['action']} {step['kind']} {step['id']}")
        index = state.index_of(step)
        for found in step["changes"]:
            key = state.key_of(step["kind"] + "s", index, found["field"])
            if found.get("secret") and step["action"] == "create":
                lines.append(f"    {key}: set")
            elif found.get("secret"):
                # What a new password does (users set-password): whoever knew the old one is out.
                after = " (ends the user's web sessions and revokes their grants)" if step["kind"] == "user" else ""
                lines.append(f"    {key}: changed{after}")
            elif step["action"] == "create":
                lines.append(f"    {key}: {text_of(found['to'])}")
            else:
                lines.append(f"    {key}: {text_of(found['from'])} -> {text_of(found['to'])}")
        if step.get("endsCaller"):
            lines.append("    (applied last: it ends this token's rights)")
    return lines


def _refused(path: str, problems: list[str]) -> str:
    count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
    return "\n".join([f"{path}: {count}; nothing was changed", *problems])


def _summary(steps: list[Json]) -> str:
    count = {action: sum(step["action"] == action for step in steps)
             for action in ("create", "update", "unchanged", "remove")}
    if not count["create"] + count["update"] + count["remove"]:
        return f"nothing to change ({count['unchanged']} unchanged)"
    return (f"plan: {count['create']} to create, {count['update']} to update, {count['unchanged']} unchanged, "
            f"{count['remove']} to remove")


async def _carry_out(op: Operations, step: Json, state: DesiredState) -> None:
    """One step of the plan, through the operation that checks what the plan checked."""
    kind, key, action = step["kind"], step["id"], step["action"]
    if action == "remove":
        remove = {"client": op.remove_client, "user": op.remove_user, "installation": op.remove_installation}[kind]
        await remove(key)
        return
    entry = state.entry(step)
    changed = {found["field"] for found in step["changes"]}
    if kind == "user":
        if action == "create":
            await op.create_user({"username": key, **entry})
            return
        if "admin" in changed:
            await op.patch_user(key, {"admin": entry["admin"]})
        secrets = {name: entry[name] for name in ("password", "passwordHash") if name in changed}
        if secrets:
            await op.set_password(key, secrets)
    elif kind == "client":
        if action == "create":
            await op.put_client(key, entry)
        else:
            await op.patch_client(key, {name: value for name, value in entry.items() if name in changed})
    else:
        current = {} if action == "create" else await op.get_installation(key)
        await op.put_installation(key, {**{name: current[name] for name in ("name", "kind", "operators")
                                           if name in current}, **entry})


async def apply(op: Operations, args: argparse.Namespace) -> int:
    """Make the service hold what a TOML file says (``kubectl apply``, ``terraform plan``): the
    file checked key by key, then the whole plan by the service with the rules of the real
    run, printed (create, update with the fields that change, unchanged, remove); nothing is
    changed unless every step is valid, and with ``--dry-run`` nothing at all. A field the
    file leaves out keeps its value; ``--prune`` removes what a table does not name."""
    state = DesiredState(args.file)
    if state.problems:
        raise CommandError(_refused(args.file, state.problems))
    try:
        steps: list[Json] = (await op.plan(state.body(args.prune)))["steps"]
    except ValidationFailed as invalid:
        raise CommandError(_refused(args.file, state.explain(invalid.detail))) from None
    to_do = [step for step in steps if step["action"] != "unchanged"]
    text = [*_plan_lines(steps, state), _summary(steps)]
    if args.dry_run or not to_do:
        emit(args, {"steps": steps, "dryRun": args.dry_run, "applied": []},
             "\n".join(text + (["(dry run: nothing was changed)"] if args.dry_run and to_do else [])))
        return 0
    if not args.json:
        print("\n".join(text), flush=True)
    done: list[str] = []
    for step in to_do:
        name = f"{step['action']} {step['kind']} {step['id']}"
        try:
            await _carry_out(op, step, state)
        except (AdminError, ValidationFailed, StorageError, cli_login.LoginError, Unreachable) as exc:
            left = [f"{later['action']} {later['kind']} {later['id']}" for later in to_do[len(done) + 1:]]
            raise CommandError(f"apply stopped at {name}: {_reason(exc)}\n"
                               f"  applied before it: {', '.join(done) or 'nothing'}\n"
                               f"  not applied: {', '.join(left) or 'nothing else'}\n"
                               "(apply again once fixed: what was applied is unchanged the second time)") from None
        done.append(name)
    ended = any(step.get("endsCaller") for step in to_do)
    emit(args, {"steps": steps, "dryRun": False, "applied": done}, f"applied: {len(done)} changes"
         + ("\n(this token's rights have ended: sign in again with `tokensvc login`)" if ended else ""))
    return 0


# -- login ------------------------------------------------------------------------------------------


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a port (1 to 65535): {text!r}")
    return int(text)


def cmd_login(args: argparse.Namespace) -> int:
    url = cli_login.admin_url(args)
    if not url:
        raise CommandError("give the admin listener's address: --url http://127.0.0.1:8081 (or TOKENSVC_ADMIN_URL)")

    client_id = args.token_client_id or os.environ.get(cli_login.CLIENT_ID_ENV)
    if args.refresh_token and not client_id:
        raise CommandError(f"--refresh-token FILE keeps a service account's token: give its client with "
                           f"--token-client-id (or {cli_login.CLIENT_ID_ENV})")
    keep_in = Path(args.refresh_token) if args.refresh_token else None

    async def body() -> int:
        read = cli_login.typed_on_stdin if args.confirmation_stdin else cli_login.typed_on_the_terminal
        tokens = await cli_login.login(url, open_browser=not args.no_browser, client_id=client_id, keep_in=keep_in,
                                        port=args.callback_port, read=read)
        who = await RemoteOperator(url, tokens["access_token"]).introspect({"token": tokens["access_token"]})
        emit(args, {"url": url, "username": who.get("username"), "clientId": who.get("client_id"),
                    "scope": who.get("scope")},
             f"signed in to {url} as {who.get('username')}; the refresh token is kept in "
             f"{keep_in or cli_login.credentials_path()}")
        return 0

    try:
        return asyncio.run(body())
    except (AdminError, cli_login.LoginError, Unreachable) as exc:
        raise CommandError(str(exc)) from None


# -- the parser -------------------------------------------------------------------------------------


class Secretive(argparse.ArgumentParser):
    """The parser of a command given secrets (``tokens revoke``): its usage errors never
    repeat an argument's value, since a token given as a plain argument (or as the value of
    the wrong option) must not reach a terminal's scrollback or a log collecting stderr. An
    argument it does not know is counted, not shown; any other message has every value of its
    command line masked (the option names stay, so the message still says what was wrong)."""

    _given: tuple[str, ...] = ()

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._given = tuple(sys.argv[1:] if args is None else args)
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"{len(unknown)} argument{'s' if len(unknown) != 1 else ''} it does not take (not shown: "
                       "it may be a token): give the token with --value=TOKEN or --token-stdin")
        return parsed, unknown

    def error(self, message: str) -> Any:
        options = set(self._option_string_actions)
        for given in self._given:
            value = given.partition("=")[2] if given.startswith("-") and "=" in given else given
            if value and value not in options:
                message = re.sub(rf"(?<![^\s'\"=,]){re.escape(value)}(?![^\s'\"=,])", "***", message)
        return super().error(message)


def add_commands(commands: argparse._SubParsersAction, factory: StoreFactory | None) -> None:
    """The operator commands, with the options every one of them takes."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help=f"a running service's admin listener (or {cli_login.ADMIN_URL_ENV}); "
                                      "without it, the store of --config, for a stopped service on MongoDB")
    common.add_argument("--token", help=f"an admin's access token (or {cli_login.TOKEN_ENV}); without it, the "
                                        "refresh token of `tokensvc login` or of --refresh-token")
    common.add_argument("--refresh-token", metavar="FILE",
                        help="a file holding a first-party client's refresh token of an admin (rewritten as it "
                             f"rotates); with --token-client-id, and {cli_login.CLIENT_SECRET_ENV} for a "
                             "confidential client")
    common.add_argument("--token-client-id", metavar="CLIENT_ID",
                        help=f"the client of --refresh-token (or {cli_login.CLIENT_ID_ENV})")
    common.add_argument("--config", default="config/tokensvc.toml",
                        help="TOML config file of a stopped service (without --url; default: %(default)s)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts instead of text")
    run = runner(factory)

    def group(name: str, help_text: str, parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
              ) -> argparse._SubParsersAction:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        return sub.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND", parser_class=parser_class)

    def command(subs: argparse._SubParsersAction, name: str, help_text: str, action: Action) -> argparse.ArgumentParser:
        sub = subs.add_parser(name, help=help_text, description=help_text, parents=[common])
        sub.set_defaults(func=run, action=action)
        return sub

    clients = group("clients", "manage OAuth clients")
    add = command(clients, "add", "register a client; prints its id and, once, its secret", clients_add)
    add.add_argument("--name", required=True, help="what the consent and account pages call the app")
    add.add_argument("--kind", choices=CLIENT_KINDS, default=CLIENT_KIND,
                     help="client (default); resource-server: an API that introspects tokens and reads the "
                          "revocation feed, nothing else (confidential, no redirect URI or scope)")
    add.add_argument("--redirect-uri", action="append",
                     help="where the app receives its code: https, http on a loopback host (any port), or a "
                          "private-use scheme (com.example.app:/cb); repeat for several (required but for a "
                          "resource server)")
    add.add_argument("--scope", action="append", help="an allowed scope; repeat for several (none: read)")
    add.add_argument("--first-party", action="store_true", help="no consent prompt")
    add.add_argument("--confidential", action="store_true", help="give the client a secret")
    add.add_argument("--description", help="one sentence for the consent page")
    add.add_argument("--logo-url", help="an http(s) URL of the app's logo, or a path this service serves "
                     "(/static/app.svg), shown on the consent and account pages")
    add.add_argument("--client-id", help="choose the id, 1-128 of [A-Za-z0-9._~-] (default: a random one)")
    add.add_argument("--allowed-origin", action="append",
                     help="a web origin (https://app.example) whose pages may call the token endpoints and "
                          "the API (CORS), besides a public client's redirect URIs; repeat for several")
    add.add_argument("--resource", action="append",
                     help="a resource server's API, as tokens name it (RFC 8707: an absolute URI, no "
                          "fragment, https://notes.example); repeat for several")
    command(clients, "list", "list clients", clients_list)
    for name, help_text, action in (("show", "show one client", clients_show),
                                    ("remove", "remove a client at once, then revoke its grants", clients_remove),
                                    ("rotate-secret", "give a confidential client a new secret",
                                     clients_rotate_secret)):
        sub = command(clients, name, help_text, action)
        sub.add_argument("client_id", help="the client's id")
        if name == "rotate-secret":
            sub.add_argument("--keep-previous", metavar="DURATION", type=keep_previous, default=0,
                             help="keep the old secret working this long beside the new one (90s, 15m, 12h, 7d; "
                                  "at most 30d), while every instance of the client takes the new one")

    users = group("users", "manage users")
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
    admin_flag = command(users, "set-admin", "make a user an administrator, or not", users_set_admin)
    admin_flag.add_argument("username", help="the user's username")
    admin_flag.add_argument("admin", choices=("yes", "no"), help="whether the user is an administrator")

    installations = group("installations", "manage node installations")
    add = command(installations, "add", "add a node installation (a telescope, an observatory...)",
                  installations_add)
    add.add_argument("installation_id", help="the installation's id, 1-128 of [A-Za-z0-9._~-]")
    add.add_argument("--name", required=True, help="what the pages call it (\"Backyard telescope\")")
    add.add_argument("--kind", required=True, help="what it is: one of the service's installation_kinds "
                                                    "(by default telescope, observatory)")
    add.add_argument("--operator", action="append", default=[], help="a username; repeat for several")
    command(installations, "list", "list installations", installations_list)
    command(installations, "remove", "remove an installation and revoke its tokens",
            installations_remove).add_argument("installation_id", help="the installation's id")

    grants = group("grants", "see and revoke authorizations")
    listing = command(grants, "list", "the live grants of a user and/or a client", grants_list)
    listing.add_argument("--user", help="a username")
    listing.add_argument("--client", help="a client id")
    command(grants, "revoke", "revoke a grant and every token of it", grants_revoke).add_argument(
        "grant_id", help="the grant's id (grants list)")

    sessions = group("sessions", "see and end users' web sessions")
    command(sessions, "list", "a user's web sessions", sessions_list).add_argument(
        "username", help="the user's username")
    end = command(sessions, "end", "end one web session of a user, or every one", sessions_end)
    end.add_argument("username", help="the user's username")
    end.add_argument("session_id", nargs="?", help="the session's id (sessions list); none: every session")

    tokens = group("tokens", "tokens: revoke one, purge the expired", Secretive)
    revoke = command(tokens, "revoke", "revoke a token by its value (a refresh token takes its family)", tokens_revoke)
    # An option, not an argument: a token may start with "-", which would read as an option.
    given = revoke.add_mutually_exclusive_group()
    given.add_argument("--value", metavar="TOKEN",
                       help="the token, written --value=TOKEN (it may start with -); better, --token-stdin")
    given.add_argument("--token-stdin", action="store_true",
                       help="read the token from standard input (it stays out of the process list)")
    command(tokens, "purge", "delete expired codes, tokens and sessions; prints the counts", tokens_purge)

    applying = commands.add_parser(
        "apply", help="make the service hold what a TOML file says",
        description="Make the service hold the clients, users and installations of a TOML file ([[clients]], "
                    "[[users]], [[installations]], with the config file's keys): the whole file is checked "
                    "first, and the plan printed (create, update with the fields that change, unchanged, "
                    "remove); nothing changes unless all of it is valid. A key left out keeps the value the "
                    "service holds; a second run of the same file changes nothing.", parents=[common])
    applying.add_argument("-f", "--file", required=True, help="the TOML file")
    applying.add_argument("--dry-run", action="store_true",
                          help="print the plan and change nothing; exit 0 only if the real run would succeed")
    applying.add_argument("--prune", action="store_true",
                          help="also remove what a table of the file does not name (a table the file leaves "
                               "out is left alone)")
    applying.set_defaults(func=run, action=apply)

    login = commands.add_parser("login", help="sign in as an administrator for the operator commands",
                                description="Sign in to a running service as an administrator, in a browser "
                                            "(the authorization-code flow with PKCE through a loopback redirect); "
                                            "the refresh token is kept for the operator commands' --url.")
    login.add_argument("--url", help=f"the service's admin listener (or {cli_login.ADMIN_URL_ENV})")
    login.add_argument("--no-browser", action="store_true", help="print the sign-in address, open no browser")
    login.add_argument("--token-client-id", metavar="CLIENT_ID",
                       help=f"sign in as this first-party client (a service account's; or {cli_login.CLIENT_ID_ENV}) "
                            f"instead of tokensvc-cli; a confidential one's secret from {cli_login.CLIENT_SECRET_ENV}")
    login.add_argument("--callback-port", metavar="PORT", type=_port, default=0,
                       help="the loopback port the browser is sent back to (http://127.0.0.1:PORT/callback): a "
                            "confidential client's registered redirect URI names it; by default any free port")
    login.add_argument("--refresh-token", metavar="FILE",
                       help="keep the refresh token in FILE (0600) for the operator commands' --refresh-token, "
                            "instead of the credentials file")
    login.add_argument("--confirmation-stdin", action="store_true",
                       help="read the confirmation code the page shows from standard input, one line, instead of "
                            "asking on the terminal")
    login.add_argument("--json", action="store_true", help="print JSON for scripts instead of text")
    login.set_defaults(func=cmd_login)


__all__ = ["CommandError", "ConfigError", "add_commands", "load_settings"]
