"""What a member of :class:`primary.ReplicaSet` does with a command: the CRUD, index and cursor
commands executed on the set's one mongomock data set, as a server executes them.

- A single-document write (``findAndModify``, an ``update`` or ``delete`` of one document, each
  document of an ``insert``) is atomic; a multi-document ``update`` or ``delete`` takes the
  documents one at a time, releasing the data between them, so other commands run in between
  (a sweep is no snapshot: a document inserted meanwhile may be missed, one changed meanwhile
  is matched again as it is then).
- Every document a write changes is one entry of the oplog (:meth:`primary.ReplicaSet.applied`):
  its own optime, its change event (``streams.py``), what a majority read and a rollback need
  of it. A write that changes nothing (no match, a field set to the value it had) writes none.
- A retryable write (``lsid`` and ``txnNumber``) records each of its statements that wrote
  something (an insert's documents, an update's or a delete's specs, a ``findAndModify``), and
  answers a statement its session executed already from that record, without running it again.
- Unique indexes hold under concurrent inserts: of two inserts of one key, the second is
  ``DuplicateKey`` (11000).
- Reads at ``readConcern`` ``majority`` answer from the majority snapshot: the data as the
  commit point left it, without the writes the secondaries have not acknowledged yet. Other
  reads, and every write, see the newest data.
- ``find`` and ``aggregate`` answer in batches (:attr:`ReplicaSet.batch_size`, 101 as a server's
  first batch); the rest waits in a cursor for ``getMore``. A cursor lives on the member that
  opened it, through a step-down (a server keeps its cursors open since 4.2); a cursor that is
  gone (killed, its member restarted, or asked of another member) is ``CursorNotFound`` (43).
"""

from __future__ import annotations

import copy
import itertools
import time
from dataclasses import dataclass
from typing import Any

import mongomock
from collation import caseless
from pymongo import ReturnDocument

CURSOR_NOT_FOUND = 43


@dataclass
class Cursor:
    member: int
    ns: str
    documents: list[dict[str, Any]]


