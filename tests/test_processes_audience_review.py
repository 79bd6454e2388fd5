"""The feed by audience across processes (docs/security.md, The feed by audience): a resource
server reading one process's feed never hears the family label of a family bound only to other
APIs, when another process revokes the grant it belongs to."""

from __future__ import annotations

import asyncio

import pytest
from helpers import WEBAPP_REDIRECT, family_of
from test_audience import NOTES, NOTES_SECRET, PHOTOS, grant_of, issued_as, with_apis
from test_feed import connect as connect_feed
from test_feed import next_message
from test_processes import other_process, store  # noqa: F401

from tokensvc.oauth import events


@pytest.mark.parametrize("config", [with_apis()], ids=["apis"])
@pytest.mark.gen_test(timeout=30)
async def test_another_processes_grant_revocation_names_no_family_of_another_api(app, http_server, base_url,
                                                                                  store, ctx, config):  # noqa: F811
    """alice's grant to the web app holds a family meant for notes and one meant for photos
    alone. Another process revokes it, then root's grant meant for notes. notes-api hears the
    grant and the notes family, never the photos family's label."""
    from tokensvc.bootstrap import make_context
    from tokensvc.oauth import revocation
    from tokensvc.oauth.feed import family_label

    relay = asyncio.ensure_future(events.relay(store, ctx.events))
    try:
        notes = await connect_feed(base_url, client_id="notes-api", secret=NOTES_SECRET)
        await next_message(notes)
        for_notes = await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT, NOTES)
        for_photos = await issued_as(ctx, "alice", "webapp", WEBAPP_REDIRECT, PHOTOS)
        delimiter = await issued_as(ctx, "root", "webapp", WEBAPP_REDIRECT, NOTES)
        grant = await grant_of(ctx, for_notes)
        assert await grant_of(ctx, for_photos) == grant  # one grant, two families
        photos_label = family_label((await family_of(store, for_photos.access_token)).family_id)
        last = await grant_of(ctx, delimiter)
        there = make_context(config, other_process(store))  # no event of this process fires
        await revocation.revoke_grant(there, grant, "test")
        await revocation.revoke_grant(there, last, "test")
        heard = []
        while not heard or heard[-1].get("grant_id") != last:
            heard.append(await next_message(notes))
        labels = {message.get("family_id") for message in heard}
        assert photos_label not in labels, f"notes-api heard the photos family's label: {heard}"
        notes.close()
    finally:
        relay.cancel()
        await asyncio.gather(relay, return_exceptions=True)
