"""What the MongoDB stand-ins (mongomock, and the wire tier's replica set over it) need to keep a
unique index on an array field as a server does.

A server indexes each element of an array (a multikey index): a unique one refuses a document
one of whose elements another document holds, and never compares a document with itself.
mongomock compares the whole array instead, so two clients declaring one resource among others
would both be taken. :func:`install` makes its check compare element by element, under the
index's partial filter, and say which index and key refused, as a server's error does.
"""

from __future__ import annotations

from typing import Any

import mongomock
from mongomock import helpers
from mongomock.collection import Collection


def _ensure_uniques(self: Any, new_data: dict[str, Any]) -> None:
    """mongomock's check (``new_data`` is in the collection already), an array of a
    single-field index compared element by element."""
    for name, index in self._store.indexes.items():
        if not index.get("unique"):
            continue
        keys = [key for key, _ in index.get("key") or []]
        values = {key: _value(new_data, key) for key in keys}
        partial = index.get("partialFilterExpression")
        if len(keys) == 1 and isinstance(values[keys[0]], list):
            key, elements = keys[0], values[keys[0]]
            if partial is not None and not list(self._iter_documents({"$and": [partial, {"_id": new_data["_id"]}]})):
                continue
            query: dict[str, Any] = {"_id": {"$ne": new_data["_id"]}, key: {"$in": elements}}
            for other in self._iter_documents(query if partial is None else {"$and": [partial, query]}):
                taken = next(element for element in elements if element in (_value(other, key) or []))
                raise mongomock.DuplicateKeyError(
                    f"E11000 duplicate key error collection: {self.full_name} index: {name} dup key: "
                    f"{{ {key}: {taken!r} }}", 11000, {"keyPattern": {key: 1}, "keyValue": {key: taken}})
            continue
        if index.get("sparse") and set(values.values()) == {None}:
            continue
        find: dict[str, Any] = values if partial is None else {"$and": [partial, values]}
        if len(list(self._iter_documents(find))) > 1:
            raise mongomock.DuplicateKeyError(
                f"E11000 duplicate key error collection: {self.full_name} index: {name}", 11000,
                {"keyPattern": dict.fromkeys(keys, 1), "keyValue": values})


def _value(document: dict[str, Any], key: str) -> Any:
    try:
        return helpers.get_value_by_dot(document, key)
    except KeyError:
        return None


_create_index_of = Collection.create_index


def _create_index(self: Any, key_or_list: Any, *args: Any, **kwargs: Any) -> str:
    """mongomock's, the documents then checked as a server builds a unique index: element by
    element, under its partial filter (mongomock compares whole arrays, and ignores the
    filter). A duplicate refuses the index (11000), which is not made."""
    if not kwargs.get("unique"):
        return _create_index_of(self, key_or_list, *args, **kwargs)
    have = self._store.indexes.get(kwargs.get("name"))
    if have is not None:  # made already: the same (nothing to do), or mongomock's refusal
        if have.get("unique") and have.get("partialFilterExpression") == kwargs.get("partialFilterExpression"):
            return str(kwargs["name"])
        return _create_index_of(self, key_or_list, *args, **kwargs)
    name = _create_index_of(self, key_or_list, *args, **{**kwargs, "unique": False})
    self._store.indexes[name]["unique"] = True
    try:
        for document in list(self._store.documents):
            _ensure_uniques(self, document)
    except mongomock.DuplicateKeyError:
        self._store.drop_index(name)
        raise
    return name


def _create_indexes(self: Any, indexes: Any, session: Any = None) -> list[str]:
    """Each model as ``create_index`` takes it, its partial filter kept (mongomock drops it)."""
    return [_create_index(self, list(index.document["key"].items()),
                          **{key: value for key, value in index.document.items() if key != "key"})
            for index in indexes]


def _details_of(original: Any) -> Any:
    """mongomock-motor's guess at which index a duplicate broke (it names the first unique index
    a document with the same value is found in), kept from overriding what the check above
    said, and naming the id's index for a taken id, as a server does."""

    def details(collection: Any, data: Any, exception: Exception) -> Exception:
        if not isinstance(exception, mongomock.DuplicateKeyError) or (exception.details or {}).get("keyValue"):
            return exception
        if isinstance(data, dict) and "_id" in data and list(collection._iter_documents({"_id": data["_id"]})):
            return mongomock.DuplicateKeyError(
                f"E11000 duplicate key error collection: {collection.full_name} index: _id_ dup key: "
                f"{{ _id: {data['_id']!r} }}", 11000, {"keyPattern": {"_id": 1}, "keyValue": {"_id": data["_id"]}})
        return original(collection, data, exception)

    return details


def install() -> None:
    from mongomock_motor import patches

    patches._provide_error_details = _details_of(patches._provide_error_details)
    Collection._ensure_uniques = _ensure_uniques
    Collection.create_index = _create_index
    Collection.create_indexes = _create_indexes
