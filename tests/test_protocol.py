"""The protocol core (tokensvc.oauth) called directly, without HTTP: the memory store and a clock
the test moves by hand. The same behaviour over HTTP is in test_token, test_refresh,
test_introspect, test_revoke and test_authorize."""

from __future__ import annotations

import pytest
from helpers import (
    CHALLENGE,
    CLI_REDIRECT,
    NODE_REDIRECT,
    PARTNER_SECRET,
    PAST_CONCURRENT,
    SKY_REDIRECT,
    VERIFIER,
    WEBAPP_REDIRECT,
    WEBAPP_SECRET,
    another_confirmation,
    confirmed_code,
    make_config,
    query_of,
)

from tokensvc.bootstrap import make_context, seed
from tokensvc.errors import ValidationFailed
from tokensvc.oauth import (
    adminauth,
    authorization,
    clientauth,
    confirmation,
    grants,
    hashing,
    introspection,
    revocation,
)
from tokensvc.oauth.authorization import Confirm, Consent, Issued, Pairing, SignIn
from tokensvc.oauth.clientauth import ClientRequest
from tokensvc.oauth.errors import (
    AccessDenied,
    InsufficientScope,
    InvalidClient,
    InvalidGrant,
    InvalidRequest,
    InvalidScope,
    InvalidToken,
    RedirectError,
    RedirectUnverified,
    UnsupportedGrantType,
)
from tokensvc.ratelimit import TooManyFailures
from tokensvc.records import Subject

pytestmark = pytest.mark.gen_test


@pytest.fixture
def seeded(io_loop, store, config, ctx):
    io_loop.run_sync(lambda: seed(store, config))
    return ctx


def args(client_id="webapp", redirect_uri=WEBAPP_REDIRECT, **extra):
    values = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "state": "s",
              "code_challenge": CHALLENGE, "code_challenge_method": "S256", **extra}
    return {name: [value] for name, value in values.items() if value is not None}


async def code_for(ctx, client_id="webapp", redirect_uri=WEBAPP_REDIRECT, username="alice", **extra) -> str:
    request = await authorization.validate(ctx, args(client_id, redirect_uri, **extra))
    user = await ctx.store.get_user_by_username(username)
    subject, _ = await authorization.resolve_subject(ctx, request, user)
    location = await authorization.issue_code(ctx, request, subject)
    return location.split("code=")[1].split("&")[0]


async def client(ctx, client_id="webapp"):
    return await ctx.store.get_client(client_id)


async def pair(ctx, client_id="webapp", redirect_uri=WEBAPP_REDIRECT):
    code = await code_for(ctx, client_id, redirect_uri)
    return await grants.exchange_code(ctx, await client(ctx, client_id), code, redirect_uri, VERIFIER)


# -- the authorization request ----------------------------------------------------------


async def test_authorization_requests_are_checked_in_order(seeded):
    with pytest.raises(RedirectUnverified):
        await authorization.validate(seeded, args(client_id="nobody"))
    with pytest.raises(RedirectUnverified):
        await authorization.validate(seeded, args(redirect_uri="https://evil.example/cb"))
    with pytest.raises(RedirectError) as missing:
        await authorization.validate(seeded, args(code_challenge=None))
    assert isinstance(missing.value.error, InvalidRequest) and missing.value.location.startswith(WEBAPP_REDIRECT + "?")
    with pytest.raises(RedirectError) as plain:
        await authorization.validate(seeded, args(code_challenge_method="plain"))
    assert isinstance(plain.value.error, InvalidRequest)
    with pytest.raises(RedirectError) as scope:
        await authorization.validate(seeded, args("skyplanner", SKY_REDIRECT, scope="write"))
    assert isinstance(scope.value.error, InvalidScope)
    defaulted = await authorization.validate(seeded, args("skyplanner", SKY_REDIRECT))
    assert defaulted.scopes == ["read", "observations:write"] and defaulted.scope_defaulted


async def test_pairing_needs_an_operator(seeded):
    request = await authorization.validate(seeded, args("node-agent", NODE_REDIRECT, installation_id="backyard-scope"))
    alice = await seeded.store.get_user_by_username("alice")
    subject, installation = await authorization.resolve_subject(seeded, request, alice)
    assert subject == Subject(installation_id="backyard-scope") and installation.name == "Backyard telescope"
    root = await seeded.store.get_user_by_username("root")
    assert (await authorization.resolve_subject(seeded, request, root))[0].installation_id == "backyard-scope"
    request.installation_id = "nowhere"
    with pytest.raises(RedirectError) as denied:
        await authorization.resolve_subject(seeded, request, alice)
    assert isinstance(denied.value.error, AccessDenied)


