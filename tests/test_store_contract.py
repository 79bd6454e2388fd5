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
    RESOURCE_SERVER,
    AuthorizationCode,
    Client,
    Family,
    Installation,
    Pair,
    PreviousSecret,
    Removal,
    Session,
    Subject,
    User,
)
from tokensvc.storage.base import (
    ClientRecord,
    Conflict,
    FailureCounts,
    Presentation,
    Removing,
    ResourceTaken,
    Store,
)
from tokensvc.storage.memory import MemoryStore

pytestmark = pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)

ALICE = Subject(user_id="u_alice")
SCOPE = Subject(installation_id="scope-1")


@pytest.fixture
def now():
    return Clock().now


def family(now, family_id="f1", grant_id="g1", subject=ALICE, n=1, ttl=3600, generation=0):
    """A family as an exchange starts it, its pair named ``a<n>`` / ``r<n>``."""
    return Family(family_id, grant_id, "webapp", subject.user_id, subject.installation_id, generation, ["read"],
                  now, f"r{n}", f"a{n}", now, now + timedelta(seconds=ttl), now + timedelta(seconds=600),
                  renewed_at=now)


def pair(now, n, ttl=3600, scopes=("read",)):
    return Pair(f"a{n}", f"r{n}", list(scopes), now, now + timedelta(seconds=ttl), now + timedelta(seconds=600))


def code(now, code_hash="c1", ttl=300):
    return AuthorizationCode(code_hash=code_hash, client_id="webapp", redirect_uri="https://a/cb",
                             scopes=["read"], user_id="u_alice", installation_id=None,
                             code_challenge="x" * 43, code_challenge_method="S256",
                             expires_at=now + timedelta(seconds=ttl))


def test_backend_implements_the_whole_interface(backend_store):
    assert isinstance(backend_store, Store)
    abstract = set(Store.__abstractmethods__)
    assert abstract, "the interface has abstract methods"
    for name in abstract | {"open", "close"}:
        implementation = getattr(type(backend_store), name)
        assert not getattr(implementation, "__isabstractmethod__", False), name
        assert inspect.iscoroutinefunction(implementation), name
        assert (list(inspect.signature(implementation).parameters)
                == list(inspect.signature(getattr(Store, name)).parameters)), name


@pytest.mark.gen_test
async def test_ping(backend_store):
    await backend_store.ping()


@pytest.mark.gen_test
async def test_a_store_no_other_serving_process_shares_says_no_one_disagrees(backend_store):
    """The deployment's settings are compared among the serving processes of one store (their
    entries among the running processes: tests/test_bootstrap.py, tests/wire/); a store of no
    serving process (this one), or only this process's (memory), answers nothing, every time."""
    for value in (True, False):
        assert await backend_store.deployment_settings({"cli_client": value}) == {}


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
    removal = await store.begin_removal("a", now, "t")
    await store.withdraw_client(removal)
    await store.withdraw_client(removal)  # what is gone is no error
    await store.end_removal(removal)
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
    await store.delete_user("u_bob")
    await store.delete_user("u_bob")
    assert await store.get_user("u_bob") is None
    assert await store.get_user_by_username("robert") is None


@pytest.mark.gen_test
async def test_usernames_are_unique_by_their_key(backend_store):
    """One user per username key (NFKC, case folded): ROOT never stands beside root, whoever
    writes, and root is found whatever the case it is typed in."""
    store = backend_store
    root = User("u_root", "root", "scrypt$hash", True)
    await store.put_user(root)
    for other in ("ROOT", "Root", "rOOt"):
        with pytest.raises(Conflict):
            await store.put_user(User("u_other", other, "x"))
        assert await store.get_user_by_username(other) == root
    assert [user.username for user in await store.list_users()] == ["root"]
    await store.put_user(replace(root, admin=False))  # the user themselves keeps the name
    # A name stored with capitals (as release 0.9.0 stored what it was given) is found as
    # written, keeps its own user, and still holds its key against anyone else.
    legacy = User("u_legacy", "Carol", "scrypt$hash", False)
    await store.put_user(legacy)
    assert await store.get_user_by_username("Carol") == legacy
    await store.put_user(replace(legacy, admin=True))
    with pytest.raises(Conflict):
        await store.put_user(User("u_new", "carol", "x"))
    # ... and by its key, whatever case it is typed in (MongoDB: caseless, as the key of an
    # ASCII name is; a user of 0.9.0 logs in as alice or ALICE, and seeding finds them).
    for typed in ("carol", "CAROL", "cArOl"):
        assert await store.get_user_by_username(typed) == replace(legacy, admin=True)
    assert await store.get_user("u_new") is None
    # Two processes adding the same new name at once (both stored as its key): one of them.
    added = await asyncio.gather(*(store.put_user(User(f"u_dora{n}", "dora", "x")) for n in range(4)),
                                 return_exceptions=True)
    assert sum(result is None for result in added) == 1 and all(
        isinstance(result, Conflict) for result in added if result is not None)


@pytest.mark.gen_test
async def test_installations(backend_store):
    store = backend_store
    inst = Installation("scope-1", "Scope", "telescope", ["u_alice"])
    await store.put_installation(inst)
    await store.put_installation(Installation("obs", "Observatory", "observatory", []))
    assert await store.get_installation("scope-1") == inst
    assert [i.installation_id for i in await store.list_installations()] == ["obs", "scope-1"]
    await store.delete_installation("obs")
    await store.delete_installation("obs")
    assert [i.installation_id for i in await store.list_installations()] == ["scope-1"]


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
    await store.mark_grant_revoked(installation.grant_id, now)
    assert [g.grant_id for g in await store.list_client_grants("webapp")] == [grant.grant_id]


@pytest.mark.gen_test
async def test_listings_page_in_key_order(backend_store, now):
    store = backend_store
    for name in ("d", "a", "c", "b", "e"):
        await store.put_client(Client(name, name.upper(), ["https://x/cb"], created_at=now))
        await store.put_user(User(f"u_{name}", f"user-{name}", "scrypt$x"))
        await store.put_installation(Installation(f"i-{name}", name, "telescope", []))

    async def pages(listing, key):
        seen, after = [], None
        while page := await listing(after, 2):
            assert len(page) <= 2
            seen.append([getattr(item, key) for item in page])
            after = getattr(page[-1], key)
        return seen

    assert await pages(store.list_clients, "client_id") == [["a", "b"], ["c", "d"], ["e"]]
    assert await pages(store.list_users, "username") == [["user-a", "user-b"], ["user-c", "user-d"], ["user-e"]]
    assert await pages(store.list_installations, "installation_id") == [["i-a", "i-b"], ["i-c", "i-d"], ["i-e"]]
    assert [client.client_id for client in await store.list_clients("b")] == ["c", "d", "e"]
    grants = sorted([(await store.save_grant("webapp", Subject(user_id=f"u_{n}"), ["read"], now)).grant_id
                     for n in "abc"])
    assert [g.grant_id for g in await store.list_client_grants("webapp", None, 2)] == grants[:2]
    assert [g.grant_id for g in await store.list_client_grants("webapp", grants[1], 2)] == grants[2:]


@pytest.mark.gen_test
async def test_a_clients_grants_and_families_are_revoked_in_bulk(backend_store, now):
    """Each grant revoked with the audience of its own live families, as the batch found them
    (the removal announces each with it): a grant whose families name none, every reader's
    (None); one with no live family, none."""
    store = backend_store
    notes, photos = "https://notes.example", "https://photos.example"
    mine = await store.save_grant("webapp", ALICE, ["read"], now)
    theirs = await store.save_grant("skyplanner", ALICE, ["read"], now)
    bobs = await store.save_grant("webapp", Subject(user_id="u_bob"), ["read"], now)
    carols = await store.save_grant("webapp", Subject(user_id="u_carol"), ["read"], now)
    await store.create_family(replace(family(now, "f1", mine.grant_id), audience=[photos]))
    await store.create_family(replace(family(now, "f3", mine.grant_id, n=3), audience=[notes]))
    await store.create_family(replace(family(now, "f2", theirs.grant_id, n=2), client_id="skyplanner"))
    await store.create_family(family(now, "f4", bobs.grant_id, Subject(user_id="u_bob"), n=4))
    await store.create_family(replace(family(now, "f5", carols.grant_id, Subject(user_id="u_carol"), n=5),
                                      audience=[notes]))
    await store.revoke_family("f5", now)
    assert await store.revoke_client_grants("webapp", now, 10) == dict(sorted({
        mine.grant_id: [notes, photos], bobs.grant_id: None, carols.grant_id: []}.items()))
    assert (await store.get_grant(mine.grant_id)).revoked_at == now
    assert await store.list_families(mine.grant_id) == []
    assert [f.family_id for f in await store.list_families(theirs.grant_id)] == ["f2"]
    assert await store.list_client_grants("webapp") == []
    assert await store.revoke_client_grants("webapp", now, 10) == {}


