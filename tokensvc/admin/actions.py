"""Operator actions: clients, users, node installations, grants, sessions, tokens,
housekeeping. One place for each action and its validation, whoever asks: the admin API
(``tokensvc/handlers/admin.py``), and the CLI writing straight into the store of a stopped
service. Each action validates its input (:class:`AdminError`, a message for a person;
:class:`Missing` for what is not there; :class:`Taken` for what is already), writes through the
Store, revokes what a removal leaves behind, and leaves one audit record (never a secret).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from tokensvc.bootstrap import new_user_id
from tokensvc.errors import HTTPAnswer, ValidationFailed
from tokensvc.identifiers import (
    DEFAULT_KINDS,
    NAME_RULE,
    OWN_RESOURCE_PATH,
    declared_resource_problem,
    id_problem,
    kind_problem,
    logo_url_problem,
    name_problem,
    origin_problem,
    own_resource,
    password_hash_problem,
    password_problem,
    redirect_uri_problem,
    resource_key,
    scope_problem,
    secret_sha256_problem,
    username_key,
    username_problem,
    within_resource,
)
from tokensvc.oauth import hashing, introspection, removal
from tokensvc.oauth import sessions as web_sessions
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.revocation import (
    client_change,
    client_marks,
    end_chains_before_promotion,
    marked_again,
    revoke_grant,
    revoke_token,
)
from tokensvc.records import (
    CLI_CLIENT_OWNER,
    CLIENT_KIND,
    CLIENT_KINDS,
    FILE_OWNER,
    MAX_KEEP_PREVIOUS_SECONDS,
    RESOURCE_SERVER,
    Client,
    Grant,
    Installation,
    PreviousSecret,
    Session,
    Subject,
    User,
    generated_digest,
    utcnow,
)
from tokensvc.storage.base import (
    CREDENTIALS,
    MARK_AUDIENCE,
    SUBJECT,
    Conflict,
    Removing,
    ResourceTaken,
    Revocation,
    Store,
)
from tokensvc.telemetry import logs

MAX_PAGE = 200  # the most a listing returns at once


class AdminError(HTTPAnswer):
    """An operator's mistake: the message says what to fix (422 over the admin API), and
    ``field`` the input at fault, when one is: a field of the body (as the body names it), or
    with ``location="path"`` the address's parameter, or with ``"query"`` its query's."""

    status_code = 422

    def __init__(self, message: str, field: str | None = None, location: str = "body") -> None:
        super().__init__(message)
        self.field, self.location = field, location

    def body(self) -> dict[str, Any]:
        loc = [self.location, self.field] if self.field else [self.location]
        return {"detail": [{"loc": loc, "msg": str(self), "type": "value_error", "input": None, "ctx": {}}]}


class Missing(AdminError):
    """What the action names is not there (404)."""

    status_code = 404

    def body(self) -> dict[str, Any]:
        return {"detail": str(self)}


class Taken(AdminError):
    """What the action would create is there already, or what it names is in a state that does
    not allow it (409)."""

    status_code = 409

    def body(self) -> dict[str, Any]:
        return {"detail": str(self)}


class TheFiles(Taken):
    """The entry is the configuration file's (409): the operations leave it alone, since each
    start of any process writes it again as the file says (:class:`FileEntries`)."""


@dataclass(frozen=True, slots=True)
class FileEntries:
    """The entries the configuration file writes at each start of every process: its
    ``[[clients]]`` (and the command line's client while ``admin.cli_client`` is on), its
    ``[[users]]`` (by their username's key) and its ``[[installations]]``. They are the file's:
    an operation that would change or remove one is refused (:class:`TheFiles`), naming the
    file, so that no change made here is undone by the next restart of a worker, an instance
    or all of them. Every other entry is the admin API's, and no start-up writes it."""

    file: str = ""
    clients: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()
    installations: frozenset[str] = frozenset()
    cli_client: str = ""  # the command line's client, while admin.cli_client writes it (not a [[clients]] entry)

    def check(self, kind: str, key: str) -> None:
        """Refuse (409) a change to the ``kind`` (client, user, installation) ``key`` if the file
        writes it, naming what writes it: the file's table, or ``admin.cli_client``."""
        owned = {"client": self.clients, "user": self.users, "installation": self.installations}[kind]
        if (username_key(key) if kind == "user" else key) in owned:
            raise written_at_every_start(kind, key, self.file or FILE_OWNER)
        if kind == "client" and key == self.cli_client:
            raise written_at_every_start(kind, key, CLI_CLIENT_OWNER)

    def writes(self, kind: str, key: str) -> bool:
        try:
            self.check(kind, key)
        except TheFiles:
            return True
        return False

    async def refuse(self, store: Store, kind: str, key: str) -> None:
        """Refuse (409) a change to the ``kind`` ``key`` that a configuration file writes at every
        start: this process's file (:meth:`check`), or the file the store says wrote it (its
        ``owner``, marked by the last start), whatever file this process was given: the command
        line on a store reads its own ``--config``, not the running deployment's."""
        self.check(kind, key)
        entry: Client | User | Installation | None
        if kind == "client":
            entry = await store.get_client(key)
        elif kind == "user":
            entry = await store.get_user_by_username(key)
        else:
            entry = await store.get_installation(key)
        if entry is not None and entry.owner:
            raise written_at_every_start(kind, key, entry.owner)


def written_at_every_start(kind: str, key: str, owner: str) -> TheFiles:
    """The refusal (409) of a change to the ``kind`` ``key``, which ``owner`` writes at every
    start: ``admin.cli_client`` (:data:`~tokensvc.records.CLI_CLIENT_OWNER`), else a
    configuration file, named by its path."""
    if owner == CLI_CLIENT_OWNER:
        return TheFiles(f"client {key!r} is tokensvc login's own client, written at every start while "
                        "admin.cli_client is on (its default): it cannot be changed here; admin.cli_client = false "
                        "removes it, and a client of your own then serves tokensvc login --token-client-id")
    where = "the configuration file" if owner == FILE_OWNER else f"the configuration file {owner}"
    return TheFiles(f"{kind} {key!r} is written by {where} at every start: change it there (or take it out "
                    "of the file to manage it here)")


def _record(event: str, **fields: object) -> None:
    logs.audit(event, fields)


def _check(problem: str | None, what: str, value: str, field: str | None = None, location: str = "body") -> None:
    """AdminError naming ``problem`` (one of identifiers' rules) and the input at fault
    (``field`` of ``location``), if there is one."""
    if problem is not None:
        raise AdminError(f"not a valid {what} ({problem}): {value!r}", field, location)


# -- clients ------------------------------------------------------------------------------------


@dataclass(slots=True)
class ClientSpec:
    """What an operator says a client is (everything but its creation time). Its secret is
    the service's to make (``confidential``: one is generated, shown once, and kept by later
    changes) or the operator's (``secret_sha256``, the SHA-256 of a secret they hold: it
    makes the client confidential). ``confidential`` None: as ``secret_sha256`` says."""

    name: str
    redirect_uris: list[str] = field(default_factory=list)
    scopes: list[str] | None = None
    first_party: bool = False
    confidential: bool | None = None
    description: str | None = None
    logo_url: str | None = None
    allowed_origins: list[str] | None = None
    kind: str = CLIENT_KIND
    secret_sha256: str | None = None
    resources: list[str] | None = None  # a resource server's (RFC 8707)

    def checked(self, given: Collection[str] | None = None) -> ClientSpec:
        """The spec as it will be written (``confidential`` decided); AdminError naming the
        body's field at fault. Only the fields ``given`` (all when None) are held to the rules:
        a change checks what it sets, so a client stored before a rule was stricter keeps
        working and can be edited. What a resource server may not have is refused whatever is
        given."""

        def asked(name: str) -> bool:
            return given is None or name in given

        if asked("name") and name_problem(self.name) is not None:
            raise AdminError(f"a client needs a name ({NAME_RULE}): {self.name!r}", "name")
        if self.kind not in CLIENT_KINDS:
            raise AdminError(f"a client's kind is one of {', '.join(CLIENT_KINDS)}: {self.kind!r}", "kind")
        if self.kind == RESOURCE_SERVER:
            return replace(self._checked_resource_server(asked("logo_url"), asked("resources")),
                           name=self.name.strip())._secret()
        if self.resources:
            raise AdminError("only a resource server serves resources", "resources")
        if asked("redirect_uris"):
            if not self.redirect_uris:
                raise AdminError("a client needs at least one redirect URI", "redirectUris")
            for uri in self.redirect_uris:
                _check(redirect_uri_problem(uri), "redirect URI", uri, "redirectUris")
        for scope in self.scopes or [] if asked("scopes") else []:
            _check(scope_problem(scope), "scope", scope, "allowedScopes")
        if asked("logo_url") and self.logo_url is not None:
            _check(logo_url_problem(self.logo_url), "logo URL", self.logo_url, "logoUrl")
        for origin in self.allowed_origins or [] if asked("allowed_origins") else []:
            _check(origin_problem(origin), "web origin", origin, "allowedOrigins")
        return replace(self, name=self.name.strip())._secret()

    def _secret(self) -> ClientSpec:
        """``confidential`` decided: a secret given (its digest) makes the client confidential."""
        confidential = self.confidential
        if self.secret_sha256 is not None:
            _check(secret_sha256_problem(self.secret_sha256), "secret digest", self.secret_sha256,
                   "clientSecretSha256")
            if confidential is False:
                raise AdminError("a client with a secret is confidential", "clientSecretSha256")
            confidential = True
        return replace(self, confidential=bool(confidential))

    def _checked_resource_server(self, logo: bool, resources: bool = True) -> ClientSpec:
        """A resource server is confidential and has none of what the authorization flow uses:
        no redirect URI, no scope, not first-party, no web origin."""
        for what, given, name in (("redirect URI", self.redirect_uris, "redirectUris"),
                                  ("scope", self.scopes, "allowedScopes"),
                                  ("web origin", self.allowed_origins, "allowedOrigins"),
                                  ("first-party flag", self.first_party, "firstParty")):
            if given:
                raise AdminError(f"a resource server has no {what}: it only introspects tokens and reads the "
                                 "revocation feed", name)
        if logo and self.logo_url is not None:
            _check(logo_url_problem(self.logo_url), "logo URL", self.logo_url, "logoUrl")
        for uri in self.resources or [] if resources else []:
            _check(declared_resource_problem(uri), "resource URI", uri, "resources")
        return replace(self, confidential=True)

    @classmethod
    def of(cls, client: Client) -> ClientSpec:
        return cls(client.name, list(client.redirect_uris), client.allowed_scopes, client.first_party,
                   client.confidential, client.description, client.logo_url, client.allowed_origins, client.kind,
                   resources=client.resources)

    def fields(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        """The client fields this spec sets (its secret aside), or those of ``names`` (the
        spec's own names, as a PATCH gives them)."""
        values = {"name": self.name, "redirect_uris": list(self.redirect_uris),
                  "allowed_scopes": list(self.scopes) if self.scopes else None, "first_party": self.first_party,
                  "description": self.description, "logo_url": self.logo_url,
                  "allowed_origins": list(self.allowed_origins) if self.allowed_origins else None,
                  "kind": self.kind, "resources": None}
        if self.kind == RESOURCE_SERVER:
            values["allowed_scopes"] = []  # none at all, never null (which means ["read"])
            values["resources"] = list(self.resources) if self.resources else None
        if names is None:
            return values
        return {field: values[field] for name in names if (field := CLIENT_FIELDS.get(name))}


# ClientSpec's names -> Client's (the secret apart)
CLIENT_FIELDS = {"name": "name", "redirect_uris": "redirect_uris", "scopes": "allowed_scopes",
                 "first_party": "first_party", "description": "description", "logo_url": "logo_url",
                 "allowed_origins": "allowed_origins", "kind": "kind", "resources": "resources"}


async def check_resources(store: Store, client_id: str, spec: ClientSpec, own: str | None,
                          planned: Mapping[str, Sequence[str] | None] | None = None,
                          later: Collection[str] = ()) -> None:
    """A resource server's ``resources`` (RFC 8707), as every writer checks them before it
    writes: never tokensvc's own API (``own``: ``base_url`` + ``/v1``), since a token bound to it
    would pass at tokensvc's ``/v1`` and at the resource server alike, and none another client
    declares, since a token meant for one would pass at the other. Compared canonically
    (:func:`~tokensvc.identifiers.resource_key`); AdminError at ``resources`` naming the other
    client. ``planned``: the resources a plan gives the clients it named so far (``apply``),
    in place of the store's; ``later``: the clients it names after this one, judged as the
    store holds them, whose refusal says to name them first. Two writers at once are the
    store's to part (ResourceTaken)."""
    if spec.kind != RESOURCE_SERVER or not spec.resources:
        return
    mine = {resource_key(uri): uri for uri in spec.resources}
    if own is not None:
        for uri in mine.values():
            if within_resource(uri, own):
                raise AdminError(f"{uri!r} is tokensvc's own API (base_url + {OWN_RESOURCE_PATH}) or within it: a "
                                 "resource server declares the URIs of its own API", "resources")
    declared: dict[str, Sequence[str] | None] = {client.client_id: client.resources
                                                 for client in await store.list_clients()}
    declared.update(planned or {})
    for other, resources in sorted(declared.items()):
        for uri in resources or [] if other != client_id else []:
            if resource_key(uri) in mine:
                first = (f"; if {other!r} gives it up later in this plan, name {other!r} before {client_id!r}"
                         if other in later else "")
                raise AdminError(f"{mine[resource_key(uri)]!r} is declared by client {other!r} (as {uri!r}): a "
                                 f"resource URI is one resource server's{first}", "resources")


def resource_taken(taken: ResourceTaken) -> AdminError:
    """The store's refusal of a resource URI another client's document declares: one written
    meanwhile, or a client's whose removal is under way."""
    what = repr(taken.resource) if taken.resource else "a resource URI"
    return AdminError(f"{what} is declared by another client (written meanwhile, or one being removed): a resource "
                      "URI is one resource server's", "resources")


async def check_new_client(store: Store, client_id: str, spec: ClientSpec) -> None:
    """What registering a client under ``client_id`` needs beside its spec: an id of the
    right form, not taken, and a name no other client has."""
    _check(id_problem(client_id), "client id", client_id, "clientId")
    if await store.get_client(client_id) is not None:
        raise Taken(f"a client with id {client_id!r} already exists")
    if await store.get_removal(client_id) is not None:
        raise Taken(f"client {client_id!r} is being removed: remove it again to finish, then register it")
    if any(client.name.lower() == spec.name.strip().lower() for client in await store.list_clients()):
        raise Taken(f"a client named {spec.name.strip()!r} already exists")


async def create_client(store: Store, spec: ClientSpec, client_id: str | None = None,
                        announce: removal.Announce = removal.nobody,
                        now: datetime | None = None, clock: removal.Clock = utcnow, *,
                        own: str | None = None) -> tuple[Client, str | None]:
    """Register a client; returns it and, for a confidential one given no secret, the secret
    made for it (shown once). The grants left under the id from before are revoked, each
    announced, then the id is claimed in one step (:func:`removal.register`): nothing issued to
    a client of before comes back, and of two registrations of one id at once one wins and the
    other is :class:`Taken` (409). ``now``: the time by the clock that stamps grants (the
    context's), which the leftovers' bound is compared with; ``clock``: that clock, which
    stamps each revocation as it is written. ``own``: tokensvc's own API, which no resource
    server declares (:func:`check_resources`)."""
    spec = spec.checked()
    now = utcnow() if now is None else now  # before the id is found free: the leftovers' bound
    # Hex: a generated id never starts with "-" (which a command line would read as an option).
    client_id = secrets.token_hex(12) if client_id is None else client_id
    await check_new_client(store, client_id, spec)
    await check_resources(store, client_id, spec, own)
    secret = hashing.new_secret() if spec.confidential and spec.secret_sha256 is None else None
    client = Client(client_id=client_id, created_at=now, **spec.fields(),
                    **_secret_fields(secret, spec.secret_sha256))
    try:
        await removal.register(store, client, now, announce, clock)
    except Removing:  # a removal of the id recorded meanwhile
        raise Taken(f"client {client_id!r} is being removed: remove it again to finish, then register it") from None
    except ResourceTaken as taken:  # another client declared one of its resources meanwhile
        raise resource_taken(taken) from None
    except Conflict:  # another registration of the id won meanwhile
        raise Taken(f"a client with id {client_id!r} already exists") from None
    _record("client_created", client_id=client_id, first_party=spec.first_party, confidential=spec.confidential,
            outcome="success")
    return client, secret


async def put_client(ctx: OAuthContext, client_id: str, spec: ClientSpec) -> tuple[Client, str | None, bool]:
    """Create or replace the client ``client_id`` as ``spec`` says (idempotent: provisioning may
    run it on every deploy). A confidential client keeps its secret unless ``spec`` gives
    one; one that becomes confidential gets one (returned once, unless given), one that
    becomes public loses it. Returns the client, a new secret if any, and whether it was
    created. The id, the address's, is checked when it is new: a client stored before its rule
    was stricter keeps working."""
    existing = await ctx.store.get_client(client_id) if len(client_id) <= 128 else None
    if existing is None:
        _check(id_problem(client_id), "client id", client_id, "client_id", "path")
        client, secret = await create_client(ctx.store, spec, client_id, ctx.events.publish, ctx.clock(), ctx.clock,
                                             own=own_resource(ctx.issuer))
        return client, secret, True
    spec = spec.checked()
    await check_resources(ctx.store, client_id, spec, own_resource(ctx.issuer))
    fields = spec.fields()
    if spec.secret_sha256 is not None and spec.secret_sha256 != existing.secret_hash:
        fields.update(_secret_fields(None, spec.secret_sha256, existing))
    if any(getattr(existing, name) != value for name, value in fields.items()) or \
            spec.confidential != existing.confidential:
        client, secret = await _change_client(ctx, existing, fields, spec.confidential)
        _record("client_replaced", client_id=client_id, secret_changed=client.secret_hash != existing.secret_hash,
                outcome="success")
        return client, secret, False
    return existing, None, False


async def update_client(ctx: OAuthContext, client_id: str, changes: dict[str, Any]) -> tuple[Client, str | None]:
    """Change some of a client's fields (``ClientSpec``'s names): those alone are checked (a
    client stored before a rule was stricter can be edited) and written, so a concurrent change
    of others (a rotated secret, another PATCH) holds. A secret given (its digest) makes it
    confidential."""
    existing = await get_client(ctx.store, client_id)
    # A change of kind writes (and so checks) every field: what the new kind allows is the
    # whole client.
    whole = "kind" in changes
    if changes.get("secret_sha256") is not None:
        changes = {"confidential": True, **changes}
    spec = replace(ClientSpec.of(existing), **changes).checked(None if whole else changes.keys())
    if whole or "resources" in changes:
        await check_resources(ctx.store, client_id, spec, own_resource(ctx.issuer))
    confidential = spec.confidential if "confidential" in changes or whole else None
    fields = spec.fields(None if whole else changes)
    if spec.secret_sha256 is not None:
        fields.update(_secret_fields(None, spec.secret_sha256, existing))
    client, secret = await _change_client(ctx, existing, fields, confidential)
    _record("client_replaced", client_id=client_id, secret_changed=client.secret_hash != existing.secret_hash,
            outcome="success")
    return client, secret


async def _change_client(ctx: OAuthContext, existing: Client, fields: dict[str, Any],
                         confidential: bool | None) -> tuple[Client, str | None]:
    """Write ``fields`` of the client and no other (a concurrent change of another field
    holds), with a secret made or dropped when ``confidential`` changes it, and the marks the
    change carries (:func:`revocation.client_change`: a narrowing of its allowed_scopes, withdrawn
    from its grants, codes and families, announced to the open WebSockets of its tokens and to
    resource servers; a change of what its feed readers proved, to those readers alone)."""
    secret = None
    if confidential is True and existing.secret_hash is None and "secret_hash" not in fields:
        secret = hashing.new_secret()
        fields = {**fields, **_secret_fields(secret)}
    elif confidential is False and existing.secret_hash is not None:
        fields = {**fields, **_secret_fields(None)}
    try:
        before, announced = await client_change(
            ctx.store, existing, fields, ctx.clock,
            lambda marks: ctx.store.update_client(existing.client_id, {**fields, **marks}))
    except ResourceTaken as taken:
        raise resource_taken(taken) from None
    if before is None:
        raise Missing(f"no client with id {existing.client_id!r}")
    for revocation in announced:
        ctx.events.publish(revocation)
    return replace(before, **fields), secret


async def _replace_secret(ctx: OAuthContext, client_id: str, secret: str) -> Client | None:
    """Write ``secret`` as the client's, only while it has one (a concurrent change making it
    public wins), marked and announced as a change of its credentials: the revocation feed's
    readers of the client in every process check their credentials again. No token of the client
    loses anything by a new secret, so resource servers hear nothing of it. The client as it
    was, or None when nothing was written."""
    announced = [Revocation(CREDENTIALS, client_id)]
    fields = {**_secret_fields(secret), **client_marks(announced, ctx.clock())}
    before = await ctx.store.update_client(client_id, fields, if_confidential=True)
    if before is not None:
        for revocation in announced:
            ctx.events.publish(revocation)
    return before


def _secret_fields(generated: str | None, given_sha256: str | None = None,
                   existing: Client | None = None) -> dict[str, Any]:
    """The client fields a secret writes: its digest, and whether the service generated it
    (``generated``, a secret of :func:`hashing.new_secret`) or an operator gave it
    (``given_sha256``, its digest); neither: no secret (public). Every writer of a secret writes
    both, so the store never takes a secret set by hand for a generated one. A digest given is
    still a generated secret's when it is the one the store recorded as generated for the
    client (``existing``): an operator handing back the secret the service made for it."""
    if generated is not None:
        secret_hash = hashing.digest(generated)
        return {"secret_hash": secret_hash, "generated_secret_hash": secret_hash}
    return {"secret_hash": given_sha256, "generated_secret_hash": generated_digest(existing, given_sha256)}


async def get_client(store: Store, client_id: str) -> Client:
    client = await store.get_client(client_id) if len(client_id) <= 128 else None
    if client is None:
        raise Missing(f"no client with id {client_id!r}")
    return client


async def rotate_secret(ctx: OAuthContext, client_id: str,
                        keep_previous_seconds: int = 0) -> tuple[str, PreviousSecret | None]:
    """A new secret for a confidential client: its secret alone is written (with the client's
    credentials mark, announced: the revocation feed's readers of the client, in every process,
    check their credentials again; no resource server drops an answer), and only while it has
    one (a concurrent change making it public wins). With ``keep_previous_seconds`` the secret
    it replaces keeps working that long beside it (at most :data:`MAX_KEEP_PREVIOUS_SECONDS`),
    as a record of its own bound to the new secret, written before the client: a rotation cut
    short leaves a record that proves nothing (its successor is not the client's secret), never
    an outage of the old one. The new secret, and the previous one kept."""
    if not 0 <= keep_previous_seconds <= MAX_KEEP_PREVIOUS_SECONDS:
        raise AdminError(f"keep the previous secret between 0 and {MAX_KEEP_PREVIOUS_SECONDS} seconds (30 days)",
                         "keepPreviousSeconds")
    store = ctx.store
    client = await get_client(store, client_id)
    secret = hashing.new_secret()
    now = ctx.clock()
    previous = None
    if keep_previous_seconds and client.secret_hash is not None:
        previous = PreviousSecret(client_id, client.secret_hash, hashing.digest(secret), now,
                                  now + timedelta(seconds=keep_previous_seconds), generated=client.secret_generated)
        await store.put_previous_secret(previous)
    before = await _replace_secret(ctx, client_id, secret)
    if before is None:
        raise Taken(f"client {client_id!r} is public: it has no secret to rotate")
    if previous is None:
        await store.delete_previous_secret(client_id)
    elif before.secret_hash != previous.secret_hash or before.secret_generated != previous.generated:
        # Another change of the secret came between the read and the write: the one replaced is its.
        assert before.secret_hash is not None  # it was confidential (if_confidential)
        previous = replace(previous, secret_hash=before.secret_hash, generated=before.secret_generated)
        await store.put_previous_secret(previous)
    _record("client_secret_rotated", client_id=client_id, keep_previous_seconds=keep_previous_seconds,
            previous_expires_at=previous.expires_at.isoformat() if previous else None, outcome="success")
    return secret, previous


async def previous_secret(store: Store, client: Client, now: datetime) -> PreviousSecret | None:
    """The client's previous secret while it still works (what ``clients show`` tells)."""
    previous = await store.get_previous_secret(client.client_id) if client.confidential else None
    return previous if previous is not None and previous.in_force(client, now) else None


async def remove_client(ctx: OAuthContext, client_id: str) -> int:
    """Remove a client so that it cannot half-happen (:mod:`tokensvc.oauth.removal`): recorded
    first (its tokens stop at once, in every process), then its grants revoked in batches, then
    finished. A removal cut short (503) is carried on by the same call again, or by the next
    start-up. The grants this call revoked. A confidential client's secret is first replaced by
    one nobody knows, marked and announced as a rotation is: a reader of the feed under the
    client, in any process, asking again, finds its credentials proving nothing. The feed names
    the client to resource servers once the removal is recorded (its mark, which every relay
    hears), public or confidential, whatever comes after."""
    if len(client_id) > 128 or await ctx.store.get_removal(client_id) is None:
        await get_client(ctx.store, client_id)
        await _replace_secret(ctx, client_id, hashing.new_secret())
    return await removal.remove_client(ctx.store, client_id, ctx.clock, ctx.events.publish)


# -- users ----------------------------------------------------------------------------------------


def check_password(password: str, context: Sequence[str]) -> None:
    """The password rule (``users add``, ``users set-password``, ``[[users]]``): AdminError."""
    problem = password_problem(password, context)
    if problem is not None:
        raise AdminError(problem, "password")


async def check_password_choice(password: str | None, password_hash: str | None, context: Sequence[str]) -> None:
    """One of a password (the rule applies) or a password hash as stored (its form). The rule
    runs off the event loop: zxcvbn takes up to half a second over a long random password, and
    a plan may hold many."""
    if password is not None and password_hash is not None:
        raise AdminError("give a password or a passwordHash, not both", "passwordHash")
    if password is not None:
        await asyncio.get_running_loop().run_in_executor(None, check_password, password, context)
    elif password_hash is not None:
        _check(password_hash_problem(password_hash), "password hash", password_hash, "passwordHash")
    else:
        raise ValidationFailed.missing("body", "password")


async def _password_hash(password: str | None, password_hash: str | None, context: Sequence[str]) -> str:
    """The hash to store: ``password_hash`` as given, or ``password`` hashed (scrypt, off the
    event loop); either checked first."""
    await check_password_choice(password, password_hash, context)
    if password is None:
        return password_hash or ""
    return await asyncio.get_running_loop().run_in_executor(None, hashing.hash_password, password)


async def check_new_user(store: Store, username: str) -> None:
    _check(username_problem(username), "username", username, "username")
    if await store.get_user_by_username(username) is not None:
        raise Taken(f"a user named {username!r} already exists")


async def create_user(store: Store, username: str, password: str | None, *, admin: bool = False,
                      service_name: str = "tokensvc", password_hash: str | None = None) -> User:
    """A new user with ``password`` (the rule applies) or, as it is stored, ``password_hash``,
    stored under their username's key (``Carol`` becomes ``carol``): one user per key, so
    ``ROOT`` can never stand beside ``root``."""
    await check_new_user(store, username)
    user = User(new_user_id(), username_key(username),
                await _password_hash(password, password_hash, [username, service_name]),
                admin)
    try:
        await store.put_user(user)
    except Conflict:
        raise Taken(f"a user named {username!r} already exists") from None
    _record("user_created", subject=user.user_id, username=username, admin=admin, outcome="success")
    return user


async def get_user(store: Store, username: str) -> User:
    user = await store.get_user_by_username(username) if len(username) <= 128 else None
    if user is None:
        raise Missing(f"no user named {username!r}")
    return user


async def _narrow_user(ctx: OAuthContext, user_id: str, fields: dict[str, Any]) -> User | None:
    """Write ``fields`` of the user with the user's mark (``narrowed_at``), in one write, and
    announce it under the user: some of what their tokens may do is withdrawn. Every process's
    relay hears the mark, and the revocation feed names the user (``sub``), so resource servers
    drop the answers they cached for them: those whose tokens may be meant for them (the
    audiences of the user's families, read first, written with the mark, and read again after
    it: :func:`~tokensvc.oauth.revocation.marked_again`). The user as they were, or None when
    there is none."""
    audience = await ctx.store.families_audience(user_id=user_id, now=ctx.clock())
    before = await ctx.store.update_user(user_id, {**fields, "narrowed_at": ctx.clock(), MARK_AUDIENCE: audience})
    if before is not None:
        heard = await marked_again(
            audience, ctx.store.families_audience(user_id=user_id, now=ctx.clock()),
            lambda together: ctx.store.update_user(user_id, {"narrowed_at": ctx.clock(), MARK_AUDIENCE: together}))
        ctx.events.publish(Revocation(SUBJECT, user_id, heard))
    return before


async def set_admin(ctx: OAuthContext, username: str, admin: bool) -> User:
    """Make a user an administrator, or not. Either takes effect at once, in every process:
    ``admin`` is in force only while the user is one (:mod:`tokensvc.oauth.privileges`). A
    promotion first revokes the grants of theirs that may carry ``admin``, so that a chain from
    an earlier time as administrator never comes back to life; a demotion is written with the
    user's mark and announced (:func:`_narrow_user`), so that no cached answer keeps ``admin``."""
    user = await get_user(ctx.store, username)
    if user.admin != admin:
        ended = await end_chains_before_promotion(ctx.store, user.user_id, ctx.clock) if admin else {}
        for grant_ended in ended.values():
            ctx.metrics.revoked_families("promotion", grant_ended.count)
            ctx.events.publish(grant_ended.revocation)
        # The flag alone is written: a password set meanwhile holds (and this holds beside it).
        before = await (ctx.store.update_user(user.user_id, {"admin": True}) if admin
                        else _narrow_user(ctx, user.user_id, {"admin": False}))
        if before is None:
            raise Missing(f"no user named {username!r}")
        user = replace(before, admin=admin)
        _record("user_admin_set", subject=user.user_id, username=user.username, admin=admin,
                grants_revoked=len(ended),
                outcome="success")
    return user


async def set_password(ctx: OAuthContext, username: str, password: str | None, *, keep_grants: bool = False,
                       service_name: str = "tokensvc", password_hash: str | None = None) -> dict[str, Any]:
    """A new password (or a hash as stored) ends the user's web sessions and, unless
    ``keep_grants``, revokes every grant (and token) of theirs: whoever knew the old password
    is out everywhere. It is written with the user's mark and announced under the user
    (:func:`_narrow_user`), so that every resource server drops the answers it cached for them,
    kept grants included. Says whose (the username as stored), and what it ended."""
    user = await get_user(ctx.store, username)
    new_hash = await _password_hash(password, password_hash, [username, service_name])
    # The hash alone is written, with the user's mark: a promotion or demotion while it was
    # computed holds, and resource servers drop whatever they cached for the user.
    if await _narrow_user(ctx, user.user_id, {"password_hash": new_hash}) is None:
        raise Missing(f"no user named {username!r}")
    sessions = await web_sessions.end_all(ctx, user.user_id)
    revoked = 0 if keep_grants else await _revoke_grants_of(ctx, Subject(user_id=user.user_id))
    ctx.limits.password_set(user.username)  # what was guessed at was the old one: the account's wait ends
    _record("user_password_set", subject=user.user_id, username=user.username, sessions_ended=sessions,
            families_revoked=revoked, outcome="success")
    return {"username": user.username, "sessions_ended": sessions, "families_revoked": revoked}


async def remove_user(ctx: OAuthContext, username: str) -> tuple[str, int]:
    """Delete a user after revoking every grant (and token) of theirs, each announced; their
    username as it was stored, and the families revoked. The user's mark is written and
    announced just before the deletion (which no relay hears; a change stream hears the mark, a
    poll may find the document gone), so that resource servers drop whatever they cached for
    the user; the grants name it all too, also one made while this ran, which the sweep after
    the deletion revokes (no token of theirs is in force once they are gone)."""
    user = await get_user(ctx.store, username)
    subject = Subject(user_id=user.user_id)
    revoked = await _revoke_grants_of(ctx, subject)
    await web_sessions.end_all(ctx, user.user_id)
    await _narrow_user(ctx, user.user_id, {})
    await ctx.store.delete_user(user.user_id)
    revoked += await _revoke_grants_of(ctx, subject)
    _record("user_removed", subject=user.user_id, username=user.username, families_revoked=revoked,
            outcome="success")
    return user.username, revoked


# -- installations ----------------------------------------------------------------------------------


async def operator_ids(store: Store, operators: Sequence[str], also: Sequence[str] = ()) -> list[str]:
    """The user ids of ``operators`` (usernames, in any case); naming no one is the body's
    fault (422). A name in ``also`` (users a plan creates first) counts as there, with an empty
    id."""
    planned = {username_key(name) for name in also}
    ids = []
    for username in operators:
        user = await store.get_user_by_username(username) if len(username) <= 128 else None
        if user is None and username_key(username) not in planned:
            raise AdminError(f"no user named {username!r}", "operators")
        ids.append(user.user_id if user is not None else "")
    return ids


def check_installation(installation_id: str | None, name: str, kind: str, kinds: Sequence[str]) -> None:
    """An installation's fields by their rules; its id (a new one's) unless None."""
    if installation_id is not None:
        _check(id_problem(installation_id), "installation id", installation_id, "installationId")
    _check(kind_problem(kind, kinds), "kind", kind, "kind")
    if name_problem(name) is not None:
        raise AdminError(f"an installation needs a name ({NAME_RULE}): {name!r}", "name")


async def put_installation(store: Store, installation_id: str, name: str, kind: str,
                           operators: Sequence[str], kinds: Sequence[str] = DEFAULT_KINDS) -> tuple[Installation, bool]:
    """Create or replace an installation (operators by username, ``kind`` one of ``kinds``,
    the configured ones); whether it was created. The id is checked when it is new: one stored
    before its rule was stricter keeps working."""
    existing = await store.get_installation(installation_id) if len(installation_id) <= 128 else None
    if existing is None:
        _check(id_problem(installation_id), "installation id", installation_id, "installation_id", "path")
    check_installation(None, name, kind, kinds)
    installation = Installation(installation_id, name.strip(), kind, await operator_ids(store, operators))
    if installation != existing:
        await store.put_installation(installation)
        _record("installation_created" if existing is None else "installation_replaced", subject=installation_id,
                outcome="success")
    return installation, existing is None


async def get_installation(store: Store, installation_id: str) -> Installation:
    installation = await store.get_installation(installation_id) if len(installation_id) <= 128 else None
    if installation is None:
        raise Missing(f"no installation with id {installation_id!r}")
    return installation


async def remove_installation(ctx: OAuthContext, installation_id: str) -> int:
    await get_installation(ctx.store, installation_id)
    revoked = await _revoke_grants_of(ctx, Subject(installation_id=installation_id))
    await ctx.store.delete_installation(installation_id)
    _record("installation_removed", subject=installation_id, families_revoked=revoked, outcome="success")
    return revoked


# -- grants, sessions, tokens -------------------------------------------------------------------------


async def _revoke_grants_of(ctx: OAuthContext, subject: Subject) -> int:
    """Revoke every live grant of ``subject`` (each announced); the families revoked."""
    revoked = 0
    for grant in await ctx.store.list_grants(subject):
        revoked += await revoke_grant(ctx, grant.grant_id, "admin")
    return revoked


async def list_grants(ctx: OAuthContext, username: str | None = None, client_id: str | None = None,
                      after: str | None = None, limit: int | None = None) -> list[Grant]:
    """The live grants of a user, of a client, or of a user with a client, ordered by id: a
    page of ``limit`` (at most :data:`MAX_PAGE`) after the grant id ``after``."""
    if username is None and client_id is None:
        raise AdminError("name a user (username) or a client (clientId), or both", location="query")
    size = page_size(limit)
    if username is None:
        assert client_id is not None
        return await ctx.store.list_client_grants(client_id, after, size)
    user = await get_user(ctx.store, username)
    grants = sorted((grant for grant in await ctx.store.list_grants(Subject(user_id=user.user_id))
                     if client_id is None or grant.client_id == client_id), key=lambda grant: grant.grant_id)
    return [grant for grant in grants if after is None or grant.grant_id > after][:size]


async def revoke_one_grant(ctx: OAuthContext, grant_id: str) -> int:
    grant = await ctx.store.get_grant(grant_id) if len(grant_id) <= 128 else None
    if grant is None or grant.revoked_at is not None:
        raise Missing(f"no live grant with id {grant_id!r}")
    revoked = await revoke_grant(ctx, grant_id, "admin")
    _record("grant_revoked", client_id=grant.client_id, subject=grant.subject.id, families_revoked=revoked,
            outcome="revoked_by_operator")
    return revoked


async def list_sessions(ctx: OAuthContext, username: str) -> list[Session]:
    return await web_sessions.list_sessions(ctx, await get_user(ctx.store, username))


async def end_session(ctx: OAuthContext, username: str, session_id: str) -> None:
    user = await get_user(ctx.store, username)
    if not await web_sessions.end_one(ctx, user, session_id):
        raise Missing(f"no session {session_id!r} of {user.username!r} is signed in")
    _record("session_ended", username=user.username, outcome="ended_by_operator")


async def end_sessions(ctx: OAuthContext, username: str) -> int:
    user = await get_user(ctx.store, username)
    ended = await web_sessions.end_all(ctx, user.user_id)
    _record("sessions_ended", username=user.username, sessions_ended=ended, outcome="ended_by_operator")
    return ended


async def revoke_token_value(ctx: OAuthContext, token: str) -> bool:
    """Revoke any token by its value (an access token alone, a refresh token with its family);
    whether one was in force."""
    return await revoke_token(ctx, token, None)


async def introspect(ctx: OAuthContext, token: str) -> dict[str, Any]:
    """What ``POST /oauth/token/introspect`` answers for ``token``."""
    return await introspection.introspect(ctx, token)


async def purge(store: Store) -> dict[str, int]:
    counts = await store.purge_expired(utcnow())
    _record("expired_records_purged", outcome="success", **counts)
    return counts


def page_size(limit: int | None) -> int:
    """How many a listing returns: ``limit``, within 1 and :data:`MAX_PAGE`."""
    return MAX_PAGE if limit is None else max(1, min(limit, MAX_PAGE))
