"""marshmallow schemas: request forms, every JSON body, and the 422 error shape.

Schemas are built once at import and reused. Validation messages carry a machine type
(``missing``, ``string_too_long``, ``value_error`` ...) so that a marshmallow
``ValidationError`` renders as the HTTPValidationError body of the interface:
``{"detail": [{"loc": [...], "msg", "type", "input", "ctx"}]}``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from marshmallow import EXCLUDE, Schema, ValidationError, fields, validate

from tokensvc import identifiers
from tokensvc.errors import ValidationFailed

MAX_FIELD_LENGTH = 2048


class ErrorDetail(str):
    """A validation message that also knows its error type and context."""

    type: str
    ctx: dict[str, Any]

    def __new__(cls, msg: str, type_: str, ctx: dict[str, Any] | None = None) -> ErrorDetail:
        obj = super().__new__(cls, msg)
        obj.type = type_
        obj.ctx = ctx or {}
        return obj

    def format(self, *args: Any, **kwargs: Any) -> ErrorDetail:  # marshmallow formats messages
        return ErrorDetail(str.format(self, *args, **kwargs), self.type, self.ctx)


REQUIRED = ErrorDetail("Field required", "missing")
NOT_STRING = ErrorDetail("Input should be a valid string", "string_type")
NOT_NULL = ErrorDetail("Input should not be null", "missing")
NOT_LIST = ErrorDetail("Input should be a valid list", "list_type")
NOT_OBJECT = ErrorDetail("Input should be an object", "model_type")
NOT_BOOLEAN = ErrorDetail("Input should be a valid boolean", "bool_parsing")
EXTRA_FORBIDDEN = ErrorDetail("Extra inputs are not permitted", "extra_forbidden")


class MaxLength(validate.Validator):
    def __init__(self, max_length: int) -> None:
        self.max_length = max_length

    def __call__(self, value: str) -> str:
        if len(value) > self.max_length:
            raise ValidationError(ErrorDetail(
                f"String should have at most {self.max_length} characters",
                "string_too_long", {"max_length": self.max_length}))
        return value


class Pattern(validate.Validator):
    def __init__(self, pattern: re.Pattern[str], message: str) -> None:
        self.pattern, self.message = pattern, message

    def __call__(self, value: str) -> str:
        if not self.pattern.fullmatch(value):
            raise ValidationError(ErrorDetail(f"Value error, {self.message}", "value_error",
                                              {"error": self.message}))
        return value


def Text(*, required: bool = False, max_length: int = MAX_FIELD_LENGTH, **kwargs: Any) -> fields.String:
    """A string field with typed messages and a length bound; a :class:`Pattern` it is given is
    stated in the OpenAPI document too."""
    validators = [MaxLength(max_length), *kwargs.pop("validate", [])]
    stated = {"pattern": v.pattern.pattern for v in validators if isinstance(v, Pattern)}  # noqa: B035 - one at most
    return fields.String(
        required=required, validate=validators,
        metadata={"maxLength": max_length, **stated, **kwargs.pop("metadata", {})},
        error_messages={"required": REQUIRED, "invalid": NOT_STRING, "null": NOT_NULL}, **kwargs)


def TextList(*, required: bool = False, max_items: int = 100, max_length: int = MAX_FIELD_LENGTH,
             item: dict[str, Any] | None = None, **kwargs: Any) -> fields.List:
    """A list of at most ``max_items`` strings (JSON bodies), with typed messages; ``item``: what
    the OpenAPI document says of each string."""

    def bounded(items: list[str]) -> None:
        if len(items) > max_items:
            raise ValidationError(ErrorDetail(f"List should have at most {max_items} items", "too_long",
                                              {"max_length": max_items}))

    return fields.List(Text(max_length=max_length, metadata=item or {}), required=required, validate=bounded,
                       metadata={"maxItems": max_items, **kwargs.pop("metadata", {})},
                       error_messages={"required": REQUIRED, "invalid": NOT_LIST, "null": NOT_NULL}, **kwargs)


class StrictBoolean(fields.Boolean):
    """true or false: never a string that reads like one, nor 0 or 1 (which equal False and True)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if type(value) is not bool:
            raise self.make_error("invalid", input=value)
        return value