@pytest.mark.gen_test
async def test_a_clients_grants_are_revoked_a_bounded_batch_at_a_time(backend_store, now):
    store = backend_store
    grants = sorted([(await store.save_grant("webapp", Subject(user_id=f"u_{n}"), ["read"], now)).grant_id
                     for n in range(5)])
    for index, grant_id in enumerate(grants):
        await store.create_family(family(now, f"f{index}", grant_id, Subject(user_id=f"u_{index}"), n=index))
    assert list(await store.revoke_client_grants("webapp", now, 2)) == grants[:2]
    assert [g.grant_id for g in await store.list_client_grants("webapp")] == grants[2:]
    assert [len(await store.list_families(grant_id)) for grant_id in grants] == [0, 0, 1, 1, 1]
    assert list(await store.revoke_client_grants("webapp", now, 2)) == grants[2:4]
    assert list(await store.revoke_client_grants("webapp", now, 2)) == grants[4:]
    assert await store.revoke_client_grants("webapp", now, 2) == {}


@pytest.mark.gen_test
async def test_a_client_id_is_claimed_once(backend_store, now):
    """add_client inserts only when no document holds the id: of registrations at once,
    exactly one wins, and the others write nothing."""
    store = backend_store
    clients = [Client("twin", f"Twin {n}", ["https://a/cb"], secret_hash=str(n) * 64, created_at=now)
               for n in range(3)]
    results = await asyncio.gather(*(store.add_client(client) for client in clients), return_exceptions=True)
    won = [client for client, result in zip(clients, results, strict=True) if result is None]
    assert len(won) == 1 and all(isinstance(result, Conflict) for result in results if result is not None)
    assert await store.get_client("twin") == won[0]
    with pytest.raises(Conflict):
        await store.add_client(replace(clients[0], client_id="twin"))
    assert await store.get_client("twin") == won[0]


@pytest.mark.gen_test
async def test_a_clients_grants_are_revoked_up_to_a_creation_time(backend_store, now):
    """``before`` bounds a client's revocation to the grants created before it (a new
    registration's leftovers): those created at or after it stay."""
    store = backend_store
    old = await store.save_grant("webapp", Subject(user_id="u_old"), ["read"], now - timedelta(seconds=1))
    new = await store.save_grant("webapp", Subject(user_id="u_new"), ["read"], now)
    assert await store.revoke_client_grants("webapp", now, 10, before=now) == {old.grant_id: []}
    assert [g.grant_id for g in await store.list_client_grants("webapp")] == [new.grant_id]


@pytest.mark.gen_test
async def test_a_client_under_removal_is_no_client_whatever_writes_its_document(backend_store, now):
    """From the removal's record on, the client is gone (found by id or listed), even when a
    writer that knows nothing of the record (release 0.9.0's seeding) writes its document back;
    finished, the document, the previous secret and the record are gone."""
    store = backend_store
    for client_id in ("a", "doomed", "z"):
        await store.put_client(Client(client_id, client_id.upper(), [f"https://{client_id}/cb"], created_at=now))
    await store.put_previous_secret(PreviousSecret("doomed", "a" * 64, "b" * 64, now, now + timedelta(hours=1)))
    assert await store.get_removal("doomed") is None and await store.list_removals() == []
    removal = Removal("doomed", now, "t1")
    assert await store.begin_removal("doomed", now, "t1") == removal  # recorded by this call
    # Idempotent: recorded already, by the call of t1.
    assert await store.begin_removal("doomed", now + timedelta(seconds=5), "t2") == removal
    assert await store.get_removal("doomed") == removal and await store.list_removals() == [removal]
    assert await store.get_client("doomed") is None
    assert [client.client_id for client in await store.list_clients()] == ["a", "z"]
    assert [client.client_id for client in await store.list_clients(None, 1)] == ["a"]
    assert [client.client_id for client in await store.list_clients("a", 1)] == ["z"]
    await store.withdraw_client(removal)
    await store.put_client(Client("doomed", "Doomed", ["https://doomed/cb"], created_at=now))  # written back
    assert await store.get_client("doomed") is None
    await store.end_removal(removal)
    await store.end_removal(removal)
    assert await store.get_removal("doomed") is None and await store.list_removals() == []
    assert await store.get_client("doomed") is None and await store.get_previous_secret("doomed") is None
    await store.add_client(Client("doomed", "Doomed", ["https://doomed/cb"], created_at=now))  # registered anew
    assert (await store.get_client("doomed")).name == "Doomed"


@pytest.mark.gen_test
async def test_a_removals_end_run_again_never_reaches_beyond_its_removal(backend_store, now):
    """The last step of a removal, run again once its record went (its reply lost, or another
    call of the same removal finished it), deletes nothing: not a client registered since under
    the id with its previous secret, nor the record of a later removal of that client."""
    store = backend_store
    await store.put_client(Client("c1", "One", ["https://a/cb"], created_at=now))
    first = await store.begin_removal("c1", now, "first")
    await store.end_removal(first)
    registered = Client("c1", "One again", ["https://a/cb"], secret_hash="b" * 64, created_at=now)
    await store.add_client(registered)
    await store.put_previous_secret(PreviousSecret("c1", "a" * 64, "b" * 64, now, now + timedelta(hours=1)))
    await store.end_removal(first)  # run again
    assert await store.get_client("c1") == registered and await store.get_previous_secret("c1") is not None
    second = await store.begin_removal("c1", now + timedelta(seconds=1), "second")
    await store.end_removal(first)
    assert await store.get_removal("c1") == second  # the later removal goes on
    await store.end_removal(second)
    assert await store.get_removal("c1") is None and await store.get_previous_secret("c1") is None


@pytest.mark.gen_test
async def test_a_registration_while_a_removal_is_under_way_is_refused_and_leaves_nothing(backend_store, now):
    """Once a removal is recorded, its document deleted, a registration of the id is refused
    (:class:`Removing`, a :class:`Conflict`) and writes nothing the removal's end could delete;
    the removal finished, the id is registered again."""
    store = backend_store
    await store.put_client(Client("c1", "One", ["https://a/cb"], created_at=now))
    removal = await store.begin_removal("c1", now, "first")
    await store.withdraw_client(removal)
    again = Client("c1", "One again", ["https://a/cb"], secret_hash="b" * 64, created_at=now)
    with pytest.raises(Removing):
        await store.add_client(again)
    assert await store.get_client("c1") is None
    await store.end_removal(removal)
    assert await store.get_client("c1") is None and await store.list_clients() == []
    await store.add_client(again)
    assert await store.get_client("c1") == again


@pytest.mark.gen_test
async def test_a_removals_steps_run_late_never_take_a_client_registered_since(backend_store, now):
    """A call of a removal that goes on after another call finished it (its record read before
    the end) withdraws nothing: not the document of a client registered since under the id, at
    its first step or at its last."""
    store = backend_store
    await store.put_client(Client("c1", "One", ["https://a/cb"], created_at=now))
    first = await store.begin_removal("c1", now, "first")
    late = await store.begin_removal("c1", now, "late")  # another call of the same removal
    await store.withdraw_client(first)
    await store.end_removal(first)
    registered = Client("c1", "One again", ["https://a/cb"], secret_hash="b" * 64, created_at=now)
    await store.add_client(registered)
    await store.withdraw_client(late)
    await store.end_removal(late)
    assert await store.get_client("c1") == registered


