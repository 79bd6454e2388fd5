"""The MongoDB store's format: its history, what this release reads and writes, and the
document in which a store records where it stands.

A *format* is what the store holds: its fields, how they are represented, its indexes. Every
change to it is a new format, one entry of :data:`FORMATS` (the format's history;
docs/reference/store-format.md says how to add one), rolled out in three steps so that the previous release
and this one can serve side by side:

1. **expand**: this release reads every format of its :data:`HISTORY` from the oldest, makes the
   indexes the new format needs at start-up, and writes what the store's *compatibility
   version* says, which stays at the previous release's format;
2. **finalize** (``tokensvc storage finalize``, once no process of a release that cannot read the
   new format is connected, and every migration that could already run is done): the
   compatibility version is raised, every process writes the new format from its next
   heartbeat, the migrations of the new format convert the rows written before
   (``storage/mongo/migrations.py``), and the indexes no release still allowed to run relies on are
   dropped;
3. **contract**: a later release drops the old read path (raises :attr:`History.oldest`) and
   refuses a store whose conversion is unfinished.

A release that predates the format document (0.9.0) cannot be told to refuse a store it no
longer reads, so finalize leaves it a **tripwire**: an index it makes at start-up is renamed
(:attr:`Format.tripwires`; same keys and options, another name). Its start-up asks for the index
under its own name, the server answers that it exists under another (IndexOptionsConflict), and
0.9.0 stops with a line naming it. Releases from 0.10.0 on know both names.

The format document (collection ``meta``, ``_id: "format"``) holds ``format`` (the newest format a
release that opened the store knows: its indexes are made), ``compatibility`` (what every process
writes and every running release must read), ``migrations`` (those done: when, how many rows),
``progress`` (where an unfinished one stands), ``releases`` (each release that opened the store,
first seen when) and ``finalized`` (each raise of the compatibility version: when, by which
release). A store without one was written by 0.9.0, which predates it (format 1); an empty
database starts at this release's newest format, as no older release wrote it.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo.errors import DuplicateKeyError

from tokensvc import __version__

COLLECTION = "meta"
KEY = "format"


@dataclass(frozen=True, slots=True)
class Migration:
    """Rows of earlier formats rewritten. ``runs_from``: the compatibility version from which it
    may run, the oldest format every release still allowed to run reads its output in (a
    backfill every running release reads: the previous format's; a conversion to the new
    format: the new one, so it runs at finalize)."""

    name: str
    runs_from: int
    summary: str


@dataclass(frozen=True, slots=True)
class Format:
    """One format of the history: the first release that writes it, what changed, the
    migrations that bring earlier rows to it, and the indexes an earlier release relied on
    that it no longer needs (dropped once the compatibility version reaches it)."""

    version: int
    release: str
    summary: str
    migrations: tuple[Migration, ...] = ()
    retired_indexes: tuple[tuple[str, str], ...] = ()  # (collection, index name)
    # (collection, the name an earlier release gives an index, its name once the compatibility
    # version reaches this format): that release cannot make it beside the renamed one.
    tripwires: tuple[tuple[str, str, str], ...] = ()


# The failure counts' TTL index from finalize on: 0.9.0, which makes it as "ttl", stops at start-up,
# its line naming this one (and its advice to drop it: never do, it is what stops it).
TRIPWIRE = "ttl_format_2_tokensvc_0_9_0_cannot_read_this_store"

PACKED_HASHES = Migration(
    "packed-hashes", runs_from=2,
    summary="codes, sessions and token families keyed by the hash's 32 bytes, and every hash they hold packed")

FORMATS: tuple[Format, ...] = (
    Format(1, "0.9.0", "hashes of secrets as 64 hex characters",
           retired_indexes=(("families", "grant_id"),)),  # replaced by grant_live in 0.9.0 itself
    Format(2, "0.10.0", "hashes of secrets (a code's, a session's, a family's id, its refresh, access and "
                        "previous refresh token's, a redeemed code's family id) as their 32 bytes",
           migrations=(PACKED_HASHES,), tripwires=(("failures", "ttl", TRIPWIRE),)),
    Format(3, "0.11.0.dev0", "a token family's and an authorization code's audience (RFC 8707 resource "
                             "indicators), and a family's access token's own: tokens are bound to one "
                             "only from this format on, which no release that would ignore it may serve"),
)
# From this compatibility version on, a family may hold an audience (AUDIENCE_FROM, store.py).
AUDIENCE_FROM = 3
# Where 0.9.0, which keeps no format document, left rows: a database holding any of these was
# written by it.
FORMAT_1_COLLECTIONS = ("clients", "users", "installations", "grants", "codes", "families", "sessions")


def release_key(release: str) -> tuple[int, ...]:
    """A release's version as numbers, for ordering (``0.10.0`` after ``0.9.0``). A development
    version (PEP 440, ``0.11.0.dev0``) comes after the releases before its own, and before that
    one (``0.10.0`` < ``0.11.0.dev0`` < ``0.11.0``)."""
    numbers = [int(part) for part in re.findall(r"\d+", release.split(".dev", 1)[0])[:3]]
    development = re.fullmatch(r".*\.dev(\d+)", release)
    return (*numbers, *[0] * (3 - len(numbers)), *((0, int(development[1])) if development else (1, 0)))


@dataclass(slots=True)
class StoreFormat:
    """A store's format document, as read."""

    format: int
    compatibility: int
    migrations: dict[str, dict[str, Any]] = field(default_factory=dict)
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    releases: list[dict[str, Any]] = field(default_factory=list)
    finalized: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, document: dict[str, Any]) -> StoreFormat:
        return cls(document["format"], document["compatibility"], dict(document.get("migrations") or {}),
                   dict(document.get("progress") or {}), list(document.get("releases") or []),
                   list(document.get("finalized") or []))

    def done(self, name: str) -> bool:
        return name in self.migrations


