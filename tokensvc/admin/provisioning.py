"""Declarative provisioning (``tokensvc apply``): the plan that makes the service hold what a
file says, computed and checked whole before anything is written.

A desired state names clients, users and installations by their ids, each with some of its
fields (the admin API's names): a field left out keeps the value the service holds. The plan
compares it with the store entry by entry, through the checks the operations that carry it
out make (:mod:`tokensvc.admin.actions`, the bodies of :mod:`tokensvc.admin.schemas`), so a plan that
passes is one those operations accept, short of a change made meanwhile; every problem of
the whole state is reported at once (422, located at its table, entry and field). Each step
says what it would do: ``create``, ``update`` (the fields that change, with their values; a
secret only that it changes, never a value), ``unchanged``, or ``remove`` (with ``prune``:
what the state does not name, in the tables it names anything in). The steps run in the
order given: users (installations name them), clients, installations, then the removals the
other way round; last of all, the change that ends the rights of the token asking (its user's
demotion or new password, its client's loss of ``admin``: ``endsCaller``),
so that nothing else needs them after it; a state with two such changes is refused.

The plan writes nothing; the command line carries it out step by step through the same
operations (``tokensvc/cli/admin.py``), so a failure midway is known to the step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from tokensvc.admin import actions as admin
from tokensvc.admin import schemas as admin_schemas
from tokensvc.admin.actions import AdminError, ClientSpec, FileEntries
from tokensvc.errors import ValidationFailed
from tokensvc.identifiers import username_key
from tokensvc.oauth import hashing
from tokensvc.oauth.scopes import ADMIN
from tokensvc.records import DEFAULT_SCOPES, RESOURCE_SERVER, Client
from tokensvc.schemas import load
from tokensvc.storage.base import Store

Json = dict[str, Any]
TABLES = ("users", "clients", "installations")  # in the order their steps run
ID_FIELDS = {"clients": "clientId", "users": "username", "installations": "installationId"}
KIND_OF = {"clients": "client", "users": "user", "installations": "installation"}
SECRET_FIELDS = frozenset({"clientSecretSha256", "password", "passwordHash"})
NO_FILE = FileEntries()  # a store no configuration file writes to


@dataclass(slots=True)
class Step:
    """One thing the plan does: ``action`` (create, update, unchanged, remove) to the
    ``kind`` (client, user, installation) named ``id``; ``changes``: the fields it sets."""

    kind: str
    id: str
    action: str
    changes: list[Json] = field(default_factory=list)
    ends_caller: bool = False  # it ends the rights of the token asking: run last

    def json(self) -> Json:
        return {"kind": self.kind, "id": self.id, "action": self.action, "changes": self.changes,
                "endsCaller": self.ends_caller}


def change(name: str, before: Any, after: Any) -> Json:
    """A field that changes: a secret says only that (``"secret": true``), never a value."""
    if name in SECRET_FIELDS:
        return {"field": name, "secret": True}
    return {"field": name, "from": before, "to": after}


class Problems:
    """Every problem of a desired state, each located as the admin API locates a field:
    ``["body", table, index, field]``."""

    def __init__(self) -> None:
        self.detail: list[Json] = []

    def add(self, loc: list[Any], message: str) -> None:
        self.detail.append({"loc": ["body", *loc], "msg": message, "type": "value_error", "input": None, "ctx": {}})

    @contextmanager
    def at(self, table: str, index: int) -> Iterator[None]:
        """Record what the checks of entry ``index`` of ``table`` raise, and go on."""
        try:
            yield
        except ValidationFailed as failed:
            for item in failed.detail:
                self.detail.append({**item, "loc": ["body", table, index, *item["loc"][1:]]})
        except AdminError as refused:
            self.add([table, index, *([refused.field] if refused.field else [])], str(refused))


@dataclass(slots=True)
class Desired:
    """What the plan knows so far of the state it makes: the names it creates, which later
    entries may use (an installation's operators, a client's name taken)."""

    users: set[str] = field(default_factory=set)
    client_names: dict[str, str] = field(default_factory=dict)  # lower-cased name -> client id
    # The resources (RFC 8707) of the clients named so far, as the plan leaves them.
    resources: dict[str, list[str] | None] = field(default_factory=dict)
    own: str | None = None  # tokensvc's own API, which no resource server declares
    clients: list[str] = field(default_factory=list)  # the client ids the plan names, in its order


async def plan(store: Store, body: Any, *, kinds: Sequence[str], service_name: str,
               acting_user: str | None = None, acting_client: str | None = None,
               file: FileEntries = NO_FILE, own: str | None = None) -> list[Step]:
    """The steps that make ``store`` hold ``body`` (``{"users", "clients", "installations":
    [entries], "prune"}``), or ValidationFailed listing every problem. An entry of the
    configuration file (``file``) may be named only as the file has it (``unchanged``): a
    change to it is a problem, naming the file. With ``prune``, what a table does not name is
    removed, except the configuration file's entries (the service's own client among them) and
    never the user or client of the token asking (``acting_user``, ``acting_client``): that is
    refused. ``own``: tokensvc's own API, which no resource server may declare; nor may two
    declare one resource, as the store holds them or as the plan leaves them (a client the plan
    names later is judged as the store holds it: name the client that gives a resource up
    before the one that takes it, as the refusal says)."""
    data = load(admin_schemas.plan_body, body)
    problems, desired = Problems(), Desired(own=own)
    desired.clients = [str(entry.get(ID_FIELDS["clients"])) for entry in data.get("clients") or []
                       if isinstance(entry, dict)]
    steps: list[Step] = []
    named: dict[str, set[str]] = {table: set() for table in TABLES}
    for table in TABLES:
        for index, entry in enumerate(data.get(table) or []):
            with problems.at(table, index):
                key = _key(table, entry)
                if same(table, key) in named[table]:
                    raise AdminError(f"{KIND_OF[table]} {key!r} is named twice", ID_FIELDS[table])
                named[table].add(same(table, key))
                fields = {name: value for name, value in entry.items() if name != ID_FIELDS[table]}
                if table == "users":
                    steps.append(_as_caller(await _user(store, key, fields, service_name, desired), acting_user))
                elif table == "clients":
                    steps.append(_client_as_caller(await _client(store, key, fields, desired), acting_client))
                else:
                    steps.append(await _installation(store, key, fields, kinds, desired))
                if steps[-1].action != "unchanged":
                    await file.refuse(store, KIND_OF[table], key)
    if data["prune"]:
        steps += await _removals(store, data, named, problems, acting_user, acting_client, file)
    _one_end_of_the_caller(steps, data, problems)
    if problems.detail:
        raise ValidationFailed(problems.detail)
    # What ends the caller's rights runs last, once the rest no longer needs them (terraform
    # would not lock itself out midway either): a file that demotes or re-keys its own runner
    # is applied whole, as its dry run said.
    return [step for step in steps if not step.ends_caller] + [step for step in steps if step.ends_caller]


def same(table: str, key: str) -> str:
    """What makes two entries of ``table`` one: a user's name is one whatever its case (its
    key, NFKC and case folded), an id is itself."""
    return username_key(key) if table == "users" else key


def _key(table: str, entry: Json) -> str:
    """The id of ``entry``, once its shape is checked: the fields of its table's entries (the
    document's PlanClient, PlanUser, PlanInstallation), each of its type. What its fields
    must hold is for the operations' checks that follow."""
    load(admin_schemas.plan_entries[table], entry)
    return str(entry[ID_FIELDS[table]])


