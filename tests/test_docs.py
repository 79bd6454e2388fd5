"""What the operator's pages say, held to the service: docs/guide/operations.md's alert rules,
docs/guide/not.md's list of what tokensvc does not do, docs/guide/administration.md's ownership of
a file's installations, and the references: every key of the configuration in
docs/reference/configuration.md, every metric in docs/reference/metrics.md."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from helpers import make_config

from tokensvc import config
from tokensvc.cli import main as cli

DOCS = Path(__file__).resolve().parent.parent / "docs"
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


@pytest.mark.gen_test
async def test_the_alert_rules_are_as_many_as_the_page_says_and_watch_metrics_the_service_has(http_client,
                                                                                                 base_url):
    """The page said "Three alert rules" over four."""
    page = (DOCS / "guide" / "operations.md").read_text()
    said, block = re.search(r"\n(\w+) alert rules worth having:\n\n```yaml\n(.*?)```", page, re.S).groups()
    rules = yaml.safe_load(block)["groups"][0]["rules"]
    assert NUMBERS[said.lower()] == len(rules), (said, [rule["alert"] for rule in rules])
    exposition = (await http_client.fetch(base_url + "/metrics")).body.decode()
    for rule in rules:
        for name in re.findall(r"tokensvc_[a-z_]+", rule["expr"]):
            assert f"# TYPE {name} " in exposition, (rule["alert"], name)


def bullets(page: str) -> dict[str, str]:
    """The page's list, by the bold words each item starts with."""
    return {match[0]: match[1] for match in re.findall(r"^- \*\*(.+?)\*\*(.*?)(?=^- |\Z)", page, re.S | re.M)}


@pytest.mark.gen_test
async def test_what_tokensvc_is_not_holds_refresh_a_second_factor_and_tls(http_client, base_url):
    """docs/guide/not.md says what a refresh does and does not do, that there is no second factor and
    no TLS of tokensvc's own; each as the service has it."""
    said = bullets((DOCS / "guide" / "not.md").read_text())
    refresh = next(text for title, text in said.items() if "refresh_token" in title and "grant" in title)
    assert "/oauth/token/refresh" in refresh and "never widens" in refresh and "web session" in refresh
    metadata = (await http_client.fetch(base_url + "/.well-known/oauth-authorization-server")).body.decode()
    assert '"grant_types_supported":["authorization_code"]' in metadata
    assert any(title.startswith("No second factor") for title in said)
    assert any(title.startswith("No TLS") for title in said)
    options = {action.dest for action in cli.build_parser()._subparsers._group_actions[0].choices["serve"]._actions}
    assert not {name for name in options | set(config.SECTIONS) if "tls" in name or "ssl" in name or "cert" in name}


def test_the_operators_of_a_files_installation_are_users_of_the_file():
    """docs/guide/administration.md: a name in an installation's ``operators`` must be a [[users]]
    entry of the same file, whoever else the store holds."""
    page = (DOCS / "guide" / "administration.md").read_text()
    assert "**The operators of a file's installation are users of the file.**" in page
    installation = {"installation_id": "dome", "name": "Dome", "kind": "observatory", "operators": ["erin"]}
    with pytest.raises(config.ConfigError) as refused:
        make_config(installations=[installation])  # erin may be a user of the admin API's: not the file's
    assert refused.value.problems == ["installations[0].operators[0]: unknown user 'erin'"]
    assert f"`{refused.value.problems[0]}`" in page


def table_keys(page: str) -> dict[str, set[str]]:
    """The keys in the first column of each table of ``page``, by the heading above the table
    (its text, with the paragraphs between)."""
    found: dict[str, set[str]] = {}
    for block in re.split(r"^(?=## )", page, flags=re.M):
        firsts = re.findall(r"^\| ((?:`[^`]+`(?:, )?)+) \|", block, re.M)
        found[block] = {name for first in firsts for name in re.findall(r"`([^`]+)`", first)}
    return found


