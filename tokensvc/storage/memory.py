"""The in-memory backend: dictionaries in one process.

For the demo, tests and single-process deployments that may lose their state on
restart. Atomicity comes from asyncio itself: no method awaits between its read and its
write, so no other coroutine can interleave. Stored values are never changed in place; an
update stores a new one, so a record handed to a caller is a stable snapshot.

The records that grow with traffic (tokens, codes, sessions and grants) are held as
:class:`Rows`, tuples of plain values. CPython's garbage collector stops tracking such a
tuple, and a dict holding only such tuples, after a collection or two. A full collection over
500,000 token dataclasses took 171 ms here, a pause for every request in flight that came back
every few tens of thousands of token requests; over the same tokens as rows it took 2 ms.
Clients, users and installations are few and stay dataclasses.
"""

from __future__ import annotations

import dataclasses
import operator
import secrets
from collections import defaultdict
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

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
from tokensvc.storage.base import CODE_RETENTION_SECONDS, Conflict, Store

R = TypeVar("R")
Row = tuple[Any, ...]


class Rows(Generic[R]):
    """How the store holds one record type: a tuple of its field values in field order,
    list fields as tuples (so that nothing in the row is a container the collector tracks)."""

    def __init__(self, cls: type[R], lists: tuple[str, ...] = ()) -> None:
        names = [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]
        self.cls = cls
        self.index = {name: position for position, name in enumerate(names)}
        self._lists = tuple(self.index[name] for name in lists)
        self._values = operator.attrgetter(*names)

    def pack(self, record: R) -> Row:
        values = self._values(record)
        if not self._lists:
            return values
        items = list(values)
        for position in self._lists:
            if items[position] is not None:
                items[position] = tuple(items[position])
        return tuple(items)

    def unpack(self, row: Row | None) -> R | None:
        if row is None:
            return None
        if not self._lists:
            return self.cls(*row)
        items = list(row)
        for position in self._lists:
            if items[position] is not None:
                items[position] = list(items[position])
        return self.cls(*items)

    def get(self, row: Row, name: str) -> Any:
        return row[self.index[name]]

    def updated(self, row: Row, **changes: Any) -> Row:
        items = list(row)
        for name, value in changes.items():
            items[self.index[name]] = value
        return tuple(items)


TOKENS = Rows(Token, lists=("scopes",))
CODES = Rows(AuthorizationCode, lists=("scopes",))
SESSIONS = Rows(Session)
GRANTS = Rows(Grant, lists=("scopes",))