@dataclass(frozen=True, slots=True)
class History:
    """The formats a release knows, the oldest it still reads, and the release itself: what
    it may do with a store (:class:`StoreFormat`)."""

    formats: tuple[Format, ...]
    oldest: int
    release: str

    @property
    def newest(self) -> int:
        """What this release writes once the store is finalized."""
        return self.formats[-1].version

    @property
    def migrations(self) -> tuple[Migration, ...]:
        return tuple(migration for entry in self.formats for migration in entry.migrations)

    def new(self, now: datetime | None = None) -> StoreFormat:
        """A store this release made: its own format, nothing to migrate."""
        return StoreFormat(self.newest, self.newest, {m.name: {"done_at": now, "rows": 0} for m in self.migrations})

    def first_release_of(self, version: int) -> str:
        return next(entry.release for entry in self.formats if entry.version == version)

    def newest_format_of(self, release: str | None) -> int:
        """The newest format ``release`` reads: by the history for a release this one knows; at
        least this one's for a later release (which reads what this one writes); format 1 for
        None, a release that predates the format document (0.9.0)."""
        if release is None:
            return 1
        known = [entry.version for entry in self.formats if release_key(entry.release) <= release_key(release)]
        if release_key(release) > release_key(self.release):
            known.append(self.newest)
        return max(known, default=1)

    def runnable(self, state: StoreFormat) -> list[Migration]:
        """The unfinished migrations the compatibility version already allows, in order."""
        return [m for m in self.migrations if not state.done(m.name) and m.runs_from <= state.compatibility]

    def waiting(self, state: StoreFormat) -> list[Migration]:
        """The migrations that run once the compatibility version is raised (at finalize)."""
        return [m for m in self.migrations if not state.done(m.name) and m.runs_from > state.compatibility]

    def refusal(self, state: StoreFormat) -> str | None:
        """Why this release must not serve from the store, or None."""
        if state.compatibility > self.newest:
            return (f"the store holds format {state.compatibility} (its compatibility version), which tokensvc "
                    f"{self.release} cannot read (it reads formats {self.oldest} to {self.newest}): run a later "
                    f"release, one that reads format {state.compatibility}")
        unconverted = [m.name for entry in self.formats if entry.version <= self.oldest for m in entry.migrations
                       if not state.done(m.name)]
        if state.compatibility < self.oldest or unconverted:
            return (f"the store still holds rows of format {state.compatibility}, which tokensvc {self.release} no "
                    f"longer reads: finish that upgrade first with tokensvc {self.first_release_of(self.oldest)} "
                    "(tokensvc storage finalize, then tokensvc storage migrate)")
        return None

    def retired_indexes(self, state: StoreFormat) -> list[tuple[str, str]]:
        """The indexes no release allowed to run on the store relies on any more (those
        renamed by a tripwire under their old name)."""
        return [index for entry in self.formats if entry.version <= state.compatibility
                for index in (*entry.retired_indexes, *((c, old) for c, old, _ in entry.tripwires))]

    def tripwires(self, after: int, upto: int) -> list[tuple[str, str, str]]:
        """The tripwires of the formats a raise of the compatibility version from ``after`` to
        ``upto`` reaches: (collection, the old name, the new name)."""
        return [tripwire for entry in self.formats if after < entry.version <= upto for tripwire in entry.tripwires]

    def index_name(self, collection: str, name: str, state: StoreFormat) -> str:
        """The name this release's index ``name`` has on a store at ``state``: renamed by each
        tripwire its compatibility version has reached."""
        for entry in self.formats:
            for where, old, new in entry.tripwires:
                if entry.version <= state.compatibility and (where, old) == (collection, name):
                    name = new
        return name

    def index_names(self, collection: str, name: str) -> set[str]:
        """Every name this release's index ``name`` has, whatever the compatibility version."""
        return {name, *(new for entry in self.formats for where, old, new in entry.tripwires
                        if (where, old) == (collection, name))}