async def test_what_an_authorization_request_leads_to(seeded):
    """authorization.decide: sign in first; a first-party client gets its code at once unless
    nothing vouches for it or it asks for admin; a third-party client always gets the consent
    page, then the user's answer."""
    alice = await seeded.store.get_user_by_username("alice")
    signin = await authorization.decide(seeded, args(), None)
    assert isinstance(signin, SignIn) and signin.request.client.client_id == "webapp"

    first_party = await authorization.decide(seeded, args(), alice)
    assert isinstance(first_party, Issued) and first_party.location.startswith(WEBAPP_REDIRECT + "?code=")
    assert "state=s" in first_party.location

    sky = args("skyplanner", SKY_REDIRECT, scope="read")
    consent = await authorization.decide(seeded, sky, alice)
    assert isinstance(consent, Consent) and consent.user == alice and consent.installation is None
    issued = await authorization.decide(seeded, sky, alice, "allow")
    assert isinstance(issued, Issued) and "code=" in issued.location
    with pytest.raises(RedirectError) as denied:
        await authorization.decide(seeded, sky, alice, "deny")
    assert isinstance(denied.value.error, AccessDenied) and "error=access_denied" in denied.value.location
    with pytest.raises(RedirectError) as odd:
        await authorization.decide(seeded, sky, alice, "maybe")
    assert isinstance(odd.value.error, InvalidRequest)
    # The answer is checked only once the request itself is valid and verified.
    with pytest.raises(RedirectUnverified):
        await authorization.decide(seeded, args("nobody"), alice, "allow")
    # A first-party client pairing an installation names it first, then issues the code.
    pair = args("node-agent", NODE_REDIRECT, installation_id="backyard-scope")
    pairing = await authorization.decide(seeded, pair, alice)
    assert isinstance(pairing, Pairing) and pairing.installation.name == "Backyard telescope"
    assert isinstance(await authorization.decide(seeded, pair, alice, "allow"), Issued)
    # A first-party public client on a loopback redirect (nothing proves it is the app it
    # names), and admin whatever the client: the user's click first (RFC 8252 §8.6).
    root = await seeded.store.get_user_by_username("root")
    for request, user in ((args("node-agent", NODE_REDIRECT, scope="read"), alice),
                          (args(scope="read admin"), root)):
        confirm = await authorization.decide(seeded, request, user)
        assert isinstance(confirm, Confirm) and confirm.user == user and confirm.confirmation is None
        assert isinstance(await authorization.decide(seeded, request, user, "allow"), Issued)
    assert isinstance(await authorization.decide(seeded, args(scope="read"), root), Issued)
    # admin to a native app: the page shows a confirmation code, and an answer issues the code
    # only for the one its page showed (none: the page again, the same code when it is given).
    cli = args("tokensvc-cli", CLI_REDIRECT, scope="admin")
    confirm = await authorization.decide(seeded, cli, root)
    assert isinstance(confirm, Confirm) and confirmation.normalized(confirm.confirmation) == confirm.confirmation
    again = await authorization.decide(seeded, cli, root, "allow")
    assert isinstance(again, Confirm) and again.confirmation != confirm.confirmation  # (1 in 2^40 to fail)
    assert isinstance(await authorization.decide(seeded, cli, root, None, confirm.confirmation), Confirm)
    assert (await authorization.decide(seeded, cli, root, None, confirm.confirmation)).confirmation \
        == confirm.confirmation
    assert isinstance(await authorization.decide(seeded, cli, root, "allow", confirm.confirmation), Issued)


# -- code exchange ----------------------------------------------------------------------


