"""The adapters open a verifier's revocation feed on its first check when the application did
not (``await verifier.start()`` forgotten, or a framework with no start-up hook): without the
feed nothing tells the cache of a revocation, so every answer would be used ``offline_ttl``
after its introspection and every check past that would ask tokensvc again, silently.

Once per verifier: one closed at shutdown is not opened again by a request still in flight.
"""

from __future__ import annotations

import weakref

from tokensvc.resource.verifier import Verifier

_opened: weakref.WeakSet[Verifier] = weakref.WeakSet()


async def ensure_feed_open(checker: Verifier) -> None:
    """Make sure ``checker``'s feed was opened once by an adapter: opened now unless an adapter
    did before (:meth:`Verifier.start` itself does nothing when the feed is open already)."""
    if checker not in _opened:
        _opened.add(checker)
        await checker.start()
