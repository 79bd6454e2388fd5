"""Operator actions on the registry: clients, users, node installations, housekeeping.

The CLI is a thin shell over these. Each action validates its input (raising
:class:`AdminError` with a message for a person), writes through the Store, revokes what
a removal leaves behind, and leaves one audit record (never a secret).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence

from tokensvc import logs
from tokensvc.bootstrap import new_user_id
from tokensvc.identifiers import (
    id_problem,
    is_url,
    kind_problem,
    origin_problem,
    password_problem,
    redirect_uri_problem,
    scope_problem,
    username_problem,
)
from tokensvc.oauth import hashing
from tokensvc.oauth import sessions as web_sessions
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.revocation import revoke_grant
from tokensvc.records import Client, Installation, Subject, User, utcnow
from tokensvc.storage.base import Conflict, Store


class AdminError(Exception):
    """An operator's mistake: the message says what to fix."""


def _record(event: str, **fields: object) -> None:
    logs.audit(event, fields)


def _check(problem: str | None, what: str, value: str) -> None:
    """AdminError naming ``problem`` (one of identifiers' rules), if there is one."""
    if problem is not None:
        raise AdminError(f"not a valid {what} ({problem}): {value!r}")


def check_redirect_uri(uri: str) -> str:
    problem = redirect_uri_problem(uri)
    if problem is not None:
        raise AdminError(f"not a valid redirect URI ({problem}): {uri!r}")
    return uri


def check_url(uri: str) -> str:
    if not is_url(uri):
        raise AdminError(f"not a valid http(s) URL: {uri!r}")
    return uri


async def create_client(store: Store, *, name: str, redirect_uris: list[str], scopes: list[str] | None,
                        first_party: bool = False, confidential: bool = False, description: str | None = None,
                        logo_url: str | None = None, client_id: str | None = None,
                        allowed_origins: list[str] | None = None) -> tuple[Client, str | None]:
    """Register a client; returns it and, for a confidential one, its secret (shown once)."""
    name = name.strip()
    if not name:
        raise AdminError("a client needs a name")
    if not redirect_uris:
        raise AdminError("a client needs at least one --redirect-uri")
    for uri in redirect_uris:
        check_redirect_uri(uri)
    for scope in scopes or []:
        _check(scope_problem(scope), "scope", scope)
    if logo_url is not None:
        check_url(logo_url)
    for origin in allowed_origins or []:
        _check(origin_problem(origin), "web origin", origin)
    # Hex: a generated id never starts with "-" (which a command line would read as an option).
    client_id = client_id or secrets.token_hex(12)
    _check(id_problem(client_id), "client id", client_id)
    existing = await store.list_clients()
    if any(client.client_id == client_id for client in existing):
        raise AdminError(f"a client with id {client_id!r} already exists")
    if any(client.name.lower() == name.lower() for client in existing):
        raise AdminError(f"a client named {name!r} already exists")
    secret = hashing.new_secret() if confidential else None
    client = Client(client_id=client_id, name=name, redirect_uris=list(redirect_uris),
                    allowed_scopes=list(scopes) if scopes else None,
                    secret_hash=hashing.digest(secret) if secret else None, first_party=first_party,
                    description=description, logo_url=logo_url, created_at=utcnow(),
                    allowed_origins=list(allowed_origins) if allowed_origins else None)
    await store.put_client(client)
    _record("client_created", client_id=client_id, first_party=first_party, confidential=confidential,
            outcome="success")
    return client, secret


async def get_client(store: Store, client_id: str) -> Client:
    client = await store.get_client(client_id)
    if client is None:
        raise AdminError(f"no client with id {client_id!r}")
    return client


async def rotate_secret(store: Store, client_id: str) -> str:
    client = await get_client(store, client_id)
    if not client.confidential:
        raise AdminError(f"client {client_id!r} is public: it has no secret to rotate")
    secret = hashing.new_secret()
    client.secret_hash = hashing.digest(secret)
    await store.put_client(client)
    _record("client_secret_rotated", client_id=client_id, outcome="success")
    return secret


