"""The records tokensvc stores.

Plain dataclasses shared by the protocol layer and every storage backend. Secrets never
appear here in clear: tokens, codes, client secrets and session ids are held as their
SHA-256 hex digest, passwords as a scrypt hash. Tokens have no records of their own: a
:class:`Family` holds its current pair, and :class:`Token` is the protocol's view of one.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit

DEFAULT_SCOPES = ("read",)


def utcnow() -> datetime:
    """The current UTC time at millisecond precision, the precision MongoDB stores (so both
    backends hand back the times they were given)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


CLIENT_KIND, RESOURCE_SERVER = "client", "resource-server"
CLIENT_KINDS = (CLIENT_KIND, RESOURCE_SERVER)


# What decides whether a client may read the revocation feed with the credentials it proved, and
# which revocations it reads (a resource server's resources): a change of one is marked
# (Client.credentials_changed_at) and announced to the client's feed readers, whoever writes it
# (the admin API, the CLI, apply, the configuration at start-up). It withdraws nothing from the
# client's tokens (none of the four is in an introspection answer,
# nor what a token's socket stands on), so it is no revocation a resource server hears of; a
# change of kind to a resource server empties the scopes too, which is a narrowing.
READER_FIELDS = ("secret_hash", "kind", "first_party", "resources")


# OWNER: who writes a client, a user or an installation at every start of every process
# (docs/guide/administration.md, "Who owns an entry"), in its record's ``owner``: the path of the
# configuration file that names it, FILE_OWNER when the settings came without a path, or
# CLI_CLIENT_OWNER for the command line's client. Marked by start-up seeding alone, which clears
# it once the file no longer names the entry, and kept by every other write; every writer
# refuses a marked entry. None (a document without the field: 0.10.0 wrote every one): the
# admin API's. It limits who may write the entry and grants nothing, so a release that ignores it
# (0.10.0 reads the record as before and keeps the field when it writes) never grants more.
FILE_OWNER = "config"
CLI_CLIENT_OWNER = "admin.cli_client"


@dataclass(slots=True)
class Client:
    client_id: str
    name: str
    redirect_uris: list[str]
    allowed_scopes: list[str] | None = None
    secret_hash: str | None = None
    first_party: bool = False
    description: str | None = None
    logo_url: str | None = None
    created_at: datetime | None = None
    # Web origins (scheme://host[:port]) whose pages may call the token endpoints and the API
    # (CORS), besides the origins of a public client's redirect URIs.
    allowed_origins: list[str] | None = None
    # When something its tokens may do was last withdrawn (allowed_scopes lost a scope; it is
    # being removed): written with the change, so that every process hears of it, the open
    # WebSockets of its tokens check again, and the revocation feed names the client to resource
    # servers. An event, never state: nothing decides anything on its value.
    narrowed_at: datetime | None = None
    # CLIENT_KIND, or RESOURCE_SERVER: an API that may introspect and read the revocation feed,
    # nothing else. Stored with no redirect URI, no scope and first_party false, so that a
    # release that drops the field (0.9.0 rewrites whole documents) leaves a client that may
    # do nothing at all, never one that may do more.
    kind: str = CLIENT_KIND
    # When what its readers of the revocation feed proved last changed (READER_FIELDS: its
    # secret, kind or first-party flag; it is being removed): written with the change, so that
    # every process hears of it and the client's feed readers check their credentials again.
    # Never named on the feed: no token of the client loses anything. An event, as narrowed_at
    # is: absent (a document 0.9.0 wrote or rewrote) it reads as None, and nothing is lost.
    credentials_changed_at: datetime | None = None
    # The digest of the secret the service generated for the client (256 random bits, shown
    # once): written beside secret_hash by whatever generates one (a registration, a rotation),
    # None where a secret was set by hand. The failure limits never refuse a right secret the
    # store knows to be generated (:attr:`secret_generated`). Bound to the secret, not a flag:
    # a writer that changes the secret and not this (0.10.0's rotation or seeding, a hand-set
    # secret written by any release) leaves it naming another secret, and one that drops it
    # (0.9.0 replaces whole documents) leaves none; either way the client is limited again,
    # never exempt by mistake.
    generated_secret_hash: str | None = None
    owner: str | None = None  # who writes it at every start (OWNER, below); None: the admin API
    # A resource server's: the resource URIs (RFC 8707: absolute, no fragment) of the API it
    # serves, which an authorization or a refresh may name to bind its tokens to (their
    # audience). Only ever widens what may be asked for: a release that drops it refuses those
    # requests, never grants more.
    resources: list[str] | None = None

    @property
    def secret_generated(self) -> bool:
        """Whether the client's current secret is one the service generated: the store says so
        for this very secret."""
        return (self.secret_hash is not None and self.generated_secret_hash is not None
                and hmac.compare_digest(self.secret_hash, self.generated_secret_hash))

    @property
    def resource_server(self) -> bool:
        return self.kind == RESOURCE_SERVER

    @property
    def confidential(self) -> bool:
        return self.secret_hash is not None

    @property
    def scopes(self) -> list[str]:
        """The scopes the client may ask for (a null list means ``["read"]``)."""
        return list(DEFAULT_SCOPES) if self.allowed_scopes is None else self.allowed_scopes

    @property
    def browser_origins(self) -> list[str]:
        """The web origins whose pages may call the service for this client: its
        ``allowed_origins`` and, for a public client (whose secret cannot be leaked, having
        none), the origins of its https redirect URIs. A loopback redirect is a native app's
        (RFC 8252 §7.3), which calls the service without a browser and needs no CORS: its
        origin (``http://127.0.0.1``, any local page on that port) is none of the client's."""
        origins = list(self.allowed_origins or [])
        if not self.confidential:
            origins += [origin for uri in self.redirect_uris if (origin := web_origin(uri))]
        return origins


