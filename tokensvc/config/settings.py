"""What the settings are: one frozen dataclass per section, the seeds of the configuration file's
tables, the constants the other stages share, and :class:`ConfigError`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tokensvc.identifiers import DEFAULT_KINDS
from tokensvc.records import CLIENT_KIND

ENV_PREFIX = "TOKENSVC_"
# The operator commands' own variables (tokensvc/cli/login.py): what a command line talks to,
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
# Settings whose default depends on other settings: absent from the input, filled in by resolve.
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
    # a write interrupted by a failover lands on the new primary (docs/guide/operations.md).
    timeout_ms: int = 15000
    max_pool_size: int = 100
    # How often a serving process renews its entry among the running processes and reads the
    # store's format again: a finalize reaches every process within it (docs/guide/operations.md).
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
    # either count, so that a fan-out stays short for everyone (docs/reference/configuration.md).
    # The defaults are the feed's own (oauth.feed.ReaderCaps): the settings import nothing of the protocol.
    max_readers: int = 1000  # open in this process
    max_readers_per_client: int = 100  # of one client, in this process
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