async def test_exchange_issues_a_pair_and_a_replay_revokes_it(seeded):
    webapp = await client(seeded)
    code = await code_for(seeded)
    response = await grants.exchange_code(seeded, webapp, code, WEBAPP_REDIRECT, VERIFIER)
    assert response.token_type == "Bearer" and response.expires_in == seeded.tokens.access_ttl
    assert (await introspection.introspect(seeded, response.access_token))["active"] is True
    with pytest.raises(InvalidGrant, match="already used"):
        await grants.exchange_code(seeded, webapp, code, WEBAPP_REDIRECT, VERIFIER)
    for token in (response.access_token, response.refresh_token):
        assert await introspection.introspect(seeded, token) == {"active": False}


async def test_a_code_is_bound_to_its_client_redirect_verifier_and_lifetime(seeded, clock):
    webapp, sky = await client(seeded), await client(seeded, "skyplanner")
    for attempt in (lambda code: grants.exchange_code(seeded, sky, code, WEBAPP_REDIRECT, VERIFIER),
                    lambda code: grants.exchange_code(seeded, webapp, code, SKY_REDIRECT, VERIFIER),
                    lambda code: grants.exchange_code(seeded, webapp, code, WEBAPP_REDIRECT, "x" * 43),
                    lambda code: grants.exchange_code(seeded, webapp, code, WEBAPP_REDIRECT, None)):
        with pytest.raises(InvalidGrant):
            await attempt(await code_for(seeded))
    code = await code_for(seeded)
    clock.advance(seeded.tokens.code_ttl + 1)
    with pytest.raises(InvalidGrant, match="expired"):
        await grants.exchange_code(seeded, webapp, code, WEBAPP_REDIRECT, VERIFIER)


# -- admin to a native app: the confirmation code its page showed ---------------------------------


async def test_admin_to_a_native_app_is_redeemed_only_with_the_confirmation_its_page_showed(seeded):
    """Two clicks deliver a code to whatever listens on the port the request named; the code is
    worth nothing without the confirmation code the page showed the person, and a process that
    looks it up by the code alone (a presentation without it; release 0.10.0) finds nothing."""
    cli = await client(seeded, "tokensvc-cli")
    code, shown = await confirmed_code(seeded)
    assert await seeded.store.get_code(hashing.digest(code)) is None
    with pytest.raises(InvalidGrant, match="^Unknown authorization code$"):
        await grants.exchange_code(seeded, cli, code, CLI_REDIRECT, VERIFIER)
    with pytest.raises(InvalidGrant, match=confirmation.NOT_THE_PAGES):
        await grants.exchange_code(seeded, cli, code, CLI_REDIRECT, VERIFIER, another_confirmation(shown))
    # As a person types it: lower case, a space and a hyphen, O and I for 0 and 1.
    typed = (shown[:4] + " - " + shown[4:]).lower().replace("0", "o").replace("1", "i")
    tokens = await grants.exchange_code(seeded, cli, code, CLI_REDIRECT, VERIFIER, typed)
    assert tokens.scope == "admin"
    assert (await introspection.introspect(seeded, tokens.access_token))["scope"] == "admin"
    # The code is single-use as every code is: its replay with the confirmation revokes what it gave.
    with pytest.raises(InvalidGrant, match="already used"):
        await grants.exchange_code(seeded, cli, code, CLI_REDIRECT, VERIFIER, shown)
    assert await introspection.introspect(seeded, tokens.access_token) == {"active": False}


async def test_a_code_for_admin_to_a_native_app_whose_page_showed_no_confirmation_is_refused(seeded, clock):
    """A code release 0.10.0 issued for its one-click page alone (stored under the code's own
    digest) is refused here, and spent."""
    from datetime import timedelta

    from tokensvc.records import AuthorizationCode

    root = await seeded.store.get_user_by_username("root")
    grant = await seeded.store.save_grant("tokensvc-cli", Subject(user_id=root.user_id), ["admin"], clock())
    code = hashing.new_secret()
    await seeded.store.add_code(AuthorizationCode(
        hashing.digest(code), "tokensvc-cli", CLI_REDIRECT, ["admin"], root.user_id, None, CHALLENGE, "S256",
        clock() + timedelta(seconds=300), generation=grant.generation))
    cli = await client(seeded, "tokensvc-cli")
    with pytest.raises(InvalidGrant, match="redeemed only with the confirmation code its page showed"):
        await grants.exchange_code(seeded, cli, code, CLI_REDIRECT, VERIFIER)
    assert (await seeded.store.get_code(hashing.digest(code))).spent_by_failure
    with pytest.raises(InvalidGrant):
        await grants.exchange_code(seeded, cli, code, CLI_REDIRECT, VERIFIER)


