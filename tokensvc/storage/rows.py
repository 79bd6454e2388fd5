"""Records as rows (:class:`Rows`): a record held as a tuple of its field values, list fields
as tuples, so that nothing in the row is a container CPython's garbage collector tracks. The
collector stops tracking such a tuple after a collection or two, and a full collection then
does not walk every row (docs/performance.md has the figure). The memory store holds the
records that grow with traffic so."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Generic, TypeVar

R = TypeVar("R")
Row = tuple[Any, ...]


class Rows(Generic[R]):
    """How the store holds one record type: a tuple of its field values in field order,
    list fields as tuples (so that nothing in the row is a container the collector tracks)."""

    def __init__(self, cls: type[R], lists: tuple[str, ...] = ()) -> None:
        names = [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]
        self.cls = cls
        self.index = {name: position for position, name in enumerate(names)}
        self._lists = tuple(self.index[name] for name in lists)
        self._values = operator.attrgetter(*names)

    def pack(self, record: R) -> Row:
        values = self._values(record)
        if not self._lists:
            return values
        items = list(values)
        for position in self._lists:
            if items[position] is not None:
                items[position] = tuple(items[position])
        return tuple(items)

    def unpack(self, row: Row | None) -> R | None:
        """A new record from ``row`` (callers get their own copy, never the stored one)."""
        return None if row is None else self.unpack_row(row)

    def unpack_row(self, row: Row) -> R:
        if not self._lists:
            return self.cls(*row)
        items = list(row)
        for position in self._lists:
            if items[position] is not None:
                items[position] = list(items[position])
        return self.cls(*items)

    def get(self, row: Row, name: str) -> Any:
        return row[self.index[name]]

    def updated(self, row: Row, **changes: Any) -> Row:
        items = list(row)
        for name, value in changes.items():
            items[self.index[name]] = value
        return tuple(items)
