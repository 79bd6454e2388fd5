"""Record dataclass <-> MongoDB document: a record's key stored as ``_id``, and its hashes
packed as the store's format says, looked for in either format (storage/mongo/hashes.py), here and
not at each call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from datetime import UTC, datetime
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
    User,
)
from tokensvc.storage.mongo import hashes


def as_utc(value: Any) -> Any:
    # Drivers hand back naive or fixed-offset datetimes; records hold aware UTC ones.
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value


def stored(moment: datetime) -> datetime:
    """``moment`` as MongoDB stores it (milliseconds), so that it finds what it wrote."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def as_is(value: Any) -> Any:
    return value


class Mapper:
    """Record dataclass <-> document, with the record's key stored as ``_id`` and the fields
    named in ``hashes`` stored as the store's format says (``pack``), read in either."""

    def __init__(self, cls: type, key: str, hashes: tuple[str, ...] = (), kept: tuple[str, ...] = ()) -> None:
        # ``kept``: fields one write alone sets (an entry's owner: Store.set_owners), which
        # every other write of the record keeps.
        self.cls, self.key, self.hashes, self.kept = cls, key, hashes, kept
        self.names = [f.name for f in fields(cls)]
        # A field added in a later release is missing from older documents: its default.
        self.defaults = {f.name: f.default for f in fields(cls) if f.default is not MISSING}

    def doc(self, record: Any, pack: Callable[[Any], Any] = as_is) -> dict[str, Any]:
        document = {name: getattr(record, name) for name in self.names}
        for name in self.hashes:
            document[name] = pack(document[name])
        document["_id"] = document.pop(self.key)
        return document

    def match(self, **values: Any) -> dict[str, Any]:
        """A filter on ``values`` (the key's as ``_id``): a hash found in either format."""
        return {"_id" if name == self.key else name: hashes.either(value) if name in self.hashes else value
                for name, value in values.items()}

    def writable(self, **values: Any) -> dict[str, Any]:
        """The filter of a single-document write: :meth:`match`, never on a frozen original
        (storage/mongo/hashes.py: a document being moved is written on its copy)."""
        return {**self.match(**values), **hashes.NOT_FROZEN}

    def fields(self, pack: Callable[[Any], Any], **values: Any) -> dict[str, Any]:
        """Field values as a write stores them: a hash as ``pack`` (the store's format) says."""
        return {name: pack(value) if name in self.hashes else value for name, value in values.items()}

    def setting(self, record: Any) -> dict[str, Any]:
        """The update that writes every field this release knows and keeps the others: a field a
        later release added survives this one's writes (0.9.0 replaced whole documents, and
        dropped them). The fields ``kept`` are not written: the document keeps its own."""
        document = self.doc(record)
        del document["_id"]
        for name in self.kept:
            del document[name]
        return {"$set": document}

    def record(self, document: dict[str, Any] | None) -> Any:
        if document is None:
            return None
        values = {name: as_utc(document.get(name, self.defaults.get(name))) for name in self.names if name != self.key}
        values[self.key] = document["_id"]
        for name in self.hashes:
            values[name] = hashes.unpacked(values[name])
        return self.cls(**values)


CLIENTS = Mapper(Client, "client_id", kept=("owner",))
PREVIOUS_SECRETS = Mapper(PreviousSecret, "client_id")
REMOVALS = Mapper(Removal, "client_id")
USERS = Mapper(User, "user_id", kept=("owner",))
INSTALLATIONS = Mapper(Installation, "installation_id", kept=("owner",))
GRANTS = Mapper(Grant, "grant_id")
CODES = Mapper(AuthorizationCode, "code_hash", ("code_hash", "family_id"))
FAMILIES = Mapper(Family, "family_id",
                   ("family_id", "refresh_hash", "access_hash", "previous_hash", "previous_access_hash"))
SESSIONS = Mapper(Session, "session_hash", ("session_hash",))


def pair_fields(pair: Pair) -> dict[str, Any]:
    """The fields a new pair sets on its family; the access token's marks start afresh."""
    return {"refresh_hash": pair.refresh_hash, "access_hash": pair.access_hash,
            "scopes": list(pair.scopes), "issued_at": pair.issued_at, "expires_at": pair.expires_at,
            "access_expires_at": pair.access_expires_at, "access_used_at": None, "access_revoked_at": None,
            "serial": pair.serial, "key_id": pair.key_id, "salt": pair.salt,
            "access_audience": _listed(pair.access_audience)}


def _listed(values: list[str] | None) -> list[str] | None:
    return None if values is None else list(values)
