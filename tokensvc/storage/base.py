"""The storage contract: one :class:`Store` interface, one implementation per backend.

The interface is the sum of one abstract class per concern: the :class:`Registry` (clients,
users, installations), :class:`Authorizations` (grants, codes and token families),
:class:`Sessions` (web sign-ins) and :class:`Housekeeping` (start-up, health, expiry, the
revocation feed). A protocol function asks for the concern it uses, and for
:class:`RegistryAndAuthorizations` where it uses both. Every method is a coroutine. Each operation that must be atomic
(consuming a code, rotating a family's refresh token) is one method here, and each backend
implements it as one atomic step: of two concurrent calls, exactly one wins.

A backend raises :class:`StorageError` when it cannot answer (the web layer answers 503),
:class:`StoreFault` when it refuses for good (500), :class:`Conflict` for a taken unique key.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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


class StorageError(Exception):
    """The store did not answer (unreachable, timed out, failed mid-operation)."""


class Conflict(Exception):
    """A unique key is taken (a username that another user already has)."""


class ResourceTaken(Conflict):
    """A resource URI (RFC 8707) that another client's document declares already: each is one
    API's, so the write is refused, with nothing written (MongoDB: the unique index
    ``clients.resources``). ``resource``: the URI, when the store knows it."""

    def __init__(self, resource: str | None = None) -> None:
        super().__init__(f"resource {resource!r} is declared by another client" if resource
                         else "a resource is declared by another client")
        self.resource = resource


class Removing(Conflict):
    """A registration of an id whose removal is under way: refused, with nothing written, until
    the removal is finished (the same removal run again, or the next start-up)."""


class StoreFault(Exception):
    """The store answered with a refusal that retrying will not change: failed
    authentication, a document it will not take, an index that conflicts. The operator has
    to act; requests get 500 (no ``Retry-After``, which would promise a recovery)."""


# Consumed codes are kept this long past their expiry, so that a replay within that time is
# still recognised (and revokes its family) instead of looking like an unknown code.
CODE_RETENTION_SECONDS = 3600
# A user's sessions listed at most (a script signing in in a loop must not make a page of
# thousands); the most recently seen ones.
MAX_LISTED_SESSIONS = 100


# What a revocation concerns, named in every announcement of it: open WebSockets re-check
# only when one of the keys they stand on is named.
FAMILY, GRANT, SESSION, USER, CLIENT, SUBJECT = "family", "grant", "session", "user", "client", "subject"
# What a client's readers of the revocation feed proved changed (its secret, kind or first-party
# flag; its removal): they check their credentials again. No token loses anything by it.
CREDENTIALS = "credentials"
# The client's field that carries each announcement about a client to every process (its
# relay watches them, storage/mongo/feed.py), written in the change's own write.
CLIENT_MARKS = {CLIENT: "narrowed_at", CREDENTIALS: "credentials_changed_at"}
# The pseudo-field of a client's or a user's update (:meth:`Registry.update_client`,
# :meth:`Registry.update_user`) that carries the audience of the mark it sets (``narrowed_at``):
# the resources the tokens it may touch are meant for (a list), or None: every reader. A store
# several processes share keeps it beside the mark, for their relays (storage/mongo/feed.py);
# one that only one process uses keeps nothing.
MARK_AUDIENCE = "mark_audience"
# The longest a process answers client authentication from what it read of a client before
# (Registry.client_record), should it hear of no change: the bound of every cache of
# the store's records (docs/security.md, "What a process keeps").
CACHE_SECONDS = 1.0


@dataclass(slots=True, frozen=True)
class Revocation:
    """Something was revoked: a token family (or its access token alone), a grant, a web
    session, every web session of a user, some of what a client's tokens may do (its
    allowed_scopes narrowed, or its removal), some of what a user's tokens may do (the user
    demoted, or removed), or what a client's feed readers proved (CREDENTIALS)."""

    kind: str  # FAMILY | GRANT | SESSION | USER | CLIENT | SUBJECT | CREDENTIALS
    key: str  # the family_id, grant_id, session_hash, user_id or client_id (SUBJECT: user_id; CREDENTIALS: client_id)
    # The resources the tokens it may touch are meant for (RFC 8707): a family's own, the union
    # of the families' of a grant, a client or a user, as the revoking process read them and as
    # its mark carries them to every process's relay. Which resource servers' feed readers hear
    # of it. None: every one (a token of them names no audience, or the audience is unknown: a
    # mark of an older release, a relay's interruption). Not part of what the revocation is
    # (equality, the listeners' keys).
    audience: tuple[str, ...] | None = field(default=None, compare=False)


