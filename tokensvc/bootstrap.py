"""The composition root's start-up work: the store the settings name, the protocol context
made from the settings, and seeding (the clients, users and installations of the config file
are upserted into the store, so a restart with the same file changes nothing and an edited
file is applied)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Mapping
from dataclasses import asdict, replace
from datetime import datetime
from typing import Any, TypeVar

from tokensvc.config import ConfigError, Settings, StorageSettings, verify_only
from tokensvc.identifiers import (
    OWN_RESOURCE_PATH,
    resource_key,
    resources_not_canonical,
    username_key,
    within_own_resource,
)
from tokensvc.oauth import clientauth, hashing, removal, successors
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.feed import ReaderCaps
from tokensvc.oauth.metadata import server_metadata
from tokensvc.oauth.revocation import client_change, end_chains_before_promotion
from tokensvc.ratelimit import FailureLimits
from tokensvc.records import (
    CLI_CLIENT_OWNER,
    FILE_OWNER,
    RESOURCE_SERVER,
    Client,
    Installation,
    User,
    generated_digest,
    utcnow,
)
from tokensvc.storage.base import MARK_AUDIENCE, Conflict, ResourceTaken, StorageError, Store, StoreFault, StoreObserver
from tokensvc.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


def make_store(settings: StorageSettings, *, serving: bool = False) -> Store:
    """The backend ``storage.backend`` names; built inside the running event loop (the MongoDB
    driver starts its monitors as tasks of it). ``serving``: for ``tokensvc serve``, whose
    MongoDB store registers the process among those running (storage/mongo/processes.py)."""
    if settings.backend == "memory":
        from tokensvc.storage.memory import MemoryStore

        return MemoryStore()
    if settings.backend == "mongodb":
        from tokensvc.storage.mongo import MongoStore

        return MongoStore.connect(settings.mongodb_uri, settings.database, timeout_ms=settings.timeout_ms,
                                  max_pool_size=settings.max_pool_size,
                                  heartbeat_seconds=settings.heartbeat_seconds if serving else None)
    raise ConfigError(f"storage.backend: unknown backend {settings.backend!r}")


def make_context(settings: Settings, store: Store, **overrides: Any) -> OAuthContext:
    """The protocol context the settings describe (``clock`` and others may be overridden),
    reporting to the service's one :class:`Metrics`, which the store reports to too."""
    # Without keys of their own, one from each key of cookie_secret: while it rotates, the pairs
    # derived under the key being retired are still recomputed, as successor_keys' would be.
    # A short key kept to verify what 0.10.0 signed derives none: 0.10.0 derived none from it either.
    keys = settings.tokens.successor_keys or tuple(successors.key_from_cookie_secret(key)
                                                   for index, key in enumerate(settings.cookie_secrets)
                                                   if not verify_only(index, key))
    metrics = Metrics()
    values: dict[str, Any] = dict(
        store=store, tokens=settings.tokens, issuer=settings.base_url, successors=successors.SuccessorKeys.of(keys),
        limits=FailureLimits(settings.limits, shared=store.failure_counts(), pause=store.reachable),
        metadata=server_metadata(settings.base_url, settings.auth_url,
                                 (client.allowed_scopes for client in settings.clients)),
        metrics=metrics, feed_caps=ReaderCaps(settings.feed.max_readers, settings.feed.max_readers_per_client))
    values.update(overrides)
    store.observer = StoreMetrics(metrics)
    return OAuthContext(**values)


CLI_CLIENT = Client(
    client_id="tokensvc-cli", name="tokensvc command line", first_party=True,
    redirect_uris=["http://127.0.0.1/callback", "http://[::1]/callback"],  # any port (RFC 8252 §7.3)
    allowed_scopes=["admin"],
    description="The operators' command line (tokensvc login): the admin API with an admin's token.")


def new_user_id() -> str:
    return "u_" + secrets.token_hex(8)


