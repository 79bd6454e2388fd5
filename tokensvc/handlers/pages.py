"""The HTML side: the authorization endpoint with its consent and pairing pages, sign-in and
sign-out, the account page, and the home page."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlencode, urlsplit

from tokensvc import schemas
from tokensvc.errors import NotFound, ValidationFailed, XsrfFailed
from tokensvc.handlers.edge import confirmation_field, guards, pace
from tokensvc.handlers.edge.headers import CONTROL
from tokensvc.handlers.edge.page_handler import PageHandler
from tokensvc.oauth import authorization, confirmation, connected_apps, hashing, revocation, sessions
from tokensvc.oauth.errors import RedirectError, RedirectUnverified
from tokensvc.ratelimit import ACCOUNT_STOPPED, BY_ACCOUNT, BY_BROWSER, TooManyFailures
from tokensvc.records import Subject, User

SCOPE_WORDS = {
    # write covers every <resource>:<action> (the scope rule), connected-apps:write and
    # sessions:write among them: its words say so.
    "read": "Read your data",
    "write": "Read, create and change your data, including which apps are connected to your account "
             "and where you are signed in",
    "admin": "Administer this service (inspect any token)",
    "sessions:read": "See where you are signed in (browsers and addresses)",
    "connected-apps:read": "See which apps are connected to your account",
}
INSTALLATION_SCOPE_WORDS = {
    "read": "Read this installation's data",
    "write": "Read, create and change this installation's data",
}


def describe_scopes(granted: list[str], descriptions: Mapping[str, str],
                    installation: bool = False) -> list[tuple[str, str]]:
    """Each scope with its words: the configuration's, the service's own for its vocabulary (an
    installation's when the subject is one), or the scope as the operator wrote it. Never words
    made from a request."""
    own = {**SCOPE_WORDS, **INSTALLATION_SCOPE_WORDS} if installation else SCOPE_WORDS
    return [(scope, descriptions.get(scope) or own.get(scope) or scope) for scope in granted]


def destination(redirect_uri: str, confirmed: bool = False) -> tuple[str, str]:
    """Where a code sent to ``redirect_uri`` goes, in a person's words after the app's name
    ("on this computer, port 53817"), and who else could have started the request; with
    ``confirmed`` (the page shows a confirmation code), who gets the access then."""
    parts = urlsplit(redirect_uri)
    typed = ": only the one you type the code into gets the access."
    if parts.scheme not in ("http", "https"):
        return (f"in the app that opens {parts.scheme}: links on this device",
                "Any app on this device can start this and claim those links" + (typed if confirmed else "."))
    if authorization.native_redirect(redirect_uri):
        return ("on this computer" + (f", port {parts.port}" if parts.port else ""),
                "Any program on this computer can start this" + (
                    typed if confirmed else ", and whatever listens on that port gets the access."))
    return f"at {parts.hostname}", "Any page you visit can send you here."


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


class FormPage(PageHandler):
    """A page whose form, left open across a sign-out or a restart, is shown again when its
    XSRF token has expired, instead of an error: the lifecycle's check decides, the page
    words the refusal."""

    form_expired = False

    def check_xsrf_cookie(self) -> None:
        try:
            super().check_xsrf_cookie()
        except XsrfFailed:
            self.form_expired = True
            self.set_status(403)


class AuthorizeHandler(FormPage):
    """``GET|POST {auth_url}/oauth/authorize`` (RFC 6749 §4.1.1); POST is the answer of the
    consent, pairing or one-click page. What the user agent gets next is
    :func:`authorization.decide`'s to say."""

    too_soon = False  # an "allow" that came before the page could be read (handlers/edge/pace.py)
    too_late = False  # or long after it was shown

    async def get(self) -> None:
        if self.at_base_url():
            # A client that took base_url for auth_url is sent on, its request whole.
            query = self.request.query
            self.redirect(self.config.auth_url + authorization.AUTHORIZE_PATH + ("?" + query if query else ""))
            return
        await self.handle(self.request.query_arguments, decision=None)

    async def post(self) -> None:
        if self.at_base_url():  # the consent form is posted from the page at auth_url only
            raise NotFound(f"No resource at {self.request.path}")
        arguments = self.request.body_arguments
        answer = arguments.get("decision", [b""])[0].decode("utf-8", "replace") or None
        shown = arguments.get(pace.FIELD, [b""])[-1].decode("ascii", "replace")
        if answer == "allow" and not self.form_expired:
            verdict = pace.judge(self.config.cookie_secret, self._session_id, shown, self.ctx.clock())
            if verdict is not None:  # a double click's second half, or a page shown long ago: the page again
                self.too_soon, self.too_late, answer = verdict == pace.TOO_SOON, verdict == pace.TOO_LATE, None
        # The confirmation code the page showed, if its form carries one signed for this session
        # (shown again with the page, and the one an "allow" issues the code for).
        carried = arguments.get(confirmation_field.FIELD, [b""])[-1].decode("ascii", "replace")
        code_shown = confirmation_field.shown(self.config.cookie_secrets, self._session_id, carried)
        # An expired form decides nothing either: the page is shown again.
        await self.handle(arguments, decision=None if self.form_expired else answer, code_shown=code_shown)

    def at_base_url(self) -> bool:
        """Whether the request names base_url's host where auth_url names another: the
        authorization endpoint is auth_url's (the interface: not served by base_url). Where both
        name one host, the listener cannot tell them apart and serves it."""
        base, auth = (urlsplit(url).hostname for url in (self.config.base_url, self.config.auth_url))
        return base != auth and guards.host_name(self.request) == base

    async def handle(self, raw_args: dict[str, list[bytes]], decision: str | None,
                     code_shown: str | None = None) -> None:
        """What the request leads to; ``code_shown``: the confirmation code the answered page showed."""
        try:
            args = {name: [value.decode("utf-8") for value in values] for name, values in raw_args.items()
                    if name not in ("decision", "_xsrf", pace.FIELD, confirmation_field.FIELD)}
        except UnicodeDecodeError:
            raise RedirectUnverified("The authorization request is not valid UTF-8.",
                                     "The link that sent you here is malformed.") from None
        found = await self.session()
        try:
            outcome = await authorization.decide(self.ctx, args, found[1] if found else None, decision, code_shown)
        except (RedirectUnverified, RedirectError):
            if self.form_expired:  # nothing to show again: the refusal itself
                raise XsrfFailed() from None
            raise
        if isinstance(outcome, authorization.SignIn):
            # The original query (GET) keeps an omitted scope omitted after sign-in.
            target = (self.request.uri if self.request.method == "GET"
                      else "/oauth/authorize?" + urlencode(outcome.request.hidden_fields(), doseq=True))
            after_post = 303 if self.request.method == "POST" else None
            self.redirect("/login?" + urlencode({"next": target}), status=after_post)
        elif isinstance(outcome, authorization.Issued):
            self.redirect(outcome.location)
        else:
            self.render_decision(outcome)

    def render_decision(self, outcome: authorization.Consent | authorization.Pairing | authorization.Confirm) -> None:
        """The page where the user decides: its form leads on to the verified redirect_uri
        (``form-action``), posts back with its XSRF token, and names where the code goes; where
        the answer needs one, it shows the confirmation code and its form carries it."""
        request, installation, code_shown = outcome.request, outcome.installation, outcome.confirmation
        self.allow_sources(form_action=[request.redirect_uri], img_src=[request.client.logo_url])
        where, warning = destination(request.redirect_uri, confirmed=code_shown is not None)
        template = {authorization.Pairing: "pairing.html", authorization.Confirm: "confirm.html"}.get(
            type(outcome), "consent.html")
        fields: dict[str, str | list[str]] = {
            **request.hidden_fields(), pace.FIELD: pace.stamp(self.config.cookie_secret, self._session_id,
                                                              self.ctx.clock())}
        if code_shown is not None:
            fields[confirmation_field.FIELD] = confirmation_field.field(self.config.cookie_secret, self._session_id,
                                                                        code_shown)
        self.render(template, client=request.client, user=outcome.user, installation=installation,
                    scopes=describe_scopes(request.scopes, self.config.scopes, installation is not None),
                    fields=[(name, value) for name, values in fields.items()
                            for value in (values if isinstance(values, list) else [values])],
                    destination=where, warning=warning, expired=self.form_expired,
                    too_soon=self.too_soon, too_late=self.too_late,
                    switch_to="/oauth/authorize?" + urlencode(request.hidden_fields(), doseq=True),
                    confirmation=confirmation.shown(code_shown) if code_shown is not None else None)


class LoginHandler(FormPage):
    """``GET|POST {auth_url}/login``: the sign-in form and its check."""

    async def get(self) -> None:
        await self.render_login(safe_next(self.get_query_argument("next", None)))

    async def post(self) -> None:
        form = self.form(schemas.login_form)
        target = safe_next(form.get("next"))
        if self.form_expired:
            return await self.render_login(target, "This form had expired. Sign in again.",
                                           form.get("username", "")[:128])
        try:
            data = self.load(schemas.login_form, form)
        except ValidationFailed:
            self.set_status(400)
            return await self.render_login(target, "Enter your username and password.",
                                           form.get("username", "")[:128])
        browser = self.known_browser()
        try:
            user = await sessions.sign_in(self.ctx, data["username"], data["password"], self.request.remote_ip or "-",
                                          browser)
        except TooManyFailures as exc:
            self.set_status(429)
            self.set_header("Retry-After", str(exc.retry_after))
            return await self.render_login(target, refusal(exc), data["username"])
        if user is None:
            self.set_status(401)
            return await self.render_login(target, "Wrong username or password.", data["username"])
        self.remember_browser((browser or sessions.KnownBrowser.new()).knowing(data["username"]))
        # The session this browser had, if any, ended; the new one started, then audited.
        self.start_session(await sessions.signed_in(self.ctx, user, self._session_id,
                                                    self.request.headers.get("User-Agent"),
                                                    self.request.remote_ip))
        self.redirect(target)

    async def render_login(self, target: str, error: str | None = None, username: str = "") -> None:
        """The sign-in form. When ``target`` is an authorization request of a registered
        client, the page names that client, and its form may lead on (through
        ``/oauth/authorize``) to the client's verified redirect_uri. A browser already signed
        in is told so."""
        behind = await authorization.client_behind(self.ctx, target)
        if behind is not None:
            self.allow_sources(form_action=[behind[1]])
        found = await self.session()
        self.render("login.html", next=target, error=error, username=username,
                    client=behind[0] if behind else None, signed_in=found[1] if found else None)


def refusal(refused: TooManyFailures) -> str:
    """What the sign-in page says of a limit's refusal: how long, and what the owner may do
    meanwhile (docs/security.md, the password's limits)."""
    wait = in_words(refused.retry_after)
    if refused.reason == ACCOUNT_STOPPED:
        return ("Too many failed sign-in attempts for this account. Sign in from a browser you have signed in with "
                f"before, ask an operator to set a new password, or try again in {wait}.")
    if refused.reason == BY_ACCOUNT:
        return (f"Too many failed sign-in attempts for this account. Try again in {wait}, or sign in from a browser "
                "you have signed in with before.")
    if refused.reason == BY_BROWSER:
        return f"Too many failed sign-in attempts in this browser. Try again in {wait}."
    return f"Too many failed sign-in attempts. Try again in {wait}."


def in_words(seconds: int) -> str:
    """A wait as a person says it: "5 minutes", "2 hours", "30 days" (rounded, at least 1 minute)."""
    for unit, size in (("day", 86400), ("hour", 3600)):
        if seconds >= 2 * size:
            count = round(seconds / size)
            return f"{count} {unit}s"
    minutes = max(1, round(seconds / 60))
    return f"{minutes} minute{'s' if minutes > 1 else ''}"


class LogoutHandler(PageHandler):
    """``GET|POST {auth_url}/logout``: the pages' sign-out button posts here and is sent on
    (303) to the signed-out page, so that Back never offers to post again; with ``next`` (an
    authorization request: "Switch account"), to sign in again and return there."""

    async def get(self) -> None:
        found = await self.session()
        self.render("signed_out.html", user=found[1] if found else None)

    async def post(self) -> None:
        target = self.get_body_argument("next", None)
        await sessions.end(self.ctx, self._session_id)
        self.end_session()
        if target:
            self.redirect("/login?" + urlencode({"next": safe_next(target)}), status=303)
        else:
            self.redirect("/logout", status=303)


class AccountHandler(PageHandler):
    """``GET|POST {auth_url}/account``: who is signed in, their connected apps, the paired
    installations they operate and their sessions. Remove and Unpair ask first (``?remove=``,
    ``?unpair=``), then post here and come back saying what happened."""

    async def get(self) -> None:
        user = await self.signed_in_user()
        if user is None:
            return
        apps = await connected_apps.list_connected(self.ctx, Subject(user_id=user.user_id))
        installations = await connected_apps.paired_installations(self.ctx, user)
        current = hashing.digest(self._session_id) if self._session_id else None
        self.allow_sources(img_src=[app.logo_url for app in apps])
        notice = await self.notice()
        self.render("account.html", user=user, notice=notice,
                    apps=[(app, describe_scopes(app.scopes, self.config.scopes)) for app in apps],
                    installations=installations,
                    sessions=[(session, sessions.browser_of(session.user_agent), session.session_hash == current)
                              for session in await sessions.list_sessions(self.ctx, user)],
                    confirm_remove=self.get_query_argument("remove", None),
                    confirm_unpair=self.get_query_argument("unpair", None))

    async def post(self) -> None:
        # The form before its caller, as every route checks its input: a fault is 422 (a
        # page) whether or not the browser is signed in.
        data = self.load(schemas.account_form, self.form(schemas.account_form, validation=True))
        user = await self.signed_in_user()
        if user is None:
            return
        action, done = data["action"], ""
        if action == "remove" and data.get("client_id"):
            await revocation.revoke_connected_app(self.ctx, Subject(user_id=user.user_id), data["client_id"])
            done = urlencode({"removed": data["client_id"]})
        elif action == "unpair" and data.get("installation_id"):
            await connected_apps.unpair(self.ctx, user, data["installation_id"])
            done = urlencode({"unpaired": data["installation_id"]})
        elif action == "end-session" and data.get("session_id"):
            done = urlencode({"ended": int(await sessions.end_one(self.ctx, user, data["session_id"]))})
        elif action == "end-others":
            done = urlencode({"ended": await sessions.end_others(self.ctx, user, self._session_id)})
        self.redirect("/account" + ("?" + done if done else ""), status=303)

    async def notice(self) -> str | None:
        """What the last action did, in words (its client and installation looked up, never
        text taken from the address)."""
        removed, unpaired = self.get_query_argument("removed", None), self.get_query_argument("unpaired", None)
        ended = self.get_query_argument("ended", None)
        if removed:
            client = await self.ctx.store.get_client(removed) if len(removed) <= 128 else None
            name = client.name if client else "The app"
            return f"{name} no longer has access to your account."
        if unpaired:
            installation = await self.ctx.store.get_installation(unpaired) if len(unpaired) <= 128 else None
            name = installation.name if installation else "The installation"
            return f"{name} is unpaired: its node software must be paired again."
        if ended is not None and ended.isdigit():
            count = int(ended)
            return ("No other session was signed in." if count == 0 else
                    f"Signed out of {count} other session{'s' if count > 1 else ''}.")
        return None

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
