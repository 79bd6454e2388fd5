"""A code's exchange decides on the records as they are when it runs: the grant and its user
read together, the client just authenticated. A demotion between the consent and the exchange
takes ``admin`` out of what is issued; a revocation of the grant that lands while the exchange
writes its family leaves nothing of it in force."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import CHALLENGE, PASSWORD_HASHES, VERIFIER, WEBAPP_REDIRECT

from tokensvc.oauth import authorization, grants, hashing, introspection, revocation
from tokensvc.oauth.errors import InvalidGrant
from tokensvc.records import User

pytestmark = pytest.mark.gen_test

BOB = User("u_bob", "bob", PASSWORD_HASHES["root"], admin=True)


@pytest.fixture(autouse=True)
def bob(app, io_loop, store):
    io_loop.run_sync(lambda: store.put_user(BOB))


async def code_for(ctx, scope: str) -> str:
    args = {"response_type": "code", "client_id": "webapp", "redirect_uri": WEBAPP_REDIRECT, "state": "s",
            "code_challenge": CHALLENGE, "code_challenge_method": "S256", "scope": scope}
    request = await authorization.validate(ctx, {name: [value] for name, value in args.items()})
    subject, _ = await authorization.resolve_subject(ctx, request, BOB)
    return (await authorization.issue_code(ctx, request, subject)).split("code=")[1].split("&")[0]


async def exchange(ctx, code: str) -> grants.TokenResponse:
    return await grants.exchange_code(ctx, await ctx.store.get_client("webapp"), code, WEBAPP_REDIRECT, VERIFIER)


async def test_a_user_demoted_after_the_consent_gets_no_admin_from_the_code(ctx, store):
    code = await code_for(ctx, "read admin")
    await store.update_user(BOB.user_id, {"admin": False})
    tokens = await exchange(ctx, code)
    assert tokens.scope == "read"
    assert (await introspection.introspect(ctx, tokens.access_token))["scope"] == "read"


async def test_a_user_removed_after_the_consent_gets_nothing_from_the_code(ctx, store):
    code = await code_for(ctx, "read")
    await store.delete_user(BOB.user_id)
    with pytest.raises(InvalidGrant):
        await exchange(ctx, code)


async def test_a_grant_revoked_while_the_exchange_writes_its_family_leaves_nothing_in_force(
        ctx, store, monkeypatch):
    code = await code_for(ctx, "read")
    create_family = store.create_family

    async def revoked_first(family):  # the revocation lands after the exchange read the grant
        await revocation.revoke_grant(ctx, family.grant_id, "user")
        return await create_family(family)

    monkeypatch.setattr(store, "create_family", revoked_first)
    tokens = await exchange(ctx, code)
    monkeypatch.undo()
    assert await introspection.introspect(ctx, tokens.access_token) == {"active": False}
    assert await introspection.introspect(ctx, tokens.refresh_token) == {"active": False}
    with pytest.raises(InvalidGrant):
        await grants.refresh(ctx, await store.get_client("webapp"), tokens.refresh_token)


@pytest.mark.parametrize("named", [None, "g-another"], ids=["none", "another"])
async def test_the_grant_a_code_names_is_the_one_it_is_exchanged_under(ctx, store, monkeypatch, named):
    """A code names the grant it was issued under; one that names none (issued by 0.10.0) is
    exchanged under its subject's grant, one that names another grant is refused."""
    add_code = store.add_code
    monkeypatch.setattr(store, "add_code", lambda code: add_code(replace(code, grant_id=named)))
    code = await code_for(ctx, "read")
    assert (await store.get_code(hashing.digest(code))).grant_id == named
    if named is None:
        assert (await exchange(ctx, code)).scope == "read"
    else:
        with pytest.raises(InvalidGrant, match="revoked"):
            await exchange(ctx, code)


async def test_a_code_names_the_grant_it_was_issued_under(ctx, store):
    code = await code_for(ctx, "read")
    grant = await store.find_grant("webapp", (await store.get_code(hashing.digest(code))).subject)
    assert (await store.get_code(hashing.digest(code))).grant_id == grant.grant_id