@pytest.mark.gen_test
async def test_a_narrowed_clients_scopes_are_withdrawn_from_what_holds_them(backend_store, now):
    """withdraw_scopes: the client's live grants, unconsumed codes and unrevoked families keep
    only the scopes kept; what is revoked or consumed, and every other client's, is left."""
    store = backend_store
    wide = ["read", "write", "admin"]
    mine = await store.save_grant("webapp", ALICE, wide, now)
    theirs = await store.save_grant("skyplanner", ALICE, wide, now)
    await store.create_family(replace(family(now, "f1", mine.grant_id, n=1), scopes=wide))
    await store.create_family(replace(family(now, "f2", mine.grant_id, n=2), scopes=["read"]))
    await store.create_family(replace(family(now, "f3", mine.grant_id, n=3), scopes=wide))
    await store.revoke_family("f3", now)
    await store.create_family(replace(family(now, "f4", theirs.grant_id, n=4), client_id="skyplanner", scopes=wide))
    await store.add_code(replace(code(now, "c1"), scopes=wide))
    await store.add_code(replace(code(now, "c2"), scopes=wide))
    await store.consume_code("c2", now, family_id="f9")
    await store.add_code(replace(code(now, "c3"), client_id="skyplanner", scopes=wide))
    await store.withdraw_scopes("webapp", ["read", "admin"])
    assert (await store.get_family("f1"))[0].scopes == ["read", "admin"]
    assert (await store.get_family("f2"))[0].scopes == ["read"]
    assert (await store.get_family("f3"))[0].scopes == wide  # revoked: nothing to withdraw
    assert (await store.get_family("f4"))[0].scopes == wide
    assert (await store.get_grant(mine.grant_id)).scopes == ["read", "admin"]
    assert (await store.get_grant(theirs.grant_id)).scopes == wide
    assert [(await store.get_code(c)).scopes for c in ("c1", "c2", "c3")] == [["read", "admin"], wide, wide]
    await store.withdraw_scopes("webapp", ["read", "admin"])  # again: nothing more withdrawn
    assert (await store.get_family("f1"))[0].scopes == ["read", "admin"]
    assert (await store.get_grant(mine.grant_id)).scopes == ["read", "admin"]
    await store.withdraw_scopes("webapp", [])
    assert (await store.get_family("f1"))[0].scopes == [] and (await store.get_family("f2"))[0].scopes == []


@pytest.mark.gen_test
async def test_updates_write_only_the_fields_they_name(backend_store):
    store = backend_store
    await store.put_client(Client("c1", "One", ["https://a/cb"], ["read"], secret_hash="s1"))
    before = await store.update_client("c1", {"name": "Uno", "allowed_scopes": ["read", "write"]})
    assert before.name == "One" and before.allowed_scopes == ["read"]
    assert await store.get_client("c1") == Client("c1", "Uno", ["https://a/cb"], ["read", "write"], secret_hash="s1")
    assert (await store.update_client("c1", {"secret_hash": "s2"}, if_confidential=True)).secret_hash == "s1"
    await store.update_client("c1", {"secret_hash": None})
    assert await store.update_client("c1", {"secret_hash": "s3"}, if_confidential=True) is None  # public now
    assert (await store.get_client("c1")).secret_hash is None
    assert await store.update_client("nobody", {"name": "x"}) is None
    await store.put_user(User("u1", "ursula", "h1", admin=True))
    assert (await store.update_user("u1", {"admin": False})).admin is True
    assert (await store.update_user("u1", {"password_hash": "h2"})).password_hash == "h1"
    assert await store.get_user("u1") == User("u1", "ursula", "h2", admin=False)
    assert await store.update_user("nobody", {"admin": True}) is None


@pytest.mark.gen_test
async def test_each_change_of_a_client_carries_the_marks_of_what_it_withdraws(backend_store):
    """A change of a client is marked in its own write, by what it takes away: some of what its
    tokens may do (a narrowing of its scopes: ``narrowed_at``, announced under the client, which
    the revocation feed names to resource servers), what its feed readers proved (a new secret,
    kind or first-party flag: ``credentials_changed_at``, announced to those readers alone), both
    when it does both (made a resource server, whose scopes are none), neither when it withdraws
    nothing. A client never changed holds neither mark. Its removal replaces its secret first
    (its readers' mark alone) and names the client only once the removal is recorded."""
    from helpers import make_config

    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context
    from tokensvc.storage.base import CLIENT, CREDENTIALS, Revocation

    clock = Clock()
    ctx = make_context(make_config(), backend_store)
    ctx.clock = clock
    heard = []
    ctx.events.watch(heard.append)
    spec = admin.ClientSpec("Robot", ["https://robot.example/cb"], ["read", "write"], confidential=True)
    await admin.create_client(backend_store, spec, "robot")

    async def change(step, *marks):
        """``step``'s marks and announcements: the marks it set, each at this moment."""
        clock.advance(1)
        before = await backend_store.get_client("robot")
        heard.clear()
        await step()
        after = await backend_store.get_client("robot")
        set_now = {name for name in ("narrowed_at", "credentials_changed_at")
                   if getattr(after, name) != getattr(before, name)}
        assert all(getattr(after, name) == clock.now for name in set_now)
        assert set_now == set(marks)
        return heard[:]

    robot = await backend_store.get_client("robot")
    assert (robot.narrowed_at, robot.credentials_changed_at) == (None, None)
    assert await change(lambda: admin.rotate_secret(ctx, "robot", 60), "credentials_changed_at") == [
        Revocation(CREDENTIALS, "robot")]
    assert await change(lambda: admin.update_client(ctx, "robot", {"description": "Builds things"})) == []
    assert await change(lambda: admin.update_client(ctx, "robot", {"scopes": ["read"]}), "narrowed_at") == [
        Revocation(CLIENT, "robot")]
    assert await change(lambda: admin.update_client(ctx, "robot", {"scopes": ["read", "write"]})) == []  # widened
    assert await change(lambda: admin.update_client(ctx, "robot", {"first_party": True}),
                        "credentials_changed_at") == [Revocation(CREDENTIALS, "robot")]
    assert await change(lambda: admin.update_client(ctx, "robot", {"secret_sha256": "ab" * 32}),
                        "credentials_changed_at") == [Revocation(CREDENTIALS, "robot")]
    made_an_api = {"kind": "resource-server", "redirect_uris": [], "scopes": None, "first_party": False}
    assert await change(lambda: admin.update_client(ctx, "robot", made_an_api), "narrowed_at",
                        "credentials_changed_at") == [Revocation(CLIENT, "robot"), Revocation(CREDENTIALS, "robot")]
    assert await change(lambda: admin.update_client(ctx, "robot", {"kind": "client", "redirect_uris": [
        "https://robot.example/cb"]}), "credentials_changed_at") == [Revocation(CREDENTIALS, "robot")]
    written, update, begin = [], backend_store.update_client, backend_store.begin_removal

    async def recording(client_id, fields, **options):
        written.append(fields)
        return await update(client_id, fields, **options)

    async def beginning(client_id, now, tag):
        heard.append("recorded")
        return await begin(client_id, now, tag)

    backend_store.update_client, backend_store.begin_removal = recording, beginning
    clock.advance(1)
    heard.clear()
    await admin.remove_client(ctx, "robot")
    # Its secret replaced first, marked for its feed readers alone; the client named once its
    # removal is recorded, when its tokens are refused already.
    assert [set(fields) & {"narrowed_at", "credentials_changed_at"} for fields in written] == [
        {"credentials_changed_at"}]
    assert heard[:3] == [Revocation(CREDENTIALS, "robot"), "recorded", Revocation(CLIENT, "robot")]


@pytest.mark.gen_test
async def test_seeding_that_takes_admin_away_marks_the_user_in_the_same_write(backend_store, now):
    """The configuration demotes, or sets a new password: the user is marked (narrowed_at, what
    every relay hears) in the write that demotes or sets it, decided on the record it replaces;
    a promotion landing between the seeding's read and its write is never demoted without the
    mark, nor a password set meanwhile replaced without it."""
    store = backend_store
    assert await store.seed_user(User("u_una", "una", "h1", admin=True), now) == User("u_una", "una", "h1", True)
    assert (await store.seed_user(User("u_other", "una", "h1", admin=True), now)).narrowed_at is None  # its id stays
    assert await store.seed_user(User("u_other", "una", "h2"), now) == User("u_una", "una", "h2", False, now)
    later = now + timedelta(seconds=5)
    assert (await store.seed_user(User("u_other", "una", "h2"), later)).narrowed_at == now  # as it was: kept
    assert (await store.seed_user(User("u_other", "una", "h3"), later)).narrowed_at == later  # a new password
    assert (await store.seed_user(User("u_new", "newt", "h"), later)).narrowed_at is None
    assert await store.get_user("u_una") == User("u_una", "una", "h3", False, later)
    for round_ in range(10):
        await store.update_user("u_una", {"password_hash": "h", "narrowed_at": None})
        mark = later + timedelta(seconds=round_)
        writes = [store.seed_user(User("u_x", "una", "h"), mark), store.update_user("u_una", {"password_hash": "h4"})]
        await asyncio.gather(*writes[::1 if round_ % 2 else -1])  # each first in turn
        una = await store.get_user("u_una")
        assert una.password_hash == "h4" or una.narrowed_at == mark, una
    for round_ in range(10):
        await store.update_user("u_una", {"admin": False, "narrowed_at": None})
        mark = later + timedelta(seconds=round_)
        writes = [store.seed_user(User("u_x", "una", "h"), mark), store.update_user("u_una", {"admin": True})]
        await asyncio.gather(*writes[::1 if round_ % 2 else -1])  # each first in turn
        una = await store.get_user("u_una")
        assert una.admin or una.narrowed_at == mark, una


