"""The authorization endpoint's logic (RFC 6749 §4.1.1-§4.1.2, RFC 7636 §4.3, RFC 9700 §2.1).

``validate`` checks a request in the order the RFC requires: first what decides whether
a redirect is safe at all (client and exact redirect_uri), then everything that is
answered by a redirect carrying ``error``. ``decide`` says what the user agent gets next:
the sign-in page, a page where the user decides, or the redirect back to the client;
``issue_code`` records the grant and mints the single-use code.

No code is issued without the user's action where nothing else vouches for where it goes
(RFC 8252 §8.6): a public client whose redirect is a loopback address or a private-use
scheme cannot prove it is the app it names (any local process can listen on a loopback
port, any app can claim a scheme), so even a first-party one gets a one-click page that
names the app, the scopes and where the code goes; and ``admin`` is never granted without
such a page, whatever the client (:func:`needs_the_user`). Clicks alone never grant ``admin``
to such an app: its page shows a confirmation code the person types into the program that
started the flow, and only the exchange that carries it redeems the code
(:func:`needs_confirmation`, ``oauth/confirmation.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import parse_qsl, urlsplit

from tokensvc.identifiers import is_loopback
from tokensvc.oauth import audience, hashing, pkce, scopes
from tokensvc.oauth import confirmation as confirmations
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import (
    AccessDenied,
    InvalidRequest,
    InvalidScope,
    InvalidTarget,
    RedirectError,
    RedirectUnverified,
    UnsupportedResponseType,
    redirect_to,
)
from tokensvc.records import AuthorizationCode, Client, Installation, Subject, User
from tokensvc.telemetry import logs

PARAMETERS = (
    "response_type", "client_id", "redirect_uri", "scope", "state",
    "code_challenge", "code_challenge_method", "installation_id",
)
MAX_PARAMETER_LENGTH = 2048
AUTHORIZE_PATH = "/oauth/authorize"


@dataclass(slots=True)
class AuthorizationRequest:
    client: Client
    redirect_uri: str
    state: str | None
    scopes: list[str]
    code_challenge: str
    code_challenge_method: str
    installation_id: str | None
    scope_defaulted: bool = False
    audience: list[str] | None = None  # the resources named (RFC 8707), checked; None: none

    def hidden_fields(self) -> dict[str, str | list[str]]:
        """The parameters a consent form posts back (re-validated on the way in)."""
        fields: dict[str, str | list[str]] = {
            "response_type": "code",
            "client_id": self.client.client_id,
            "redirect_uri": self.redirect_uri,
            "scope": scopes.render(self.scopes),
            "code_challenge": self.code_challenge,
            "code_challenge_method": self.code_challenge_method,
        }
        if self.state is not None:
            fields["state"] = self.state
        if self.installation_id is not None:
            fields["installation_id"] = self.installation_id
        if self.audience is not None:
            fields["resource"] = list(self.audience)
        return fields


@dataclass(slots=True)
class SignIn:
    """The user agent signs in first, then comes back to ``request``."""

    request: AuthorizationRequest


@dataclass(slots=True)
class Consent:
    """A third-party client: the user is asked. ``confirmation``: the code the page shows, where
    :func:`needs_confirmation` (else None)."""

    request: AuthorizationRequest
    user: User
    installation: Installation | None
    confirmation: str | None = None


@dataclass(slots=True)
class Pairing:
    """A first-party client pairs a node installation: the user sees which before the code is
    issued (no consent prompt about scopes, but a named confirmation)."""

    request: AuthorizationRequest
    user: User
    installation: Installation
    confirmation: str | None = None


@dataclass(slots=True)
class Confirm:
    """A first-party client whose code the user must send on themselves (:func:`needs_the_user`):
    the one-click page of a streamlined consent, naming the app, the scopes and where the code goes."""

    request: AuthorizationRequest
    user: User
    installation: None = None  # as the other pages' outcomes say it: no installation is paired
    confirmation: str | None = None


@dataclass(slots=True)
class Issued:
    """A code was issued: the user agent goes back to the client."""

    location: str


def _single_getter(args: dict[str, list[str]]):
    def single(name: str) -> str | None:
        values = args.get(name)
        if not values:
            return None
        if len(values) > 1:
            raise InvalidRequest(f"Parameter '{name}' is repeated")
        return values[0]

    return single


async def verify_redirect(ctx: OAuthContext, args: dict[str, list[str]]) -> tuple[Client, str]:
    """The client and the redirect_uri it registered, or RedirectUnverified.

    This is what decides whether the user agent may ever be sent to the client (RFC 6749
    §4.1.2.1), and so what the sign-in and consent pages may let their forms lead to.
    """
    single = _single_getter(args)
    try:
        client_id = single("client_id")
        redirect_uri = single("redirect_uri")
    except InvalidRequest as exc:
        raise RedirectUnverified(exc.description or "Repeated parameter",
                                 "The link that sent you here is malformed: it repeats a part of itself.") from None
    if not client_id:
        raise RedirectUnverified("The request names no client (client_id is missing).",
                                 "The link that sent you here does not say which app it comes from.")
    client = await ctx.store.get_client(client_id) if len(client_id) <= 128 else None
    if client is None:
        raise RedirectUnverified("The client that sent you here is not registered with this service.",
                                 "The app that sent you here is not known to this service.")
    if client.resource_server:
        raise RedirectUnverified("The client that sent you here is an API: it cannot ask for authorization.",
                                 f"{client.name} is an API, not an app: it cannot ask for authorization.")
    if not redirect_uri:
        raise RedirectUnverified("The request carries no redirect_uri.",
                                 f"{client.name} did not say where to send you back to.")
    if not registered(redirect_uri, client):
        raise RedirectUnverified("The redirect_uri is not registered for this client.",
                                 f"{client.name} asked to send you back to an address it has not registered with "
                                 "this service, so you are not sent there.")
    return client, redirect_uri


LOOPBACK_IPS = ("127.0.0.1", "::1")


def registered(redirect_uri: str, client: Client) -> bool:
    """Whether ``redirect_uri`` is one of ``client``'s: an exact string comparison, no prefix
    or pattern (RFC 9700 §4.1.3). The one exception is a native app's: for a public client, a
    loopback IP redirect URI matches whatever port the request names (RFC 8252 §7.3: it
    listens on any free port). A confidential client is a server with an address of its own:
    its redirect URIs match exactly, loopback ones too, so that its code never goes to another
    port of the same host (any local process may listen there)."""
    if redirect_uri in client.redirect_uris:
        return True
    if client.confidential:
        return False
    try:
        asked = urlsplit(redirect_uri)
        if asked.scheme != "http" or asked.hostname not in LOOPBACK_IPS or asked.fragment or \
                asked.username is not None:
            return False
        asked.port  # noqa: B018 - a port that is not a number raises here
        for uri in client.redirect_uris:
            known = urlsplit(uri)
            if (known.scheme, known.hostname, known.path, known.query) == \
                    (asked.scheme, asked.hostname, asked.path, asked.query):
                return True
    except ValueError:
        return False
    return False


async def validate(ctx: OAuthContext, args: dict[str, list[str]]) -> AuthorizationRequest:
    """Check an authorization request. Raises RedirectUnverified (show an error page) or
    RedirectError (send the error to the client's redirect_uri)."""
    client, redirect_uri = await verify_redirect(ctx, args)
    state_values = args.get("state") or []
    state = state_values[0] if len(state_values) == 1 else None
    try:
        if len(state_values) > 1:
            raise InvalidRequest("Parameter 'state' is repeated")
        request = _validate_parameters(client, redirect_uri, state, _single_getter(args))
        # RFC 6749 §3.1: a parameter sent without a value is treated as omitted (as the token endpoints do).
        request.audience = await audience.requested(ctx, [value for value in args.get("resource") or [] if value])
    except (InvalidRequest, InvalidScope, InvalidTarget, UnsupportedResponseType) as exc:
        raise RedirectError(exc, redirect_uri, state, ctx.issuer) from None
    return request


async def client_behind(ctx: OAuthContext, target: str) -> tuple[Client, str] | None:
    """The verified (client, redirect_uri) of an authorization request that a same-site
    ``target`` (a sign-in's ``next``) leads to; None for any other target."""
    parts = urlsplit(target)
    if parts.path != AUTHORIZE_PATH:
        return None
    args: dict[str, list[str]] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=False):
        args.setdefault(name, []).append(value)
    try:
        return await verify_redirect(ctx, args)
    except RedirectUnverified:
        return None