def Flag(**kwargs: Any) -> fields.Boolean:
    """A JSON boolean, with typed messages."""
    return StrictBoolean(error_messages={"required": REQUIRED, "invalid": NOT_BOOLEAN, "null": NOT_NULL}, **kwargs)


# -- request schemas ------------------------------------------------------------------

class FormSchema(Schema):
    class Meta:
        unknown = EXCLUDE  # RFC 6749 §3.1: unrecognized parameters are ignored


MAX_RESOURCES = 16  # resource parameters one request may name (tokensvc.oauth.audience)


def Resources(description: str) -> fields.List:
    """``resource`` (RFC 8707 §2): a form parameter that may be sent more than once, each an
    absolute URI without a fragment. Its handler reads it (a form loads single values only)."""
    return fields.List(Text(max_length=identifiers.RESOURCE_MAX_LENGTH,
                            metadata={"description": identifiers.RESOURCE_URI_RULE}),
                       metadata={"maxItems": MAX_RESOURCES, "description": description})


class TokenRequestSchema(FormSchema):
    """``POST /oauth/token`` (RFC 6749 §4.1.3 + RFC 7636 §4.5)."""

    grant_type = Text(required=True, max_length=64, metadata={"enum": ["authorization_code"]})
    code = Text(required=True, max_length=512)
    redirect_uri = Text(required=True)
    code_verifier = Text(max_length=128)
    client_id = Text(max_length=128)
    client_secret = Text(max_length=512)
    confirmation_code = Text(max_length=32, metadata={"description": (
        "The confirmation code the authorization's page showed, as the person typed it (8 characters; case, "
        "spaces and hyphens do not matter). Required for a code that grants admin to a public client with a "
        "loopback or private-use redirect URI; such a code may be presented with one 3 times at most.")})
    resource = Resources(
        "RFC 8707 §2.2, repeatable: narrows the access token to these resources, each one the authorization "
        "request named (any declared one, when it named none). The refresh token keeps what the authorization "
        "request named. Else invalid_target.")


class RefreshRequestSchema(FormSchema):
    """``POST /oauth/token/refresh``."""

    refresh_token = Text(required=True, max_length=512)
    grant_type = Text(max_length=64, metadata={"description": "Any value: the endpoint is the grant"})
    client_id = Text(max_length=128)
    client_secret = Text(max_length=512)
    scope = Text()
    resource = Resources(
        "RFC 8707 §2.2, repeatable: binds the new access token to these resources, each one the authorization "
        "granted (any declared one, when it named none). Absent: every resource the authorization granted. The "
        "refresh token keeps what the authorization granted, so a later refresh may name others. Else "
        "invalid_target.")


class TokenActionSchema(FormSchema):
    """``POST /oauth/token/introspect`` (RFC 7662 §2.1) and ``/oauth/token/revoke`` (RFC 7009 §2.1)."""

    token = Text(required=True, max_length=512)
    token_type_hint = Text(max_length=64)
    client_id = Text(max_length=128)
    client_secret = Text(max_length=512)


class IntrospectionRequestSchema(TokenActionSchema):
    """``POST /oauth/token/introspect``: a token action whose caller may also be an admin's
    bearer token (RFC 7662 §2.1), which names its client itself: then no client_id."""


def ClientId() -> fields.String:
    """A required client id: 1-128 characters of ``[A-Za-z0-9._~-]``."""
    return Text(required=True, max_length=128, validate=[
        Pattern(identifiers.ID_CHARS, f"client_id must be {identifiers.ID_RULE}")])


class ClientIdPathSchema(Schema):
    client_id = ClientId()


class AccountFormSchema(FormSchema):
    """The account page's buttons: remove an app, unpair an installation, sign a session out,
    or every other session."""

    action = Text(required=True, max_length=32, validate=[validate.OneOf(
        ["remove", "unpair", "end-session", "end-others"], error="Value error, an action of the account page")])
    client_id = Text(max_length=128, validate=[
        Pattern(identifiers.ID_CHARS, f"client_id must be {identifiers.ID_RULE}")])
    installation_id = Text(max_length=128, validate=[
        Pattern(identifiers.ID_CHARS, f"installation_id must be {identifiers.ID_RULE}")])
    session_id = Text(max_length=64)


SESSION_ID = re.compile(r"^[0-9a-f]{24}$")  # Session.public_id: a prefix of the session's hash