@pytest.mark.gen_test
async def test_concurrent_changes_of_a_user_each_hold(backend_store):
    """A demotion (or a promotion, which first ends the chains that may carry admin) beside a
    password set: each writes its own field, so both hold (the password set wrote the whole
    user it had read before hashing, undoing the demotion; on MongoDB, the other way round
    lost the new password while it was reported set)."""
    from helpers import make_config

    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context
    from tokensvc.oauth import hashing

    ctx = make_context(make_config(), backend_store)
    await admin.create_user(backend_store, "eve", "orchid-marble-falcon", admin=True)
    await asyncio.gather(admin.set_admin(ctx, "eve", False), admin.set_password(ctx, "eve", "saffron-glacier-pylon"))
    eve = await backend_store.get_user_by_username("eve")
    assert eve.admin is False and hashing.verify_password("saffron-glacier-pylon", eve.password_hash)
    await asyncio.gather(admin.set_password(ctx, "eve", "cobalt-meadow-lantern"), admin.set_admin(ctx, "eve", True))
    eve = await backend_store.get_user_by_username("eve")
    assert eve.admin is True and hashing.verify_password("cobalt-meadow-lantern", eve.password_hash)


@pytest.mark.gen_test
async def test_a_previous_secret_is_kept_used_and_expired_by_one_caller_each(backend_store, now):
    """A client's previous secret is a record of its own: replaced by the next one, its use
    recorded by one of concurrent callers (once per interval), its expiry handed to exactly one
    of concurrent sweeps, and gone with its client."""
    store = backend_store
    await store.put_client(Client("c", "C", ["https://c/cb"], secret_hash="b" * 64, created_at=now))
    assert await store.get_previous_secret("c") is None
    first = PreviousSecret("c", "a" * 64, "b" * 64, now, now + timedelta(seconds=60))
    await store.put_previous_secret(first)
    assert await store.get_previous_secret("c") == first
    kept = PreviousSecret("c", "b" * 64, "d" * 64, now, now + timedelta(seconds=120))
    await store.put_previous_secret(kept)  # a second rotation replaces the first
    assert await store.get_previous_secret("c") == kept
    # Of uses at once, one records it; within the interval no other does; after it, one again.
    used = await asyncio.gather(*(store.note_previous_secret_use("c", now, 60) for _ in range(4)))
    assert sorted(used) == [False, False, False, True]
    assert (await store.get_previous_secret("c")).last_used_at == now
    assert not await store.note_previous_secret_use("c", now + timedelta(seconds=59), 60)
    assert await store.note_previous_secret_use("c", now + timedelta(seconds=61), 60)
    assert not await store.note_previous_secret_use("nobody", now, 60)
    # Unexpired, it stays; expired, one of concurrent sweeps gets it.
    assert await store.expire_previous_secret(now + timedelta(seconds=119)) is None
    swept = await asyncio.gather(*(store.expire_previous_secret(now + timedelta(seconds=120)) for _ in range(3)))
    assert sorted(each is None for each in swept) == [False, True, True]
    gone = next(each for each in swept if each)
    assert (gone.client_id, gone.last_used_at) == ("c", now + timedelta(seconds=61))
    assert await store.get_previous_secret("c") is None
    # Forgotten on request, and with its client.
    await store.put_previous_secret(kept)
    await store.delete_previous_secret("c")
    await store.delete_previous_secret("c")
    assert await store.get_previous_secret("c") is None
    await store.put_previous_secret(kept)
    await store.withdraw_client(await store.begin_removal("c", now, "t"))
    assert await store.get_previous_secret("c") is None


@pytest.mark.gen_test
async def test_a_generated_secret_is_known_by_the_store_for_that_secret_alone(backend_store, now):
    """Whether a client's secret was generated (what exempts it from the failure limits) is the
    store's word for that very secret: kept by every write of another field, and lost by any
    write of the secret that does not say it again, as 0.10.0's rotation and seeding write it,
    and by a document without it, as 0.10.0 and 0.9.0 wrote every client. Lost, the client is
    limited: an older process never makes a secret exempt."""
    store = backend_store
    generated = Client("g", "G", ["https://g/cb"], secret_hash="a" * 64, generated_secret_hash="a" * 64,
                       created_at=now)
    await store.put_client(generated)
    assert (await store.get_client("g")).secret_generated
    await store.update_client("g", {"name": "G2", "first_party": True})
    assert (await store.get_client("g")).secret_generated
    await store.update_client("g", {"secret_hash": "b" * 64}, if_confidential=True)  # 0.10.0's rotation
    assert not (await store.get_client("g")).secret_generated
    await store.put_client(generated)
    await store.put_client(replace(generated, secret_hash="c" * 64, generated_secret_hash=None))  # set by hand
    assert not (await store.get_client("g")).secret_generated
    # A document written before the field existed (0.10.0, 0.9.0): limited.
    if isinstance(store, MemoryStore):
        store._clients["old"] = Client("old", "Old", ["https://old/cb"], secret_hash="d" * 64, created_at=now)
    else:
        await store.db["clients"].insert_one({"_id": "old", "name": "Old", "redirect_uris": ["https://old/cb"],
                                        "allowed_scopes": None, "secret_hash": "d" * 64, "first_party": False,
                                        "description": None, "logo_url": None, "created_at": now})
    old = await store.get_client("old")
    assert old.secret_hash == "d" * 64 and old.generated_secret_hash is None and not old.secret_generated
    # A previous secret says whether it was generated; one written without it (0.10.0) was not.
    kept = PreviousSecret("g", "a" * 64, "c" * 64, now, now + timedelta(seconds=60), generated=True)
    await store.put_previous_secret(kept)
    assert (await store.get_previous_secret("g")).generated
    if not isinstance(store, MemoryStore):
        await store.db["previous_secrets"].update_one({"_id": "g"}, {"$unset": {"generated": ""}})
        assert not (await store.get_previous_secret("g")).generated


@pytest.mark.gen_test
async def test_the_store_marks_the_entries_a_configuration_file_writes_and_no_other_write_clears_it(backend_store,
                                                                                                   now):
    """Which entries the configuration file writes at every start is the store's word
    (``owner``), so that every writer refuses them whatever file it was given: each start marks
    what its file names and clears the mark of every other entry; no other write, seeding's
    own included, marks or clears it. A document without the field (0.10.0 wrote every one) is
    the admin API's."""
    store = backend_store
    file = "/etc/tokensvc/tokensvc.toml"
    await store.add_client(Client("webapp", "Web", ["https://a/cb"], created_at=now))
    await store.add_client(Client("tokensvc-cli", "CLI", ["http://127.0.0.1/cb"], created_at=now))
    await store.add_client(Client("made-here", "Made here", ["https://m/cb"], created_at=now))
    await store.put_user(User("u_alice", "alice", "h1"))
    await store.put_user(User("u_bob", "bob", "h1"))
    await store.put_installation(Installation("scope-1", "Scope", "telescope"))
    assert (await store.get_client("webapp")).owner is None and (await store.get_user("u_alice")).owner is None
    assert await store.set_owners("client", {"webapp": file, "tokensvc-cli": "admin.cli_client"}) == {}
    await store.set_owners("user", {"u_alice": file})
    await store.set_owners("installation", {"scope-1": file})

    def owners(entries, key):
        return {getattr(entry, key): entry.owner for entry in entries}

    marked = {"webapp": file, "tokensvc-cli": "admin.cli_client", "made-here": None}
    assert owners(await store.list_clients(), "client_id") == marked
    assert owners(await store.list_users(), "username") == {"alice": file, "bob": None}
    assert (await store.get_user_by_username("ALICE")).owner == file
    assert (await store.get_installation("scope-1")).owner == file
    # Every other write keeps the mark, a record that says none included.
    await store.put_client(Client("webapp", "Web 2", ["https://a/cb"], created_at=now))
    await store.update_client("webapp", {"name": "Web 3"})
    await store.seed_user(User("u_alice", "alice", "h2", admin=True), now)
    await store.update_user("u_alice", {"admin": False})
    await store.put_user(User("u_alice", "alice", "h3"))
    await store.put_installation(Installation("scope-1", "Scope 2", "telescope"))
    assert owners(await store.list_clients(), "client_id") == marked
    assert (await store.get_client("webapp")).name == "Web 3"
    assert (await store.get_user("u_alice")).owner == file
    assert (await store.get_installation("scope-1")).owner == file
    # A later start's file: what it names is marked as its own, every other mark cleared.
    # It says which marks it took, and from whom.
    assert await store.set_owners("client", {"made-here": "/srv/other.toml", "tokensvc-cli": "admin.cli_client"}) \
        == {"webapp": file}
    await store.set_owners("user", {})
    await store.set_owners("installation", {})
    assert owners(await store.list_clients(), "client_id") == {
        "webapp": None, "tokensvc-cli": "admin.cli_client", "made-here": "/srv/other.toml"}
    assert owners(await store.list_users(), "username") == {"alice": None, "bob": None}
    assert (await store.get_installation("scope-1")).owner is None
    # A document written before the field existed (0.10.0, 0.9.0): the admin API's.
    if not isinstance(store, MemoryStore):
        await store.db["clients"].insert_one({"_id": "old", "name": "Old", "redirect_uris": ["https://old/cb"],
                                              "allowed_scopes": None, "secret_hash": None, "first_party": False,
                                              "description": None, "logo_url": None, "created_at": now})
        assert (await store.get_client("old")).owner is None


