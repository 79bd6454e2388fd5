"""``tokensvc gate``: a forward-auth decision for nginx ``auth_request``, Traefik's ForwardAuth
and Envoy's HTTP ext_authz, built on :mod:`tokensvc.resource` (a token introspected once, its
answer cached, the revocation feed followed), so that an API in any language is protected as a
Python one is.

:mod:`.settings` reads its configuration, :mod:`.gate` decides (no web framework), and
:mod:`.server` serves the checks, health and readiness.
"""

from tokensvc.gate.gate import Decision, Gate
from tokensvc.gate.settings import GateConfigError, GateSettings, Rule, load

__all__ = ["Decision", "Gate", "GateConfigError", "GateSettings", "Rule", "load"]
