"""How MongoDB's errors leave the store: a duplicate key as Conflict wherever it happens, what
passes as StorageError (503 with Retry-After), what does not as StoreFault (500, no promise)."""

from __future__ import annotations

import hashlib
import logging

import pytest
from bson.errors import InvalidDocument
from helpers import WEBAPP_SECRET, basic, json_of, post_form
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    DuplicateKeyError,
    ExecutionTimeout,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    ServerSelectionTimeoutError,
    WriteConcernError,
    WTimeoutError,
)

from tokensvc.storage.base import Conflict, StorageError, StoreFault
from tokensvc.storage.mongo import translate

TRANSIENT = [
    AutoReconnect("connection reset"),
    NetworkTimeout("timed out"),
    ServerSelectionTimeoutError("no primary"),
    NotPrimaryError("not primary", {"code": 10107}),
    WTimeoutError("waiting for replication timed out", 64, {"code": 64}),
    ExecutionTimeout("operation exceeded time limit", 50, {"code": 50}),
    OperationFailure("interrupted at shutdown", 91, {"code": 91, "errorLabels": ["RetryableWriteError"]}),
]
PERMANENT = [
    OperationFailure("Authentication failed.", 18, {"code": 18}),
    OperationFailure("Document failed validation", 121, {"code": 121}),
    OperationFailure("An equivalent index already exists with different options", 85, {"code": 85}),
    WriteConcernError("No write concern mode named 'x' found", 79, {"code": 79}),
    InvalidDocument("cannot encode object: <object>"),
]
DUPLICATES = [
    DuplicateKeyError("E11000 duplicate key", 11000, {"code": 11000, "keyValue": {"username": "alice"}}),
    OperationFailure("E11000 duplicate key", 11000, {"code": 11000}),
    BulkWriteError({"writeErrors": [{"code": 11000, "errmsg": "E11000"}]}),
]


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda e: type(e).__name__)
def test_what_passes_is_storage_error(error):
    assert type(translate(error)) is StorageError


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__)
def test_what_does_not_pass_is_a_store_fault(error):
    translated = translate(error)
    assert type(translated) is StoreFault and str(error)[:20] in str(translated)


@pytest.mark.parametrize("error", DUPLICATES, ids=lambda e: type(e).__name__)
def test_a_duplicate_key_is_a_conflict_wherever_it_comes_from(error):
    assert type(translate(error)) is Conflict


def test_no_hash_and_no_signed_cluster_time_in_what_an_error_says():
    key = hashlib.sha256(b"a secret").hexdigest()
    answer = {"code": 11000, "keyValue": {"_id": bytes.fromhex(key)}, "$clusterTime": {"signature": {
        "hash": b"\x01" * 20, "keyId": 7}}}
    said = [str(translate(error)) for error in (
        DuplicateKeyError(f"E11000 duplicate key error collection: tokensvc.families index: _id_ dup key: "
                          f"{{ _id: \"{key}\" }}", 11000, answer),
        DuplicateKeyError(f"E11000 duplicate key error dup key: {{ _id: \"{key}\" }}", 11000, {"code": 11000}),
        OperationFailure("not authorized on admin", 13, {"code": 13, **answer}),
    )]
    assert said[0] == "{'_id': '<hash>'}" and "dup key: {...}" in said[1]
    for message in said:
        assert key not in message and key[:16] not in message and "signature" not in message, message


@pytest.mark.gen_test
@pytest.mark.parametrize("error, status", [(PERMANENT[0], 500), (TRANSIENT[0], 503)])
async def test_over_http_a_fault_is_500_without_retry_after(http_client, base_url, store, monkeypatch, caplog,
                                                              error, status):
    async def failing(*args, **kwargs):
        raise translate(error)

    monkeypatch.setattr(store, "get_client", failing)
    with caplog.at_level(logging.WARNING):
        response = await post_form(http_client, base_url + "/oauth/token/introspect", {"token": "x"},
                                   {"Authorization": basic("webapp", WEBAPP_SECRET)})
    assert response.code == status and set(json_of(response)) == {"detail"}
    assert ("Retry-After" in response.headers) == (status == 503)
    if status == 500:
        line = next(r for r in caplog.records if "store fault" in r.getMessage())
        assert line.levelno == logging.ERROR and "Authentication failed" in line.getMessage()
        assert "Traceback" not in caplog.text