@pytest.mark.gen_test
async def test_concurrent_changes_of_a_client_each_hold(backend_store):
    """A secret rotated beside a PATCH or a PUT of the client, and two PATCHes of different
    fields: each change holds (each wrote the whole client it had read: the rotated secret,
    reported to the operator, did not work, or the other change was undone)."""
    from helpers import make_config

    from tokensvc.admin import actions as admin
    from tokensvc.bootstrap import make_context
    from tokensvc.oauth import hashing

    ctx = make_context(make_config(), backend_store)
    spec = admin.ClientSpec("Robot", ["https://robot.example/cb"], ["read", "write"], confidential=True)
    await admin.create_client(backend_store, spec, "robot")
    (secret, _), _ = await asyncio.gather(admin.rotate_secret(ctx, "robot"),
                                          admin.update_client(ctx, "robot", {"description": "Builds things"}))
    robot = await backend_store.get_client("robot")
    assert hashing.matches(secret, robot.secret_hash) and robot.description == "Builds things"
    (secret, _), _ = await asyncio.gather(admin.rotate_secret(ctx, "robot"),
                                          admin.put_client(ctx, "robot", replace(spec, name="Robot 2",
                                                                                 scopes=["read"])))
    robot = await backend_store.get_client("robot")
    assert hashing.matches(secret, robot.secret_hash) and robot.name == "Robot 2" and robot.scopes == ["read"]
    await asyncio.gather(admin.update_client(ctx, "robot", {"description": "Still builds"}),
                         admin.update_client(ctx, "robot", {"logo_url": "https://robot.example/logo.png"}))
    robot = await backend_store.get_client("robot")
    assert (robot.description, robot.logo_url) == ("Still builds", "https://robot.example/logo.png")


@pytest.mark.gen_test
async def test_revoking_a_grant_revokes_its_families_and_a_new_consent_revives_it(backend_store, now):
    store = backend_store
    grant = await store.save_grant("webapp", ALICE, ["read"], now)
    other = await store.save_grant("skyplanner", ALICE, ["read"], now)
    await store.create_family(family(now, "f1", grant.grant_id, n=1))
    await store.create_family(family(now, "f2", grant.grant_id, n=2))
    await store.create_family(family(now, "f3", other.grant_id, n=3))
    assert await store.mark_grant_revoked(grant.grant_id, now) is True
    assert await store.mark_grant_revoked(grant.grant_id, now) is False
    assert (await store.get_grant(grant.grant_id)).revoked_at == now
    assert await store.revoke_grant_families(grant.grant_id, now) == 2
    assert await store.revoke_grant_families(grant.grant_id, now) == 0
    for family_id, revoked in (("f1", now), ("f2", now), ("f3", None)):
        assert (await store.get_family(family_id))[0].revoked_at == revoked, family_id
    assert await store.list_families(grant.grant_id) == []
    assert [f.family_id for f in await store.list_families(other.grant_id)] == ["f3"]
    assert [g.client_id for g in await store.list_grants(ALICE)] == ["skyplanner"]
    later = now + timedelta(minutes=1)
    revived = await store.save_grant("webapp", ALICE, ["write"], later)
    assert revived.grant_id == grant.grant_id and revived.revoked_at is None
    assert revived.created_at == later and revived.scopes == ["write"]


@pytest.mark.gen_test
async def test_codes_are_consumed_once(backend_store, now):
    store = backend_store
    await store.add_code(code(now))
    assert (await store.get_code("c1")).consumed_at is None
    first = await store.consume_code("c1", now, family_id="f1")
    assert first is not None and first.consumed_at is None and first.code_hash == "c1"
    assert await store.consume_code("c1", now, family_id="f2") is None
    redeemed = await store.get_code("c1")
    assert redeemed.consumed_at == now and redeemed.family_id == "f1"
    assert not redeemed.spent_by_failure
    assert await store.consume_code("unknown", now) is None


@pytest.mark.gen_test
async def test_a_code_is_redeemed_only_as_it_was_issued(backend_store, now):
    """The exchange's one step: the code consumed if, and only if, it is unconsumed, unexpired
    and presented by its client, for its redirect_uri, with its challenge, and without the
    scope refused; otherwise nothing is written."""
    store = backend_store
    await store.add_code(code(now))
    await store.add_code(replace(code(now, "c-admin"), scopes=["read", "admin"]))
    await store.add_code(code(now, "c-old", ttl=-1))
    right = Presentation("webapp", "https://a/cb", "x" * 43)
    for wrong in (replace(right, client_id="other"), replace(right, redirect_uri="https://a/other"),
                  replace(right, code_challenge="y" * 43)):
        assert await store.redeem_code("c1", now, "f1", wrong) is None
    assert (await store.get_code("c1")).consumed_at is None  # nothing written
    assert await store.redeem_code("c-old", now, "f1", right) is None  # expired
    assert await store.redeem_code("c-admin", now, "f1", replace(right, refused_scope="admin")) is None
    assert (await store.get_code("c-admin")).consumed_at is None
    assert await store.redeem_code("unknown", now, "f1", right) is None
    first = await store.redeem_code("c1", now, "f1", right)
    assert first is not None and first.consumed_at is None and first.code_hash == "c1"
    assert await store.redeem_code("c1", now, "f2", right) is None  # single use
    redeemed = await store.get_code("c1")
    assert (redeemed.consumed_at, redeemed.family_id, redeemed.spent_by_failure) == (now, "f1", False)
    assert await store.redeem_code("c-admin", now, "f3", right) is not None  # refusing nothing


@pytest.mark.gen_test
async def test_a_grant_is_read_with_its_user(backend_store, now):
    store = backend_store
    alice = User("u_alice", "alice", "x")
    await store.put_user(alice)
    grant = await store.save_grant("webapp", ALICE, ["read"], now)
    assert await store.grant_standing("webapp", ALICE) == (grant, alice)
    assert await store.grant_standing("other", ALICE) == (None, None)
    installation_grant = await store.save_grant("webapp", SCOPE, ["read"], now)
    assert await store.grant_standing("webapp", SCOPE) == (installation_grant, None)
    # By the key a code names: that grant, and only as the (subject, client) grant.
    assert await store.grant_standing("webapp", ALICE, grant.grant_id) == (grant, alice)
    assert await store.grant_standing("webapp", SCOPE, grant.grant_id) == (None, None)
    assert await store.grant_standing("other", ALICE, grant.grant_id) == (None, None)
    assert await store.grant_standing("webapp", ALICE, "g-unknown") == (None, None)
    await store.mark_grant_revoked(grant.grant_id, now)
    await store.delete_user("u_alice")
    revoked, gone = await store.grant_standing("webapp", ALICE)
    assert revoked is not None and revoked.revoked_at is not None and gone is None


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
async def test_a_family_is_created_once(backend_store, now):
    store = backend_store
    assert await store.create_family(family(now)) is True
    assert await store.create_family(family(now, n=2)) is False  # the id is taken: nothing changes
    assert (await store.get_family("f1"))[0] == family(now)
    results = await asyncio.gather(*(store.create_family(family(now, "f-race", n=10 + k)) for k in range(20)))
    assert results.count(True) == 1