async def test_other_native_requests_and_confidential_or_web_clients_need_no_confirmation(seeded):
    """The confirmation is for admin to a public client with a native redirect, whatever page
    it gets (the one-click page, a third party's consent): a native app's other scopes, a
    confidential client (its code is worth nothing without its secret, even at a loopback
    address) and a public client at an https address keep the page and the code as before."""
    from tokensvc.records import Client

    await seeded.store.put_client(Client("console", "Console", ["https://console.example/cb"], ["admin"],
                                         first_party=True))
    await seeded.store.put_client(Client("desk-admin", "Desk admin", ["com.example.desk:/cb"], ["admin"]))
    alice, root = [await seeded.store.get_user_by_username(name) for name in ("alice", "root")]
    for request, user, page in ((args("node-agent", NODE_REDIRECT, scope="read"), alice, Confirm),
                                (args(scope="read admin"), root, Confirm),  # webapp: confidential, loopback
                                (args("console", "https://console.example/cb", scope="admin"), root, Confirm)):
        shown = await authorization.decide(seeded, request, user)
        assert isinstance(shown, page) and shown.confirmation is None
        issued = await authorization.decide(seeded, request, user, "allow")
        code = query_of(issued.location)["code"]
        assert await seeded.store.get_code(hashing.digest(code)) is not None  # as before: under its own digest
        called = request["client_id"][0]
        assert (await grants.exchange_code(seeded, await client(seeded, called), code, request["redirect_uri"][0],
                                           VERIFIER)).access_token
    consent = await authorization.decide(seeded, args("desk-admin", "com.example.desk:/cb", scope="admin"), root)
    assert isinstance(consent, Consent) and confirmation.normalized(consent.confirmation) == consent.confirmation
    pairing = await authorization.decide(seeded, args("node-agent", NODE_REDIRECT, installation_id="backyard-scope"),
                                         alice)
    assert isinstance(pairing, Pairing) and pairing.confirmation is None


async def test_no_code_for_admin_to_a_native_app_is_issued_without_a_confirmation(seeded):
    request = await authorization.validate(seeded, args("tokensvc-cli", CLI_REDIRECT, scope="admin"))
    root = await seeded.store.get_user_by_username("root")
    subject, _ = await authorization.resolve_subject(seeded, request, root)
    for wrong in (None, "k7qm3xpd", "K7QM-3XPD"):  # none, or not as issued
        with pytest.raises(ValueError, match="needs the confirmation code"):
            await authorization.issue_code(seeded, request, subject, wrong)
    webapp = await authorization.validate(seeded, args(scope="read"))
    with pytest.raises(ValueError, match="shows no confirmation code"):
        await authorization.issue_code(seeded, webapp, subject, "K7QM3XPD")
    assert seeded.store._codes == {}


async def test_wrong_confirmations_are_audited_and_counted(seeded, caplog):
    import logging

    cli = await client(seeded, "tokensvc-cli")
    code, shown = await confirmed_code(seeded)
    caplog.clear()  # the consent's own audit line, wherever an earlier test set the level, is not counted
    with caplog.at_level(logging.INFO, logger="tokensvc.audit"):
        for wrong in (another_confirmation(shown), "not a code"):  # not the page's, or none at all
            with pytest.raises(InvalidGrant, match=confirmation.NOT_THE_PAGES):
                await grants.exchange_code(seeded, cli, code, CLI_REDIRECT, VERIFIER, wrong, address="127.0.0.7")
    events = [record.audit for record in caplog.records if record.name == "tokensvc.audit"]
    assert events == [{"event": "code_confirmation", "client_id": "tokensvc-cli", "outcome": "failure",
                       "remote_ip": "127.0.0.7"}] * 2
    assert shown not in caplog.text and code not in caplog.text
    assert seeded.metrics.registry.get_sample_value("tokensvc_confirmation_failures_total") == 2


async def test_the_token_endpoint_serves_the_code_grant_only():
    grants.check_grant_type("authorization_code")
    grants.check_grant_type(None)  # missing: the schema's 422 says so
    with pytest.raises(UnsupportedGrantType, match="/oauth/token/refresh"):
        grants.check_grant_type("refresh_token")


# -- refresh --------------------------------------------------------------------------------


