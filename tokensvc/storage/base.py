"""The storage contract: one :class:`Store` interface, one implementation per backend.

Every method is a coroutine. Each operation that must be atomic (consuming a code,
rotating a refresh token) is one method here, and each backend implements it as one
atomic step: of two concurrent calls with the same code or token, exactly one wins.

A backend raises :class:`StorageError` (and nothing else) when it cannot answer; the web
layer maps that single exception to 503.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Collection
from datetime import datetime

from tokensvc.records import (
    REFRESH,
    AuthorizationCode,
    Client,
    Grant,
    Installation,
    Session,
    Subject,
    Token,
    User,
)


class StorageError(Exception):
    """The store did not answer (unreachable, timed out, failed mid-operation)."""


class Conflict(Exception):
    """A unique key is taken (a username that another user already has)."""


class StoreFault(Exception):
    """The store answered with a refusal that retrying will not change: failed
    authentication, a document it will not take, an index that conflicts. The operator has
    to act; requests get 500 (no ``Retry-After``, which would promise a recovery)."""


# Consumed codes are kept this long past their expiry, so that a replay within that time is
# still recognised (and revokes the grant) instead of looking like an unknown code.
CODE_RETENTION_SECONDS = 3600


class Store(abc.ABC):
    """Everything the protocol layer, the handlers and the CLI ask of storage."""

    # False while ``bootstrap.prepare`` opens and seeds the store at start-up; ``/readyz``
    # answers 503 until then. A store its creator prepares itself (tests, the CLI) is ready.
    prepared: bool = True

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Prepare the backend (create indexes, ...). Called once at start-up."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Called at shutdown."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise StorageError unless the store answers. Used by ``/readyz``."""

    # -- clients: client lookup on every token endpoint, the client endpoints, the CLI

    @abc.abstractmethod
    async def get_client(self, client_id: str) -> Client | None:
        """The registered client, or None."""

    @abc.abstractmethod
    async def list_clients(self) -> list[Client]:
        """Every registered client, ordered by client_id."""

    @abc.abstractmethod
    async def put_client(self, client: Client) -> None:
        """Insert or replace the client with this client_id (config seeding, CLI)."""

    @abc.abstractmethod
    async def delete_client(self, client_id: str) -> bool:
        """Remove a client; True when it existed (CLI)."""

    # -- users: login, /v1/me, introspection's ``username``, the CLI

    @abc.abstractmethod
    async def get_user(self, user_id: str) -> User | None: ...

    @abc.abstractmethod
    async def get_user_by_username(self, username: str) -> User | None: ...

    @abc.abstractmethod
    async def list_users(self) -> list[User]:
        """Every user, ordered by username."""

    @abc.abstractmethod
    async def seed_user(self, user: User) -> User:
        """Upsert on the username: an existing user keeps its id and takes ``user``'s password
        hash and admin flag; otherwise ``user`` is added. Returns the stored user. Several
        processes seeding one empty database at once all succeed, with one user per name."""

    @abc.abstractmethod
    async def put_user(self, user: User) -> None:
        """Insert or replace the user with this user_id. Usernames are unique: Conflict."""

    @abc.abstractmethod
    async def delete_user(self, user_id: str) -> bool: ...

    # -- node installations: pairing at /oauth/authorize, the CLI

    @abc.abstractmethod
    async def get_installation(self, installation_id: str) -> Installation | None: ...

    @abc.abstractmethod
    async def list_installations(self) -> list[Installation]: ...

    @abc.abstractmethod
    async def put_installation(self, installation: Installation) -> None: ...

    @abc.abstractmethod
    async def delete_installation(self, installation_id: str) -> bool: ...

    # -- grants: one per (subject, client); created at code exchange, revoked by reuse
    #    detection, /oauth/revoke and the connected-apps endpoint

    @abc.abstractmethod
    async def save_grant(self, client_id: str, subject: Subject, scopes: list[str], now: datetime) -> Grant:
        """Create the (subject, client) grant, or reactivate it with these scopes.

        The grant_id of an existing grant is kept; created_at is reset when the grant was
        revoked (a fresh consent), and so is revoked_at.
        """

    @abc.abstractmethod
    async def get_grant(self, grant_id: str) -> Grant | None: ...

    @abc.abstractmethod
    async def find_grant(self, client_id: str, subject: Subject) -> Grant | None: ...

    @abc.abstractmethod
    async def list_grants(self, subject: Subject) -> list[Grant]:
        """The active (unrevoked) grants of a subject, oldest first (connected apps)."""

    @abc.abstractmethod
    async def list_client_grants(self, client_id: str) -> list[Grant]:
        """The active grants held by a client (``clients remove`` revokes them)."""

    @abc.abstractmethod
    async def revoke_grant(self, grant_id: str, now: datetime) -> int:
        """Mark the grant revoked, then revoke every unrevoked token of it. Returns the token count.

        The grant is marked first so that a token minted concurrently is caught either by
        this sweep or by the minting side's check of the grant afterwards.
        """

    # -- authorization codes: /oauth/authorize issues, /oauth/token consumes

    @abc.abstractmethod
    async def add_code(self, code: AuthorizationCode) -> None: ...

    @abc.abstractmethod
    async def get_code(self, code_hash: str) -> AuthorizationCode | None: ...

    @abc.abstractmethod
    async def consume_code(self, code_hash: str, now: datetime, *, failed: bool = False) -> AuthorizationCode | None:
        """Atomically mark an unconsumed code consumed (``failed``: spent by a failed check, not
        redeemed); return it as it was before.

        None when the code is unknown or was already consumed: exactly one of concurrent
        callers gets the record.
        """

    # -- tokens: minted at exchange and refresh; looked up by introspection and bearer auth

    @abc.abstractmethod
    async def add_tokens(self, tokens: list[Token]) -> None: ...

    @abc.abstractmethod
    async def get_token(self, token_hash: str) -> Token | None: ...

    @abc.abstractmethod
    async def get_token_and_grant(self, token_hash: str) -> tuple[Token | None, Grant | None]:
        """A token and its grant, in one round trip (bearer auth and introspection decide
        with both: :meth:`Token.in_force`)."""

    @abc.abstractmethod
    async def rotate_refresh_token(self, token_hash: str, client_id: str, now: datetime) -> Token | None:
        """Atomically mark a current refresh token rotated out; return it as it was before.

        Only an unexpired refresh token of ``client_id`` that is neither rotated nor
        revoked qualifies. Exactly one of concurrent callers gets the record.
        """

    @abc.abstractmethod
    async def revoke_token(self, token_hash: str, now: datetime) -> bool:
        """Mark one token revoked; True when it was unrevoked before."""

    @abc.abstractmethod
    async def revoke_grant_tokens(self, grant_id: str, now: datetime, token_type: str | None = None) -> int:
        """Revoke the unrevoked tokens of a grant (of one type, or all). Returns the count."""

    @abc.abstractmethod
    async def revoke_children(self, parent_hash: str, now: datetime, keep: Collection[str] = ()) -> int:
        """Revoke the tokens minted from ``parent_hash`` (its rotations), but those in ``keep``.

        Used by the refresh grace period. Returns the count.
        """

    @abc.abstractmethod
    async def list_children(self, parent_hash: str) -> list[Token]:
        """The tokens minted from ``parent_hash`` (its rotations), oldest first: by
        ``issued_at``, then by ``token_hash`` (the same order on every backend)."""

    async def find_child_refresh(self, parent_hash: str) -> Token | None:
        """A refresh token minted from ``parent_hash``: the current one (neither rotated nor
        revoked) if there is one, else the newest; None when there is none. One definition
        for every backend, over :meth:`list_children`."""
        children = [token for token in await self.list_children(parent_hash) if token.token_type == REFRESH]
        current = [token for token in children if token.rotated_at is None and token.revoked_at is None]
        return (current or children)[-1] if children else None

    # -- web sessions: the ``<service>_session`` cookie

    @abc.abstractmethod
    async def add_session(self, session: Session) -> None: ...

    @abc.abstractmethod
    async def get_session(self, session_hash: str) -> Session | None: ...

    @abc.abstractmethod
    async def delete_session(self, session_hash: str) -> bool: ...

    @abc.abstractmethod
    async def delete_user_sessions(self, user_id: str) -> int:
        """End every web session of a user (a password set, the user removed); the count."""

    # -- revocations across processes

    async def revocation_feed(self) -> AsyncIterator[None]:
        """Yields whenever any process sharing this store revokes something (a token, a
        grant, a session), so that this process re-checks its open WebSockets. A store only
        one process uses (memory) never yields: that process's own announcements suffice."""
        return
        yield  # an async generator that ends at once

    # -- housekeeping

    @abc.abstractmethod
    async def purge_expired(self, now: datetime) -> dict[str, int]:
        """Delete expired tokens and sessions, and expired codes: unconsumed ones at once,
        consumed ones :data:`CODE_RETENTION_SECONDS` after their expiry (replay detection);
        counts per kind (``tokens purge``)."""