@pytest.mark.gen_test
async def test_a_family_is_found_by_id_and_by_its_access_token_with_its_grant(backend_store, now):
    store = backend_store
    grant = await store.save_grant("webapp", ALICE, ["read"], now)
    stored = family(now, grant_id=grant.grant_id)
    await store.create_family(stored)
    assert await store.get_family("f1") == (stored, grant)
    assert await store.find_access("a1") == (stored, grant)
    assert await store.find_access("r1") == (None, None)  # a refresh token is no access token
    assert await store.get_family("nothing") == (None, None)
    assert await store.find_access("nothing") == (None, None)
    orphan = family(now, "f-orphan", grant_id="no-such-grant", n=9)
    await store.create_family(orphan)
    assert await store.get_family("f-orphan") == (orphan, None)


@pytest.mark.gen_test
async def test_an_access_token_that_names_its_family_is_found_by_the_id_and_the_hash_together(backend_store, now):
    """A routed access token's lookup names the ids its routing part may stand for (its
    family's shard key) beside its hash: a family among them holding the hash, as its current
    access token or the one its last rotation replaced, is found; no other, though it holds
    the hash. A lookup that names no id finds the token by its hash alone (the old shape)."""
    store = backend_store
    grant = await store.save_grant("webapp", ALICE, ["read"], now)
    stored = family(now, grant_id=grant.grant_id)
    await store.create_family(stored)
    await store.create_family(family(now, "f2", grant.grant_id, n=2))
    assert await store.find_access("a1", ("f1",)) == (stored, grant)
    assert await store.find_access("a1", ("f0", "f1")) == (stored, grant)
    assert await store.find_access("a1", ("f2",)) == (None, None)
    assert await store.find_access("a1", ("nothing",)) == (None, None)
    assert (await store.access_standing("a1", ("f1",))).family == stored
    assert (await store.access_standing("a1", ("f2",))).family is None
    assert (await store.access_standing("a1")).family == stored
    later = now + timedelta(seconds=5)
    rotated = await store.rotate_family("f1", "r1", pair(later, 3), later, previous_access=("a1", later))
    assert (await store.find_access("a1", ("f1",)))[0] == rotated
    assert (await store.access_standing("a3", ("f1",))).family == rotated
    assert (await store.access_standing("a1", ("f2",))).family is None


@pytest.mark.gen_test
async def test_a_familys_standing_is_read_with_its_grant_client_and_user(backend_store, now):
    """What a token's use is decided on, read together: the family, its grant, its client
    (none once its removal is recorded) and its user (none for an installation, or once gone)."""
    store = backend_store
    webapp = Client("webapp", "Web app", ["https://a/cb"], ["read"])
    alice = User("u_alice", "alice", "x")
    await store.put_client(webapp)
    await store.put_user(alice)
    grant = await store.save_grant("webapp", ALICE, ["read"], now)
    stored = family(now, grant_id=grant.grant_id)
    await store.create_family(stored)
    for standing in (await store.family_standing("f1"), await store.access_standing("a1")):
        assert (standing.family, standing.grant, standing.client, standing.user) == (stored, grant, webapp, alice)
    assert (await store.access_standing("r1")).family is None
    assert (await store.family_standing("nothing")).family is None
    installation_grant = await store.save_grant("webapp", SCOPE, ["read"], now)
    await store.create_family(family(now, "f2", installation_grant.grant_id, SCOPE, n=2))
    assert (await store.access_standing("a2")).user is None
    await store.delete_user("u_alice")
    await store.begin_removal("webapp", now, "t")
    gone = await store.family_standing("f1")
    assert (gone.family, gone.grant, gone.client, gone.user) == (stored, grant, None, None)


@pytest.mark.gen_test
async def test_a_clients_record_holds_its_previous_secret(backend_store, now):
    store = backend_store
    webapp = Client("webapp", "Web app", ["https://a/cb"], ["read"], secret_hash="b" * 64)
    await store.put_client(webapp)
    assert await store.client_record("webapp") == ClientRecord(webapp, None)
    previous = PreviousSecret("webapp", "a" * 64, "b" * 64, now, now + timedelta(hours=1))
    await store.put_previous_secret(previous)
    assert await store.client_record("webapp") == ClientRecord(webapp, previous)
    await store.delete_previous_secret("webapp")
    assert await store.client_record("webapp") == ClientRecord(webapp, None)
    assert await store.client_record("nothing") is None
    await store.begin_removal("webapp", now, "t")
    assert await store.client_record("webapp") is None


@pytest.mark.gen_test
async def test_rotation_is_atomic_and_conditional(backend_store, now):
    store = backend_store
    await store.create_family(family(now))
    later = now + timedelta(seconds=5)
    assert await store.rotate_family("f1", "r-wrong", pair(later, 2), later) is None
    assert await store.rotate_family("f1", "r1", pair(later, 2), now + timedelta(seconds=3601)) is None  # expired
    assert await store.rotate_family("nothing", "r1", pair(later, 2), later) is None
    results = await asyncio.gather(*(store.rotate_family("f1", "r1", pair(later, 100 + k), later)
                                     for k in range(50)))
    winners = [result for result in results if result is not None]
    assert len(winners) == 1
    rotated = winners[0]
    assert rotated == (await store.get_family("f1"))[0]
    assert rotated.previous_hash == "r1" and rotated.renewed_at == later and rotated.rotations == 1
    assert rotated.refresh_hash.startswith("r1") and rotated.access_hash == "a" + rotated.refresh_hash[1:]
    assert rotated.issued_at == later and rotated.expires_at == later + timedelta(seconds=3600)
    assert await store.find_access("a1") == (None, None)  # a refresh replaces the family's access token
    assert (await store.find_access(rotated.access_hash))[0] == rotated
    await store.revoke_family("f1", later)
    assert await store.rotate_family("f1", rotated.refresh_hash, pair(later, 3), later) is None  # revoked


@pytest.mark.gen_test
async def test_a_rotation_keeps_the_access_token_it_replaced_and_a_second_holder_is_marked_once(backend_store, now):
    """The access token a rotation replaces (as read with the refresh token) finds the family
    until the next rotation, beside its current one; the rotation applies only while it is
    still the family's access token. A second holder is recorded once."""
    store = backend_store
    await store.create_family(family(now))
    later = now + timedelta(seconds=5)
    replaced = ("a1", now + timedelta(seconds=600))
    assert await store.rotate_family("f1", "r1", pair(later, 2), later, previous_access=("a-other", later)) is None
    rotated = await store.rotate_family("f1", "r1", replace(pair(later, 2), salt="s2"), later,
                                        previous_access=replaced)
    assert (rotated.previous_access_hash, rotated.previous_access_expires_at, rotated.salt) == (*replaced, "s2")
    found, _ = await store.find_access("a1")
    assert found == rotated and found.access_hash == "a2"
    assert (await store.find_access("a2"))[0] == rotated
    assert await store.mark_second_holder("f1", later) is True
    assert await store.mark_second_holder("f1", later + timedelta(seconds=1)) is False  # the first stays
    assert (await store.get_family("f1"))[0].second_holder_at == later
    assert await store.mark_second_holder("nothing", later) is False
    again = await store.rotate_family("f1", "r2", pair(later, 3), later, previous_access=("a2", later))
    assert again.second_holder_at == later and again.previous_access_hash == "a2"  # for good
    assert await store.find_access("a1") == (None, None)  # only the last one replaced is kept
    assert (await store.find_access("a2"))[0] == again
    await store.purge_expired(later + timedelta(seconds=3601))
    assert await store.find_access("a2") == (None, None)


@pytest.mark.gen_test
async def test_a_pair_is_reissued_only_while_unused(backend_store, now):
    store = backend_store
    await store.create_family(family(now))
    later = now + timedelta(seconds=5)
    rotated = await store.rotate_family("f1", "r1", pair(later, 2), later)
    reissued = await store.reissue_pair("f1", "r2", pair(later, 3))
    assert reissued.refresh_hash == "r3" and reissued.access_hash == "a3"
    # What the retry leaves as it was: the token it retried, and when that was rotated out.
    assert (reissued.previous_hash, reissued.renewed_at, reissued.rotations) == ("r1", later, rotated.rotations)
    assert await store.reissue_pair("f1", "r2", pair(later, 4)) is None  # r2 is no longer the current one
    await store.mark_access_used("f1", "a-other", later)  # not its access token: nothing happens
    assert (await store.get_family("f1"))[0].access_used_at is None
    await store.mark_access_used("f1", "a3", later)
    await store.mark_access_used("f1", "a3", later + timedelta(seconds=1))  # the first use stays
    assert (await store.get_family("f1"))[0].access_used_at == later
    assert await store.reissue_pair("f1", "r3", pair(later, 5)) is None  # used
    again = await store.rotate_family("f1", "r3", pair(later, 6), later)  # a rotation clears the mark
    assert again.access_used_at is None and again.previous_hash == "r3"


