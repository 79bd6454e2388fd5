"""A client's removal, which cannot half-happen.

1. **Recorded first** (:meth:`Store.begin_removal`): from then on the store answers no client
   under that id to any process of this release, so its tokens stop at once everywhere the
   client is looked at (every use: :mod:`tokensvc.oauth.privileges` finds no client, so
   introspection says inactive, bearer checks refuse, a refresh or an exchange is
   ``invalid_client``), and its document is deleted (a process of 0.9.0, which knows nothing of
   the record, then refuses the client at its token endpoints too). Only then is the client
   named as revoked (``client_id`` on the revocation feed): by this process at once, and by
   every other process's relay from the removal's mark, written after the record
   (:meth:`Store.mark_removal`; MongoDB: the ``removed_clients`` notice), so an introspection
   made after the name was heard can never find the client's tokens active. Every call of the
   removal writes the mark again, stamped with the time of that write. The call that recorded
   the removal audits its start (``client_removal_started``) before anything else can fail.
2. **Then its grants are revoked in bounded batches** (:data:`BATCH` at a time, each one store
   operation with its own budget, the families before their grants), each announced.
3. **Then finished** (:meth:`Store.end_removal`): the document withdrawn again (whatever wrote
   it back meanwhile), the previous secret, the record; each only while the record of this
   removal (its ``tag``, the call's that recorded it) is there.

No step of a removal, however late it runs (run again after a lost reply, or by another call of
the same removal), deletes a client registered under the id: while the record is there a
registration is refused (:class:`~tokensvc.storage.base.Removing`) and takes back what it
wrote, and each deletion takes only the document the removal found, or one an older release
wrote back (:meth:`Store.withdraw_client`).

A failure at any step (503) leaves the record: the client stays gone, and a retry of the same
removal, or the next start-up of any process, carries on from where it stopped (and names the
client again). The record is one of its own, never a field of the client's document, which
0.9.0 rewrites whole (docs/decisions/0039-state-outside-the-client-document.md).

A client registered under an id no client holds first has the grants left under that id from
before the registration began revoked, then claims the id (:func:`register`,
:func:`clear_leftovers`, :meth:`Store.add_client`, atomic: of two registrations at once one
wins, the other is refused): whatever removed the client before (a removal by 0.9.0 cut short
between its deletion and its revocation, a document deleted by hand), nothing issued to it
comes back to life under the new one, and nothing issued to the winner of a race is taken.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime

from tokensvc.records import Client, Removal, utcnow
from tokensvc.storage.base import CLIENT, GRANT, Authorizations, RegistryAndAuthorizations, Revocation, union
from tokensvc.telemetry import logs

BATCH = 200  # grants revoked per store operation


Announce = Callable[[Revocation], None]
Clock = Callable[[], datetime]  # the time of each write, read as it is made


def nobody(revocation: Revocation) -> None:
    """No WebSocket listens (start-up)."""


async def remove_client(store: RegistryAndAuthorizations, client_id: str, clock: Clock,
                        announce: Announce = nobody) -> int:
    """Remove a client (or carry on with its removal): recorded (the start audited by the call
    that recorded it, as soon as it did), marked (again, when it was already), its document
    deleted, named as revoked, its grants revoked a batch at a time, then finished. The grants
    this call revoked."""
    tag = secrets.token_hex(8)
    removal = await store.begin_removal(client_id, clock(), tag)
    if removal.tag == tag:
        logs.audit("client_removal_started", {"client_id": client_id, "outcome": "disabled"})
    # What it may touch: its families' audiences, read once its tokens are refused (none issued
    # after the record stands), written with the mark.
    audience = await store.families_audience(client_id=client_id, now=clock())
    await store.mark_removal(client_id, clock(), audience)
    await store.withdraw_client(removal)  # the document it found (never one registered since)
    # Its tokens are refused already; caches drop their answers.
    announce(Revocation(CLIENT, client_id, union(audience)))
    return await finish(store, removal, clock, announce)


async def _revoke_grants(store: Authorizations, client_id: str, clock: Clock, announce: Announce,
                         before: datetime | None = None) -> int:
    """Revoke every live grant under ``client_id`` (created before ``before``, if given), a
    batch at a time, each announced with the audience of its own live families (a resource
    server hears only the grants whose tokens may be meant for it) and stamped with the time of
    its own write (a polling relay reads the stamps a few seconds back: a long removal's later
    batches are heard too); how many."""
    revoked = 0
    while True:
        batch = await store.revoke_client_grants(client_id, clock(), BATCH, before)
        for grant_id, audience in batch.items():
            announce(Revocation(GRANT, grant_id, union(audience)))
        revoked += len(batch)
        if len(batch) < BATCH:
            return revoked


async def finish(store: RegistryAndAuthorizations, removal: Removal, clock: Clock, announce: Announce = nobody) -> int:
    """Revoke what is left of a recorded removal, a batch at a time, then end it (that removal
    alone). The grants revoked, each with the audience of its own families."""
    revoked = await _revoke_grants(store, removal.client_id, clock, announce)
    await store.end_removal(removal)
    logs.audit("client_removed", {"client_id": removal.client_id, "grants_revoked": revoked, "outcome": "success"})
    return revoked


async def finish_pending(store: RegistryAndAuthorizations, clock: Clock) -> list[str]:
    """Finish every removal a process left under way (start-up), each named again first (the
    process may have stopped before its mark was written), its mark stamped when it is written
    (after the removals before it: a polling relay reads the stamps a few seconds back); the
    clients removed."""
    removed = []
    for removal in await store.list_removals():
        audience = await store.families_audience(client_id=removal.client_id, now=clock())
        await store.mark_removal(removal.client_id, clock(), audience)
        await finish(store, removal, clock)
        removed.append(removal.client_id)
    return removed


async def clear_leftovers(store: Authorizations, client_id: str, now: datetime, announce: Announce = nobody,
                          clock: Clock = utcnow) -> int:
    """Revoke the grants left under ``client_id``, which no client holds (about to be
    registered, at ``now``: the new client's ``created_at``, read before the id was found free):
    whatever path removed the client of before, nothing issued to it comes back to life with the
    new one. Only the grants created before ``now``: a registration of the same id that won
    meanwhile keeps what it issued. Each announced, each batch stamped with the time ``clock``
    says as it is written (``now`` is a bound, not the time of the writes: a polling relay reads
    the stamps back an operation's budget); how many."""
    revoked = await _revoke_grants(store, client_id, clock, announce, before=now)
    if revoked:
        logs.audit("client_leftovers_revoked", {"client_id": client_id, "grants_revoked": revoked,
                                                 "outcome": "success"})
    return revoked


async def register(store: RegistryAndAuthorizations, client: Client, now: datetime, announce: Announce = nobody,
                   clock: Clock = utcnow) -> None:
    """Register ``client`` (its ``created_at`` is ``now``, read before its id was found free):
    the grants left under the id from before ``now`` revoked first (:func:`clear_leftovers`),
    then the id claimed (:meth:`Store.add_client`: :class:`~tokensvc.storage.base.Conflict`
    when another registration claimed it first, with nothing written). In this order no client
    is ever registered over live leftovers: a registration cut short anywhere (503, a reply
    lost) has either claimed nothing, and clears again when asked again, or cleared already; and
    the grants a registration that won the id issued are after ``now``, so never touched.
    ``clock``: the time of each write (the context's)."""
    await clear_leftovers(store, client.client_id, now, announce, clock)
    await store.add_client(client)
