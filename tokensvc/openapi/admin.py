"""The admin API's operations in its OpenAPI document (:mod:`tokensvc.openapi.document` builds it): what
each route's methods take and answer, of the parts in :mod:`tokensvc.openapi.parts`. The
bodies are ``admin/schemas.py``'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokensvc.admin import schemas as admin_schemas
from tokensvc.admin.actions import MAX_PAGE
from tokensvc.openapi.parts import (
    BEARER_401,
    FORBIDDEN,
    ID_PATTERN,
    JSON,
    NOT_FOUND,
    TOO_LARGE,
    TOO_MANY,
    UNAVAILABLE,
    json_answer,
    listed,
    parameter,
    ref,
    session_id_path,
)

SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]
REFUSED = {"401": BEARER_401, "403": FORBIDDEN, "429": TOO_MANY, "503": UNAVAILABLE}
CONFLICT = json_answer("Detail", "Already there")
# The entries the configuration file writes at every start are its own (admin.FileEntries).
FILES = "the configuration file's entry, which it writes at every start: change it there"
THE_FILES = {"409": json_answer("Detail", FILES[0].upper() + FILES[1:])}
MISSING = {"404": NOT_FOUND}
LOOKED_UP = "Any value: one that names nothing is 404"
INVALID = json_answer("HTTPValidationError", (
    "A field failed validation: each item's loc names it ([\"body\", \"redirectUris\"], [\"path\", \"client_id\"]; "
    "in a plan [\"body\", \"clients\", 0, \"name\"]), or [\"body\"] for the body as a whole"))
# The bodies a call may go without: a PATCH without one changes nothing, a plan without one
# is the plan of nothing.
OPTIONAL_BODIES = frozenset({"ClientPatch", "PlanBody", "SecretBody"})


def obj(required: bool = True, **properties: Any) -> dict[str, Any]:
    """An object schema whose every property is there (``required``)."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = sorted(properties)
    return schema


STRING, INTEGER, BOOLEAN = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
WITH_SECRET, PUT_CLIENT, PUT_INSTALLATION = "AdminClientWithSecret", "AdminClientPut", "AdminInstallationPut"


def op(summary: str, ok: dict[str, Any], *, body: str | None = None, extra: dict[str, Any] | None = None,
       parameters: list[dict[str, Any]] | None = None, status: str = "200", invalid: bool = True) -> dict[str, Any]:
    """An operation: an admin's token, 401/403/429/503 refusals, and 422 where it reads input."""
    responses = {status: ok, **REFUSED, **(extra or {})}
    if invalid:
        responses["422"] = INVALID
    operation: dict[str, Any] = {"summary": summary, "security": SECURITY, "tags": ["admin"], "responses": responses}
    if body:
        operation["requestBody"] = {"required": body not in OPTIONAL_BODIES, "content": {JSON: {"schema": ref(body)}}}
        responses["413"] = TOO_LARGE
    if parameters:
        operation["parameters"] = parameters
    return operation


def looked_up(name: str) -> dict[str, Any]:
    return parameter(name, "path", LOOKED_UP)


def new_id(name: str) -> dict[str, Any]:
    return parameter(name, "path", "The id to give it, or the one it has", pattern=ID_PATTERN, maxLength=128)


def page(item: str) -> dict[str, Any]:
    return json_answer(obj(items={"type": "array", "items": ref(item)}, next={
        "type": ["string", "null"], "description": "The cursor of the next page; null on the last"}), "A page")


def done(**fields: Any) -> dict[str, Any]:
    return json_answer(obj(**fields), "Done")


PAGING = [parameter("limit", "query", f"At most this many (default {MAX_PAGE})", type="integer", minimum=1,
                   maximum=MAX_PAGE),
          parameter("cursor", "query", "The next of the previous page")]


