"""How the MongoDB store runs an operation: one budget, retries by the operation's kind (one table,
:data:`RETRY_KINDS`, of every Store method's), and every driver error leaving as one of three
(:class:`~tokensvc.storage.base.StorageError`, :class:`~tokensvc.storage.base.StoreFault`,
:class:`~tokensvc.storage.base.Conflict`)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import random
import re
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pymongo
from bson.errors import BSONError
from pymongo.errors import (
    BulkWriteError,
    ConfigurationError,
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    InvalidOperation,
    OperationFailure,
    PyMongoError,
    WTimeoutError,
)

from tokensvc.storage.base import Conflict, ResourceTaken, StorageError, StoreFault
from tokensvc.storage.mongo import calls, hashes
from tokensvc.storage.mongo.causal import CAUSAL_SESSION

if TYPE_CHECKING:
    from tokensvc.storage.mongo.connection import Connection

R = TypeVar("R")


class OnConnection(Protocol):
    """What a guarded operation runs on: a part of the store (or the store), holding the
    store's :class:`~tokensvc.storage.mongo.connection.Connection`."""

    @property
    def connection(self) -> Connection: ...

DUPLICATE_KEY = frozenset({11000, 11001, 12582})
# Codes a read or write may be tried again after (the driver's list, and the server's
# retryable-write codes): a step-down, shutdown, a node unreachable, a time limit, majority
# reads not yet available on a new primary; a write conflict (nothing applied) and a lost
# cursor (the read runs again from the start).
WRITE_CONFLICT, CURSOR_NOT_FOUND = 112, 43
RETRYABLE_CODES = frozenset({6, 7, 89, 91, 134, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
                             WRITE_CONFLICT, CURSOR_NOT_FOUND})
AUTHENTICATION_FAILED = 18
MINIMUM_SERVER = "4.4"  # wire version 9: change streams' postBatchResumeToken, retryable writes, $lookup


# How an operation may be tried again within its budget (see :func:`guarded`).
ONCE = "once"  # a single-document write: the driver's one retry, with the same txnNumber, dedups it
RERUN = "rerun"  # an idempotent write (a conditional set, an upsert, a sweep): run again, with backoff
READ = "read"  # a read: run again, with backoff, each run under the server's maxTimeMS
STEPS = "steps"  # not one operation: several, one after the other, each with its own kind (below)