# This release's: it reads format 1 (0.9.0's) and format 2.
HISTORY = History(FORMATS, oldest=1, release=__version__)


async def read(db: Any) -> StoreFormat | None:
    document = await db[COLLECTION].find_one({"_id": KEY})
    return None if document is None else StoreFormat.of(document)


async def recorded(db: Any, history: History, now: datetime) -> StoreFormat:
    """The store's format document, made for a store that has none: format 1 for what 0.9.0
    wrote, this release's format for an empty database. Several processes starting at once
    agree (the first insert wins)."""
    state = await read(db)
    if state is not None:
        return state
    written = [name for name in FORMAT_1_COLLECTIONS if await db[name].find_one({}, {"_id": 1}) is not None]
    start = StoreFormat(1, 1) if written else history.new(now)
    with contextlib.suppress(DuplicateKeyError):  # another process recorded it first
        await db[COLLECTION].update_one({"_id": KEY}, {"$setOnInsert": {
            "format": start.format, "compatibility": start.compatibility, "migrations": start.migrations,
            "progress": {}, "releases": [], "finalized": [], "created_at": now}}, upsert=True)
    return await read(db)  # type: ignore[return-value]


async def expanded(db: Any, history: History, now: datetime) -> StoreFormat:
    """Record that this release opened the store, its indexes made: ``format`` raised to this
    release's (never lowered: a later release may have opened it already), and the release
    among those seen."""
    meta = db[COLLECTION]
    await meta.update_one({"_id": KEY, "format": {"$lt": history.newest}}, {"$set": {"format": history.newest}})
    await meta.update_one({"_id": KEY, "releases.release": {"$ne": history.release}},
                          {"$push": {"releases": {"release": history.release, "first_seen": now}}})
    return await read(db)  # type: ignore[return-value]
