"""The in-memory backend: dictionaries in one process.

For the demo, tests and single-process deployments that may lose their state on
restart. Atomicity comes from asyncio itself: no method awaits between its read and its
write, so no other coroutine can interleave. Every record handed to a caller is its own
copy: changing it changes nothing stored.

The records that grow with traffic (families, codes, sessions and grants) are held as rows
(rows.py), tuples of plain values, which CPython's garbage collector stops tracking after a
collection or two: a full collection then does not walk every live token (docs/performance.md
has the figure). Clients, users and installations are few and stay
dataclasses, copied on the way in and out.
"""

from __future__ import annotations

import bisect
import dataclasses
import secrets
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from tokensvc.identifiers import username_key
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
    utcnow,
)
from tokensvc.storage.base import (
    CODE_RETENTION_SECONDS,
    MARK_AUDIENCE,
    MAX_LISTED_SESSIONS,
    ClientRecord,
    Conflict,
    Removing,
    ResourceTaken,
    Standing,
    Store,
)
from tokensvc.storage.rows import Row, Rows


def _tupled(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


FAMILIES = Rows(Family, lists=("scopes", "audience", "access_audience"))
CODES = Rows(AuthorizationCode, lists=("scopes", "audience"))
SESSIONS = Rows(Session)
GRANTS = Rows(Grant, lists=("scopes",))

copy = dataclasses.replace


def _unmarked(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` without the audience of a mark: one process's own announcement is every relay
    there is."""
    return {name: value for name, value in fields.items() if name != MARK_AUDIENCE}


def _client(client: Client) -> Client:
    scopes = None if client.allowed_scopes is None else list(client.allowed_scopes)
    origins = None if client.allowed_origins is None else list(client.allowed_origins)
    resources = None if client.resources is None else list(client.resources)
    return copy(client, redirect_uris=list(client.redirect_uris), allowed_scopes=scopes, allowed_origins=origins,
                resources=resources)


def _owner(stored: Client | User | Installation | None) -> str | None:
    """The mark a write keeps: the stored entry's (Store.set_owners alone changes it)."""
    return stored.owner if stored is not None else None


def _installation(installation: Installation) -> Installation:
    return copy(installation, operators=list(installation.operators))


def _page(keys: list[str], after: str | None, limit: int | None) -> list[str]:
    """The sorted ``keys`` after ``after``, at most ``limit`` of them."""
    start = bisect.bisect_right(keys, after) if after is not None else 0
    return keys[start:] if limit is None else keys[start:start + limit]


class MemoryStore(Store):
    def __init__(self) -> None:
        self._clients: dict[str, Client] = {}
        self._previous_secrets: dict[str, PreviousSecret] = {}
        self._removals: dict[str, Removal] = {}
        self._users: dict[str, User] = {}
        self._user_ids_by_name: dict[str, str] = {}
        self._user_ids_by_key: dict[str, str] = {}  # identifiers.username_key -> user id: one user per key
        self._installations: dict[str, Installation] = {}
        self._grants: dict[str, Row] = {}  # GRANTS rows
        self._grant_ids: dict[tuple[str, str | None, str | None], str] = {}
        self._codes: dict[str, Row] = {}  # CODES rows
        self._families: dict[str, Row] = {}  # FAMILIES rows
        self._access: dict[str, str] = {}  # a family's current access token hash -> its id
        self._previous_access: dict[str, str] = {}  # the access token hash its last rotation replaced -> its id
        self._grant_families: dict[str, set[str]] = defaultdict(set)
        self._sessions: dict[str, Row] = {}  # SESSIONS rows
        self._user_sessions: dict[str, set[str]] = defaultdict(set)

    async def ping(self) -> None:
        return None

    # -- clients

    async def get_client(self, client_id: str) -> Client | None:
        client = self._clients.get(client_id)
        return None if client is None or client_id in self._removals else _client(client)

    async def declared_resources(self, resources: list[str]) -> set[str]:
        declaring = [set(client.resources or []) for key, client in self._clients.items()
                     if key not in self._removals and client.resource_server]
        return {resource for resource in resources if sum(resource in declared for declared in declaring) == 1}

    def _resources_free(self, client_id: str, resources: Iterable[str] | None) -> None:
        """ResourceTaken when another client's document declares one of ``resources`` (the
        MongoDB store's unique index, whatever the client's kind or removal)."""
        for key, other in self._clients.items():
            taken = set(other.resources or []).intersection(resources or []) if key != client_id else None
            if taken:
                raise ResourceTaken(min(taken))

    async def list_clients(self, after: str | None = None, limit: int | None = None) -> list[Client]:
        keys = sorted(key for key in self._clients if key not in self._removals)
        return [_client(self._clients[key]) for key in _page(keys, after, limit)]

    async def put_client(self, client: Client) -> None:
        self._resources_free(client.client_id, client.resources)
        self._clients[client.client_id] = _client(copy(client, owner=_owner(self._clients.get(client.client_id))))

    async def add_client(self, client: Client) -> None:
        if client.client_id in self._removals:  # the checks and the write with no await between
            raise Removing(f"client id {client.client_id!r} is being removed")
        if client.client_id in self._clients:
            raise Conflict(f"client id {client.client_id!r} is taken")
        self._resources_free(client.client_id, client.resources)
        self._clients[client.client_id] = _client(client)

    async def update_client(self, client_id: str, fields: dict[str, Any], *,
                            if_confidential: bool = False) -> Client | None:
        client = self._clients.get(client_id)
        if client is None or (if_confidential and client.secret_hash is None):
            return None
        if "resources" in fields:
            self._resources_free(client_id, fields["resources"])
        self._clients[client_id] = _client(copy(client, **_unmarked(fields)))
        return _client(client)

    async def set_owners(self, kind: str, owners: Mapping[str, str]) -> dict[str, str]:
        entries: dict[str, Any] = (self._clients if kind == "client" else self._users if kind == "user"
                                   else self._installations)
        taken = {}
        for key, entry in entries.items():
            if entry.owner != owners.get(key):
                if entry.owner is not None:
                    taken[key] = entry.owner
                entries[key] = copy(entry, owner=owners.get(key))
        return taken

    async def withdraw_client(self, removal: Removal) -> None:
        recorded = self._removals.get(removal.client_id)
        if recorded is None or recorded.tag != removal.tag:
            return  # finished already: the id may have been registered (or be removed) again since
        self._clients.pop(removal.client_id, None)  # no registration while the record is there
        self._previous_secrets.pop(removal.client_id, None)

    async def begin_removal(self, client_id: str, now: datetime, tag: str) -> Removal:
        removal = self._removals.setdefault(client_id, Removal(client_id, now, tag))
        return copy(removal)

    async def mark_removal(self, client_id: str, now: datetime, audience: list[str] | None = None) -> None:
        """One process: its own announcement is every relay there is."""

    async def get_removal(self, client_id: str) -> Removal | None:
        removal = self._removals.get(client_id)
        return None if removal is None else copy(removal)

    async def list_removals(self) -> list[Removal]:
        return [copy(removal) for _, removal in sorted(self._removals.items())]

    async def end_removal(self, removal: Removal) -> None:
        recorded = self._removals.get(removal.client_id)
        if recorded is None or recorded.tag != removal.tag:
            return  # finished already: the id may have been registered (or be removed) again since
        self._clients.pop(removal.client_id, None)
        self._previous_secrets.pop(removal.client_id, None)
        del self._removals[removal.client_id]

    async def put_previous_secret(self, previous: PreviousSecret) -> None:
        self._previous_secrets[previous.client_id] = copy(previous)

    async def client_record(self, client_id: str) -> ClientRecord | None:
        client = await self.get_client(client_id)
        return None if client is None else ClientRecord(client, await self.get_previous_secret(client_id))

    async def get_previous_secret(self, client_id: str) -> PreviousSecret | None:
        previous = self._previous_secrets.get(client_id)
        return None if previous is None else copy(previous)

    async def delete_previous_secret(self, client_id: str) -> None:
        self._previous_secrets.pop(client_id, None)

    async def note_previous_secret_use(self, client_id: str, now: datetime, every_seconds: float) -> bool:
        previous = self._previous_secrets.get(client_id)
        if previous is None or (previous.last_used_at is not None
                                and previous.last_used_at > now - timedelta(seconds=every_seconds)):
            return False
        previous.last_used_at = now
        return True

    async def expire_previous_secret(self, now: datetime) -> PreviousSecret | None:
        expired = min(((previous.expires_at, key) for key, previous in self._previous_secrets.items()
                       if previous.expires_at <= now), default=None)
        return None if expired is None else self._previous_secrets.pop(expired[1])

    # -- users

    async def get_user(self, user_id: str) -> User | None:
        user = self._users.get(user_id)
        return None if user is None else copy(user)

    async def get_user_by_username(self, username: str) -> User | None:
        user_id = self._user_ids_by_name.get(username) or self._user_ids_by_key.get(username_key(username))
        return None if user_id is None else await self.get_user(user_id)

    async def list_users(self, after: str | None = None, limit: int | None = None) -> list[User]:
        names = _page(sorted(self._user_ids_by_name), after, limit)
        return [copy(self._users[self._user_ids_by_name[name]]) for name in names]

    async def seed_user(self, user: User, now: datetime) -> User:
        existing = await self.get_user_by_username(user.username)
        if existing is not None:
            narrowed = (existing.admin and not user.admin) or existing.password_hash != user.password_hash
            user = copy(existing, password_hash=user.password_hash, admin=user.admin,
                        narrowed_at=now if narrowed else existing.narrowed_at)
        await self.put_user(user)
        return copy(user)

    async def put_user(self, user: User) -> None:
        key = username_key(user.username)
        owner = self._user_ids_by_key.get(key)
        if owner is not None and owner != user.user_id:
            raise Conflict(f"username {user.username!r} is taken")
        previous = self._users.get(user.user_id)
        if previous is not None:
            self._user_ids_by_name.pop(previous.username, None)
            self._user_ids_by_key.pop(username_key(previous.username), None)
        self._users[user.user_id] = copy(user, owner=_owner(previous))
        self._user_ids_by_name[user.username] = user.user_id
        self._user_ids_by_key[key] = user.user_id

    async def update_user(self, user_id: str, fields: dict[str, Any]) -> User | None:
        user = self._users.get(user_id)
        if user is None:
            return None
        assert "username" not in fields and "user_id" not in fields  # a user's keys stay
        self._users[user_id] = copy(user, **_unmarked(fields))
        return copy(user)

    async def delete_user(self, user_id: str) -> None:
        user = self._users.pop(user_id, None)
        if user is not None:
            self._user_ids_by_name.pop(user.username, None)
            self._user_ids_by_key.pop(username_key(user.username), None)

    # -- installations

    async def get_installation(self, installation_id: str) -> Installation | None:
        installation = self._installations.get(installation_id)
        return None if installation is None else _installation(installation)

    async def list_installations(self, after: str | None = None, limit: int | None = None) -> list[Installation]:
        return [_installation(self._installations[key]) for key in _page(sorted(self._installations), after, limit)]

    async def put_installation(self, installation: Installation) -> None:
        previous = self._installations.get(installation.installation_id)
        self._installations[installation.installation_id] = _installation(copy(installation, owner=_owner(previous)))

    async def delete_installation(self, installation_id: str) -> None:
        self._installations.pop(installation_id, None)

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
            grant = copy(current, scopes=list(scopes), created_at=now, revoked_at=None,
                         generation=current.generation + 1)
        else:
            grant = copy(current, scopes=list(scopes))
        self._grants[grant.grant_id] = GRANTS.pack(grant)
        return GRANTS.unpack_row(self._grants[grant.grant_id])

    async def get_grant(self, grant_id: str) -> Grant | None:
        return GRANTS.unpack(self._grants.get(grant_id))

    async def find_grant(self, client_id: str, subject: Subject) -> Grant | None:
        grant_id = self._grant_ids.get(self._grant_key(client_id, subject))
        return None if grant_id is None else GRANTS.unpack(self._grants.get(grant_id))

    async def list_grants(self, subject: Subject) -> list[Grant]:
        grants = [grant for grant in map(GRANTS.unpack_row, self._grants.values())
                  if grant.revoked_at is None
                  and grant.user_id == subject.user_id and grant.installation_id == subject.installation_id]
        return sorted(grants, key=lambda grant: (grant.created_at, grant.grant_id))

    async def list_client_grants(self, client_id: str, after: str | None = None,
                                 limit: int | None = None) -> list[Grant]:
        grants = {grant.grant_id: grant for grant in map(GRANTS.unpack_row, self._grants.values())
                  if grant.client_id == client_id and grant.revoked_at is None}
        return [grants[grant_id] for grant_id in _page(sorted(grants), after, limit)]

    async def revoke_client_grants(self, client_id: str, now: datetime, limit: int,
                                   before: datetime | None = None) -> dict[str, list[str] | None]:
        revoked = {}
        for grant in [grant for grant in await self.list_client_grants(client_id)
                      if before is None or grant.created_at < before][:limit]:
            revoked[grant.grant_id] = await self.families_audience(grant_id=grant.grant_id, now=now)
            await self.revoke_grant_families(grant.grant_id, now)
            await self.mark_grant_revoked(grant.grant_id, now)
        return revoked

    async def withdraw_scopes(self, client_id: str, kept: list[str]) -> None:
        def narrowed(rows: Rows[Any], table: dict[str, Row], keys: Iterable[str], live: str) -> None:
            for key in keys:
                row = table.get(key)
                if row is None or rows.get(row, "client_id") != client_id or rows.get(row, live) is not None:
                    continue
                held = rows.get(row, "scopes")
                if any(scope not in kept for scope in held):
                    table[key] = rows.updated(row, scopes=tuple(scope for scope in held if scope in kept))

        grant_ids = [key for key, row in self._grants.items() if GRANTS.get(row, "client_id") == client_id]
        narrowed(GRANTS, self._grants, grant_ids, "revoked_at")
        narrowed(CODES, self._codes, list(self._codes), "consumed_at")
        families = [family_id for grant_id in grant_ids for family_id in self._grant_families.get(grant_id, ())]
        narrowed(FAMILIES, self._families, families, "revoked_at")

    async def mark_grant_revoked(self, grant_id: str, now: datetime, audience: list[str] | None = None) -> bool:
        row = self._grants.get(grant_id)
        if row is None or GRANTS.get(row, "revoked_at") is not None:
            return False
        self._grants[grant_id] = GRANTS.updated(row, revoked_at=now)
        return True

    async def revoke_grant_families(self, grant_id: str, now: datetime) -> int:
        return sum([self._revoke_family(family_id, now) for family_id in list(self._grant_families.get(grant_id, ()))])

    # -- codes

    async def add_code(self, code: AuthorizationCode) -> None:
        self._codes[code.code_hash] = CODES.pack(code)

    async def get_code(self, code_hash: str) -> AuthorizationCode | None:
        return CODES.unpack(self._codes.get(code_hash))

    async def consume_code(self, code_hash: str, now: datetime, *, family_id: str | None = None,
                           failed: bool = False) -> AuthorizationCode | None:
        row = self._codes.get(code_hash)
        if row is None or CODES.get(row, "consumed_at") is not None:
            return None
        self._codes[code_hash] = CODES.updated(row, consumed_at=now, spent_by_failure=failed, family_id=family_id)
        return CODES.unpack(row)

    # -- token families

    async def create_family(self, family: Family) -> bool:
        if family.family_id in self._families:
            return False
        self._families[family.family_id] = FAMILIES.pack(family)
        self._access[family.access_hash] = family.family_id
        self._grant_families[family.grant_id].add(family.family_id)
        return True

    async def family_standing(self, family_id: str) -> Standing:
        return await self._standing(*await self.get_family(family_id))

    async def access_standing(self, access_hash: str, family_ids: Sequence[str] = ()) -> Standing:
        return await self._standing(*await self.find_access(access_hash, family_ids))

    async def _standing(self, family: Family | None, grant: Grant | None) -> Standing:
        if family is None:
            return Standing(None)
        user = await self.get_user(family.user_id) if family.user_id is not None else None
        return Standing(family, grant, await self.get_client(family.client_id), user)

    def _with_grant(self, row: Row | None) -> tuple[Family | None, Grant | None]:
        if row is None:
            return None, None
        return FAMILIES.unpack(row), GRANTS.unpack(self._grants.get(FAMILIES.get(row, "grant_id")))

    async def get_family(self, family_id: str) -> tuple[Family | None, Grant | None]:
        return self._with_grant(self._families.get(family_id))

    async def find_access(self, access_hash: str,
                          family_ids: Sequence[str] = ()) -> tuple[Family | None, Grant | None]:
        family_id = self._access.get(access_hash) or self._previous_access.get(access_hash)
        if family_ids and family_id not in family_ids:
            family_id = None
        return self._with_grant(None if family_id is None else self._families.get(family_id))

    def _replace_pair(self, family_id: str, row: Row, pair: Pair, **changes: Any) -> Family:
        self._access.pop(FAMILIES.get(row, "access_hash"), None)
        self._access[pair.access_hash] = family_id
        updated = FAMILIES.updated(row, refresh_hash=pair.refresh_hash, access_hash=pair.access_hash,
                                   scopes=tuple(pair.scopes), issued_at=pair.issued_at, expires_at=pair.expires_at,
                                   access_expires_at=pair.access_expires_at, access_used_at=None,
                                   access_revoked_at=None, serial=pair.serial, key_id=pair.key_id, salt=pair.salt,
                                   access_audience=_tupled(pair.access_audience), **changes)
        self._families[family_id] = updated
        return FAMILIES.unpack_row(updated)

    async def rotate_family(self, family_id: str, refresh_hash: str, pair: Pair, now: datetime, *,
                            previous_access: tuple[str, datetime] | None = None) -> Family | None:
        row = self._families.get(family_id)
        if (row is None or FAMILIES.get(row, "refresh_hash") != refresh_hash
                or FAMILIES.get(row, "revoked_at") is not None or FAMILIES.get(row, "expires_at") <= now
                or (previous_access is not None and FAMILIES.get(row, "access_hash") != previous_access[0])):
            return None
        self._previous_access.pop(FAMILIES.get(row, "previous_access_hash"), None)
        replaced_hash, replaced_expiry = previous_access or (None, None)
        if replaced_hash is not None:
            self._previous_access[replaced_hash] = family_id
        return self._replace_pair(family_id, row, pair, previous_hash=refresh_hash, renewed_at=now,
                                  rotations=FAMILIES.get(row, "rotations") + 1, previous_access_hash=replaced_hash,
                                  previous_access_expires_at=replaced_expiry)

    async def reissue_pair(self, family_id: str, refresh_hash: str, pair: Pair) -> Family | None:
        row = self._families.get(family_id)
        if (row is None or FAMILIES.get(row, "refresh_hash") != refresh_hash
                or FAMILIES.get(row, "access_used_at") is not None or FAMILIES.get(row, "revoked_at") is not None):
            return None
        return self._replace_pair(family_id, row, pair)

    async def mark_access_used(self, family_id: str, access_hash: str, now: datetime) -> None:
        row = self._families.get(family_id)
        if (row is not None and FAMILIES.get(row, "access_hash") == access_hash
                and FAMILIES.get(row, "access_used_at") is None):
            self._families[family_id] = FAMILIES.updated(row, access_used_at=now)

    async def mark_second_holder(self, family_id: str, now: datetime) -> bool:
        row = self._families.get(family_id)
        if row is None or FAMILIES.get(row, "second_holder_at") is not None:
            return False
        self._families[family_id] = FAMILIES.updated(row, second_holder_at=now)
        return True

    async def revoke_access(self, family_id: str, access_hash: str, now: datetime,
                            audience: list[str] | None = None) -> bool:
        row = self._families.get(family_id)
        if (row is None or FAMILIES.get(row, "access_hash") != access_hash
                or FAMILIES.get(row, "access_revoked_at") is not None):
            return False
        self._families[family_id] = FAMILIES.updated(row, access_revoked_at=now, access_used_at=now)
        return True

    def _revoke_family(self, family_id: str, now: datetime) -> bool:
        row = self._families.get(family_id)
        if row is None or FAMILIES.get(row, "revoked_at") is not None:
            return False
        self._families[family_id] = FAMILIES.updated(row, revoked_at=now)
        return True

    async def revoke_family(self, family_id: str, now: datetime, audience: list[str] | None = None) -> bool:
        return self._revoke_family(family_id, now)

    async def families_audience(self, *, grant_id: str | None = None, client_id: str | None = None,
                                user_id: str | None = None, now: datetime | None = None) -> list[str] | None:
        if grant_id is not None:
            grant_ids: Iterable[str] = (grant_id,)
        else:
            grant_ids = [key for key, row in self._grants.items() if GRANTS.get(row, "revoked_at") is None
                         and (GRANTS.get(row, "client_id") == client_id if client_id is not None
                              else GRANTS.get(row, "user_id") == user_id)]
        at = now or utcnow()
        together: set[str] = set()
        for family_id in (family_id for key in grant_ids for family_id in self._grant_families.get(key, ())):
            row = self._families.get(family_id)
            if row is None or FAMILIES.get(row, "revoked_at") is not None or FAMILIES.get(row, "expires_at") <= at:
                continue  # dead: its tokens are refused already, and were announced when it died
            audience = FAMILIES.get(row, "audience")
            if audience is None:
                return None
            together.update(audience)
        return sorted(together)

    async def list_families(self, grant_id: str) -> list[Family]:
        families = [FAMILIES.unpack(self._families[family_id]) for family_id in self._grant_families.get(grant_id, ())]
        live = [family for family in families if family is not None and family.revoked_at is None]
        return sorted(live, key=lambda family: (family.created_at, family.family_id))

    # -- sessions

    async def add_session(self, session: Session) -> None:
        self._sessions[session.session_hash] = SESSIONS.pack(session)
        self._user_sessions[session.user_id].add(session.session_hash)

    async def get_session(self, session_hash: str) -> Session | None:
        session = SESSIONS.unpack(self._sessions.get(session_hash))
        return None if session is None or session.ended_at is not None else session

    async def end_session(self, session_hash: str, now: datetime) -> bool:
        row = self._sessions.get(session_hash)
        if row is None or SESSIONS.get(row, "ended_at") is not None:
            return False
        self._sessions[session_hash] = SESSIONS.updated(row, ended_at=now)
        return True

    async def list_user_sessions(self, user_id: str, now: datetime) -> list[Session]:
        sessions = [session for key in self._user_sessions.get(user_id, ())
                    if (session := SESSIONS.unpack_row(self._sessions[key])).ended_at is None
                    and session.expires_at > now]
        newest = sorted(sessions, key=lambda s: (s.last_seen_at or s.created_at, s.session_hash), reverse=True)
        return newest[:MAX_LISTED_SESSIONS]

    async def touch_session(self, session_hash: str, now: datetime) -> None:
        row = self._sessions.get(session_hash)
        if row is not None:
            self._sessions[session_hash] = SESSIONS.updated(row, last_seen_at=now)

    async def end_user_sessions(self, user_id: str, now: datetime) -> int:
        ended = [await self.end_session(session_hash, now)
                 for session_hash in list(self._user_sessions.get(user_id, ()))]
        return sum(ended)

    # -- housekeeping

    async def purge_expired(self, now: datetime) -> dict[str, int]:
        kept_until = now - timedelta(seconds=CODE_RETENTION_SECONDS)
        codes = [key for key, row in self._codes.items()
                 if CODES.get(row, "expires_at") <= (now if CODES.get(row, "consumed_at") is None else kept_until)]
        for key in codes:
            del self._codes[key]
        families = [key for key, row in self._families.items() if FAMILIES.get(row, "expires_at") <= now]
        for key in families:
            row = self._families.pop(key)
            self._access.pop(FAMILIES.get(row, "access_hash"), None)
            self._previous_access.pop(FAMILIES.get(row, "previous_access_hash"), None)
            self._grant_families[FAMILIES.get(row, "grant_id")].discard(key)
        sessions = [key for key, row in self._sessions.items() if SESSIONS.get(row, "expires_at") <= now]
        for key in sessions:
            self._user_sessions[SESSIONS.get(self._sessions.pop(key), "user_id")].discard(key)
        return {"codes": len(codes), "families": len(families), "sessions": len(sessions)}