async def resources_free(store: Store, config: Settings) -> None:
    """The resource URIs (RFC 8707) of the clients the store holds, read at start-up.

    A client the file does not name (one the admin API registered) may declare neither one of
    the file's URIs, which ``config check`` found each one resource server's within the file,
    nor tokensvc's own API (``base_url`` + ``/v1``, which a change of ``base_url`` may make one
    of its URIs) or a URI within it: StoreFault naming the client, which stops start-up, since a
    token meant for one API would pass at another. A URI not in canonical form, which a store
    written before that rule may hold, is warned of and left as it is."""
    mine = {resource_key(uri): (seed.client_id, uri) for seed in config.clients for uri in seed.resources or []}
    named = {seed.client_id for seed in config.clients}
    others = [client for client in await store.list_clients() if client.client_id not in named and client.resources]
    for client in others:
        for uri in client.resources or []:
            if within_own_resource(uri, config.base_url):
                raise StoreFault(f"client {client.client_id!r} declares the resource {uri!r}, which is tokensvc's own "
                                 f"API (base_url + {OWN_RESOURCE_PATH}) or within it: a token meant for tokensvc "
                                 "would pass at that client too; change its resources (tokensvc apply), or base_url, "
                                 "then start again")
            if (found := mine.get(resource_key(uri))) is not None:
                raise StoreFault(taken_message(found[0], found[1], f"client {client.client_id!r} declares it too, "
                                                                  f"as {uri!r}"))
    for warning in resources_not_canonical((client.client_id, client.resources) for client in others):
        log.warning("%s", warning)


def taken_message(client_id: str, uri: str, why: str) -> str:
    return (f"the configuration file's client {client_id!r} declares the resource {uri!r}, but {why}: a resource URI "
            "is one resource server's; change that client's resources (the admin API, tokensvc apply) or the file's, "
            "then start again")


async def seed(store: Store, config: Settings) -> None:
    await resources_free(store, config)
    for seed_client in config.clients:
        # Read before the entry's id is found free: the bound of the leftovers a registration revokes.
        now = utcnow()
        existing = await store.get_client(seed_client.client_id)
        secret_hash: str | None
        if seed_client.client_secret is not None:
            secret_hash = hashing.digest(seed_client.client_secret)
        else:
            secret_hash = seed_client.client_secret_sha256
        await seeded_resources(seed_client.client_id, seed_client_as(store, existing, said_if_changed(existing, Client(
            client_id=seed_client.client_id,
            name=seed_client.name,
            redirect_uris=list(seed_client.redirect_uris),
            # A resource server holds no scope, never null (which means ["read"]).
            allowed_scopes=[] if seed_client.kind == RESOURCE_SERVER
            else None if seed_client.allowed_scopes is None else list(seed_client.allowed_scopes),
            kind=seed_client.kind,
            allowed_origins=None if seed_client.allowed_origins is None else list(seed_client.allowed_origins),
            resources=list(seed_client.resources) if seed_client.resources else None,
            secret_hash=secret_hash,
            # Set by hand, unless it is the very secret the service generated for the client
            # (its digest copied into the file after a rotation).
            generated_secret_hash=generated_digest(existing, secret_hash),
            first_party=seed_client.first_party,
            description=seed_client.description,
            logo_url=seed_client.logo_url,
            created_at=existing.created_at if existing and existing.created_at else now,
        )), now))
    if config.admin.cli_client:  # `tokensvc login`: a native app on a loopback port (RFC 8252)
        now = utcnow()
        existing = await store.get_client(CLI_CLIENT.client_id)
        await seed_client_as(store, existing, replace(CLI_CLIENT, created_at=existing.created_at if existing else now),
                             now)
    elif await store.get_client(CLI_CLIENT.client_id) is not None:
        # Switched off: removed as `clients remove` removes a client (recorded, its grants
        # revoked and announced), so its tokens stay dead when a later start switches it on.
        await removal.remove_client(store, CLI_CLIENT.client_id, utcnow)
    user_ids: dict[str, str] = {}
    loop = asyncio.get_running_loop()
    for seed_user in config.users:
        existing_user = await store.get_user_by_username(seed_user.username)
        if seed_user.password_hash is not None:
            password_hash = seed_user.password_hash
        elif existing_user is not None and await loop.run_in_executor(
                None, hashing.verify_password, seed_user.password or "", existing_user.password_hash):
            password_hash = existing_user.password_hash  # unchanged: keep the stored hash
        else:
            password_hash = await loop.run_in_executor(None, hashing.hash_password, seed_user.password or "")
        if existing_user is not None and seed_user.admin and not existing_user.admin:
            # Promoted by the file (or again, after a demotion through the admin API), as
            # `users set-admin` promotes: no chain from before holds admin in force again.
            await end_chains_before_promotion(store, existing_user.user_id, utcnow)
        # Upserted on the username (a new one stored as its key, as `users add` does): processes
        # seeding one empty database at once agree on its id. Demoted by the file, the user is
        # marked in the same write, which every process's relay hears (the revocation feed).
        user = await store.seed_user(said_if_changed(existing_user, User(
            user_id=existing_user.user_id if existing_user else new_user_id(),
            username=existing_user.username if existing_user else username_key(seed_user.username),
            password_hash=password_hash,
            admin=seed_user.admin,
        )), utcnow())
        user_ids[username_key(seed_user.username)] = user.user_id
    for seed_installation in config.installations:
        installation = Installation(
            installation_id=seed_installation.installation_id,
            name=seed_installation.name,
            kind=seed_installation.kind,
            operators=[user_ids[username_key(name)] for name in seed_installation.operators],
        )
        existing_installation = await store.get_installation(installation.installation_id)
        await store.put_installation(said_if_changed(existing_installation, installation))
    # What the file writes at every start is marked as the file's in the store, and the mark of
    # what it no longer names is cleared: every writer refuses a marked entry, whatever file it
    # was given (docs/guide/administration.md, "Who owns an entry").
    owner = config.config_file or FILE_OWNER
    clients_owned = {seed_client.client_id: owner for seed_client in config.clients}
    if config.admin.cli_client:
        clients_owned[CLI_CLIENT.client_id] = CLI_CLIENT_OWNER
    users_owned = dict.fromkeys(user_ids.values(), owner)
    installations_owned = {seed.installation_id: owner for seed in config.installations}
    for kind, owned in (("client", clients_owned), ("user", users_owned), ("installation", installations_owned)):
        await said_if_taken(store, kind, owner, owned, await store.set_owners(kind, owned))
    clients = counted(len(config.clients) + config.admin.cli_client, "client")  # the CLI's client too
    where = f"{len(config.clients)} from the config and {CLI_CLIENT.client_id}" if config.admin.cli_client \
        else "from the config"
    log.info("seeded %s (%s), %s, %s", clients, where, counted(len(config.users), "user"),
             counted(len(config.installations), "installation"))