async def test_refresh_rotates_and_reuse_revokes_the_grant(seeded, clock):
    webapp = await client(seeded)
    first = await pair(seeded)
    second = await grants.refresh(seeded, webapp, first.refresh_token)
    assert second.refresh_token != first.refresh_token
    assert (await introspection.introspect(seeded, first.refresh_token)) == {"active": False}
    third = await grants.refresh(seeded, webapp, second.refresh_token, "read")
    assert third.scope == "read"
    clock.advance(PAST_CONCURRENT)
    with pytest.raises(InvalidGrant, match="already used"):
        await grants.refresh(seeded, webapp, second.refresh_token)
    for token in (third.access_token, third.refresh_token):
        assert await introspection.introspect(seeded, token) == {"active": False}


async def test_refresh_is_bound_to_its_client_and_cannot_widen(seeded):
    first = await pair(seeded)
    with pytest.raises(InvalidGrant, match="Unknown"):
        await grants.refresh(seeded, await client(seeded, "skyplanner"), first.refresh_token)
    with pytest.raises(InvalidScope):
        await grants.refresh(seeded, await client(seeded), first.refresh_token, "read write admin")
    assert (await grants.refresh(seeded, await client(seeded), first.refresh_token)).access_token


async def test_refresh_grace_lets_a_lost_response_be_retried_once(store, clock, io_loop):
    config = make_config(tokens={"refresh_grace_seconds": 30})
    ctx = make_context(config, store, clock=clock)
    await seed(store, config)
    webapp = await client(ctx)
    first = await pair(ctx)
    lost = await grants.refresh(ctx, webapp, first.refresh_token)  # its response never arrived
    clock.advance(PAST_CONCURRENT)  # the client's retry, after its own timeout
    retried = await grants.refresh(ctx, webapp, first.refresh_token)
    assert retried.refresh_token != lost.refresh_token
    assert await introspection.introspect(ctx, lost.refresh_token) == {"active": False}
    assert (await introspection.introspect(ctx, retried.refresh_token))["active"] is True
    newer = await grants.refresh(ctx, webapp, retried.refresh_token)
    clock.advance(31)
    with pytest.raises(InvalidGrant):  # past the grace, the rotated-out token is reuse
        await grants.refresh(ctx, webapp, retried.refresh_token)
    assert await introspection.introspect(ctx, newer.refresh_token) == {"active": False}


async def test_an_expired_refresh_token_is_refused(seeded, clock):
    first = await pair(seeded)
    clock.advance(seeded.tokens.refresh_ttl + 1)
    with pytest.raises(InvalidGrant, match="expired"):
        await grants.refresh(seeded, await client(seeded), first.refresh_token)


# -- introspection ----------------------------------------------------------------------------


def caller(authorization=None, client_id=None, client_secret=None, address="127.0.0.1"):
    return ClientRequest(authorization, client_id, client_secret, address, "/oauth/token/introspect")


async def test_introspection_reports_and_expires(seeded, clock):
    first = await pair(seeded)
    body = await introspection.introspect(seeded, first.access_token)
    assert body["active"] is True and body["username"] == "alice" and body["subject_type"] == "user"
    assert body["token_type"] == "access_token" and body["client_id"] == "webapp"
    clock.advance(seeded.tokens.access_ttl + 1)
    assert await introspection.introspect(seeded, first.access_token) == {"active": False}
    assert await introspection.introspect(seeded, "not-a-token") == {"active": False}