def generated_digest(existing: Client | None, given_sha256: str | None) -> str | None:
    """What a client's ``generated_secret_hash`` is when a writer gives its secret as a digest:
    ``given_sha256`` when the store records it as the digest of the secret the service generated
    for ``existing`` (an operator handing back, in the configuration or ``apply``, the secret the
    service made), None otherwise (a secret set by hand)."""
    recorded = existing.generated_secret_hash if existing is not None else None
    if given_sha256 is None or recorded is None or not hmac.compare_digest(given_sha256, recorded):
        return None
    return recorded


# The longest a rotation may keep the previous secret valid: long enough to roll every
# instance of a client, short enough that a forgotten overlap ends by itself.
MAX_KEEP_PREVIOUS_SECONDS = 30 * 86400


@dataclass(slots=True)
class PreviousSecret:
    """A client's secret that a rotation replaced and kept valid for a while (``clients
    rotate-secret --keep-previous``), so that every instance of the client can take the new one
    before the old one stops. A record of its own, never a field of the client's document: a
    release that rewrites whole client documents (0.9.0) cannot drop it, and it is in force only
    beside the secret that replaced it (``successor_hash``): any other change of the client's
    secret ends it."""

    client_id: str
    secret_hash: str  # the SHA-256 of the old secret
    successor_hash: str  # the SHA-256 of the secret that replaced it
    rotated_at: datetime
    expires_at: datetime
    last_used_at: datetime | None = None  # the latest use, to within PREVIOUS_USE_NOTED_EVERY
    # Whether the old secret was one the service generated (the client's secret_generated when
    # the rotation replaced it): a right old secret is exempt from the failure limits only then.
    # A record written without it (0.10.0) reads False: limited.
    generated: bool = False

    def in_force(self, client: Client, now: datetime) -> bool:
        """Whether the old secret still proves ``client``: unexpired, and the secret that
        replaced it is still the client's."""
        return now < self.expires_at and client.secret_hash == self.successor_hash


@dataclass(slots=True)
class Removal:
    """A client's removal under way: recorded before anything else of it, so that from then on
    the client is gone for every process of this release (the store answers no client, whatever
    document a writer left or made), and finished by a retry of the removal or by the next
    start-up once every grant of the client is revoked."""

    client_id: str
    started_at: datetime
    # Which removal of the client this is (random, the call's that recorded it): what its last
    # step is conditional on, so that a run of it after the record went (its reply lost, or
    # another call finished it) deletes nothing registered since under the same id.
    tag: str | None = None
    # Which document of the client the removal takes (MongoDB: the ``claim`` of the document
    # there when it was recorded, "" for a document with none; None: unknown, a record of
    # release 0.10.0). A client registered since under the id has a claim of its own, which no
    # step of this removal matches. Not part of a removal's equality: a store of one process
    # needs none.
    client_claim: str | None = field(default=None, compare=False)


