"""The parts the OpenAPI documents are made of (:mod:`.openapi` for the public listener,
:mod:`.openapi_admin` for the admin listener): media types, answers, headers, parameters and
the refusals both listeners share."""

from __future__ import annotations

from typing import Any

from tokensvc import identifiers, schemas

FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
HTML = "text/html"


def ref(schema: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{schema}"}


def one_of_shapes(*names: str) -> dict[str, Any]:
    return {"anyOf": [ref(name) for name in names]}


def json_answer(schema: str | dict[str, Any], description: str,
                headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {JSON: {
        "schema": ref(schema) if isinstance(schema, str) else schema}}}
    if headers:
        response["headers"] = headers
    return response


def html(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {HTML: {"schema": {"type": "string"}}}}
    if headers:
        response["headers"] = headers
    return response


def redirect(description: str) -> dict[str, Any]:
    return {"description": description, "headers": {"Location": {"schema": {"type": "string"}}}}


def header(description: str, **schema: Any) -> dict[str, Any]:
    return {"schema": {"type": "string", **schema}, "description": description}


def listed(item: str, description: str) -> dict[str, Any]:
    return json_answer({"type": "array", "items": ref(item)}, description)


def parameter(name: str, where: str, description: str = "", *, required: bool = False,
              **schema: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "in": where, "required": required or where == "path",
                             "schema": {"type": "string", **schema}}
    if description:
        entry["description"] = description
    return entry


RETRY_AFTER = {"Retry-After": header("Seconds to wait")}
CHALLENGE = {"WWW-Authenticate": header("The RFC 6750 challenge: Bearer realm=\"tokensvc\", error=...",
                                        pattern="^Bearer ")}
BASIC_CHALLENGE = {"WWW-Authenticate": header(
    "To a client that tried HTTP Basic, Basic realm=\"tokensvc\", charset=\"UTF-8\" (RFC 6749 §5.2)",
    pattern="^Basic ")}
INVALID = json_answer("HTTPValidationError", "A field failed validation")
OAUTH_400 = json_answer("OAuthError", "OAuth protocol failure (RFC 6749 §5.2); also a body that cannot be parsed "
                                      "(invalid_request)")
CLIENT_401 = json_answer("OAuthError", "Client authentication failed (invalid_client)", BASIC_CHALLENGE)
BEARER_401 = json_answer("OAuthError", "No valid bearer token or session (invalid_token)", CHALLENGE)
FORBIDDEN = json_answer("OAuthError", "Authenticated, but not allowed (insufficient_scope / access_denied)")
FORBIDDEN_OR_XSRF = json_answer(one_of_shapes("OAuthError", "Detail"), "Not allowed (insufficient_scope / "
                                "access_denied); or the session cookie without its XSRF token ({\"detail\"})")
TOO_LARGE = json_answer("Detail", "Request body over 64 KiB")
TOO_MANY = json_answer("OAuthError", "Too many failed authentications (too_many_requests)", RETRY_AFTER)
UNAVAILABLE = json_answer("Detail", "The store does not answer", RETRY_AFTER)
NOT_FOUND = json_answer("Detail", "No such resource")
NO_STORE = {"Cache-Control": header("Never cached", enum=["no-store"]), "Pragma": header("", enum=["no-cache"])}
PAGE_503 = html("The store does not answer", RETRY_AFTER)

WEBSOCKET_HANDSHAKE = [
    parameter("Upgrade", "header", required=True, pattern="^[Ww][Ee][Bb][Ss][Oo][Cc][Kk][Ee][Tt]$"),
    parameter("Connection", "header", "A list naming Upgrade", required=True,
              pattern="^([^,]*,)*[ \\t]*[Uu][Pp][Gg][Rr][Aa][Dd][Ee][ \\t]*(,[^,]*)*$"),
    parameter("Sec-WebSocket-Version", "header", required=True, enum=["13"]),
    parameter("Sec-WebSocket-Key", "header", "16 bytes in base64 (RFC 6455 §4.2.1)", required=True,
              pattern="^[A-Za-z0-9+/]{21}[AQgw]==$")]
HANDSHAKE_400 = json_answer(one_of_shapes("HTTPValidationError", "Detail"), "Not a WebSocket handshake: the "
                            "header at fault; or not HTTP/1.1 with a Host ({\"detail\"})")
UPGRADE_426 = json_answer("HTTPValidationError", "Another WebSocket version than 13", {
    "Sec-WebSocket-Version": header("The version spoken", enum=["13"]), "Upgrade": header("", enum=["websocket"])})

ID_PATTERN = identifiers.ID.pattern  # an id: 1-128 characters of RFC 3986's unreserved ones
EMPTY_IS_ABSENT = ("Form bodies: an empty value counts as absent (RFC 6749 §3.1), unknown parameters are ignored, "
                   "and a parameter sent twice is invalid_request.")


def client_id_path(description: str) -> dict[str, Any]:
    return parameter("client_id", "path", description, pattern=ID_PATTERN, maxLength=128)


def session_id_path(description: str) -> dict[str, Any]:
    """A session's id in a path, at /v1 and the admin API alike (``schemas.session_id_path``)."""
    return parameter("session_id", "path", description, pattern=schemas.SESSION_ID.pattern)


def form_body(schema: str) -> dict[str, Any]:
    return {"required": True, "description": EMPTY_IS_ABSENT, "content": {FORM: {"schema": ref(schema)}}}
