"""What a store that fails half-way, or loses a reply, leaves behind: on every backend, through
the protocol core (the mongodb backend is the yielding stand-in, tests/yielding.py)."""

from __future__ import annotations

import pytest
from backends import BACKENDS
from helpers import VERIFIER, WEBAPP_REDIRECT, family_of, make_config
from test_protocol import code_for

from tokensvc.bootstrap import make_context, seed
from tokensvc.oauth import authorization, grants, introspection, principal, revocation
from tokensvc.oauth.errors import InvalidGrant
from tokensvc.storage.base import GRANT, Revocation, StorageError

pytestmark = [pytest.mark.gen_test, pytest.mark.parametrize("backend_store", BACKENDS, indirect=True)]


@pytest.fixture
def proto(backend_store, io_loop, clock):
    config = make_config(tokens={"refresh_grace_seconds": 30})
    io_loop.run_sync(lambda: seed(backend_store, config))
    return make_context(config, backend_store, clock=clock)


async def issued(ctx):
    webapp = await ctx.store.get_client("webapp")
    code = await code_for(ctx)
    return webapp, await grants.exchange_code(ctx, webapp, code, WEBAPP_REDIRECT, VERIFIER)


async def test_an_interrupted_sweep_leaves_no_usable_token_and_reconsent_revives_none(proto, monkeypatch):
    webapp, tokens = await issued(proto)
    family = await family_of(proto.store, tokens.access_token)

    async def sweep_fails(*args, **kwargs):
        raise StorageError("the connection dropped")

    # The grant is marked revoked, then the sweep of its families fails (or the process dies).
    monkeypatch.setattr(proto.store, "revoke_grant_families", sweep_fails)
    with pytest.raises(StorageError):
        await revocation.revoke_grant(proto, family.grant_id, "user")
    monkeypatch.undo()
    unswept = await family_of(proto.store, tokens.access_token)
    assert unswept.revoked_at is None  # the sweep really did not reach it ...
    assert await introspection.introspect(proto, tokens.access_token) == {"active": False}  # ... yet it is dead
    assert await principal.from_bearer(proto, tokens.access_token) is None
    with pytest.raises(InvalidGrant):
        await grants.refresh(proto, webapp, tokens.refresh_token)

    # The user consents again: the same grant stands again, under a new generation.
    request = await authorization.validate(proto, {"response_type": ["code"], "client_id": ["webapp"],
                                                   "redirect_uri": [WEBAPP_REDIRECT], "state": ["s"],
                                                   "code_challenge": ["E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"],
                                                   "code_challenge_method": ["S256"]})
    alice = await proto.store.get_user_by_username("alice")
    await authorization.issue_code(proto, request, (await authorization.resolve_subject(proto, request, alice))[0])
    revived = await proto.store.get_grant(family.grant_id)
    assert revived.revoked_at is None and revived.generation == family.generation + 1
    assert await introspection.introspect(proto, tokens.access_token) == {"active": False}
    assert await principal.from_bearer(proto, tokens.access_token) is None
    with pytest.raises(InvalidGrant):
        await grants.refresh(proto, webapp, tokens.refresh_token)
    # What the new consent issues works.
    _, fresh = await issued(proto)
    assert (await introspection.introspect(proto, fresh.access_token))["active"] is True


async def test_a_code_from_before_a_revocation_is_void_after_reconsent(proto):
    webapp = await proto.store.get_client("webapp")
    old_code = await code_for(proto)
    _, tokens = await issued(proto)
    family = await family_of(proto.store, tokens.access_token)
    await revocation.revoke_grant(proto, family.grant_id, "user")
    await code_for(proto)  # consent again
    with pytest.raises(InvalidGrant, match="revoked"):
        await grants.exchange_code(proto, webapp, old_code, WEBAPP_REDIRECT, VERIFIER)


async def test_a_lost_reply_of_a_rotation_does_not_revoke_anything(proto, monkeypatch):
    webapp, tokens = await issued(proto)
    rotate = proto.store.rotate_family

    async def applied_but_reply_lost(*args, **kwargs):
        await rotate(*args, **kwargs)
        raise StorageError("the reply was lost")

    monkeypatch.setattr(proto.store, "rotate_family", applied_but_reply_lost)
    with pytest.raises(StorageError):  # the client gets 503
        await grants.refresh(proto, webapp, tokens.refresh_token)
    monkeypatch.undo()
    retried = await grants.refresh(proto, webapp, tokens.refresh_token)  # the client retries
    assert (await introspection.introspect(proto, retried.access_token))["active"] is True
    family = await family_of(proto.store, retried.refresh_token)
    assert family.revoked_at is None and (await proto.store.get_grant(family.grant_id)).revoked_at is None
    # Still one live pair, which goes on.
    assert (await grants.refresh(proto, webapp, retried.refresh_token)).access_token


async def test_a_revocation_whose_reply_was_lost_is_completed_by_the_retry(proto, monkeypatch):
    """The grant is marked and the reply is lost before the sweep: the client's retry finds
    nothing to mark, sweeps, and announces; nothing is left half-revoked."""
    _, tokens = await issued(proto)
    family = await family_of(proto.store, tokens.access_token)
    mark = proto.store.mark_grant_revoked

    async def applied_but_reply_lost(*args, **kwargs):
        await mark(*args, **kwargs)
        raise StorageError("the reply was lost")

    heard = []
    proto.events.subscribe([Revocation(GRANT, family.grant_id)], lambda: heard.append(1))
    monkeypatch.setattr(proto.store, "mark_grant_revoked", applied_but_reply_lost)
    with pytest.raises(StorageError):
        await revocation.revoke_grant_of(proto, tokens.access_token)
    monkeypatch.undo()
    assert heard == []
    assert await revocation.revoke_grant_of(proto, tokens.refresh_token) is False  # no longer in force ...
    assert await revocation.revoke_grant(proto, family.grant_id, "user") == 1  # ... but the retry of the sweep is
    assert heard == [1] and (await family_of(proto.store, tokens.refresh_token)).revoked_at is not None
