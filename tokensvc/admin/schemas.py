"""marshmallow schemas of the admin API: its resources (camelCase on the wire, like
OAuthClient) and the JSON bodies operators send. The same schemas check what the CLI sends
straight to a stopped service's store (``tokensvc/admin/operator.py``): one place for each rule."""

from __future__ import annotations

from typing import Any

from marshmallow import RAISE, Schema, fields, pre_dump, validate

from tokensvc import identifiers
from tokensvc.records import CLIENT_KINDS, MAX_KEEP_PREVIOUS_SECONDS
from tokensvc.schemas import EXTRA_FORBIDDEN, NOT_LIST, NOT_NULL, NOT_OBJECT, Flag, Text, TextList

MAX_LIST = 100  # redirect URIs, scopes, origins, operators a body may name


def SecretDigest() -> Any:
    """A client secret given as its SHA-256 (hex), never the secret: it makes the client
    confidential, and the service keeps the digest as it keeps every secret."""
    return Text(max_length=64, data_key="clientSecretSha256", metadata={
        "pattern": identifiers.SHA256_HEX.pattern,
        "description": "The SHA-256 (64 lower-case hex digits) of a secret the operator holds: the client "
                       "becomes confidential with it"})


def PasswordHash() -> Any:
    """A user's password given as its hash as the service stores it, instead of the password."""
    return Text(max_length=256, data_key="passwordHash", metadata={
        "pattern": identifiers.PASSWORD_HASH.pattern,
        "description": "Instead of password: a scrypt hash as tokensvc stores it (scrypt$N$r$p$salt$key)"})


RESOURCE = {"maxLength": identifiers.RESOURCE_MAX_LENGTH, "description": identifiers.RESOURCE_URI_RULE}
RESOURCES = ("A resource server's: the resource URIs of the API it serves (RFC 8707), which an authorization or a "
             "refresh may name to bind its tokens to; none for a client. Never tokensvc's own API (base_url + /v1), "
             "nor one another resource server declares (422)")

class BodySchema(Schema):
    """An operator's JSON body: a field the service does not know is refused (422 naming it),
    never ignored. A misspelt ``allowedScope`` changing nothing, or a ``clientSecret`` that a
    PUT drops and so makes the client public, is a mistake the operator must see."""

    error_messages = {"unknown": EXTRA_FORBIDDEN}

    class Meta:
        unknown = RAISE


KIND = ("client (default): the authorization flow; resource-server: an API that may introspect tokens and read "
        "the revocation feed, nothing else (confidential; no redirect URI, scope, origin, nor first-party flag)")
KIND_ERROR = "Value error, client or resource-server"


# -- resources ---------------------------------------------------------------------------------


class AdminClientSchema(Schema):
    """A registered client as an operator sees it (never its secret)."""

    client_id = fields.String(required=True, data_key="clientId")
    name = fields.String(required=True)
    redirect_uris = fields.List(fields.String(), required=True, data_key="redirectUris")
    allowed_scopes = fields.List(fields.String(), required=True, data_key="allowedScopes")
    first_party = fields.Boolean(required=True, data_key="firstParty")
    confidential = fields.Boolean(required=True)
    description = fields.String(allow_none=True)
    logo_url = fields.String(allow_none=True, data_key="logoUrl")
    allowed_origins = fields.List(fields.String(), required=True, data_key="allowedOrigins")
    created_at = fields.DateTime(allow_none=True, data_key="createdAt")
    kind = fields.String(required=True, validate=validate.OneOf(CLIENT_KINDS), metadata={"description": KIND})
    resources = fields.List(fields.String(), required=True, metadata={"description": RESOURCES})

    @pre_dump
    def in_force(self, client: Any, **_: Any) -> dict[str, Any]:
        """What the client is in force: its scopes with the default, no origins as []."""
        return {"client_id": client.client_id, "name": client.name, "redirect_uris": client.redirect_uris,
                "allowed_scopes": client.scopes, "first_party": client.first_party,
                "confidential": client.confidential, "description": client.description, "logo_url": client.logo_url,
                "allowed_origins": client.allowed_origins or [], "created_at": client.created_at,
                "kind": client.kind, "resources": client.resources or []}


