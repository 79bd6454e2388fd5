"""Stage 4 of the settings, **checked**: each section's rules on the frozen settings, every rule
of an identifier taken from :mod:`tokensvc.identifiers`; and what is valid but no production
deployment wants (:func:`warnings`)."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from urllib.parse import urlsplit

from tokensvc.config.masking import masked_uri, mongodb_hosts
from tokensvc.config.settings import (
    HOST_NAME,
    MAX_CONSECUTIVE_FAILED_LOGINS,
    MIN_UNSENT_BYTES,
    UNIX_PEER,
    VERIFY_ONLY_SECRET_LENGTH,
    AdminSettings,
    ClientSeed,
    FeedSettings,
    InstallationSeed,
    LimitSettings,
    Say,
    Settings,
    StorageSettings,
    TokenSettings,
    UserSeed,
)
from tokensvc.identifiers import (
    KIND,
    KIND_RULE,
    MIN_SECRET_LENGTH,
    OWN_RESOURCE_PATH,
    declared_resource_problem,
    id_problem,
    is_loopback,
    is_url,
    kind_problem,
    logo_url_problem,
    origin_problem,
    password_hash_problem,
    password_problem,
    redirect_uri_problem,
    resource_key,
    resource_uri_problem,
    scope_problem,
    secret_problem,
    secret_sha256_problem,
    username_key,
    username_problem,
    within_own_resource,
)
from tokensvc.records import CLIENT_KINDS, RESOURCE_SERVER


def check_url(key: str, url: str, say: Say, *, schemes: tuple[str, ...] = ("http", "https")) -> bool:
    """Whether ``url`` is a URL of one of ``schemes``; if not, said."""
    if is_url(url, schemes):
        return True
    quoted = len(url) > 1 and url[0] == url[-1] and url[0] in "\"'"
    say(f"{key}: not a valid {'/'.join(schemes)} URL: {masked_uri(url)!r}"
        + (" (remove the quotes around it: docker --env-file and systemd's EnvironmentFile keep them as given)"
           if quoted else ""))
    return False


def check(settings: Settings, say: Say) -> None:
    """Each section's rules, on the settings as they will be used."""
    _check_service(settings, say)
    _check_admin(settings.admin, settings.port, say)
    _check_storage(settings.storage, say)
    _check_sections(settings, say)
    _check_clients(settings.clients, settings.demo, say)
    _check_resources(settings.clients, settings.base_url, say)
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
    if check_url("storage.mongodb_uri", storage.mongodb_uri, say, schemes=("mongodb", "mongodb+srv")):
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


def _check_resources(clients: tuple[ClientSeed, ...], base_url: str, say: Say) -> None:
    """A resource URI (RFC 8707) is one resource server's, and never tokensvc's own API
    (``base_url`` + ``/v1``): else a token meant for one API would pass at another. Compared
    canonically (identifiers.resource_key)."""
    declared: dict[str, tuple[str, str]] = {}  # key -> (client id, the URI as it wrote it)
    for i, client in enumerate(clients):
        for index, uri in enumerate(client.resources or []):
            if resource_uri_problem(uri) is not None:
                continue  # said above
            where = f"clients[{i}].resources[{index}]"
            key = resource_key(uri)
            if within_own_resource(uri, base_url):
                say(f"{where}: {uri!r} is tokensvc's own API (base_url + {OWN_RESOURCE_PATH}) or within it, which no "
                    f"resource server declares: client {client.client_id!r}")
                continue
            other, written = declared.setdefault(key, (client.client_id, uri))
            if other != client.client_id:
                say(f"{where}: {uri!r} is declared by clients {other!r} (as {written!r}) and {client.client_id!r}: "
                    "a resource URI is one resource server's")


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
            problem = declared_resource_problem(uri)
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


def warnings(settings: Settings) -> list[str]:
    """What is valid but no production deployment wants, each naming its key: ``config check``
    prints these (``--strict`` refuses them) and ``serve`` logs them at start. Demo mode is
    said once, and nothing else: it is for trying tokensvc out."""
    if settings.demo:
        return ["demo: true: weak secrets are taken and a cookie secret may be generated; for trying tokensvc out, "
                "not for production"]
    found = [f"cookie_secret[{index}]: {len(key)} characters, shorter than a key that signs: it verifies what "
             "0.10.0 signed and signs nothing; drop it once tokens.session_ttl has passed since the upgrade "
             "(docs/guide/operations.md, Rotating the cookie secret)"
             for index, key in enumerate(settings.cookie_secrets) if verify_only(index, key)]
    storage = settings.storage
    if storage.backend == "memory":
        found.append('storage.backend: "memory" keeps nothing across a restart and serves one process alone; '
                     'production uses "mongodb"')
    else:
        hosts, options = mongodb_hosts(storage.mongodb_uri)
        if hosts and all(is_loopback(host) for host in hosts):
            found.append(f"storage.mongodb_uri: names this machine alone ({', '.join(hosts)}); a production store is "
                         "a replica set of three members on hosts of their own (docs/guide/operations.md, Production "
                         "checklist)")
        if options.get("directconnection", "").lower() == "true":
            found.append("storage.mongodb_uri: directConnection=true: the driver talks to that one member and "
                         "follows no election; name the replica set's members and replicaSet= instead "
                         "(docs/guide/operations.md, Production checklist)")
    urls = {"base_url": settings.base_url, **({"auth_url": settings.auth_url}
                                              if settings.auth_url != settings.base_url else {})}
    behind_proxy = settings.server.unix_socket or is_loopback(settings.host)
    if settings.base_url.startswith("https://") and behind_proxy and not settings.xheaders:
        where = f"server.unix_socket {settings.server.unix_socket}" if settings.server.unix_socket \
            else f"host {settings.host}"
        found.append(f"xheaders: false while base_url is https and the service listens on {where}: a proxy on "
                     "this host serves it, and every client then has the proxy's address, so one client's failed "
                     'sign-ins lock every client out; set xheaders = true, server.unix_socket and '
                     'proxy.trusted_networks = ["unix"] (docs/guide/deployment.md, Behind a reverse proxy)')
    for key, url in urls.items():
        host = urlsplit(url).hostname or ""
        if url.startswith("http://") and not is_loopback(host):
            found.append(f"{key}: http:// to {host}: sign-in and tokens cross the network unencrypted, and cookies "
                         "are not Secure; serve https (TLS in front) and give the https URL")
    return found