# -- users ---------------------------------------------------------------------------------------


async def _user(store: Store, username: str, entry: Json, service_name: str, desired: Desired) -> Step:
    existing = await store.get_user_by_username(username) if len(username) <= 128 else None
    context = [username, service_name]
    if existing is None:
        data = load(admin_schemas.user_body, {"username": username, **entry})
        await admin.check_new_user(store, username)
        await admin.check_password_choice(data.get("password"), data.get("password_hash"), context)
        desired.users.add(username)
        return Step("user", username, "create", [change(name, None, value) for name, value in entry.items()])
    changes = []
    if "admin" in entry:
        wanted = load(admin_schemas.user_patch, {"admin": entry["admin"]})["admin"]
        if wanted != existing.admin:
            changes.append(change("admin", existing.admin, wanted))
    secrets = {name: entry[name] for name in ("password", "passwordHash") if name in entry}
    if secrets:
        data = load(admin_schemas.password_body, secrets)
        password, password_hash = data.get("password"), data.get("password_hash")
        await admin.check_password_choice(password, password_hash, context)
        if password is None:
            differs = password_hash != existing.password_hash
        else:
            differs = not await asyncio.get_running_loop().run_in_executor(
                None, hashing.verify_password, password, existing.password_hash)
        if differs:
            changes += [change(name, None, None) for name in secrets]
    return Step("user", username, "update" if changes else "unchanged", changes)


