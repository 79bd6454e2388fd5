"""What ``tokensvc gate`` is told: a TOML file of its own (never the service's), the client
secret from the environment when the file names none, and the command line's flags.

Every problem of the file is found at once and said one line each (:class:`GateConfigError`), each
naming the file; a file that cannot be read (a device, a pipe, a byte order mark) is one line.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from tokensvc import tomlfile
from tokensvc.resource.settings import Settings

SECRET_ENV = "TOKENSVC_GATE_CLIENT_SECRET"
# What the [verifier] table may set: the library's settings but those the gate's own keys give.
VERIFIER_KEYS = tuple(name for name in Settings.__dataclass_fields__
                      if name not in ("base_url", "client_id", "client_secret", "realm"))
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
TOP_KEYS = frozenset(("tokensvc_url", "client_id", "client_secret", "host", "port", "realm", "scope", "rules",
                      "verifier", "log_level", "log_format"))
LOG_LEVELS = ("debug", "info", "warning", "error")


class GateConfigError(Exception):
    """The gate's configuration refused: every problem, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(slots=True, frozen=True)
class Rule:
    """The scope a request needs when its path starts with ``prefix`` (whole segments: ``/notes``
    matches ``/notes`` and ``/notes/1``, never ``/notesx``) and, when ``methods`` names any, its
    method is one of them. ``scope`` empty: any active token."""

    prefix: str
    scope: str
    methods: frozenset[str] = frozenset()

    def matches(self, method: str, path: str) -> bool:
        """Whole segments, in any case: many frameworks route ``/NOTES`` as ``/notes``, so a
        rule never lets a change of case past it."""
        if self.methods and method not in self.methods:
            return False
        prefix, path = self.prefix.rstrip("/").casefold(), path.casefold()
        return path == prefix or path.startswith(prefix + "/") or not prefix


@dataclass(slots=True)
class GateSettings:
    """The gate's settings: where tokensvc is, the resource server's credentials, where the gate
    listens, the scopes each request needs, and the verifier's own settings."""

    tokensvc_url: str
    client_id: str
    client_secret: str
    host: str = "127.0.0.1"
    port: int = 8090
    realm: str = "api"
    scope: str = ""  # what a request no rule matches needs; empty: any active token
    rules: tuple[Rule, ...] = ()
    verifier: dict[str, Any] = field(default_factory=dict)
    log_level: str = "info"
    log_format: str = "text"

    def required_scope(self, method: str, path: str) -> str:
        """The scope a request needs: the first rule's that matches it, else :attr:`scope`."""
        for rule in self.rules:
            if rule.matches(method, path):
                return rule.scope
        return self.scope

    def verifier_settings(self) -> Settings:
        return Settings(self.tokensvc_url, self.client_id, self.client_secret, realm=self.realm, **self.verifier)


def load(path: str | None, *, host: str | None = None, port: int | None = None,
         environ: dict[str, str] | None = None) -> GateSettings:
    """The settings of the file at ``path`` (None: the environment and flags alone cannot name
    tokensvc, so a file is needed), with ``host`` and ``port`` from the command line over it."""
    environ = dict(os.environ) if environ is None else environ
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomlfile.read(path)
        except tomlfile.FileRefused as exc:  # it names the file
            raise GateConfigError([str(exc)]) from None
    if environ.get(SECRET_ENV):
        raw["client_secret"] = environ[SECRET_ENV]
    if host:
        raw["host"] = host
    if port is not None:
        raw["port"] = port
    try:
        return from_dict(raw)
    except GateConfigError as exc:
        if path is None:
            raise
        raise GateConfigError([f"{path}: {problem}" for problem in exc.problems]) from None


def from_dict(raw: dict[str, Any]) -> GateSettings:
    problems = [f"{key}: not a setting of the gate" for key in sorted(raw.keys() - TOP_KEYS)]
    for key in ("tokensvc_url", "client_id"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            problems.append(f"{key}: required (a string)")
    if not isinstance(raw.get("client_secret"), str) or not raw.get("client_secret"):
        problems.append(f"client_secret: required (or in {SECRET_ENV})")
    url = raw.get("tokensvc_url")
    if isinstance(url, str) and url and not url.startswith(("http://", "https://")):
        problems.append("tokensvc_url: an http:// or https:// URL")
    for key in ("host", "realm", "scope"):
        if key in raw and not isinstance(raw[key], str):
            problems.append(f"{key}: a string")
    if isinstance(raw.get("scope"), str) and " " in raw["scope"]:
        problems.append("scope: one scope")
    port = raw.get("port", 8090)
    if type(port) is not int or not 0 < port < 65536:
        problems.append("port: 1-65535")
    if raw.get("log_level", "info") not in LOG_LEVELS:
        problems.append(f"log_level: one of {', '.join(LOG_LEVELS)}")
    if raw.get("log_format", "text") not in ("text", "json"):
        problems.append("log_format: text or json")
    rules = _rules(raw.get("rules", []), problems)
    verifier = raw.get("verifier", {})
    if not isinstance(verifier, dict):
        problems.append("verifier: a table")
        verifier = {}
    for key, value in verifier.items():
        if key not in VERIFIER_KEYS:
            problems.append(f"verifier.{key}: not a setting of the verifier (one of {', '.join(VERIFIER_KEYS)})")
        elif key == "audience":
            if not isinstance(value, str) or not value:
                problems.append("verifier.audience: the resource URI this API serves (a string)")
        elif key == "require_audience":
            if not isinstance(value, bool):
                problems.append("verifier.require_audience: true or false")
        elif type(value) not in (int, float) or value <= 0:
            problems.append(f"verifier.{key}: a positive number")
    if problems:
        raise GateConfigError(problems)
    known = {name for name in GateSettings.__dataclass_fields__}
    values = {key: value for key, value in raw.items() if key in known and key not in ("rules", "verifier")}
    settings = GateSettings(**values, rules=rules, verifier=dict(verifier))
    return dataclasses.replace(settings, tokensvc_url=settings.tokensvc_url.rstrip("/"))


def _rules(entries: Any, problems: list[str]) -> tuple[Rule, ...]:
    if not isinstance(entries, list):
        problems.append("rules: an array of tables ([[rules]])")
        return ()
    rules = []
    for index, entry in enumerate(entries):
        where = f"rules[{index}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: a table")
            continue
        for key in sorted(entry.keys() - {"prefix", "scope", "methods"}):
            problems.append(f"{where}.{key}: not a setting of a rule (prefix, scope, methods)")
        prefix, scope, methods = entry.get("prefix"), entry.get("scope"), entry.get("methods", [])
        if not isinstance(prefix, str) or not prefix.startswith("/"):
            problems.append(f"{where}.prefix: a path that starts with /")
        if not isinstance(scope, str) or " " in scope:
            problems.append(f"{where}.scope: one scope, or \"\" for any active token")
        if not isinstance(methods, list) or not all(isinstance(m, str) and m.upper() in METHODS for m in methods):
            problems.append(f"{where}.methods: a list of HTTP methods ({', '.join(sorted(METHODS))})")
            methods = []
        if isinstance(prefix, str) and isinstance(scope, str):
            rules.append(Rule(prefix, scope, frozenset(m.upper() for m in methods)))
    return tuple(rules)