# The retry kind of every method of the Store contract (storage/base.py), and of the store's
# own operations that those run as steps: the one place that says how each may be tried
# again. ``guarded()`` takes a method's kind from here; tests/test_mongo_retry.py holds the
# table to the contract, and tests/wire/test_wire_store.py shows each kind meeting a lost reply.
# ONCE is every write that, applied twice, does something else than once: an insert, a
# consumption, a rotation, a revocation that answers whether it revoked, a count.
RETRY_KINDS: dict[str, str] = {
    # Registry
    "get_client": READ, "list_clients": READ, "declared_resources": READ, "put_client": RERUN, "add_client": STEPS,
    "update_client": ONCE, "set_owners": RERUN,
    "get_user": READ, "get_user_by_username": READ, "list_users": READ, "seed_user": STEPS, "put_user": STEPS,
    "update_user": ONCE, "delete_user": RERUN,
    "get_installation": READ, "list_installations": READ, "put_installation": RERUN, "delete_installation": RERUN,
    "begin_removal": STEPS, "mark_removal": RERUN, "get_removal": READ, "list_removals": READ, "end_removal": STEPS,
    "withdraw_client": RERUN,
    "client_record": STEPS, "put_previous_secret": RERUN, "get_previous_secret": READ, "delete_previous_secret": RERUN,
    "note_previous_secret_use": ONCE, "expire_previous_secret": ONCE,
    # Authorizations
    "save_grant": ONCE, "get_grant": READ, "find_grant": READ, "grant_standing": READ, "list_grants": READ,
    "list_client_grants": READ,
    "revoke_client_grants": STEPS, "withdraw_scopes": RERUN, "mark_grant_revoked": STEPS,
    "revoke_grant_families": RERUN,
    "add_code": ONCE, "get_code": READ, "consume_code": ONCE, "redeem_code": ONCE,
    "create_family": ONCE, "get_family": READ, "find_access": READ,
    "family_standing": READ, "access_standing": READ, "rotate_family": ONCE, "reissue_pair": ONCE,
    "mark_access_used": RERUN, "mark_second_holder": RERUN, "revoke_access": STEPS, "revoke_family": STEPS,
    "list_families": READ, "families_audience": STEPS,
    # Sessions
    "add_session": ONCE, "get_session": READ, "end_session": STEPS, "end_user_sessions": RERUN,
    "list_user_sessions": READ, "touch_session": RERUN,
    # Housekeeping
    "open": ONCE, "close": STEPS, "upkeep": STEPS, "ping": READ, "revocation_feed": STEPS, "purge_expired": RERUN,
    "binds_audiences": STEPS,  # the format, read by a command line's store (writing)
    "deployment_settings": STEPS,
    "reachable": STEPS,  # no operation: a wait for the driver to see the store again
    # Failure counts (FailureCounts)
    "count_attempt": ONCE, "uncount_attempt": ONCE, "read_counts": READ,
    # The steps of the STEPS methods above.
    "_caseless_holders": READ, "_write_user": RERUN,  # put_user
    "_client_record": READ,  # client_record, when this process read it too long ago
    "_seeded_admin": READ, "_seed_write": RERUN,  # seed_user
    "_live_client_grant_ids": READ, "_grants_audiences": READ, "_revoke_families_where": RERUN,
    "_mark_grants": RERUN,  # revoke_client_grants
    "_user_grant_ids": READ, "_audiences": READ,  # families_audience
    "_insert_client": ONCE, "_removal_recorded": READ, "_take_back": RERUN, "_exists": READ,  # add_client
    "_claim_of": READ, "_record_removal": RERUN,  # begin_removal
    "_drop_removal": RERUN,  # end_removal
    "_revoke_family": ONCE, "_revoke_access": ONCE, "_mark_grant_revoked": ONCE, "_end_session": ONCE,
    "_restamp": RERUN, "_restamp_late": RERUN,  # revoke_family, revoke_access, mark_grant_revoked, end_session
    "_mark_stopped": RERUN,  # close
    "_declare_settings": RERUN, "_running_settings": READ,  # deployment_settings
    "heartbeat": RERUN,  # upkeep
    "_revoked_since": READ,  # revocation_feed, polling
}
BACKOFF_BASE_SECONDS = 0.025
BACKOFF_CAP_SECONDS = 1.0


def backoff(attempt: int) -> float:
    """Full jitter (a uniform wait up to an exponential cap): processes that failed together
    do not come back together."""
    return random.uniform(0, min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** attempt))


# Whether the operation running in this task is being run again after a failed attempt, whose
# write may have applied all the same (a sweep then reports what the store holds: Credentials.swept).
RUN_AGAIN: contextvars.ContextVar[bool] = contextvars.ContextVar("tokensvc_mongo_run_again", default=False)


