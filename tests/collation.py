"""What the MongoDB stand-ins (mongomock, which ignores a query's collation, and the wire tier's
replica set over it) need to answer a read under a caseless collation as a server does.

A server compares strings under a collation of ``strength`` 1 or 2 with ICU, ignoring case. The
stand-ins compare the strings an equality names case-insensitively instead, which is the same
comparison for the ASCII usernames the store holds (``identifiers.USERNAME``): letters, digits
and ``._@-``, each of its own weight at strength 2 but for the case of a letter.
"""

from __future__ import annotations

import re
from typing import Any


def caseless(query: dict[str, Any], collation: dict[str, Any] | None) -> dict[str, Any]:
    """``query`` as a stand-in runs it under ``collation``: each string an equality (a value, its
    ``$eq`` or ``$in``) names compared whatever its case when the strength ignores case."""
    if not collation or collation.get("strength", 3) > 2:
        return query
    return {field: [caseless(part, collation) for part in value] if field in ("$and", "$or", "$nor")
            else value if field.startswith("$") else _condition(value) for field, value in query.items()}


def _condition(value: Any) -> Any:
    if isinstance(value, str):
        return re.compile(rf"\A{re.escape(value)}\Z", re.IGNORECASE)
    if isinstance(value, dict):
        return {operator: [_condition(item) for item in operand] if operator in ("$in", "$nin")
                else _condition(operand) if operator in ("$eq", "$ne") else operand
                for operator, operand in value.items()}
    return value
