"""The layering ARCHITECTURE.md states, checked: the protocol layer (``tokensvc.oauth``) loads
neither the configuration nor a web framework, a database driver or a metrics library, and
reports what it counts through an interface the service's metrics implement; no module imports
in a circle or from a layer above its own; only the MongoDB store imports the driver; and no
module takes another's private names."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import tokensvc
from tokensvc.oauth.metrics import ProtocolMetrics
from tokensvc.telemetry.metrics import Metrics

# What importing every module of tokensvc.oauth must not load.
FOREIGN = ("tokensvc.config", "prometheus_client", "tornado", "pymongo", "bson", "motor", "tokensvc.telemetry.metrics",
           "tokensvc.handlers", "tokensvc.app")

PROGRAM = """
import importlib, json, pkgutil, sys
import tokensvc.oauth
for module in pkgutil.iter_modules(tokensvc.oauth.__path__):
    importlib.import_module("tokensvc.oauth." + module.name)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.process
def test_the_protocol_layer_loads_no_configuration_framework_driver_or_metrics_library():
    """In a fresh interpreter (this one has loaded everything already)."""
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120,
                            check=True)
    loaded = json.loads(result.stdout)
    assert "tokensvc.oauth.grants" in loaded and "tokensvc.oauth.metrics" in loaded  # the walk imported them
    assert [name for name in loaded if name.split(".")[0] in FOREIGN or name.startswith(FOREIGN)] == []


def test_the_services_metrics_implement_what_the_protocol_reports():
    reported = {name: inspect.signature(member) for name, member in vars(ProtocolMetrics).items()
                if inspect.isfunction(member) and not name.startswith("_")}
    assert len(reported) >= 8
    for name, signature in reported.items():
        assert inspect.signature(getattr(Metrics, name)) == signature, name


def test_each_report_reaches_its_series():
    metrics = Metrics()
    reports: ProtocolMetrics = metrics
    reports.issued("refresh_token")
    reports.revoked_families("reuse", 3)
    reports.revoked_access_token()
    reports.reused_code()
    reports.reused_refresh_token()
    reports.failed_client_auth()
    reports.failed_login()
    reports.refused_by_limit("login")
    value = metrics.registry.get_sample_value
    assert value("tokensvc_tokens_issued_total", {"grant": "refresh_token"}) == 1
    assert value("tokensvc_token_families_revoked_total", {"reason": "reuse"}) == 3
    assert value("tokensvc_access_tokens_revoked_total") == 1
    assert value("tokensvc_code_reuse_total") == value("tokensvc_refresh_reuse_total") == 1
    assert value("tokensvc_client_auth_failures_total") == value("tokensvc_login_failures_total") == 1
    assert value("tokensvc_rate_limited_total", {"kind": "login"}) == 1


# -- the import graph, read from the sources ------------------------------------------------------