async def test_who_may_introspect(seeded):
    await introspection.authorize_caller(seeded, caller(client_id="webapp", client_secret=WEBAPP_SECRET))
    with pytest.raises(AccessDenied):  # confidential but third-party
        await introspection.authorize_caller(seeded, caller(client_id="partner", client_secret=PARTNER_SECRET))
    with pytest.raises(InvalidClient):  # public: proves nothing
        await introspection.authorize_caller(seeded, caller(client_id="node-agent"))
    with pytest.raises(InvalidClient):
        await introspection.authorize_caller(seeded, caller(client_id="webapp", client_secret="wrong"))
    alice = await pair(seeded)
    with pytest.raises(AccessDenied):  # a user who is not an administrator
        await introspection.authorize_caller(seeded, caller(authorization=f"Bearer {alice.access_token}",
                                                            client_id="webapp"))
    root_code = await code_for(seeded, username="root", scope="read admin")
    root = await grants.exchange_code(seeded, await client(seeded), root_code, WEBAPP_REDIRECT, VERIFIER)
    await introspection.authorize_caller(seeded, caller(authorization=f"Bearer {root.access_token}",
                                                        client_id="webapp"))
    with pytest.raises(ValidationFailed):  # every call names its client: a bearer call its token's
        await introspection.authorize_caller(seeded, caller(authorization=f"Bearer {root.access_token}"))
    with pytest.raises(InvalidClient):
        await introspection.authorize_caller(seeded, caller(authorization=f"Bearer {root.access_token}",
                                                            client_id="partner"))
    root_read = await grants.refresh(seeded, await client(seeded), root.refresh_token, "read")
    with pytest.raises(InsufficientScope):
        await introspection.authorize_caller(seeded, caller(authorization=f"Bearer {root_read.access_token}",
                                                            client_id="webapp"))


def test_an_empty_secret_proves_no_confidential_client_whatever_digest_is_stored():
    """A store written before empty secrets were refused may hold the digest of one: presenting
    no secret, or an empty one, still proves nothing."""
    from tokensvc.oauth.clientauth import BASIC, ClientCredentials
    from tokensvc.records import Client

    client = Client("legacy", "Legacy", ["https://legacy.example/cb"], secret_hash=hashing.digest(""))
    for secret in ("", None):
        with pytest.raises(InvalidClient):
            clientauth.verify(client, ClientCredentials("legacy", secret, BASIC))


async def test_client_authentication_failures_are_limited(seeded):
    request = ClientRequest(None, "webapp", "wrong", "127.0.0.9", "/oauth/token")
    for _ in range(seeded.limits.settings.failed_client_auth_per_client):
        with pytest.raises(InvalidClient):
            await clientauth.authenticate_request(seeded, request)
    with pytest.raises(TooManyFailures):
        await clientauth.authenticate_request(seeded, request)


async def test_who_may_call_the_admin_api_and_how_often_they_may_fail(seeded):
    def call(authorization, address="127.0.0.8"):
        return adminauth.authenticate(seeded, adminauth.AdminRequest(authorization, address, "GET", "/admin/users"))

    root_code = await code_for(seeded, username="root", scope="read admin")
    root = await grants.exchange_code(seeded, await client(seeded), root_code, WEBAPP_REDIRECT, VERIFIER)
    assert await call(f"Bearer {root.access_token}") == adminauth.AdminCaller("root", "webapp")
    with pytest.raises(AccessDenied):  # a user who is not an administrator
        await call(f"Bearer {(await pair(seeded)).access_token}")
    root_read = await grants.refresh(seeded, await client(seeded), root.refresh_token, "read")
    with pytest.raises(InsufficientScope):
        await call(f"Bearer {root_read.access_token}")
    # Neither of those counted as a failure: only no token in force does (none, a dead one, a
    # refresh token), per address.
    for attempt in range(seeded.limits.settings.failed_client_auth_per_address):
        with pytest.raises(InvalidToken):
            await call([None, "Bearer nope", f"Bearer {root_read.refresh_token}"][attempt % 3])
    with pytest.raises(TooManyFailures):
        await call("Bearer nope")
    with pytest.raises(InvalidToken):  # another address has its own count
        await call("Bearer nope", "127.0.0.9")
    again = await grants.exchange_code(seeded, await client(seeded), await code_for(seeded, username="root",
                                                                                     scope="read admin"),
                                       WEBAPP_REDIRECT, VERIFIER)
    assert (await call(f"Bearer {again.access_token}")).username == "root"  # never refused by the limit


# -- revocation ----------------------------------------------------------------------------------


async def test_revoking_a_refresh_token_takes_its_family_and_an_access_token_itself(seeded):
    webapp = await client(seeded)
    first = await pair(seeded)
    second = await grants.refresh(seeded, webapp, first.refresh_token)
    # Its client revoking a rotated-out one takes the family (RFC 7009 §2.1); at sign-out it
    # is not in force and changes nothing.
    assert await revocation.revoke_token(seeded, first.refresh_token, None) is False
    assert (await introspection.introspect(seeded, second.access_token))["active"] is True
    assert await revocation.revoke_token(seeded, first.refresh_token, webapp) is True
    for token in (second.access_token, second.refresh_token):
        assert await introspection.introspect(seeded, token) == {"active": False}
    other = await pair(seeded)
    assert await revocation.revoke_token(seeded, other.access_token, webapp) is True
    assert await introspection.introspect(seeded, other.access_token) == {"active": False}
    assert (await introspection.introspect(seeded, other.refresh_token))["active"] is True  # RFC 7009: that token
    assert await revocation.revoke_token(seeded, other.access_token, webapp) is False