def union(*audiences: list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The audiences together, as a :class:`Revocation` carries them: None (every reader) when
    one of them is None."""
    together: set[str] = set()
    for audience in audiences:
        if audience is None:
            return None
        together.update(audience)
    return tuple(sorted(together))


@dataclass(slots=True, frozen=True)
class Standing:
    """A token family with everything its use is decided on, as the store holds them now, read
    in one round trip: its grant, its client (None when it is not registered, or its removal is
    recorded) and its user (None for an installation's family, or a user who is gone)."""

    family: Family | None
    grant: Grant | None = None
    client: Client | None = None
    user: User | None = None


@dataclass(slots=True, frozen=True)
class Presentation:
    """What a code's exchange presents (:meth:`Authorizations.redeem_code`): the client, the
    redirect_uri, the S256 challenge of the verifier presented, and a scope the code must not
    hold (``admin``, where the code would need a confirmation that was not presented)."""

    client_id: str
    redirect_uri: str
    code_challenge: str
    refused_scope: str | None = None

    def matches(self, code: AuthorizationCode, now: datetime) -> bool:
        """Whether ``code`` is unconsumed, unexpired and presented as it was issued."""
        return (code.consumed_at is None and code.expires_at > now and code.client_id == self.client_id
                and code.redirect_uri == self.redirect_uri and code.code_challenge_method == "S256"
                and code.code_challenge == self.code_challenge
                and (self.refused_scope is None or self.refused_scope not in code.scopes))


@dataclass(slots=True, frozen=True)
class ClientRecord:
    """A registered client and its previous secret (None when it has none), as client
    authentication weighs them."""

    client: Client
    previous: PreviousSecret | None = None


class Registry(abc.ABC):
    """Clients, users and node installations: the token endpoints and the pages read them, the
    operator's commands and start-up seeding write them.

    A removal answers nothing: whether the record was there is not something a store that runs
    a delete again after a lost reply can say (the first run may have removed it), so callers
    read first when they must know (the admin API's 404)."""

    # -- clients: client lookup on every token endpoint, the client endpoints, the CLI

    @abc.abstractmethod
    async def get_client(self, client_id: str) -> Client | None:
        """The registered client, or None (also while a removal of it is recorded, whatever
        document a writer left or made meanwhile).

        Called by a feed reader's re-check (oauth/introspection.py), the authorization request
        (oauth/authorization.py), a token's privileges (oauth/privileges.py), connected apps, the pages'
        notices, GET /oauth/clients/{id}, the operator's actions (admin/actions.py) and start-up seeding
        (bootstrap.py).
        """

    @abc.abstractmethod
    async def declared_resources(self, resources: list[str]) -> set[str]:
        """Which of ``resources`` a registered resource server declares (its ``resources``):
        one read, made only when a request names resources (RFC 8707). A resource two of them
        declare (a store written before each write kept the rule, see :meth:`put_client`) is
        none's: no token is bound to it (fail closed).

        Called by the authorization request, the code exchange and the refresh (oauth/audience.py).
        """

    @abc.abstractmethod
    async def list_clients(self, after: str | None = None, limit: int | None = None) -> list[Client]:
        """The registered clients ordered by client_id, none whose removal is recorded: every
        one, or a page of ``limit`` after the client_id ``after`` (the admin API's listings).

        Called by the allowed CORS origins (oauth/origins.py), GET /oauth/clients, the operator's listings
        (admin/operator.py) and client creation (admin/actions.py).
        """

    @abc.abstractmethod
    async def put_client(self, client: Client) -> None:
        """Insert or replace the client with this client_id (config seeding, CLI).

        A resource URI is declared by one client's document at most (RFC 8707: a token meant
        for one API must not pass at another): this write, :meth:`add_client` and
        :meth:`update_client` raise :class:`ResourceTaken` and write nothing when another
        client's document declares one of ``resources`` as written (MongoDB: a unique index,
        so two writers in two processes at once cannot both land). Every writer writes a URI
        in its canonical form alone (identifiers.declared_resource_problem), so comparing
        strings here compares URIs.

        Called by start-up seeding of a client that exists (bootstrap.py).
        """

    @abc.abstractmethod
    async def add_client(self, client: Client) -> None:
        """Register the client only if no document holds its client_id, in one atomic step (its
        claim of the id): of two registrations of one id at once, exactly one wins, and the
        other gets :class:`Conflict` and writes nothing. Its ``created_at`` is the time its
        registration began, which bounded the leftovers revoked before it
        (:meth:`revoke_client_grants`'s ``before``). A lost reply never turns into a false
        Conflict within this call (MongoDB: the driver's retry of the insert carries the same
        transaction number, and the server applies it once); a registration asked again after
        a 503 may find its own claim (409).

        While a removal of the id is recorded (:meth:`begin_removal`) the registration is
        refused with :class:`Removing` and leaves nothing: whatever order its steps and the
        removal's land in, no step of that removal ever deletes a client this call registered
        (MongoDB: the document is inserted with a claim of its own, which the removal's steps
        never match, then the removal is looked for, and the document taken back if one is
        recorded; memory: the check and the write with no await between).

        Called by a registration (oauth/removal.py), for client creation and start-up seeding of
        a new client.
        """

    @abc.abstractmethod
    async def update_client(self, client_id: str, fields: dict[str, Any], *,
                            if_confidential: bool = False) -> Client | None:
        """Set ``fields`` (names of :class:`Client`'s fields) of the client and no other, in one
        atomic step: concurrent changes of different fields all hold (a PATCH beside a secret's
        rotation). With ``if_confidential``, only while the client has a secret. The client as
        it was before, or None when there is none (or, with ``if_confidential``, it is public).
        ``fields`` may hold :data:`MARK_AUDIENCE`, the audience of the narrowing mark it sets.

        Called by the operator's client changes and secret rotation (admin/actions.py).
        """

    @abc.abstractmethod
    async def withdraw_client(self, removal: Removal) -> None:
        """Delete the document of the client ``removal`` takes (whatever wrote it meanwhile: a
        release that knows nothing of the record writing it back), and its previous secret.
        Idempotent, and never beyond the removal: the document of a client registered under
        the id since (once the removal ended, or while it was recorded and the registration had
        not yet looked for it) is never deleted, whichever call of the removal runs it, and
        however late.

        Called by a client's removal, once it is recorded, and by :meth:`end_removal`
        (oauth/removal.py).
        """

    @abc.abstractmethod
    async def set_owners(self, kind: str, owners: Mapping[str, str]) -> dict[str, str]:
        """Mark each entry of ``kind`` (``client``, ``user``, ``installation``) that ``owners``
        names by its key (client_id, user_id, installation_id) with its owner (what writes it at
        every start: records.OWNER), and clear the mark of every other entry of that kind. No
        other write marks or clears one: a record written with ``owner`` None keeps the mark the
        store holds (``add_client``'s new document excepted, which holds its record's).

        Returns each entry whose mark this changed from another owner, by its key: the owner
        it had (a start whose file names it no more, or that another file wrote).

        Called by start-up seeding (bootstrap.py)."""

    # -- a client's removal: a record of its own, from its start until it is finished

    @abc.abstractmethod
    async def begin_removal(self, client_id: str, now: datetime, tag: str) -> Removal:
        """Record the removal of a client, started ``now``, under ``tag`` (the call's own, random;
        from then on :meth:`get_client` says None), unless one is recorded already. Idempotent.
        The removal as recorded: this call's, whose ``tag`` is ``tag`` (a write whose reply was
        lost and that is tried again included), or the one recorded before, for every other
        call: of removals run at once, one finds its own tag.

        Called by a client's removal (oauth/removal.py).
        """

    @abc.abstractmethod
    async def mark_removal(self, client_id: str, now: datetime, audience: list[str] | None = None) -> None:
        """Write the mark of a recorded removal, stamped ``now`` (the time of the write), which
        every process's relay hears (:meth:`revocation_feed` yields the client, CLIENT, with
        ``audience``: its families', :meth:`families_audience`; None: every reader): written
        after the record, so it is heard when the client's tokens are refused already. Written
        again by each call of the removal (MongoDB: the ``removed_clients`` notice, kept a day
        after the removal; a store only one process uses has none).

        Called by a client's removal and start-up's finishing of one under way (oauth/removal.py).
        """

    @abc.abstractmethod
    async def get_removal(self, client_id: str) -> Removal | None:
        """The client's removal under way, or None.

        Called by the operator's client actions (admin/actions.py).
        """

    @abc.abstractmethod
    async def list_removals(self) -> list[Removal]:
        """The removals under way (start-up finishes them).

        Called by start-up, which finishes the removals under way (oauth/removal.py).
        """

    @abc.abstractmethod
    async def end_removal(self, removal: Removal) -> None:
        """Finish ``removal``, whose grants are all revoked: withdraw the client's document
        (:meth:`withdraw_client`) and its previous secret, then delete the record (by its
        ``tag``). Idempotent, and never beyond the removal: run
        again after its record went (its reply lost, or another call of the same removal
        finished it), it deletes nothing, neither a client registered since under the id nor
        the record of a later removal of it.

        Called by a client's removal, once its grants are revoked (oauth/removal.py).
        """

    @abc.abstractmethod
    async def client_record(self, client_id: str) -> ClientRecord | None:
        """The registered client and its previous secret, or None (as :meth:`get_client`
        says), for client authentication, which every token-endpoint request and every
        introspection begins with. A store that several processes share may answer from what
        this process read of them less than a second ago (:data:`CACHE_SECONDS`), made current
        at once by every change this process writes and every announcement its relay hears of
        another's (the client narrowed, removed, or what its feed readers proved changed); a
        change announced by nothing (a widening) is seen within that second.

        Called by client authentication (oauth/clientauth.py).
        """

    # -- a client's previous secret: kept valid for a while by a rotation (a record of its own)

    @abc.abstractmethod
    async def put_previous_secret(self, previous: PreviousSecret) -> None:
        """Keep ``previous`` as its client's previous secret, replacing any other.

        Called by a secret's rotation with overlap (admin/actions.py).
        """

    @abc.abstractmethod
    async def get_previous_secret(self, client_id: str) -> PreviousSecret | None:
        """The client's previous secret, expired or not, or None.

        Called by a feed reader's re-check (oauth/introspection.py) and the operator's views
        (admin/actions.py); client authentication reads it with its client (:meth:`client_record`).
        """

    @abc.abstractmethod
    async def delete_previous_secret(self, client_id: str) -> None:
        """Forget the client's previous secret, if there is one.

        Called by a secret's rotation (admin/actions.py).
        """

    @abc.abstractmethod
    async def note_previous_secret_use(self, client_id: str, now: datetime, every_seconds: float) -> bool:
        """Record a use of the client's previous secret at ``now``, unless one was recorded less
        than ``every_seconds`` before; True when this call recorded it (exactly one of concurrent
        callers: whoever tells of the use).

        Called by client authentication with the previous secret (oauth/clientauth.py).
        """

    @abc.abstractmethod
    async def expire_previous_secret(self, now: datetime) -> PreviousSecret | None:
        """Forget one previous secret expired by ``now``, in one atomic step, and return it
        (exactly one caller gets each: whoever tells of its expiry), or None when none is. One
        at a time, so that each is told as soon as it is forgotten: a failure after some of a
        batch were forgotten lost the telling of every one of them. (MongoDB: a reply lost is
        answered by the driver's retry of the same write, which the server answers with what it
        deleted.)

        Called by the periodic expiry of previous secrets (oauth/clientauth.py).
        """

    # -- users: sign-in, /v1/me, introspection's ``username``, the CLI

    @abc.abstractmethod
    async def get_user(self, user_id: str) -> User | None:
        """The user with this user_id, or None.

        Called by sign-in sessions (oauth/sessions.py), bearer principals (oauth/principal.py), a token's
        privileges (oauth/privileges.py) and the operator's views (admin/operator.py).
        """

    @abc.abstractmethod
    async def get_user_by_username(self, username: str) -> User | None:
        """The user stored under exactly ``username``, else the one whose username has the same
        key (:func:`tokensvc.identifiers.username_key`: ``ROOT`` finds ``root``), or None. A
        username stored by a release before 0.10 with capitals is found as written (MongoDB).

        Called by sign-in (oauth/sessions.py), the operator's user actions (admin/actions.py) and start-up seeding
        (bootstrap.py).
        """

    @abc.abstractmethod
    async def list_users(self, after: str | None = None, limit: int | None = None) -> list[User]:
        """The users ordered by username: every one, or a page after the username ``after``.

        Called by the operator's listings (admin/operator.py).
        """

    @abc.abstractmethod
    async def seed_user(self, user: User, now: datetime) -> User:
        """Upsert on the username: an existing user keeps its id and takes ``user``'s password
        hash and admin flag; otherwise ``user`` is added. Returns the stored user. Several
        processes seeding one empty database at once all succeed, with one user per name. A
        write that takes ``admin`` away from an administrator, or sets another password hash,
        also marks the user narrowed (``narrowed_at``: ``now``), decided on the record it
        replaces, so that no demotion or new password is ever written without its mark (a
        promotion landing between a read and the write included).

        Called by start-up seeding (bootstrap.py).
        """

    @abc.abstractmethod
    async def put_user(self, user: User) -> None:
        """Insert or replace the user with this user_id. Usernames are unique by their key
        (:func:`tokensvc.identifiers.username_key`, NFKC and case folded): one whose key another
        user's username has is Conflict.

        Called by user creation (admin/actions.py).
        """

    @abc.abstractmethod
    async def update_user(self, user_id: str, fields: dict[str, Any]) -> User | None:
        """Set ``fields`` of the user (``password_hash``, ``admin``, ``narrowed_at``, and
        :data:`MARK_AUDIENCE`, the audience of that mark) and no other, in one atomic step: a
        password set beside a demotion leaves both. The user as it was before, or None when
        there is none.

        Called by the operator's password and admin changes (admin/actions.py).
        """

    @abc.abstractmethod
    async def delete_user(self, user_id: str) -> None:
        """Remove a user, if there.

        Called by user removal (admin/actions.py)."""

    # -- node installations: pairing at /oauth/authorize, the CLI

    @abc.abstractmethod
    async def get_installation(self, installation_id: str) -> Installation | None:
        """The installation with this id, or None.

        Called by the authorization request's subject (oauth/authorization.py), bearer principals
        (oauth/principal.py), the pages' notices and the operator's actions (admin/actions.py).
        """

    @abc.abstractmethod
    async def list_installations(self, after: str | None = None, limit: int | None = None) -> list[Installation]:
        """The installations ordered by id: every one, or a page after the id ``after``.

        Called by connected apps (oauth/connected_apps.py) and the operator's listings (admin/operator.py).
        """

    @abc.abstractmethod
    async def put_installation(self, installation: Installation) -> None:
        """Insert or replace the installation with this id.

        Called by the operator's actions (admin/actions.py) and start-up seeding (bootstrap.py)."""

    @abc.abstractmethod
    async def delete_installation(self, installation_id: str) -> None:
        """Remove an installation, if there.

        Called by installation removal (admin/actions.py)."""


class Authorizations(abc.ABC):
    """Grants, authorization codes and token families: what the authorization endpoint, the
    token endpoints, bearer authentication and revocation read and write."""

    # -- grants: one per (subject, client); created at consent, revoked by users and operators

    @abc.abstractmethod
    async def save_grant(self, client_id: str, subject: Subject, scopes: list[str], now: datetime) -> Grant:
        """Create the (subject, client) grant, or reactivate it with these scopes.

        The grant_id of an existing grant is kept; created_at is reset when the grant was
        revoked (a fresh consent), and so is revoked_at, and its generation is raised.

        Called by consent, as a code is issued (oauth/authorization.py).
        """

    @abc.abstractmethod
    async def get_grant(self, grant_id: str) -> Grant | None:
        """The grant with this id, revoked or not, or None.

        Called by the operator's grant revocation (admin/actions.py).
        """

    @abc.abstractmethod
    async def find_grant(self, client_id: str, subject: Subject) -> Grant | None:
        """The (subject, client) grant, revoked or not, or None.

        Called by a user's revocation of a connected app (oauth/revocation.py).
        """

    @abc.abstractmethod
    async def list_grants(self, subject: Subject) -> list[Grant]:
        """The active (unrevoked) grants of a subject, oldest first (connected apps).

        Called by connected apps (oauth/connected_apps.py), revocation before a promotion
        (oauth/revocation.py) and the operator's actions that end a subject's grants (admin/actions.py).
        """

    @abc.abstractmethod
    async def list_client_grants(self, client_id: str, after: str | None = None,
                                 limit: int | None = None) -> list[Grant]:
        """The active grants held by a client ordered by grant_id: every one, or a page of
        ``limit`` after the grant_id ``after`` (the admin API's listing).

        Called by the operator's grant listing (admin/actions.py).
        """

    @abc.abstractmethod
    async def revoke_client_grants(self, client_id: str, now: datetime, limit: int,
                                   before: datetime | None = None) -> dict[str, list[str] | None]:
        """Revoke up to ``limit`` live grants of a client and every family of them, the families
        first (a removed client's, a batch at a time); the grants revoked, in the order of their
        ids, each with the audience of its live families as the batch found them (read before
        the sweep: :meth:`families_audience`'s), fewer than ``limit`` when none is left. Each
        mark carries its own audience: a family's its own, a grant's its families'. With
        ``before``, only the grants created before it
        (the leftovers under a newly claimed id: those issued to the new client stay).
        Idempotent: run again after a reply was lost, it takes the grants still live (those
        whose revocation applied go uncounted).

        Called by a client's removal and a registration's clearing of leftovers, a batch at a
        time (oauth/removal.py).
        """

    @abc.abstractmethod
    async def withdraw_scopes(self, client_id: str, kept: list[str]) -> None:
        """Take every scope not in ``kept`` out of what the client's live grants, unconsumed
        codes and unrevoked families hold, in bulk (its allowed_scopes were narrowed to
        ``kept``): a later widening gives them nothing back. Idempotent. It says nothing of how
        many it changed: run again after a lost reply (MongoDB), it cannot tell what its first
        run changed, and nothing needs the number.

        Called by the narrowing of a client's allowed_scopes (oauth/revocation.py).
        """

    @abc.abstractmethod
    async def mark_grant_revoked(self, grant_id: str, now: datetime, audience: list[str] | None = None) -> bool:
        """Mark an active grant revoked; True when it was active. From then on none of its
        families is in force (their generation no longer stands), swept or not. The mark
        carries ``audience`` (its families', :meth:`families_audience`; None: every reader).

        Called by the end of a grant (oauth/revocation.py).
        """

    @abc.abstractmethod
    async def revoke_grant_families(self, grant_id: str, now: datetime) -> int:
        """Revoke every unrevoked family of a grant; the count. One write however many
        refreshes the families have seen. Each mark carries the family's own audience, so a
        relay tells each family to the readers of its tokens alone.

        Called by the end of a grant, after mark_grant_revoked (oauth/revocation.py).
        """

    # -- authorization codes: /oauth/authorize issues, /oauth/token consumes

    @abc.abstractmethod
    async def add_code(self, code: AuthorizationCode) -> None:
        """Store a new authorization code (its hash; never consumed yet).

        Called by the authorization endpoint, as a code is issued (oauth/authorization.py)."""

    @abc.abstractmethod
    async def get_code(self, code_hash: str) -> AuthorizationCode | None:
        """The code with this hash, consumed or not, or None.

        Called by the code exchange (oauth/grants.py)."""

    @abc.abstractmethod
    async def consume_code(self, code_hash: str, now: datetime, *, family_id: str | None = None,
                           failed: bool = False) -> AuthorizationCode | None:
        """Atomically mark an unconsumed code consumed: redeemed into the family
        ``family_id``, or (``failed``) spent by a failed check. Returns it as it was before.

        None when the code is unknown or was already consumed: exactly one of concurrent
        callers gets the record.

        Called by the code exchange (oauth/grants.py).
        """

    async def redeem_code(self, code_hash: str, now: datetime, family_id: str,
                          presented: Presentation) -> AuthorizationCode | None:
        """Atomically consume the code, redeemed into the family ``family_id``, if it is
        unconsumed, unexpired and ``presented`` matches it (:meth:`Presentation.matches`).
        Returns it as it was before; None otherwise, and nothing is written: the caller reads
        the code to say why. Exactly one of concurrent callers gets the record.

        This default reads the code, then consumes it: the fields matched never change once
        the code is issued, save its scopes, which only shrink. A backend that can do both in
        one round trip does (MongoDB: one conditional findAndModify).

        Called by the code exchange (oauth/grants.py)."""
        found = await self.get_code(code_hash)
        if found is None or not presented.matches(found, now):
            return None
        return await self.consume_code(code_hash, now, family_id=family_id)

    # -- token families: one record per redeemed code, holding its current pair

    @abc.abstractmethod
    async def create_family(self, family: Family) -> bool:
        """Insert ``family`` unless one with its id exists; True when inserted (exactly one
        of concurrent callers).

        Called by code redemption (oauth/grants.py).
        """

    @abc.abstractmethod
    async def get_family(self, family_id: str) -> tuple[Family | None, Grant | None]:
        """A family and its grant, in one round trip (refresh, revocation, sockets).

        Called by the refresh and code exchange (oauth/grants.py), bearer authentication (oauth/bearer.py)
        and the WebSockets' re-checks (oauth/principal.py).
        """

    @abc.abstractmethod
    async def find_access(self, access_hash: str,
                          family_ids: Sequence[str] = ()) -> tuple[Family | None, Grant | None]:
        """The family whose current access token has this hash, or whose last rotation replaced
        the access token with this hash (its ``access_hash`` then differs), and its grant, in
        one round trip: what a revocation finds a token by. With ``family_ids`` (what an access
        token's routing part names: oauth/tokens.py), only a family among them: the lookup names
        the family's shard key beside the hash. Without, the token is found by its hash alone
        (the old shape, on every shard). A token's use reads it with its
        client and user (:meth:`RegistryAndAuthorizations.access_standing`).

        Called by bearer authentication (oauth/bearer.py).
        """

    @abc.abstractmethod
    async def rotate_family(self, family_id: str, refresh_hash: str, pair: Pair, now: datetime, *,
                            previous_access: tuple[str, datetime] | None = None) -> Family | None:
        """Atomically replace the family's pair with ``pair`` (its hashes, scopes, times,
        ``serial``, ``key_id`` and ``salt``) if ``refresh_hash`` is its current refresh token,
        unexpired, and the family is not revoked (and, given ``previous_access``, the hash and
        expiry of the access token read with it, that this is its access token). The replaced
        refresh token becomes ``previous_hash``, ``now`` the ``renewed_at``, ``previous_access``
        the ``previous_access_hash`` and ``previous_access_expires_at`` (None without it); the
        access token's use and revocation marks are cleared. The family after, or None (exactly
        one of concurrent callers wins).

        Called by the refresh (oauth/grants.py).
        """

    @abc.abstractmethod
    async def reissue_pair(self, family_id: str, refresh_hash: str, pair: Pair) -> Family | None:
        """Atomically replace a pair that was never used (a retry of a reply that was lost):
        only if ``refresh_hash`` is still the current refresh token, its access token was
        never presented, and the family is not revoked. ``previous_hash``, ``renewed_at``
        and ``rotations`` stay. The family after, or None.

        Called by the refresh retried after a lost reply (oauth/grants.py).
        """

    @abc.abstractmethod
    async def mark_access_used(self, family_id: str, access_hash: str, now: datetime) -> None:
        """Record the first presentation of the family's current access token.

        Called by bearer authentication (oauth/bearer.py).
        """

    @abc.abstractmethod
    async def mark_second_holder(self, family_id: str, now: datetime) -> bool:
        """Record, once, that a second holder of the family showed (``second_holder_at``); True
        when this call recorded it, also when its reply was lost and it ran again.

        Called by bearer authentication, meeting a rotated-out token (oauth/bearer.py).
        """

    @abc.abstractmethod
    async def revoke_access(self, family_id: str, access_hash: str, now: datetime,
                            audience: list[str] | None = None) -> bool:
        """Revoke the family's current access token alone (RFC 7009 for an access token);
        True when it was in force. The mark carries ``audience``: the family's, as the caller
        read it (None: every reader).

        Called by RFC 7009 revocation of an access token (oauth/revocation.py).
        """

    @abc.abstractmethod
    async def revoke_family(self, family_id: str, now: datetime, audience: list[str] | None = None) -> bool:
        """Revoke a family (its refresh and access token); True when it was unrevoked. The mark
        carries ``audience`` (as :meth:`revoke_access`'s).

        Called by revocation of a family (oauth/revocation.py: RFC 7009, a replay, a second holder).
        """

    @abc.abstractmethod
    async def families_audience(self, *, grant_id: str | None = None, client_id: str | None = None,
                                user_id: str | None = None, now: datetime | None = None) -> list[str] | None:
        """The resources the live families of a grant, a client or a user (one of them named)
        are meant for together, each once and in order: what a revocation of them may touch,
        which the revocation feed tells those resource servers alone. None as soon as one of
        them names no audience (its tokens are meant for every API). Live: unrevoked, its
        refresh token unexpired at ``now`` (the current time when None), and, for a client's or
        a user's, of a live grant (a grant's own are read after its mark too). A dead family's
        tokens are refused already and were announced when it died, and no cached answer
        outlives its token. One read of the
        distinct audiences alone, on an index (a user's: two, their grants, then their families),
        however many families there are; a revocation's write path, never a request's.

        Called by the revocations of a grant, a client and a user (oauth/revocation.py,
        oauth/removal.py, admin/actions.py).
        """

    @abc.abstractmethod
    async def list_families(self, grant_id: str) -> list[Family]:
        """The unrevoked families of a grant, oldest first (what a connected app can do).

        Called by connected apps (oauth/connected_apps.py) and a token's admin privileges
        (oauth/privileges.py).
        """


class Sessions(abc.ABC):
    """Web sessions: the ``<service>_session`` cookie carries a random id, stored as its hash."""

    @abc.abstractmethod
    async def add_session(self, session: Session) -> None:
        """Store a new web session (its hash).

        Called by sign-in (oauth/sessions.py)."""

    @abc.abstractmethod
    async def get_session(self, session_hash: str) -> Session | None:
        """The session, unless it was ended (expiry is the caller's to check).

        Called by the session cookie's resolution (oauth/sessions.py) and the WebSockets' re-checks
        (oauth/principal.py).
        """

    @abc.abstractmethod
    async def end_session(self, session_hash: str, now: datetime) -> bool:
        """End a session (sign-out); True when it was live.

        Called by sign-out and the ending of one session (oauth/sessions.py).
        """

    @abc.abstractmethod
    async def end_user_sessions(self, user_id: str, now: datetime) -> int:
        """End every web session of a user (a password set, the user removed); the count.

        Called by a password set or a user removed (oauth/sessions.py).
        """

    @abc.abstractmethod
    async def list_user_sessions(self, user_id: str, now: datetime) -> list[Session]:
        """A user's live sessions (not ended, not expired), the most recently seen first, at most
        :data:`MAX_LISTED_SESSIONS` of them (the account page, ``GET /v1/me/sessions``).

        Called by the account page and GET /v1/me/sessions (oauth/sessions.py).
        """

    @abc.abstractmethod
    async def touch_session(self, session_hash: str, now: datetime) -> None:
        """Note that the session was used at ``now`` (what the account page calls last seen).

        Called by the session cookie's resolution (oauth/sessions.py).
        """


class FailureCounts(abc.ABC):
    """Counts of failed attempts that every process sharing the store sees (``ratelimit``: the
    brute-force limits on client authentication and sign-in, FailureLimits). A group (an
    address) holds named counters in one record with one window, which starts with the group's
    first attempt and ends ``window_seconds`` later, when every counter of it is forgotten.

    A concern of its own, beside the Store rather than in it: a store that only one process
    uses (memory) has none (:meth:`Housekeeping.failure_counts` is None) and the limits count in
    that process; a store several processes share (MongoDB) has one, or N processes would each
    allow the limit. Every call comes from ``ratelimit.FailureLimits``."""

    @abc.abstractmethod
    async def count_attempt(self, group: str, counters: list[str], window_seconds: int) -> tuple[list[int], float]:
        """Add one to each counter in one atomic step: their new counts (of concurrent callers,
        each sees a count of its own), and the seconds left in the group's window (a new window
        of ``window_seconds`` when there was none, or it had ended). Not idempotent: counted
        again, an attempt counts twice.

        Called by FailureLimits.failed and FailureLimits.reserve (ratelimit.py).
        """

    @abc.abstractmethod
    async def uncount_attempt(self, group: str, counters: list[str], reset: list[str]) -> None:
        """Take one back from each of ``counters`` (the attempt succeeded, or was refused before
        its check), and set each of ``reset`` to zero (a right password clears its username, a
        sign-in its account's failures since the last, a new password its account's counts), in
        one step, within the group's window (after it, nothing is left to take back). Either
        list may be empty.

        Called by FailureLimits, a success or a refusal given back, an account's counts
        forgiven (ratelimit.py).
        """

    @abc.abstractmethod
    async def read_counts(self, group: str, counters: list[str]) -> tuple[list[int], float]:
        """The counters' counts (0 for one never counted, or after the window) and the seconds
        left in the group's window (0.0 without one).

        Called by FailureLimits.check (ratelimit.py).
        """


class StoreObserver:
    """What a store tells about its own work (the store metrics, ``tokensvc/bootstrap.py``
    connects them); by default nobody listens."""

    def operation(self, name: str, seconds: float) -> None:
        """An operation ended (its retries included) after ``seconds``."""

    def error(self, name: str, code: str) -> None:
        """An attempt of operation ``name`` failed with ``code`` (the server's, or a class name)."""

    def retry(self, name: str) -> None:
        """Operation ``name`` is tried again after a transient error."""

    def feed(self, state: str) -> None:
        """The revocation feed is now ``stream``, ``polling`` or ``interrupted``."""

    def feed_event(self) -> None:
        """The revocation feed delivered a revocation."""

    def pool_checked_out(self, seconds: float) -> None:
        """A connection was checked out of the pool after waiting ``seconds``."""

    def pool_checked_in(self) -> None:
        """A connection went back to the pool."""

    def topology_changed(self) -> None:
        """A server changed its state (an election, a failure)."""

    def format_seen(self, stored: int, compatibility: int, migrations: dict[str, tuple[int, bool]]) -> None:
        """The store's format as this process last read it: the format, the compatibility
        version, and each migration of this release's history: (rows converted, done)."""

    def old_release_connections(self, count: int) -> None:
        """Connections of a release that cannot read the store's compatibility version (0.9.0
        after finalize), as this process last looked."""

    def old_format_rows(self, count: int) -> None:
        """Rows of an older format found behind a done migration, as this process last looked."""


class Housekeeping(abc.ABC):
    """Start-up, health, expiry, and the revocations of other processes."""

    # False while ``bootstrap.prepare`` opens and seeds the store at start-up; ``/readyz``
    # answers 503 until then. A store its creator prepares itself (tests, the CLI) is ready.
    prepared: bool = True
    observer: StoreObserver = StoreObserver()  # who hears what the store tells (the metrics)

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Prepare the backend (create indexes, ...). Called once at start-up.

        Called by start-up (bootstrap.prepare) and the command line's store (cli/admin.py).
        """

    async def binds_audiences(self) -> bool:
        """Whether tokens may be bound to an audience (RFC 8707): whether every process allowed
        to serve from the store reads a family's audience. A store no older release shares
        always may.

        Called by oauth/audience.py.
        """
        return True

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Called at shutdown.

        Called by shutdown (cli/main.py) and the command line's store (cli/admin.py, cli/storage.py).
        """

    async def reachable(self, seconds: float) -> None:
        """Wait ``seconds``, or less: until the store may answer again (MongoDB: its driver sees
        a member that takes writes, having seen none, or a newly elected primary), so that a
        store that comes back is prepared at once, not at the next step of a long back-off.

        Called by start-up, between its tries (bootstrap.py), and by the relay between its tries
        (oauth/events.py). The WebSocket handlers give it to each socket's re-check as the pause
        after a failed one, and the service's context to the failure limits as the pause before
        the take-backs of counts the store missed (bootstrap.py).
        """
        await asyncio.sleep(seconds)

    async def upkeep(self) -> None:  # noqa: B027 - optional hook
        """What the backend does in the background while the service runs, until cancelled
        (MongoDB: the process's heartbeat and the migrations, storage/mongo/processes.py and
        storage/mongo/migrations.py). Returns at once where there is nothing: the memory backend
        keeps no state across a restart, so it has no format to follow.

        Called by tokensvc serve, while it runs (cli/main.py).
        """

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise StorageError unless the store answers. Used by ``/readyz``.

        Called by /readyz (handlers/edge/readiness.py).
        """

    async def deployment_settings(self, settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Record this process's ``settings`` of those every instance of one store must share
        (the store is one deployment: ``admin.cli_client``), and answer the other running
        processes of this store that say otherwise: by process (``host:pid:tag``), the settings
        they differ in, as they say them. A store only one process uses (memory), or no serving
        process's, answers nothing.

        Called by start-up (bootstrap.py), after seeding.
        """
        return {}

    def failure_counts(self) -> FailureCounts | None:
        """The failed-attempt counts every process sharing this store sees, or None where one
        process uses the store (memory: the limits count in the process). Asked once, at
        start-up (``bootstrap.make_context``)."""
        return None

    def unwritable(self) -> str | None:
        """Why no write can succeed now, as far as the store knows without asking, when only a
        change of the deployment mends it (MongoDB: a directly connected member that is no
        writable primary); None otherwise. ``/readyz`` is 503 with it, and writes fail at once."""
        return None

    async def revocation_feed(self) -> AsyncIterator[Revocation]:
        """Yields each revocation any process sharing this store makes (a family, its access
        token, a grant, a session), so that this process re-checks the WebSockets standing on
        it. A store only one process uses (memory) never yields: that process's own
        announcements suffice.

        Called by the relay (oauth/events.py).
        """
        return
        yield  # an async generator that ends at once

    @abc.abstractmethod
    async def purge_expired(self, now: datetime) -> dict[str, int]:
        """Delete expired families and sessions, and expired codes: unconsumed ones at once,
        consumed ones :data:`CODE_RETENTION_SECONDS` after their expiry (replay detection);
        counts per kind (``tokens purge``).

        Called by the periodic purge (bootstrap.py) and tokens purge (admin/actions.py).
        """


class RegistryAndAuthorizations(Registry, Authorizations, abc.ABC):
    """The registry and the authorizations together: what a protocol function asks of storage
    when it weighs an authorization against its client (may a grant carry ``admin``), or ends
    a client's authorizations with the client (its removal; a registration clearing what was
    left under its id), and a token's use, decided on its family, grant, client and user read
    together."""

    async def grant_standing(self, client_id: str, subject: Subject,
                             grant_id: str | None = None) -> tuple[Grant | None, User | None]:
        """The (subject, client) grant, revoked or not, with its user as the store holds it
        now (None for an installation's grant, or a user who is gone): what a code's exchange
        is decided on. With ``grant_id`` (the grant a code names), that grant only, and only if
        it is the (subject, client) one. One round trip where the backend can (MongoDB: one
        aggregate).

        Called by the code exchange (oauth/grants.py)."""
        if grant_id is None:
            grant = await self.find_grant(client_id, subject)
        else:
            grant = await self.get_grant(grant_id)
            if grant is not None and (grant.client_id, grant.subject) != (client_id, subject):
                grant = None
        user = await self.get_user(subject.user_id) if grant is not None and subject.user_id is not None else None
        return grant, user

    @abc.abstractmethod
    async def family_standing(self, family_id: str) -> Standing:
        """A family with its grant, client and user as they are now (:class:`Standing`), in one
        round trip: what a refresh token's use is decided on.

        Called by the refresh (oauth/grants.py) and bearer authentication (oauth/bearer.py).
        """

    @abc.abstractmethod
    async def access_standing(self, access_hash: str, family_ids: Sequence[str] = ()) -> Standing:
        """The family :meth:`find_access` finds, with its grant, client and user as they are
        now (:class:`Standing`), in one round trip: what an access token's use is decided on.

        Called by bearer authentication and introspection (oauth/bearer.py).
        """


class Store(RegistryAndAuthorizations, Sessions, Housekeeping, abc.ABC):
    """Everything the protocol layer, the handlers and the CLI ask of storage."""