# What seeding compares of an entry it writes over: what the file says of it.
SAID = {Client: ("name", "redirect_uris", "allowed_scopes", "kind", "allowed_origins", "resources", "secret_hash",
                 "first_party", "description", "logo_url"),
        User: ("password_hash", "admin"), Installation: ("name", "kind", "operators")}
Entry = TypeVar("Entry", Client, User, Installation)


async def seeded_resources(client_id: str, seeding: Awaitable[None]) -> None:
    """``seeding`` (a client's), a resource URI another client declared meanwhile (or one being
    removed) told as :func:`resources_free` tells it."""
    try:
        await seeding
    except ResourceTaken as taken:
        raise StoreFault(taken_message(client_id, taken.resource or "?", "another client declares it (written "
                                       "meanwhile, or being removed)")) from None


def said_if_changed(existing: Entry | None, entry: Entry) -> Entry:
    """``entry``, as the file has it; when the store held it otherwise, a line says which fields
    the file writes over (never a value: a secret's or a password's hash among them). The admin
    API changes no entry of the file, so this is the file edited, or an entry of the admin API's
    named by the file, which is the file's from now on (docs/guide/administration.md)."""
    if existing is not None:
        changed = [name for name in SAID[type(entry)] if getattr(existing, name) != getattr(entry, name)]
        if changed:
            kind = type(entry).__name__.lower()
            key = entry.username if isinstance(entry, User) else \
                entry.client_id if isinstance(entry, Client) else entry.installation_id
            log.info("%s %s written as the configuration file says: %s", kind, key, ", ".join(changed))
    return entry


def counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


