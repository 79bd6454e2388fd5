"""The feed by audience (docs/security.md, The feed by audience): a resource server never hears
the family label, grant id or user id of a revocation that touches only tokens bound to other
APIs. Two paths that tell it all the same."""

from __future__ import annotations

import pytest
from helpers import VERIFIER, WEBAPP_REDIRECT, WEBAPP_SECRET, basic, post_form
from test_audience import NOTES, PHOTOS, code_for, config, feed_readers, heard, issued_as, tokens_for  # noqa: F401

from tokensvc.oauth import grants
from tokensvc.oauth.errors import InvalidGrant

pytestmark = pytest.mark.gen_test(timeout=60)


async def test_a_code_presented_twice_is_told_only_to_the_readers_of_its_audience(app, http_server, base_url, ctx):
    """The code's second presentation revokes the family its first started: a family meant for
    photos alone, so notes-api hears nothing of it. Its first message is the revocation of a
    notes token that follows."""
    notes, webapp = await feed_readers(base_url)
    webapp_client = await ctx.store.get_client("webapp")
    code = await code_for(ctx, PHOTOS)
    await grants.exchange_code(ctx, webapp_client, code, WEBAPP_REDIRECT, VERIFIER)
    with pytest.raises(InvalidGrant):
        await grants.exchange_code(ctx, webapp_client, code, WEBAPP_REDIRECT, VERIFIER)
    for_notes = await tokens_for(ctx, NOTES)
    await grants_revoked(ctx, for_notes)
    first = (await heard(notes, 1))[0]
    assert "grant_id" in first, f"notes-api heard a revocation of a family meant for photos alone: {first}"
    notes.close()
    webapp.close()


async def test_a_users_new_password_is_not_told_to_an_api_for_a_revoked_family_naming_none(
        app, http_server, http_client, base_url, ctx):
    """alice's only tokens in force are meant for photos: a family of hers that named no
    audience was revoked before. Her new password touches photos' tokens alone, so notes-api
    hears neither her id nor her grant's. Its first message is root's demotion, whose tokens
    are meant for notes."""
    from tokensvc.admin import actions as admin

    notes, webapp = await feed_readers(base_url)
    old = await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT)  # names none: every API's
    revoked = await post_form(http_client, base_url + "/oauth/token/revoke", {"token": old.refresh_token},
                              {"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert revoked.code == 200
    webapp_heard = await heard(webapp, 1)
    assert await heard(notes, 1) == webapp_heard  # a family meant for every API: heard, rightly
    await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT, PHOTOS)
    await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, NOTES)
    alice = await ctx.store.get_user_by_username("alice")
    root = await ctx.store.get_user_by_username("root")
    await admin.set_password(ctx, "alice", "granite-willow-comet-lantern", keep_grants=True)
    await admin.set_admin(ctx, "root", False)
    first = (await heard(notes, 1))[0]
    assert first == {"type": "revoked", "sub": root.user_id}, (
        f"notes-api heard {first}: alice ({alice.user_id}) holds no token in force that may be meant for it")
    notes.close()
    webapp.close()


async def grants_revoked(ctx, issued) -> None:
    from tokensvc.oauth import introspection, revocation

    grant_id = (await introspection.introspect(ctx, issued.access_token))["grant_id"]
    _grants[issued.access_token] = grant_id
    await revocation.revoke_grant(ctx, grant_id, "test")


async def test_a_clients_removal_tells_each_grant_only_to_the_readers_of_that_grants_audience(
        app, http_server, base_url, ctx):
    """skyplanner's grant of alice holds tokens meant for photos alone, its grant of root tokens
    meant for notes. Its removal revokes both: notes-api hears the client and root's grant,
    never alice's grant, before the revocation of a notes grant that follows."""
    from test_audience import SKY_REDIRECT

    from tokensvc.admin import actions as admin

    await ctx.store.set_owners("client", {})  # the operator's to change
    notes, webapp = await feed_readers(base_url)
    photos_grant = await grant_of_issued(ctx, await issued_as(ctx, "alice", "skyplanner", SKY_REDIRECT, PHOTOS))
    notes_grant = await grant_of_issued(ctx, await issued_as(ctx, "root", "skyplanner", SKY_REDIRECT, NOTES))
    delimiter = await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, NOTES)
    await admin.remove_client(ctx, "skyplanner")
    await grants_revoked(ctx, delimiter)
    last = await grant_of_issued(ctx, delimiter, active=False)
    messages = []
    while not messages or messages[-1].get("grant_id") != last:
        messages.append((await heard(notes, 1))[0])
    assert notes_grant in {message.get("grant_id") for message in messages}
    assert photos_grant not in {message.get("grant_id") for message in messages}, (
        f"notes-api heard the grant whose tokens are meant for photos alone: {messages}")
    notes.close()
    webapp.close()


_grants: dict[str, str] = {}


async def grant_of_issued(ctx, issued, active: bool = True) -> str:
    from tokensvc.oauth import introspection

    if active:
        _grants[issued.access_token] = (await introspection.introspect(ctx, issued.access_token))["grant_id"]
    return _grants[issued.access_token]