class SessionIdPathSchema(Schema):
    """A session's id in a path (its other parameters, the admin API's username, any value)."""

    class Meta:
        unknown = EXCLUDE

    session_id = Text(required=True, max_length=24, validate=[Pattern(SESSION_ID, "a session's id: 24 hex digits")])


FEED_STREAM = re.compile(r"^[A-Za-z0-9_-]{16}$")  # RevocationFeed.stream
FEED_SEQ = re.compile(r"^[0-9]{1,15}$")


class FeedQuerySchema(FormSchema):
    """``GET /oauth/revocations``: where a reconnecting reader left off."""

    stream = Text(max_length=16, validate=[Pattern(FEED_STREAM, "stream must be the stream a ready message named")],
                  metadata={"description": "The stream of the last message seen (its ready message names it)"})
    after = Text(max_length=15, validate=[Pattern(FEED_SEQ, "after must be a sequence number")],
                 metadata={"description": "The seq of the last message seen on that stream"})


class OptionalTokenQuerySchema(FormSchema):
    token = Text(max_length=512)


class LoginFormSchema(FormSchema):
    username = Text(required=True, max_length=128)
    password = Text(required=True, max_length=1024)
    next = Text()


# -- response schemas -----------------------------------------------------------------

class OAuthClientSchema(Schema):
    """The public face of a registered client: never its secret nor its first-party flag. Its
    scopes are those in force (``Client.scopes``: a client registered without any has the
    default), as the admin API shows them."""

    client_id = fields.String(required=True, data_key="clientId")
    name = fields.String(required=True)
    redirect_uris = fields.List(fields.String(), required=True, data_key="redirectUris")
    allowed_scopes = fields.List(fields.String(), required=True, attribute="scopes", data_key="allowedScopes")
    created_at = fields.DateTime(allow_none=True, data_key="createdAt")
    description = fields.String(allow_none=True)
    logo_url = fields.String(allow_none=True, data_key="logoUrl")


class TokenResponseSchema(Schema):
    """RFC 6749 §5.1 successful token response."""

    access_token = fields.String(required=True)
    refresh_token = fields.String(required=True)
    expires_in = fields.Integer(required=True, metadata={"description": "Seconds"})
    token_type = fields.String(required=True, validate=validate.Equal("Bearer"))
    scope = fields.String(required=True)


class IntrospectionResponseSchema(Schema):
    """RFC 7662 §2.2. An inactive token has ``active: false`` and nothing else."""

    active = fields.Boolean(required=True)
    scope = fields.String()
    client_id = fields.String()
    token_type = fields.String(validate=validate.OneOf(["access_token", "refresh_token"]))
    exp = fields.Integer()
    iat = fields.Integer()
    iss = fields.String()
    sub = fields.String()
    subject_type = fields.String(validate=validate.OneOf(["user", "installation"]))
    username = fields.String()
    installation_id = fields.String()
    # Beyond RFC 7662 (§2.2 allows more members): what a cache keys its entries on, and what
    # the revocation feed names (GET /oauth/revocations).
    family_id = fields.String(metadata={"description": "The token's family (one authorization code's chain of "
                                                       "refreshes); opaque, never a token or its hash"})
    grant_id = fields.String(metadata={"description": "The grant of the subject to the client behind the token"})
    aud = fields.List(fields.String(), metadata={"description": "The resources (RFC 8707) the token is meant for; "
                                                                "absent: every API"})


# Every code an OAuth error body may hold (tokensvc.oauth.errors; too_many_requests: the rate
# limit's); tests/test_openapi.py checks the list against the error classes.
OAUTH_ERRORS = ("access_denied", "insufficient_scope", "invalid_client", "invalid_grant", "invalid_request",
                "invalid_scope", "invalid_target", "invalid_token", "too_many_requests", "unauthorized_client",
                "unsupported_grant_type", "unsupported_response_type")


class OAuthErrorSchema(Schema):
    """RFC 6749 §5.2 error response."""

    error = fields.String(required=True, metadata={"enum": list(OAUTH_ERRORS)})
    error_description = fields.String()
    scope = fields.String()


class DetailSchema(Schema):
    """``{"detail": "..."}``: unknown resource, store unavailable, body too large."""

    detail = fields.String(required=True)