async def said_if_taken(store: Store, kind: str, owner: str, owned: Mapping[str, str],
                        taken: Mapping[str, str]) -> None:
    """Warn of each entry another configuration file wrote at every start, which this start's
    file now writes, or no longer names (so that it is the admin API's from now on): instances
    of one store that start with different files take entries from each other at every start,
    and a change one refuses another makes (docs/guide/administration.md, "Who owns an entry")."""
    for key, was in sorted(taken.items()):
        if was in (owner, CLI_CLIENT_OWNER):
            continue  # this file's own hand-over, or the setting's client
        label = key
        if kind == "user":
            user = await store.get_user(key)
            label = user.username if user else key
        if key in owned:
            log.warning("%s %s was written at every start by the configuration file %s, and is now by this one, %s: "
                        "run every instance of one store with the same file", kind, label, was, owner)
        else:
            log.warning("%s %s was written at every start by the configuration file %s, which this start's file, %s, "
                        "does not name: it is the admin API's until a start with %s; run every instance of one "
                        "store with the same file", kind, label, was, owner, was)


async def seed_client_as(store: Store, existing: Client | None, client: Client, now: datetime) -> None:
    """Write ``client`` as the configuration says it, over ``existing``, with the marks the
    change carries (:func:`tokensvc.oauth.revocation.client_change`): a narrowing of its
    allowed_scopes is withdrawn from what its grants and tokens hold, as the admin API's is, and
    marked; a change of what its feed readers proved (its secret, kind, first-party flag) is
    marked, so the other processes' readers of the client check their credentials again. The
    marks it does not set keep their value. A client registered anew first has the grants left
    under its id from before revoked (:func:`tokensvc.oauth.removal.register`); when
    another process seeding the same entry claimed the id first, its client is the existing one
    this one is written over."""
    if existing is None:
        try:
            await removal.register(store, client, now)
            return
        except ResourceTaken:
            raise
        except Conflict:
            existing = await store.get_client(client.client_id)
            if existing is None:  # claimed, then removed at once: the next start-up seeds it
                raise StorageError(f"client {client.client_id!r} changed while it was seeded") from None
            client = replace(client, created_at=existing.created_at)
    client = replace(client, narrowed_at=existing.narrowed_at, credentials_changed_at=existing.credentials_changed_at)
    await client_change(store, existing, asdict(client), utcnow,
                        lambda marks: store.put_client(replace(client, **{
                            name: value for name, value in marks.items() if name != MARK_AUDIENCE})))


async def prepare(store: Store, config: Settings, *, first_delay: float = 1.0, max_delay: float = 30.0) -> None:
    """Open the store, finish the client removals left under way, and seed it, retrying until
    the store answers; then mark it prepared.

    The service listens meanwhile and answers 503 where it needs the store (``/readyz``
    too), so a database that starts after tokensvc (or is briefly away at deploy time) needs
    no restart. A :class:`StoreFault` (an index only the operator can fix) is no such wait:
    it is raised, and ``tokensvc serve`` stops with its message.
    """
    delay = first_delay
    while True:
        try:
            await store.open()
            # A removal a process left under way is finished first: the configuration may name
            # the client again, and seeding then registers it afresh, with no grant of before.
            for client_id in await removal.finish_pending(store, utcnow):
                log.info("finished the removal of client %s", client_id)
            await seed(store, config)
            await compare_deployment_settings(store, config)
            store.prepared = True
            return
        except StorageError as exc:
            log.warning("store not ready (%s); retrying in %.0fs, or as soon as it answers", exc, delay)
            await store.reachable(delay)
            delay = min(delay * 2, max_delay)