def _validate_parameters(client: Client, redirect_uri: str, state: str | None, single) -> AuthorizationRequest:
    for name in PARAMETERS:
        value = single(name)
        if value is not None and len(value) > MAX_PARAMETER_LENGTH:
            raise InvalidRequest(f"Parameter '{name}' is too long")
    response_type = single("response_type")
    if response_type is None:
        raise InvalidRequest("response_type is required")
    if response_type != "code":
        raise UnsupportedResponseType("Only response_type=code is supported")
    challenge = single("code_challenge")
    if not challenge:
        raise InvalidRequest("code_challenge is required (PKCE)")
    method = single("code_challenge_method")
    if method != pkce.S256:
        raise InvalidRequest("code_challenge_method must be S256")
    if not pkce.is_valid_challenge(challenge):
        raise InvalidRequest("code_challenge is not a S256 challenge (43 base64url characters)")
    try:
        asked = scopes.parse(single("scope"))
    except ValueError as exc:
        raise InvalidScope(str(exc)) from None
    allowed = client.scopes
    defaulted = asked is None
    if asked is None:
        asked = list(allowed)
    else:
        # Only what the operator listed, literally: the read/write hierarchy applies when an
        # endpoint checks a token, never when a client asks, so the consent page only ever
        # shows scopes an operator registered.
        beyond = [scope for scope in asked if scope not in allowed]
        if beyond:
            raise InvalidScope("The client may not ask for: " + " ".join(beyond))
    if not asked:
        raise InvalidScope("No scope to grant")
    return AuthorizationRequest(client, redirect_uri, state, asked, challenge, method,
                                single("installation_id"), defaulted)


