"""The operator's side of the store's format (``tokensvc storage status|migrate|finalize``):
where the store stands, the migrations the compatibility version allows, and its raise.

``finalize`` raises the compatibility version to this release's format only when nothing can
still need the old one: no running process and no connection of a release that cannot read
the new format (``storage/mongo/processes.py``), every migration the current version allows done,
and this release's indexes made (a process of it has opened the store). Then the processes
write the new format from their next heartbeat; finalize waits for them, drops the indexes no
release allowed to run still needs, and runs the migrations the new version allows
(``storage/mongo/migrations.py``), which ``migrate`` resumes if anything interrupts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokensvc.identifiers import resources_not_canonical
from tokensvc.records import utcnow
from tokensvc.storage.base import StorageError, StoreFault
from tokensvc.storage.mongo import format as store_format
from tokensvc.storage.mongo import migrations, processes
from tokensvc.storage.mongo.format import Migration, StoreFormat
from tokensvc.storage.mongo.retry import READ, RERUN, guarded
from tokensvc.storage.mongo.store import MongoStore

OPENED = "opened the store"  # how a release that records its opening is known (since when: the record's)


class Refused(Exception):
    """The command cannot do what it was asked: the message says why, and what to do."""


@dataclass(frozen=True, slots=True)
class Release:
    """A release that used the store, and how that is known."""

    release: str | None  # None: a release that predates the format document (0.9.0)
    since: Any  # when it first opened the store (releases that record it), else None
    how: list[str]  # "wrote format 1", "opened the store", "running", "connected"

    @property
    def name(self) -> str:
        return processes.release_name(self.release)


@dataclass(slots=True)
class Status:
    state: StoreFormat
    history: store_format.History
    running: list[processes.Seen]
    connections: list[processes.Seen] | None  # None: the server did not say
    entries: list[dict[str, Any]]  # the registry's history
    left: dict[str, int]  # rows each migration still has to convert (behind a done one: written since)
    blockers: list[str]  # why finalize would be refused now (empty: it would not)
    warnings: list[str]  # what a release that cannot read the store leaves: it must be stopped

    @property
    def seen(self) -> list[Release]:
        """Every release known to have used the store, oldest first: the one that predates the
        format document (0.9.0) when the store was ever at its format (it wrote the store, or a
        later release found its rows), each release that recorded opening the store, and the
        releases running or connected now."""
        known: dict[str | None, Release] = {}

        def saw(release: str | None, how: str, since: Any = None) -> None:
            entry = known.setdefault(release, Release(release, since, []))
            if how not in entry.how:
                entry.how.append(how)

        first = store_format.FORMATS[0].version
        if self.state.compatibility == first or any(entry.get("from") == first for entry in self.state.finalized):
            saw(None, f"wrote format {first}")
        for entry in self.state.releases:
            saw(entry.get("release"), OPENED, entry.get("first_seen"))
        for seen in self.running:
            saw(seen.release, "running")
        for seen in self.connections or []:
            saw(seen.release, "connected")
        return sorted(known.values(), key=lambda entry: store_format.release_key(entry.release or "0"))

    @property
    def runnable(self) -> list[Migration]:
        return self.history.runnable(self.state)

    @property
    def waiting(self) -> list[Migration]:
        return self.history.waiting(self.state)


@guarded(READ)
async def current(store: MongoStore) -> StoreFormat:
    """The store's format (the server a writable primary); Refused for a store no release of
    this history ever opened."""
    await store.connection.check_primary()
    state = await store_format.read(store.db)
    if state is None:
        raise Refused("the store has no format document: 0.9.0 wrote it (format 1), or it is empty; the first "
                      "tokensvc serve of this release records its format: start one, then run this command again")
    return state


@guarded(READ)
async def status(store: MongoStore, assume_stopped: bool = False) -> Status:
    state = await current(store)
    running = await processes.running(store.connection)
    connections = await processes.connected(store.connection)
    left = {migration.name: await _left(store, migration) for migration in store.history.migrations}
    return Status(state, store.history, running, connections, await processes.recent(store.connection), left,
                  _blockers(store, state, running, connections, assume_stopped),
                  _warnings(state, connections, left) + await store.indexes.unmade()
                  + resources_not_canonical((client.client_id, client.resources)
                                            for client in await store.list_clients()))


async def _left(store: MongoStore, migration: Migration) -> int:
    step = migrations.STEPS[migration.name]
    return sum([await store.db[collection].count_documents(step.left) for collection in step.collections])


def _blockers(store: MongoStore, state: StoreFormat, running: list[processes.Seen],
              connections: list[processes.Seen] | None, assume_stopped: bool) -> list[str]:
    """Why the compatibility version cannot be raised to this release's format now."""
    history, target = store.history, store.history.newest
    if state.compatibility >= target:
        return []
    refusal = history.refusal(state)
    reasons = [refusal] if refusal else []
    if state.format < target:
        reasons.append(f"no process of tokensvc {history.release} has opened the store yet (its indexes are not "
                       "made): upgrade the service first")
    reasons += [f"migration {m.name} is unfinished: run tokensvc storage migrate" for m in history.runnable(state)]
    older = [seen for seen in running if seen.reads < target]
    reasons += [f"tokensvc {seen.name} is running at {seen.where} (it reads formats up to {seen.reads})"
                for seen in older]
    if connections is None:
        if not assume_stopped:
            reasons.append("the server does not list its connections ($currentOp), so a process of a release that "
                           f"cannot read format {target} (0.9.0) could go unseen: once you know every one is "
                           "stopped, say so with --previous-release-stopped")
    else:
        by_release: dict[tuple[str, int], set[str]] = {}
        for seen in connections:
            if seen.reads < target:
                by_release.setdefault((seen.name, seen.reads), set()).add(seen.where)
        reasons += [f"tokensvc {name} is connected from {', '.join(sorted(where))} (it reads formats up to {reads})"
                    for (name, reads), where in by_release.items()]
    return reasons


