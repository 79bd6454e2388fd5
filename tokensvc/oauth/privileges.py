"""What a token may do, decided each time it is used: the one place of that rule.

A token holds the scopes its authorization granted. Which of them are in force is decided at
every use (bearer authentication at the ``/v1`` API and the admin API, introspection, refresh,
and a code's exchange) from the records as they are then, never from what held when it was
issued:

- the token's client is still registered, and each scope is still listed in the client's
  ``allowed_scopes`` (an operator who narrows them takes the rest away at once);
- ``admin`` is in force only for a user who is an administrator now.

The token's client and user are read with its family, in the same store command
(:class:`~tokensvc.storage.base.Standing`), never kept, so a change any process writes holds at
the next use in every process. A
token with no scope left in force is inactive: introspection says ``active: false``, bearer
authentication refuses it, a refresh is ``invalid_grant``.

A user promoted to administrator again must not find the chains of their earlier time as one
in force again: the promotion first revokes every grant of theirs that may carry ``admin``
(:func:`may_carry_admin`; :func:`tokensvc.oauth.revocation.end_chains_before_promotion`), so
the only chains that hold ``admin`` afterwards were made after it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.scopes import ADMIN
from tokensvc.records import Client, Grant, Subject, Token, User
from tokensvc.storage.base import RegistryAndAuthorizations


@dataclass(slots=True, frozen=True)
class Authority:
    """What a token may do now: the token with its scopes narrowed to those in force, the user
    it acts for as the store holds them now (None for a node installation), and its client."""

    token: Token
    user: User | None
    client: Client


@dataclass(slots=True, frozen=True)
class InForce:
    """The scopes of an authorization in force now, its user and its client as the store holds
    them (None when gone)."""

    scopes: list[str]
    user: User | None
    client: Client | None


async def in_force(ctx: OAuthContext, client_id: str, subject: Subject, held: list[str],
                   client: Client | None = None, holders: Holders | None = None) -> InForce:
    """Which of ``held`` (the scopes a token, or a code, of ``client_id`` for ``subject``
    carries) are in force now. ``client`` saves a read where the caller has just read or
    authenticated it; ``holders``, the client and user the store read with the token's family
    (:class:`~tokensvc.storage.base.Standing`), save both."""
    if holders is not None:
        client, user = holders.client, holders.user
    else:
        if client is None or client.client_id != client_id:
            client = await ctx.store.get_client(client_id)
        user = await ctx.store.get_user(subject.user_id) if subject.user_id is not None else None
    if client is None or client.client_id != client_id or (subject.user_id is not None and
                                                            (user is None or user.user_id != subject.user_id)):
        return InForce([], user, client)  # the client was removed, or the user: nothing stands behind it
    allowed = client.scopes
    admin = user is not None and user.admin
    return InForce([scope for scope in held if scope in allowed and (scope != ADMIN or admin)], user, client)


@dataclass(slots=True, frozen=True)
class Holders:
    """A token's client and user as the store holds them now, read with its family (None: gone)."""

    client: Client | None
    user: User | None


async def authority(ctx: OAuthContext, token: Token, client: Client | None = None,
                    holders: Holders | None = None) -> Authority | None:
    """``token`` (in force as a credential: unexpired, its family and grant standing) with the
    scopes in force now; None when none is."""
    found = await in_force(ctx, token.client_id, token.subject, token.scopes, client, holders)
    if not found.scopes or found.client is None:
        return None
    return Authority(token if found.scopes == token.scopes else replace(token, scopes=found.scopes), found.user,
                     found.client)


async def may_carry_admin(store: RegistryAndAuthorizations, grant: Grant) -> bool:
    """Whether something of ``grant`` may hold ``admin``: its last consent asked for it, its
    client may ask for it (a code may be on its way), or a live chain of it holds it."""
    if ADMIN in grant.scopes:
        return True
    client = await store.get_client(grant.client_id)
    if client is not None and ADMIN in client.scopes:
        return True
    return any(ADMIN in family.scopes for family in await store.list_families(grant.grant_id))
