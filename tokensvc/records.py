"""The records tokensvc stores.

Plain dataclasses shared by the protocol layer and every storage backend. Secrets never
appear here in clear: tokens, codes, client secrets and session ids are held as their
SHA-256 hex digest, passwords as a scrypt hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

DEFAULT_SCOPES = ("read",)


def utcnow() -> datetime:
    """The current UTC time at millisecond precision, the precision MongoDB stores (so both
    backends hand back the times they were given)."""
    now = datetime.now(timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


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

    @property
    def confidential(self) -> bool:
        return self.secret_hash is not None

    @property
    def scopes(self) -> list[str]:
        """The scopes the client may ask for (a null list means ``["read"]``)."""
        return list(DEFAULT_SCOPES) if self.allowed_scopes is None else self.allowed_scopes


@dataclass(slots=True)
class User:
    user_id: str
    username: str
    password_hash: str
    admin: bool = False


@dataclass(slots=True)
class Installation:
    installation_id: str
    name: str
    kind: str  # "telescope" | "observatory"
    operators: list[str] = field(default_factory=list)  # user ids


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

    @property
    def subject(self) -> Subject:
        return Subject(self.user_id, self.installation_id)


ACCESS = "access"
REFRESH = "refresh"


@dataclass(slots=True)
class Token:
    token_hash: str
    token_type: str  # ACCESS | REFRESH
    client_id: str
    grant_id: str
    scopes: list[str]
    issued_at: datetime
    expires_at: datetime
    user_id: str | None = None
    installation_id: str | None = None
    revoked_at: datetime | None = None
    rotated_at: datetime | None = None  # refresh tokens only
    parent_hash: str | None = None  # the refresh token whose rotation minted this one
    generation: int = 0  # the grant's, when the token was minted

    @property
    def subject(self) -> Subject:
        return Subject(self.user_id, self.installation_id)

    def is_active(self, now: datetime) -> bool:
        return self.revoked_at is None and self.rotated_at is None and now < self.expires_at

    def in_force(self, grant: Grant | None, now: datetime) -> bool:
        """Active, and its grant still stands behind it: a revoked grant's tokens authorize
        nothing, whether or not the revocation's sweep reached them."""
        return self.is_active(now) and grant is not None and grant.stands_behind(self.generation)


@dataclass(slots=True)
class Session:
    session_hash: str
    user_id: str
    created_at: datetime
    expires_at: datetime