def _as_caller(step: Step, acting_user: str | None) -> Step:
    """``step`` marked if it ends the rights of ``acting_user``'s token: their demotion, or
    their new password (which revokes their grants). Both at once cannot be carried out (the
    first ends the token the second needs): refused."""
    if acting_user is None or step.action != "update" or same("users", step.id) != same("users", acting_user):
        return step
    demoted = any(found["field"] == "admin" and found["to"] is False for found in step.changes)
    rekeyed = any(found["field"] in SECRET_FIELDS for found in step.changes)
    if demoted and rekeyed:
        raise AdminError(f"{step.id!r} runs this: their demotion and their new password each end this token's "
                         "rights, so one run cannot apply both; apply one, sign in again, then the other", "admin")
    return replace(step, ends_caller=True) if demoted or rekeyed else step


def _one_end_of_the_caller(steps: list[Step], data: Json, problems: Problems) -> None:
    """Two steps that each end the caller's rights (its user's demotion, its client's loss of
    ``admin``) cannot both be carried out: the first ends the token the second needs."""
    ending = [step for step in steps if step.ends_caller]
    if len(ending) < 2:
        return
    table = "clients" if ending[1].kind == "client" else "users"
    index = next(index for index, entry in enumerate(data.get(table) or [])
                 if same(table, str(entry[ID_FIELDS[table]])) == same(table, ending[1].id))
    problems.add([table, index], f"{ending[0].kind} {ending[0].id!r} and {ending[1].kind} {ending[1].id!r} each end "
                                 "the rights of the token this runs with, so one run cannot apply both; apply one, "
                                 "sign in again, then the other")


# -- clients -------------------------------------------------------------------------------------


def _in_force(spec: ClientSpec) -> Json:
    """A client's fields as they act, by the body's names: what ``spec.fields()`` writes (a
    client's empty scopes are read, a resource server's none; no origins: none)."""
    written = spec.fields()
    return {"name": spec.name, "kind": spec.kind, "redirectUris": written["redirect_uris"],
            "allowedScopes": list(DEFAULT_SCOPES) if written["allowed_scopes"] is None else written["allowed_scopes"],
            "firstParty": spec.first_party, "confidential": bool(spec.confidential),
            "description": spec.description, "logoUrl": spec.logo_url,
            "allowedOrigins": written["allowed_origins"] or [], "resources": written["resources"] or []}


def _client_as_caller(step: Step, acting_client: str | None) -> Step:
    """``step`` marked if it ends the rights of ``acting_client``'s tokens: ``admin`` taken
    from its scopes, withdrawn from its live tokens (a resource server has no scope: made one,
    it loses ``admin`` too)."""
    if step.action != "update" or step.id != acting_client:
        return step
    narrowed = any(found["field"] == "allowedScopes" and ADMIN in found["from"] and ADMIN not in found["to"]
                   for found in step.changes)
    return replace(step, ends_caller=True) if narrowed else step


def _secret_given(spec: ClientSpec, existing: Client | None) -> None:
    """A client the state makes confidential is given its secret: one the service made would
    be shown to no one (apply prints no secret), and the client could never prove itself."""
    if spec.confidential and spec.secret_sha256 is None and (existing is None or not existing.confidential):
        what = "a resource server is confidential" if spec.kind == RESOURCE_SERVER else "a confidential client"
        raise AdminError(f"{what}: give client_secret or client_secret_sha256")