PACKAGE = Path(tokensvc.__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class Imported:
    """One import of a tokensvc module: what it names, and whether only a type checker runs it."""

    module: str  # the tokensvc module (or package) imported
    names: tuple[str, ...]  # the names taken from it (``from module import names``); () for ``import module``
    typing_only: bool


def module_names() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = module_names()


@functools.cache
def tree_of(path: Path) -> ast.Module:
    """The module at ``path``, parsed once for every test here (none changes a tree)."""
    return ast.parse(path.read_text())


@functools.cache
def imports_of(path: Path) -> tuple[Imported, ...]:
    """Every import of a tokensvc module in ``path``: at its top, in a function, or under
    ``if TYPE_CHECKING:`` (``typing_only``). ``from package import module`` imports the module."""
    tree = tree_of(path)
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for node in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Imported(alias.name, (), id(node) in typing_only) for alias in node.names
                      if alias.name.split(".")[0] == "tokensvc"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tokensvc":
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in MODULES:
                    found.append(Imported(submodule, (), id(node) in typing_only))
                else:
                    found.append(Imported(node.module, (alias.name,), id(node) in typing_only))
    return tuple(found)


def graph(typing_too: bool) -> dict[str, set[str]]:
    """Each tokensvc module and the tokensvc modules it imports (with ``typing_too``, those it
    imports for type checking alone as well)."""
    return {name: {imported.module for imported in imports_of(path)
                   if imported.module != name and (typing_too or not imported.typing_only)}
            for name, path in MODULES.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each set of modules that import one another, round (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in edges.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == module:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_the_import_graph_is_read_whole():
    edges = graph(typing_too=True)
    assert len(edges) > 100 and "tokensvc.storage.mongo.lifecycle" in edges["tokensvc.storage.mongo.store"]
    assert "tokensvc.storage.mongo.connection" in edges["tokensvc.storage.mongo.retry"]  # for type checking alone
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_in_a_circle():
    """What runs: the imports at a module's top and in its functions (a function's import that
    closes a circle is a circle all the same)."""
    assert circles(graph(typing_too=False)) == []


def test_not_even_a_type_checker_goes_round_anywhere():
    """The web edge too: what every route shares (``Edge``, its renderer) lives beside the
    exit, so the exit and the lifecycle do not import each other, not even for a type checker."""
    assert circles(graph(typing_too=True)) == []


def test_below_the_web_edge_not_even_a_type_checker_goes_round():
    """The storage, the protocol and every module outside the web edge import in no circle,
    counting the imports a type checker alone runs: a circle of annotations ties the modules
    together as much as one of code."""
    found = circles(graph(typing_too=True))
    assert [members for members in found if not all(m.startswith("tokensvc.handlers.") for m in members)] == []


# The layers below the rest of the house, from the bottom up (ARCHITECTURE.md, The layers). A module
# of a layer imports from its own layer and those below it; never from a layer above, nor from
# the rest of the house (the web edge, the configuration, the operator's modules, the command
# line), which stands on them all. "tokensvc" alone is the package itself (its __version__).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tokensvc", "tokensvc.records", "tokensvc.identifiers", "tokensvc.errors", "tokensvc.telemetry.redaction",
     "tokensvc.jsontext", "tokensvc.tomlfile"),
    ("tokensvc.storage", "tokensvc.storage.base"),  # the contract
    ("tokensvc.storage.memory", "tokensvc.storage.mongo"),  # the backends
    ("tokensvc.telemetry.logs", "tokensvc.ratelimit"),
    ("tokensvc.oauth",),
)
BACKENDS = ("tokensvc.storage.memory", "tokensvc.storage.mongo")


def within(module: str, name: str) -> bool:
    return module == name or (name != "tokensvc" and module.startswith(name + "."))


def layer_of(module: str) -> tuple[int, str] | None:
    """The layer of ``module`` and the entry that places it (the longest that names it); None
    for the rest of the house."""
    entries = [(len(name), index, name) for index, names in enumerate(LAYERS) for name in names if within(module, name)]
    if not entries:
        return None
    _, index, name = max(entries)
    return index, name


# The rest of the house, from the bottom up (ARCHITECTURE.md, The layers): each package stands on
# the layers above (LAYERS) and on the packages before it here, never on one after it. The
# library a resource server imports first (it stands on the bottom layer alone), with the gate
# built on it alone; the settings
# and the schemas; then the metrics; start-up; the operator's work; the OpenAPI documents (the
# admin API's operations are the operator's); the web edge's machinery, then the endpoints on
# it; the composition root; the command line, which runs it all.
HOUSE: tuple[tuple[str, ...], ...] = (
    ("tokensvc.resource", "tokensvc.gate"),
    ("tokensvc.config", "tokensvc.schemas"),
    ("tokensvc.telemetry.metrics", "tokensvc.telemetry.request_metrics"),
    ("tokensvc.bootstrap",),
    ("tokensvc.admin",),
    ("tokensvc.openapi",),
    ("tokensvc.handlers.edge",),
    ("tokensvc.handlers",),
    ("tokensvc.app",),
    ("tokensvc.cli", "tokensvc.__main__"),
)


def house_layer_of(module: str) -> int | None:
    """The layer of ``module`` in the rest of the house (the longest entry that names it)."""
    entries = [(len(name), index) for index, names in enumerate(HOUSE) for name in names if within(module, name)]
    return max(entries)[1] if entries else None


def test_every_module_has_its_place():
    """Each module is placed once: in a layer below the rest of the house or in the house's
    own order (the packages' own ``__init__`` that import nothing stand outside both)."""
    edges = graph(typing_too=True)
    unplaced = [module for module in edges if layer_of(module) is None and house_layer_of(module) is None
                and (edges[module] or MODULES[module].name != "__init__.py")]
    twice = [module for module in edges if layer_of(module) is not None and house_layer_of(module) is not None]
    assert unplaced == [] and twice == []


def test_the_rest_of_the_house_imports_down_its_own_order():
    """The web edge's machinery imports no endpoint, the operator's work no web edge, the
    settings nothing of what starts the service, and nothing imports the command line."""
    edges = graph(typing_too=True)
    assert house_layer_of("tokensvc.handlers.edge.exit") == 6 and house_layer_of("tokensvc.handlers.token") == 7
    upward = [(module, imported) for module in edges if (mine := house_layer_of(module)) is not None
              for imported in edges[module] if (theirs := house_layer_of(imported)) is not None and theirs > mine]
    assert upward == []


def test_no_module_imports_a_layer_above_its_own():
    edges = graph(typing_too=True)
    placed = [module for module in edges if layer_of(module) is not None]
    assert "tokensvc.storage.mongo.store" in placed and "tokensvc.oauth.grants" in placed
    assert layer_of("tokensvc.handlers.edge.exit") is None and layer_of("tokensvc.config") is None
    upward = [(module, imported) for module in placed for imported in edges[module]
              if layer_of(imported) is None or layer_of(imported)[0] > layer_of(module)[0]]
    assert upward == []


def test_the_storage_backends_import_the_contract_never_each_other():
    edges = graph(typing_too=True)
    crossing = [(module, imported) for module in edges for imported in edges[module] for backend in BACKENDS
                if within(module, backend) and any(within(imported, other) for other in BACKENDS if other != backend)]
    assert crossing == []
    assert all(not any(within(imported, backend) for backend in BACKENDS)
               for imported in edges["tokensvc.storage"] | edges["tokensvc.storage.base"])


def test_the_configuration_imports_nothing_of_the_protocol():
    """The settings stand beside the protocol layer, not on it: no module of ``tokensvc.config``
    imports ``tokensvc.oauth`` (nor the other way round: the protocol loads no configuration),
    counting the imports a type checker alone runs."""
    edges = graph(typing_too=True)
    config = [module for module in edges if within(module, "tokensvc.config")]
    assert "tokensvc.config.checks" in config and "tokensvc.config.settings" in config
    assert [(module, imported) for module in config for imported in edges[module]
            if within(imported, "tokensvc.oauth")] == []
    assert [(module, imported) for module in edges if within(module, "tokensvc.oauth") for imported in edges[module]
            if within(imported, "tokensvc.config")] == []


# The modules at tokensvc's top, beside its packages (admin, cli, config, handlers, oauth, openapi,
# resource, storage, telemetry): what every layer shares, and the composition root.
TOP_MODULES_AT_MOST = 8


def test_the_top_level_holds_few_modules_and_the_packages_show_the_layers():
    top = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem not in ("__init__", "__main__"))
    assert len(top) <= TOP_MODULES_AT_MOST, top
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert {"admin", "cli", "config", "handlers", "oauth", "openapi", "resource", "storage", "telemetry"} <= packages