class AdminClientShownSchema(AdminClientSchema):
    """One client as ``GET /admin/clients/{id}`` shows it: with its previous secret's time, when
    a rotation keeps one valid (never the secret, nor its hash)."""

    previous_secret_expires_at = fields.DateTime(required=True, allow_none=True,
                                                 data_key="previousSecretExpiresAt", metadata={
                                                     "description": "Until when the secret a rotation replaced "
                                                                    "still works; null when none does"})
    previous_secret_last_used_at = fields.DateTime(required=True, allow_none=True,
                                                   data_key="previousSecretLastUsedAt", metadata={
                                                       "description": "Its latest use (to within a minute); null "
                                                                      "when it was not used since the rotation"})

    @pre_dump
    def in_force(self, shown: Any, **_: Any) -> dict[str, Any]:
        """``(client, its previous secret in force or None)``."""
        client, previous = shown
        return {**super().in_force(client),
                "previous_secret_expires_at": previous.expires_at if previous else None,
                "previous_secret_last_used_at": previous.last_used_at if previous else None}


class AdminClientWithSecretSchema(AdminClientSchema):
    """The document's answer to a registration or a change: the client, and a confidential
    one's new secret (shown this once; null when there is none)."""

    client_secret = fields.String(required=True, allow_none=True, data_key="clientSecret")


class AdminClientPutSchema(AdminClientWithSecretSchema):
    """The document's answer to ``PUT /admin/clients/{id}``: whether it was created."""

    created = fields.Boolean(required=True)


class AdminUserSchema(Schema):
    username = fields.String(required=True)
    user_id = fields.String(required=True, data_key="userId")
    admin = fields.Boolean(required=True)


class AdminInstallationSchema(Schema):
    installation_id = fields.String(required=True, data_key="installationId")
    name = fields.String(required=True)
    kind = fields.String(required=True)
    operators = fields.List(fields.String(), required=True, metadata={"description": "usernames"})


class AdminInstallationPutSchema(AdminInstallationSchema):
    """The document's answer to ``PUT /admin/installations/{id}``: whether it was created."""

    created = fields.Boolean(required=True)


class GrantSchema(Schema):
    grant_id = fields.String(required=True, data_key="grantId")
    client_id = fields.String(required=True, data_key="clientId")
    subject_type = fields.String(required=True, data_key="subjectType")
    subject = fields.String(required=True, metadata={"description": "a user id or an installation id"})
    scopes = fields.List(fields.String(), required=True)
    created_at = fields.DateTime(required=True, data_key="createdAt")


class AdminSessionSchema(Schema):
    id = fields.String(required=True)
    browser = fields.String(required=True)
    user_agent = fields.String(allow_none=True, data_key="userAgent")
    address = fields.String(allow_none=True)
    signed_in_at = fields.DateTime(required=True, data_key="signedInAt")
    last_seen_at = fields.DateTime(allow_none=True, data_key="lastSeenAt")


# -- bodies ------------------------------------------------------------------------------------


# What the OpenAPI document says of each field beyond its type and length: the rules of
# tokensvc/identifiers.py that admin/actions.py applies (422 otherwise). What no pattern can hold (a
# password's strength, an operator who exists) is said in words.
NAME = {"pattern": identifiers.NAME.pattern, "description": f"A name: {identifiers.NAME_RULE}"}
REDIRECT_URI = {"pattern": identifiers.REDIRECT_URI.pattern, "description": (
    "https; http only to a loopback host (127.0.0.0/8, [::1], localhost); or a private-use scheme "
    "(com.example.app:/cb, RFC 8252 §7.1), never javascript:, data:, file:, vbscript:, blob:, about:, "
    "filesystem:; no fragment; " + identifiers.URI_RULE)}
SCOPE = {"pattern": identifiers.SCOPE_TOKEN.pattern, "description": "RFC 6749 §3.3's scope-token"}
LOGO_URL = {"pattern": identifiers.LOGO.pattern, "description": (
    "An http(s) URL (" + identifiers.URI_RULE + "), or a path such as /static/app.svg: this service's "
    "public URL followed by the path is held, as the configuration's logo_url")}
ORIGIN = {"pattern": identifiers.ORIGIN.pattern, "maxLength": identifiers.ORIGIN_MAX_LENGTH, "description": (
    "A web origin as a browser sends it: scheme://host[:port] in lower case without its default port, https "
    "and a DNS name, or http on a loopback host; never a wildcard")}
