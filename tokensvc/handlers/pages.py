"""The HTML side: the authorization endpoint with its consent page, sign-in and sign-out
pages, and the home page."""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit

from tokensvc import schemas
from tokensvc.errors import ValidationFailed
from tokensvc.handlers.headers import CONTROL
from tokensvc.handlers.page import PageHandler
from tokensvc.oauth import authorization, connected_apps, revocation, sessions
from tokensvc.oauth.authorization import AuthorizationRequest
from tokensvc.oauth.errors import RedirectUnverified
from tokensvc.ratelimit import TooManyFailures
from tokensvc.records import Subject, User

SCOPE_WORDS = {
    "read": "Read your data",
    "write": "Read, create and change your data",
    "admin": "Administer this service (inspect any token)",
}


def describe_scopes(granted: list[str], descriptions: dict[str, str]) -> list[tuple[str, str]]:
    """Each scope with its words: the configuration's, the service's own for its vocabulary,
    or the scope as the operator wrote it. Never words made from a request."""
    return [(scope, descriptions.get(scope) or SCOPE_WORDS.get(scope) or scope) for scope in granted]


def safe_next(target: str | None) -> str:
    """A same-site path to return to after sign-in; anything else becomes ``/`` (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or target.startswith("/\\"):
        return "/"
    if CONTROL.search(target) or "\\" in target:
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return "/"
    return target


class AuthorizeHandler(PageHandler):
    """``GET|POST {auth_url}/oauth/authorize`` (RFC 6749 §4.1.1); POST is the consent decision.
    What the user agent gets next is :func:`authorization.decide`'s to say."""

    async def get(self) -> None:
        await self.handle(self.request.query_arguments, decision=None)

    async def post(self) -> None:
        arguments = self.request.body_arguments
        answer = arguments.get("decision", [b""])[0].decode("utf-8", "replace")
        await self.handle(arguments, decision=answer or None)

    async def handle(self, raw_args: dict[str, list[bytes]], decision: str | None) -> None:
        try:
            args = {name: [value.decode("utf-8") for value in values] for name, values in raw_args.items()}
        except UnicodeDecodeError:
            raise RedirectUnverified("The authorization request is not valid UTF-8.") from None
        found = await self.session()
        outcome = await authorization.decide(self.ctx, args, found[1] if found else None, decision)
        if isinstance(outcome, authorization.SignIn):
            # The original query (GET) keeps an omitted scope omitted after sign-in.
            target = (self.request.uri if self.request.method == "GET"
                      else "/oauth/authorize?" + urlencode(outcome.request.hidden_fields()))
            self.redirect("/login?" + urlencode({"next": target}))
        elif isinstance(outcome, authorization.Consent):
            self.render_consent(outcome.request, outcome.user, outcome.installation)
        else:
            self.redirect(outcome.location)

    def render_consent(self, request: AuthorizationRequest, user: User, installation) -> None:
        self.allow_sources(form_action=[request.redirect_uri], img_src=[request.client.logo_url])
        self.render("consent.html", client=request.client, user=user, installation=installation,
                    scopes=describe_scopes(request.scopes, self.config.scopes),
                    fields=request.hidden_fields(), redirect_host=urlsplit(request.redirect_uri).netloc)


class LoginHandler(PageHandler):
    """``GET|POST {auth_url}/login``: the sign-in form and its check."""

    async def get(self) -> None:
        await self.render_login(safe_next(self.get_query_argument("next", None)))

    async def post(self) -> None:
        form = self.form(schemas.login_form)
        target = safe_next(form.get("next"))
        try:
            data = self.load(schemas.login_form, form)
        except ValidationFailed:
            self.set_status(400)
            return await self.render_login(target, "Enter your username and password.",
                                           form.get("username", "")[:128])
        try:
            user = await sessions.sign_in(self.ctx, data["username"], data["password"], self.request.remote_ip or "-")
        except TooManyFailures as exc:
            self.set_status(429)
            self.set_header("Retry-After", str(exc.retry_after))
            minutes = max(1, round(exc.retry_after / 60))
            return await self.render_login(target, f"Too many failed sign-in attempts. Try again in {minutes} "
                                                   f"minute{'s' if minutes > 1 else ''}.", data["username"])
        if user is None:
            self.set_status(401)
            return await self.render_login(target, "Wrong username or password.", data["username"])
        await sessions.end(self.ctx, self._session_id)  # the session this browser had, if any
        self.start_session(await sessions.start(self.ctx, user))
        self.redirect(target)

    async def render_login(self, target: str, error: str | None = None, username: str = "") -> None:
        """The sign-in form. When ``target`` is an authorization request of a registered
        client, the page names that client, and its form may lead on (through
        ``/oauth/authorize``) to the client's verified redirect_uri."""
        behind = await authorization.client_behind(self.ctx, target)
        if behind is not None:
            self.allow_sources(form_action=[behind[1]])
        self.render("login.html", next=target, error=error, username=username,
                    client=behind[0] if behind else None)


class LogoutHandler(PageHandler):
    """``POST {auth_url}/logout``: the sign-out button of the web pages."""

    async def post(self) -> None:
        await sessions.end(self.ctx, self._session_id)
        self.end_session()
        self.render("signed_out.html")


class AccountHandler(PageHandler):
    """``GET|POST {auth_url}/account``: who is signed in and their connected apps; the form
    of each app's Remove button posts its ``client_id`` here."""

    async def get(self) -> None:
        user = await self.signed_in_user()
        if user is None:
            return
        apps = await connected_apps.list_connected(self.ctx, Subject(user_id=user.user_id))
        self.allow_sources(img_src=[app.logo_url for app in apps])
        self.render("account.html", user=user,
                    apps=[(app, describe_scopes(app.scopes, self.config.scopes)) for app in apps])

    async def post(self) -> None:
        user = await self.signed_in_user()
        if user is None:
            return
        client_id = self.load(schemas.remove_app_form, self.form(schemas.remove_app_form))["client_id"]
        await revocation.revoke_connected_app(self.ctx, Subject(user_id=user.user_id), client_id)
        self.redirect("/account", status=303)  # removed, or already gone: the page shows which

    async def signed_in_user(self) -> User | None:
        """The signed-in user; otherwise the browser is sent to sign in and back here."""
        found = await self.session()
        if found is None:
            self.redirect("/login?" + urlencode({"next": "/account"}), status=303)
            return None
        return found[1]


class HomeHandler(PageHandler):
    """``GET /``: who is signed in, and where the endpoints are."""

    async def get(self) -> None:
        found = await self.session()
        self.render("home.html", user=found[1] if found else None, base_url=self.config.base_url,
                    auth_url=self.config.auth_url)
