"""Settings: a TOML file, then ``TOKENSVC_<SECTION>_<KEY>`` environment overrides.

Every key has a default except ``cookie_secret`` outside demo mode. A config error (an
unknown key, a wrong type, a bad URL) raises :class:`ConfigError` with one message that
names the key, and the service does not start.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import os
import re
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tokensvc.identifiers import ID, USERNAME, is_url, password_problem, redirect_uri_problem

log = logging.getLogger(__name__)

ENV_PREFIX = "TOKENSVC_"
# What a 503 (the store not answering) asks a client to wait before it tries again.
STORE_RETRY_AFTER_SECONDS = 5
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class ConfigError(Exception):
    """A configuration fault; the message names the key."""


@dataclass(slots=True)
class StorageSettings:
    backend: str = "memory"
    mongodb_uri: str = "mongodb://127.0.0.1:27017"
    database: str = "tokensvc"
    # The driver's timeoutMS: one budget for a whole operation (server selection, pool wait,
    # the retry of a write). Longer than a replica set's primary election (10-12 s), so that
    # a write interrupted by a failover lands on the new primary (README: MongoDB).
    timeout_ms: int = 15000
    max_pool_size: int = 100


@dataclass(slots=True)
class TokenSettings:
    access_ttl: int = 3600
    refresh_ttl: int = 2592000
    installation_refresh_ttl: int = 31536000
    code_ttl: int = 300
    session_ttl: int = 1209600
    # How long a client may retry an exchange or a refresh whose reply it lost, while the pair
    # that reply carried is unused. Unset: on MongoDB, where a reply can be lost after the write
    # applied, the whole retry budget (:func:`mongodb_grace_seconds`); 0 on the memory backend.
    refresh_grace_seconds: int | None = None


@dataclass(slots=True)
class ServerSettings:
    # Seconds a connection may take to send a request's headers, and may stay idle between
    # requests (one setting in Tornado); then it is closed.
    idle_timeout: int = 60
    # Seconds a request may take to send its body.
    body_timeout: int = 30


@dataclass(slots=True)
class LimitSettings:
    enabled: bool = True
    window_seconds: int = 300
    failed_client_auth_per_client: int = 10
    failed_client_auth_per_address: int = 50
    failed_logins_per_username: int = 5
    failed_logins_per_address: int = 20


@dataclass(slots=True)
class MetricsSettings:
    enabled: bool = True
    # Who may scrape GET /metrics (networks; anyone else gets 404): loopback and the private ranges.
    allow: list[str] = field(default_factory=lambda: ["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12",
                                                      "192.168.0.0/16", "fc00::/7"])


@dataclass(slots=True)
class ClientSeed:
    client_id: str
    name: str
    redirect_uris: list[str]
    allowed_scopes: list[str] | None = None
    first_party: bool = False
    client_secret: str | None = None
    client_secret_sha256: str | None = None
    description: str | None = None
    logo_url: str | None = None


@dataclass(slots=True)
class UserSeed:
    username: str
    password: str | None = None
    password_hash: str | None = None
    admin: bool = False


@dataclass(slots=True)
class InstallationSeed:
    installation_id: str
    name: str
    kind: str
    operators: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Settings:
    service_name: str = "tokensvc"
    base_url: str | None = None  # unset: follows the listen address (see listen_url)
    auth_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    cookie_secret: str | None = None
    demo: bool = False
    xheaders: bool = False
    log_format: str = "text"
    log_level: str = "info"
    server: ServerSettings = field(default_factory=ServerSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    tokens: TokenSettings = field(default_factory=TokenSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    clients: list[ClientSeed] = field(default_factory=list)
    users: list[UserSeed] = field(default_factory=list)
    installations: list[InstallationSeed] = field(default_factory=list)
    # What a scope lets an app do, in the words the consent and account pages show; a scope
    # without one is shown as written. Scopes stay free strings: this only words them.
    scopes: dict[str, str] = field(default_factory=dict)
    generated_cookie_secret: bool = field(default=False, repr=False)

    @property
    def session_cookie(self) -> str:
        """``<service_name>_session``; on https with the ``__Host-`` prefix, which a browser
        accepts only Secure, for ``/`` and from this host alone (no sibling subdomain can set it)."""
        return f"{self._cookie_prefix}{self.service_name}_session"

    @property
    def xsrf_cookie(self) -> str:
        return f"{self._cookie_prefix}_xsrf"

    @property
    def _cookie_prefix(self) -> str:
        return "__Host-" if self.secure_cookies else ""

    @property
    def secure_cookies(self) -> bool:
        return self.auth_url.startswith("https://")


_SECTIONS = {"server": ServerSettings, "storage": StorageSettings, "tokens": TokenSettings, "limits": LimitSettings,
             "metrics": MetricsSettings}
_TABLES = {"clients": ClientSeed, "users": UserSeed, "installations": InstallationSeed}
_INTERNAL = {"generated_cookie_secret"}


# -- value checks ---------------------------------------------------------------------

def _type_name(tp: Any) -> str:
    return {str: "a string", int: "an integer", bool: "a boolean"}.get(tp, str(tp))


def _coerce(key: str, value: Any, annotation: str) -> Any:
    """Check ``value`` against a dataclass field annotation (as a string: ``from __future__``)."""
    optional = annotation.endswith("| None")
    base = annotation.removesuffix(" | None")
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key}: a value is required")
    if base == "list[str]":
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
        return list(value)
    expected = {"str": str, "int": int, "bool": bool}[base]
    # bool is an int subclass: reject true/false where a number is expected.
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{key}: expected {_type_name(expected)}, got {value!r}")
    return value


def _from_table(cls: type, key: str, table: Any) -> Any:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{key}: expected a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in _INTERNAL}
    values = {}
    for name, value in table.items():
        if name not in fields:
            raise ConfigError(f"{key}.{name}: unknown key")
        values[name] = _coerce(f"{key}.{name}", value, fields[name].type)
    for name, spec in fields.items():
        if name not in values and spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key}.{name}: a value is required")
    return cls(**values)


def _check_url(key: str, url: str, *, schemes: tuple[str, ...] = ("http", "https")) -> None:
    if not is_url(url, schemes):
        raise ConfigError(f"{key}: not a valid {'/'.join(schemes)} URL: {url!r}")


def _check_redirect_uri(key: str, uri: str) -> None:
    problem = redirect_uri_problem(uri)
    if problem is not None:
        raise ConfigError(f"{key}: not a valid redirect URI ({problem}): {uri!r}")


# -- loading --------------------------------------------------------------------------

def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    """Fold ``TOKENSVC_<SECTION>_<KEY>`` (or ``TOKENSVC_<KEY>``) variables into ``raw``.

    Variables of another prefix (``TOKENSVC_TEST_...``) are not settings and are left alone;
    a variable naming a known section but an unknown key is an error.
    """
    top = {f.name: f.type for f in dataclasses.fields(Settings)
           if f.name not in _SECTIONS and f.name not in _TABLES and f.name not in _INTERNAL and f.name != "scopes"}
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        if rest in top:
            raw[rest] = _parse_env(name, text, top[rest])
            continue
        section, _, key = rest.partition("_")
        if section not in _SECTIONS:
            continue
        fields = {f.name: f.type for f in dataclasses.fields(_SECTIONS[section])}
        if key not in fields:
            raise ConfigError(f"{name}: unknown key {section}.{key}")
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{section}: expected a table")
        table[key] = _parse_env(name, text, fields[key])


def _parse_env(name: str, text: str, annotation: str) -> Any:
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
    if base == "list[str]":
        return [item.strip() for item in text.split(",") if item.strip()]
    return text


def load(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Settings:
    """Read the TOML file at ``path`` (none: defaults only), apply the environment, then
    ``overrides`` (command-line flags, top-level keys), and validate the result."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    _apply_env(raw, os.environ if environ is None else environ)
    raw.update({key: value for key, value in (overrides or {}).items() if value is not None})
    return from_dict(raw)