def operations() -> dict[str, dict[str, Any]]:
    """The admin API's routes: what each method takes and answers."""
    client, user = looked_up("client_id"), looked_up("username")
    installation = looked_up("installation_id")
    return {
        "/admin": {"get": {"summary": "Where to get an admin's token (tokensvc login starts here)", "responses": {
            "200": json_answer(obj(issuer=STRING, authorizationEndpoint=STRING, tokenEndpoint=STRING,
                                   cliClientId={"type": ["string", "null"]}),
                               "The service's token endpoints and the command line's client")}}},
        "/admin/clients": {
            "get": op("Registered clients, a page at a time", page("AdminClient"), parameters=PAGING),
            "post": op("Register a client (its id given, or a random one); a confidential one's secret once",
                       json_answer(WITH_SECRET, "Registered"), body="ClientBody", extra={"409": CONFLICT},
                       status="201")},
        "/admin/clients/{client_id}": {
            "get": op("One client", json_answer("AdminClientShown", "The client"), parameters=[client], extra=MISSING),
            "put": op("Create or replace a client (idempotent)", json_answer(PUT_CLIENT, "Replaced"),
                      body="ClientPutBody", parameters=[new_id("client_id")],
                      extra={"201": json_answer(PUT_CLIENT, "Created"),
                             "409": json_answer("Detail", f"Registered meanwhile, or {FILES}")}),
            "patch": op("Change some of a client's fields", json_answer(WITH_SECRET, "Changed"), body="ClientPatch",
                        parameters=[client], extra={**MISSING, **THE_FILES}),
            "delete": op("Remove a client: gone at once, then its grants revoked in batches; a 503 leaves it gone, "
                         "and the same DELETE again (or the next start-up) finishes it",
                         done(removed=STRING, grantsRevoked=INTEGER), parameters=[client],
                         extra={**MISSING, **THE_FILES})},
        "/admin/clients/{client_id}/secret": {"post": op(
            "A new secret, returned once (a confidential client's; a public one has none: 409); the old one keeps "
            "working for keepPreviousSeconds",
            json_answer("SecretRotated", "Rotated"), body="SecretBody", parameters=[client],
            extra={**MISSING, "409": json_answer("Detail", f"A public client (it has no secret), or {FILES}")})},
        "/admin/users": {
            "get": op("Users, a page at a time", page("AdminUser"), parameters=PAGING),
            "post": op("Add a user (the password rule applies)", json_answer("AdminUser", "Added"), body="UserBody",
                       extra={"409": CONFLICT}, status="201")},
        "/admin/users/{username}": {
            "get": op("One user", json_answer("AdminUser", "The user"), parameters=[user], extra=MISSING),
            "patch": op("Make a user an admin, or not", json_answer("AdminUser", "Changed"), body="UserPatch",
                        parameters=[user], extra={**MISSING, **THE_FILES}),
            "delete": op("Remove a user, revoking their grants and ending their sessions",
                         done(removed=STRING, familiesRevoked=INTEGER), parameters=[user],
                         extra={**MISSING, **THE_FILES})},
        "/admin/users/{username}/password": {"put": op(
            "Set a password: ends the user's sessions, revokes their grants unless keepGrants",
            done(username=STRING, sessionsEnded=INTEGER, familiesRevoked=INTEGER), body="PasswordBody",
            parameters=[user], extra={**MISSING, **THE_FILES})},
        "/admin/users/{username}/sessions": {
            "get": op("A user's sessions", listed("AdminSession", "The sessions"), parameters=[user], extra=MISSING),
            "delete": op("End every session of a user", done(ended=INTEGER), parameters=[user], extra=MISSING)},
        "/admin/users/{username}/sessions/{session_id}": {"delete": op(
            "End one session of a user", done(ended={"type": "integer", "enum": [1]}),
            parameters=[user, session_id_path(f"As GET /admin/users/{{username}}/sessions names it; {LOOKED_UP}")],
            extra=MISSING)},
        "/admin/installations": {"get": op("Installations, a page at a time", page("AdminInstallation"),
                                           parameters=PAGING)},
        "/admin/installations/{installation_id}": {
            "get": op("One installation", json_answer("AdminInstallation", "The installation"),
                      parameters=[installation], extra=MISSING),
            "put": op("Create or replace an installation (operators by username)",
                      json_answer(PUT_INSTALLATION, "Replaced"), body="InstallationBody",
                      parameters=[new_id("installation_id")],
                      extra={"201": json_answer(PUT_INSTALLATION, "Created"), **THE_FILES}),
            "delete": op("Remove an installation, revoking its grants", done(removed=STRING, familiesRevoked=INTEGER),
                         parameters=[installation], extra={**MISSING, **THE_FILES})},
        "/admin/grants": {"get": op(
            "The live grants of a user (username) and/or a client (clientId): naming neither is 422",
            page("Grant"), extra=MISSING, parameters=[
                parameter("username", "query", "A user's (404 when there is none)"),
                parameter("clientId", "query", "A client's"), *PAGING])},
        "/admin/grants/{grant_id}": {"delete": op("Revoke a grant and all its tokens",
                                                  done(revoked=STRING, familiesRevoked=INTEGER),
                                                  parameters=[looked_up("grant_id")], extra=MISSING)},
        "/admin/tokens/revoke": {"post": op("Revoke a token by its value (an access token alone, a refresh token "
                                            "with its family)", done(revoked=BOOLEAN), body="TokenBody")},
        "/admin/tokens/introspect": {"post": op("What introspection says of a token",
                                                json_answer("IntrospectionResponse", "RFC 7662"), body="TokenBody")},
        "/admin/purge": {"post": op("Delete expired codes, tokens and sessions",
                                    json_answer(obj(required=False, codes=INTEGER, families=INTEGER,
                                                    sessions=INTEGER, note=STRING), "The counts, per kind"),
                                    invalid=False)},
        "/admin/plan": {"post": op("What applying a desired state would do (tokensvc apply), every problem of it "
                                   "at once (422, each at its table, entry and field); writes nothing",
                                   json_answer("Plan", "The steps, in the order they would run"),
                                   body="PlanBody")},
        "/openapi.json": {"get": {"summary": "This document",
                                  "responses": {"200": json_answer({"type": "object"}, "OpenAPI 3.1")}}},
    }


def add_rules(components: dict[str, Any], kinds: Sequence[str]) -> None:
    """What the admin bodies' schemas cannot say field by field (``admin_schemas.RULES``), and
    the installation kinds the service is configured with."""
    for name, rule in admin_schemas.RULES.items():
        components[name].update(rule)
    for name in admin_schemas.WITH_KIND:
        components[name]["properties"]["kind"]["enum"] = list(kinds)
