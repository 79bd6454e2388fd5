"""The settings made, every stage in turn (:mod:`.reading`, :mod:`.resolving`, :mod:`.checks`),
whatever the ones before found, then :class:`~.settings.ConfigError` with every problem."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from tokensvc.config.checks import check
from tokensvc.config.reading import Problems, apply_env, read_file, typed
from tokensvc.config.resolving import resolve
from tokensvc.config.settings import SECTIONS, TABLES, Settings


def load(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Settings:
    """Read the TOML file at ``path`` (none: defaults only), apply the environment, then
    ``overrides`` (command-line flags, top-level keys), and make the settings. A file that
    cannot be read stops here; every other problem of the file and the environment is found
    before :class:`ConfigError` lists them all."""
    raw: dict[str, Any] = {} if path is None else read_file(path)
    found = Problems()
    apply_env(raw, os.environ if environ is None else environ, found)
    raw.update({key: value for key, value in (overrides or {}).items() if value is not None})
    settings = settings_of(raw, found)
    return settings if path is None else dataclasses.replace(settings, config_file=os.path.abspath(path))


def from_dict(raw: Mapping[str, Any]) -> Settings:
    """The settings ``raw`` (a parsed TOML document) describes."""
    return settings_of(raw, Problems())


def settings_of(raw: Mapping[str, Any], found: Problems) -> Settings:
    """The settings ``raw`` describes, every stage run whatever the ones before found (what
    they refused is left out), then :class:`ConfigError` with every problem found, if any."""
    values = typed(raw, found)
    resolve(values, found)
    for key, cls in SECTIONS.items():
        values[key] = cls(**values.get(key, {}))
    for key, cls in TABLES.items():
        values[key] = tuple(cls(**item) for item in values.get(key, []))
    settings = Settings(**values)
    check(settings, found)
    found.check()
    return settings
