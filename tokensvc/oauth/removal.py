"""A client's removal, which cannot half-happen.

1. **Recorded first** (:meth:`Store.begin_removal`): from then on the store answers no client
   under that id to any process of this release, so its tokens stop at once everywhere the
   client is looked at (every use: :mod:`tokensvc.oauth.privileges` finds no client, so
   introspection says inactive, bearer checks refuse, a refresh or an exchange is
   ``invalid_client``), and its document is deleted (a process of 0.9.0, which knows nothing of
   the record, then refuses the client at its token endpoints too).
2. **Then its grants are revoked in bounded batches** (:data:`BATCH` at a time, each one store
   operation with its own budget, the families before their grants), each announced.
3. **Then finished** (:meth:`Store.end_removal`): the document deleted again (whatever wrote it
   back meanwhile), the previous secret, the record.

A failure at any step (503) leaves the record: the client stays gone, and a retry of the same
removal, or the next start-up of any process, carries on from where it stopped. The record is
one of its own, never a field of the client's document, which 0.9.0 rewrites whole
(ARCHITECTURE.md, the store's format).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from tokensvc import logs
from tokensvc.storage.base import CLIENT, GRANT, Revocation, Store

BATCH = 200  # grants revoked per store operation


def _nobody(revocation: Revocation) -> None:
    """No WebSocket listens (start-up)."""


async def remove_client(store: Store, client_id: str, now: datetime,
                        announce: Callable[[Revocation], None] = _nobody) -> int:
    """Remove a client (or carry on with its removal): recorded, its document deleted, its
    grants revoked a batch at a time, then finished. The grants this call revoked."""
    if await store.get_removal(client_id) is None:
        await store.begin_removal(client_id, now)
        logs.audit("client_removal_started", {"client_id": client_id, "outcome": "disabled"})
    await store.delete_client(client_id)
    announce(Revocation(CLIENT, client_id))  # open WebSockets of its tokens re-check: no client
    return await finish(store, client_id, now, announce)


async def finish(store: Store, client_id: str, now: datetime,
                 announce: Callable[[Revocation], None] = _nobody) -> int:
    """Revoke what is left of a recorded removal, a batch at a time, then end it. The grants
    revoked."""
    revoked = 0
    while True:
        batch = await store.revoke_client_grants(client_id, now, BATCH)
        for grant_id in batch:
            announce(Revocation(GRANT, grant_id))
        revoked += len(batch)
        if len(batch) < BATCH:
            break
    await store.end_removal(client_id)
    logs.audit("client_removed", {"client_id": client_id, "grants_revoked": revoked, "outcome": "success"})
    return revoked


async def finish_pending(store: Store, now: datetime) -> list[str]:
    """Finish every removal a process left under way (start-up); the clients removed."""
    removed = []
    for removal in await store.list_removals():
        await finish(store, removal.client_id, now)
        removed.append(removal.client_id)
    return removed