class ValidationErrorSchema(Schema):
    loc = fields.List(fields.Raw(), required=True)
    msg = fields.String(required=True)
    type = fields.String(required=True)
    input = fields.Raw(allow_none=True)
    ctx = fields.Dict()


class HTTPValidationErrorSchema(Schema):
    detail = fields.List(fields.Nested(ValidationErrorSchema), required=True)


class EmptySchema(Schema):
    """``{}``: revocation and sign-out."""


class MetadataSchema(Schema):
    """RFC 8414 §2 authorization server metadata."""

    issuer = fields.String(required=True)
    authorization_endpoint = fields.String(required=True)
    token_endpoint = fields.String(required=True)
    introspection_endpoint = fields.String(required=True)
    revocation_endpoint = fields.String(required=True)
    response_types_supported = fields.List(fields.String(), required=True)
    response_modes_supported = fields.List(fields.String())
    grant_types_supported = fields.List(fields.String(), required=True)
    code_challenge_methods_supported = fields.List(fields.String(), required=True)
    token_endpoint_auth_methods_supported = fields.List(fields.String(), required=True)
    introspection_endpoint_auth_methods_supported = fields.List(fields.String())
    revocation_endpoint_auth_methods_supported = fields.List(fields.String())
    scopes_supported = fields.List(fields.String(), required=True)
    authorization_response_iss_parameter_supported = fields.Boolean()
    resource_indicators_supported = fields.Boolean(metadata={"description": (
        "RFC 8707: resource at the authorization request, the code exchange and the refresh; tokensvc's own API "
        "is the resource at base_url + /v1")})
    service_documentation = fields.String()


token_request = TokenRequestSchema()
refresh_request = RefreshRequestSchema()
token_action = TokenActionSchema()
introspection_request = IntrospectionRequestSchema()
client_id_path = ClientIdPathSchema()
optional_token_query = OptionalTokenQuerySchema()
login_form = LoginFormSchema()
account_form = AccountFormSchema()
session_id_path = SessionIdPathSchema()
oauth_client = OAuthClientSchema()
oauth_clients = OAuthClientSchema(many=True)
token_response = TokenResponseSchema()
introspection_response = IntrospectionResponseSchema()
http_validation_error = HTTPValidationErrorSchema()


# -- rendering validation errors ------------------------------------------------------

def validation_detail(error: ValidationError, location: str, data: Mapping[str, Any],
                      schema: Schema) -> list[dict[str, Any]]:
    """The ``detail`` list of an HTTPValidationError for a failed ``schema.load``."""
    data_keys = {name: (f.data_key or name) for name, f in schema.fields.items()}
    detail: list[dict[str, Any]] = []
    messages = error.messages if isinstance(error.messages, dict) else {"_schema": error.messages}
    for name, field_messages in messages.items():
        # A key of the input is reported as sent (an unknown ``keep_grants`` beside the field
        # whose data key is ``keepGrants``); a field's own errors under its data key.
        key = name if name in data else data_keys.get(name, name)
        loc = [location] if key == "_schema" else [location, key]
        value = data.get(key)
        # A list's items fail one by one: {index: [messages]}, located at their index.
        located = ([(loc + [index], value[index] if isinstance(value, list) and index < len(value) else None,
                     item_messages) for index, item_messages in field_messages.items()]
                   if isinstance(field_messages, dict) else [(loc, value, field_messages)])
        for where, given, found in located:
            for message in found if isinstance(found, list) else [found]:
                detail.append({"loc": where, "msg": str(message), "type": getattr(message, "type", "value_error"),
                               "input": given, "ctx": getattr(message, "ctx", {})})
    return detail


metadata = MetadataSchema()


class MeSchema(Schema):
    """``GET /v1/me``: ``username`` for a user, ``name`` for a node installation."""

    subjectType = fields.String(required=True, validate=validate.OneOf(["user", "installation"]))
    id = fields.String(required=True)
    username = fields.String()
    name = fields.String()
    clientId = fields.String(required=True, allow_none=True)
    scopes = fields.List(fields.String(), required=True)


class ConnectedAppSchema(Schema):
    client_id = fields.String(required=True, data_key="clientId")
    name = fields.String(required=True)
    logo_url = fields.String(allow_none=True, required=True, data_key="logoUrl")
    scopes = fields.List(fields.String(), required=True)
    granted_at = fields.DateTime(required=True, data_key="grantedAt")