def listen_url(host: str, port: int) -> str:
    """The URL a client on this machine reaches ``host:port`` by: a wildcard address is
    reached on loopback, an IPv6 literal in brackets."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def from_dict(raw: Mapping[str, Any]) -> Settings:
    values: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(Settings) if f.name not in _INTERNAL}
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(f"{key}: unknown key")
        if key == "scopes":
            values[key] = _scope_descriptions(value)
        elif key in _SECTIONS:
            values[key] = _from_table(_SECTIONS[key], key, value)
        elif key in _TABLES:
            if not isinstance(value, list):
                raise ConfigError(f"{key}: expected an array of tables ([[{key}]])")
            values[key] = [_from_table(_TABLES[key], f"{key}[{i}]", item) for i, item in enumerate(value)]
        else:
            values[key] = _coerce(key, value, fields[key].type)
    settings = Settings(**values)
    validate(settings)
    return settings


def _scope_descriptions(table: Any) -> dict[str, str]:
    if not isinstance(table, Mapping):
        raise ConfigError("scopes: expected a table of scope = \"description\"")
    for scope, words in table.items():
        if not isinstance(words, str) or not words.strip():
            raise ConfigError(f"scopes.{scope}: expected a description (a non-empty string), got {words!r}")
        if not scope or any(ch.isspace() for ch in scope):
            raise ConfigError(f"scopes: not a scope (no spaces): {scope!r}")
    return dict(table)


def mongodb_grace_seconds(timeout_ms: int) -> int:
    """The grace period that covers a client's honest retry on MongoDB: its first attempt may
    take the whole operation budget before answering 503, the client waits the Retry-After,
    and its retry may take the budget again before it reaches the store (docs/operations.md)."""
    return 2 * math.ceil(timeout_ms / 1000) + STORE_RETRY_AFTER_SECONDS


def validate(settings: Settings) -> None:
    """Cross-field checks; fills in a generated cookie secret in demo mode."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", settings.service_name):
        raise ConfigError("service_name: letters, digits, '_' and '-' only (it names the session cookie)")
    if not 1 <= settings.port <= 65535:
        raise ConfigError(f"port: {settings.port} is outside 1-65535; choose another with --port or TOKENSVC_PORT")
    for key in ("base_url", "auth_url"):
        url = getattr(settings, key)
        if url is None:  # not set: the service is reached where it listens
            url = listen_url(settings.host, settings.port)
        _check_url(key, url)
        setattr(settings, key, url.rstrip("/"))
    if settings.log_format not in ("text", "json"):
        raise ConfigError(f"log_format: expected 'text' or 'json', got {settings.log_format!r}")
    if settings.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log_level: expected debug, info, warning or error, got {settings.log_level!r}")
    if settings.storage.backend not in ("memory", "mongodb"):
        raise ConfigError(f"storage.backend: expected 'memory' or 'mongodb', got {settings.storage.backend!r}")
    _check_url("storage.mongodb_uri", settings.storage.mongodb_uri, schemes=("mongodb", "mongodb+srv"))
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,63}", settings.storage.database):
        raise ConfigError(f"storage.database: not a valid database name: {settings.storage.database!r}")
    for key in ("timeout_ms", "max_pool_size"):
        if getattr(settings.storage, key) <= 0:
            raise ConfigError(f"storage.{key}: must be positive")
    if settings.tokens.refresh_grace_seconds is None:
        settings.tokens.refresh_grace_seconds = (mongodb_grace_seconds(settings.storage.timeout_ms)
                                                 if settings.storage.backend == "mongodb" else 0)
    for f in dataclasses.fields(TokenSettings):
        value = getattr(settings.tokens, f.name)
        minimum = 0 if f.name == "refresh_grace_seconds" else 1
        if value < minimum:
            raise ConfigError(f"tokens.{f.name}: must be at least {minimum}, got {value}")

    for f in dataclasses.fields(ServerSettings):
        if getattr(settings.server, f.name) < 1:
            raise ConfigError(f"server.{f.name}: must be at least 1 second, got {getattr(settings.server, f.name)}")
    for network in settings.metrics.allow:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ConfigError(f"metrics.allow: not a network (address/prefix): {network!r}") from None
    for f in dataclasses.fields(LimitSettings):
        value = getattr(settings.limits, f.name)
        if f.name != "enabled" and value < 1:
            raise ConfigError(f"limits.{f.name}: must be at least 1, got {value}")

    if settings.cookie_secret is None:
        if not settings.demo:
            raise ConfigError("cookie_secret: required outside demo mode (set it, or TOKENSVC_COOKIE_SECRET)")
        settings.cookie_secret = secrets.token_urlsafe(32)
        settings.generated_cookie_secret = True
    elif len(settings.cookie_secret) < 16 and not settings.demo:
        raise ConfigError("cookie_secret: too short (at least 16 characters outside demo mode)")

    seen: set[str] = set()
    for i, client in enumerate(settings.clients):
        key = f"clients[{i}]"
        if not ID.match(client.client_id):
            raise ConfigError(f"{key}.client_id: 1-128 characters of [A-Za-z0-9._~-]: {client.client_id!r}")
        if client.client_id in seen:
            raise ConfigError(f"{key}.client_id: duplicate client id {client.client_id!r}")
        seen.add(client.client_id)
        if not client.redirect_uris:
            raise ConfigError(f"{key}.redirect_uris: at least one redirect URI is required")
        for uri in client.redirect_uris:
            _check_redirect_uri(f"{key}.redirect_uris", uri)
        if client.logo_url is not None:
            if client.logo_url.startswith("/") and not client.logo_url.startswith("//"):
                client.logo_url = settings.auth_url + client.logo_url  # served by this service
            _check_url(f"{key}.logo_url", client.logo_url)
        if client.client_secret is not None and client.client_secret_sha256 is not None:
            raise ConfigError(f"{key}: give client_secret or client_secret_sha256, not both")
        if client.client_secret_sha256 is not None and not _SHA256_HEX.match(client.client_secret_sha256):
            raise ConfigError(f"{key}.client_secret_sha256: expected 64 lower-case hex digits")
    names: set[str] = set()
    for i, user in enumerate(settings.users):
        key = f"users[{i}]"
        if not USERNAME.match(user.username):
            raise ConfigError(f"{key}.username: 1-64 characters of [A-Za-z0-9._@-]: {user.username!r}")
        if user.username in names:
            raise ConfigError(f"{key}.username: duplicate username {user.username!r}")
        names.add(user.username)
        if (user.password is None) == (user.password_hash is None):
            raise ConfigError(f"{key}: give exactly one of password or password_hash")
        problem = password_problem(user.password) if user.password is not None else None
        if problem is not None:
            raise ConfigError(f"{key}.password: {problem} (the rule of `tokensvc users add`)")
    for i, inst in enumerate(settings.installations):
        key = f"installations[{i}]"
        if not ID.match(inst.installation_id):
            raise ConfigError(f"{key}.installation_id: 1-128 characters of [A-Za-z0-9._~-]")
        if inst.kind not in ("telescope", "observatory"):
            raise ConfigError(f"{key}.kind: expected 'telescope' or 'observatory', got {inst.kind!r}")
        for operator in inst.operators:
            if operator not in names:
                raise ConfigError(f"{key}.operators: unknown user {operator!r}")


def masked(settings: Settings) -> dict[str, Any]:
    """The effective settings as a dict, every secret replaced by ``"***"`` (``config check``)."""
    data = dataclasses.asdict(settings)
    data.pop("generated_cookie_secret", None)
    data["cookie_secret"] = "***" if settings.cookie_secret else None
    for client in data["clients"]:
        for key in ("client_secret", "client_secret_sha256"):
            if client[key] is not None:
                client[key] = "***"
    for user in data["users"]:
        for key in ("password", "password_hash"):
            if user[key] is not None:
                user[key] = "***"
    data["storage"]["mongodb_uri"] = re.sub(r"//[^@/]*@", "//***@", data["storage"]["mongodb_uri"])
    return data