async def resolve_subject(ctx: OAuthContext, request: AuthorizationRequest,
                          user: User) -> tuple[Subject, Installation | None]:
    """The subject the code will be issued to: the user, or the installation being paired.

    Pairing needs the user to operate the installation (or to be an admin); the ``admin``
    scope only goes to admin users (left out of a defaulted scope, refused when asked for).
    """
    if scopes.ADMIN in request.scopes and not user.admin:
        if request.scope_defaulted and len(request.scopes) > 1:
            request.scopes = [scope for scope in request.scopes if scope != scopes.ADMIN]
            return await resolve_subject(ctx, request, user)
        raise RedirectError(InvalidScope("The admin scope is for administrators only"),
                            request.redirect_uri, request.state, ctx.issuer)
    if request.installation_id is None:
        return Subject(user_id=user.user_id), None
    installation = await ctx.store.get_installation(request.installation_id)
    if installation is None or not (user.admin or user.user_id in installation.operators):
        raise RedirectError(AccessDenied("You may not pair this installation"),
                            request.redirect_uri, request.state, ctx.issuer)
    return Subject(installation_id=installation.installation_id), installation


async def issue_code(ctx: OAuthContext, request: AuthorizationRequest, subject: Subject,
                     confirmation: str | None = None) -> str:
    """Record the grant and mint a code; returns the URL to redirect the user agent to. Where
    :func:`needs_confirmation`, ``confirmation`` is the code the person's page showed, and the
    code is stored under the digest of both (``confirmation.code_digest``): it is redeemed
    only with it. Without one there, nothing is issued (ValueError: no caller gets that far)."""
    if needs_confirmation(request.client, request.redirect_uri, request.scopes):
        if confirmation is None or confirmations.normalized(confirmation) != confirmation:
            raise ValueError("this authorization needs the confirmation code its page showed")
    elif confirmation is not None:
        raise ValueError("this authorization shows no confirmation code")
    now = ctx.clock()
    grant = await ctx.store.save_grant(request.client.client_id, subject, request.scopes, now)
    code = hashing.new_secret()
    await ctx.store.add_code(AuthorizationCode(
        code_hash=hashing.digest(code) if confirmation is None else confirmations.code_digest(code, confirmation),
        client_id=request.client.client_id,
        redirect_uri=request.redirect_uri,
        scopes=request.scopes,
        user_id=subject.user_id,
        installation_id=subject.installation_id,
        code_challenge=request.code_challenge,
        code_challenge_method=request.code_challenge_method,
        expires_at=now + timedelta(seconds=ctx.tokens.code_ttl),
        generation=grant.generation,
        grant_id=grant.grant_id,
        audience=request.audience,
    ))
    logs.audit("code_issued", {"client_id": request.client.client_id, "subject": subject.id,
                               "subject_type": subject.kind, "outcome": "success"}, message="authorization code issued")
    return redirect_to(request.redirect_uri, {"code": code, "state": request.state, "iss": ctx.issuer})