def _warnings(state: StoreFormat, connections: list[processes.Seen] | None, left: dict[str, int]) -> list[str]:
    """What a process of a release that cannot read the store (0.9.0 after finalize) leaves:
    its connections, and rows of the old form behind a done migration."""
    found = [f"tokensvc {seen.name} is connected from {seen.where}, and cannot read this store (compatibility "
             f"{state.compatibility}; it reads formats up to {seen.reads}): stop it"
             for seen in connections or [] if seen.reads < state.compatibility]
    found += [f"{rows} rows of an older format were written after migration {name} was done (by a release that "
              "cannot read this store): the service converts them; find that release and stop it"
              for name, rows in left.items() if rows and state.done(name)]
    return found


def _wait_seconds(running: list[processes.Seen]) -> float:
    """How long processes may take to follow a raised compatibility version: two heartbeats."""
    return 2.0 * max((seen.heartbeat_seconds for seen in running), default=0) + 5.0


Progress = Callable[[str, str, int], None]


async def migrate(store: MongoStore, progress: Progress | None = None, said: str = "") -> dict[str, int]:
    """Run every migration the compatibility version allows that is not done (waiting first
    for the processes to write what it writes); the rows each converted. ``said`` starts
    every refusal (finalize's: the compatibility version is raised already)."""
    state = await current(store)
    refusal = store.history.refusal(state)
    if refusal is not None:
        raise Refused(said + refusal)
    converted = {}
    for migration in store.history.runnable(state):
        try:
            await migrations.wait_for_processes(store, migration.runs_from,
                                                _wait_seconds(await _running(store)))
            converted[migration.name] = await migrations.run(store, migration.name, progress)
        except migrations.NotYet as exc:
            raise Refused(f"{said}migration {migration.name} waits: {exc}") from None
        except migrations.Stopped as exc:
            raise Refused(f"{said}{exc}") from None
    store.format = await current(store)
    await _resources_index(store)
    return converted


@guarded(RERUN, budget="build_budget")
async def _resources_index(store: MongoStore) -> list[str]:
    """The index a store written before it cannot have made at start-up (indexes.py), made
    once its clients allow; what keeps it unmade is in ``store.indexes.problems``."""
    return await store.indexes.make_resources()


@guarded(READ)
async def _running(store: MongoStore) -> list[processes.Seen]:
    return await processes.running(store.connection)


