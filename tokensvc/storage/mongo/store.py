"""The MongoDB store (:class:`MongoStore`): the Store contract, assembled from one part per
job, which it hands each operation to. The package's docstring lists the parts, and the
collections, queries and indexes."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from tokensvc import __version__
from tokensvc.records import (
    AuthorizationCode,
    Client,
    Family,
    Grant,
    Installation,
    Pair,
    PreviousSecret,
    Removal,
    Session,
    Subject,
    User,
)
from tokensvc.storage.base import (
    CLIENT,
    CREDENTIALS,
    ClientRecord,
    FailureCounts,
    Presentation,
    Revocation,
    Standing,
    Store,
    StoreObserver,
)
from tokensvc.storage.mongo import format as store_format
from tokensvc.storage.mongo import processes, topology
from tokensvc.storage.mongo.authorizations import MongoAuthorizations
from tokensvc.storage.mongo.calls import Calls
from tokensvc.storage.mongo.causal import CausalClock, SessionedDatabase
from tokensvc.storage.mongo.connection import BUILD_TIMEOUT_MS, Connection
from tokensvc.storage.mongo.credentials import Credentials
from tokensvc.storage.mongo.failures import MongoFailureCounts
from tokensvc.storage.mongo.feed import POLL_SECONDS, STREAM_WAIT_MS, MongoRevocationFeed
from tokensvc.storage.mongo.format import AUDIENCE_FROM
from tokensvc.storage.mongo.indexes import Indexes
from tokensvc.storage.mongo.lifecycle import Lifecycle
from tokensvc.storage.mongo.registry import MongoRegistry
from tokensvc.storage.mongo.sessions import MongoSessions
from tokensvc.storage.mongo.stamps import Stamps

R = TypeVar("R")


def _changes_clients(method: Callable[..., Coroutine[Any, Any, R]]) -> Callable[..., Coroutine[Any, Any, R]]:
    """A write that may change what client authentication weighs (a client, its previous
    secret, its removal): what this process read of clients lately is dropped before it and
    again once it is answered (or failed), so that no read it overtook is kept either."""
    @functools.wraps(method)
    async def wrapper(self: MongoStore, *args: Any, **kwargs: Any) -> R:
        self.registry.recent.clear()
        try:
            return await method(self, *args, **kwargs)
        finally:
            self.registry.recent.clear()

    return wrapper


class MongoStore(Store):
    """The Store contract on MongoDB. Each concern of the contract is a part of its own, on the
    store's one :class:`Connection`: the :attr:`registry` (registry.py), the
    :attr:`authorizations` (authorizations.py), the web :attr:`sessions` (sessions.py) and the
    failure counts (failures.py); the store's :attr:`lifecycle` (lifecycle.py: start-up,
    upkeep, stop) and its :attr:`indexes` (indexes.py) keep it; the revocation :attr:`feed`
    (feed.py) follows what every process revokes."""

    def __init__(self, client: Any, database: str, *, change_streams: bool = True, timeout_ms: int = 15_000,
                 build_timeout_ms: int = BUILD_TIMEOUT_MS, causal: bool = False) -> None:
        """``client`` is a ``pymongo.AsyncMongoClient`` (or an API-compatible stand-in in tests,
        which has no change streams: ``change_streams=False`` polls instead); the other
        arguments are the :class:`Connection`'s."""
        self.connection = Connection(client, database, timeout_ms=timeout_ms, build_timeout_ms=build_timeout_ms,
                                     causal=causal)
        credentials = Credentials(self.connection)
        self.stamps = Stamps(self.connection)  # revocations' marks that landed late, stamped again
        self.registry = MongoRegistry(self.connection)
        self.authorizations = MongoAuthorizations(self.connection, credentials, self.stamps)
        self.sessions = MongoSessions(self.connection, credentials, self.stamps)
        self.failures = MongoFailureCounts(self.connection)
        self.indexes = Indexes(self.connection)
        self.lifecycle = Lifecycle(self.connection, self.indexes)
        self.feed = MongoRevocationFeed(self.connection, change_streams=change_streams)
        self._prepared = True

    @classmethod
    def connect(cls, uri: str, database: str, *, timeout_ms: int, max_pool_size: int,
                heartbeat_seconds: int | None = None) -> MongoStore:
        """The store of ``database`` on the deployment ``uri`` names, every operation within
        ``timeout_ms``, at most ``max_pool_size`` connections. ``heartbeat_seconds``: a serving
        process's store (``tokensvc serve``), which registers among the running processes and
        renews its entry this often (processes.py); None: a command line's store."""
        from pymongo import AsyncMongoClient

        events = topology.DriverEvents()
        # The client connects lazily, in the background: building it never blocks or fails
        # on an absent server; the first operation does, after serverSelectionTimeoutMS.
        # Keyword options override the URI's.
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            uri,
            tz_aware=True,
            serverSelectionTimeoutMS=timeout_ms,
            connectTimeoutMS=min(10_000, timeout_ms),
            maxPoolSize=max_pool_size,
            waitQueueTimeoutMS=timeout_ms,
            # A reply that has not come a second after the budget is the driver's to give up on:
            # every call the store stops waiting for ends by itself (calls.py). A read's
            # pymongo.timeout, and an index build's, say less or more.
            socketTimeoutMS=timeout_ms + STREAM_WAIT_MS,
            # No timeoutMS (whatever the URI says): under it the driver retries a failing operation
            # back to back for the whole budget. The store holds each operation to its budget
            # itself, and retries with backoff (guarded).
            timeoutMS=None,
            retryWrites=True,
            retryReads=False,
            w="majority",
            journal=True,
            wTimeoutMS=timeout_ms,
            readPreference="primary",
            readConcernLevel="majority",
            appname=f"tokensvc/{__version__}",  # the release, for the storage commands' check of who is connected
            event_listeners=[events],
        )
        store = cls(client, database, timeout_ms=timeout_ms, causal=True)
        events.connection = store.connection
        if heartbeat_seconds is not None:
            store.registration = processes.Registration(heartbeat_seconds)
        return store

    # -- what the parts share (connection.py), as the storage commands, the migrations and the
    # revocation feed reach it

    @property
    def db(self) -> SessionedDatabase:
        """The database, in the current operation's causally consistent session (the storage
        commands, the migrations and the process registry work on it directly)."""
        return self.connection.db

    @property
    def client(self) -> Any:
        return self.connection.client

    @property
    def calls(self) -> Calls:
        return self.connection.calls

    @property
    def clock(self) -> CausalClock | None:
        return self.connection.clock

    @property
    def topology(self) -> topology.Topology:
        return self.connection.topology

    @property
    def observer(self) -> StoreObserver:
        return self.connection.observer

    @observer.setter
    def observer(self, observer: StoreObserver) -> None:
        self.connection.observer = observer

    @property
    def budget(self) -> float:
        return self.connection.budget

    @budget.setter
    def budget(self, seconds: float) -> None:
        self.connection.budget = seconds

    @property
    def build_budget(self) -> float:
        return self.connection.build_budget

    @build_budget.setter
    def build_budget(self, seconds: float) -> None:
        self.connection.build_budget = seconds

    @property
    def history(self) -> store_format.History:
        return self.connection.history

    @history.setter
    def history(self, history: store_format.History) -> None:
        self.connection.history = history

    @property
    def format(self) -> store_format.StoreFormat:
        return self.connection.format

    @format.setter
    def format(self, state: store_format.StoreFormat) -> None:
        self.connection.format = state

    @property
    def registration(self) -> processes.Registration | None:
        return self.lifecycle.registration

    @registration.setter
    def registration(self, registration: processes.Registration | None) -> None:
        self.lifecycle.registration = registration

    @property
    def prepared(self) -> bool:
        """As start-up says, and never once a heartbeat found the store's format refusing this
        release (the process is stopping)."""
        return self._prepared and self.connection.refusal is None

    @prepared.setter
    def prepared(self, prepared: bool) -> None:
        self._prepared = prepared

    async def writing(self) -> Callable[[Any], Any]:
        return await self.connection.writing()

    async def binds_audiences(self) -> bool:
        await self.connection.writing()  # the format known (read now by a command line's store)
        return self.connection.format.compatibility >= AUDIENCE_FROM

    async def heartbeat(self) -> None:
        await self.lifecycle.heartbeat()

    # -- Housekeeping (lifecycle.py; the revocation feed: feed.py)

    async def open(self) -> None:
        await self.lifecycle.open()

    async def close(self) -> None:
        await self.lifecycle.close()

    async def reachable(self, seconds: float) -> None:
        await self.lifecycle.reachable(seconds)

    async def upkeep(self) -> None:
        await self.lifecycle.upkeep()

    async def ping(self) -> None:
        await self.lifecycle.ping()

    async def deployment_settings(self, settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        return await self.lifecycle.deployment_settings(settings)

    def failure_counts(self) -> FailureCounts:
        return self.failures  # every process sharing the store counts in it

    def unwritable(self) -> str | None:
        return self.connection.unwritable()

    async def purge_expired(self, now: datetime) -> dict[str, int]:
        return await self.lifecycle.purge_expired(now)

    async def revocation_feed(self, poll_seconds: float = POLL_SECONDS) -> AsyncIterator[Revocation]:
        """The feed (feed.py), each announcement about a client dropping what this process
        read of it lately before it is yielded; its start and its end, however it ends (an
        interruption: anything may have changed meanwhile), everything read."""
        self.registry.recent.clear()
        feed = self.feed.revocation_feed(poll_seconds)
        try:
            async for revocation in feed:
                if revocation.kind in (CLIENT, CREDENTIALS):
                    self.registry.recent.drop(revocation.key)
                yield revocation
        finally:
            self.registry.recent.clear()

    # -- Registry (registry.py)

    async def get_client(self, client_id: str) -> Client | None:
        return await self.registry.get_client(client_id)

    async def list_clients(self, after: str | None = None, limit: int | None = None) -> list[Client]:
        return await self.registry.list_clients(after, limit)

    async def declared_resources(self, resources: list[str]) -> set[str]:
        return await self.registry.declared_resources(resources)

    @_changes_clients
    async def put_client(self, client: Client) -> None:
        await self.registry.put_client(client)

    @_changes_clients
    async def add_client(self, client: Client) -> None:
        await self.registry.add_client(client)

    @_changes_clients
    async def update_client(self, client_id: str, fields: dict[str, Any], *,
                            if_confidential: bool = False) -> Client | None:
        return await self.registry.update_client(client_id, fields, if_confidential=if_confidential)

    @_changes_clients
    async def set_owners(self, kind: str, owners: Mapping[str, str]) -> dict[str, str]:
        return await self.registry.set_owners(kind, owners)

    @_changes_clients
    async def withdraw_client(self, removal: Removal) -> None:
        await self.registry.withdraw_client(removal)

    @_changes_clients
    async def begin_removal(self, client_id: str, now: datetime, tag: str) -> Removal:
        return await self.registry.begin_removal(client_id, now, tag)

    @_changes_clients
    async def mark_removal(self, client_id: str, now: datetime, audience: list[str] | None = None) -> None:
        await self.registry.mark_removal(client_id, now, audience)

    async def get_removal(self, client_id: str) -> Removal | None:
        return await self.registry.get_removal(client_id)

    async def list_removals(self) -> list[Removal]:
        return await self.registry.list_removals()

    @_changes_clients
    async def end_removal(self, removal: Removal) -> None:
        await self.registry.end_removal(removal)

    @_changes_clients
    async def put_previous_secret(self, previous: PreviousSecret) -> None:
        await self.registry.put_previous_secret(previous)

    async def get_previous_secret(self, client_id: str) -> PreviousSecret | None:
        return await self.registry.get_previous_secret(client_id)

    async def client_record(self, client_id: str) -> ClientRecord | None:
        return await self.registry.client_record(client_id)

    @_changes_clients
    async def delete_previous_secret(self, client_id: str) -> None:
        await self.registry.delete_previous_secret(client_id)

    async def note_previous_secret_use(self, client_id: str, now: datetime, every_seconds: float) -> bool:
        return await self.registry.note_previous_secret_use(client_id, now, every_seconds)

    @_changes_clients
    async def expire_previous_secret(self, now: datetime) -> PreviousSecret | None:
        return await self.registry.expire_previous_secret(now)

    async def get_user(self, user_id: str) -> User | None:
        return await self.registry.get_user(user_id)

    async def get_user_by_username(self, username: str) -> User | None:
        return await self.registry.get_user_by_username(username)

    async def list_users(self, after: str | None = None, limit: int | None = None) -> list[User]:
        return await self.registry.list_users(after, limit)

    async def seed_user(self, user: User, now: datetime) -> User:
        return await self.registry.seed_user(user, now)

    async def put_user(self, user: User) -> None:
        await self.registry.put_user(user)

    async def update_user(self, user_id: str, fields: dict[str, Any]) -> User | None:
        return await self.registry.update_user(user_id, fields)

    async def delete_user(self, user_id: str) -> None:
        await self.registry.delete_user(user_id)

    async def get_installation(self, installation_id: str) -> Installation | None:
        return await self.registry.get_installation(installation_id)

    async def list_installations(self, after: str | None = None, limit: int | None = None) -> list[Installation]:
        return await self.registry.list_installations(after, limit)

    async def put_installation(self, installation: Installation) -> None:
        await self.registry.put_installation(installation)

    async def delete_installation(self, installation_id: str) -> None:
        await self.registry.delete_installation(installation_id)

    # -- Authorizations (authorizations.py)

    async def save_grant(self, client_id: str, subject: Subject, scopes: list[str], now: datetime) -> Grant:
        return await self.authorizations.save_grant(client_id, subject, scopes, now)

    async def get_grant(self, grant_id: str) -> Grant | None:
        return await self.authorizations.get_grant(grant_id)

    async def find_grant(self, client_id: str, subject: Subject) -> Grant | None:
        return await self.authorizations.find_grant(client_id, subject)

    async def list_grants(self, subject: Subject) -> list[Grant]:
        return await self.authorizations.list_grants(subject)

    async def list_client_grants(self, client_id: str, after: str | None = None,
                                 limit: int | None = None) -> list[Grant]:
        return await self.authorizations.list_client_grants(client_id, after, limit)

    async def revoke_client_grants(self, client_id: str, now: datetime, limit: int,
                                   before: datetime | None = None) -> dict[str, list[str] | None]:
        return await self.authorizations.revoke_client_grants(client_id, now, limit, before)

    async def withdraw_scopes(self, client_id: str, kept: list[str]) -> None:
        await self.authorizations.withdraw_scopes(client_id, kept)

    async def mark_grant_revoked(self, grant_id: str, now: datetime, audience: list[str] | None = None) -> bool:
        return await self.authorizations.mark_grant_revoked(grant_id, now, audience)

    async def revoke_grant_families(self, grant_id: str, now: datetime) -> int:
        return await self.authorizations.revoke_grant_families(grant_id, now)

    async def add_code(self, code: AuthorizationCode) -> None:
        await self.authorizations.add_code(code)

    async def get_code(self, code_hash: str) -> AuthorizationCode | None:
        return await self.authorizations.get_code(code_hash)

    async def consume_code(self, code_hash: str, now: datetime, *, family_id: str | None = None,
                           failed: bool = False) -> AuthorizationCode | None:
        return await self.authorizations.consume_code(code_hash, now, family_id=family_id, failed=failed)

    async def create_family(self, family: Family) -> bool:
        return await self.authorizations.create_family(family)

    async def get_family(self, family_id: str) -> tuple[Family | None, Grant | None]:
        return await self.authorizations.get_family(family_id)

    async def family_standing(self, family_id: str) -> Standing:
        return await self.authorizations.family_standing(family_id)

    async def grant_standing(self, client_id: str, subject: Subject,
                             grant_id: str | None = None) -> tuple[Grant | None, User | None]:
        return await self.authorizations.grant_standing(client_id, subject, grant_id)

    async def redeem_code(self, code_hash: str, now: datetime, family_id: str,
                          presented: Presentation) -> AuthorizationCode | None:
        return await self.authorizations.redeem_code(code_hash, now, family_id, presented)

    async def access_standing(self, access_hash: str, family_ids: Sequence[str] = ()) -> Standing:
        return await self.authorizations.access_standing(access_hash, family_ids)

    async def find_access(self, access_hash: str,
                          family_ids: Sequence[str] = ()) -> tuple[Family | None, Grant | None]:
        return await self.authorizations.find_access(access_hash, family_ids)

    async def rotate_family(self, family_id: str, refresh_hash: str, pair: Pair, now: datetime, *,
                            previous_access: tuple[str, datetime] | None = None) -> Family | None:
        return await self.authorizations.rotate_family(family_id, refresh_hash, pair, now,
                                                       previous_access=previous_access)

    async def reissue_pair(self, family_id: str, refresh_hash: str, pair: Pair) -> Family | None:
        return await self.authorizations.reissue_pair(family_id, refresh_hash, pair)

    async def mark_access_used(self, family_id: str, access_hash: str, now: datetime) -> None:
        await self.authorizations.mark_access_used(family_id, access_hash, now)

    async def mark_second_holder(self, family_id: str, now: datetime) -> bool:
        return await self.authorizations.mark_second_holder(family_id, now)

    async def revoke_access(self, family_id: str, access_hash: str, now: datetime,
                            audience: list[str] | None = None) -> bool:
        return await self.authorizations.revoke_access(family_id, access_hash, now, audience)

    async def revoke_family(self, family_id: str, now: datetime, audience: list[str] | None = None) -> bool:
        return await self.authorizations.revoke_family(family_id, now, audience)

    async def families_audience(self, *, grant_id: str | None = None, client_id: str | None = None,
                                user_id: str | None = None, now: datetime | None = None) -> list[str] | None:
        return await self.authorizations.families_audience(grant_id=grant_id, client_id=client_id, user_id=user_id,
                                                           now=now)

    async def list_families(self, grant_id: str) -> list[Family]:
        return await self.authorizations.list_families(grant_id)

    # -- Sessions (sessions.py)

    async def add_session(self, session: Session) -> None:
        await self.sessions.add_session(session)

    async def get_session(self, session_hash: str) -> Session | None:
        return await self.sessions.get_session(session_hash)

    async def end_session(self, session_hash: str, now: datetime) -> bool:
        return await self.sessions.end_session(session_hash, now)

    async def end_user_sessions(self, user_id: str, now: datetime) -> int:
        return await self.sessions.end_user_sessions(user_id, now)

    async def list_user_sessions(self, user_id: str, now: datetime) -> list[Session]:
        return await self.sessions.list_user_sessions(user_id, now)

    async def touch_session(self, session_hash: str, now: datetime) -> None:
        await self.sessions.touch_session(session_hash, now)