class Commands:
    """The data commands of the set. ``rs`` is the :class:`primary.ReplicaSet`: its lock guards
    the data, its events list takes the change events."""

    def __init__(self, rs: Any) -> None:
        self.rs = rs
        self.cursors: dict[int, Cursor] = {}
        # Each index's collation, which mongomock does not keep: (database, collection, name).
        self.collations: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._cursor_ids = itertools.count(10_000)

    def collection(self, doc: dict[str, Any], name: str) -> Any:
        return self.rs.data[doc["$db"]][doc[name]]

    # -- cursors

    def batch(self, member: int, ns: str, documents: list[dict[str, Any]], size: int | None,
              single: bool = False) -> dict[str, Any]:
        """The first batch of ``documents``, the rest kept for ``getMore``."""
        size = min(size or self.rs.batch_size, self.rs.batch_size)
        first, rest = documents[:size], documents[size:]
        cursor_id = 0
        if rest and not single:
            cursor_id = next(self._cursor_ids)
            self.cursors[cursor_id] = Cursor(member, ns, rest)
        return {"ok": 1, "cursor": {"id": cursor_id, "ns": ns, "firstBatch": first}}

    def get_more(self, member: int, doc: dict[str, Any]) -> dict[str, Any]:
        cursor = self.cursors.get(doc["getMore"])
        if cursor is None or cursor.member != member:
            return {"ok": 0, "code": CURSOR_NOT_FOUND, "codeName": "CursorNotFound",
                    "errmsg": f"cursor id {doc['getMore']} not found"}
        size = min(doc.get("batchSize") or self.rs.batch_size, self.rs.batch_size)
        batch, cursor.documents = cursor.documents[:size], cursor.documents[size:]
        cursor_id = doc["getMore"]
        if not cursor.documents:
            del self.cursors[cursor_id]
            cursor_id = 0
        return {"ok": 1, "cursor": {"id": cursor_id, "ns": cursor.ns, "nextBatch": batch}}

    def kill(self, cursor_ids: list[int]) -> None:
        for cursor_id in cursor_ids:
            self.cursors.pop(cursor_id, None)

    def kill_member(self, member: int) -> None:
        for cursor_id in [key for key, cursor in self.cursors.items() if cursor.member == member]:
            del self.cursors[cursor_id]

    # -- reads

    def source(self, doc: dict[str, Any], name: str) -> Any:
        """The collection a read reads: the majority snapshot at ``readConcern`` ``majority``,
        else the newest data."""
        level = (doc.get("readConcern") or {}).get("level", "local")
        database = self.rs.snapshot(doc["$db"]) if level in ("majority", "snapshot") else self.rs.data[doc["$db"]]
        return database[doc[name]]

    def find(self, member: int, doc: dict[str, Any]) -> dict[str, Any]:
        with self.rs.lock:
            cursor = self.source(doc, "find").find(caseless(doc.get("filter", {}), doc.get("collation")),
                                                   doc.get("projection"))
            if doc.get("sort"):
                cursor = cursor.sort(list(doc["sort"].items()))
            if doc.get("skip"):
                cursor = cursor.skip(doc["skip"])
            if doc.get("limit"):
                cursor = cursor.limit(abs(doc["limit"]))
            documents = list(cursor)
            single = doc.get("singleBatch") or (doc.get("limit") or 0) < 0
            return self.batch(member, f"{doc['$db']}.{doc['find']}", documents, doc.get("batchSize"), single)

    def aggregate(self, member: int, doc: dict[str, Any]) -> dict[str, Any]:
        with self.rs.lock:
            documents = list(self.source(doc, "aggregate").aggregate(doc.get("pipeline", [])))
            return self.batch(member, f"{doc['$db']}.{doc['aggregate']}", documents,
                              doc.get("cursor", {}).get("batchSize"))

    def count(self, doc: dict[str, Any]) -> dict[str, Any]:
        with self.rs.lock:
            return {"ok": 1, "n": self.source(doc, "count").count_documents(doc.get("query", {}))}

    # -- writes

    def _applied(self, op: Any, doc: dict[str, Any], name: str, _id: Any, before: dict[str, Any] | None,
                 update: Any) -> bool:
        """Whether the write changed the document ``_id`` (``before`` as it was, None: it made
        it); if so, its oplog entry (under the set's lock, by the write)."""
        after = self.collection(doc, name).find_one({"_id": _id})
        if after == before:
            return False
        self.rs.applied(op, doc["$db"], doc[name], _id, before, copy.deepcopy(after), update)
        return True

    @staticmethod
    def _executed(op: Any, statement: int) -> dict[str, Any] | None:
        """What a statement of this retryable write did when its session executed it already."""
        if op.executed is None or statement not in op.executed:
            return None
        return dict(op.executed[statement][1])

    @staticmethod
    def _record(op: Any, statement: int, result: dict[str, Any]) -> None:
        """A statement of a retryable write wrote something: what it did, at its optime."""
        if op.executed is not None:
            op.executed[statement] = (op.optime, result)

    def insert(self, op: Any, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self.collection(doc, "insert")
        n, errors = 0, []
        for index, document in enumerate(doc.get("documents", [])):
            with self.rs.lock:
                if self._executed(op, index) is not None:
                    n += 1
                    continue
                try:
                    collection.insert_one(document)
                except mongomock.DuplicateKeyError as exc:
                    errors.append({"index": index, "code": 11000, "errmsg": str(exc)})
                    if doc.get("ordered", True):
                        break
                    continue
                self._applied(op, doc, "insert", document["_id"], None, None)
                self._record(op, index, {"n": 1})
                n += 1
        return {"ok": 1, "n": n, **({"writeErrors": errors} if errors else {})}

    def update(self, op: Any, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self.collection(doc, "update")
        matched = modified = 0
        upserted, errors = [], []
        for index, spec in enumerate(doc.get("updates", [])):
            query, change = spec.get("q", {}), spec["u"]
            if spec.get("multi"):  # never retryable: the driver sends no txnNumber with it
                found, changed = self._update_each(op, doc, collection, query, change)
                matched, modified = matched + found, modified + changed
                continue
            with self.rs.lock:
                done = self._executed(op, index)
                if done is not None:  # a retry: what the server recorded of it, not run again
                    matched, modified = matched + done["n"], modified + done["nModified"]
                    if "upserted" in done:
                        upserted.append({"index": index, "_id": done["upserted"]})
                    continue
                before = copy.deepcopy(collection.find_one(query))
                try:
                    if isinstance(change, dict) and not any(key.startswith("$") for key in change):
                        result = collection.replace_one(query, change, upsert=spec.get("upsert", False))
                    else:
                        result = collection.update_one(query, change, upsert=spec.get("upsert", False))
                except mongomock.DuplicateKeyError as exc:
                    errors.append({"index": index, "code": 11000, "errmsg": str(exc)})
                    break
                if result.upserted_id is not None:
                    self._applied(op, doc, "update", result.upserted_id, None, change)
                    self._record(op, index, {"n": 1, "nModified": 0, "upserted": result.upserted_id})
                elif before is not None and self._applied(op, doc, "update", before["_id"], before, change):
                    self._record(op, index, {"n": 1, "nModified": 1})
            matched += result.matched_count
            modified += result.modified_count
            if result.upserted_id is not None:
                upserted.append({"index": index, "_id": result.upserted_id})
        reply: dict[str, Any] = {"ok": 1, "n": matched + len(upserted), "nModified": modified}
        if upserted:
            reply["upserted"] = upserted
        if errors:
            reply["writeErrors"] = errors
        return reply

    def _update_each(self, op: Any, doc: dict[str, Any], collection: Any, query: dict[str, Any],
                     change: dict[str, Any]) -> tuple[int, int]:
        """A multi-document update, one document at a time, as a server yields between them."""
        with self.rs.lock:
            ids = [found["_id"] for found in collection.find(query, {"_id": 1})]
        matched = modified = 0
        for _id in ids:
            with self.rs.lock:  # still matching? (another command may have changed it meanwhile)
                before = copy.deepcopy(collection.find_one({"$and": [{"_id": _id}, query]}))
                if before is not None:
                    result = collection.update_one({"_id": _id}, change)
                    matched, modified = matched + 1, modified + result.modified_count
                    self._applied(op, doc, "update", _id, before, change)
            time.sleep(0)  # the yield: other commands run between two documents
        return matched, modified

    def delete(self, op: Any, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self.collection(doc, "delete")
        n = 0
        for index, spec in enumerate(doc.get("deletes", [])):
            query = spec.get("q", {})
            if spec.get("limit") == 1:
                with self.rs.lock:
                    done = self._executed(op, index)
                    if done is not None:
                        n += done["n"]
                        continue
                    found = copy.deepcopy(collection.find_one(query))
                    if found is not None:
                        collection.delete_one({"_id": found["_id"]})
                        self._applied(op, doc, "delete", found["_id"], found, None)
                        self._record(op, index, {"n": 1})
                        n += 1
                continue
            with self.rs.lock:
                ids = [found["_id"] for found in collection.find(query, {"_id": 1})]
            for _id in ids:
                with self.rs.lock:
                    found = copy.deepcopy(collection.find_one({"$and": [{"_id": _id}, query]}))
                    if found is not None:
                        collection.delete_one({"_id": _id})
                        self._applied(op, doc, "delete", _id, found, None)
                        n += 1
                time.sleep(0)
        return {"ok": 1, "n": n}

    def find_and_modify(self, op: Any, doc: dict[str, Any]) -> dict[str, Any]:
        collection = self.collection(doc, "findAndModify")
        query, sort = doc.get("query", {}), list((doc.get("sort") or {}).items()) or None
        with self.rs.lock:
            done = self._executed(op, 0)
            if done is not None:  # a retry: the answer recorded with the write (its pre- or post-image)
                return {"ok": 1, **done}
            before = copy.deepcopy(collection.find_one(query, sort=sort))
            if doc.get("remove"):
                value = collection.find_one_and_delete(query, projection=doc.get("fields"), sort=sort)
                result = {"lastErrorObject": {"n": int(value is not None)}, "value": value}
                if before is not None:
                    self._applied(op, doc, "findAndModify", before["_id"], before, None)
                    self._record(op, 0, result)
                return {"ok": 1, **result}
            change = doc["update"]
            replacement = isinstance(change, dict) and not any(key.startswith("$") for key in change)
            outcome: dict[str, Any] = {"n": int(before is not None or doc.get("upsert", False)),
                                       "updatedExisting": before is not None}
            try:
                if before is not None:
                    after = ReturnDocument.AFTER if doc.get("new") else ReturnDocument.BEFORE
                    if replacement:
                        value = collection.find_one_and_replace({"_id": before["_id"]}, change,
                                                                projection=doc.get("fields"), return_document=after)
                    else:
                        value = collection.find_one_and_update({"_id": before["_id"]}, change,
                                                               projection=doc.get("fields"), return_document=after)
                    changed = self._applied(op, doc, "findAndModify", before["_id"], before, change)
                elif doc.get("upsert"):  # no match: the upsert makes the document
                    write = collection.replace_one if replacement else collection.update_one
                    made = write(query, change, upsert=True).upserted_id
                    value = collection.find_one({"_id": made}, doc.get("fields")) if doc.get("new") else None
                    changed = self._applied(op, doc, "findAndModify", made, None, change)
                    outcome["upserted"] = made
                else:
                    value, changed = None, False
            except mongomock.DuplicateKeyError as exc:
                return {"ok": 0, "code": 11000, "codeName": "DuplicateKey", "errmsg": str(exc)}
            result = {"lastErrorObject": outcome, "value": value}
            if changed:
                self._record(op, 0, result)
        return {"ok": 1, **result}

    def matched(self, name: str, doc: dict[str, Any]) -> dict[Any, dict[str, Any]]:
        """The documents a write would change now, as they are (for a race: whether another
        write changed them between this one's read and its commit)."""
        with self.rs.lock:
            if name == "findAndModify":
                queries = [doc.get("query", {})]
            elif name == "update":
                queries = [spec.get("q", {}) for spec in doc.get("updates", [])]
            elif name == "delete":
                queries = [spec.get("q", {}) for spec in doc.get("deletes", [])]
            else:
                return {}
            collection = self.collection(doc, name)
            return {found["_id"]: copy.deepcopy(found) for query in queries for found in collection.find(query)}

    # -- indexes

    def create_indexes(self, doc: dict[str, Any]) -> dict[str, Any]:
        with self.rs.lock:
            collection = self.collection(doc, "createIndexes")
            existing = self._indexes(doc, "createIndexes")
            for index in doc.get("indexes", []):
                options = {key: value for key, value in index.items() if key not in ("key", "name")}
                # Indexes of the same keys under other collations are others (the server's rule).
                same_keys = [name for name, info in existing.items()
                             if list(info["key"]) == list(index["key"].items()) and name != index["name"]
                             and info.get("collation") == index.get("collation")]
                if same_keys:
                    return {"ok": 0, "code": 85,
                            "errmsg": f"Index already exists with a different name: {same_keys[0]}"}
                have = existing.get(index["name"])
                if have is not None:
                    have_options = {key: value for key, value in have.items() if key not in ("key", "v", "ns")}
                    if list(have["key"]) != list(index["key"].items()) or have_options != options:
                        return {"ok": 0, "code": 85, "errmsg": f"Index already exists with different options: "
                                                              f"{index['name']}"}
                    continue
                collection.create_index(list(index["key"].items()), name=index["name"], **options)
                # mongomock deletes what a TTL index says has expired at every access to the
                # collection, silently; a server's TTL monitor deletes it in a pass of its own
                # (ReplicaSet.expire), seconds or minutes later, as writes.
                collection._store._ttl_indexes.pop(index["name"], None)
                if "collation" in index:
                    self.collations[(doc["$db"], doc["createIndexes"], index["name"])] = index["collation"]
            return {"ok": 1, "createdCollectionAutomatically": False, "numIndexesBefore": len(existing),
                    "numIndexesAfter": len(collection.index_information())}

    def coll_mod(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``collMod`` of an index's ``expireAfterSeconds`` (what the store changes with it)."""
        change = doc.get("index")
        if change is None:
            return {"ok": 1}
        with self.rs.lock:
            collection = self.collection(doc, "collMod")
            index = collection._store.indexes.get(change.get("name"))
            if index is None:
                return {"ok": 0, "code": 27, "codeName": "IndexNotFound",
                        "errmsg": f"cannot find index {change.get('name')} for ns {doc['$db']}.{doc['collMod']}"}
            reply: dict[str, Any] = {"ok": 1}
            if "expireAfterSeconds" in change:
                reply.update(expireAfterSeconds_old=index.get("expireAfterSeconds"),
                             expireAfterSeconds_new=change["expireAfterSeconds"])
                index["expireAfterSeconds"] = change["expireAfterSeconds"]
            return reply

    def list_indexes(self, doc: dict[str, Any]) -> dict[str, Any]:
        with self.rs.lock:
            indexes = [{"v": 2, "key": dict(info["key"]), "name": name,
                        **{key: value for key, value in info.items() if key not in ("key", "v", "ns")}}
                       for name, info in self._indexes(doc, "listIndexes").items()]
        return {"ok": 1, "cursor": {"id": 0, "ns": f"{doc['$db']}.{doc['listIndexes']}", "firstBatch": indexes}}

    def drop_indexes(self, doc: dict[str, Any]) -> dict[str, Any]:
        with self.rs.lock:
            collection = self.collection(doc, "dropIndexes")
            if doc["index"] not in collection.index_information():
                return {"ok": 0, "code": 27, "codeName": "IndexNotFound", "errmsg": f"index not found: {doc['index']}"}
            collection.drop_index(doc["index"])
            self.collations.pop((doc["$db"], doc["dropIndexes"], doc["index"]), None)
        return {"ok": 1}

    def _indexes(self, doc: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
        """The collection's indexes as the server lists them: with their collations."""
        indexes = self.collection(doc, name).index_information()
        for index, info in indexes.items():
            collation = self.collations.get((doc["$db"], doc[name], index))
            if collation is not None:
                info["collation"] = collation
        return indexes