async def test_revocation_of_another_clients_token_is_a_silent_no_op(seeded):
    first = await pair(seeded)
    assert await revocation.revoke_token(seeded, first.access_token, await client(seeded, "skyplanner")) is False
    assert (await introspection.introspect(seeded, first.access_token))["active"] is True
    assert await revocation.revoke_token(seeded, "unknown", await client(seeded)) is False


async def test_revoking_the_grant_of_a_token(seeded):
    first = await pair(seeded)
    assert await revocation.revoke_grant_of(seeded, first.access_token) is True
    assert await introspection.introspect(seeded, first.refresh_token) == {"active": False}
    assert await revocation.revoke_grant_of(seeded, "unknown") is False


async def test_a_client_may_ask_only_for_scopes_listed_literally(seeded):
    """``write`` covers ``read`` and ``<resource>:<action>`` when a token is checked, never when a
    client asks: webapp may hold ``write`` but not ask for ``anything:read``."""
    for scope in ("observations:read", "evil<b>:read", "write:anything"):
        with pytest.raises(RedirectError) as refused:
            await authorization.validate(seeded, args(scope=scope))
        assert isinstance(refused.value.error, InvalidScope)
    listed = await authorization.validate(seeded, args(scope="read connected-apps:write"))
    assert listed.scopes == ["read", "connected-apps:write"]


async def test_a_failed_check_that_wins_the_race_is_no_replay(seeded, monkeypatch):
    """The attacker's failed check spends the code while the user's exchange is between its
    read and its atomic step: the user's pair is void and invalid_grant, and nothing is revoked."""
    webapp = await client(seeded)
    earlier = await pair(seeded)
    code = await code_for(seeded)
    store, consume = seeded.store, seeded.store.consume_code

    async def attacker_first(code_hash, now, *, family_id=None, failed=False):
        if not failed:  # the user's atomic step: the attacker's failed check got there first
            await consume(code_hash, now, failed=True)
        return await consume(code_hash, now, family_id=family_id, failed=failed)

    monkeypatch.setattr(store, "consume_code", attacker_first)
    with pytest.raises(InvalidGrant, match="no longer valid"):
        await grants.exchange_code(seeded, webapp, code, WEBAPP_REDIRECT, VERIFIER)
    assert (await introspection.introspect(seeded, earlier.refresh_token))["active"] is True


# -- operators: a password set, a user removed -------------------------------------------------


async def test_a_new_password_ends_sessions_and_revokes_grants_unless_kept(seeded):
    from tokensvc.admin import actions as admin
    from tokensvc.oauth import sessions

    alice = await seeded.store.get_user_by_username("alice")
    session_id = await sessions.start(seeded, alice)
    tokens = await pair(seeded)
    kept = await admin.set_password(seeded, "alice", "a-new-password-1", keep_grants=True)
    assert kept == {"username": "alice", "sessions_ended": 1, "families_revoked": 0}
    assert await sessions.resolve(seeded, session_id) is None
    assert (await introspection.introspect(seeded, tokens.refresh_token))["active"] is True

    session_id = await sessions.start(seeded, alice)
    ended = await admin.set_password(seeded, "alice", "another-password-2")
    assert ended["sessions_ended"] == 1 and ended["families_revoked"] == 1
    assert await sessions.resolve(seeded, session_id) is None
    assert await introspection.introspect(seeded, tokens.refresh_token) == {"active": False}


async def test_removing_a_user_ends_their_sessions(seeded):
    from tokensvc.admin import actions as admin
    from tokensvc.oauth import sessions

    root = await seeded.store.get_user_by_username("root")
    session_id = await sessions.start(seeded, root)
    await admin.remove_user(seeded, "root")
    assert await sessions.resolve(seeded, session_id) is None
    assert await seeded.store.get_session(hashing.digest(session_id)) is None  # ended
