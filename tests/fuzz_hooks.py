"""schemathesis hooks of tests/test_fuzz.py's runs (``SCHEMATHESIS_HOOKS=fuzz_hooks``): whose
access token each run carries, and what it never does with it.

Over the public API the run acts as alice through the web app (``read write``); over the admin
API as the admin ``root`` through the command line's client. It may do anything such a caller
may, except to the identity it acts as: it never removes, demotes, re-passwords or replaces
root, nor the ``tokensvc-cli`` client (the rest of the run would then be refused, and check
nothing). A run that loses its token all the same fails on schemathesis's missing_auth
warning (tests/schemathesis.toml).
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis
from service import WEBAPP_SECRET, access_token

ADMIN = os.environ.get("TOKENSVC_FUZZ_AS") == "admin"
ACTING_AS = {"username": "root", "client_id": "tokensvc-cli"}


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    """No call that changes or removes the identity the run acts as."""
    if not ADMIN or case.method.upper() in ("GET", "HEAD"):
        return True
    parameters = case.path_parameters or {}
    return not any(parameters.get(name) == value for name, value in ACTING_AS.items())


@schemathesis.auth(refresh_interval=24 * 3600, retry_on=[])  # one token for the run
class SignedIn:
    """The run's access token, from the code flow with PKCE once, as the client would."""

    def get(self, case: Any, context: Any) -> str:
        base = os.environ["TOKENSVC_FUZZ_PUBLIC"]
        if ADMIN:
            return access_token(base, "tokensvc-cli", "http://127.0.0.1:9/callback", "admin", "root",
                                "quartz-river-beacon")
        return access_token(base, "webapp", "http://127.0.0.1:1/callback", "read write", "alice",
                            "violet-tide-anchor", WEBAPP_SECRET)

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}