async def finalize(store: MongoStore, assume_stopped: bool = False,
                   progress: Progress | None = None) -> tuple[int, dict[str, int]]:
    """Raise the compatibility version to this release's format (Refused, with every reason,
    when something may still need the old one), then migrate. Returns the version it was
    raised from and the rows each migration converted; already finalized: (the version, {})
    after completing any migration left unfinished.

    In this order, so that a process of a release that cannot read the new format (0.9.0),
    started at any moment, either stops at its start-up or is seen: the tripwire first (from
    then on such a process stops at start-up), then the look at who is connected (one started
    before the tripwire runs, and is seen: refused, the tripwire taken back), then the raise,
    then the look again (one that was still starting at the first look: the raise cannot be
    taken back, so the command says to stop it; the running processes keep looking too,
    storage/mongo/migrations.py). The blockers are looked at once before the tripwire as well, so a
    finalize refused for them changes nothing; one refused at the second look takes the
    tripwire back. A raise that fails may still apply (sent, its answer lost), so the tripwire
    then stays, and the command says to run it again."""
    found = await status(store, assume_stopped)
    state, target = found.state, store.history.newest
    if state.compatibility > target:
        raise Refused(store.history.refusal(state) or "")
    if state.compatibility == target:
        return state.compatibility, await migrate(store, progress)
    if found.blockers:
        raise Refused("not finalized: " + "; ".join(found.blockers))
    await _tripwires(store, state.compatibility, target)
    try:
        found = await status(store, assume_stopped)
        if found.state.compatibility != state.compatibility or found.blockers:
            raise Refused("not finalized: " + "; ".join(
                found.blockers or ["another finalize changed the compatibility version meanwhile: run this one again"]))
    except BaseException as exc:
        await _take_back(store, state.compatibility, target, exc)
        raise
    try:
        await _raise(store, state.compatibility, target)
    except (StorageError, StoreFault) as exc:  # sent, perhaps applied, perhaps to apply still: the tripwire stays
        raise Refused(f"not finalized for certain ({exc}): the raise of the compatibility version may still apply, so "
                      f"its tripwire stays in place (a process of a release that cannot read format {target} cannot "
                      "start): run tokensvc storage finalize again") from None
    said = (f"finalized: the compatibility version is raised from {state.compatibility} to {target} (irreversible: "
            "tokensvc storage finalize need not run again); but ")
    try:
        store.format = await current(store)
        await _follow_indexes(store)
        older = [seen for seen in await _connected(store) or [] if seen.reads < target]
        if older:
            raise Refused(f"{said}tokensvc {older[0].name} is connected from "
                          f"{', '.join(sorted({seen.where for seen in older}))}, and cannot read this store: stop it, "
                          "then run tokensvc storage migrate (the running processes convert what it writes)")
        return state.compatibility, await migrate(store, progress, said)
    except (StorageError, StoreFault) as exc:  # what a Refused does not say already
        raise Refused(f"{said}{exc}: the running processes follow the new version at their next heartbeat, and "
                      "tokensvc storage migrate converts the rows") from None


@guarded(RERUN)
async def _raise(store: MongoStore, before: int, target: int) -> None:
    await store.db[store_format.COLLECTION].update_one(
        {"_id": store_format.KEY, "compatibility": before},
        {"$set": {"compatibility": target},
         "$push": {"finalized": {"compatibility": target, "from": before, "at": utcnow(),
                                 "release": store.history.release}}})


@guarded(RERUN, budget="build_budget")
async def _follow_indexes(store: MongoStore) -> None:
    await store.indexes.follow()


@guarded(RERUN, budget="build_budget")
async def _tripwires(store: MongoStore, before: int, target: int, placed: bool = True) -> None:
    await store.indexes.set_tripwires(before, target, placed)


async def _take_back(store: MongoStore, before: int, target: int, cause: BaseException) -> None:
    """The tripwires of a finalize refused before its raise taken back, the store as it found
    it (a release that cannot read the new format may start again); left when another
    finalize raised the compatibility version meanwhile. Refused, saying so, when the store
    does not answer."""
    try:
        if (await current(store)).compatibility == before:
            await _tripwires(store, before, target, placed=False)
    except (StorageError, StoreFault, Refused) as exc:
        said = str(cause) if isinstance(cause, Refused) else f"not finalized ({cause})"
        raise Refused(f"{said}; and its tripwire is left in place ({exc}): a process of a release that cannot read "
                      f"format {target} cannot start until tokensvc storage finalize runs again") from None


@guarded(READ)
async def _connected(store: MongoStore) -> list[processes.Seen] | None:
    return await processes.connected(store.connection)