def guarded(kind: str | None = None, budget: str = "budget",
            stamps: Callable[..., tuple[str, dict[str, Any], str, Any]] | None = None,
            ) -> Callable[[Callable[..., Coroutine[Any, Any, R]]], Callable[..., Coroutine[Any, Any, R]]]:
    """One budget per operation (``storage.timeout_ms``), retries within it, and every driver
    error leaving as one of three. ``kind``: how the operation may be tried again; by default
    the one :data:`RETRY_KINDS` gives the method's name. The operation is a method of a part of
    the store, or a function of the store (its first argument): either holds the store's
    connection (:class:`OnConnection`), whose ``budget`` (or the one ``budget`` names) it has.

    The whole operation, its retries included, is answered within the store's budget: each
    attempt runs in a task of its own (storage/mongo/calls.py), which the store waits for at
    most what is left of the budget and never cancels (a cancellation inside the driver can
    leave its lock held by no one). An attempt the store stops waiting for goes on to the
    driver's own deadlines (a read's ``pymongo.timeout``, the client's server-selection, pool
    and socket timeouts), and its session is ended at once (:meth:`CausalClock.abandon`), so
    nothing of it is sent after the store answered. The driver retries a write once with the
    same ``txnNumber`` (the server applies it at most once) and never a read; the store itself
    tries reads and idempotent writes again after a transient error, with jittered
    exponential backoff, while the budget lasts. Nothing is ever tried back to back (the
    driver's own loop under ``timeoutMS`` would, for the whole budget: that is why the client
    has no ``timeoutMS``, and why a write runs under no ``pymongo.timeout``).

    A one-document write is run again by the store only after an error whose label says the
    server did not apply it (a write conflict, ``TransientTransactionError``); a write while
    the driver sees no writable member that only a change of the deployment brings back (a
    directly connected secondary: storage/mongo/topology.py) fails at once, as does any operation
    under a closed client (the service is stopping: retrying cannot help). A read or an
    idempotent write waiting when another primary is elected is run again at once, on the new
    one (:meth:`Topology.abandoned`), unless its budget ran out meanwhile (then it is a timeout).

    ``stamps``: where a write stamps a revocation's mark (``(collection, filter, field, time)``
    from the method's arguments): an attempt the store stopped waiting for may land later than a
    polling relay reads back, with its old time, so once its call ends, the mark it wrote is
    stamped again with the time then (storage/mongo/stamps.py).

    Errors: a duplicate key as :class:`Conflict`; what passes (network, server selection, a
    primary stepping down, a timeout, a write conflict, the client closed under a request) as
    :class:`StorageError` (503, try again); anything else, which will not pass by retrying
    (authentication, a server too old, validation, index options, a document BSON cannot
    hold), as :class:`StoreFault` (500, the operator must act; at start-up the service stops
    with its one line)."""

    def decorate(method: Callable[..., Coroutine[Any, Any, R]]) -> Callable[..., Coroutine[Any, Any, R]]:
        chosen = kind or RETRY_KINDS[method.__name__]
        if chosen not in (ONCE, RERUN, READ):
            raise ValueError(f"{method.__name__}: {chosen!r} is no kind of a single operation")

        async def attempt(self: OnConnection, again: bool, remaining: float, *args: Any, **kwargs: Any) -> R:
            """One attempt, in its own task: the method, a read under the server's maxTimeMS."""
            RUN_AGAIN.set(again)
            if chosen == READ:
                with pymongo.timeout(remaining):  # the server's maxTimeMS: it stops too
                    return await method(self, *args, **kwargs)
            return await method(self, *args, **kwargs)

        async def waited(self: OnConnection, remaining: float, again: bool, *args: Any, **kwargs: Any) -> R:
            """One attempt's answer, waited for at most ``remaining`` (:class:`calls.Left`), or,
            unless it is a single-document write, until another primary is elected
            (:class:`calls.Elected`); in a causally consistent session of its own, ended when
            the attempt ends, or at once when the store stops waiting for it (an operation run
            as a step of another, as ``upgrade.status`` runs ``upgrade.current``, runs in that
            one's session)."""
            connection = self.connection
            elections = connection.topology.abandoned() if chosen != ONCE else None
            context = contextvars.copy_context()
            session = None
            clock = connection.clock
            if clock is not None and CAUSAL_SESSION.get() is None:  # else a step of a call: its session
                session = clock.start(connection.client)
                context.run(CAUSAL_SESSION.set, session)
            call = connection.calls.start(attempt(self, again, remaining, *args, **kwargs), context)
            try:
                return await connection.calls.wait(call, remaining, elections)
            except calls.Left:
                restamp = getattr(connection, "restamp_later", None)  # a store's connection has one
                if stamps is not None and restamp is not None and not call.done():
                    stamped = stamps(self, *args, **kwargs)
                    call.add_done_callback(lambda _: restamp(stamped))
                raise
            finally:
                if session is not None and clock is not None:
                    if call.done():
                        await clock.end(session, not call.cancelled() and call.exception() is None)
                    else:
                        await clock.abandon(session)

        @functools.wraps(method)
        async def wrapper(self: OnConnection, *args: Any, **kwargs: Any) -> R:
            connection = self.connection
            if chosen != READ and (reason := connection.unwritable()) is not None:
                connection.observer.error(method.__name__, "not_writable")
                raise StorageError(reason)
            loop = asyncio.get_running_loop()
            seconds: float = getattr(connection, budget)
            deadline = loop.time() + seconds
            attempt_number = 0
            started = loop.time()
            while True:
                try:
                    try:
                        remaining = deadline - loop.time()
                        if remaining <= 0:  # abandoned by an election as the budget ran out
                            raise calls.Left()
                        result = await waited(self, remaining, attempt_number > 0, *args, **kwargs)
                    except calls.Elected:
                        connection.observer.error(method.__name__, "abandoned")
                        attempt_number += 1
                        connection.observer.retry(method.__name__)
                        continue  # a new primary: at once, no backoff
                    connection.observer.operation(method.__name__, loop.time() - started)
                    return result
                except (calls.Left, TimeoutError):
                    connection.observer.error(method.__name__, "timeout")
                    raise StorageError(f"MongoDB: no answer within {seconds:g} s") from None
                except (PyMongoError, BSONError) as exc:
                    error = translate(exc)
                    connection.observer.error(method.__name__, _code_of(exc))
                    delay = backoff(attempt_number)
                    again = chosen != ONCE or not_applied(exc)
                    if (not again or type(error) is not StorageError or isinstance(exc, InvalidOperation)
                            or loop.time() + delay >= deadline):
                        raise error from None
                attempt_number += 1
                connection.observer.retry(method.__name__)
                await asyncio.sleep(delay)

        wrapper.retry_kind = chosen  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _code_of(exc: Exception) -> str:
    """A bounded label for an error: its server code, or its class."""
    code = getattr(exc, "code", None)
    return str(code) if isinstance(code, int) else type(exc).__name__


