"""Storage backends behind one :class:`~tokensvc.storage.base.Store` interface."""

from __future__ import annotations

from tokensvc.config import ConfigError, StorageSettings
from tokensvc.storage.base import Conflict, StorageError, Store, StoreFault

__all__ = ["Conflict", "Store", "StorageError", "StoreFault", "make_store"]


def make_store(settings: StorageSettings, *, serving: bool = False) -> Store:
    """The backend ``storage.backend`` names; built inside the running event loop (the MongoDB
    driver starts its monitors as tasks of it). ``serving``: for ``tokensvc serve``, whose
    MongoDB store registers the process among those running (storage/processes.py)."""
    if settings.backend == "memory":
        from tokensvc.storage.memory import MemoryStore

        return MemoryStore()
    if settings.backend == "mongodb":
        from tokensvc.storage.mongo import MongoStore

        return MongoStore.from_settings(settings, serving=serving)
    raise ConfigError(f"storage.backend: unknown backend {settings.backend!r}")
