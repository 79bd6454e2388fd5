"""The token endpoint's grants: authorization code with PKCE (RFC 6749 §4.1.3, RFC 7636
§4.5-4.6) and refresh-token rotation with reuse detection (RFC 6749 §6, RFC 9700 §4.14.2).

A redeemed code starts a token *family* (:class:`tokensvc.records.Family`): the code and every
refresh rotation after it. Each refresh replaces the family's pair in one atomic step. A token
of the family presented when it is no longer the current one (a rotated-out refresh token, or
the redeemed code again) revokes the family: RFC 6749 §4.1.2's "tokens previously issued based
on that code", and nothing else of the user's.

The presenter of a code is checked (client, redirect_uri, PKCE verifier) before anything else:
whoever saw a code but is not its client, or lacks its verifier, gets ``invalid_grant`` and
changes nothing but the unredeemed code, which a failed check spends. A code that grants
``admin`` to a native app is found only with the confirmation code its page showed
(``oauth/confirmation.py``): the presentations with one are counted, per address and per code,
before the lookup.

Codes are single-use, with no grace (the interface's state table, RFC 6749 §4.1.2's MUST deny):
of any number of presentations of a code by its client, exactly one is exchanged, and every
other is ``invalid_grant`` and revokes what the code was exchanged for. A reply lost after the
family was written costs the user one more authorization.

Refresh tokens presented together. Presentations of one refresh token that arrive within two
seconds of its successor's issue (``oauth/successors.py``), before that successor was used (two
tabs, an app and its retry, a proxy's duplicate), all get **the same** successor: the pair is
derived from the presented token and a salt the store holds, so whoever finds the token just
rotated out recomputes the pair the store holds and answers it again, from any process. Times
are arrivals: a rotation issues its pair at its request's arrival, and a presentation is judged
by its own, whatever the store's latency. A rotated-out access token presented while it would
still be in force shows a second holder of the pair (a thief's rotation, then the client's call
with the access token it killed): from then the family's presentations get no successor again,
and the grace rules decide.

Lost replies. A reply can be lost after the store applied its write (a timeout, a failover, a
deploy), and the client retries with what it sent. Within ``tokens.refresh_grace_seconds`` of
that rotation, and only while the pair it issued was never used (its refresh token not rotated,
its access token never presented), the retry gets a new pair in place of the lost one. A
presentation after that, or of any older token, is reuse. Whoever loses an atomic step to a
concurrent request decides again on the family as the store holds it then.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from tokensvc.oauth import (
    audience,
    authorization,
    clientauth,
    confirmation,
    hashing,
    pkce,
    privileges,
    scopes,
    successors,
    tokens,
)
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.context import OAuthContext
from tokensvc.oauth.errors import InvalidGrant, InvalidScope, InvalidTarget, UnsupportedGrantType
from tokensvc.oauth.revocation import revoke_family
from tokensvc.ratelimit import TooManyFailures
from tokensvc.records import AuthorizationCode, Client, Family, Grant, Subject
from tokensvc.storage.base import Presentation
from tokensvc.telemetry import logs


@dataclass(slots=True)
class TokenResponse:
    access_token: str
    refresh_token: str
    expires_in: int
    scope: str
    token_type: str = "Bearer"


def _audit(event: str, outcome: str, client_id: str, subject: Subject, **fields: object) -> None:
    logs.audit(event, {"client_id": client_id, "subject": subject.id, "subject_type": subject.kind,
                       "outcome": outcome, **fields},
               logging.WARNING if outcome == "family_revoked" else logging.INFO)


# -- the token endpoints ----------------------------------------------------------------

def check_grant_type(grant_type: str | None) -> None:
    """``POST /oauth/token`` serves ``authorization_code`` only; checked before anything else.
    Refresh lives at ``/oauth/token/refresh`` (the spec), so a ``refresh_token`` grant here is
    told where to go."""
    if grant_type is not None and grant_type != "authorization_code":
        raise UnsupportedGrantType("Only grant_type=authorization_code is supported here; "
                                   "refresh at /oauth/token/refresh")


async def token_for_code(ctx: OAuthContext, caller: ClientRequest, code: str, redirect_uri: str,
                         code_verifier: str | None, confirmation_code: str | None = None,
                         resources: list[str] | None = None) -> TokenResponse:
    """``POST /oauth/token``: authenticate the client, then exchange its code (with the
    confirmation code its page showed, where it needs one), narrowed to ``resources``."""
    client = await clientauth.authenticate_grant_client(ctx, caller)
    return await exchange_code(ctx, client, code, redirect_uri, code_verifier, confirmation_code,
                               address=caller.address, resources=resources)


async def token_for_refresh(ctx: OAuthContext, caller: ClientRequest, refresh_token: str,
                            scope: str | None, arrived: datetime, resources: list[str] | None = None) -> TokenResponse:
    """``POST /oauth/token/refresh``, arrived at ``arrived``: authenticate the client, then
    rotate its refresh token (its new pair meant for ``resources``, when named)."""
    client = await clientauth.authenticate_grant_client(ctx, caller)
    return await refresh(ctx, client, refresh_token, scope, arrived=arrived, resources=resources)


# -- authorization code ----------------------------------------------------------------

async def exchange_code(ctx: OAuthContext, client: Client, code: str, redirect_uri: str,
                        code_verifier: str | None, confirmation_code: str | None = None, *,
                        address: str = "-", resources: list[str] | None = None) -> TokenResponse:
    """Exchange ``client``'s ``code``, presented from ``address``; ``confirmation_code``: what the
    person typed from the code's page, for a code that grants ``admin`` to a native app.
    ``resources`` may narrow the access token to some of what the code's authorization request
    named (RFC 8707 §2.2); the refresh token keeps all of it. A target outside it is
    ``invalid_target``, and the code is not spent."""
    store, now = ctx.store, ctx.clock()
    if confirmation_code:
        record, code_hash = await _confirmed(ctx, client, code, confirmation_code, address)
    else:
        code_hash = hashing.digest(code)
        if code_verifier and pkce.is_valid_verifier(code_verifier) and not resources:
            # The common case in one step: the code consumed only as it was issued. Anything
            # else (a replay, a wrong presenter, an expired code, a narrowing by resource, which
            # is judged before the code is spent) is read and told below.
            secret = tokens.family_secret(code, code_verifier)
            family_id = tokens.family_id(secret)
            redeemed = await store.redeem_code(code_hash, now, family_id, _presentation(client, redirect_uri,
                                                                                         code_verifier))
            if redeemed is not None:
                return await _redeem(ctx, client, redeemed, secret, family_id, True, now)
        found = await store.get_code(code_hash)
        if found is None:
            raise InvalidGrant("Unknown authorization code")
        record = found
    try:
        verifier = _check_presenter(record, client, redirect_uri, code_verifier)
        if not confirmation_code and authorization.needs_confirmation(client, record.redirect_uri, record.scopes):
            # Issued without one, by a release that showed none: clicks alone never grant admin here.
            raise InvalidGrant("A code that grants admin to a native app is redeemed only with the confirmation "
                               "code its page showed (confirmation_code): authorize again")
        if record.consumed_at is None and record.expires_at <= now:
            raise InvalidGrant("The authorization code has expired")
    except InvalidGrant:
        if record.consumed_at is None:
            # Spent, so that a verifier cannot be guessed by retrying; it is no redemption,
            # so presenting it again revokes nothing.
            await store.consume_code(code_hash, now, failed=True)
        raise
    target = await audience.requested(ctx, resources, record.audience) if resources else None
    secret = tokens.family_secret(code, verifier)
    family_id = tokens.family_id(secret)
    first = record.consumed_at is None
    if first and await store.consume_code(code_hash, now, family_id=family_id) is None:
        first, record = False, await store.get_code(code_hash) or record  # another presentation won
    if record.spent_by_failure:
        raise InvalidGrant("The authorization code is no longer valid")
    return await _redeem(ctx, client, record, secret, family_id, first, now, target)


def _presentation(client: Client, redirect_uri: str, code_verifier: str) -> Presentation:
    """What :func:`_check_presenter` and the confirmation rule ask of a code presented
    without a confirmation code, for the store to match as it consumes the code."""
    refused = scopes.ADMIN if authorization.needs_confirmation(client, redirect_uri, [scopes.ADMIN]) else None
    return Presentation(client.client_id, redirect_uri, pkce.s256(code_verifier), refused)


async def _confirmed(ctx: OAuthContext, client: Client, code: str, typed: str,
                     address: str) -> tuple[AuthorizationCode, str]:
    """The code issued with the confirmation ``typed`` (``oauth/confirmation.py``), and its key;
    else InvalidGrant. Counted per code before the lookup, whatever the settings, so that
    concurrent guesses count too: past :data:`~tokensvc.oauth.confirmation.PRESENTATIONS`
    presentations the code is dead, the right confirmation included. That bounds guessing. A
    wrong confirmation also counts per address, as a failed sign-in does (TooManyFailures past
    the limit, instead of its InvalidGrant); a right one is never refused by the address's
    count, so that wrong ones sent from a shared address (loopback, a NAT) cannot lock the
    person out. Only the holder of the right confirmation sees the difference."""
    limits = ctx.limits
    if not await limits.present(confirmation.presentations_key(code), confirmation.PRESENTATIONS,
                                ctx.tokens.code_ttl):
        _audit_confirmation(client, address, "code_exhausted")
        ctx.metrics.failed_confirmation()
        raise InvalidGrant("Too many confirmation codes were presented with this authorization code: it is no "
                           "longer valid")
    shown = confirmation.normalized(typed)
    code_hash = confirmation.code_digest(code, shown) if shown is not None else None
    record = await ctx.store.get_code(code_hash) if code_hash is not None else None
    if record is None or code_hash is None:
        try:
            await limits.failed(limits.confirmation_attempt(address))
        except TooManyFailures:
            _audit_confirmation(client, address, "rate_limited")
            ctx.metrics.refused_by_limit("confirmation")
            raise
        _audit_confirmation(client, address, "failure")
        ctx.metrics.failed_confirmation()
        raise InvalidGrant(confirmation.NOT_THE_PAGES)
    return record, code_hash


def _audit_confirmation(client: Client, address: str, outcome: str) -> None:
    logs.audit("code_confirmation", {"client_id": client.client_id, "outcome": outcome, "remote_ip": address},
               logging.WARNING, "confirmation code refused")


def _check_presenter(record: AuthorizationCode, client: Client, redirect_uri: str,
                     code_verifier: str | None) -> str:
    """The verifier, once the code is shown to be presented by its client, for its
    redirect_uri, with the verifier of its challenge; else InvalidGrant."""
    if record.client_id != client.client_id:
        raise InvalidGrant("The authorization code was issued to another client")
    if record.redirect_uri != redirect_uri:
        raise InvalidGrant("redirect_uri does not match the authorization request")
    if not code_verifier:
        raise InvalidGrant("code_verifier is required (PKCE)")
    if not pkce.verify(code_verifier, record.code_challenge, record.code_challenge_method):
        raise InvalidGrant("PKCE verification failed")
    return code_verifier


async def _redeem(ctx: OAuthContext, client: Client, record: AuthorizationCode, secret: str, family_id: str,
                  first: bool, now: datetime, target: list[str] | None = None) -> TokenResponse:
    """Start the code's family, its access token meant for ``target`` (None: what the code
    names); for the code presented again, revoke it (a replay)."""
    store = ctx.store
    # The grant with its user, read together: what is in force is decided on them and on the
    # client just authenticated. The grant the code names, found by its key (a code of 0.10.0
    # names none: the subject's). A revocation of the grant that lands after this read leaves
    # the family this writes dead: every use reads the grant with the family (Family.stands).
    grant, user = await store.grant_standing(client.client_id, record.subject, record.grant_id)
    if grant is None or not grant.stands_behind(record.generation):
        raise InvalidGrant("The authorization was revoked")
    # A consumed code whose family is missing was redeemed by a request that failed before
    # writing it (the client saw 503): this presentation writes it, while the code is valid.
    # Of all the presentations, the one whose write lands is the exchange.
    if first or record.expires_at > now:
        held = await _in_force(ctx, client, record.subject, record.scopes, privileges.Holders(client, user))
        routing_key = ctx.successors.deriving[1] if await _routed(ctx) else None
        minted = _mint(ctx, secret, held, record.subject, now, routing_key)
        family = _family(family_id, grant, client, record, minted, now, target)
        if await store.create_family(family):
            _audit("token_issued", "success", client.client_id, record.subject, grant="authorization_code")
            ctx.metrics.issued("authorization_code")
            return _response(ctx, minted)
    elif (await store.get_family(family_id))[0] is None:
        raise InvalidGrant("The authorization code has expired")
    # RFC 6749 §4.1.2: a code used twice is denied, and what it was exchanged for revoked: a
    # family meant for what the code's authorization granted (its refresh token's audience).
    revoked = await revoke_family(ctx, family_id, "code_reuse", record.audience)
    _audit("code_reuse", "family_revoked", client.client_id, record.subject, family_revoked=revoked)
    ctx.metrics.reused_code()
    raise InvalidGrant("The authorization code was already used")


def _family(family_id: str, grant: Grant, client: Client, record: AuthorizationCode, minted: tokens.Minted,
            now: datetime, target: list[str] | None = None) -> Family:
    pair = minted.pair
    return Family(family_id, grant.grant_id, client.client_id, record.user_id, record.installation_id,
                  record.generation, list(pair.scopes), now, pair.refresh_hash, pair.access_hash, pair.issued_at,
                  pair.expires_at, pair.access_expires_at, renewed_at=now, audience=record.audience,
                  access_audience=target)


# -- refresh ----------------------------------------------------------------------------

async def refresh(ctx: OAuthContext, client: Client, refresh_token: str, scope: str | None = None, *,
                  arrived: datetime | None = None, resources: list[str] | None = None) -> TokenResponse:
    """Rotate ``refresh_token``. ``scope`` may narrow the new pair (RFC 6749 §6), never widen it;
    ``resources`` binds its access token to some of the APIs the family was granted (RFC 8707
    §2.2; any declared one, when it was granted every API), never more; the refresh token keeps
    them all, so that the next refresh may name others, or none for every one of them.
    ``arrived``: when the presentation arrived (now, unless said), the moment the window of
    concurrent presentations is judged by and a rotation issues its pair at, however long the
    store then takes (within :data:`~tokensvc.oauth.successors.HELD_SECONDS`)."""
    arrived = arrived or ctx.clock()
    _asked(scope)  # a malformed scope is told so before anything is decided
    parsed = tokens.parse_refresh(refresh_token)
    if parsed is None:
        raise InvalidGrant("Unknown refresh token")
    family_id, token_hash = parsed
    for _ in range(3):  # after losing an atomic step, decide again on the family as it is now
        standing = await ctx.store.family_standing(family_id)
        family, grant = standing.family, standing.grant
        holders = privileges.Holders(standing.client, standing.user)
        judged = successors.judged_at(arrived, ctx.clock())
        # Bound to its client (RFC 6749 §6): another client's token is simply unknown here.
        if family is None or family.client_id != client.client_id:
            raise InvalidGrant("Unknown refresh token")
        if family.revoked_at is not None:
            raise InvalidGrant("The refresh token is revoked")
        current = hmac.compare_digest(token_hash, family.refresh_hash)
        rotated_out_last = (not current and family.previous_hash is not None
                            and hmac.compare_digest(token_hash, family.previous_hash))
        again = _again(ctx, family, refresh_token, judged) if rotated_out_last else None
        if not (current or again is not None
                or (rotated_out_last and family.replaceable(ctx.tokens.refresh_grace_seconds, ctx.clock()))):
            await _reused(ctx, family)  # told first: whatever else the presentation asks
        target = await audience.requested(ctx, resources, family.audience) if resources else None
        if current:
            response = await _rotate(ctx, client, family, grant, token_hash, refresh_token, scope, judged, holders,
                                     target)
        elif again is not None:
            return await _successor_again(ctx, client, family, grant, again, scope, judged, holders, target)
        else:
            response = await _retry(ctx, client, family, grant, refresh_token, scope, judged, holders, target)
        if response is not None:
            return response
    raise InvalidGrant("The refresh token is no longer valid")


async def _rotate(ctx: OAuthContext, client: Client, family: Family, grant: Grant | None, token_hash: str,
                  presented: str, scope: str | None, arrived: datetime,
                  holders: privileges.Holders | None = None, target: list[str] | None = None) -> TokenResponse | None:
    if family.expires_at <= arrived:
        raise InvalidGrant("The refresh token has expired")
    if not family.stands(grant):
        raise InvalidGrant("The authorization was revoked")
    minted = _successor(ctx, family, presented, await _refreshed(ctx, client, family, scope, holders), arrived,
                        target, await _routed(ctx))
    if await ctx.store.rotate_family(family.family_id, token_hash, minted.pair, arrived,
                                     previous_access=(family.access_hash, family.access_expires_at)) is None:
        return None
    _audit("token_refreshed", "success", family.client_id, family.subject)
    ctx.metrics.issued("refresh_token")
    return _response(ctx, minted)


def _again(ctx: OAuthContext, family: Family, presented: str, arrived: datetime) -> tokens.Minted | None:
    """The family's current pair, when it is the successor of ``presented`` (the token rotated
    out last) and this presentation arrived within :data:`~tokensvc.oauth.successors.CONCURRENT_SECONDS` of its issue,
    before its first use, with no second holder of the family shown: recomputed, and given
    only if the store holds exactly its hashes. None otherwise (the key that derived it is not
    configured here, a release that does not derive pairs issued it, or the presentation is not
    concurrent): the grace rules decide."""
    if (family.second_holder_at is not None or not successors.concurrent(family.issued_at, arrived)
            or (family.access_used_at is not None and family.access_used_at <= arrived)):
        return None
    key = ctx.successors.get(family.key_id)
    if key is None or family.salt is None:
        return None
    # In the shape the store holds: a successor derived before every process routed (or by the
    # previous release) has no routing part.
    again = _derived(ctx, family, presented, family.scopes, arrived, family.key_id, key, family.serial, family.salt,
                     routed=True)
    if not hmac.compare_digest(again.pair.access_hash, family.access_hash):
        again = _derived(ctx, family, presented, family.scopes, arrived, family.key_id, key, family.serial,
                         family.salt, routed=False)
    if not (hmac.compare_digest(again.pair.refresh_hash, family.refresh_hash)
            and hmac.compare_digest(again.pair.access_hash, family.access_hash)):
        return None
    return again


async def _successor_again(ctx: OAuthContext, client: Client, family: Family, grant: Grant | None,
                           again: tokens.Minted, scope: str | None, arrived: datetime,
                           holders: privileges.Holders | None = None,
                           target: list[str] | None = None) -> TokenResponse:
    """The family's current pair ``again`` (:func:`_again`), answered to a concurrent
    presentation with the scopes of it in force now."""
    if family.expires_at <= arrived:
        raise InvalidGrant("The refresh token has expired")
    if not family.stands(grant):
        raise InvalidGrant("The authorization was revoked")
    # The scope asked is checked as a rotation checks it (never wider, in force), and then must
    # be the pair's own: a presentation is never given a pair of another scope than it asked.
    granted = await _refreshed(ctx, client, family, scope, holders)
    if scope is not None and set(granted) != set(family.scopes):
        raise InvalidScope("This refresh token was just rotated by a concurrent request, with the scope "
                           f"'{scopes.render(family.scopes)}': present it with that scope, or none")
    if target is not None and set(target) != set(family.access_target or ()):
        raise InvalidTarget("This refresh token was just rotated by a concurrent request, for the resources "
                            f"'{' '.join(family.access_target or [])}': present it with those, or none")
    _audit("token_refreshed", "success", family.client_id, family.subject, concurrent_presentation=True)
    remaining = max(0, int((family.access_expires_at - ctx.clock()).total_seconds()))
    held = [item for item in family.scopes if item in granted]  # the pair's, in its order, in force now
    return TokenResponse(again.access_token, again.refresh_token, remaining, scopes.render(held))


async def _retry(ctx: OAuthContext, client: Client, family: Family, grant: Grant | None, presented: str,
                 scope: str | None, arrived: datetime,
                 holders: privileges.Holders | None = None, target: list[str] | None = None) -> TokenResponse | None:
    """The refresh token rotated out last, again, within the grace period, while the pair that
    rotation issued was never used: that pair is replaced (its reply was lost)."""
    if not family.stands(grant):
        raise InvalidGrant("The authorization was revoked")
    minted = _successor(ctx, family, presented, await _refreshed(ctx, client, family, scope, holders), arrived,
                        target, await _routed(ctx))
    if await ctx.store.reissue_pair(family.family_id, family.refresh_hash, minted.pair) is None:
        return None
    _audit("token_refreshed", "success", family.client_id, family.subject, retry_within_grace=True)
    ctx.metrics.issued("refresh_token")
    return _response(ctx, minted)


async def _reused(ctx: OAuthContext, family: Family) -> None:
    """A token of the family that is not its current one: reuse (RFC 9700 §4.14.2)."""
    revoked = await revoke_family(ctx, family.family_id, "refresh_reuse", family.audience)
    _audit("refresh_reuse", "family_revoked", family.client_id, family.subject, family_revoked=revoked)
    ctx.metrics.reused_refresh_token()
    raise InvalidGrant("The refresh token was already used")


async def _refreshed(ctx: OAuthContext, client: Client, family: Family, scope: str | None,
                     holders: privileges.Holders | None = None) -> list[str]:
    """The scopes of a refresh's new pair: of those the family holds, what ``scope`` asks for
    (all when omitted, never more, RFC 6749 §6) that is in force now. A scope no longer in
    force is left out for good: the new pair does not hold it."""
    asked = _asked(scope)
    beyond = [item for item in asked or [] if item not in family.scopes]
    if beyond:
        raise InvalidScope("A refresh cannot widen the scope: " + " ".join(beyond))
    held = await _in_force(ctx, client, family.subject, family.scopes, holders)
    lost = [item for item in asked or [] if item not in held]
    if lost:
        raise InvalidScope("No longer in force: " + " ".join(lost))
    return held if asked is None else asked


def _asked(scope: str | None) -> list[str] | None:
    """The scopes ``scope`` asks for (None: omitted); ``invalid_scope`` when malformed."""
    try:
        return scopes.parse(scope)
    except ValueError as exc:
        raise InvalidScope(str(exc)) from None


async def _in_force(ctx: OAuthContext, client: Client, subject: Subject, held: list[str],
                    holders: privileges.Holders | None = None) -> list[str]:
    """The scopes of ``held`` in force now; InvalidGrant when none is. ``holders``: the client
    and user read with the family (they say what is in force now, the authenticated client
    perhaps what this process read of it a moment ago)."""
    found = await privileges.in_force(ctx, client.client_id, subject, held, client, holders)
    if not found.scopes:
        raise InvalidGrant("Nothing this authorization granted is in force any more")
    return found.scopes


# -- minting ----------------------------------------------------------------------------

def _mint(ctx: OAuthContext, secret: str, granted: list[str], subject: Subject, now: datetime,
          routing_key: bytes | None, **derivation: Any) -> tokens.Minted:
    """A pair whose access token's routing part is enciphered under ``routing_key`` (None: the
    old shape): a random pair's under the first key, a derived pair's under the key that
    derived it, so that recomputing it gives the same token."""
    settings = ctx.tokens
    refresh_ttl = settings.installation_refresh_ttl if subject.installation_id is not None else settings.refresh_ttl
    return tokens.mint(secret, granted, now, settings.access_ttl, refresh_ttl, routing_key=routing_key, **derivation)


async def _routed(ctx: OAuthContext) -> bool:
    """Whether a new access token carries its routing part: once no process of the previous
    release may serve from the store (the compatibility version that lets tokens be bound to an
    audience). Until then the previous release recomputes a successor without it to answer
    presentations arriving together at both releases, and would answer them otherwise than this
    one; and the previous release's ``tokensvc.resource`` refuses a token of the new shape
    without asking, so an operator upgrades the resource servers before finalizing
    (UPGRADE.md). An exchange's pair waits for the same moment, so that one rule says when
    tokens change shape."""
    return await ctx.store.binds_audiences()


def _successor(ctx: OAuthContext, family: Family, presented: str, granted: list[str], now: datetime,
               target: list[str] | None, routed: bool) -> tokens.Minted:
    """The pair that replaces the family's current one, derived from the refresh token
    ``presented`` with the first key and a new salt, numbered one past the current pair, its
    access token meant for ``target`` (what the refresh named; None: the family's audience) and
    carrying its routing part when ``routed``."""
    key_id, key = ctx.successors.deriving
    minted = _derived(ctx, family, presented, granted, now, key_id, key, family.serial + 1, successors.new_salt(),
                      routed=routed)
    return replace(minted, pair=replace(minted.pair, access_audience=target))


def _derived(ctx: OAuthContext, family: Family, presented: str, granted: list[str], now: datetime, key_id: str | None,
             key: bytes, serial: int, salt: str, *, routed: bool) -> tokens.Minted:
    """The successor of ``presented`` numbered ``serial``, derived with the key ``key_id`` and
    ``salt``, its access token's routing part enciphered under that key when ``routed``."""
    return _mint(ctx, presented.partition(tokens.SEPARATOR)[0], granted, family.subject, now, key if routed else None,
                 derived=successors.derive(key, presented, serial, salt), serial=serial, key_id=key_id, salt=salt)


def _response(ctx: OAuthContext, minted: tokens.Minted) -> TokenResponse:
    return TokenResponse(minted.access_token, minted.refresh_token, ctx.tokens.access_ttl,
                         scopes.render(minted.pair.scopes))
