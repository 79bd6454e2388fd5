"""The MongoDB backend, on PyMongo's asyncio API (``AsyncMongoClient``), as a package. The
store (:mod:`.store`, ``MongoStore``) is assembled from one part per job, each on the store's
one connection (:mod:`.connection`: the client, the sessioned database, the budgets, where the
store's format stands):

- the records, one part per concern of the Store contract: :mod:`.registry` (clients, their
  removals and previous secrets, users, installations), :mod:`.authorizations` (grants, codes,
  token families), :mod:`.sessions` (web sessions) and :mod:`.failures` (the failure counts);
  codes, families and sessions are credentials, keyed by a hash (:mod:`.credentials`);
- the store's keeping: :mod:`.indexes` (what start-up makes, what a finalize renames),
  :mod:`.lifecycle` (start-up, the heartbeat and the background migrations, health, stop),
  and :mod:`.feed` (the revocation feed, a part on the connection as the records' are);
- how an operation runs: :mod:`.retry` (budgets, retry kinds, errors), :mod:`.calls` (each
  driver call in a task of its own), :mod:`.causal` (sessions), :mod:`.topology` (the
  deployment as the driver sees it), :mod:`.mapping` (records and their hashes);
- what versions the store: :mod:`.format` (the format's history), :mod:`.hashes` (a hash in
  either format), :mod:`.migrations`, :mod:`.processes` (the running processes) and
  :mod:`.upgrade` (what the storage commands run).

One collection per record kind, keyed by ``_id`` (the record's id or hash; a hash, a SHA-256
digest, stored in the format the store's compatibility version says: ``format.py``,
``hashes.py``). Every operation that must be atomic is one single-document atomic command
(``find_one_and_update`` with the precondition in its filter). Expired codes, tokens and
sessions are removed by TTL indexes. Every driver error leaves this module as
:class:`StorageError`, and a duplicate unique key as :class:`Conflict`.

The queries and the index serving each (no query scans a collection):

======================  ===========================================  ===========================
collection              query                                        index
======================  ===========================================  ===========================
clients                 by client_id, with its removal ($lookup);    ``_id``; removals ``_id``
                        list sorted by client_id
clients                 resource servers declaring a resource;       ``resources`` unique, partial
                        one client per resource URI (RFC 8707)       (multikey; strings only)
removals                by client_id; every one (start-up)           ``_id``
removed_clients         (a removal's mark, for the relays)           TTL ``expires_at``
previous_secrets        by client_id; the expired ones               ``_id``; ``expires_at``
codes                   a narrowed client's unconsumed ones          ``client_unconsumed``
users                   by user_id; list by username                 ``_id``; ``username`` unique
users                   by username in any case (one read: a name    ``username_caseless``
                        0.9.0 stored with capitals, none at all)     (collation en, strength 2)
installations           by installation_id; list                     ``_id``
grants                  by grant_id                                  ``_id``
grants                  by (client_id, user_id, installation_id)     ``subject_client`` unique
grants                  active grants of a subject                   ``user_subject`` *
grants                  active grants of a client, by id             ``client_live``
families                a removed client's (bulk revocation), a      ``client_revoked``
                        narrowed client's live ones
codes                   by code_hash (get, consume)                  ``_id``; TTL ``expires_at``
families                by family_id (refresh, rotate, revoke)       ``_id``; TTL ``expires_at``
families                by the current access token's hash, with     ``access_hash`` unique
                        the id its routing part names (by the hash
                        alone for a token of 0.10.0's shape)
families                one per id while both formats are written    ``family_key`` unique,
                        (create: hashes.py, Twins)                   sparse
families                a grant's live ones (revoke a grant, list)   ``grant_live``
families                the distinct audiences of a grant's, a       ``grant_live``,
                        client's or (through their grants) a         ``client_revoked``,
                        user's (a revocation's write path)           ``user_subject``
sessions                by session_hash; a user's (end them all)     ``_id``; ``user_id``; TTL
(polling fallback)      revocations since a moment                   partial ``revoked_at``,
                                                                     ``access_revoked_at``,
                                                                     ``ended_at``, ``narrowed_at``
                                                                     (clients and users),
                                                                     ``credentials_changed_at``,
                                                                     ``removed_at``
======================  ===========================================  ===========================

(*) ``list_grants`` filters on ``user_id`` + ``installation_id`` + ``revoked_at``: the index
``user_subject`` (user_id, installation_id, revoked_at) serves it whole.

Revocations reach the other processes without a write of their own, but for a client's
removal: each process's relay watches the families, grants, sessions, clients and users
collections for writes that set ``revoked_at``, ``access_revoked_at``, ``ended_at``, a client's
or user's ``narrowed_at`` or a client's ``credentials_changed_at``, and ``removed_clients`` for a
removal's mark, ``removed_at`` (a change stream resumed where it left off, which says which of
them an update set, or, in ``removed_clients`` alone, which an inserted document holds: the
upsert's insert of a removal's first mark; elsewhere an insert, such as the move of a revoked
family to format 2, revokes nothing), or, where the deployment has none, polls those fields
through the partial indexes. Each mark is written with its audience beside it (``mark_audience``:
the time of the mark and the resources of the tokens it may touch), which the relay hands on with
the revocation (feed.py).

Reads see the writes before them: every operation runs in a causally consistent session
advanced to the latest operation time this process has seen (its own writes' and the relay's
change events'), so a primary elected a moment ago waits until it holds them before it
answers a majority read (``afterClusterTime``), instead of answering from before them. The
store reaches the database only through :class:`~.causal.SessionedDatabase`, which hands every
collection call that session.

How each operation is tried again is one table, :data:`RETRY_KINDS` (see :func:`guarded`);
how a record's hashes are stored and looked for, its kind's :class:`~.mapping.Mapper`.
"""

from __future__ import annotations

from tokensvc.storage.mongo.causal import CausalClock
from tokensvc.storage.mongo.feed import POLL_SECONDS, WATCHED
from tokensvc.storage.mongo.indexes import INDEXES
from tokensvc.storage.mongo.mapping import (
    CLIENTS,
    CODES,
    FAMILIES,
    GRANTS,
    INSTALLATIONS,
    PREVIOUS_SECRETS,
    REMOVALS,
    SESSIONS,
    USERS,
)
from tokensvc.storage.mongo.retry import (
    ONCE,
    READ,
    RERUN,
    RETRY_KINDS,
    STEPS,
    guarded,
    not_applied,
    transient,
    translate,
)
from tokensvc.storage.mongo.store import MongoStore

__all__ = [
    "CLIENTS", "CODES", "CausalClock", "FAMILIES", "GRANTS", "INDEXES", "INSTALLATIONS", "MongoStore", "ONCE",
    "POLL_SECONDS", "PREVIOUS_SECRETS", "READ", "REMOVALS", "RERUN", "RETRY_KINDS", "SESSIONS", "STEPS",
    "USERS", "WATCHED", "guarded", "not_applied", "transient", "translate",
]