PASSWORD = {"minLength": identifiers.MIN_PASSWORD_LENGTH, "description": (
    "At least 8 characters, and hard to guess (zxcvbn's score 3 of 4, the username, its parts and the "
    "service's name counted against it): a common, breached or name-built password is 422")}
USERNAME = {"pattern": identifiers.USERNAME.pattern}
OPERATOR = {**USERNAME, "description": "A user's username (422 if none)"}
# The document of a running service names its configured installation_kinds (openapi/admin.py).
INSTALLATION_KIND = {"enum": list(identifiers.DEFAULT_KINDS), "description": "One of the service's installation_kinds"}


class ClientBodySchema(BodySchema):
    """``PUT /admin/clients/{id}`` and ``POST /admin/clients``: what the client is."""

    client_id = Text(max_length=128, data_key="clientId", metadata={
        "pattern": identifiers.ID.pattern,
        "description": "POST: the id to give it (default: a random one); PUT: the path's, if given"})
    name = Text(required=True, max_length=200, metadata=NAME)
    redirect_uris = TextList(data_key="redirectUris", item=REDIRECT_URI, metadata={
        "description": "At least one for a client; none for a resource server"})
    scopes = TextList(data_key="allowedScopes", max_length=128, item=SCOPE, metadata={
        "description": "Absent or empty: [\"read\"] (a resource server: none)"})
    first_party = Flag(load_default=False, data_key="firstParty")
    confidential = Flag(metadata={"description": "Give it a secret, made by the service and returned once "
                                                 "(default: as clientSecretSha256 says; a resource server always is)"})
    description = Text(max_length=1000, allow_none=True)
    logo_url = Text(allow_none=True, data_key="logoUrl", metadata=LOGO_URL)
    allowed_origins = TextList(data_key="allowedOrigins", item=ORIGIN)
    kind = Text(max_length=32, validate=[validate.OneOf(CLIENT_KINDS, error=KIND_ERROR)], metadata={
        "description": KIND, "enum": list(CLIENT_KINDS)})
    secret_sha256 = SecretDigest()
    resources = TextList(max_items=64, max_length=identifiers.RESOURCE_MAX_LENGTH, item=RESOURCE,
                         metadata={"description": RESOURCES})


class ClientPutBodySchema(ClientBodySchema):
    """The document's ``PUT /admin/clients/{id}`` body: the path names the client."""

    class Meta(BodySchema.Meta):
        exclude = ("client_id",)


class ClientPatchSchema(BodySchema):
    """``PATCH /admin/clients/{id}``: the fields to change."""

    name = Text(max_length=200, metadata=NAME)
    redirect_uris = TextList(data_key="redirectUris", item=REDIRECT_URI,
                             metadata={"minItems": 1})
    scopes = TextList(data_key="allowedScopes", max_length=128, item=SCOPE)
    first_party = Flag(data_key="firstParty")
    confidential = Flag()
    description = Text(max_length=1000, allow_none=True)
    logo_url = Text(allow_none=True, data_key="logoUrl", metadata=LOGO_URL)
    allowed_origins = TextList(data_key="allowedOrigins", item=ORIGIN)
    kind = Text(max_length=32, validate=[validate.OneOf(CLIENT_KINDS, error=KIND_ERROR)], metadata={
        "description": KIND, "enum": list(CLIENT_KINDS)})
    secret_sha256 = SecretDigest()
    resources = TextList(max_items=64, max_length=identifiers.RESOURCE_MAX_LENGTH, item=RESOURCE,
                         metadata={"description": RESOURCES})


class UserBodySchema(BodySchema):
    """``POST /admin/users``: a password (the rule applies) or a hash as stored, not both."""

    username = Text(required=True, max_length=64, metadata=USERNAME)
    password = Text(max_length=1024, metadata=PASSWORD)
    password_hash = PasswordHash()
    admin = Flag(load_default=False)


class UserPatchSchema(BodySchema):
    admin = Flag(required=True)


class PasswordBodySchema(BodySchema):
    password = Text(max_length=1024, metadata=PASSWORD)
    password_hash = PasswordHash()
    keep_grants = Flag(load_default=False, data_key="keepGrants")