def translate(exc: Exception) -> Exception:
    """The store's exception for a driver error (see :func:`guarded`). Its message never holds
    a hash (a duplicate key's value, the server's whole answer with its signed cluster time)."""
    if _duplicate_key(exc):
        details = getattr(exc, "details", None) or {}
        key = details.get("keyValue")
        if "resources" in (details.get("keyPattern") or {}) or " index: resources " in str(exc):
            value = key.get("resources") if isinstance(key, dict) else None
            return ResourceTaken(value if isinstance(value, str) else None)
        return Conflict(str({name: "<hash>" if isinstance(value, bytes) or hashes.is_digest(value) else value
                             for name, value in key.items()}) if isinstance(key, dict) else _head(exc))
    head = _head(exc)
    if isinstance(exc, ConfigurationError) and "wire version" in head:
        return StoreFault(f"MongoDB is too old for tokensvc, which needs MongoDB {MINIMUM_SERVER} or later: {head}")
    if isinstance(exc, OperationFailure) and exc.code == AUTHENTICATION_FAILED:
        return StoreFault(f"MongoDB refused the credentials of storage.mongodb_uri: {head} (check its user, password "
                          "and authSource)")
    if isinstance(exc, PyMongoError) and transient(exc):
        return StorageError(f"MongoDB: {type(exc).__name__}: {head}")
    return StoreFault(f"MongoDB refused: {type(exc).__name__}: {head}")


def _head(exc: Exception) -> str:
    """What a message may say of a driver error: its first part (the driver's can carry a whole
    topology description, or the server's whole reply), any duplicate key's value left out."""
    head = str(exc).split(", full error:")[0].split(", Timeout:")[0].split(" (configured timeouts")[0][:300]
    return re.sub(r"dup key: \{.*?\}", "dup key: {...}", head)


def transient(exc: PyMongoError) -> bool:
    """Whether waiting and trying again can help: the network, a timeout, a primary stepping
    down, a write conflict, an SRV record that does not resolve yet (``ConfigurationError``),
    the client closed under a request while the service stops (``InvalidOperation``: a 503,
    tried once)."""
    return (isinstance(exc, (ConnectionFailure, ExecutionTimeout, WTimeoutError, ConfigurationError,
                             InvalidOperation)) or exc.timeout
            or exc.has_error_label("RetryableWriteError") or exc.has_error_label("TransientTransactionError")
            or (isinstance(exc, OperationFailure) and exc.code in RETRYABLE_CODES))


def not_applied(exc: Exception) -> bool:
    """Whether the server says it applied nothing, so that even a one-document write may run
    again: a write conflict (its label ``TransientTransactionError``: start over)."""
    return isinstance(exc, PyMongoError) and (exc.has_error_label("TransientTransactionError") or (
        isinstance(exc, OperationFailure) and exc.code == WRITE_CONFLICT))


def _duplicate_key(exc: Exception) -> bool:
    if isinstance(exc, DuplicateKeyError):
        return True
    if isinstance(exc, BulkWriteError):
        errors = exc.details.get("writeErrors") or []
        return bool(errors) and all(error.get("code") in DUPLICATE_KEY for error in errors)
    return isinstance(exc, OperationFailure) and exc.code in DUPLICATE_KEY