async def compare_deployment_settings(store: Store, config: Settings) -> None:
    """Say what this instance holds of the settings every instance of one store must share, and
    warn of each running instance that says otherwise. ``admin.cli_client`` is the deployment's,
    as the store is one: an instance with it off removes ``tokensvc-cli`` for every instance
    (and each removal ends every command-line sign-in), one with it on registers it afresh, so
    instances that disagree undo each other at every start. A store that does not answer
    delays nothing: the comparison is left to the next start."""
    here = {"cli_client": config.admin.cli_client}
    try:
        others = await store.deployment_settings(here)
    except StorageError as exc:
        log.warning("could not compare admin.cli_client with the other instances of this store: %s", exc)
        return
    elsewhere = sorted(others)
    if elsewhere:
        value = str(not config.admin.cli_client).lower()
        log.warning("admin.cli_client is %s here and %s at %s running instance%s of this store (%s): every instance "
                    "of one store must say the same, or each start of one removes %s (ending every command-line "
                    "sign-in) and each start of another registers it afresh", str(config.admin.cli_client).lower(),
                    value, len(elsewhere), "" if len(elsewhere) == 1 else "s", ", ".join(elsewhere),
                    CLI_CLIENT.client_id)


# The memory store has no TTL indexes: the server purges it itself, this often.
MEMORY_PURGE_SECONDS = 300


async def purge_periodically(store: Store, every: float = MEMORY_PURGE_SECONDS) -> None:
    """Delete expired codes, tokens and sessions every ``every`` seconds, until cancelled
    (the memory backend's housekeeping; MongoDB's TTL indexes do it there)."""
    while True:
        await asyncio.sleep(every)
        try:
            counts = await store.purge_expired(utcnow())
        except StorageError as exc:
            log.warning("could not purge expired records: %s", exc)
            continue
        if any(counts.values()):
            log.info("purged %d expired codes, %d token families, %d sessions", counts["codes"], counts["families"],
                     counts["sessions"])


# How often a serving process looks for clients' previous secrets whose time is up. An expired
# one is refused at its time whatever this does; this forgets it and writes its audit line.
PREVIOUS_SECRET_SWEEP_SECONDS = 30.0


async def expire_previous_secrets_periodically(store: Store, every: float = PREVIOUS_SECRET_SWEEP_SECONDS) -> None:
    """Forget the previous client secrets whose time is up, each audited by the one process that
    forgets it, every ``every`` seconds until cancelled (on every backend: MongoDB has no TTL
    index for them, which would delete them without a word)."""
    while True:
        await asyncio.sleep(every)
        if not store.prepared:
            continue
        try:
            await clientauth.expire_previous_secrets(store, utcnow())
        except (StorageError, StoreFault) as exc:
            log.warning("could not look for expired previous client secrets: %s", exc)


class StoreMetrics(StoreObserver):
    """The store's reports (:class:`~tokensvc.storage.base.StoreObserver`) as metrics."""

    FEED_STATES = ("stream", "polling", "interrupted")

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._seconds: dict[str, Any] = {}

    def operation(self, name: str, seconds: float) -> None:
        histogram = self._seconds.get(name)
        if histogram is None:
            histogram = self._seconds[name] = self.metrics.store_seconds.labels(name)
        histogram.observe(seconds)

    def error(self, name: str, code: str) -> None:
        self.metrics.store_attempt_errors.labels(name, code).inc()

    def retry(self, name: str) -> None:
        self.metrics.store_retries.labels(name).inc()

    def feed(self, state: str) -> None:
        if state == "interrupted":
            self.metrics.feed_interruptions.inc()
        for known in self.FEED_STATES:
            self.metrics.feed_state.labels(known).set(1 if known == state else 0)

    def feed_event(self) -> None:
        self.metrics.feed_last_event.set_to_current_time()

    def pool_checked_out(self, seconds: float) -> None:
        self.metrics.store_pool_checked_out.inc()
        self.metrics.store_pool_wait.observe(seconds)

    def pool_checked_in(self) -> None:
        self.metrics.store_pool_checked_out.dec()

    def topology_changed(self) -> None:
        self.metrics.store_topology_changes.inc()

    def format_seen(self, stored: int, compatibility: int, migrations: dict[str, tuple[int, bool]]) -> None:
        self.metrics.store_format.labels("store").set(stored)
        self.metrics.store_format.labels("compatibility").set(compatibility)
        for name, (rows, done) in migrations.items():
            self.metrics.migration_rows.labels(name).set(rows)
            self.metrics.migration_pending.labels(name).set(0 if done else 1)

    def old_release_connections(self, count: int) -> None:
        self.metrics.old_release_connections.set(count)

    def old_format_rows(self, count: int) -> None:
        self.metrics.old_format_rows.set(count)
