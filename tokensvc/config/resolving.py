"""Stage 3 of the settings, **resolved**: the defaults that depend on other settings filled in
(the public URLs from the listen address, the refresh grace from the storage backend, a demo
cookie secret, a logo given as a path)."""

from __future__ import annotations

import dataclasses
import math
import secrets
from typing import Any

from tokensvc.config.checks import check_url
from tokensvc.config.reading import Problems
from tokensvc.config.settings import STORE_RETRY_AFTER_SECONDS, Settings, StorageSettings
from tokensvc.identifiers import served_here

# The wildcard listen addresses: the loopback address this machine reaches each by, and what
# each means, in words.
_WILDCARDS = {"": ("127.0.0.1", "every IPv4 address (0.0.0.0)"),
              "0.0.0.0": ("127.0.0.1", "every IPv4 address (0.0.0.0)"),
              "::": ("::1", "every address (::)")}


def listen_url(host: str, port: int) -> str:
    """The URL a client on this machine reaches ``host:port`` by: a wildcard address is
    reached on loopback, an IPv6 literal in brackets."""
    host = _WILDCARDS[host][0] if host in _WILDCARDS else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def wildcard_of(host: str) -> str | None:
    """What a wildcard listen address means, in words (``listen_url`` gives where this machine
    reaches it); None for any other address."""
    return _WILDCARDS[host][1] if host in _WILDCARDS else None


def mongodb_grace_seconds(timeout_ms: int) -> int:
    """The grace period that covers a client's honest retry on MongoDB: its first attempt may
    take the whole operation budget before answering 503, the client waits the Retry-After,
    and its retry may take the budget again before it reaches the store (docs/guide/operations.md)."""
    return 2 * math.ceil(timeout_ms / 1000) + STORE_RETRY_AFTER_SECONDS


def _default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def resolve(values: dict[str, Any], found: Problems) -> None:
    """Fill in the settings whose default depends on others."""
    host, port = values.get("host", _default(Settings, "host")), values.get("port", _default(Settings, "port"))
    if not 1 <= port <= 65535:
        found.refuse("port", f"port: {port} is outside 1-65535; choose another with --port or TOKENSVC_PORT")
        port = _default(Settings, "port")  # to derive the rest with: their problems would be this one's
    for key in ("base_url", "auth_url"):
        url = values.get(key) or listen_url(host, port)  # not set: reached where it listens
        if not check_url(key, url, found):
            url = listen_url(host, port)  # to check the rest with
        values[key] = url.rstrip("/")
    admin = values.setdefault("admin", {})
    if "port" not in admin:  # beside the public port
        admin["port"] = port + 1 if port < 65535 else 0
    storage = values.setdefault("storage", {})
    if storage.get("backend", _default(StorageSettings, "backend")) == "mongodb" and "mongodb_uri" not in storage \
            and not values.get("demo"):
        # Its default names this host alone: a forgotten secret would make a production service wait
        # for a database that is not there.
        found('storage.mongodb_uri: required with storage.backend = "mongodb" outside demo mode (set it, '
              "or TOKENSVC_STORAGE_MONGODB_URI)")
    tokens = values.setdefault("tokens", {})
    if "refresh_grace_seconds" not in tokens:
        on_mongodb = storage.get("backend", _default(StorageSettings, "backend")) == "mongodb"
        timeout_ms = storage.get("timeout_ms", _default(StorageSettings, "timeout_ms"))
        tokens["refresh_grace_seconds"] = mongodb_grace_seconds(timeout_ms) if on_mongodb else 0
    if not values.get("cookie_secret") and values.get("demo"):
        values["cookie_secret"] = secrets.token_urlsafe(32)
        values["generated_cookie_secret"] = True
    keys = values.get("cookie_secret") or []
    values["cookie_secrets"] = tuple([keys] if isinstance(keys, str) else keys)
    values["cookie_secret"] = values["cookie_secrets"][0] if values["cookie_secrets"] else ""
    for client in values.get("clients", []):
        if isinstance(client.get("logo_url"), str):
            client["logo_url"] = served_here(client["logo_url"], values["auth_url"])
