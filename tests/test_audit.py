"""The audit trail (logger ``tokensvc.audit``) and the log formats."""

import json
import logging
import sys

import pytest
from helpers import SKY_REDIRECT, WEBAPP_REDIRECT, WEBAPP_SECRET, basic, exchange, json_of, post_form

from tokensvc.storage.base import StorageError
from tokensvc.telemetry.logs import JsonFormatter, TextFormatter


def audit_events(caplog):
    return [record.audit for record in caplog.records if record.name == "tokensvc.audit"]


@pytest.mark.gen_test
async def test_every_security_event_is_audited_without_secrets(browser, http_client, base_url, caplog):
    with caplog.at_level(logging.INFO, logger="tokensvc.audit"):
        await browser.login("alice", "wrong-password")
        await browser.login("alice")
        page = await browser.authorize("skyplanner", SKY_REDIRECT)
        await browser.decide(page, "deny")
        code = await browser.code_for("skyplanner", SKY_REDIRECT)  # consent allowed
        first = json_of(await exchange(http_client, base_url, code, client_id="skyplanner", secret=None,
                                       redirect_uri=SKY_REDIRECT))
        refresh_url = base_url + "/oauth/token/refresh"
        second = json_of(await post_form(http_client, refresh_url, {"refresh_token": first["refresh_token"],
                                                                    "client_id": "skyplanner"}))
        await post_form(http_client, base_url + "/oauth/token/revoke",
                        {"token": second["access_token"], "client_id": "skyplanner"})
        await post_form(http_client, refresh_url, {"refresh_token": first["refresh_token"], "client_id": "skyplanner"})
        await exchange(http_client, base_url, code, client_id="skyplanner", secret=None, redirect_uri=SKY_REDIRECT)
    events = audit_events(caplog)
    seen = [(event["event"], event["outcome"]) for event in events]
    for expected in [("login", "failure"), ("login", "success"), ("consent", "denied"), ("consent", "allowed"),
                     ("code_issued", "success"), ("token_issued", "success"), ("token_refreshed", "success"),
                     ("token_revoked", "revoked"), ("refresh_reuse", "family_revoked"),
                     ("code_reuse", "family_revoked")]:
        assert expected in seen, (expected, seen)
    alice_events = [event for event in events if event["event"] not in ("login",)]
    assert all(event.get("client_id") == "skyplanner" for event in alice_events)
    assert all(event.get("subject") for event in events if event["outcome"] != "failure")
    text = caplog.text + repr(events)
    for secret in (code, first["access_token"], first["refresh_token"], second["refresh_token"],
                   "alice-password", "wrong-password", browser.cookies["tokensvc_session"]):
        assert secret not in text


@pytest.mark.gen_test
async def test_a_sign_in_the_store_fails_after_the_password_is_audited_as_what_the_user_got(browser, store,
                                                                                             monkeypatch, caplog):
    """The password is right, then the store fails to start the session: the user gets 503,
    and the audit trail says so (an error), never that the sign-in succeeded."""
    async def away(session):
        raise StorageError("the store did not answer")

    monkeypatch.setattr(store, "add_session", away)
    with caplog.at_level(logging.INFO, logger="tokensvc.audit"):
        response = await browser.login("alice")
    assert response.code == 503
    logins = [(event["outcome"], event.get("username")) for event in audit_events(caplog) if event["event"] == "login"]
    assert logins == [("error", "alice")]
    assert "login succeeded" not in caplog.text


@pytest.mark.gen_test
async def test_a_failed_sign_in_names_only_a_user_that_exists(browser, caplog):
    """What was typed into the username field may be a password: it is written only when it
    names a user."""
    with caplog.at_level(logging.INFO, logger="tokensvc.audit"):
        await browser.login("alice", "wrong-password")
        await browser.login("hunter2-my-secret", "wrong-password")
    failures = [event for event in audit_events(caplog) if event["event"] == "login"]
    assert [event["username"] for event in failures] == ["alice", "(unknown)"]
    assert "hunter2-my-secret" not in caplog.text


@pytest.mark.gen_test
async def test_access_log_names_the_client(browser, http_client, base_url, caplog):
    code = await browser.code_for("webapp", WEBAPP_REDIRECT)
    with caplog.at_level(logging.INFO, logger="tokensvc.access"):
        await exchange(http_client, base_url, code)
        await post_form(http_client, base_url + "/oauth/token/introspect", {"token": "x"},
                        {"Authorization": basic("webapp", WEBAPP_SECRET)})
    lines = [record.getMessage() for record in caplog.records if record.name == "tokensvc.access"]
    assert any(line.startswith("127.0.0.1 200 POST /oauth/token ") and line.endswith("client_id=webapp")
               for line in lines)
    access = [record.access for record in caplog.records if record.name == "tokensvc.access"]
    assert access[0]["client_id"] == "webapp" and access[0]["status"] == 200 and access[0]["method"] == "POST"


def make_record(**extra):
    record = logging.LogRecord("tokensvc.audit", logging.INFO, __file__, 1, "token issued", (), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_log_format_is_one_object_per_line():
    line = JsonFormatter().format(make_record(audit={"event": "token_issued", "client_id": "webapp"}))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["logger"] == "tokensvc.audit" and entry["level"] == "info" and entry["message"] == "token issued"
    assert entry["audit"] == {"event": "token_issued", "client_id": "webapp"} and entry["time"].endswith("+00:00")


def test_text_log_format_appends_audit_fields():
    line = TextFormatter().format(make_record(audit={"event": "login", "outcome": "failure"}))
    assert line.endswith("token issued event=login outcome=failure")


def test_text_time_is_utc_iso_8601():
    record = make_record()
    record.created = 1795000000.25  # 2026-11-18T11:06:40.250Z
    formatter = TextFormatter()
    for _ in range(2):  # the second line uses the cached second
        assert formatter.format(record).startswith("2026-11-18T11:06:40.250Z INFO tokensvc.audit: ")


def test_a_json_line_carries_the_exception():
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        record = logging.LogRecord("tokensvc.handlers.exit", logging.ERROR, __file__, 1, "Uncaught exception",
                                   (), sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "Uncaught exception" and entry["level"] == "error"
    assert entry["exception"].startswith("Traceback") and "RuntimeError: a bug" in entry["exception"]


def test_a_text_line_carries_the_exception_below_it():
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        record = logging.LogRecord("tokensvc", logging.ERROR, __file__, 1, "Uncaught exception", (), sys.exc_info())
    first, *rest = TextFormatter().format(record).split("\n")
    assert first.endswith("ERROR tokensvc: Uncaught exception")
    assert rest[0].startswith("Traceback") and rest[-1] == "RuntimeError: a bug"