class SessionSchema(Schema):
    """One of the user's signed-in sessions (``GET /v1/me/sessions``)."""

    id = fields.String(required=True)
    browser = fields.String(required=True)
    userAgent = fields.String(allow_none=True)
    address = fields.String(allow_none=True)
    signedInAt = fields.DateTime(required=True)
    lastSeenAt = fields.DateTime(allow_none=True)
    current = fields.Boolean(required=True)


class WelcomeSchema(Schema):
    type = fields.String(required=True, validate=validate.Equal("welcome"))
    subjectType = fields.String(required=True)
    id = fields.String(required=True)
    scopes = fields.List(fields.String(), required=True)


class FeedReadySchema(Schema):
    """The revocation feed's first message. ``resumed`` false: drop every cached answer."""

    type = fields.String(required=True, validate=validate.Equal("ready"))
    stream = fields.String(required=True, metadata={"description": "This process's stream: pass it back as stream"})
    seq = fields.Integer(required=True, metadata={"description": "The last message's number on the stream so far"})
    resumed = fields.Boolean(required=True, metadata={
        "description": "true: the messages after the given one follow at once; false: flush the cache"})


class FeedRevokedSchema(Schema):
    """A revocation: drop every cached answer whose member of the same name has this value.
    Exactly one of the identifiers is present."""

    type = fields.String(required=True, validate=validate.Equal("revoked"))
    seq = fields.Integer(required=True)
    family_id = fields.String(metadata={"description": "A token family (or its current access token) was revoked"})
    grant_id = fields.String(metadata={"description": "A grant and every token of it was revoked"})
    client_id = fields.String(metadata={"description": "Some of what the client's tokens may do was withdrawn (its "
                                                       "allowed scopes narrowed, or the client removed). Never sent "
                                                       "for a new secret, kind or first-party flag, which withdraws "
                                                       "nothing from its tokens"})
    sub = fields.String(metadata={"description": "Some of what the user's tokens may do was withdrawn (no longer "
                                                 "an administrator, or removed)"})


class FeedFlushSchema(Schema):
    """Revocations may have been missed (the service's own feed was interrupted): drop every
    cached answer."""

    type = fields.String(required=True, validate=validate.Equal("flush"))
    seq = fields.Integer(required=True)


FEED_MESSAGES = {"ready": FeedReadySchema(), "revoked": FeedRevokedSchema(), "flush": FeedFlushSchema()}
feed_query = FeedQuerySchema()
me = MeSchema()
connected_apps = ConnectedAppSchema(many=True)
user_sessions = SessionSchema(many=True)
welcome = WelcomeSchema()


class StatusSchema(Schema):
    """``/readyz``."""

    status = fields.String(required=True, validate=validate.Equal("ok"))


class NotReadySchema(DetailSchema):
    """``/readyz`` while not ready: the store's 503, and why."""

    reason = fields.String(required=True, metadata={
        "description": "why this instance should take no traffic now",
        "example": "start-up has not prepared the store yet"})


class FeedFullSchema(DetailSchema):
    """A revocation feed reader refused for a cap (429 its client's, 503 the process's)."""

    reason = fields.String(required=True, validate=validate.OneOf(["client_cap", "process_cap", "stopping"]),
                           metadata={"description": "client_cap: the client has as many readers open in this process "
                                                    "as it may (429); process_cap: the process has (503); stopping: "
                                                    "the process is stopping (503)"})


class HealthSchema(StatusSchema):
    """``/healthz``: alive, and the release the process runs."""

    version = fields.String(required=True, metadata={"description": "the release (semantic versioning)",
                                                       "example": "0.10.0"})


# -- fast paths ---------------------------------------------------------------------------
#
# marshmallow's general machinery costs tens of microseconds per load or dump, a large share
# of a token endpoint's time. For the flat schemas of the hot endpoints these functions are
# compiled once from the schema's own declarations (field names, data keys, required flags,
# MaxLength and Pattern validators), so the schema stays the single source of the rules.
# Any input the fast path is not sure about goes through marshmallow itself, which then
# produces the ValidationError and its messages; tests check both paths agree.