async def remove_client(ctx: OAuthContext, client_id: str) -> int:
    """Delete a client after revoking every grant (and token) it holds; the families revoked."""
    await get_client(ctx.store, client_id)
    revoked = 0
    for grant in await ctx.store.list_client_grants(client_id):
        revoked += await revoke_grant(ctx, grant.grant_id, "admin")
    await ctx.store.delete_client(client_id)
    _record("client_removed", client_id=client_id, families_revoked=revoked, outcome="success")
    return revoked


async def _hash_password(password: str, context: Sequence[str]) -> str:
    problem = password_problem(password, context)
    if problem is not None:
        raise AdminError(problem)
    return await asyncio.get_running_loop().run_in_executor(None, hashing.hash_password, password)


async def create_user(store: Store, username: str, password: str, *, admin: bool = False,
                      service_name: str = "tokensvc") -> User:
    _check(username_problem(username), "username", username)
    if await store.get_user_by_username(username) is not None:
        raise AdminError(f"a user named {username!r} already exists")
    user = User(new_user_id(), username, await _hash_password(password, [username, service_name]), admin)
    try:
        await store.put_user(user)
    except Conflict:
        raise AdminError(f"a user named {username!r} already exists") from None
    _record("user_created", subject=user.user_id, username=username, admin=admin, outcome="success")
    return user


async def get_user(store: Store, username: str) -> User:
    user = await store.get_user_by_username(username)
    if user is None:
        raise AdminError(f"no user named {username!r}")
    return user


async def set_password(ctx: OAuthContext, username: str, password: str, *, keep_grants: bool = False,
                       service_name: str = "tokensvc") -> dict[str, int]:
    """A new password ends the user's web sessions and, unless ``keep_grants``, revokes every
    grant (and token) of theirs: whoever knew the old password is out everywhere."""
    user = await get_user(ctx.store, username)
    user.password_hash = await _hash_password(password, [username, service_name])
    await ctx.store.put_user(user)
    sessions = await web_sessions.end_all(ctx, user.user_id)
    revoked = 0
    if not keep_grants:
        for grant in await ctx.store.list_grants(Subject(user_id=user.user_id)):
            revoked += await revoke_grant(ctx, grant.grant_id, "admin")
    _record("user_password_set", subject=user.user_id, username=username, sessions_ended=sessions,
            families_revoked=revoked, outcome="success")
    return {"sessions_ended": sessions, "families_revoked": revoked}


async def remove_user(ctx: OAuthContext, username: str) -> int:
    """Delete a user after revoking every grant (and token) of theirs."""
    user = await get_user(ctx.store, username)
    revoked = 0
    for grant in await ctx.store.list_grants(Subject(user_id=user.user_id)):
        revoked += await revoke_grant(ctx, grant.grant_id, "admin")
    await web_sessions.end_all(ctx, user.user_id)
    await ctx.store.delete_user(user.user_id)
    _record("user_removed", subject=user.user_id, username=username, families_revoked=revoked, outcome="success")
    return revoked


async def create_installation(store: Store, installation_id: str, name: str, kind: str,
                              operators: list[str]) -> Installation:
    _check(id_problem(installation_id), "installation id", installation_id)
    _check(kind_problem(kind), "kind", kind)
    if await store.get_installation(installation_id) is not None:
        raise AdminError(f"an installation with id {installation_id!r} already exists")
    operator_ids = [(await get_user(store, username)).user_id for username in operators]
    installation = Installation(installation_id, name, kind, operator_ids)
    await store.put_installation(installation)
    _record("installation_created", subject=installation_id, outcome="success")
    return installation


async def remove_installation(ctx: OAuthContext, installation_id: str) -> int:
    if await ctx.store.get_installation(installation_id) is None:
        raise AdminError(f"no installation with id {installation_id!r}")
    revoked = 0
    for grant in await ctx.store.list_grants(Subject(installation_id=installation_id)):
        revoked += await revoke_grant(ctx, grant.grant_id, "admin")
    await ctx.store.delete_installation(installation_id)
    _record("installation_removed", subject=installation_id, families_revoked=revoked, outcome="success")
    return revoked


async def purge(store: Store) -> dict[str, int]:
    counts = await store.purge_expired(utcnow())
    _record("expired_records_purged", outcome="success", **counts)
    return counts
