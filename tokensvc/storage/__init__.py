"""Storage backends behind one :class:`~tokensvc.storage.base.Store` interface (the backend a
configuration names is built by ``tokensvc.bootstrap.make_store``: importing the contract loads
no configuration)."""

from __future__ import annotations

from tokensvc.storage.base import Conflict, StorageError, Store, StoreFault

__all__ = ["Conflict", "Store", "StorageError", "StoreFault"]