def given(cls: type) -> list[str]:
    """The keys a file or the environment may give of a settings class: not those made from others."""
    return [field.name for field in dataclasses.fields(cls) if not field.metadata.get("made")]


def test_every_key_of_the_configuration_has_its_row_in_the_reference():
    """A key added to the settings and not to docs/reference/configuration.md fails here: a
    top-level key by its name, a section's as ``section.key`` or under the section's heading, a
    seeded table's field under its ``[[table]]`` heading."""
    blocks = table_keys((DOCS / "reference" / "configuration.md").read_text())
    every = set().union(*blocks.values())
    sections = set(config.SECTIONS) | set(config.TABLES) | {"scopes"}
    missing = [name for name in given(config.Settings) if name not in sections and name not in every]
    for section, cls in config.SECTIONS.items():
        under = set().union(*(keys for block, keys in blocks.items() if f"`[{section}]`" in block))
        missing += [f"{section}.{name}" for name in given(cls)
                    if f"{section}.{name}" not in every and name not in under]
    for table, cls in config.TABLES.items():
        under = set().union(*(keys for block, keys in blocks.items() if block.startswith(f"## `[[{table}]]`")))
        missing += [f"[[{table}]] {name}" for name in given(cls) if name not in under]
    assert not missing, missing



def commands_of(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """Every command of the parser that runs, as ``"clients add"``, with its option strings."""
    groups = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not groups:
        return {" ".join(path): {option for action in parser._actions for option in action.option_strings
                                 if not isinstance(action, argparse._HelpAction)}}
    return {name: options for command, sub in groups[0].choices.items()
            for name, options in commands_of(sub, (*path, command)).items()}


def test_every_command_and_option_of_the_parser_has_its_row_in_the_reference():
    """A command or an option added to the parser and not to docs/reference/command-line.md
    fails here. A row of a table names its commands in the first cell, ``clients add`` or a
    whole group as ``clients``, and one option in the second."""
    page = (DOCS / "reference" / "command-line.md").read_text()
    rows = [[re.findall(r"`([^`]+)`", cell) for cell in line.strip("|").split(" | ")[:2]]
            for line in page.splitlines() if line.startswith("| `")]
    named: set[str] = set()
    documented: set[tuple[str, str]] = set()
    for commands, options in rows:
        words = [[word for word in command.split() if re.fullmatch(r"[a-z][a-z-]*", word)] for command in commands]
        named.update(" ".join(command) for command in words)
        documented.update((" ".join(command), re.split(r"[ =]", option)[0]) for command in words for option in options)
    parser = cli.build_parser()
    missing = [command for command in commands_of(parser) if command not in named]
    for command, options in commands_of(parser).items():
        prefixes = {" ".join(command.split()[:length]) for length in range(1, len(command.split()) + 1)}
        missing += [f"{command} {option}" for option in sorted(options)
                    if not any((prefix, option) in documented for prefix in prefixes)]
    top = {option for action in parser._actions for option in action.option_strings} - {"-h", "--help"}
    missing += [option for option in top if f"tokensvc {option}" not in page]
    assert not missing, missing

@pytest.mark.gen_test
async def test_every_metric_the_service_exposes_has_its_row_in_the_reference(http_client, base_url):
    """A metric added to the service and not to docs/reference/metrics.md fails here, and a row
    of the page names no metric the service lacks."""
    rows = set(re.findall(r"^\| `(tokensvc_[a-z_]+)` \|", (DOCS / "reference" / "metrics.md").read_text(), re.M))
    exposition = (await http_client.fetch(base_url + "/metrics")).body.decode()
    exposed = set(re.findall(r"^# TYPE (tokensvc_[a-z_]+) ", exposition, re.M))
    exposed -= {name for name in exposed if name.endswith("_created")}  # the library's creation times
    assert exposed and exposed == rows, (sorted(exposed - rows), sorted(rows - exposed))