def web_origin(url: str) -> str | None:
    """``scheme://host[:port]`` of an https URL; None for any other (http is only ever a
    loopback redirect's: a native app's)."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc.lower()}"


@dataclass(slots=True)
class User:
    user_id: str
    username: str
    password_hash: str
    admin: bool = False
    # When something the user's tokens may do was last withdrawn (no longer an administrator;
    # being removed): written with the change, so that every process hears of it (the
    # revocation feed names the user) and resource servers drop the answers they cached. An
    # event, never state: nothing decides anything on its value, so a writer that drops it
    # (0.9.0 replaces whole documents) loses nothing that was heard when it was written.
    narrowed_at: datetime | None = None
    owner: str | None = None  # who writes it at every start (OWNER, above); None: the admin API


@dataclass(slots=True)
class Installation:
    installation_id: str
    name: str
    kind: str  # "telescope" | "observatory"
    operators: list[str] = field(default_factory=list)  # user ids
    owner: str | None = None  # who writes it at every start (OWNER, above); None: the admin API


@dataclass(slots=True)
class Subject:
    """Who a grant, code or token belongs to: a user or a node installation, never both."""

    user_id: str | None = None
    installation_id: str | None = None

    def __post_init__(self) -> None:
        if (self.user_id is None) == (self.installation_id is None):
            raise ValueError("a subject is exactly one of a user or an installation")

    @property
    def kind(self) -> str:
        return "user" if self.user_id is not None else "installation"

    @property
    def id(self) -> str:
        return self.user_id if self.user_id is not None else self.installation_id  # type: ignore[return-value]


@dataclass(slots=True)
class Grant:
    grant_id: str
    client_id: str
    user_id: str | None
    installation_id: str | None
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None = None
    # Raised each time a revoked grant is consented to again. Codes and tokens carry the
    # generation they were issued under, and only the current one's authorize anything: an
    # old token left unswept by a revocation that failed half-way never comes back to life.
    generation: int = 0

    @property
    def subject(self) -> Subject:
        return Subject(self.user_id, self.installation_id)

    def stands_behind(self, generation: int) -> bool:
        """Whether this grant still authorizes what was issued under ``generation``."""
        return self.revoked_at is None and self.generation == generation


@dataclass(slots=True)
class AuthorizationCode:
    code_hash: str
    client_id: str
    redirect_uri: str
    scopes: list[str]
    user_id: str | None
    installation_id: str | None
    code_challenge: str
    code_challenge_method: str
    expires_at: datetime
    consumed_at: datetime | None = None
    # Spent by a failed check (verifier, redirect_uri, client) rather than redeemed: dead, but
    # presenting it again is no replay (RFC 6749 §4.1.2 revokes only for a redeemed code).
    spent_by_failure: bool = False
    generation: int = 0  # the grant's, when the code was issued
    family_id: str | None = None  # the family its redemption started
    grant_id: str | None = None  # the grant it was issued under (None: issued by 0.10.0)
    # The resources its tokens are meant for (RFC 8707), as the authorization request named
    # them; None: named none, so meant for every API (as before audiences).
    audience: list[str] | None = None

    @property
    def subject(self) -> Subject:
        return Subject(self.user_id, self.installation_id)


ACCESS = "access"
REFRESH = "refresh"


@dataclass(slots=True)
class Family:
    """Every token descended from one redeemed authorization code: the code's exchange and
    each refresh rotation after it (RFC 9700 §4.14.2 revokes a family on reuse).

    One record however often the family refreshes: it holds the current access and refresh
    token (as hashes), the refresh token rotated out last (for a retry within the grace
    period), and when the current pair replaced it. Every refresh token of the family carries
    the family's secret (``tokensvc.oauth.tokens``), so a rotated-out one is recognised
    without a record of its own; a refresh replaces the family's access token (one pair per
    family, as ORY Hydra's refresh does).
    """

    family_id: str  # the SHA-256 of the family secret every refresh token of it starts with
    grant_id: str
    client_id: str
    user_id: str | None
    installation_id: str | None
    generation: int  # the grant's, when the code was issued
    scopes: list[str]  # the current pair's (a refresh may narrow them)
    created_at: datetime  # the code's redemption
    refresh_hash: str
    access_hash: str
    issued_at: datetime  # when the current pair was issued
    expires_at: datetime  # the current refresh token's expiry: the record lives this long
    access_expires_at: datetime
    # The refresh token the current pair replaced, and when: a client whose reply was lost
    # may present it again within the grace period, while the current pair is unused.
    previous_hash: str | None = None
    renewed_at: datetime | None = None  # the last rotation (or the exchange)
    access_used_at: datetime | None = None  # the current access token's first presentation
    access_revoked_at: datetime | None = None  # the current access token revoked alone
    revoked_at: datetime | None = None  # the whole family
    rotations: int = 0
    # The current pair's number in the family (the exchange's is 0; each rotation or reissue
    # adds one), the id of the successor key it was derived with (None: a random pair) and the
    # random salt its derivation took. Presentations of the token it succeeded that come within
    # seconds get this same pair, recomputed (tokensvc.oauth.successors). A release that does
    # not derive pairs leaves all three as they were: a recomputation that does not give the
    # stored hashes is no match.
    serial: int = 0
    key_id: str | None = None
    salt: str | None = None
    # The access token the last rotation replaced, and when it would have expired: presented
    # while it would still be in force, it shows a second holder of the pair it belonged to.
    previous_access_hash: str | None = None
    previous_access_expires_at: datetime | None = None
    # When a second holder showed (that presentation): from then no presentation of a
    # rotated-out refresh token gets a successor again; the grace rules decide.
    second_holder_at: datetime | None = None
    # The resources its authorization granted (RFC 8707), as the code's request named them, or
    # None: every API. Its refresh tokens are meant for them all, whatever a refresh names.
    # Written only once the store's compatibility version is format 3, which no release that
    # ignores it may serve (tokensvc.storage.mongo.format).
    audience: list[str] | None = None
    # The current access token's own audience, when the exchange or the refresh that issued it
    # named ``resource`` (RFC 8707 §2.2: some of ``audience``, or any declared one when that is
    # None); None: ``audience``. Each new pair writes it.
    access_audience: list[str] | None = None

    @property
    def subject(self) -> Subject:
        return Subject(self.user_id, self.installation_id)

    def access(self) -> Token:
        return Token(ACCESS, self.access_hash, self.family_id, self.client_id, self.grant_id, self.scopes,
                     self.issued_at, self.access_expires_at, self.user_id, self.installation_id,
                     self.generation, self.revoked_at or self.access_revoked_at, self.access_target)

    def refresh(self) -> Token:
        return Token(REFRESH, self.refresh_hash, self.family_id, self.client_id, self.grant_id, self.scopes,
                     self.issued_at, self.expires_at, self.user_id, self.installation_id, self.generation,
                     self.revoked_at, self.audience)

    @property
    def access_target(self) -> list[str] | None:
        """The resources the current access token is meant for (None: every API)."""
        return self.audience if self.access_audience is None else self.access_audience

    def stands(self, grant: Grant | None) -> bool:
        """Not revoked, and its grant still stands behind the generation it was issued under."""
        return self.revoked_at is None and grant is not None and grant.stands_behind(self.generation)

    def replaceable(self, grace_seconds: int, now: datetime) -> bool:
        """Whether a retry may still replace the current pair, as a lost reply's: within the
        grace period after the exchange or rotation that issued it, and never used (its
        refresh token not rotated, its access token never presented)."""
        return (grace_seconds > 0 and self.revoked_at is None and self.access_used_at is None
                and self.renewed_at is not None and (now - self.renewed_at).total_seconds() <= grace_seconds)


@dataclass(slots=True, frozen=True)
class Pair:
    """What the store keeps of a newly minted access + refresh pair: hashes, scopes, times."""

    access_hash: str
    refresh_hash: str
    scopes: list[str]
    issued_at: datetime
    expires_at: datetime  # the refresh token's
    access_expires_at: datetime
    serial: int = 0  # see Family.serial, Family.key_id and Family.salt
    key_id: str | None = None
    salt: str | None = None
    access_audience: list[str] | None = None  # see Family.access_audience


@dataclass(slots=True, frozen=True)
class Token:
    """An access or refresh token as the protocol sees it: the current pair of a
    :class:`Family` (tokens have no records of their own)."""

    token_type: str  # ACCESS | REFRESH
    token_hash: str
    family_id: str
    client_id: str
    grant_id: str
    scopes: list[str]
    issued_at: datetime
    expires_at: datetime
    user_id: str | None = None
    installation_id: str | None = None
    generation: int = 0
    revoked_at: datetime | None = None
    audience: list[str] | None = None  # the resources it is meant for (RFC 8707); None: every API

    @property
    def subject(self) -> Subject:
        return Subject(self.user_id, self.installation_id)

    def meant_for(self, resources: list[str]) -> bool:
        """Whether the token may be used at an API serving ``resources``: it names no
        audience, or one of them."""
        return self.audience is None or any(resource in self.audience for resource in resources)


@dataclass(slots=True)
class Session:
    session_hash: str
    user_id: str
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None = None  # signed out (kept until it expires, so a revocation can be followed)
    # What the account page shows the user of their sessions (never a secret).
    user_agent: str | None = None
    address: str | None = None
    last_seen_at: datetime | None = None

    @property
    def public_id(self) -> str:
        """How the account page and ``/v1/me/sessions`` name it: a prefix of the hash, which
        says nothing of the id in the cookie."""
        return self.session_hash[:24]
