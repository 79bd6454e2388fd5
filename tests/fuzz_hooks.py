"""schemathesis hooks of tests/test_fuzz.py's runs (``SCHEMATHESIS_HOOKS=fuzz_hooks``): whose
access token each run carries, and what it never does with it.

Over the public API the run acts as alice through the web app (``read write``); over the admin
API as the admin ``root`` through the command line's client. It may do anything such a caller
may, except to the identity it acts as: it never removes, demotes, re-passwords or replaces
root, nor the ``tokensvc-cli`` client, nor revokes the grant of its own token (the rest of the
run would then be refused, and check nothing). ``POST /admin/plan`` may name them as it likes:
a plan writes nothing, whatever it holds, and never prunes them
(tests/test_admin_api.py::test_a_plan_writes_nothing_whoever_it_names). A run that loses its
token all the same fails on schemathesis's missing_auth warning (tests/schemathesis.toml).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import requests
import schemathesis
from service import WEBAPP_SECRET, access_token

from tokensvc.identifiers import username_key

ADMIN = os.environ.get("TOKENSVC_FUZZ_AS") == "admin"
# Each as the service finds it: a username by its key (``ROOT`` and ``ｒｏｏｔ`` are root), a
# client id as it is.
ACTING_AS = {"username": ("root", username_key), "client_id": ("tokensvc-cli", str)}


def acts_on_itself(case: Any) -> bool:
    """Whether ``case`` changes or removes the identity the run acts as."""
    if not ADMIN or case.method.upper() in ("GET", "HEAD"):
        return False
    parameters = case.path_parameters or {}
    return any(isinstance(parameters.get(name), str) and key(parameters[name]) == value
               for name, (value, key) in ACTING_AS.items())


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    """No call that changes or removes the identity the run acts as: root (by any name that is
    root's: ``ROOT`` is root), the ``tokensvc-cli`` client, the grant the run's token is of
    (the stateful phase finds its id in ``GET /admin/grants``)."""
    if acts_on_itself(case):
        return False
    if not ADMIN or case.method.upper() in ("GET", "HEAD"):
        return True
    return (case.path_parameters or {}).get("grant_id") not in own_grants()


@functools.cache
def run_token() -> str:
    """The run's access token, from the code flow with PKCE once, as the client would."""
    base = os.environ["TOKENSVC_FUZZ_PUBLIC"]
    if ADMIN:
        return access_token(base, "tokensvc-cli", "http://127.0.0.1:9/callback", "admin", "root",
                            "quartz-river-beacon")
    return access_token(base, "webapp", "http://127.0.0.1:1/callback", "read write", "alice",
                        "violet-tide-anchor", WEBAPP_SECRET)


@functools.cache
def own_grants() -> frozenset[str]:
    """The ids of root's grants to the command line's client: the run's token is of one."""
    answer = requests.get(os.environ["TOKENSVC_FUZZ_ADMIN"] + "/admin/grants",
                          params={"username": ACTING_AS["username"][0], "clientId": ACTING_AS["client_id"][0]},
                          headers={"Authorization": f"Bearer {run_token()}"}, timeout=10)
    answer.raise_for_status()
    return frozenset(grant["grantId"] for grant in answer.json()["items"])


@schemathesis.auth(refresh_interval=24 * 3600, retry_on=[])  # one token for the run
class SignedIn:
    """The run's token on every call."""

    def get(self, case: Any, context: Any) -> str:
        return run_token()

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@schemathesis.hook
def before_call(context: Any, case: Any, **kwargs: Any) -> None:
    """A header named Host among those the run makes up is not sent: it would address a server
    the documents' ``servers`` do not describe, which the service refuses on every route alike
    (400, an unknown host: tests/test_pages.py::test_only_the_configured_host_names_are_served)."""
    if case.headers and any(name.lower() == "host" for name in case.headers):
        case.headers = {name: value for name, value in case.headers.items() if name.lower() != "host"}