_SIMPLE_DUMP_FIELDS = (fields.String, fields.Integer, fields.Boolean)


# A compiled function takes the schema as an argument rather than holding it: the cache below
# holds the functions, and must not keep their schemas alive.
Loader = Callable[[Schema, Mapping[str, Any]], dict[str, Any]]
Dumper = Callable[[Schema, Any], dict[str, Any]]


def _marshmallow_load(schema: Schema, data: Mapping[str, Any]) -> dict[str, Any]:
    return schema.load(data)


def _marshmallow_dump(schema: Schema, obj: Any) -> dict[str, Any]:
    return schema.dump(obj)


def _compile_loader(schema: Schema) -> Loader:
    rules = []
    for name, field in schema.fields.items():
        if type(field) is not fields.String or field.data_key not in (None, name):
            return _marshmallow_load
        checks: list[tuple[str, Any]] = []
        for validator in field.validators:
            if isinstance(validator, MaxLength):
                checks.append(("max", validator.max_length))
            elif isinstance(validator, Pattern):
                checks.append(("pattern", validator.pattern))
            else:
                return _marshmallow_load
        rules.append((name, field.required, tuple(checks)))
    known = frozenset(schema.fields)
    strict = schema.unknown != EXCLUDE

    def load(schema: Schema, data: Mapping[str, Any]) -> dict[str, Any]:
        if strict and not known.issuperset(data):
            return schema.load(data)  # marshmallow reports the unknown field
        result = {}
        for name, required, checks in rules:
            value = data.get(name)
            if value is None:
                if required:
                    return schema.load(data)
                continue
            if type(value) is not str:
                return schema.load(data)
            for kind, rule in checks:
                if (kind == "max" and len(value) > rule) or (kind == "pattern" and not rule.fullmatch(value)):
                    return schema.load(data)
            result[name] = value
        return result

    return load


def _simple(field: fields.Field) -> bool:
    if type(field) is fields.List:
        return type(field.inner) in _SIMPLE_DUMP_FIELDS
    return type(field) in _SIMPLE_DUMP_FIELDS


def _compile_dumper(schema: Schema) -> Dumper:
    names, lists = [], set()
    for name, field in schema.fields.items():
        if not _simple(field) or field.data_key not in (None, name) or field.load_only:
            return _marshmallow_dump
        names.append(name)
        if type(field) is fields.List:
            lists.add(name)

    def dump(schema: Schema, obj: Any) -> dict[str, Any]:
        if type(obj) is dict or isinstance(obj, Mapping):
            result = {name: obj[name] for name in names if name in obj}
        else:
            result = {name: getattr(obj, name) for name in names if hasattr(obj, name)}
        for name in lists & result.keys():
            if result[name] is not None:
                result[name] = list(result[name])
        return result

    return dump


# The compiled functions of each schema, held as long as the schema is: a schema made per
# call is neither kept for ever nor, once collected, mistaken for a new one at its address.
_loaders: weakref.WeakKeyDictionary[Schema, Loader] = weakref.WeakKeyDictionary()
_dumpers: weakref.WeakKeyDictionary[Schema, Dumper] = weakref.WeakKeyDictionary()


def load(schema: Schema, data: Any, location: str = "body") -> dict[str, Any]:
    """``data`` loaded by ``schema``; ValidationFailed (422 HTTPValidationError) when it fails."""
    if not isinstance(data, Mapping):
        raise ValidationFailed.one([location], str(NOT_OBJECT), NOT_OBJECT.type)
    try:
        return fast_load(schema, data)
    except ValidationError as exc:
        raise ValidationFailed(validation_detail(exc, location, data, schema)) from None


def fast_load(schema: Schema, data: Mapping[str, Any]) -> dict[str, Any]:
    """``schema.load(data)``, through the compiled fast path when the schema allows it."""
    loader = _loaders.get(schema)
    if loader is None:
        loader = _loaders[schema] = _compile_loader(schema)
    return loader(schema, data)


def fast_dump(schema: Schema, obj: Any) -> dict[str, Any]:
    """``schema.dump(obj)`` for flat schemas of strings, integers and booleans."""
    dumper = _dumpers.get(schema)
    if dumper is None:
        dumper = _dumpers[schema] = _compile_dumper(schema)
    return dumper(schema, obj)