def native_redirect(redirect_uri: str) -> bool:
    """Whether a code sent to ``redirect_uri`` reaches whatever happens to listen there: an
    http loopback address (any local process may hold the port, RFC 8252 §8.3) or a
    private-use scheme (any app may claim it, §8.6). A claimed https address is vouched for by
    its host."""
    parts = urlsplit(redirect_uri)
    if parts.scheme == "http":
        return is_loopback(parts.hostname)
    return parts.scheme != "https"


def needs_the_user(request: AuthorizationRequest) -> bool:
    """Whether the code must wait for the user's click even for a first-party client: a public
    client with a native redirect (nothing proves the app is the one named, RFC 8252 §8.6: the
    streamlined consent the spec asks first-party clients for, never none), or a request that
    would grant ``admin``."""
    native = not request.client.confidential and native_redirect(request.redirect_uri)
    return native or scopes.ADMIN in request.scopes


def needs_confirmation(client: Client, redirect_uri: str, granted: list[str]) -> bool:
    """Whether clicks are not enough: an authorization that would grant ``admin`` to a public
    client with a native redirect (any local program may listen there, and the request, its
    PKCE challenge and port included, may be anyone's) is redeemed only with the confirmation
    code its page showed (``oauth/confirmation.py``). A confidential client's code is worth
    nothing without its secret, and an https redirect is vouched for by its host: those keep
    the one-click page alone."""
    return scopes.ADMIN in granted and not client.confidential and native_redirect(redirect_uri)


def record_consent(request: AuthorizationRequest, user: User, allowed: bool) -> None:
    """Audit the user's answer to a consent page."""
    outcome = "allowed" if allowed else "denied"
    logs.audit("consent", {"client_id": request.client.client_id, "subject": user.user_id,
                           "scopes": request.scopes, "outcome": outcome}, message=f"consent {outcome}")


async def decide(ctx: OAuthContext, args: dict[str, list[str]], user: User | None,
                 decision: str | None = None,
                 confirmation: str | None = None) -> SignIn | Consent | Pairing | Confirm | Issued:
    """What an authorization request (``decision``: the answer of a page's form, posted with
    its XSRF token, None for the request itself) leads to for ``user`` (None: not signed in).
    Third-party clients always get the consent page (the spec); pairing an installation names
    it first; a first-party client gets the one-click page where :func:`needs_the_user`, and
    otherwise its code without a prompt. Where :func:`needs_confirmation`, the page shows a
    confirmation code (``confirmation``: the one the answered page showed, verified by the
    caller; a new one when None) and an "allow" issues the code only for the confirmation
    its page showed: one without is answered with the page again. RedirectUnverified or
    RedirectError when it fails."""
    request = await validate(ctx, args)
    if user is None:
        return SignIn(request)
    subject, installation = await resolve_subject(ctx, request, user)
    if decision == "deny":
        record_consent(request, user, allowed=False)
        raise RedirectError(AccessDenied("The user denied the request"), request.redirect_uri, request.state,
                            ctx.issuer)
    if decision not in (None, "allow"):
        raise RedirectError(InvalidRequest("decision must be allow or deny"), request.redirect_uri, request.state,
                            ctx.issuer)
    confirming = needs_confirmation(request.client, request.redirect_uri, request.scopes)
    if decision == "allow" and confirming and confirmation is None:
        decision = None  # the answer of a page that showed no confirmation code: the page, with one
    shown = (confirmation or confirmations.new()) if confirming else None
    if decision == "allow":
        record_consent(request, user, allowed=True)
    elif not request.client.first_party:
        return Consent(request, user, installation, shown)
    elif installation is not None:
        return Pairing(request, user, installation, shown)
    elif needs_the_user(request):
        return Confirm(request, user, confirmation=shown)
    return Issued(await issue_code(ctx, request, subject, shown))