def test_only_the_mongodb_store_imports_the_driver():
    """Everything that imports pymongo (or bson, motor) lives in ``tokensvc.storage.mongo``."""
    drivers = ("pymongo", "bson", "motor")
    outside = []
    for name, path in MODULES.items():
        if within(name, "tokensvc.storage.mongo"):
            continue
        for node in ast.walk(tree_of(path)):
            if isinstance(node, ast.Import):
                outside += [(name, alias.name) for alias in node.names if alias.name.split(".")[0] in drivers]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in drivers:
                outside.append((name, node.module))
    assert outside == []


def test_no_module_takes_a_private_name_of_another():
    """A name with a leading underscore is its module's own: no other module imports it, nor
    reaches it through the module (what two modules share is public in the one that owns it)."""
    taken = []
    for name, path in MODULES.items():
        tree = tree_of(path)
        aliases = {}  # the names bound to tokensvc modules here
        for imported in imports_of(path):
            taken += [(name, f"{imported.module}.{private}") for private in imported.names
                      if private.startswith("_") and not private.startswith("__")]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tokensvc":
                aliases.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names
                                if f"{node.module}.{alias.name}" in MODULES})
            elif isinstance(node, ast.Import):
                aliases.update({alias.asname or alias.name: alias.name for alias in node.names
                                if alias.name.split(".")[0] == "tokensvc"})
        taken += [(name, f"{aliases[node.value.id]}.{node.attr}") for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                  and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert taken == []


def test_each_protocol_function_asks_storage_for_the_concern_it_uses():
    """A function of ``tokensvc.oauth`` that takes storage takes the concern it uses
    (``Registry``, ``Authorizations``, ``Sessions``, ``Housekeeping``, or
    ``RegistryAndAuthorizations`` for both), never the whole ``Store`` (the type checker holds
    each to its concern); the protocol's context alone carries the whole store."""
    concerns = {"Registry", "Authorizations", "Sessions", "Housekeeping", "FailureCounts", "RegistryAndAuthorizations"}
    whole, asked = [], set()
    for name, path in MODULES.items():
        if not within(name, "tokensvc.oauth"):
            continue
        for node in ast.walk(tree_of(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for argument in [*node.args.args, *node.args.kwonlyargs]:
                    annotation = ast.unparse(argument.annotation) if argument.annotation else ""
                    if annotation == "Store":
                        whole.append(f"{name}.{node.name}({argument.arg})")
                    elif annotation in concerns:
                        asked.add(annotation)
    assert whole == []
    assert {"Registry", "Authorizations", "Housekeeping", "RegistryAndAuthorizations"} <= asked


# -- the handlers' one vocabulary -----------------------------------------------------------------

ENDPOINTS = [name for name in MODULES if within(name, "tokensvc.handlers")
             and not within(name, "tokensvc.handlers.edge") and name != "tokensvc.handlers"]


def test_the_decisions_a_handler_class_carries_are_listed_in_one_place():
    """Every class attribute that carries a security decision is named in the handlers' base
    and in CONTRIBUTING.md, and each attribute of the bases an endpoint sets is one of them."""
    from tokensvc.handlers.edge.auth import AuthMixin
    from tokensvc.handlers.edge.inputs import SECURITY_ATTRIBUTES, RequestInput
    from tokensvc.handlers.edge.json_handler import JsonHandler
    from tokensvc.handlers.edge.web_handler import WebHandler

    contributing = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    bases = (RequestInput, JsonHandler, WebHandler, AuthMixin)
    for name in SECURITY_ATTRIBUTES:
        assert f"``{name}``" in (RequestInput.__doc__ or "") and f"`{name}`" in contributing, name
        assert any(hasattr(base, name) for base in bases), name
    set_by_endpoints = set()
    for module in ENDPOINTS:
        for node in ast.walk(tree_of(MODULES[module])):
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    targets = statement.targets if isinstance(statement, ast.Assign) else \
                        [statement.target] if isinstance(statement, ast.AnnAssign) else []
                    set_by_endpoints |= {target.id for target in targets if isinstance(target, ast.Name)}
    overridden = {name for name in set_by_endpoints if any(hasattr(base, name) for base in bases)}
    assert {"cors", "reads_session", "default_headers", "max_body", "accept_query_token"} <= overridden
    assert overridden <= set(SECURITY_ATTRIBUTES), overridden - set(SECURITY_ATTRIBUTES)


def test_no_endpoint_writes_through_tornado():
    """An endpoint answers whole (``send_json``, ``send``, ``render``, ``redirect``) or raises;
    Tornado's ``write``, ``flush`` and ``finish`` are the adapters' alone."""
    assert "tokensvc.handlers.token" in ENDPOINTS and "tokensvc.handlers.pages" in ENDPOINTS
    written = []
    for module in ENDPOINTS:
        for node in ast.walk(tree_of(MODULES[module])):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self" \
                    and node.func.attr in ("write", "flush", "finish"):
                written.append((module, node.func.attr))
    assert written == []
