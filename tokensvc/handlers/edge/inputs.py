"""Reading a request: form and query parameters as single values, schema validation into
422 HTTPValidationError, path ids, and the session cookie. Shared by both adapters."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

import tornado.httputil
import tornado.web
from marshmallow import Schema, fields

from tokensvc import schemas
from tokensvc.config import Settings
from tokensvc.errors import ValidationFailed
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import InvalidRequest

JSON, HTML = "json", "html"  # the two output formats
# The class attributes that carry a handler's security decisions (RequestInput's table).
SECURITY_ATTRIBUTES = ("default_headers", "output", "max_body", "reads_session", "bearer_replaces_cookie", "cors",
                       "path_schema", "accept_query_token")


class RequestInput:
    """What every handler is to the request lifecycle, whichever adapter it is built on
    (:class:`.json_handler.JsonHandler`, :class:`.web_handler.WebHandler`), and how it reads its
    request.

    **The decisions a handler class carries.** Each is a class attribute that the edge reads
    for every request of the route; a subclass changes one only where its route needs it
    (:data:`SECURITY_ATTRIBUTES`, CONTRIBUTING.md holds the same table):

    - ``default_headers`` (the format's: ``JSON_HEADERS``, ``PAGE_HEADERS``): the security and
      caching headers of every answer, errors included (:mod:`.headers`);
    - ``output`` (``JSON`` or ``HTML``): the shape of a refusal, JSON or the error page;
    - ``max_body`` (``MAX_BODY_BYTES``): a larger body is 413; None: the body is never read;
    - ``reads_session`` (True): the session cookie may authorize it, so an unsafe request
      proves it came from the service's pages (XSRF, :mod:`.guards`);
    - ``bearer_replaces_cookie`` (False; True with :class:`.auth.AuthMixin`): an
      ``Authorization`` header takes the cookie's place, and needs no XSRF proof;
    - ``cors`` (False): browser apps of other origins may call it (:mod:`.cors`), and OPTIONS
      is answered;
    - ``path_schema`` (None; :class:`.json_handler.JsonHandler`): what the path's ``{name}``
      segments may be (422 otherwise);
    - ``accept_query_token`` (False; :class:`.auth.AuthMixin`): a WebSocket's ``access_token``
      query parameter authenticates (RFC 6750 §2.3).

    Two decisions are not attributes: which listener serves a route is the route table it is in
    (``app.ROUTES`` or the admin listener's ``app.ADMIN_ROUTES``), and which scope a method
    needs is its ``@requires(scope)`` (:mod:`.auth`).

    **One way to answer.** A handler answers once, with a whole answer: a JSON route with
    ``send_json(body, status)`` (or ``send`` for bytes of another type), a page with ``render``
    or ``redirect`` (after ``set_status`` or ``set_header`` where it needs them); a refusal is
    raised as an :class:`~tokensvc.errors.HTTPAnswer`, which the exit renders in the route's
    shape. No endpoint calls Tornado's ``write``, ``flush`` or ``finish``: those are the
    adapters' own, and every answer leaves through the request's exit (:mod:`.exit`).
    """

    request: tornado.httputil.HTTPServerRequest
    ctx: OAuthContext
    config: Settings
    default_headers: ClassVar[dict[str, str]]  # the security (and caching) headers of its answers
    output: ClassVar[str]  # JSON or HTML
    max_body: ClassVar[int | None]  # larger bodies get 413; None: any body is ignored unread
    reads_session: ClassVar[bool]  # whether the session cookie may authorize it (XSRF applies then)
    # Whether an Authorization header takes the cookie's place (the /v1 API's bearer tokens):
    # only then does a request with one need no XSRF token, cookie or not.
    bearer_replaces_cookie: ClassVar[bool] = False
    cors: ClassVar[bool] = False  # whether browser apps of other origins may call it (handlers/edge/cors.py)
    log_client_id: str | None = None  # the client the access line names, once known

    def logged_client_id(self) -> str | None:
        """The client the access line names."""
        return self.log_client_id

    def form(self, schema: Schema, *, validation: bool = False) -> dict[str, str]:
        """The form-encoded body's parameters that ``schema`` knows, as single values.

        Empty values count as absent and unknown parameters are ignored (RFC 6749 §3.1); a
        known one sent twice, or not UTF-8, is ``invalid_request`` (§3.2: the token
        endpoints' answer), or with ``validation`` a 422 HTTPValidationError at its name.
        """
        return single_values(self.request.body_arguments, schema, "body" if validation else None)

    def query(self, schema: Schema, *, validation: bool = False) -> dict[str, str]:
        """The query's parameters that ``schema`` knows, as :meth:`form` reads a body's."""
        return single_values(self.request.query_arguments, schema, "query" if validation else None)

    @staticmethod
    def load(schema: Schema, data: dict[str, Any], location: str = "body") -> dict[str, Any]:
        return schemas.load(schema, data, location)

    def raw_session_id(self) -> str | None:
        """The session id in the signed session cookie, if there is a valid one. Only a route
        that declares it reads the session may: the XSRF rule applies to it then."""
        if not self.reads_session:
            raise RuntimeError(f"{type(self).__name__} does not read the session (reads_session = False)")
        morsel = self.request.cookies.get(self.config.session_cookie)
        if morsel is None:
            return None
        # Signed with the first key of cookie_secret; any of its keys verifies (a rotation).
        for secret in self.config.cookie_secrets:
            raw = tornado.web.decode_signed_value(secret, self.config.session_cookie, morsel.value,
                                                  max_age_days=self.cookie_days())
            if raw:
                return raw.decode("ascii", "replace")
        return None

    def cookie_days(self) -> float:
        return self.config.tokens.session_ttl / 86400


def single_values(arguments: dict[str, list[bytes]], schema: Schema, location: str | None = None) -> dict[str, str]:
    """Each parameter ``schema`` knows as one string. A parameter sent twice or not UTF-8 is
    ``invalid_request``, or, given the ``location`` it is read from, a validation fault there.
    A repeatable one (a list in ``schema``, as ``resource``) is left to its handler."""
    known = schema.fields
    values: dict[str, str] = {}
    for name, raw in arguments.items():
        if name not in known or isinstance(known[name], fields.List):
            continue
        present = [item for item in raw if item]
        if not present:
            continue
        if len(present) > 1:
            if location is not None:
                raise ValidationFailed.one([location, name], "Value error, sent more than once", "value_error")
            raise InvalidRequest(f"Parameter '{name}' is repeated")
        try:
            values[name] = present[0].decode("utf-8")
        except UnicodeDecodeError:
            if location is not None:
                raise ValidationFailed.one([location, name], "Input should be a valid string: not UTF-8",
                                           "string_unicode", quote(present[0], safe="")) from None
            raise InvalidRequest(f"Parameter '{name}' is not valid UTF-8") from None
    return values