class MemoryStore(Store):
    def __init__(self) -> None:
        self._clients: dict[str, Client] = {}
        self._users: dict[str, User] = {}
        self._user_ids_by_name: dict[str, str] = {}
        self._installations: dict[str, Installation] = {}
        self._grants: dict[str, Row] = {}  # GRANTS rows
        self._grant_ids: dict[tuple[str, str | None, str | None], str] = {}
        self._codes: dict[str, Row] = {}  # CODES rows
        self._tokens: dict[str, Row] = {}  # TOKENS rows
        self._tokens_by_grant: dict[str, set[str]] = defaultdict(set)
        self._children: dict[str, tuple[str, ...]] = {}  # parent refresh token -> what its rotation minted
        self._sessions: dict[str, Row] = {}  # SESSIONS rows

    async def ping(self) -> None:
        return None

    # -- clients

    async def get_client(self, client_id: str) -> Client | None:
        return self._clients.get(client_id)

    async def list_clients(self) -> list[Client]:
        return [self._clients[key] for key in sorted(self._clients)]

    async def put_client(self, client: Client) -> None:
        self._clients[client.client_id] = dataclasses.replace(client)

    async def delete_client(self, client_id: str) -> bool:
        return self._clients.pop(client_id, None) is not None

    # -- users

    async def get_user(self, user_id: str) -> User | None:
        return self._users.get(user_id)

    async def get_user_by_username(self, username: str) -> User | None:
        user_id = self._user_ids_by_name.get(username)
        return None if user_id is None else self._users.get(user_id)

    async def list_users(self) -> list[User]:
        return sorted(self._users.values(), key=lambda user: user.username)

    async def seed_user(self, user: User) -> User:
        existing = await self.get_user_by_username(user.username)
        if existing is not None:
            user = dataclasses.replace(existing, password_hash=user.password_hash, admin=user.admin)
        await self.put_user(user)
        return user

    async def put_user(self, user: User) -> None:
        owner = self._user_ids_by_name.get(user.username)
        if owner is not None and owner != user.user_id:
            raise Conflict(f"username {user.username!r} is taken")
        previous = self._users.get(user.user_id)
        if previous is not None:
            self._user_ids_by_name.pop(previous.username, None)
        self._users[user.user_id] = dataclasses.replace(user)
        self._user_ids_by_name[user.username] = user.user_id

    async def delete_user(self, user_id: str) -> bool:
        user = self._users.pop(user_id, None)
        if user is None:
            return False
        self._user_ids_by_name.pop(user.username, None)
        return True

    # -- installations

    async def get_installation(self, installation_id: str) -> Installation | None:
        return self._installations.get(installation_id)

    async def list_installations(self) -> list[Installation]:
        return [self._installations[key] for key in sorted(self._installations)]

    async def put_installation(self, installation: Installation) -> None:
        self._installations[installation.installation_id] = dataclasses.replace(installation, operators=list(installation.operators))

    async def delete_installation(self, installation_id: str) -> bool:
        return self._installations.pop(installation_id, None) is not None

    # -- grants

    @staticmethod
    def _grant_key(client_id: str, subject: Subject) -> tuple[str, str | None, str | None]:
        return (client_id, subject.user_id, subject.installation_id)

    async def save_grant(self, client_id: str, subject: Subject, scopes: list[str], now: datetime) -> Grant:
        key = self._grant_key(client_id, subject)
        grant_id = self._grant_ids.get(key)
        current = GRANTS.unpack(self._grants.get(grant_id)) if grant_id else None
        if current is None:
            grant = Grant(secrets.token_hex(16), client_id, subject.user_id, subject.installation_id,
                          list(scopes), now)
            self._grant_ids[key] = grant.grant_id
        elif current.revoked_at is not None:
            grant = dataclasses.replace(current, scopes=list(scopes), created_at=now, revoked_at=None,
                                        generation=current.generation + 1)
        else:
            grant = dataclasses.replace(current, scopes=list(scopes))
        self._grants[grant.grant_id] = GRANTS.pack(grant)
        return grant

    async def get_grant(self, grant_id: str) -> Grant | None:
        return GRANTS.unpack(self._grants.get(grant_id))

    async def find_grant(self, client_id: str, subject: Subject) -> Grant | None:
        grant_id = self._grant_ids.get(self._grant_key(client_id, subject))
        return None if grant_id is None else GRANTS.unpack(self._grants.get(grant_id))

    async def list_grants(self, subject: Subject) -> list[Grant]:
        grants = [grant for grant in map(GRANTS.unpack, self._grants.values())
                  if grant.revoked_at is None
                  and grant.user_id == subject.user_id and grant.installation_id == subject.installation_id]
        return sorted(grants, key=lambda grant: (grant.created_at, grant.grant_id))

    async def list_client_grants(self, client_id: str) -> list[Grant]:
        grants = [grant for grant in map(GRANTS.unpack, self._grants.values())
                  if grant.client_id == client_id and grant.revoked_at is None]
        return sorted(grants, key=lambda grant: (grant.created_at, grant.grant_id))

    async def revoke_grant(self, grant_id: str, now: datetime) -> int:
        row = self._grants.get(grant_id)
        if row is not None and GRANTS.get(row, "revoked_at") is None:
            self._grants[grant_id] = GRANTS.updated(row, revoked_at=now)
        return await self.revoke_grant_tokens(grant_id, now)

    # -- codes

    async def add_code(self, code: AuthorizationCode) -> None:
        self._codes[code.code_hash] = CODES.pack(code)

    async def get_code(self, code_hash: str) -> AuthorizationCode | None:
        return CODES.unpack(self._codes.get(code_hash))

    async def consume_code(self, code_hash: str, now: datetime, *, failed: bool = False) -> AuthorizationCode | None:
        row = self._codes.get(code_hash)
        if row is None or CODES.get(row, "consumed_at") is not None:
            return None
        self._codes[code_hash] = CODES.updated(row, consumed_at=now, spent_by_failure=failed)
        return CODES.unpack(row)

    # -- tokens

    async def add_tokens(self, tokens: list[Token]) -> None:
        for token in tokens:
            self._tokens[token.token_hash] = TOKENS.pack(token)
            self._tokens_by_grant[token.grant_id].add(token.token_hash)
            if token.parent_hash is not None:
                self._children[token.parent_hash] = self._children.get(token.parent_hash, ()) + (token.token_hash,)

    async def get_token(self, token_hash: str) -> Token | None:
        return TOKENS.unpack(self._tokens.get(token_hash))

    async def get_token_and_grant(self, token_hash: str) -> tuple[Token | None, Grant | None]:
        row = self._tokens.get(token_hash)
        if row is None:
            return None, None
        return TOKENS.unpack(row), GRANTS.unpack(self._grants.get(TOKENS.get(row, "grant_id")))

    async def rotate_refresh_token(self, token_hash: str, client_id: str, now: datetime) -> Token | None:
        row = self._tokens.get(token_hash)
        token = TOKENS.unpack(row)
        if (token is None or token.token_type != REFRESH or token.client_id != client_id
                or token.rotated_at is not None or token.revoked_at is not None or token.expires_at <= now):
            return None
        self._tokens[token_hash] = TOKENS.updated(row, rotated_at=now)
        return token

    def _revoke(self, token_hash: str, now: datetime) -> bool:
        row = self._tokens.get(token_hash)
        if row is None or TOKENS.get(row, "revoked_at") is not None:
            return False
        self._tokens[token_hash] = TOKENS.updated(row, revoked_at=now)
        return True

    async def revoke_token(self, token_hash: str, now: datetime) -> bool:
        return self._revoke(token_hash, now)

    async def revoke_grant_tokens(self, grant_id: str, now: datetime, token_type: str | None = None) -> int:
        hashes = [
            token_hash for token_hash in self._tokens_by_grant.get(grant_id, ())
            if token_type is None or TOKENS.get(self._tokens[token_hash], "token_type") == token_type
        ]
        return sum(self._revoke(token_hash, now) for token_hash in hashes)

    async def revoke_children(self, parent_hash: str, now: datetime, keep: Collection[str] = ()) -> int:
        return sum(self._revoke(token_hash, now) for token_hash in self._children.get(parent_hash, ())
                   if token_hash not in keep)

    async def list_children(self, parent_hash: str) -> list[Token]:
        children = [TOKENS.unpack(self._tokens[token_hash]) for token_hash in self._children.get(parent_hash, ())]
        return sorted(children, key=lambda token: (token.issued_at, token.token_hash))  # type: ignore[union-attr]

    # -- sessions

    async def add_session(self, session: Session) -> None:
        self._sessions[session.session_hash] = SESSIONS.pack(session)

    async def get_session(self, session_hash: str) -> Session | None:
        return SESSIONS.unpack(self._sessions.get(session_hash))

    async def delete_session(self, session_hash: str) -> bool:
        return self._sessions.pop(session_hash, None) is not None

    async def delete_user_sessions(self, user_id: str) -> int:
        ended = [key for key, row in self._sessions.items() if SESSIONS.get(row, "user_id") == user_id]
        for key in ended:
            del self._sessions[key]
        return len(ended)

    # -- housekeeping

    async def purge_expired(self, now: datetime) -> dict[str, int]:
        kept_until = now - timedelta(seconds=CODE_RETENTION_SECONDS)
        codes = [key for key, row in self._codes.items()
                 if CODES.get(row, "expires_at") <= (now if CODES.get(row, "consumed_at") is None else kept_until)]
        for key in codes:
            del self._codes[key]
        tokens = [key for key, row in self._tokens.items() if TOKENS.get(row, "expires_at") <= now]
        for key in tokens:
            token = TOKENS.unpack(self._tokens.pop(key))
            self._tokens_by_grant[token.grant_id].discard(key)
            siblings = self._children.get(token.parent_hash) if token.parent_hash is not None else None
            if siblings and key in siblings:
                self._children[token.parent_hash] = tuple(other for other in siblings if other != key)
        sessions = [key for key, row in self._sessions.items() if SESSIONS.get(row, "expires_at") <= now]
        for key in sessions:
            del self._sessions[key]
        return {"codes": len(codes), "tokens": len(tokens), "sessions": len(sessions)}
