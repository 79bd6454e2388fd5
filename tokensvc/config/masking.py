"""What the settings show of themselves: a URI with its credentials masked, a MongoDB URI's
hosts and options read without resolving anything, the effective settings with every secret
masked (``config check``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

from tokensvc.config.settings import Settings


def masked_uri(uri: str) -> str:
    """``uri`` with what it holds before its last ``@`` (a user and a password) as ``***``,
    whatever its scheme: the form any message or listing shows of a URI. A query holding an
    ``@`` masks the hosts too, never less."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        scheme, rest = "", uri
    if "@" not in rest:
        return uri
    return f"{scheme}{sep}***@{rest.rpartition('@')[2]}"


def mongodb_hosts(uri: str) -> tuple[list[str], dict[str, str]]:
    """The hosts a MongoDB URI names (without ports; an SRV record's name for ``mongodb+srv``)
    and its options (names lower-cased), read without resolving anything."""
    rest = uri.partition("://")[2]
    authority, _, tail = rest.partition("/")
    authority, _, query = authority.partition("?") if "?" in authority else (authority, "", tail.partition("?")[2])
    hosts = []
    for host in authority.rpartition("@")[2].split(","):
        if host.startswith("["):
            hosts.append(host[1:host.find("]")])
        elif host:
            hosts.append(host.rsplit(":", 1)[0])
    return hosts, {name.lower(): value for name, value in parse_qsl(query)}


def masked(settings: Settings) -> dict[str, Any]:
    """The effective settings as a dict, every secret replaced by ``"***"`` (``config check``)."""
    data = _plain(settings)
    data.pop("generated_cookie_secret", None)
    data.pop("config_file", None)
    keys = data.pop("cookie_secrets")
    data["cookie_secret"] = ["***" for _ in keys] if len(keys) > 1 else "***" if settings.cookie_secret else None
    for client in data["clients"]:
        for key in ("client_secret", "client_secret_sha256"):
            if client[key] is not None:
                client[key] = "***"
    for user in data["users"]:
        for key in ("password", "password_hash"):
            if user[key] is not None:
                user[key] = "***"
    data["tokens"]["successor_keys"] = ["***"] * len(settings.tokens.successor_keys)
    data["storage"]["mongodb_uri"] = masked_uri(data["storage"]["mongodb_uri"])
    return data


def _plain(value: Any) -> Any:
    """``value`` as JSON-like data: dataclasses and mappings as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value
