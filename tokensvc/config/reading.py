"""Stages 1 and 2 of the settings: **raw** (the TOML file and the ``TOKENSVC_*`` environment
folded into one dict) and **typed** (every key checked against its section's dataclass: an
unknown key, a wrong type, a missing required value)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tokensvc import tomlfile
from tokensvc.config.settings import (
    COMMAND_LINE_VARIABLES,
    COOKIE_SECRET,
    ENV_PREFIX,
    SECRET_KEYS,
    SECRET_VARIABLES,
    SECTIONS,
    STRINGS,
    TABLES,
    ConfigError,
    Settings,
)
from tokensvc.identifiers import scope_problem


def read_file(path: str | os.PathLike[str], *, what: str = "config file", option: str = "--config") -> dict[str, Any]:
    """The TOML document at ``path``; what keeps it from being read, in one line (``what`` the
    file is, given with ``option``): :func:`tokensvc.tomlfile.read`, refusing with ConfigError."""
    try:
        return tomlfile.read(path, what=what, option=option)
    except tomlfile.FileRefused as exc:
        raise ConfigError(str(exc)) from None


class Problems:
    """What a reading of the settings finds wrong, one line each naming its key, in the order
    found. A value refused for its type (or its variable) is left out, its default taken, so
    that the later stages go on and find every other problem; what a later stage says of a
    key refused before, or of the entry that holds it, follows from that refusal and is left
    out (``clients[0].redirect_uris: at least one ...`` after ``redirect_uris`` was refused)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.refused: list[str] = []

    def __call__(self, line: str) -> None:
        key = line.split(": ", 1)[0]
        # Once each: the driver names an option given three times twice, say.
        if line not in self.lines and not any(_related(key, refused) for refused in self.refused):
            self.lines.append(line)

    def refuse(self, key: str, line: str) -> None:
        """``line`` said of ``key``, whose value is left out."""
        self(line)
        self.refused.append(key)

    def check(self) -> None:
        if self.lines:
            raise ConfigError(*self.lines)


def _related(key: str, other: str) -> bool:
    """Whether one of two keys is the other or holds it (``clients[0]``, ``clients[0].name``)."""
    if len(key) > len(other):
        key, other = other, key
    return other == key or other.startswith((key + ".", key + "["))


def apply_env(raw: dict[str, Any], environ: Mapping[str, str], found: Problems) -> None:
    """Fold ``TOKENSVC_<SECTION>_<KEY>`` (or ``TOKENSVC_<KEY>``) variables into ``raw``.

    Variables of another prefix (``TOKENSVC_TEST_...``) are not settings and are left alone;
    a variable naming a known section but an unknown key is an error.
    """
    top = {name: annotation for name, annotation in _inputs(Settings).items()
           if name not in SECTIONS and name not in TABLES and name != "scopes"}
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX) or name in COMMAND_LINE_VARIABLES:
            continue
        rest = name[len(ENV_PREFIX):].lower()
        if rest in top:
            try:
                raw[rest] = _parse_env(name, text, top[rest])
            except ConfigError as exc:
                found.refuse(rest, str(exc))
            continue
        section, _, key = rest.partition("_")
        if section not in SECTIONS:
            continue
        fields = _inputs(SECTIONS[section])
        if key not in fields:
            found.refuse(f"{section}.{key}", f"{name}: unknown key {section}.{key}")
            continue
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            continue  # the file's [section] is no table, which the next stage says
        try:
            table[key] = _parse_env(name, text, fields[key])
        except ConfigError as exc:
            found.refuse(f"{section}.{key}", str(exc))


def _parse_env(name: str, text: str, annotation: str) -> Any:
    if annotation in (COOKIE_SECRET, STRINGS) and text.lstrip().startswith("["):
        # A list as a JSON array (several keys: TOKENSVC_COOKIE_SECRET='["new...", "old..."]'),
        # which takes a comma in an entry too. An IPv6 address in brackets ("[::1],tokensvc")
        # is no JSON: read as the comma-separated form.
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return value
        if value is not None or text.lstrip().startswith(('["', "['")) or name in SECRET_VARIABLES \
                or annotation == COOKIE_SECRET:
            raise ConfigError(f"{name}: a list of keys is a JSON array of strings" if annotation == COOKIE_SECRET
                              else f"{name}: a list is a JSON array of strings, or comma-separated, got "
                                   f"{_quoted(name, text)}")
    base = annotation.removesuffix(" | None")
    if base == "int":
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{name}: expected an integer, got {text!r}") from None
    if base == "bool":
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}: expected a boolean (true/false), got {text!r}")
    if base == STRINGS:
        return [item.strip() for item in text.split(",") if item.strip()]
    return text


def _quoted(name: str, text: str) -> str:
    """``text`` as a message may show it: a variable of keys is never shown."""
    return "a value not shown (it holds keys)" if name in SECRET_VARIABLES else repr(text)


# -- stage 2: typed ----------------------------------------------------------------------------


def _inputs(cls: type) -> dict[str, str]:
    """The keys a section takes, with their annotations (``from __future__``: strings). A
    derived setting may be given; one made from others (``MADE``) may not. ``cookie_secret``
    takes one key or a list."""
    return {f.name: (COOKIE_SECRET if f.name == "cookie_secret" and cls is Settings else str(f.type))
            for f in dataclasses.fields(cls) if not f.metadata.get("made")}