@pytest.mark.gen_test
async def test_revoking_an_access_token_alone_and_a_family(backend_store, now):
    store = backend_store
    await store.create_family(family(now))
    assert await store.revoke_access("f1", "a-wrong", now) is False
    assert await store.revoke_access("f1", "a1", now) is True
    assert await store.revoke_access("f1", "a1", now) is False
    revoked_alone = (await store.find_access("a1"))[0]
    assert revoked_alone.access_revoked_at == now and revoked_alone.revoked_at is None
    assert await store.revoke_family("f1", now) is True
    assert await store.revoke_family("f1", now) is False
    assert await store.revoke_family("nothing", now) is False
    assert (await store.get_family("f1"))[0].revoked_at == now


@pytest.mark.gen_test
async def test_a_record_read_before_an_update_keeps_its_values(backend_store, now):
    store = backend_store
    await store.create_family(family(now))
    await store.add_code(code(now))
    await store.save_grant("webapp", ALICE, ["read"], now)
    client = Client("c", "C", ["https://c/cb"], ["read"], None, False, None, None, now)
    await store.put_client(client)
    family_before, code_before = (await store.get_family("f1"))[0], await store.get_code("c1")
    grant_before = await store.find_grant("webapp", ALICE)
    later = now + timedelta(seconds=5)
    assert await store.rotate_family("f1", "r1", pair(later, 2), later) is not None
    assert await store.revoke_family("f1", later) is True
    assert await store.consume_code("c1", later) is not None
    await store.mark_grant_revoked(grant_before.grant_id, later)
    # Updates store new values; what a caller already holds is a snapshot.
    assert family_before == family(now) and code_before == code(now)
    assert grant_before.revoked_at is None
    assert (await store.get_code("c1")) == replace(code_before, consumed_at=later)
    assert await store.get_grant(grant_before.grant_id) == replace(grant_before, revoked_at=later)
    # And a record a caller changes changes nothing stored.
    held = await store.get_client("c")
    held.redirect_uris.append("https://evil/cb")
    held.name = "changed"
    assert await store.get_client("c") == client
    listed = (await store.list_clients())[0]
    listed.allowed_scopes.append("admin")
    assert await store.get_client("c") == client
    families = await store.list_families("g1")
    assert families == []  # revoked


@pytest.mark.gen_test
async def test_the_live_families_of_a_grant_oldest_first(backend_store, now):
    store = backend_store
    later = now + timedelta(seconds=1)
    await store.create_family(family(later, "f-b", n=1))
    await store.create_family(family(now, "f-c", n=2))
    await store.create_family(family(later, "f-a", n=3))
    await store.create_family(family(now, "f-other", grant_id="g2", n=4))
    await store.create_family(family(now, "f-dead", n=5))
    await store.revoke_family("f-dead", now)
    assert [f.family_id for f in await store.list_families("g1")] == ["f-c", "f-a", "f-b"]


@pytest.mark.gen_test
async def test_listings_are_in_the_same_order_on_every_backend_with_equal_timestamps(backend_store, now):
    store = backend_store
    # Equal timestamps: grants by grant id, whatever the insertion order.
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
    await store.mark_grant_revoked(first.grant_id, now)
    again = await store.save_grant("webapp", ALICE, ["read"], now + timedelta(seconds=1))
    assert again.grant_id == first.grant_id and again.generation == first.generation + 1
    assert again.revoked_at is None
    old = family(now, "f-old", first.grant_id, n=1, generation=first.generation)
    new = family(now, "f-new", first.grant_id, n=2, generation=again.generation)
    for stored in (old, new):
        await store.create_family(stored)
        assert await store.get_family(stored.family_id) == (stored, again)
    # The old generation's family was never swept, yet it no longer stands.
    assert old.revoked_at is None and not old.stands(again) and new.stands(again)


@pytest.mark.gen_test
async def test_sessions(backend_store, now):
    store = backend_store
    session = Session("s1", "u_alice", now, now + timedelta(days=1))
    await store.add_session(session)
    assert await store.get_session("s1") == session
    assert await store.end_session("s1", now) is True
    assert await store.end_session("s1", now) is False
    assert await store.end_session("nothing", now) is False
    assert await store.get_session("s1") is None


@pytest.mark.gen_test
async def test_purge_expired(backend_store, now):
    store = backend_store
    await store.add_code(code(now, "c-live"))
    await store.add_code(code(now, "c-dead", ttl=10))
    await store.create_family(family(now, "f-live", n=1))
    await store.create_family(family(now, "f-dead", n=2, ttl=10))
    await store.add_session(Session("s-dead", "u", now, now + timedelta(seconds=10)))
    counts = await store.purge_expired(now + timedelta(seconds=60))
    assert counts == {"codes": 1, "families": 1, "sessions": 1}
    assert await store.get_code("c-live") is not None and await store.get_code("c-dead") is None
    assert (await store.get_family("f-live"))[0] is not None and await store.get_family("f-dead") == (None, None)
    assert await store.find_access("a2") == (None, None)
    assert await store.purge_expired(now + timedelta(seconds=60)) == {"codes": 0, "families": 0, "sessions": 0}


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
    assert await store.end_user_sessions("u1", now) == 2
    assert await store.get_session("s1") is None and await store.get_session("s2") is None
    assert await store.get_session("s3") is not None
    assert await store.end_user_sessions("u1", now) == 0


@pytest.mark.gen_test
async def test_a_users_sessions_are_listed_newest_first_and_bounded(backend_store, now):
    from tokensvc.storage.base import MAX_LISTED_SESSIONS

    store = backend_store
    for index in range(MAX_LISTED_SESSIONS + 5):
        seen = now + timedelta(seconds=index)
        await store.add_session(Session(f"s{index:04}", "u_alice", now, now + timedelta(hours=1), last_seen_at=seen))
    listed = await store.list_user_sessions("u_alice", now)
    assert len(listed) == MAX_LISTED_SESSIONS
    assert [s.session_hash for s in listed[:2]] == [f"s{MAX_LISTED_SESSIONS + 4:04}", f"s{MAX_LISTED_SESSIONS + 3:04}"]


@pytest.mark.gen_test
async def test_failure_counts_are_shared_where_several_processes_share_the_store(backend_store):
    """The failure-count concern (storage.base.FailureCounts): a store several processes share
    counts there, in one atomic step per attempt; a store of one process has none, and the
    limits count in that process (ratelimit.FailureLimits)."""
    counts = backend_store.failure_counts()
    if isinstance(backend_store, MemoryStore):
        assert counts is None
        return
    assert isinstance(counts, FailureCounts)
    assert await counts.read_counts("login|10.0.0.1", ["address", "alice"]) == ([0, 0], 0.0)
    first, left = await counts.count_attempt("login|10.0.0.1", ["address", "alice"], 300)
    assert first == [1, 1] and 0 < left <= 300
    # Concurrent attempts each see a count of their own: one atomic step each.
    results = await asyncio.gather(*(counts.count_attempt("login|10.0.0.1", ["address"], 300) for _ in range(8)))
    assert sorted(counted[0] for counted, _ in results) == list(range(2, 10))
    assert (await counts.read_counts("login|10.0.0.1", ["address", "alice", "bob"]))[0] == [9, 1, 0]
    await counts.uncount_attempt("login|10.0.0.1", ["address"], ["alice"])
    counted, left = await counts.read_counts("login|10.0.0.1", ["address", "alice"])
    assert counted == [8, 0] and 0 < left <= 300
    # Groups are apart.
    assert (await counts.read_counts("client|10.0.0.1", ["address"]))[0] == [0]
    # Each group has its own window (an account's hour, its 30 days); a count set back to zero
    # alone (a sign-in forgiving an account's failures since the last) takes nothing else back.
    _, hour = await counts.count_attempt("account|a1", ["n"], 3600)
    _, month = await counts.count_attempt("account-run|a1", ["n"], 30 * 86400)
    assert 300 < hour <= 3600 and 86400 < month <= 30 * 86400
    await counts.count_attempt("account-run|a1", ["n"], 30 * 86400)
    await counts.uncount_attempt("account-run|a1", [], ["n"])
    await counts.uncount_attempt("account|a1", [], [])
    assert (await counts.read_counts("account-run|a1", ["n"]))[0] == [0]
    assert (await counts.read_counts("account|a1", ["n"]))[0] == [1]


