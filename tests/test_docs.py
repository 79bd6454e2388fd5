"""What the operator's pages say, held to the service: docs/guide/operations.md's alert rules,
docs/not.md's list of what tokensvc does not do, and docs/guide/administration.md's ownership of a
file's installations."""

from __future__ import annotations

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
    """docs/not.md says what a refresh does and does not do, that there is no second factor and
    no TLS of tokensvc's own; each as the service has it."""
    said = bullets((DOCS / "not.md").read_text())
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
