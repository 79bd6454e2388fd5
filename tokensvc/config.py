"""Settings: a TOML file, then ``TOKENSVC_<SECTION>_<KEY>`` environment overrides, then the
command line's flags.

Loading goes in stages, each with one job:

1. **raw**: the file, the environment and the flags folded into one dict (:func:`load`);
2. **typed**: every key checked against its section's dataclass (:func:`_typed`): an unknown
   key, a wrong type, a missing required value;
3. **resolved**: the defaults that depend on other settings filled in (:func:`_resolve`): the
   public URLs from the listen address, the refresh grace from the storage backend, a demo
   cookie secret, a logo given as a path;
4. **checked**: the frozen settings built and each section's rules checked (:func:`_check`),
   every rule of an identifier taken from :mod:`tokensvc.identifiers`.

The settings are immutable all the way down (frozen dataclasses, tuples, a read-only mapping):
whatever holds them (the protocol context, every application of the process) shares them
without a copy, and nothing can change them under another holder.

Every key has a default except ``cookie_secret`` outside demo mode. Every stage runs whatever
the ones before found (a value refused is left out, its default taken); then
:class:`ConfigError` lists every problem found, one line each naming its key, and the service
does not start.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import math
import os
import re
import secrets
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tokensvc.identifiers import (
    DEFAULT_KINDS,
    KIND,
    KIND_RULE,
    MIN_SECRET_LENGTH,
    id_problem,
    is_loopback,
    is_url,
    kind_problem,
    logo_url_problem,
    origin_problem,
    password_hash_problem,
    password_problem,
    redirect_uri_problem,
    resource_uri_problem,
    scope_problem,
    secret_problem,
    secret_sha256_problem,
    served_here,
    username_key,
    username_problem,
)
from tokensvc.oauth.feed import ReaderCaps
from tokensvc.records import CLIENT_KIND, CLIENT_KINDS, RESOURCE_SERVER

log = logging.getLogger(__name__)

ENV_PREFIX = "TOKENSVC_"
# The operator commands' own variables (tokensvc/cli_login.py): what a command line talks to,
# not how the service runs, so they are never read as [admin] settings.
COMMAND_LINE_VARIABLES = frozenset({"TOKENSVC_ADMIN_URL", "TOKENSVC_ADMIN_TOKEN", "TOKENSVC_ADMIN_CLIENT_ID",
                                    "TOKENSVC_ADMIN_CLIENT_SECRET"})
# The variables that hold keys: a message about one never repeats its value.
SECRET_VARIABLES = frozenset({"TOKENSVC_COOKIE_SECRET", "TOKENSVC_TOKENS_SUCCESSOR_KEYS"})
# Keys whose value is a secret or may hold one: a problem of their type never shows the value.
SECRET_KEYS = frozenset({"cookie_secret", "successor_keys", "client_secret", "client_secret_sha256", "password",
                         "password_hash", "mongodb_uri"})
# The shortest cookie_secret 0.10.0 took: after the first key, such a key verifies and never signs.
VERIFY_ONLY_SECRET_LENGTH = 16
# What a 503 (the store not answering) asks a client to wait before it tries again.
STORE_RETRY_AFTER_SECONDS = 5
# Settings whose default depends on other settings: absent from the input, filled in by _resolve.
DERIVED = {"derived": True}
# How a list of strings is declared (an array in TOML, comma-separated in the environment).
STRINGS = "tuple[str, ...]"
# Settings made from others, never given (not keys of the file or the environment).
MADE = {"derived": True, "made": True}
# What cookie_secret takes: one key, or the keys of a rotation (the first signs, each verifies).
COOKIE_SECRET = "str | list[str]"


# What server.allowed_hosts takes: a host name or an address as a request's Host names it.
HOST_NAME = re.compile(r"\[?[0-9A-Fa-f:.]+\]?|[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
# The least feed.max_unsent_bytes may be: a few messages (a resumption's missed ones, bounded
# by the feed's replay buffer, are not counted against it).
MIN_UNSENT_BYTES = 4096
UNIX_PEER = "unix"  # in proxy.trusted_networks: the peer on server.unix_socket


# Says one problem of the settings, a line that starts with its key (``key: what is wrong``).
Say = Callable[[str], None]


class ConfigError(Exception):
    """A configuration fault: ``problems``, one line each naming its key, every one that one
    reading of the settings found; the message is those lines."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageSettings:
    backend: str = "memory"
    mongodb_uri: str = "mongodb://127.0.0.1:27017"
    database: str = "tokensvc"
    # The driver's timeoutMS: one budget for a whole operation (server selection, pool wait,
    # the retry of a write). Longer than a replica set's primary election (10-12 s), so that
    # a write interrupted by a failover lands on the new primary (docs/operations.md).
    timeout_ms: int = 15000
    max_pool_size: int = 100
    # How often a serving process renews its entry among the running processes and reads the
    # store's format again: a finalize reaches every process within it (docs/operations.md).
    heartbeat_seconds: int = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenSettings:
    access_ttl: int = 3600
    refresh_ttl: int = 2592000
    installation_refresh_ttl: int = 31536000
    code_ttl: int = 300
    session_ttl: int = 1209600
    # How long a client may retry an exchange or a refresh whose reply it lost, while the pair
    # that reply carried is unused. Unset: on MongoDB, where a reply can be lost after the write
    # applied, the whole retry budget (:func:`mongodb_grace_seconds`); 0 on the memory backend.
    refresh_grace_seconds: int = field(default=0, metadata=DERIVED)
    # The keys a rotation derives its pair with (the first), and with which a presentation
    # arriving with it recomputes that pair (every one): see docs/security.md. Empty: one key
    # derived from cookie_secret, which must then have 32 characters or more. The same list on
    # every process; at least 32 characters each.
    successor_keys: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSettings:
    # Seconds a connection may take to send a request's headers, and may stay idle between
    # requests (one setting in Tornado); then it is closed.
    idle_timeout: int = 60
    # Seconds a request may take to send its body.
    body_timeout: int = 30
    # Host names a request may name besides those of base_url and auth_url (and, where one of
    # those is a loopback address, localhost, 127.0.0.1 and ::1); "*" for any. Anything else is
    # 400: a DNS name an attacker points at this address reaches nothing (DNS rebinding).
    allowed_hosts: tuple[str, ...] = ()
    # On SIGTERM or SIGINT: stop accepting, then let the requests in flight finish for at most
    # this long before the store is closed (a deploy cuts no exchange in half).
    drain_seconds: int = 20
    # A unix socket the public port also listens on, for a proxy on this host: only whoever the
    # file's mode lets open it can connect (unlike a loopback address, which any local process
    # may connect from), so proxy.trusted_networks = ["unix"] believes the proxy's headers there.
    unix_socket: str = ""
    unix_socket_mode: int = 0o660


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxySettings:
    # With xheaders (required then): the networks of the proxies the service is reached
    # through, or "unix": the peer on server.unix_socket. A peer outside them is a client that
    # connected directly, and no header it sends is believed.
    trusted_networks: tuple[str, ...] = ()
    # 0: X-Forwarded-For is read back past every address in trusted_networks. N: behind a
    # peer in trusted_networks, N proxies in all append to it (the farther ones, a cloud load
    # balancer, may be anywhere): the client is the N-th entry from the right.
    trusted_hops: int = 0
    # Take X-Real-IP, set by the nearest proxy, instead (from a peer in trusted_networks only).
    real_ip_header: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminSettings:
    # The admin listener (the admin API): its own address, never the public port's.
    host: str = "127.0.0.1"
    # Unset: the public port + 1; 0: no admin listener.
    port: int = field(default=0, metadata=DERIVED)
    # A non-loopback host must be asked for: the listener then belongs behind TLS and a network policy.
    allow_remote: bool = False
    # Seed the first-party public client of `tokensvc login` (tokensvc-cli).
    cli_client: bool = True