class WholeNumber(fields.Integer):
    """A JSON integer as JSON Schema reads one: ``3600`` or ``3600.0``, never ``3600.5``, a
    string or a boolean."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                (isinstance(value, float) and not value.is_integer()):
            raise self.make_error("invalid")
        return int(value)


class SecretBodySchema(BodySchema):
    keep_previous_seconds = WholeNumber(
        load_default=0, data_key="keepPreviousSeconds",
        validate=validate.Range(0, MAX_KEEP_PREVIOUS_SECONDS),
        metadata={"description": "How long the secret being replaced keeps working beside the new one, in seconds "
                                 f"(at most {MAX_KEEP_PREVIOUS_SECONDS}, 30 days; 0, the default: it stops at once)"})


class SecretRotatedSchema(Schema):
    client_id = fields.String(required=True, data_key="clientId")
    client_secret = fields.String(required=True, data_key="clientSecret")
    previous_secret_expires_at = fields.DateTime(required=True, allow_none=True, data_key="previousSecretExpiresAt")


class InstallationBodySchema(BodySchema):
    name = Text(required=True, max_length=200, metadata=NAME)
    kind = Text(required=True, max_length=32, metadata=INSTALLATION_KIND)
    operators = TextList(max_length=64, item=OPERATOR)


class Entry(fields.Nested):
    """An entry of a plan: the document states its schema; the plan loads each entry on its
    own (``tokensvc/admin/provisioning.py``), so that the problems of every entry are reported at
    once, located at their table, entry and field. Here it need only be an object."""

    default_error_messages = {"type": NOT_OBJECT, "null": NOT_NULL}

    def _deserialize(self, value: Any, attr: str | None, data: Any, partial: Any = None, **kwargs: Any) -> Any:
        if not isinstance(value, dict):
            raise self.make_error("type")
        return value


def Entries(schema: type[Schema], what: str) -> Any:
    return fields.List(Entry(schema), metadata={"description": what},
                       error_messages={"invalid": NOT_LIST, "null": NOT_NULL})


class PlanClientSchema(ClientPatchSchema):
    """A client of a plan: its id and the fields to hold, ClientPatch's (a client the service
    does not have yet needs what ClientBody requires: name and redirectUris)."""

    client_id = Text(required=True, max_length=128, data_key="clientId", metadata={
        "pattern": identifiers.ID.pattern})


class PlanUserSchema(BodySchema):
    """A user of a plan: a new one needs a password or a passwordHash (not both); a password
    given for one the service has is a change only if it is not the one it holds."""

    username = Text(required=True, max_length=64, metadata=USERNAME)
    password = Text(max_length=1024, metadata=PASSWORD)
    password_hash = PasswordHash()
    admin = Flag()


class PlanInstallationSchema(BodySchema):
    """An installation of a plan: its id and the fields to hold, InstallationBody's (a new one
    needs name and kind)."""

    installation_id = Text(required=True, max_length=128, data_key="installationId", metadata={
        "pattern": identifiers.ID.pattern})
    name = Text(max_length=200, metadata=NAME)
    kind = Text(max_length=32, metadata=INSTALLATION_KIND)
    operators = TextList(max_length=64, item=OPERATOR)


class PlanBodySchema(BodySchema):
    """``POST /admin/plan``: a desired state (``tokensvc apply``'s file): each entry names its
    resource by id and gives the fields to hold, by the names of ClientBody, UserBody and
    InstallationBody (secrets as clientSecretSha256, password or passwordHash); a field left
    out keeps its value."""

    clients = Entries(PlanClientSchema, "Clients, each by its id with the fields to hold")
    users = Entries(PlanUserSchema, "Users, each by its username with the fields to hold")
    installations = Entries(PlanInstallationSchema, "Installations, each by its id with the fields to hold")
    prune = Flag(load_default=False, metadata={"description": "Also remove what a list given leaves out (never the "
                                                              "user or client of the token asking: 422)"})


class PlanChangeSchema(Schema):
    """A field a step sets: its value before and after, or for a secret only that it is set."""

    field = fields.String(required=True, metadata={"description": "The body's name of the field"})
    before = fields.Raw(data_key="from", allow_none=True, metadata={"description": "Null when created"})
    after = fields.Raw(data_key="to", allow_none=True)
    secret = fields.Boolean(metadata={"enum": [True], "description": "A secret: never its value"})


class PlanStepSchema(Schema):
    kind = fields.String(required=True, metadata={"enum": ["client", "user", "installation"]})
    id = fields.String(required=True)
    action = fields.String(required=True, metadata={"enum": ["create", "update", "unchanged", "remove"]})
    changes = fields.List(fields.Nested(PlanChangeSchema), required=True)
    ends_caller = fields.Boolean(required=True, data_key="endsCaller", metadata={"description": (
        "It ends the rights of the token asking (its user's demotion or new password, its client's "
        "loss of admin): ordered last")})


class PlanSchema(Schema):
    steps = fields.List(fields.Nested(PlanStepSchema), required=True)


class TokenBodySchema(BodySchema):
    token = Text(required=True, max_length=512)


# What the fields of a body cannot say one by one, as JSON Schema the OpenAPI document adds to
# its component (openapi/admin.py); admin/actions.py applies the same rules (422 at the field named).
SECRET_MAKES_CONFIDENTIAL = {
    "description": "A clientSecretSha256 makes the client confidential: confidential false beside one is 422",
    "not": {"required": ["clientSecretSha256", "confidential"], "properties": {"confidential": {"const": False}}}}
PASSWORD_OR_HASH = {"description": "A password or a passwordHash, not both",
                    "oneOf": [{"required": ["password"]}, {"required": ["passwordHash"]}]}
RULES: dict[str, dict[str, Any]] = {
    "ClientBody": SECRET_MAKES_CONFIDENTIAL, "ClientPutBody": SECRET_MAKES_CONFIDENTIAL,
    "ClientPatch": SECRET_MAKES_CONFIDENTIAL, "PlanClient": SECRET_MAKES_CONFIDENTIAL,
    "UserBody": PASSWORD_OR_HASH, "PasswordBody": PASSWORD_OR_HASH,
    "PlanUser": {"description": "A new user needs a password or a passwordHash; never both",
                 "not": {"required": ["password", "passwordHash"]}},
    "PlanChange": {"oneOf": [{"required": ["from", "to"]}, {"required": ["secret"]}]}}
WITH_KIND = ("InstallationBody", "PlanInstallation")  # whose kind is one of the configured ones

admin_client = AdminClientSchema()
admin_client_shown = AdminClientShownSchema()
secret_body = SecretBodySchema()
secret_rotated = SecretRotatedSchema()
admin_user = AdminUserSchema()
admin_installation = AdminInstallationSchema()
grant = GrantSchema()
admin_session = AdminSessionSchema()
client_body = ClientBodySchema()
client_patch = ClientPatchSchema()
user_body = UserBodySchema()
user_patch = UserPatchSchema()
password_body = PasswordBodySchema()
installation_body = InstallationBodySchema()
token_body = TokenBodySchema()
plan_body = PlanBodySchema()
plan_entries = {"clients": PlanClientSchema(), "users": PlanUserSchema(), "installations": PlanInstallationSchema()}
COMPONENTS: dict[str, type[Schema]] = {
    "AdminClient": AdminClientSchema, "AdminClientShown": AdminClientShownSchema,
    "SecretBody": SecretBodySchema, "SecretRotated": SecretRotatedSchema,
    "AdminClientWithSecret": AdminClientWithSecretSchema,
    "AdminClientPut": AdminClientPutSchema, "AdminInstallationPut": AdminInstallationPutSchema,
    "AdminUser": AdminUserSchema, "AdminInstallation": AdminInstallationSchema,
    "Grant": GrantSchema, "AdminSession": AdminSessionSchema, "ClientBody": ClientBodySchema,
    "ClientPatch": ClientPatchSchema, "UserBody": UserBodySchema, "UserPatch": UserPatchSchema,
    "ClientPutBody": ClientPutBodySchema, "PasswordBody": PasswordBodySchema,
    "InstallationBody": InstallationBodySchema, "TokenBody": TokenBodySchema,
    "PlanClient": PlanClientSchema, "PlanUser": PlanUserSchema, "PlanInstallation": PlanInstallationSchema,
    "PlanBody": PlanBodySchema, "PlanChange": PlanChangeSchema, "PlanStep": PlanStepSchema, "Plan": PlanSchema}
