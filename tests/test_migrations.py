"""The conversion of format-1 rows beside live traffic, on MongoDB's in-process stand-in that
yields to the event loop between every driver call (tests/yielding.py), so that each step of
a move can meet a live write: a document frozen by a mover is finished by whoever meets it, a
revocation a sweep writes on a frozen original reaches its copy, a refresh chain and bearer
checks running through a migration never miss, two migrations at once and one interrupted
all end with every row converted once."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest
from mongomock_motor import AsyncMongoMockClient
from yielding import Yielding

from tokensvc.oauth import hashing
from tokensvc.records import AuthorizationCode, Family, Pair, Session, utcnow
from tokensvc.storage.base import StorageError
from tokensvc.storage.mongo import MongoStore, hashes, migrations

pytestmark = [pytest.mark.mongodb, pytest.mark.gen_test(timeout=60)]


async def format_1_store() -> MongoStore:
    """A store 0.9.0 wrote (compatibility 1: this release writes 0.9.0's format into it)."""
    client = Yielding(AsyncMongoMockClient(tz_aware=True))
    await client["tokensvc"]["users"].insert_one({"_id": "u_alice", "username": "alice", "password_hash": "x"})
    store = MongoStore(client, "tokensvc", change_streams=False)
    await store.open()
    assert store.format.compatibility == 1
    await store.db["grants"].insert_one({"_id": "g1", "client_id": "webapp", "user_id": "u_alice",
                                         "installation_id": None, "scopes": ["read"], "created_at": utcnow(),
                                         "revoked_at": None, "generation": 0})
    return store


async def finalized(store: MongoStore) -> None:
    await store.db["meta"].update_one({"_id": "format"}, {"$set": {"compatibility": 2}})
    store.format = replace(store.format, compatibility=2)


def pair(name: str, now) -> Pair:
    return Pair(hashing.digest("access " + name), hashing.digest("refresh " + name), ["read"], now,
                now + timedelta(hours=1), now + timedelta(minutes=10))


async def new_family(store: MongoStore, name: str, scopes: tuple[str, ...] = ("read",)) -> Family:
    now = utcnow()
    first = pair(name, now)
    family = Family(hashing.digest("family " + name), "g1", "webapp", "u_alice", None, 0, list(scopes), now,
                    first.refresh_hash, first.access_hash, now, first.expires_at, first.access_expires_at,
                    renewed_at=now)
    assert await store.create_family(family)
    return family


async def with_families(count: int) -> MongoStore:
    """A store 0.9.0 wrote holding ``count`` families, then finalized."""
    store = await format_1_store()
    for index in range(count):
        await new_family(store, str(index))
    await finalized(store)
    return store


def batches(count: int):
    """A pass's ``still_mine`` that lets ``count`` batches through, then stops the pass."""
    given = 0

    async def still_mine() -> bool:
        nonlocal given
        given += 1
        return given <= count

    return still_mine


async def code_and_session(store: MongoStore) -> tuple[AuthorizationCode, Session]:
    """A code and a session, written in the store's format."""
    now = utcnow()
    code = AuthorizationCode(hashing.digest("code"), "webapp", "https://a/cb", ["read"], "u_alice", None, "x" * 43,
                             "S256", now + timedelta(minutes=5))
    await store.add_code(code)
    session = Session(hashing.digest("session"), "u_alice", now, now + timedelta(hours=1))
    await store.add_session(session)
    return code, session


async def freeze(store: MongoStore, collection: str, key: str) -> dict:
    """A mover's first step, and no more (as if it died there)."""
    return await store.db[collection].find_one_and_update({"_id": key}, {"$set": {hashes.MOVING: utcnow()}},
                                                          return_document=True)


async def packed_only(store: MongoStore) -> bool:
    return [await store.db[name].count_documents({"_id": {"$type": "string"}})
            for name in ("codes", "families", "sessions")] == [0, 0, 0]


async def test_each_write_that_meets_a_frozen_document_finishes_its_move_and_applies():
    store = await format_1_store()
    now = utcnow()
    families = [await new_family(store, str(index)) for index in range(6)]
    code, session = await code_and_session(store)
    await finalized(store)
    for name, key in [("families", family.family_id) for family in families] + [
            ("codes", code.code_hash), ("sessions", session.session_hash)]:
        await freeze(store, name, key)
    writes = [
        store.rotate_family(families[0].family_id, families[0].refresh_hash, pair("0b", now), now),
        store.reissue_pair(families[1].family_id, families[1].refresh_hash, pair("1b", now)),
        store.revoke_family(families[2].family_id, now),
        store.revoke_access(families[3].family_id, families[3].access_hash, now),
        store.mark_access_used(families[4].family_id, families[4].access_hash, now),
        store.consume_code(code.code_hash, now, family_id=families[5].family_id),
        store.end_session(session.session_hash, now),
    ]
    results = [await write for write in writes]
    assert results[0].refresh_hash == pair("0b", now).refresh_hash
    assert results[1].access_hash == pair("1b", now).access_hash
    assert results[2:4] == [True, True] and results[5].consumed_at is None and results[6] is True
    assert (await store.get_family(families[4].family_id))[0].access_used_at == now
    assert (await store.get_code(code.code_hash)).family_id == families[5].family_id
    # Each one it met moved (the sixth family, never written, still waits for the migration).
    assert await store.db["families"].count_documents({"_id": {"$type": "string"}}) == 1
    assert await store.db["codes"].count_documents({"_id": {"$type": "string"}}) == 0
    await store.touch_session(session.session_hash, now)  # on the copy
    await store.close()


async def test_a_revocation_swept_onto_a_frozen_original_holds_and_reaches_its_copy():
    store = await format_1_store()
    family = await new_family(store, "a")
    session = Session(hashing.digest("session"), "u_alice", utcnow(), utcnow() + timedelta(hours=1))
    await store.add_session(session)
    await finalized(store)
    frozen = await freeze(store, "families", family.family_id)
    frozen_session = await freeze(store, "sessions", session.session_hash)
    # A mover that read the frozen documents made their copies; the sweeps came in between.
    now = utcnow()
    assert await store.revoke_grant_families("g1", now) == 1
    assert await store.end_user_sessions("u_alice", now) == 1
    for collection, document in (("families", frozen), ("sessions", frozen_session)):
        copy = {key: hashes.packed(value) if key in hashes.HASHED[collection] else value
                for key, value in document.items() if key not in (hashes.MOVING, hashes.GUARD)}
        await store.db[collection].insert_one(copy)
    # While both exist, a read sees the revocation the original alone carries.
    assert (await store.get_family(family.family_id))[0].revoked_at == now
    assert (await store.find_access(family.access_hash))[0].revoked_at == now
    assert await store.get_session(session.session_hash) is None
    assert [f.family_id for f in await store.list_families("g1")] == []
    # The migration finishes the moves: the copies carry the revocations, the originals are gone.
    await migrations.run(store, "packed-hashes")
    assert await packed_only(store)
    assert (await store.db["families"].find_one())["revoked_at"] is not None
    assert (await store.db["sessions"].find_one())["ended_at"] is not None
    await store.close()


class Paused:
    """The database as a mover sees it: after its ``at``-th operation, ``then`` runs (live
    operations meeting the move in that state) before the mover goes on."""

    def __init__(self, db, at: int, then) -> None:
        self.db, self.at, self.then, self.operations = db, at, then, 0

    def __getitem__(self, name: str) -> _PausedCollection:
        return _PausedCollection(self, self.db[name])


class _PausedCollection:
    def __init__(self, owner: Paused, collection) -> None:
        self.owner, self.collection = owner, collection

    def __getattr__(self, name: str):
        method = getattr(self.collection, name)

        async def call(*args, **kwargs):
            result = await method(*args, **kwargs)
            self.owner.operations += 1
            if self.owner.operations == self.owner.at:
                await self.owner.then()
            return result

        return call


MOVE_STEPS = 4  # a family's move: freeze, copy, hand a narrowing of its scopes on, delete the original


@pytest.mark.parametrize("step", range(1, MOVE_STEPS + 1))
async def test_after_each_step_of_a_move_the_family_serves_reads_and_rotations(step):
    store = await format_1_store()
    family = await new_family(store, "a")
    await finalized(store)
    current = family

    async def live() -> None:
        nonlocal current
        for round_ in range(2):
            found, grant = await store.get_family(family.family_id)
            assert found.refresh_hash == current.refresh_hash and grant.grant_id == "g1"
            assert (await store.find_access(current.access_hash))[0].rotations == current.rotations
            now = utcnow()
            rotated = await store.rotate_family(family.family_id, current.refresh_hash, pair(f"{step} {round_}", now),
                                                now)
            assert rotated is not None and rotated.rotations == current.rotations + 1
            current = rotated

    document = await store.db["families"].find_one()
    await hashes.move(Paused(store.db, step, live), "families", document, utcnow())
    assert await packed_only(store)
    found, _ = await store.get_family(family.family_id)
    assert (found.refresh_hash, found.rotations) == (current.refresh_hash, 2)
    await store.close()


@pytest.mark.parametrize("step", range(1, MOVE_STEPS + 1))
async def test_a_sweep_after_any_step_of_a_move_revokes_the_family_for_good(step):
    store = await format_1_store()
    family = await new_family(store, "a")
    await finalized(store)

    async def sweep() -> None:
        assert await store.revoke_grant_families("g1", utcnow()) in (1, 2)  # the original and its copy
        assert (await store.get_family(family.family_id))[0].revoked_at is not None
        assert await store.list_families("g1") == []

    document = await store.db["families"].find_one()
    await hashes.move(Paused(store.db, step, sweep), "families", document, utcnow())
    assert await packed_only(store)
    assert (await store.get_family(family.family_id))[0].revoked_at is not None
    assert await store.db["families"].count_documents({}) == 1
    await store.close()


@pytest.mark.parametrize("step", range(1, MOVE_STEPS + 1))
async def test_a_narrowing_after_any_step_of_a_move_holds_for_good(step):
    """A narrowed client's scopes withdrawn (a sweep: ``withdraw_scopes``) while a family moves:
    the read in between and the family once moved hold only what the narrowing kept."""
    store = await format_1_store()
    family = await new_family(store, "a", ("read", "write"))
    await finalized(store)

    async def narrow() -> None:
        await store.withdraw_scopes("webapp", ["read"])  # the original, or its copy, or both
        assert (await store.get_family(family.family_id))[0].scopes == ["read"]

    document = await store.db["families"].find_one()
    await hashes.move(Paused(store.db, step, narrow), "families", document, utcnow())
    assert await packed_only(store)
    assert (await store.get_family(family.family_id))[0].scopes == ["read"]
    assert await store.db["families"].count_documents({}) == 1
    await store.close()


async def test_refreshes_and_bearer_checks_running_through_a_migration_never_miss(monkeypatch):
    monkeypatch.setattr(migrations, "BATCH", 3)
    store = await format_1_store()
    families = [await new_family(store, str(index)) for index in range(12)]
    await finalized(store)
    failures: list[str] = []

    async def live(family: Family) -> None:
        current = family
        for round_ in range(8):
            now = utcnow()
            found, _ = await store.find_access(current.access_hash)
            if found is None or found.revoked_at is not None:
                failures.append(f"{family.family_id[:8]}: access missed in round {round_}")
            rotated = await store.rotate_family(family.family_id, current.refresh_hash,
                                                pair(f"{family.family_id} {round_}", now), now)
            if rotated is None:
                failures.append(f"{family.family_id[:8]}: rotation missed in round {round_}")
                return
            current = rotated

    await asyncio.gather(migrations.run(store, "packed-hashes"), migrations.run(store, "packed-hashes"),
                         *(live(family) for family in families))
    assert failures == []
    assert await packed_only(store)
    assert await store.db["families"].count_documents({}) == 12
    for family in families:
        found, _ = await store.get_family(family.family_id)
        assert found.rotations == 8 and found.revoked_at is None
    assert "packed-hashes" in (await store.db["meta"].find_one())["migrations"]
    await store.close()


async def test_a_migration_stopped_half_way_resumes_where_it_stood(monkeypatch):
    monkeypatch.setattr(migrations, "BATCH", 2)
    store = await with_families(7)
    seen: list[int] = []
    assert await migrations.run(store, "packed-hashes", lambda *line: seen.append(line[2]),
                                still_mine=batches(2)) == 4
    progress = (await store.db["meta"].find_one())["progress"]["packed-hashes"]
    assert progress["collection"] == "families" and progress["rows"] == 4
    assert await store.db["families"].count_documents({"_id": {"$type": "string"}}) == 3
    assert await migrations.run(store, "packed-hashes", lambda *line: seen.append(line[2])) == 7
    assert seen[:2] == [2, 4] and seen[-1] == 7
    document = await store.db["meta"].find_one()
    assert document["migrations"]["packed-hashes"]["rows"] == 7 and document["progress"] == {}
    assert await packed_only(store)
    await store.close()


async def test_a_row_written_in_the_old_format_behind_a_pass_makes_another():
    store = await format_1_store()
    await new_family(store, "a")
    await finalized(store)
    late = False

    def progress(name: str, collection: str, rows: int) -> None:
        nonlocal late
        if not late:  # a process that had not followed the compatibility version yet
            late = True
            store.format = replace(store.format, compatibility=1)
            asyncio.get_running_loop().create_task(new_family(store, "late"))

    assert await migrations.run(store, "packed-hashes", progress) == 2
    assert await packed_only(store)
    await store.close()


class Died(Exception):
    """A mover stopped where it stood: kill -9, Ctrl+C, its budget running out."""


async def die() -> None:
    raise Died


@pytest.mark.parametrize("step", range(1, MOVE_STEPS + 1))
async def test_a_move_cut_short_after_any_step_never_answers_from_its_frozen_original(step):
    """A mover dies after ``step`` steps; then the family is rotated and revoked, the session
    ended, the code redeemed (each write lands on the copy once there is one, while the frozen
    original keeps the hashes it had). Every read keyed by a hash, with the previous access
    hash, the previous refresh hash and the current ones, answers as the copy says: before a
    later pass completes the moves, and after."""
    store = await format_1_store()
    family = await new_family(store, "a")
    now = utcnow()
    code, session = await code_and_session(store)
    await finalized(store)
    for collection in ("families", "sessions", "codes"):
        document = await store.db[collection].find_one()
        if step < MOVE_STEPS or collection in hashes.NARROWED:  # a session's move has no narrowing to hand on
            with pytest.raises(Died):
                await hashes.move(Paused(store.db, step, die), collection, document, utcnow())
    rotated = await store.rotate_family(family.family_id, family.refresh_hash, pair("b", now), now)
    assert rotated is not None

    async def live_then_revoked(revoked: bool) -> None:
        at = utcnow()
        assert await store.find_access(family.access_hash) == (None, None)  # rotated out
        found, grant = await store.get_family(family.family_id)
        assert (found.refresh_hash, found.previous_hash, grant.grant_id) == (rotated.refresh_hash,
                                                                             family.refresh_hash, "g1")
        assert (found.revoked_at is not None) == revoked
        by_access, _ = await store.find_access(rotated.access_hash)
        assert by_access.family_id == family.family_id and (by_access.revoked_at is not None) == revoked
        assert await store.rotate_family(family.family_id, family.refresh_hash, pair("c", at), at) is None
        assert await store.reissue_pair(family.family_id, family.refresh_hash, pair("c", at)) is None
        assert not await store.revoke_access(family.family_id, family.access_hash, at)
        assert [f.family_id for f in await store.list_families("g1")] == ([] if revoked else [family.family_id])
        assert (await store.get_session(session.session_hash) is None) == revoked
        assert len(await store.list_user_sessions("u_alice", at)) == (0 if revoked else 1)
        assert ((await store.get_code(code.code_hash)).consumed_at is not None) == revoked

    await live_then_revoked(False)
    assert await store.revoke_family(family.family_id, now)
    assert await store.end_session(session.session_hash, now)
    assert (await store.consume_code(code.code_hash, now, family_id=family.family_id)).consumed_at is None
    await live_then_revoked(True)
    await migrations.run(store, "packed-hashes")
    assert await packed_only(store)
    await live_then_revoked(True)
    await store.close()


# -- one family per id, whichever format each process writes ------------------------------------


def laggard_beside(store: MongoStore) -> MongoStore:
    """Another process on the same database that has not yet seen the store finalized: it still
    writes format 1 (its next heartbeat would tell it)."""
    laggard = MongoStore(store.client, "tokensvc", change_streams=False)
    laggard.format = replace(store.format, compatibility=1)
    return laggard


def redemption(name: str, pair_name: str) -> Family:
    """The family a code's redemption writes: its id follows from the code and verifier, its
    pair is new each time."""
    now = utcnow()
    issued = pair(pair_name, now)
    return Family(hashing.digest("family " + name), "g1", "webapp", "u_alice", None, 0, ["read"], now,
                  issued.refresh_hash, issued.access_hash, now, issued.expires_at, issued.access_expires_at,
                  renewed_at=now)


async def test_a_family_is_written_once_whichever_format_each_process_writes():
    store = await format_1_store()
    await finalized(store)
    laggard = laggard_beside(store)
    # In turn, either format first.
    assert await store.create_family(redemption("a", "a first"))
    assert not await laggard.create_family(redemption("a", "a again"))
    assert await laggard.create_family(redemption("b", "b first"))
    assert not await store.create_family(redemption("b", "b again"))
    # At once: each check finds nothing, and both write.
    for index in range(8):
        name = f"at once {index}"
        written = await asyncio.gather(store.create_family(redemption(name, name + " packed")),
                                       laggard.create_family(redemption(name, name + " hex")))
        assert sorted(written) == [False, True], name
    ids = [hashes.unpacked(document["_id"]) for document in await store.db["families"].find().to_list(None)]
    assert len(ids) == len(set(ids)) == 10
    # The migration moves the hex ones to their packed keys: no twin to meet.
    await migrations.run(store, "packed-hashes")
    assert await packed_only(store) and await store.db["families"].count_documents({"revoked_at": None}) == 10
    await store.close()


async def test_a_twin_written_anyway_is_taken_as_a_code_used_twice(caplog):
    """A family in each format under one id (0.9.0, started against the rules, redeemed the
    code again, without the guard): every read takes it as revoked, and the migration keeps
    one document, revoked, and says so without naming it."""
    store = await format_1_store()
    await finalized(store)
    assert await store.create_family(redemption("a", "0.10.0"))
    twin = redemption("a", "0.9.0")
    await store.db["families"].insert_one({**{key: value for key, value in (await store.db["families"].find_one(
        )).items() if key != hashes.GUARD}, "_id": twin.family_id, "refresh_hash": twin.refresh_hash,
        "access_hash": twin.access_hash, "created_at": utcnow() + timedelta(seconds=1)})
    assert (await store.get_family(twin.family_id))[0].revoked_at is not None
    assert await store.list_families("g1") == []
    await migrations.run(store, "packed-hashes")
    [document] = await store.db["families"].find().to_list(None)
    assert isinstance(document["_id"], bytes) and document["revoked_at"] is not None
    assert "written twice, once in each format" in caplog.text and twin.family_id not in caplog.text
    await store.close()


async def test_a_code_redeemed_at_a_process_writing_format_2_and_again_at_one_still_writing_format_1():
    from helpers import CHALLENGE, VERIFIER, WEBAPP_REDIRECT, make_config

    from tokensvc.bootstrap import make_context, seed
    from tokensvc.oauth import authorization, grants, introspection
    from tokensvc.oauth.errors import InvalidGrant

    config = make_config(storage={"backend": "mongodb", "mongodb_uri": "mongodb://db1,db2,db3/?replicaSet=rs0"})
    store = await format_1_store()
    await seed(store, config)
    await finalized(store)
    follower, laggard = make_context(config, store), make_context(config, laggard_beside(store))
    alice = await store.get_user_by_username("alice")
    client = await store.get_client("webapp")

    async def code() -> str:
        args = {"response_type": "code", "client_id": "webapp", "redirect_uri": WEBAPP_REDIRECT, "state": "s",
                "code_challenge": CHALLENGE, "code_challenge_method": "S256", "scope": "read"}
        request = await authorization.validate(follower, {name: [value] for name, value in args.items()})
        subject, _ = await authorization.resolve_subject(follower, request, alice)
        return (await authorization.issue_code(follower, request, subject)).split("code=")[1].split("&")[0]

    async def active(token: str) -> bool:
        return (await introspection.introspect(follower, token))["active"]

    # A code is used once: presented again at a process writing the other format, it is refused,
    # and what it was exchanged for is revoked (no second family under its id).
    for use_first in (False, True):
        redeemed = await code()
        issued = await grants.exchange_code(follower, client, redeemed, WEBAPP_REDIRECT, VERIFIER)
        if use_first:
            assert await active(issued.access_token)
        with pytest.raises(InvalidGrant, match="already used"):
            await grants.exchange_code(laggard, client, redeemed, WEBAPP_REDIRECT, VERIFIER)
        assert not await active(issued.access_token)
    assert await store.db["families"].count_documents({}) == 2
    await store.close()


# -- what a pass records ------------------------------------------------------------------------


async def test_passes_at_once_add_up_and_a_late_one_changes_nothing(monkeypatch):
    """Two passes at once count each row once (the one that moved it); a pass that starts once
    the migration is done (a process that had not seen it yet) converts nothing and leaves the
    count as it was; the progress lines grow, never repeat."""
    monkeypatch.setattr(migrations, "BATCH", 3)
    store = await with_families(7)
    lines: list[list[int]] = [[], []]
    totals = await asyncio.gather(*(migrations.run(store, "packed-hashes", lambda *line, seen=seen: seen.append(
        line[2])) for seen in lines))
    assert (await store.db["meta"].find_one())["migrations"]["packed-hashes"]["rows"] == 7 and max(totals) == 7
    for seen in lines:
        assert seen == sorted(set(seen)), seen
    assert await migrations.run(store, "packed-hashes") == 7
    assert (await store.db["meta"].find_one())["migrations"]["packed-hashes"]["rows"] == 7
    await store.close()


async def test_no_hash_in_what_a_move_says_or_a_pass_records(monkeypatch):
    class Changing:
        """A document that changes under every attempt to freeze it."""

        def __getitem__(self, name):
            return self

        async def find_one_and_update(self, *args, **kwargs):
            return None

        async def find_one(self, *args, **kwargs):
            return {"_id": key, "family_id": None}

    key = hashing.digest("code")
    with pytest.raises(StorageError) as refused:
        await hashes.move(Changing(), "codes", {"_id": key, "family_id": None}, utcnow())
    assert key not in str(refused.value) and key[:8] not in str(refused.value)
    monkeypatch.setattr(migrations, "BATCH", 2)
    store = await with_families(5)
    await migrations.run(store, "packed-hashes", still_mine=batches(1))
    recorded = repr(await store.db["meta"].find_one())
    for document in await store.db["families"].find().to_list(None):
        assert hashes.unpacked(document["_id"]) not in recorded and repr(document["_id"]) not in recorded
    await store.close()