# NIST SP 800-63B §5.2.2: a verifier limits the consecutive failed attempts on one account to no
# more than 100.
MAX_CONSECUTIVE_FAILED_LOGINS = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitSettings:
    enabled: bool = True
    window_seconds: int = 300
    failed_client_auth_per_client: int = 10
    failed_client_auth_per_address: int = 50
    failed_logins_per_username: int = 5
    failed_logins_per_address: int = 20
    # Per account, from any number of addresses: failed sign-ins an hour from the browsers that
    # have not signed in to it before (each one that has is limited alike on its own), and the
    # failures since its last sign-in, at most 100 (NIST SP 800-63B §5.2.2), counted over 30 days.
    failed_logins_per_account: int = 10
    account_window_seconds: int = 3600
    consecutive_failed_logins: int = 100
    consecutive_window_seconds: int = 30 * 86400
    # The IPv6 addresses counted as one address: a host commonly holds a whole /64 and picks
    # any address of it, so counting each address apart would give it unlimited guesses.
    ipv6_prefix: int = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedSettings:
    # The revocation feed's readers (GET /oauth/revocations): refused before the upgrade past
    # either count, so that a fan-out stays short for everyone (docs/configuration.md).
    max_readers: int = ReaderCaps().per_process  # open in this process
    max_readers_per_client: int = ReaderCaps().per_client  # of one client, in this process
    # A ping every ping_seconds; a reader that has not answered within ping_timeout_seconds
    # (at most ping_seconds) is closed: a dead one no longer counts against the caps.
    ping_seconds: int = 20
    ping_timeout_seconds: int = 10
    # A reader whose messages not yet written to its socket exceed this is closed (1008): it
    # does not keep up, and the process would otherwise hold them without bound.
    max_unsent_bytes: int = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSettings:
    enabled: bool = True
    # Who may scrape GET /metrics (networks; anyone else gets 404): loopback and the private ranges.
    allow: tuple[str, ...] = ("127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientSeed:
    client_id: str
    name: str
    redirect_uris: tuple[str, ...] = ()
    kind: str = CLIENT_KIND  # or RESOURCE_SERVER: introspection and the revocation feed only
    allowed_scopes: tuple[str, ...] | None = None
    first_party: bool = False
    client_secret: str | None = None
    client_secret_sha256: str | None = None
    description: str | None = None
    logo_url: str | None = None
    allowed_origins: tuple[str, ...] | None = None
    resources: tuple[str, ...] | None = None  # a resource server's API (RFC 8707 resource URIs)


@dataclass(frozen=True, slots=True, kw_only=True)
class UserSeed:
    username: str
    password: str | None = None
    password_hash: str | None = None
    admin: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallationSeed:
    installation_id: str
    name: str
    kind: str
    operators: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    service_name: str = "tokensvc"
    # Unset: the service is reached where it listens (see listen_url).
    base_url: str = field(default="", metadata=DERIVED)
    auth_url: str = field(default="", metadata=DERIVED)
    host: str = "127.0.0.1"
    port: int = 8080
    # The key that signs the session and XSRF cookies. Given as a list (rotation), its first
    # entry; unset: an error, except in demo mode, where one is generated (generated_cookie_secret).
    cookie_secret: str = field(default="", metadata=DERIVED, repr=False)
    # Every key a cookie may be signed with: cookie_secret first, then the ones being retired.
    cookie_secrets: tuple[str, ...] = field(default=(), metadata=MADE, repr=False)
    demo: bool = False
    xheaders: bool = False
    log_format: str = "text"
    log_level: str = "info"
    server: ServerSettings = field(default_factory=ServerSettings)
    proxy: ProxySettings = field(default_factory=ProxySettings)
    admin: AdminSettings = field(default_factory=AdminSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    tokens: TokenSettings = field(default_factory=TokenSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    feed: FeedSettings = field(default_factory=FeedSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    clients: tuple[ClientSeed, ...] = ()
    users: tuple[UserSeed, ...] = ()
    installations: tuple[InstallationSeed, ...] = ()
    # What a scope lets an app do, in the words the consent and account pages show; a scope
    # without one is shown as written. Scopes stay free strings: this only words them.
    scopes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # What a node installation may be; the pages say "a telescope", "an observatory".
    installation_kinds: tuple[str, ...] = tuple(DEFAULT_KINDS)
    generated_cookie_secret: bool = field(default=False, metadata=MADE, repr=False)
    # The file the settings were read from, as an absolute path ("" when none): its
    # [[clients]], [[users]] and [[installations]] are its own, and a refusal to change one
    # names it (to an admin API caller who does not know the service's working directory).
    config_file: str = field(default="", metadata=MADE)

    @property
    def session_cookie(self) -> str:
        """``<service_name>_session``; on https with the ``__Host-`` prefix, which a browser
        accepts only Secure, for ``/`` and from this host alone (no sibling subdomain can set it)."""
        return f"{self._cookie_prefix}{self.service_name}_session"

    @property
    def xsrf_cookie(self) -> str:
        return f"{self._cookie_prefix}_xsrf"

    @property
    def browser_cookie(self) -> str:
        """``<service_name>_browser``: a browser's own id and the accounts that signed in with
        it (the per-account failure limits know it by that), with the session cookie's prefix."""
        return f"{self._cookie_prefix}{self.service_name}_browser"

    @property
    def _cookie_prefix(self) -> str:
        return "__Host-" if self.secure_cookies else ""

    @property
    def secure_cookies(self) -> bool:
        return self.auth_url.startswith("https://")


SECTIONS: dict[str, type] = {"server": ServerSettings, "proxy": ProxySettings, "admin": AdminSettings,
                             "storage": StorageSettings,
                             "tokens": TokenSettings,
                             "limits": LimitSettings, "feed": FeedSettings, "metrics": MetricsSettings}
TABLES: dict[str, type] = {"clients": ClientSeed, "users": UserSeed, "installations": InstallationSeed}


# -- stage 1: raw -----------------------------------------------------------------------------


def load(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Settings:
    """Read the TOML file at ``path`` (none: defaults only), apply the environment, then
    ``overrides`` (command-line flags, top-level keys), and make the settings. A file that
    cannot be read stops here; every other problem of the file and the environment is found
    before :class:`ConfigError` lists them all."""
    raw: dict[str, Any] = {} if path is None else _read(path)
    found = _Problems()
    _apply_env(raw, os.environ if environ is None else environ, found)
    raw.update({key: value for key, value in (overrides or {}).items() if value is not None})
    settings = _settings(raw, found)
    return settings if path is None else dataclasses.replace(settings, config_file=os.path.abspath(path))


def _read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML document at ``path``; what keeps it from being read, in one line."""
    try:
        if os.path.exists(path) and not os.path.isdir(path) and not stat.S_ISREG(os.stat(path).st_mode):
            # A device, a pipe or a socket: /dev/zero would be read without end.
            raise ConfigError(f"{path}: not a regular file (give the TOML file with --config)")
        text = Path(path).read_text(encoding="utf-8")
        if text.startswith("\ufeff"):
            raise ConfigError(f"{path}: starts with a UTF-8 byte order mark, which TOML does not take: save it as "
                              "UTF-8 without one")
        return tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: a directory, not a config file (give the TOML file with --config)") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}): a config file is TOML in UTF-8") from None
    except OSError as exc:  # no permission to read it, an I/O error
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


class _Problems:
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
        if not any(_related(key, refused) for refused in self.refused):
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


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str], found: _Problems) -> None:
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


def _table(cls: type, key: str, table: Any, found: _Problems) -> dict[str, Any]:
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


def _typed(raw: Mapping[str, Any], found: _Problems) -> dict[str, Any]:
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


def _scope_descriptions(table: Any, found: _Problems) -> Mapping[str, str]:
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


# -- stage 3: resolved -------------------------------------------------------------------------


def listen_url(host: str, port: int) -> str:
    """The URL a client on this machine reaches ``host:port`` by: a wildcard address is
    reached on loopback, an IPv6 literal in brackets."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def mongodb_grace_seconds(timeout_ms: int) -> int:
    """The grace period that covers a client's honest retry on MongoDB: its first attempt may
    take the whole operation budget before answering 503, the client waits the Retry-After,
    and its retry may take the budget again before it reaches the store (docs/operations.md)."""
    return 2 * math.ceil(timeout_ms / 1000) + STORE_RETRY_AFTER_SECONDS


def _default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _resolve(values: dict[str, Any], found: _Problems) -> None:
    """Fill in the settings whose default depends on others."""
    host, port = values.get("host", _default(Settings, "host")), values.get("port", _default(Settings, "port"))
    if not 1 <= port <= 65535:
        found.refuse("port", f"port: {port} is outside 1-65535; choose another with --port or TOKENSVC_PORT")
        port = _default(Settings, "port")  # to derive the rest with: their problems would be this one's
    for key in ("base_url", "auth_url"):
        url = values.get(key) or listen_url(host, port)  # not set: reached where it listens
        if not _check_url(key, url, found):
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


def from_dict(raw: Mapping[str, Any]) -> Settings:
    """The settings ``raw`` (a parsed TOML document) describes."""
    return _settings(raw, _Problems())


def _settings(raw: Mapping[str, Any], found: _Problems) -> Settings:
    """The settings ``raw`` describes, every stage run whatever the ones before found (what
    they refused is left out), then :class:`ConfigError` with every problem found, if any."""
    values = _typed(raw, found)
    _resolve(values, found)
    for key, cls in SECTIONS.items():
        values[key] = cls(**values.get(key, {}))
    for key, cls in TABLES.items():
        values[key] = tuple(cls(**item) for item in values.get(key, []))
    settings = Settings(**values)
    _check(settings, found)
    found.check()
    return settings


# -- stage 4: checked --------------------------------------------------------------------------


def _check_url(key: str, url: str, say: Say, *, schemes: tuple[str, ...] = ("http", "https")) -> bool:
    """Whether ``url`` is a URL of one of ``schemes``; if not, said."""
    if is_url(url, schemes):
        return True
    quoted = len(url) > 1 and url[0] == url[-1] and url[0] in "\"'"
    say(f"{key}: not a valid {'/'.join(schemes)} URL: {masked_uri(url)!r}"
        + (" (remove the quotes around it: docker --env-file and systemd's EnvironmentFile keep them as given)"
           if quoted else ""))
    return False


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


def _check(settings: Settings, say: Say) -> None:
    """Each section's rules, on the settings as they will be used."""
    _check_service(settings, say)
    _check_admin(settings.admin, settings.port, say)
    _check_storage(settings.storage, say)
    _check_sections(settings, say)
    _check_clients(settings.clients, settings.demo, say)
    names = _check_users(settings.users, settings.service_name, say)
    _check_kinds(settings.installation_kinds, say)
    _check_installations(settings.installations, names, settings.installation_kinds, say)


def _check_service(settings: Settings, say: Say) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", settings.service_name):
        say("service_name: letters, digits, '_' and '-' only (it names the session cookie)")
    if settings.log_format not in ("text", "json"):
        say(f"log_format: expected 'text' or 'json', got {settings.log_format!r}")
    if settings.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        say(f"log_level: expected debug, info, warning or error, got {settings.log_level!r}")
    if not settings.cookie_secret:
        say("cookie_secret: required outside demo mode (set it, or TOKENSVC_COOKIE_SECRET)")
    for index, key in enumerate(settings.cookie_secrets):
        if verify_only(index, key):
            continue  # warned of: a key 0.10.0 signed with, kept to verify while its sessions live
        problem = secret_problem(key, demo=settings.demo)
        if problem is not None:
            name = f"cookie_secret[{index}]" if len(settings.cookie_secrets) > 1 else "cookie_secret"
            say(f"{name}: expected {problem}")
    if len(set(settings.cookie_secrets)) != len(settings.cookie_secrets):
        say("cookie_secret: a key is listed twice")


def verify_only(index: int, key: str) -> bool:
    """Whether the ``index``-th key of ``cookie_secret`` is one shorter than a key that signs
    but as long as 0.10.0 took: kept after the first, it verifies and never signs, so that an
    upgrade from a short key signs nobody out."""
    return index > 0 and bool(key.strip()) and VERIFY_ONLY_SECRET_LENGTH <= len(key) < MIN_SECRET_LENGTH


def _check_admin(admin: AdminSettings, port: int, say: Say) -> None:
    if not 0 <= admin.port <= 65535:
        say(f"admin.port: {admin.port} is outside 0-65535 (0: no admin listener)")
    if admin.port and admin.port == port:
        say("admin.port: the admin listener needs a port of its own, not the public one")
    if admin.port and not is_loopback(admin.host) and not admin.allow_remote:
        say(f"admin.host: {admin.host!r} is not a loopback address; the admin API belongs on "
                          "loopback, or behind TLS and a network policy with admin.allow_remote = true")


def _check_storage(storage: StorageSettings, say: Say) -> None:
    if storage.backend not in ("memory", "mongodb"):
        say(f"storage.backend: expected 'memory' or 'mongodb', got {storage.backend!r}")
    if _check_url("storage.mongodb_uri", storage.mongodb_uri, say, schemes=("mongodb", "mongodb+srv")):
        from tokensvc.storage.mongo.uri import uri_problems  # the driver, only where a URI is given

        for problem in uri_problems(storage.mongodb_uri):
            say(f"storage.mongodb_uri: {problem}")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,63}", storage.database):
        say(f"storage.database: not a valid database name: {storage.database!r}")
    for key in ("timeout_ms", "max_pool_size", "heartbeat_seconds"):
        if getattr(storage, key) <= 0:
            say(f"storage.{key}: must be positive")


def _check_sections(settings: Settings, say: Say) -> None:
    """The numbers of [tokens], [server], [proxy] and [limits], and the networks of [metrics] and [proxy]."""
    for f in dataclasses.fields(TokenSettings):
        value = getattr(settings.tokens, f.name)
        if f.name == "successor_keys":
            continue
        minimum = 0 if f.name == "refresh_grace_seconds" else 1
        if value < minimum:
            say(f"tokens.{f.name}: must be at least {minimum}, got {value}")
    keys = settings.tokens.successor_keys
    for index, key in enumerate(keys):
        problem = secret_problem(key)  # demo mode too: it is no cookie secret a demo generates
        if problem is not None:
            say(f"tokens.successor_keys[{index}]: expected {problem}")
    if len(set(keys)) != len(keys):
        say("tokens.successor_keys: a key is listed twice")
    # Without keys of their own, one is derived from each cookie_secret key, which has
    # MIN_SECRET_LENGTH characters or more outside demo mode (the rule of _check_service).
    for name in ("idle_timeout", "body_timeout", "drain_seconds"):
        if getattr(settings.server, name) < 1:
            say(f"server.{name}: must be at least 1 second, got {getattr(settings.server, name)}")
    if not 0 <= settings.server.unix_socket_mode <= 0o777:
        say(f"server.unix_socket_mode: a file mode (0o660), got {settings.server.unix_socket_mode:#o}")
    if UNIX_PEER in settings.proxy.trusted_networks and not settings.server.unix_socket:
        say(f'proxy.trusted_networks: "{UNIX_PEER}" trusts the peer on server.unix_socket, which is '
                          "not set")
    for f in dataclasses.fields(LimitSettings):
        value = getattr(settings.limits, f.name)
        if f.name != "enabled" and value < 1:
            say(f"limits.{f.name}: must be at least 1, got {value}")
    if settings.limits.consecutive_failed_logins > MAX_CONSECUTIVE_FAILED_LOGINS:
        say(f"limits.consecutive_failed_logins: at most {MAX_CONSECUTIVE_FAILED_LOGINS} (NIST SP 800-63B "
                          f"§5.2.2), got {settings.limits.consecutive_failed_logins}")
    if settings.limits.ipv6_prefix > 128:
        say(f"limits.ipv6_prefix: an IPv6 prefix length, 1 to 128, got {settings.limits.ipv6_prefix}")
    _check_feed(settings.feed, say)
    for key, networks in (("metrics.allow", settings.metrics.allow),
                          ("proxy.trusted_networks", settings.proxy.trusted_networks)):
        for index, network in enumerate(networks):
            if key == "proxy.trusted_networks" and network == UNIX_PEER:
                continue
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                say(f"{key}[{index}]: not a network (address/prefix): {network!r}")
    for index, host in enumerate(settings.server.allowed_hosts):
        if host != "*" and not HOST_NAME.fullmatch(host):
            say(f"server.allowed_hosts[{index}]: a host name or address as a request's Host names it, "
                              f"without scheme, port or path (or \"*\" for any): {host!r}")
    if settings.proxy.trusted_hops < 0:
        say(f"proxy.trusted_hops: must be 0 or more, got {settings.proxy.trusted_hops}")
    if settings.xheaders and not settings.proxy.trusted_networks:
        # Else a client connecting directly writes its own X-Forwarded-For: the failure
        # limits and /metrics would take the address it chose.
        say("proxy.trusted_networks: required with xheaders: the networks of the proxies the service "
                          "is reached through (their headers are believed from them alone)")


def _check_feed(feed: FeedSettings, say: Say) -> None:
    for f in dataclasses.fields(FeedSettings):
        if getattr(feed, f.name) < 1:
            say(f"feed.{f.name}: must be at least 1, got {getattr(feed, f.name)}")
    if feed.ping_timeout_seconds > feed.ping_seconds:
        say(f"feed.ping_timeout_seconds: at most feed.ping_seconds ({feed.ping_seconds}), got "
                          f"{feed.ping_timeout_seconds}")
    if feed.max_readers_per_client > feed.max_readers:
        say(f"feed.max_readers_per_client: at most feed.max_readers ({feed.max_readers}), got "
                          f"{feed.max_readers_per_client}")
    if feed.max_unsent_bytes < MIN_UNSENT_BYTES:
        say(f"feed.max_unsent_bytes: at least {MIN_UNSENT_BYTES} (a few messages), got "
                          f"{feed.max_unsent_bytes}")


def _check_clients(clients: tuple[ClientSeed, ...], demo: bool, say: Say) -> None:
    seen: set[str] = set()
    for i, client in enumerate(clients):
        key = f"clients[{i}]"
        problem = id_problem(client.client_id)
        if problem is not None:
            say(f"{key}.client_id: {problem}: {client.client_id!r}")
        if client.client_id in seen:
            say(f"{key}.client_id: duplicate client id {client.client_id!r}")
        seen.add(client.client_id)
        if client.kind not in CLIENT_KINDS:
            say(f"{key}.kind: one of {', '.join(CLIENT_KINDS)}: {client.kind!r}")
        if client.kind == RESOURCE_SERVER:
            _check_resource_server(key, client, say)
        elif not client.redirect_uris:
            say(f"{key}.redirect_uris: at least one redirect URI is required")
        if client.resources and client.kind != RESOURCE_SERVER:
            say(f"{key}.resources: only a resource server serves resources (kind = \"{RESOURCE_SERVER}\")")
        for index, uri in enumerate(client.resources or []):
            problem = resource_uri_problem(uri)
            if problem is not None:
                say(f"{key}.resources[{index}]: not a resource URI ({problem}): {uri!r}")
        for index, uri in enumerate(client.redirect_uris):
            problem = redirect_uri_problem(uri)
            if problem is not None:
                say(f"{key}.redirect_uris[{index}]: not a valid redirect URI ({problem}): {uri!r}")
        for index, scope in enumerate(client.allowed_scopes or []):
            problem = scope_problem(scope)
            if problem is not None:
                say(f"{key}.allowed_scopes[{index}]: not a valid scope ({problem}): {scope!r}")
        problem = logo_url_problem(client.logo_url) if client.logo_url is not None else None
        if problem is not None:
            say(f"{key}.logo_url: not a valid logo URL ({problem}): {client.logo_url!r}")
        for index, origin in enumerate(client.allowed_origins or []):
            problem = origin_problem(origin)
            if problem is not None:
                say(f"{key}.allowed_origins[{index}]: not a web origin ({problem}): {origin!r}")
        if client.client_secret is not None and client.client_secret_sha256 is not None:
            say(f"{key}: give client_secret or client_secret_sha256, not both")
        problem = (secret_sha256_problem(client.client_secret_sha256)
                   if client.client_secret_sha256 is not None else None)
        if problem is not None:
            say(f"{key}.client_secret_sha256: expected {problem}")
        problem = secret_problem(client.client_secret, demo=demo) if client.client_secret is not None else None
        if problem is not None:
            say(f"{key}.client_secret: expected {problem}")


def _check_resource_server(key: str, client: ClientSeed, say: Say) -> None:
    """A resource server proves a secret and has nothing of the authorization flow."""
    for name in ("redirect_uris", "allowed_scopes", "allowed_origins"):
        if getattr(client, name):
            say(f"{key}.{name}: a resource server has none (it introspects and reads the feed only)")
    if client.first_party:
        say(f"{key}.first_party: a resource server is not first-party (it introspects and reads the "
                          "feed only)")
    if client.client_secret is None and client.client_secret_sha256 is None:
        say(f"{key}: a resource server is confidential: give client_secret or client_secret_sha256")


def _check_users(users: tuple[UserSeed, ...], service_name: str, say: Say) -> set[str]:
    """The users' rules; their usernames' keys (identifiers.username_key)."""
    names: set[str] = set()
    for i, user in enumerate(users):
        key = f"users[{i}]"
        problem = username_problem(user.username)
        if problem is not None:
            say(f"{key}.username: {problem}: {user.username!r}")
        if username_key(user.username) in names:  # one user per key: ROOT is root
            say(f"{key}.username: duplicate username {user.username!r}")
        names.add(username_key(user.username))
        if (user.password is None) == (user.password_hash is None):
            say(f"{key}: give exactly one of password or password_hash")
        problem = password_problem(user.password, [user.username, service_name]) if user.password else None
        if problem is not None:
            say(f"{key}.password: {problem} (the rule of `tokensvc users add`)")
        problem = password_hash_problem(user.password_hash) if user.password_hash is not None else None
        if problem is not None:
            say(f"{key}.password_hash: expected {problem}")
    return names


def _check_kinds(kinds: tuple[str, ...], say: Say) -> None:
    if not kinds:
        say("installation_kinds: at least one kind is required")
    for index, kind in enumerate(kinds):
        if not KIND.fullmatch(kind):
            say(f"installation_kinds[{index}]: {KIND_RULE}: {kind!r}")
    if len(set(kinds)) != len(kinds):
        say("installation_kinds: a kind is listed twice")


def _check_installations(installations: tuple[InstallationSeed, ...], usernames: set[str],
                         kinds: tuple[str, ...], say: Say) -> None:
    for i, inst in enumerate(installations):
        key = f"installations[{i}]"
        problem = id_problem(inst.installation_id)
        if problem is not None:
            say(f"{key}.installation_id: {problem}: {inst.installation_id!r}")
        problem = kind_problem(inst.kind, kinds)
        if problem is not None:
            say(f"{key}.kind: {problem}, got {inst.kind!r}")
        for index, operator in enumerate(inst.operators):
            if username_key(operator) not in usernames:
                say(f"{key}.operators[{index}]: unknown user {operator!r}")


# -- what a production deployment does not want ------------------------------------------------


def warnings(settings: Settings) -> list[str]:
    """What is valid but no production deployment wants, each naming its key: ``config check``
    prints these (``--strict`` refuses them) and ``serve`` logs them at start. Demo mode is
    said once, and nothing else: it is for trying tokensvc out."""
    if settings.demo:
        return ["demo: true: weak secrets are taken and a cookie secret may be generated; for trying tokensvc out, "
                "not for production"]
    found = [f"cookie_secret[{index}]: {len(key)} characters, shorter than a key that signs: it verifies what "
             "0.10.0 signed and signs nothing; drop it once tokens.session_ttl has passed since the upgrade "
             "(docs/operations.md, Rotating the cookie secret)"
             for index, key in enumerate(settings.cookie_secrets) if verify_only(index, key)]
    storage = settings.storage
    if storage.backend == "memory":
        found.append('storage.backend: "memory" keeps nothing across a restart and serves one process alone; '
                     'production uses "mongodb"')
    else:
        hosts, options = mongodb_hosts(storage.mongodb_uri)
        if hosts and all(is_loopback(host) for host in hosts):
            found.append(f"storage.mongodb_uri: names this machine alone ({', '.join(hosts)}); a production store is "
                         "a replica set of three members on hosts of their own (docs/operations.md, Production "
                         "checklist)")
        if options.get("directconnection", "").lower() == "true":
            found.append("storage.mongodb_uri: directConnection=true: the driver talks to that one member and "
                         "follows no election; name the replica set's members and replicaSet= instead "
                         "(docs/operations.md, Production checklist)")
    urls = {"base_url": settings.base_url, **({"auth_url": settings.auth_url}
                                              if settings.auth_url != settings.base_url else {})}
    behind_proxy = settings.server.unix_socket or is_loopback(settings.host)
    if settings.base_url.startswith("https://") and behind_proxy and not settings.xheaders:
        where = f"server.unix_socket {settings.server.unix_socket}" if settings.server.unix_socket \
            else f"host {settings.host}"
        found.append(f"xheaders: false while base_url is https and the service listens on {where}: a proxy on "
                     "this host serves it, and every client then has the proxy's address, so one client's failed "
                     'sign-ins lock every client out; set xheaders = true, server.unix_socket and '
                     'proxy.trusted_networks = ["unix"] (docs/configuration.md, Behind a reverse proxy)')
    for key, url in urls.items():
        host = urlsplit(url).hostname or ""
        if url.startswith("http://") and not is_loopback(host):
            found.append(f"{key}: http:// to {host}: sign-in and tokens cross the network unencrypted, and cookies "
                         "are not Secure; serve https (TLS in front) and give the https URL")
    return found


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
