"""JSON text read within a nesting depth: every JSON body the service takes, and every JSON
answer the resource library reads.

Python's ``json`` parses nested arrays and objects by recursion. A body of 64 KiB of ``[`` is
65,536 levels, past the interpreter's recursion limit: ``RecursionError``, which is no
``ValueError``, and so was a 500. Far below that limit a deep document still costs every later
walk over it (a schema, an answer naming the input) a recursion of its own. So the depth is
counted first, in a loop, and a text nested deeper than :data:`MAX_DEPTH` is refused before it
is parsed. No body the service documents is nested more than a few levels.

A string holding a lone surrogate (``"\\ud800"``, or its bytes in a body decoded with
``surrogatepass``) is refused too, key or value, at any depth: it is no text, and neither UTF-8
nor BSON encodes it. Taken, it was stored on the memory backend and then broke every answer
naming it; on MongoDB the write failed with a 500.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32  # arrays and objects within one another; the admin API's deepest body (a plan) has 4

# A string of JSON text, with its escapes: brackets inside one do not nest anything.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


# Where a parsed string may hold a surrogate: one in the text, or an escape of one (a pair's
# halves are joined by the parse; what is left after it is alone).
_MAY_HOLD_SURROGATE = re.compile("[\ud800-\udfff]|\\\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class LoneSurrogate(ValueError):
    """JSON text with a string (key or value) that holds a lone surrogate."""

    def __init__(self) -> None:
        super().__init__("a string holds a lone surrogate")


class TooDeep(ValueError):
    """JSON text nested deeper than its reader takes."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(f"nested deeper than {max_depth} levels")
        self.max_depth = max_depth


def loads(data: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """``data`` parsed as ``json.loads`` parses it (bytes in UTF-8, -16 or -32); :class:`TooDeep`
    when its arrays and objects are nested deeper than ``max_depth``, :class:`LoneSurrogate` when
    a string in it holds a lone surrogate, ``ValueError`` when it is not JSON. Never
    ``RecursionError``."""
    text = data.decode(json.detect_encoding(data), "surrogatepass") if isinstance(data, (bytes, bytearray)) else data
    if deeper_than(text, max_depth):
        raise TooDeep(max_depth)
    value = json.loads(text)
    if _MAY_HOLD_SURROGATE.search(text) and holds_surrogate(value):
        raise LoneSurrogate()
    return value


def holds_surrogate(value: Any) -> bool:
    """Whether a string in ``value`` (parsed JSON: a key or a value, at any depth) holds a
    surrogate code point. Walked in a loop, not by recursion."""
    waiting = [value]
    while waiting:
        item = waiting.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            waiting.extend(item.keys())
            waiting.extend(item.values())
        elif isinstance(item, list):
            waiting.extend(item)
    return False


def deeper_than(text: str, max_depth: int) -> bool:
    """Whether ``text``'s arrays and objects are nested deeper than ``max_depth``, strings set
    aside. Text that is not JSON is counted all the same (an unclosed string's brackets count):
    whatever it says, it is refused either way."""
    depth = 0
    for bracket in _BRACKET.finditer(_STRING.sub("", text)):
        if bracket.group() in "[{":
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth -= 1
    return False
