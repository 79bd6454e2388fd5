"""The Store contract: one suite, every backend (memory, mongodb via mongomock, real MongoDB)."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import replace
from datetime import timedelta

import pytest

from backends import BACKENDS
from helpers import Clock
from tokensvc.records import (
    ACCESS, REFRESH, AuthorizationCode, Client, Installation, Session, Subject, Token, User,
)
from tokensvc.storage.base import Conflict, Store
from tokensvc.storage.memory import MemoryStore
from tokensvc.storage.mongo import MongoStore

pytestmark = pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)

ALICE = Subject(user_id="u_alice")
SCOPE = Subject(installation_id="scope-1")


@pytest.fixture
def now():
    return Clock().now


def token(now, token_hash, token_type=ACCESS, grant_id="g1", client_id="webapp", subject=ALICE,
          parent_hash=None, ttl=3600):
    return Token(token_hash=token_hash, token_type=token_type, client_id=client_id, grant_id=grant_id,
                 scopes=["read"], issued_at=now, expires_at=now + timedelta(seconds=ttl),
                 user_id=subject.user_id, installation_id=subject.installation_id, parent_hash=parent_hash)


def code(now, code_hash="c1", ttl=300):
    return AuthorizationCode(code_hash=code_hash, client_id="webapp", redirect_uri="https://a/cb",
                             scopes=["read"], user_id="u_alice", installation_id=None,
                             code_challenge="x" * 43, code_challenge_method="S256",
                             expires_at=now + timedelta(seconds=ttl))


def test_backend_implements_the_whole_interface(backend_store):
    assert isinstance(backend_store, Store)
    abstract = {name for name, member in vars(Store).items() if getattr(member, "__isabstractmethod__", False)}
    assert abstract, "the interface has abstract methods"
    for name in abstract | {"open", "close"}:
        implementation = getattr(type(backend_store), name)
        assert not getattr(implementation, "__isabstractmethod__", False), name
        assert inspect.iscoroutinefunction(implementation), name
        assert (list(inspect.signature(implementation).parameters)
                == list(inspect.signature(getattr(Store, name)).parameters)), name


def test_both_backends_cover_the_same_interface(backend_store):
    assert not MemoryStore.__abstractmethods__ and not MongoStore.__abstractmethods__
    assert not type(backend_store).__abstractmethods__


@pytest.mark.gen_test
async def test_ping(backend_store):
    await backend_store.ping()


@pytest.mark.gen_test
async def test_clients(backend_store, now):
    store = backend_store
    assert await store.get_client("b") is None
    b = Client("b", "B", ["https://b/cb"], None, None, False, None, None, now)
    a = Client("a", "A", ["https://a/cb", "https://a/cb2"], ["read", "write"], "f" * 64, True, "desc",
               "https://a/logo.png", now)
    await store.put_client(b)
    await store.put_client(a)
    assert await store.get_client("a") == a
    assert [client.client_id for client in await store.list_clients()] == ["a", "b"]
    await store.put_client(replace(a, name="A2"))
    assert (await store.get_client("a")).name == "A2"
    assert await store.delete_client("a") is True
    assert await store.delete_client("a") is False
    assert [client.client_id for client in await store.list_clients()] == ["b"]


@pytest.mark.gen_test
async def test_users(backend_store):
    store = backend_store
    bob = User("u_bob", "bob", "scrypt$hash", False)
    amy = User("u_amy", "amy", "scrypt$hash2", True)
    await store.put_user(bob)
    await store.put_user(amy)
    assert await store.get_user("u_bob") == bob
    assert await store.get_user_by_username("amy") == amy
    assert await store.get_user_by_username("nobody") is None
    assert [user.username for user in await store.list_users()] == ["amy", "bob"]
    # Renaming keeps the id and frees the old name.
    await store.put_user(replace(bob, username="robert"))
    assert await store.get_user_by_username("bob") is None
    assert (await store.get_user_by_username("robert")).user_id == "u_bob"
    with pytest.raises(Conflict):
        await store.put_user(User("u_other", "amy", "x"))
    assert await store.delete_user("u_bob") is True
    assert await store.delete_user("u_bob") is False
    assert await store.get_user_by_username("robert") is None


@pytest.mark.gen_test
async def test_installations(backend_store):
    store = backend_store
    inst = Installation("scope-1", "Scope", "telescope", ["u_alice"])
    await store.put_installation(inst)
    await store.put_installation(Installation("obs", "Observatory", "observatory", []))
    assert await store.get_installation("scope-1") == inst
    assert [i.installation_id for i in await store.list_installations()] == ["obs", "scope-1"]
    assert await store.delete_installation("obs") is True
    assert await store.delete_installation("obs") is False


@pytest.mark.gen_test
async def test_grants_one_per_subject_and_client(backend_store, now):
    store = backend_store
    grant = await store.save_grant("webapp", ALICE, ["read"], now)
    again = await store.save_grant("webapp", ALICE, ["read", "write"], now + timedelta(seconds=5))
    assert again.grant_id == grant.grant_id and again.scopes == ["read", "write"]
    assert again.created_at == now  # an active grant keeps its date
    other_client = await store.save_grant("skyplanner", ALICE, ["read"], now)
    installation = await store.save_grant("webapp", SCOPE, ["read"], now)
    assert len({grant.grant_id, other_client.grant_id, installation.grant_id}) == 3
    assert await store.get_grant(grant.grant_id) == again
    assert (await store.find_grant("webapp", ALICE)).grant_id == grant.grant_id
    assert await store.find_grant("nobody", ALICE) is None
    # Equal dates: in grant id order (test_listings_are_in_the_same_order_...).
    assert [g.grant_id for g in await store.list_grants(ALICE)] == sorted([grant.grant_id, other_client.grant_id])
    assert [g.grant_id for g in await store.list_grants(SCOPE)] == [installation.grant_id]
    assert [g.grant_id for g in await store.list_client_grants("webapp")] == sorted([grant.grant_id,
                                                                                     installation.grant_id])
    await store.revoke_grant(installation.grant_id, now)
    assert [g.grant_id for g in await store.list_client_grants("webapp")] == [grant.grant_id]


@pytest.mark.gen_test
async def test_revoke_grant_revokes_its_tokens_and_a_new_consent_revives_it(backend_store, now):
    store = backend_store
    grant = await store.save_grant("webapp", ALICE, ["read"], now)
    other = await store.save_grant("skyplanner", ALICE, ["read"], now)
    await store.add_tokens([token(now, "t1", grant_id=grant.grant_id),
                            token(now, "t2", REFRESH, grant_id=grant.grant_id),
                            token(now, "t3", grant_id=other.grant_id)])
    assert await store.revoke_grant(grant.grant_id, now) == 2
    assert (await store.get_grant(grant.grant_id)).revoked_at == now
    assert (await store.get_token("t1")).revoked_at == now and (await store.get_token("t2")).revoked_at == now
    assert (await store.get_token("t3")).revoked_at is None
    assert [g.client_id for g in await store.list_grants(ALICE)] == ["skyplanner"]
    assert await store.revoke_grant(grant.grant_id, now) == 0
    later = now + timedelta(minutes=1)
    revived = await store.save_grant("webapp", ALICE, ["write"], later)
    assert revived.grant_id == grant.grant_id and revived.revoked_at is None
    assert revived.created_at == later and revived.scopes == ["write"]


@pytest.mark.gen_test
async def test_codes_are_consumed_once(backend_store, now):
    store = backend_store
    await store.add_code(code(now))
    assert (await store.get_code("c1")).consumed_at is None
    first = await store.consume_code("c1", now)
    assert first is not None and first.consumed_at is None and first.code_hash == "c1"
    assert await store.consume_code("c1", now) is None
    assert (await store.get_code("c1")).consumed_at == now
    assert not (await store.get_code("c1")).spent_by_failure  # redeemed
    assert await store.consume_code("unknown", now) is None


@pytest.mark.gen_test
async def test_a_code_spent_by_a_failed_check_says_so(backend_store, now):
    store = backend_store
    await store.add_code(code(now))
    assert await store.consume_code("c1", now, failed=True) is not None
    spent = await store.get_code("c1")
    assert spent.consumed_at == now and spent.spent_by_failure is True
    assert await store.consume_code("c1", now) is None  # and it stays spent


@pytest.mark.gen_test
async def test_concurrent_consumers_exactly_one_wins(backend_store, now):
    store = backend_store
    await store.add_code(code(now))
    results = await asyncio.gather(*(store.consume_code("c1", now) for _ in range(50)))
    assert sum(result is not None for result in results) == 1


@pytest.mark.gen_test
async def test_refresh_rotation_is_atomic_and_conditional(backend_store, now):
    store = backend_store
    await store.add_tokens([token(now, "r1", REFRESH), token(now, "a1", ACCESS),
                            token(now, "r-old", REFRESH, ttl=60)])
    assert await store.rotate_refresh_token("a1", "webapp", now) is None  # not a refresh token
    assert await store.rotate_refresh_token("r1", "other-client", now) is None
    assert await store.rotate_refresh_token("r-old", "webapp", now + timedelta(seconds=61)) is None  # expired
    assert (await store.get_token("r-old")).rotated_at is None
    results = await asyncio.gather(*(store.rotate_refresh_token("r1", "webapp", now) for _ in range(50)))
    winners = [result for result in results if result is not None]
    assert len(winners) == 1 and winners[0].rotated_at is None
    assert (await store.get_token("r1")).rotated_at == now
    await store.add_tokens([token(now, "r2", REFRESH)])
    await store.revoke_token("r2", now)
    assert await store.rotate_refresh_token("r2", "webapp", now) is None  # revoked


@pytest.mark.gen_test
async def test_token_revocation(backend_store, now):
    store = backend_store
    await store.add_tokens([token(now, "a1"), token(now, "a2"), token(now, "r1", REFRESH)])
    assert await store.get_token("a1") == token(now, "a1")
    assert await store.get_token("nope") is None
    assert await store.revoke_token("a1", now) is True
    assert await store.revoke_token("a1", now) is False
    assert await store.revoke_token("nope", now) is False
    assert await store.revoke_grant_tokens("g1", now, token_type=ACCESS) == 1  # a2; a1 was already
    assert (await store.get_token("r1")).revoked_at is None
    assert await store.revoke_grant_tokens("g1", now) == 1


@pytest.mark.gen_test
async def test_a_record_read_before_an_update_keeps_its_values(backend_store, now):
    store = backend_store
    await store.add_tokens([token(now, "r1", REFRESH)])
    await store.add_code(code(now))
    await store.save_grant("webapp", ALICE, ["read"], now)
    token_before, code_before = await store.get_token("r1"), await store.get_code("c1")
    grant_before = await store.find_grant("webapp", ALICE)
    later = now + timedelta(seconds=5)
    assert await store.rotate_refresh_token("r1", "webapp", later) is not None
    assert await store.revoke_token("r1", later) is True
    assert await store.consume_code("c1", later) is not None
    await store.revoke_grant(grant_before.grant_id, later)
    # Updates store new values; what a caller already holds is a snapshot.
    assert token_before == token(now, "r1", REFRESH) and code_before == code(now)
    assert grant_before.revoked_at is None
    token_after, code_after = await store.get_token("r1"), await store.get_code("c1")
    assert token_after == replace(token_before, rotated_at=later, revoked_at=later)
    assert code_after == replace(code_before, consumed_at=later)
    assert await store.get_grant(grant_before.grant_id) == replace(grant_before, revoked_at=later)


@pytest.mark.gen_test
async def test_rotation_children(backend_store, now):
    store = backend_store
    await store.add_tokens([token(now, "r1", REFRESH), token(now, "a2", parent_hash="r1"),
                            token(now, "r2", REFRESH, parent_hash="r1")])
    assert (await store.find_child_refresh("r1")).token_hash == "r2"
    assert await store.find_child_refresh("r2") is None
    assert await store.revoke_children("r1", now) == 2
    assert (await store.get_token("a2")).revoked_at == now and (await store.get_token("r1")).revoked_at is None


@pytest.mark.gen_test
async def test_the_newest_child_is_found_whatever_its_state(backend_store, now):
    store = backend_store
    later, latest = now + timedelta(seconds=1), now + timedelta(seconds=2)
    older = replace(token(now, "r-old", REFRESH, parent_hash="r1"), rotated_at=later)  # rotated, not revoked
    newer = replace(token(later, "r-new", REFRESH, parent_hash="r1"), revoked_at=latest)  # revoked later
    await store.add_tokens([older, newer])
    assert (await store.find_child_refresh("r1")).token_hash == "r-new"
    current = token(latest, "r-cur", REFRESH, parent_hash="r1")
    await store.add_tokens([current])
    assert (await store.find_child_refresh("r1")).token_hash == "r-cur"


@pytest.mark.gen_test
async def test_listings_are_in_the_same_order_on_every_backend_with_equal_timestamps(backend_store, now):
    store = backend_store
    # Equal timestamps: children by token hash, grants by grant id, whatever the insertion order.
    await store.add_tokens([token(now, name, REFRESH, parent_hash="p") for name in ("c", "a", "b")])
    assert [child.token_hash for child in await store.list_children("p")] == ["a", "b", "c"]
    clients = [f"client-{n}" for n in range(6)]
    for client_id in reversed(clients):
        await store.save_grant(client_id, ALICE, ["read"], now)
    listed = await store.list_grants(ALICE)
    assert [grant.grant_id for grant in listed] == sorted(grant.grant_id for grant in listed)
    assert listed == await store.list_grants(ALICE)


@pytest.mark.gen_test
async def test_twenty_concurrent_first_consents_make_one_grant(backend_store, now):
    store = backend_store
    saved = await asyncio.gather(*(store.save_grant("webapp", ALICE, ["read"], now) for _ in range(20)))
    assert len({grant.grant_id for grant in saved}) == 1
    assert [grant.grant_id for grant in await store.list_grants(ALICE)] == [saved[0].grant_id]


@pytest.mark.gen_test
async def test_a_reconsent_after_revocation_raises_the_generation(backend_store, now):
    store = backend_store
    first = await store.save_grant("webapp", ALICE, ["read"], now)
    assert (await store.save_grant("webapp", ALICE, ["read", "write"], now)).generation == first.generation
    await store.revoke_grant(first.grant_id, now)
    again = await store.save_grant("webapp", ALICE, ["read"], now + timedelta(seconds=1))
    assert again.grant_id == first.grant_id and again.generation == first.generation + 1
    assert again.revoked_at is None
    old = replace(token(now, "t-old", grant_id=first.grant_id), generation=first.generation)
    new = replace(token(now, "t-new", grant_id=first.grant_id), generation=again.generation)
    await store.add_tokens([old, new])
    for stored in (old, new):
        found, grant = await store.get_token_and_grant(stored.token_hash)
        assert found == stored and grant == again
    assert not old.in_force(again, now) and new.in_force(again, now)
    assert await store.get_token_and_grant("nothing") == (None, None)


@pytest.mark.gen_test
async def test_sessions(backend_store, now):
    store = backend_store
    session = Session("s1", "u_alice", now, now + timedelta(days=1))
    await store.add_session(session)
    assert await store.get_session("s1") == session
    assert await store.delete_session("s1") is True
    assert await store.delete_session("s1") is False
    assert await store.get_session("s1") is None


@pytest.mark.gen_test
async def test_purge_expired(backend_store, now):
    store = backend_store
    await store.add_code(code(now, "c-live"))
    await store.add_code(code(now, "c-dead", ttl=10))
    await store.add_tokens([token(now, "t-live"), token(now, "t-dead", ttl=10)])
    await store.add_session(Session("s-dead", "u", now, now + timedelta(seconds=10)))
    counts = await store.purge_expired(now + timedelta(seconds=60))
    assert counts == {"codes": 1, "tokens": 1, "sessions": 1}
    assert await store.get_code("c-live") is not None and await store.get_code("c-dead") is None
    assert await store.get_token("t-live") is not None and await store.get_token("t-dead") is None
    assert await store.purge_expired(now + timedelta(seconds=60)) == {"codes": 0, "tokens": 0, "sessions": 0}


@pytest.mark.gen_test
async def test_purge_keeps_consumed_codes_for_the_replay_hour(backend_store, now):
    store = backend_store
    await store.add_code(code(now, "c-redeemed", ttl=10))
    await store.consume_code("c-redeemed", now)
    await store.add_code(code(now, "c-unused", ttl=10))
    assert (await store.purge_expired(now + timedelta(seconds=60)))["codes"] == 1
    assert await store.get_code("c-unused") is None
    assert (await store.get_code("c-redeemed")).consumed_at == now  # a replay is still recognised
    assert (await store.purge_expired(now + timedelta(seconds=10 + 3600)))["codes"] == 1
    assert await store.get_code("c-redeemed") is None


@pytest.mark.gen_test
async def test_a_users_sessions_end_together(backend_store, now):
    from tokensvc.records import Session

    store = backend_store
    for name, user in (("s1", "u1"), ("s2", "u1"), ("s3", "u2")):
        await store.add_session(Session(name, user, now, now + timedelta(days=1)))
    assert await store.delete_user_sessions("u1") == 2
    assert await store.get_session("s1") is None and await store.get_session("s2") is None
    assert await store.get_session("s3") is not None
    assert await store.delete_user_sessions("u1") == 0