async def _client(store: Store, client_id: str, entry: Json, desired: Desired) -> Step:
    existing = await store.get_client(client_id) if len(client_id) <= 128 else None
    if existing is None:
        data = load(admin_schemas.client_body, entry)
        spec = ClientSpec(**data).checked()
        _secret_given(spec, None)
        await admin.check_new_client(store, client_id, spec)
        _name_free(client_id, spec.name, desired)
        await _resources_free(store, client_id, spec, desired)
        return Step("client", client_id, "create", [change(name, None, value) for name, value in entry.items()])
    changes = load(admin_schemas.client_patch, entry)
    if changes.get("secret_sha256") is not None:
        changes = {"confidential": True, **changes}
    spec = replace(ClientSpec.of(existing), **changes).checked()
    _secret_given(spec, existing)
    _name_free(client_id, spec.name, desired)
    if "resources" in changes or "kind" in changes:
        await _resources_free(store, client_id, spec, desired)
    desired.resources[client_id] = list(spec.resources or []) if spec.kind == RESOURCE_SERVER else None
    # The stored client as it acts, held to no rule: one stored before a rule was stricter (a
    # resource URI not in canonical form) is shown as it is, and the plan changes it.
    before, after = _in_force(ClientSpec.of(existing).checked(given=())), _in_force(spec)
    found = [change(name, before[name], after[name]) for name in after if before[name] != after[name]]
    if spec.secret_sha256 is not None and spec.secret_sha256 != existing.secret_hash:
        found.append(change("clientSecretSha256", None, None))
    return Step("client", client_id, "update" if found else "unchanged", found)


async def _resources_free(store: Store, client_id: str, spec: ClientSpec, desired: Desired) -> None:
    """A resource server's resources as every writer checks them (:func:`admin.check_resources`),
    against the store as the plan leaves it so far. A client the plan names later is judged as
    the store holds it: the refusal says to name that one first, if it gives the URI up."""
    later = [other for other in desired.clients if other not in desired.resources and other != client_id]
    await admin.check_resources(store, client_id, spec, desired.own, desired.resources, later=later)
    desired.resources[client_id] = list(spec.resources or []) if spec.kind == RESOURCE_SERVER else None


def _name_free(client_id: str, name: str, desired: Desired) -> None:
    """Two clients of one state may not share a name (``create_client``'s rule, within the plan)."""
    other = desired.client_names.setdefault(name.lower(), client_id)
    if other != client_id:
        raise AdminError(f"a client named {name!r} is also {other!r} in this state", "name")


# -- installations ---------------------------------------------------------------------------------


async def _installation(store: Store, installation_id: str, entry: Json, kinds: Sequence[str],
                        desired: Desired) -> Step:
    existing = await store.get_installation(installation_id) if len(installation_id) <= 128 else None
    current: Json = {}
    if existing is not None:
        operators = [await store.get_user(user_id) for user_id in existing.operators]
        current = {"name": existing.name, "kind": existing.kind,
                   "operators": [user.username for user in operators if user is not None]}
    data = load(admin_schemas.installation_body, {**current, **entry})
    admin.check_installation(installation_id, data["name"], data["kind"], kinds)
    await admin.operator_ids(store, data.get("operators") or [], also=sorted(desired.users))
    if existing is None:
        return Step("installation", installation_id, "create",
                    [change(name, None, value) for name, value in entry.items()])
    found = [change(name, current[name], value) for name, value in entry.items()
             if name in current and current[name] != (value.strip() if name == "name" else value)]
    return Step("installation", installation_id, "update" if found else "unchanged", found)


# -- prune -----------------------------------------------------------------------------------------


async def _removals(store: Store, data: Json, named: dict[str, set[str]], problems: Problems,
                    acting_user: str | None, acting_client: str | None, file: FileEntries) -> list[Step]:
    """What each table the state names anything in holds and the state does not: removed,
    installations first (their grants), then clients, then users; never an entry of the
    configuration file."""
    steps: list[Step] = []
    if "installations" in data:
        steps += [Step("installation", inst.installation_id, "remove") for inst in await store.list_installations()
                  if inst.installation_id not in named["installations"]
                  and not inst.owner and not file.writes("installation", inst.installation_id)]
    if "clients" in data:
        clients: list[Client] = await store.list_clients()
        for client in clients:
            if client.client_id in named["clients"] or client.owner or file.writes("client", client.client_id):
                continue
            if client.client_id == acting_client:
                problems.add(["clients"], f"pruning would remove {client.client_id!r}, the client of the token this "
                                          "runs with: name it in the file")
            steps.append(Step("client", client.client_id, "remove"))
    if "users" in data:
        for user in await store.list_users():
            if username_key(user.username) in named["users"] or user.owner or file.writes("user", user.username):
                continue
            if acting_user is not None and username_key(user.username) == username_key(acting_user):
                problems.add(["users"], f"pruning would remove {user.username!r}, who runs this: name them in the "
                                        "file")
            steps.append(Step("user", user.username, "remove"))
    return steps
