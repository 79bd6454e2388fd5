"""Web sessions and sign-in: password check against a slow KDF, and the server-side session
record behind the ``<service_name>_session`` cookie (which carries only a random id)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass
from datetime import timedelta

from tokensvc.oauth import hashing, revocation
from tokensvc.oauth.context import OAuthContext
from tokensvc.ratelimit import TooManyFailures, account_counter
from tokensvc.records import Session, User
from tokensvc.storage.base import SESSION, USER, Revocation, StorageError, StoreFault
from tokensvc.telemetry import logs


async def sign_in(ctx: OAuthContext, username: str, password: str, address: str,
                  browser: KnownBrowser | None = None) -> User | None:
    """The user when the password is right, None when not; TooManyFailures (429) when a limit
    is reached (:meth:`FailureLimits.sign_in_attempts`): the username or the address failed too
    often there, or the account from browsers it does not know, from any number of addresses;
    from a ``browser`` that signed in to the account before (its cookie, which the handler
    verified), that browser did. Every refusal is audited here, a right password by
    :func:`signed_in`; a failed one names the username only when such a user exists (what was
    typed may be a password typed in the wrong field)."""
    limits = ctx.limits
    known = browser is not None and browser.knows(username)
    try:  # before the slow check
        reservation = await limits.reserve(limits.sign_in_attempts(
            username, address, browser.browser_id if known and browser is not None else None))
    except TooManyFailures as refused:
        logs.audit("login", {"username": await _known(ctx, username), "outcome": "rate_limited",
                             "limit": refused.reason, "remote_ip": address}, logging.WARNING, "login refused")
        ctx.metrics.refused_by_limit("login")
        raise
    named, right = await check_password(ctx, username, password)
    if named is None or not right:
        logs.audit("login", {"username": named.username if named else UNKNOWN_USER, "outcome": "failure",
                             "remote_ip": address}, logging.WARNING, "login failed")
        ctx.metrics.failed_login()
        return None  # the attempt stays counted
    limits.release(reservation, clear_account=True)
    if known:  # the account's own failures since its last sign-in end with this one too
        limits.signed_in(username)
    return named  # audited once its session is started (:func:`signed_in`)


async def signed_in(ctx: OAuthContext, user: User, session_id: str | None, user_agent: str | None,
                    address: str | None) -> str:
    """Start the session of ``user``, whose password :func:`sign_in` found right, ending the one
    ``session_id`` names (the browser's before, if any); the new session's id. Audited as the
    user finds it: a success only once the session is written; a store that fails first (503)
    is an error."""
    try:
        await end(ctx, session_id)
        started = await start(ctx, user, user_agent, address)
    except (StorageError, StoreFault):
        logs.audit("login", {"subject": user.user_id, "username": user.username, "outcome": "error",
                             "remote_ip": address or "-"}, logging.WARNING, "login not completed: the store failed")
        raise
    logs.audit("login", {"subject": user.user_id, "username": user.username, "outcome": "success",
                         "remote_ip": address or "-"}, message="login succeeded")
    return started


# How many accounts a browser's cookie remembers having signed in with it (the latest first).
BROWSER_ACCOUNTS = 5


@dataclass(frozen=True, slots=True)
class KnownBrowser:
    """A browser, as its cookie (``<service_name>_browser``, signed with the cookie secret)
    tells: a random id of its own, and the accounts that signed in with it (each as
    :func:`ratelimit.account_counter`, a digest of the username's key, never the username). A
    sign-in from a browser known to its account counts against that browser's limits and not
    the account's (:meth:`FailureLimits.sign_in_attempts`): the owner signs in where they did
    before, whatever anyone else fails. Not a credential: the password is still asked."""

    browser_id: str
    accounts: tuple[str, ...] = ()

    @classmethod
    def new(cls) -> KnownBrowser:
        return cls(hashing.new_secret()[:22])  # 128 random bits

    def knows(self, username: str) -> bool:
        return account_counter(username) in self.accounts

    def knowing(self, username: str) -> KnownBrowser:
        """This browser, having signed in to ``username`` now (the latest first)."""
        account = account_counter(username)
        return KnownBrowser(self.browser_id, (account, *[a for a in self.accounts if a != account])[:BROWSER_ACCOUNTS])

    def value(self) -> str:
        """What its cookie carries (before the handler signs it)."""
        return f"{self.browser_id}|{','.join(self.accounts)}"

    @classmethod
    def parse(cls, value: str) -> KnownBrowser | None:
        """A browser from its cookie's (verified) value; None when it is not one."""
        browser_id, sep, accounts = value.partition("|")
        if not sep or not _BROWSER_ID.fullmatch(browser_id):
            return None
        listed = tuple(account for account in accounts.split(",") if account)
        if len(listed) > BROWSER_ACCOUNTS or not all(_ACCOUNT.fullmatch(account) for account in listed):
            return None
        return cls(browser_id, listed)


_BROWSER_ID = re.compile(r"[A-Za-z0-9_-]{22}")
_ACCOUNT = re.compile(r"[0-9a-f]{32}")


UNKNOWN_USER = "(unknown)"  # no username holds a parenthesis: it names no one


async def _known(ctx: OAuthContext, username: str) -> str:
    user = await ctx.store.get_user_by_username(username) if len(username) <= 128 else None
    return user.username if user is not None else UNKNOWN_USER


async def check_password(ctx: OAuthContext, username: str, password: str) -> tuple[User | None, bool]:
    """The user ``username`` names (None: no such user) and whether ``password`` is theirs, in
    about the same time either way."""
    user = await ctx.store.get_user_by_username(username) if len(username) <= 128 else None
    stored = user.password_hash if user is not None else hashing.dummy_password_hash()
    loop = asyncio.get_running_loop()
    # scrypt takes tens of milliseconds: keep it off the event loop.
    ok = await loop.run_in_executor(None, hashing.verify_password, password, stored)
    return user, ok and user is not None


async def start(ctx: OAuthContext, user: User, user_agent: str | None = None, address: str | None = None) -> str:
    """Create a session for ``user`` (from the browser ``user_agent`` at ``address``, which the
    account page shows); returns the session id for the cookie."""
    session_id = hashing.new_secret()
    now = ctx.clock()
    await ctx.store.add_session(Session(hashing.digest(session_id), user.user_id, now,
                                        now + timedelta(seconds=ctx.tokens.session_ttl),
                                        user_agent=logs.clip(user_agent) if user_agent else None,
                                        address=address, last_seen_at=now))
    return session_id


async def resolve(ctx: OAuthContext, session_id: str | None) -> tuple[Session, User] | None:
    """The live session and its user, or None (unknown, expired, or the user is gone)."""
    if not session_id or len(session_id) > 128:
        return None
    session = await ctx.store.get_session(hashing.digest(session_id))
    now = ctx.clock()
    if session is None or session.expires_at <= now:
        return None
    user = await ctx.store.get_user(session.user_id)
    if user is None:
        return None
    if session.last_seen_at is None or now - session.last_seen_at >= SEEN_EVERY:
        # One write a minute, not one a request; and no request fails for want of it.
        with contextlib.suppress(StorageError, StoreFault):
            await ctx.store.touch_session(session.session_hash, now)
    return session, user


SEEN_EVERY = timedelta(minutes=1)  # how precisely the account page knows when a session was last used


async def list_sessions(ctx: OAuthContext, user: User) -> list[Session]:
    """The user's live sessions, the most recently seen first."""
    return await ctx.store.list_user_sessions(user.user_id, ctx.clock())


async def end_one(ctx: OAuthContext, user: User, public_id: str) -> bool:
    """End the user's session named ``public_id`` (as the account page and the API name it)."""
    for session in await list_sessions(ctx, user):
        if session.public_id == public_id:
            return await _end_hash(ctx, session.session_hash)
    return False


async def end_others(ctx: OAuthContext, user: User, current_id: str | None) -> int:
    """End every session of the user but the one ``current_id`` (the cookie's) names; the count."""
    keep = hashing.digest(current_id) if current_id else None
    return sum([await _end_hash(ctx, session.session_hash) for session in await list_sessions(ctx, user)
                if session.session_hash != keep])


async def end(ctx: OAuthContext, session_id: str | None) -> bool:
    """End the web session ``session_id`` names (sign-out); True when it was live."""
    if not session_id or len(session_id) > 128:
        return False
    return await _end_hash(ctx, hashing.digest(session_id))


async def _end_hash(ctx: OAuthContext, session_hash: str) -> bool:
    ended = await ctx.store.end_session(session_hash, ctx.clock())
    if ended:
        ctx.events.publish(Revocation(SESSION, session_hash))
    return ended


async def sign_out(ctx: OAuthContext, session_id: str | None, token: str | None) -> None:
    """``POST /oauth/sign-out``: end the web session, and revoke ``token`` when it is given
    and in force (a dead token revokes nothing)."""
    await end(ctx, session_id)
    if token:
        await revocation.revoke_token(ctx, token, None)


async def end_all(ctx: OAuthContext, user_id: str) -> int:
    """End every web session of a user; the count."""
    ended = await ctx.store.end_user_sessions(user_id, ctx.clock())
    if ended:
        ctx.events.publish(Revocation(USER, user_id))
    return ended


_BROWSERS = (("Edg/", "Edge"), ("OPR/", "Opera"), ("Firefox/", "Firefox"), ("Chromium/", "Chromium"),
             ("Chrome/", "Chrome"), ("Version/", "Safari"), ("curl/", "curl"), ("python-requests/", "a script"))
_SYSTEMS = (("Windows", "Windows"), ("iPhone", "iOS"), ("iPad", "iPadOS"), ("Android", "Android"),
            ("Mac OS X", "macOS"), ("CrOS", "ChromeOS"), ("Linux", "Linux"))


def browser_of(user_agent: str | None) -> str:
    """What a person calls the browser a ``User-Agent`` names: "Firefox on Windows"."""
    agent = user_agent or ""
    browser = next((name for marker, name in _BROWSERS if marker in agent), "An unknown browser")
    system = next((name for marker, name in _SYSTEMS if marker in agent), None)
    return f"{browser} on {system}" if system else browser