@pytest.mark.gen_test
async def test_a_familys_audience_is_its_codes_and_each_new_pair_says_its_access_tokens(backend_store, now):
    """RFC 8707 §2.2: a code keeps the resources its request named, a family the audience its
    authorization granted (its refresh token's, which no new pair changes), and each new pair
    (an exchange, a rotation, a retry's reissue) the audience of its own access token: narrowed,
    or None for the family's. None as the family's is every API's, as every record written
    before audiences reads."""
    store = backend_store
    granted = ["https://notes.example", "https://photos.example"]
    await store.add_code(replace(code(now), audience=granted))
    assert (await store.get_code("c1")).audience == granted
    await store.create_family(replace(family(now), audience=granted, access_audience=["https://photos.example"]))
    found, _ = await store.get_family("f1")
    assert found.audience == found.refresh().audience == granted
    assert found.access_audience == found.access().audience == ["https://photos.example"]
    later = now + timedelta(seconds=5)
    rotated = await store.rotate_family("f1", "r1", replace(pair(later, 2), access_audience=["https://notes.example"]),
                                        later)
    assert rotated is not None and rotated.audience == granted and rotated.refresh().audience == granted
    assert (await store.find_access("a2"))[0].access().audience == ["https://notes.example"]
    await store.reissue_pair("f1", "r2", replace(pair(later, 3)))  # naming none: the whole audience back
    again, _ = await store.get_family("f1")
    assert again.audience == granted and again.access_audience is None and again.access().audience == granted
    await store.create_family(family(now, "f2", n=9))
    unbound, _ = await store.get_family("f2")
    assert unbound.audience is None and unbound.access().audience is None
    # Bound to every API, its access token to one: a rotation may name another, or none.
    await store.rotate_family("f2", "r9", replace(pair(later, 10), access_audience=["https://notes.example"]), later)
    bound, _ = await store.get_family("f2")
    assert bound.audience is None and bound.access().audience == ["https://notes.example"]


@pytest.mark.gen_test
async def test_a_resource_uri_is_one_clients_whichever_write_declares_it(backend_store):
    """RFC 8707: a token meant for one API must not pass at another, so a resource URI is one
    client's. A registration, a replacement or a change that declares one another client's
    document holds is ResourceTaken and writes nothing (MongoDB: a unique multikey index);
    of two registrations at once declaring one URI, one lands. Clients without resources are
    many, and a client writes its own again."""
    store = backend_store
    notes = Client("notes-api", "Notes API", [], [], secret_hash="h", kind=RESOURCE_SERVER,
                   resources=["https://notes.example", "https://notes.example/v2"])
    await store.add_client(notes)
    other = Client("other-api", "Other API", [], [], secret_hash="h", kind=RESOURCE_SERVER,
                   resources=["https://other.example", "https://notes.example/v2"])
    for write in (store.add_client, store.put_client):
        with pytest.raises(ResourceTaken) as taken:
            await write(other)
        assert taken.value.resource == "https://notes.example/v2"
        assert await store.get_client("other-api") is None
    await store.add_client(replace(other, resources=["https://other.example"]))
    with pytest.raises(ResourceTaken):
        await store.update_client("other-api", {"resources": ["https://other.example", "https://notes.example"]})
    assert (await store.get_client("other-api")).resources == ["https://other.example"]
    await store.put_client(replace(notes, name="Notes"))  # its own, again
    assert await store.update_client("notes-api", {"resources": ["https://notes.example"]}) is not None
    assert await store.update_client("other-api", {"resources": ["https://other.example", "https://notes.example/v2"]})
    for n in range(3):  # none declared: as many as there are
        await store.add_client(Client(f"app-{n}", f"App {n}", ["https://a/cb"]))
        await store.put_client(Client(f"api-{n}", f"API {n}", [], [], secret_hash="h", kind=RESOURCE_SERVER))
    results = await asyncio.gather(*(store.add_client(replace(other, client_id=client_id, name=client_id,
                                                              resources=["https://shared.example"]))
                                     for client_id in ("one-api", "two-api")), return_exceptions=True)
    assert sorted(type(result).__name__ for result in results) == ["NoneType", "ResourceTaken"], results
    assert await store.declared_resources(["https://shared.example", "https://notes.example"]) == {
        "https://shared.example", "https://notes.example"}


@pytest.mark.gen_test
async def test_declared_resources_are_a_registered_resource_servers(backend_store, now):
    store = backend_store
    await store.put_client(Client("notes-api", "Notes API", [], [], secret_hash="h", kind=RESOURCE_SERVER,
                                  resources=["https://notes.example", "https://notes.example/v2"]))
    await store.put_client(Client("app", "App", ["https://a/cb"], resources=["https://app.example"]))  # no API
    asked = ["https://notes.example/v2", "https://app.example", "https://other.example"]
    assert await store.declared_resources(asked) == {"https://notes.example/v2"}
    await store.begin_removal("notes-api", now, "t")
    assert await store.declared_resources(asked) == set()
    assert await store.binds_audiences() is True  # a store no older release shares


@pytest.mark.gen_test
async def test_the_audience_of_a_grants_a_clients_or_a_users_families(backend_store, now):
    """What the revocation of a grant, a client or a user may touch, which the revocation feed
    tells the resource servers it concerns alone: the resources their live families are meant
    for together, each once. None (every reader) as soon as one of them names none: its tokens
    are meant for every API. Nothing held: none. A revoked or expired family, and a revoked
    grant's, count for nothing: their tokens are refused already."""
    store = backend_store
    notes, photos, own = "https://notes.example", "https://photos.example", "https://tokensvc.example/v1"
    bob = Subject(user_id="u_bob")
    alice_web = await store.save_grant("webapp", ALICE, ["read"], now)
    alice_sky = await store.save_grant("skyplanner", ALICE, ["read"], now)
    bob_web = await store.save_grant("webapp", bob, ["read"], now)
    assert await store.families_audience(grant_id=alice_web.grant_id) == []
    assert await store.families_audience(user_id="u_alice") == []
    await store.create_family(replace(family(now, "f1", alice_web.grant_id, n=1), audience=[photos, notes]))
    await store.create_family(replace(family(now, "f2", alice_web.grant_id, n=2), audience=[notes]))
    await store.revoke_family("f2", now)  # revoked: counts for nothing
    await store.create_family(replace(family(now, "f3", alice_sky.grant_id, n=3), client_id="skyplanner",
                                      audience=[photos]))
    await store.create_family(replace(family(now, "f4", bob_web.grant_id, bob, n=4), audience=[own]))
    assert await store.families_audience(grant_id=alice_web.grant_id) == [notes, photos]
    assert await store.families_audience(grant_id=alice_sky.grant_id) == [photos]
    assert await store.families_audience(client_id="webapp") == [notes, photos, own]
    assert await store.families_audience(client_id="skyplanner") == [photos]
    assert await store.families_audience(user_id="u_alice") == [notes, photos]
    assert await store.families_audience(user_id="u_bob") == [own]
    await store.create_family(family(now, "f5", bob_web.grant_id, bob, n=5))  # names none
    assert await store.families_audience(grant_id=bob_web.grant_id) is None
    assert await store.families_audience(client_id="webapp") is None
    assert await store.families_audience(user_id="u_bob") is None
    assert await store.families_audience(user_id="u_alice") == [notes, photos]
    assert await store.families_audience(client_id="nobody") == []
    await store.create_family(replace(family(now, "f6", alice_web.grant_id, n=6), audience=[own]))
    await store.revoke_family("f1", now)
    assert await store.families_audience(grant_id=alice_web.grant_id, now=now) == [own]
    assert await store.families_audience(user_id="u_alice", now=now) == [photos, own]
    # f6's refresh token expired (ttl 3600): dead, though no sweep took it yet
    assert await store.families_audience(grant_id=alice_web.grant_id, now=now + timedelta(seconds=3600)) == []
    await store.create_family(replace(family(now, "f7", alice_sky.grant_id, n=7), client_id="skyplanner"))
    assert await store.families_audience(user_id="u_alice", now=now) is None  # f7 names none
    await store.mark_grant_revoked(alice_sky.grant_id, now)
    assert await store.families_audience(user_id="u_alice", now=now) == [own]  # a revoked grant's: none
    await store.revoke_family("f5", now)
    await store.revoke_family("f4", now)
    assert await store.families_audience(user_id="u_bob", now=now) == []  # every family dead: none