def _required(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def _type_name(tp: Any) -> str:
    return {str: "a string", int: "an integer", bool: "a boolean"}.get(tp, str(tp))


def _type_problem(value: Any, annotation: str, *, secret: bool = False) -> str | None:
    """Why ``value`` does not have the type ``annotation`` names, or None when it does. The
    value of a ``secret`` key is not shown, its type alone."""
    if secret:
        problem = _type_problem(value, annotation)
        return None if problem is None else f"{problem.partition(', got ')[0]}, got {_kind(value)} (not shown)"
    if annotation == COOKIE_SECRET:
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(key, str) for key in value)):
            return None
        return f"expected a string or a list of strings, got {value!r}"
    optional = annotation.endswith("| None")
    base = annotation.removesuffix(" | None")
    if value is None:
        return None if optional else "a value is required"
    if base == STRINGS:
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            return f"expected a list of strings, got {value!r}"
        return None
    expected = {"str": str, "int": int, "bool": bool}[base]
    # bool is an int subclass: reject true/false where a number is expected.
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        return f"expected {_type_name(expected)}, got {value!r}"
    return None


def _kind(value: Any) -> str:
    """What a value is, as a message may say it without showing it."""
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


def _coerce(key: str, value: Any, annotation: str) -> Any:
    """``value`` if it has the type ``annotation`` names; else ConfigError."""
    problem = _type_problem(value, annotation, secret=key.rpartition(".")[2] in SECRET_KEYS)
    if problem is not None:
        raise ConfigError(f"{key}: {problem}")
    return tuple(value) if value is not None and annotation.removesuffix(" | None") == STRINGS else value


def _table(cls: type, key: str, table: Any, found: Problems) -> dict[str, Any]:
    """The keys of one table, each of the type its section declares; a key refused is left
    out, and a required one left out or refused is "" (found says why), so that the entry is
    still made and its other keys checked."""
    if not isinstance(table, Mapping):
        found.refuse(key, f"{key}: expected a table, got {table!r}")
        table = {}
    inputs = _inputs(cls)
    values: dict[str, Any] = {}
    for name, value in table.items():
        if name not in inputs:
            found.refuse(f"{key}.{name}", f"{key}.{name}: unknown key")
            continue
        try:
            values[name] = _coerce(f"{key}.{name}", value, inputs[name])
        except ConfigError as exc:
            found.refuse(f"{key}.{name}", str(exc))
    for name in _required(cls):  # every required key is a string
        if name not in values:
            if name not in table:
                found.refuse(f"{key}.{name}", f"{key}.{name}: a value is required")
            values[name] = ""
    return values


def entry_problems(table: str, entry: Any) -> list[tuple[str | None, str]]:
    """What is wrong with one ``[[table]]`` entry taken alone, as (key, problem) pairs: a key
    the table does not have, a value of the wrong type. ``tokensvc apply`` checks a file with
    it (where a key may be left out: the service keeps the value it holds)."""
    if not isinstance(entry, Mapping):
        return [(None, f"expected a table, got {entry!r}")]
    inputs = _inputs(TABLES[table])
    problems: list[tuple[str | None, str]] = []
    for name, value in entry.items():
        if name not in inputs:
            problems.append((name, f"unknown key (the keys of [[{table}]]: {', '.join(inputs)})"))
            continue
        problem = _type_problem(value, inputs[name], secret=name in SECRET_KEYS)
        if problem is not None:
            problems.append((name, problem))
    return problems


def typed(raw: Mapping[str, Any], found: Problems) -> dict[str, Any]:
    """Every key of ``raw`` checked against the settings' declared types, as plain values; a
    key refused is left out."""
    inputs = _inputs(Settings)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in inputs:
            found.refuse(key, f"{key}: unknown key")
        elif key == "scopes":
            values[key] = _scope_descriptions(value, found)
        elif key in SECTIONS:
            values[key] = _table(SECTIONS[key], key, value, found)
        elif key in TABLES:
            if not isinstance(value, list):
                found.refuse(key, f"{key}: expected an array of tables ([[{key}]])")
                continue
            values[key] = [_table(TABLES[key], f"{key}[{i}]", item, found) for i, item in enumerate(value)]
        else:
            try:
                values[key] = _coerce(key, value, inputs[key])
            except ConfigError as exc:
                found.refuse(key, str(exc))
    return values


def _scope_descriptions(table: Any, found: Problems) -> Mapping[str, str]:
    if not isinstance(table, Mapping):
        found.refuse("scopes", "scopes: expected a table of scope = \"description\"")
        return MappingProxyType({})
    described = {}
    for scope, words in table.items():
        if not isinstance(words, str) or not words.strip():
            found.refuse(f"scopes.{scope}",
                         f"scopes.{scope}: expected a description (a non-empty string), got {words!r}")
            continue
        problem = scope_problem(scope)
        if problem is not None:
            found(f"scopes: not a scope ({problem}): {scope!r}")
            continue
        described[scope] = words
    return MappingProxyType(described)
