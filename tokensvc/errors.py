"""The one error base: every error the service answers with is an :class:`HTTPAnswer`.

An answer owns its response: its status, its body (a JSON object, or nothing) and its headers,
as node-oidc-provider's ``OIDCProviderError`` and Authlib's errors do. The protocol errors
(:mod:`tokensvc.oauth.errors`), the failure limits' 429 (:mod:`tokensvc.ratelimit`) and the
web layer's own answers below all subclass it, so adding an error never means listing it
somewhere else. The web layer renders any answer once per output format
(:mod:`tokensvc.handlers.edge.lifecycle`); a page shows its ``title`` and ``message``. Nothing here
imports a web framework: the protocol layer raises these.
"""

from __future__ import annotations

from http.client import responses
from typing import Any


def reason_phrase(status: int) -> str:
    return responses.get(status, "Unknown")


class HTTPAnswer(Exception):
    """An error that is an answer: not a fault, so it gets its response and no traceback."""

    status_code: int = 500

    def body(self) -> dict[str, Any] | None:
        """The JSON body; None for an answer with no body (a redirect)."""
        return {"detail": str(self)}

    def headers(self) -> dict[str, str]:
        return {}

    @property
    def title(self) -> str:
        """What a page calls it."""
        return reason_phrase(self.status_code)

    @property
    def message(self) -> str:
        """What a page says about it, in plain words."""
        body = self.body() or {}
        for key in ("error_description", "detail"):
            if isinstance(body.get(key), str):
                return body[key]
        return "Something went wrong."

    @property
    def error_code(self) -> str | None:
        """The OAuth error code the access line names, if any."""
        body = self.body() or {}
        return body["error"] if isinstance(body.get("error"), str) else None


class Detail(HTTPAnswer):
    """An answer whose body is ``{"detail": "..."}``."""

    def __init__(self, detail: str, status_code: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if status_code is not None:
            self.status_code = status_code

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail}


class BadRequest(Detail):
    status_code = 400

    def __init__(self, detail: str = "Bad Request") -> None:
        super().__init__(detail)


class Forbidden(Detail):
    status_code = 403


class XsrfFailed(Forbidden):
    """An unsafe request carrying the session cookie (or a page's form) without a valid XSRF
    token: 403."""

    def __init__(self) -> None:
        super().__init__("XSRF check failed")

    @property
    def title(self) -> str:
        return "This form has expired"

    @property
    def message(self) -> str:
        return "It was left open too long, or did not come from this service. Go back, reload the page and try again."


class NotFound(Detail):
    """Unknown resource: 404 ``{"detail"}``."""

    status_code = 404

    @property
    def title(self) -> str:
        return "Nothing here"

    @property
    def message(self) -> str:
        return "There is no page at this address. Check it, or start again from the home page."


class MethodNotAllowed(Detail):
    """405, with ``Allow`` naming what the route answers (RFC 9110 §15.5.6)."""

    status_code = 405

    def __init__(self, allowed: frozenset[str] | tuple[str, ...]) -> None:
        super().__init__("Method Not Allowed")
        self.allowed = allowed

    def headers(self) -> dict[str, str]:
        return {"Allow": ", ".join(sorted(self.allowed))}

    @property
    def title(self) -> str:
        return "Not a page to open"

    @property
    def message(self) -> str:
        return "This address only takes what a form or an app sends; it is not a page of its own."


class TooLarge(Detail):
    """A request over one of the service's sizes, refused before any field of it is read: 413
    its body, 414 its target (path and query), 431 its header fields (RFC 6585 §5)."""

    def __init__(self, status_code: int = 413, detail: str = "Request Entity Too Large") -> None:
        super().__init__(detail)
        self.status_code = status_code

    @property
    def message(self) -> str:
        return "What was sent is too large."


class ValidationFailed(HTTPAnswer):
    """Input failed field validation: 422 HTTPValidationError."""

    status_code = 422

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__("validation failed")
        self.detail = detail

    @classmethod
    def one(cls, loc: list[str], msg: str, type_: str, input_: Any = None) -> ValidationFailed:
        """A single fault at ``loc`` (``["body"]``, ``["path", "client_id"]`` ...)."""
        return cls([{"loc": loc, "msg": msg, "type": type_, "input": input_, "ctx": {}}])

    @classmethod
    def missing(cls, location: str, name: str) -> ValidationFailed:
        """A required field that is not there (``location``: body, query or path)."""
        return cls.one([location, name], "Field required", "missing")

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail}

    @property
    def message(self) -> str:
        return "Some of the information sent was not valid."


class BadHandshake(ValidationFailed):
    """A request that is no WebSocket opening handshake: 400, as RFC 6455 §4.2.1 asks, with the
    fault of its header as an HTTPValidationError, as the interface asks of any input."""

    status_code = 400

    def __init__(self, header: str, message: str, given: str | None) -> None:
        super().__init__([{"loc": ["header", header], "msg": message, "type": "value_error", "input": given,
                           "ctx": {}}])


class UpgradeRequired(BadHandshake):
    """426: a WebSocket handshake of a version this service does not speak (RFC 6455 §4.2.2),
    naming the one it does."""

    status_code = 426

    def __init__(self, version: str, given: str | None) -> None:
        super().__init__("Sec-WebSocket-Version", f"WebSocket version {version} only", given)
        self.version = version

    def headers(self) -> dict[str, str]:
        # RFC 9110 §7.8: an Upgrade header field is sent with the "upgrade" connection option.
        return {"Sec-WebSocket-Version": self.version, "Upgrade": "websocket", "Connection": "Upgrade"}


class Redirect(HTTPAnswer):
    """An answer that sends the user agent elsewhere: no body, a ``Location``."""

    status_code = 302

    def __init__(self, location: str, status_code: int = 302) -> None:
        super().__init__(location)
        self.location = location
        self.status_code = status_code

    def body(self) -> None:
        return None

    def headers(self) -> dict[str, str]:
        return {"Location": self.location}


class StoreUnavailable(Detail):
    """The store did not answer: 503 with ``Retry-After``."""

    status_code = 503

    def __init__(self, retry_after: int) -> None:
        super().__init__("The token store is not answering; try again shortly.")
        self.retry_after = retry_after

    @property
    def title(self) -> str:
        return "Unavailable for a moment"

    @property
    def message(self) -> str:
        return "The service cannot reach its data just now. Try again in a few seconds."

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class NotReady(StoreUnavailable):
    """``/readyz`` while this instance should take no traffic: the store's 503, saying why
    (``reason``: start-up has not prepared the store, a member that takes no writes, a store
    that has not answered)."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(retry_after)
        self.reason = reason

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail, "reason": self.reason}


class FeedFull(Detail):
    """A revocation feed reader refused before the upgrade, for a cap: 429 when its client has
    as many readers open as it may, 503 when this process has (or is stopping); ``Retry-After``
    and the ``reason`` in either."""

    def __init__(self, reason: str, detail: str, retry_after: int, status_code: int) -> None:
        super().__init__(detail, status_code)
        self.reason, self.retry_after = reason, retry_after

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail, "reason": self.reason}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class StoreRefused(Detail):
    """The store refused for good: 500 without ``Retry-After``, which would promise a recovery."""

    status_code = 500

    def __init__(self) -> None:
        super().__init__("The token store refused the operation; the operator has been told.")


class InternalError(Detail):
    status_code = 500

    def __init__(self) -> None:
        super().__init__("Internal server error")

    @property
    def title(self) -> str:
        return "Something went wrong"

    @property
    def message(self) -> str:
        return "The service failed to answer this. Try again; if it keeps failing, tell its operators."
