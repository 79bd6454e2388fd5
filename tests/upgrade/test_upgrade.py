"""A rolling upgrade from the previous release, as an operator runs one: that release's
``tokensvc serve`` (from the project's history, tests/upgrade/releases.py) and this tree's,
side by side on one replica-set primary, then ``tokensvc storage finalize``.

The invariant: no credential dies of the upgrade. Every credential either release issues
(access and refresh tokens, codes, session cookies, installation tokens) is served by the
other; a refresh chain may alternate between them; a revocation or a sign-out at one holds at
the other; processes restart in any order and come up, and none of them drops an index the
other relies on; nothing this release writes holds a hash. Side by side, both write the previous
release's format (2): finalize is refused while a process of it is connected, and it serves
what this one issued once this one's processes stop (a rollback). Once finalized (format 3),
tokens may be bound to an audience (RFC 8707), which the previous release would ignore: it then
refuses to start.

From 0.9.0 (fixture ``oldest``; "the previous release" of those tests, the older of the
deployment), whose format this release still reads: finalize is refused while a process of it
is connected; after it, with only this release's processes, every credential issued before
still works and no row of the old format is left; 0.9.0 then refuses to start (answering, until
it stops, from the old format, never ready), and one run anyway is seen. What 0.9.0 drops when
it rewrites a document this release wrote loses nothing and grants nothing."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import releases
import requests
from helpers import CHALLENGE, DIGEST, VERIFIER, wait_until
from primary import Fault, ReplicaSet
from service import NOWHERE, WEBAPP_SECRET, Service, answer_when_read, start_service

from tokensvc import __version__
from tokensvc.cli import main as cli
from tokensvc.oauth import hashing
from tokensvc.storage.base import CACHE_SECONDS
from tokensvc.storage.mongo.format import TRIPWIRE, release_key

HEARTBEAT = 1  # storage.heartbeat_seconds of this release's processes: finalize waits for one


def storage(primary: ReplicaSet, database: str = "tokensvc") -> str:
    return (f'[storage]\nbackend = "mongodb"\nmongodb_uri = "{primary.uri()}"\ndatabase = "{database}"\n'
            'timeout_ms = 5000\n')


class Deployment:
    """The processes of both releases on one primary."""

    def __init__(self, primary: ReplicaSet, previous, tmp_path_factory) -> None:
        self.primary, self.previous, self.tmp = primary, previous, tmp_path_factory
        self.services: list[Service] = []
        self.said: list[str] = []  # what the storage commands printed

    def storage(self, capsys, *argv: str) -> tuple[int, str, str]:
        """``tokensvc storage ...`` of this release, on this deployment's store."""
        code, out, err = storage_command(capsys, *argv, "--config", self.config())
        self.said.append(out + err)
        return code, out, err

    def written(self) -> str:
        """Everything this release wrote: its processes' output, its storage commands'."""
        return "\n".join([*(service.output() for service in self.services
                             if "current" in service.log_path.parent.name), *self.said])

    def start(self, release: str, extra: str = "", ready: bool = True, database: str = "tokensvc") -> Service:
        directory = self.tmp.mktemp(release)
        if release == "previous":
            service = start_service(directory, storage(self.primary, database), python=self.previous.python,
                                    cwd=self.previous.cwd, env=self.previous.env, extra=extra)
        else:
            service = start_service(directory, storage(self.primary, database), extra=extra,
                                    env={"TOKENSVC_STORAGE_HEARTBEAT_SECONDS": str(HEARTBEAT)})
        self.services.append(service)
        return service.wait_ready() if ready else service

    def stop(self, service: Service) -> None:
        output = service.stop()
        assert service.returncode == 0 and "Traceback" not in output, output

    def config(self) -> str:
        """A config file of this release's processes (the storage commands read the store from it)."""
        current = next(service for service in self.services if "current" in service.log_path.parent.name)
        return str(current.log_path.parent / "tokensvc.toml")

    def operators_config(self) -> str:
        """That config without its [[clients]], [[users]] and [[installations]]: an operator's
        command changes only entries no configuration file of this release names
        (docs/guide/administration.md, "Who owns an entry"): one that the store marks as a file's, which
        this release's file names, is refused whatever file the command is given. The previous
        release seeds from its own file whatever that names, and knows no owner."""
        text = Path(self.config()).read_text()
        path = Path(self.config()).with_name("operators.toml")
        path.write_text(text.split("\n[[", 1)[0] + "\n")
        return str(path)

    def unmark(self, collection: str, key: str) -> None:
        """Take the store's mark off an entry this release's file names (``owner``), as a start of
        this release whose file names it no more does: the entry is the operator's to change
        here, while the previous release's file goes on naming it."""
        self.primary.db["tokensvc"][collection].update_one({"_id": key}, {"$unset": {"owner": ""}})

    def close(self) -> list[str]:
        return [service.stop() for service in self.services if service.process.poll() is None]


class Browser:
    """A user agent: its cookies (the session, the XSRF token) go to every process, as behind
    one load balancer."""

    def __init__(self, username: str = "alice", password: str = "violet-tide-anchor") -> None:
        self.agent = requests.Session()
        self.username, self.password = username, password

    def sign_in(self, base: str) -> Browser:
        self.agent.get(base + "/login", timeout=30)
        answer = self.agent.post(base + "/login", timeout=30, allow_redirects=False, data={
            "username": self.username, "password": self.password, "_xsrf": self.agent.cookies["_xsrf"]})
        assert answer.status_code in (302, 303), answer.text
        return self

    def code(self, base: str, client_id: str = "webapp", installation: str | None = None) -> str:
        query = {"response_type": "code", "client_id": client_id, "redirect_uri": NOWHERE[client_id],
                 "scope": "read", "state": "s", "code_challenge": CHALLENGE, "code_challenge_method": "S256"}
        if installation:
            query["installation_id"] = installation
        url = base + "/oauth/authorize?" + urlencode(query)
        answer = self.agent.get(url, timeout=30, allow_redirects=False)
        if answer.status_code == 200:  # the pairing page
            answer = answer_when_read(self.agent, urljoin(url, "/oauth/authorize"), answer.text)
        assert answer.status_code == 302, answer.text
        return parse_qs(urlsplit(answer.headers["Location"]).query)["code"][0]

    def me(self, base: str) -> int:
        return self.agent.get(base + "/v1/me", timeout=30).status_code

    def sign_out(self, base: str) -> None:
        answer = self.agent.post(base + "/logout", timeout=30, allow_redirects=False,
                                 data={"_xsrf": self.agent.cookies["_xsrf"]})
        assert answer.status_code in (302, 303), answer.text


def client_auth(client_id: str) -> dict:
    return {"auth": (client_id, WEBAPP_SECRET)} if client_id == "webapp" else {}


def exchange(base: str, code: str, client_id: str = "webapp") -> dict:
    answer = requests.post(base + "/oauth/token", timeout=30, **client_auth(client_id), data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": NOWHERE[client_id],
        "code_verifier": VERIFIER, **({} if client_id == "webapp" else {"client_id": client_id})})
    assert answer.status_code == 200, answer.text
    return {**answer.json(), "client_id": client_id}


def refresh(base: str, tokens: dict) -> dict:
    client_id = tokens["client_id"]
    answer = requests.post(base + "/oauth/token/refresh", timeout=30, **client_auth(client_id), data={
        "refresh_token": tokens["refresh_token"], **({} if client_id == "webapp" else {"client_id": client_id})})
    assert answer.status_code == 200, answer.text
    return {**answer.json(), "client_id": client_id}


def works(base: str, tokens: dict) -> bool:
    """The access token authorizes /v1/me, and introspection says it is active."""
    me = requests.get(base + "/v1/me", timeout=30, headers={"Authorization": f"Bearer {tokens['access_token']}"})
    info = requests.post(base + "/oauth/token/introspect", timeout=30, auth=("webapp", WEBAPP_SECRET),
                         data={"token": tokens["access_token"]}).json()
    assert (me.status_code == 200) == info["active"], (me.status_code, info)
    return info["active"]


def revoke(base: str, tokens: dict) -> None:
    """RFC 7009: the client revokes its refresh token (the token family: its access token too)."""
    client_id = tokens["client_id"]
    answer = requests.post(base + "/oauth/token/revoke", timeout=30, **client_auth(client_id), data={
        "token": tokens["refresh_token"], **({} if client_id == "webapp" else {"client_id": client_id})})
    assert answer.status_code == 200, answer.text


def revoke_grant(base: str, tokens: dict) -> None:
    """``POST /oauth/revoke?token=``: the app cuts its own access, the whole grant."""
    answer = requests.post(base + "/oauth/revoke", timeout=30, params={"token": tokens["access_token"]})
    assert answer.status_code == 200, answer.text


def cookie_of(browser: Browser) -> requests.Session:
    """A copy of the browser's cookies: what a thief of the session cookie would hold (the
    browser itself forgets it when it signs out)."""
    copy = requests.Session()
    copy.cookies.update(browser.agent.cookies)
    return copy


def storage_command(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["storage", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def metric(service: Service, name: str) -> float:
    text = requests.get(service.base + "/metrics", timeout=30).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def looks_at_connections(primary: ReplicaSet) -> list[dict]:
    """The ``$currentOp`` requests the server has answered."""
    return [doc for doc in primary.sent("aggregate") if doc.get("pipeline") and "$currentOp" in doc["pipeline"][0]]


def indexes(primary: ReplicaSet) -> dict[str, list[str]]:
    db = primary.db["tokensvc"]
    return {name: sorted(db[name].index_information()) for name in sorted(db.list_collection_names())}


def each_serves_the_others(old: Service, new: Service, alice: Browser) -> None:
    """What either release issues works at the other: a session cookie, a code, access and
    refresh tokens, installation tokens; a sign-out and revocations at one hold at both."""
    for issuer, other in ((old, new), (new, old)):
        browser = Browser("bob", "copper-fern-meadow").sign_in(issuer.base)
        assert browser.me(other.base) == 200  # the session cookie
        tokens = exchange(other.base, browser.code(issuer.base))  # a code
        # An access token: neither release's carries a routing part while the previous release
        # may serve (its resource library refuses the new shape); each finds the other's by its hash.
        assert len(tokens["access_token"]) == 43
        assert works(issuer.base, tokens) and works(other.base, tokens)
        tokens = refresh(other.base, tokens)
        # A successor has none while the previous release may serve: both recompute it alike.
        assert works(issuer.base, tokens) and len(tokens["access_token"]) == 43  # a refresh token
        paired = exchange(other.base, alice.code(issuer.base, "node-agent", "backyard-scope"), "node-agent")
        paired = refresh(other.base, paired)
        assert works(issuer.base, paired)  # installation tokens
        # Acting on the other's records: a sign-out, and revocations of tokens in force, hold at both.
        session = cookie_of(browser)
        browser.sign_out(other.base)
        assert session.get(issuer.base + "/v1/me", timeout=30).status_code == 401
        revoke(other.base, paired)  # a family (RFC 7009)
        assert not works(issuer.base, paired) and not works(other.base, paired)
        revoke_grant(other.base, tokens)  # bob's grant to the web app, whole
        assert not works(issuer.base, tokens)
        assert requests.post(issuer.base + "/oauth/token/refresh", timeout=30, auth=("webapp", WEBAPP_SECRET),
                             data={"refresh_token": tokens["refresh_token"]}).status_code == 400


def alternated(chain: dict, old: Service, new: Service) -> dict:
    """A refresh chain alternating between the releases keeps working: its last pair."""
    for base in (new.base, old.base, new.base, old.base):
        chain = refresh(base, chain)
        assert works(old.base, chain) and works(new.base, chain)
    return chain


def restarted(deployment: Deployment, old: Service, new: Service) -> tuple[Service, Service]:
    """Each process restarted, the previous release's first: each comes up, and none drops an
    index another relies on."""
    made = indexes(deployment.primary)
    for release, service in (("previous", old), ("current", new)):
        deployment.stop(service)
        started = deployment.start(release)
        old, new = (started, new) if release == "previous" else (old, started)
        assert indexes(deployment.primary) == made
    assert deployment.primary.sent("dropIndexes") == []
    return old, new


def test_a_rolling_upgrade_signs_no_one_out_and_finalize_waits_for_the_previous_release(primary, previous,
                                                                                         tmp_path_factory, capsys):
    """The previous release and this one write the same format: side by side, each serves what
    the other issued, a refresh chain alternates between them, presentations arriving together
    at both get one pair, restarts drop no index; finalize (to format 3, audiences) is refused
    while the previous release is connected and raises nothing; the previous release, alone
    again (a rollback), serves every credential this one issued."""
    deployment = Deployment(primary, previous, tmp_path_factory)
    try:
        old = deployment.start("previous")
        assert requests.get(old.base + "/healthz", timeout=5).json() == {"status": "ok", "version": previous.version}
        alice = Browser().sign_in(old.base)
        issued_before = {"pending code": alice.code(old.base), "tokens": exchange(old.base, alice.code(old.base))}

        new = deployment.start("current")
        assert requests.get(new.base + "/healthz", timeout=5).json() == {"status": "ok", "version": __version__}
        code, out, _ = deployment.storage(capsys, "status", "--json")
        status = json.loads(out)
        assert code == 0 and (status["format"], status["compatibility"]) == (3, 2)
        assert status["warnings"] == []
        assert [blocker for blocker in status["finalizeBlockers"] if f"tokensvc {previous.version} is" in blocker]
        assert {seen["release"] for seen in status["connections"]} == {previous.version, __version__}
        assert [(seen["release"], seen["how"]) for seen in status["releasesSeen"]] == [
            (release, ["opened the store", "running", "connected"]) for release in (previous.version, __version__)]

        each_serves_the_others(old, new, alice)
        chain = alternated(issued_before["tokens"], old, new)
        # Arriving together, one at each release: the one pair both derive.
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda base, tokens=chain: refresh(base, tokens), [old.base, new.base]))
        assert together[0]["refresh_token"] == together[1]["refresh_token"]
        chain = together[0]
        assert works(old.base, chain) and works(new.base, chain)
        old, new = restarted(deployment, old, new)
        assert works(old.base, chain) and works(new.base, chain) and alice.me(new.base) == 200

        # Finalize, the previous release still serving: refused, nothing raised.
        code, _, err = deployment.storage(capsys, "finalize")
        assert code == 1 and f"tokensvc {previous.version} is" in err, err
        assert primary.db["tokensvc"]["meta"].find_one({"_id": "format"})["compatibility"] == 2
        # This release's credentials, its processes stopped: the previous release serves them all.
        bob = Browser("bob", "copper-fern-meadow").sign_in(new.base)
        issued_here = {"code": bob.code(new.base), "tokens": refresh(new.base, exchange(new.base, bob.code(new.base)))}
        deployment.stop(new)
        assert bob.me(old.base) == 200 and alice.me(old.base) == 200
        assert works(old.base, refresh(old.base, issued_here["tokens"]))
        assert works(old.base, exchange(old.base, issued_here["code"]))
        assert works(old.base, exchange(old.base, issued_before["pending code"]))
        assert works(old.base, refresh(old.base, chain))
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs
    assert not DIGEST.search(deployment.written()), DIGEST.search(deployment.written())  # no hash, ever


def test_a_rolling_upgrade_then_finalize_signs_no_one_out(primary, oldest, tmp_path_factory, capsys):
    """From 0.9.0, whose format (1) this release converts at finalize."""
    deployment = Deployment(primary, oldest, tmp_path_factory)
    try:
        # The deployment as it runs today: the previous release, with what users hold.
        old = deployment.start("previous")
        assert requests.get(old.base + "/healthz", timeout=5).json() == {"status": "ok"}  # 0.9.0 says no version
        alice = Browser().sign_in(old.base)
        issued_before = {"pending code": alice.code(old.base), "tokens": exchange(old.base, alice.code(old.base)),
                         "installation": exchange(old.base, alice.code(old.base, "node-agent", "backyard-scope"),
                                                  "node-agent")}

        # A process of this release joins.
        new = deployment.start("current")
        assert requests.get(new.base + "/healthz", timeout=5).json() == {"status": "ok", "version": __version__}
        code, out, _ = deployment.storage(capsys, "status", "--json")
        status = json.loads(out)
        assert code == 0 and (status["format"], status["compatibility"]) == (3, 1)
        assert {seen["release"] for seen in status["connections"]} == {None, __version__}
        assert status["migrations"]["atFinalize"][0]["name"] == "packed-hashes"
        assert any("0.9.0 or earlier is connected" in blocker for blocker in status["finalizeBlockers"])
        assert [(seen["release"], seen["how"]) for seen in status["releasesSeen"]] == [
            (None, ["wrote format 1", "connected"]), (__version__, ["opened the store", "running", "connected"])]
        assert metric(new, 'tokensvc_store_format{of="compatibility"}') == 1
        assert metric(new, 'tokensvc_store_migration_pending{migration="packed-hashes"}') == 1

        # What either issues works at the other.
        each_serves_the_others(old, new, alice)

        # A refresh chain alternating between the releases keeps working.
        chain = alternated(issued_before["tokens"], old, new)
        # Presentations arriving together at this release get the one pair it derived, an
        # ordinary pair to the previous release; a pair the previous release issued (random,
        # the family's serial and key id left as they were) is never taken for one: a
        # presentation of its predecessor is decided by the grace rules, as it was before.
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda base, tokens=chain: refresh(base, tokens), [new.base, new.base]))
        assert together[0]["refresh_token"] == together[1]["refresh_token"]
        assert works(old.base, together[0])
        rotated_by_previous = refresh(old.base, together[0])
        retried = refresh(new.base, together[0])  # unused, within the grace: a new pair in its place
        assert retried["refresh_token"] != rotated_by_previous["refresh_token"]
        assert works(old.base, retried) and not works(new.base, rotated_by_previous)
        chain = refresh(old.base, retried)
        issued_before["tokens"] = chain
        assert alice.me(new.base) == 200
        issued_before["code at the new release"] = Browser().sign_in(new.base).code(new.base)

        # Restarts in any order come up, and no process drops an index another relies on.
        old, new = restarted(deployment, old, new)
        assert works(old.base, chain) and works(new.base, chain) and alice.me(new.base) == 200

        # Finalize waits for the previous release to be gone.
        code, _, err = deployment.storage(capsys, "finalize")
        assert code == 1 and "not finalized: tokensvc 0.9.0 or earlier is connected from 127.0.0.1:" in err, err
        deployment.stop(old)

        def finalized() -> str | None:
            code, _, err = deployment.storage(capsys, "finalize")
            assert code == 0 or "0.9.0 or earlier is connected" in err, err  # its sockets are still closing
            return err if code == 0 else None

        err = wait_until(finalized, "finalize, once the previous release's sockets are closed")
        assert "packed-hashes: " in err  # progress on stderr
        code, out, _ = deployment.storage(capsys, "status", "--json")
        status = json.loads(out)
        assert (status["format"], status["compatibility"]) == (3, 3)
        assert "packed-hashes" in status["migrations"]["done"] and status["finalizeBlockers"] == []
        assert {seen["writes"] for seen in status["running"]} == {3}
        for name in ("codes", "families", "sessions"):
            assert primary.db["tokensvc"][name].count_documents({"_id": {"$type": "string"}}) == 0, name
        wait_until(lambda: metric(new, 'tokensvc_store_migration_pending{migration="packed-hashes"}') == 0,
                   "the metrics following the store at the next heartbeat", retry=(requests.RequestException,))
        assert metric(new, 'tokensvc_store_format{of="compatibility"}') == 3
        assert metric(new, 'tokensvc_store_migration_rows{migration="packed-hashes"}') > 0

        # Only this release now: every credential issued before the upgrade still works.
        another = deployment.start("current")
        for base in (new.base, another.base):
            assert alice.me(base) == 200
            assert works(base, issued_before["tokens"])
        issued_before["tokens"] = refresh(another.base, issued_before["tokens"])
        assert works(new.base, issued_before["tokens"])
        assert works(another.base, refresh(new.base, issued_before["installation"]))
        assert works(new.base, exchange(another.base, issued_before["pending code"]))
        assert works(another.base, exchange(new.base, issued_before["code at the new release"]))

        # The previous release now stops at start-up, its line naming the index it cannot make
        # beside the tripwire. It listens while it asks for its indexes (its request held here,
        # for a look): meanwhile it answers from the old format (a live token inactive, its
        # refresh token unknown: a client would throw it away), and its /readyz answers 503 all
        # that time, so nothing routed by readiness reaches it.
        tripwire = Fault("createIndexes", "hold", collection="failures",
                         when=lambda doc: doc["indexes"][0]["name"] == "ttl")
        primary.script(tripwire)
        refused = deployment.start("previous", ready=False)
        wait_until(lambda: tripwire.hits, "the previous release asking for the index the tripwire holds")

        def ready() -> int:
            return requests.get(refused.base + "/readyz", timeout=30).status_code

        assert wait_until(ready, "the previous release listening", retry=(requests.RequestException,)) == 503
        live = issued_before["tokens"]
        assert works(new.base, live) and not works(refused.base, live)
        unknown = requests.post(refused.base + "/oauth/token/refresh", timeout=30, auth=("webapp", WEBAPP_SECRET),
                                data={"refresh_token": live["refresh_token"]})
        assert (unknown.status_code, unknown.json()["error"]) == (400, "invalid_grant"), unknown.text
        assert ready() == 503 and works(another.base, live)
        primary.release(tripwire)
        refused.process.wait(timeout=30)
        assert refused.returncode == 1, refused.output()
        assert f"tokensvc: index failures.{TRIPWIRE} (tokensvc's ttl) exists with other options" in refused.output()
        # Started anyway (the tripwire dropped, as that line advises, while no process of this
        # release ran to make it again): every process of this release warns and says so in its
        # metrics, converts the rows it writes, makes the tripwire again; status warns.
        for service in (new, another):
            deployment.stop(service)
        primary.db["tokensvc"]["failures"].drop_index(TRIPWIRE)
        old = deployment.start("previous")
        Browser().sign_in(old.base)  # a session, written as 0.9.0 writes it
        new = deployment.start("current")
        wait_until(lambda: metric(new, "tokensvc_store_old_release_connections") >= 1
                   and primary.db["tokensvc"]["sessions"].count_documents({"_id": {"$type": "string"}}) == 0,
                   "the old release seen and its session converted", retry=(requests.RequestException,))
        assert sorted(primary.db["tokensvc"]["failures"].index_information()) == ["_id_", TRIPWIRE]
        assert "tokensvc 0.9.0 or earlier is connected from 127.0.0.1:" in new.output()
        assert "rows of an older format were written after migration packed-hashes was done" in new.output()
        code, out, _ = deployment.storage(capsys, "status")
        assert "WARNING: tokensvc 0.9.0 or earlier is connected from 127.0.0.1:" in out, out
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs
    assert not DIGEST.search(deployment.written()), DIGEST.search(deployment.written())  # no hash, ever


def start_together(deployment: Deployment, releases: list[str], extra: str = "") -> list[Service]:
    """Processes of ``releases`` started at once (``extra``: the configuration of this release's)."""
    with ThreadPoolExecutor(len(releases)) as pool:
        return list(pool.map(lambda release: deployment.start(release, extra if release == "current" else ""),
                             releases))


CAROL = '[[users]]\nusername = "carol"\npassword = "juniper-vault-cascade"\n'


def test_processes_of_both_releases_starting_together_all_come_up(primary, previous, tmp_path_factory):
    """Two processes of each release starting at once on a store the previous release wrote:
    every one serves, each serves the others' credentials, and no index is dropped.

    The previous release stored ``users add Carol`` under her key (``carol``). This release,
    which looks usernames up through an index the previous release does not make (and does not
    drop), finds her whatever the case it is typed in: its configuration naming ``carol`` takes
    that user, and Carol signs in as CAROL."""
    import os
    import subprocess

    deployment = Deployment(primary, previous, tmp_path_factory)
    try:
        old = deployment.start("previous")
        added = subprocess.run(
            [previous.python, "-m", "tokensvc", "users", "add", "Carol", "--password-stdin", "--config",
             str(old.log_path.parent / "tokensvc.toml")], input="lichen-orbit-tamarind\n", capture_output=True,
            text=True, cwd=previous.cwd, env={**os.environ, **previous.env}, timeout=60)
        assert added.returncode == 0, added.stderr
        deployment.stop(old)
        services = start_together(deployment, ["previous", "current", "previous", "current"], extra=CAROL)
        tokens = exchange(services[0].base, Browser().sign_in(services[1].base).code(services[2].base))
        for service in services:
            tokens = refresh(service.base, tokens)
            assert all(works(other.base, tokens) for other in services)
        assert primary.sent("dropIndexes") == []
        users = primary.db["tokensvc"]["users"]
        assert [user["username"] for user in users.find({"username": {"$regex": "^carol$", "$options": "i"}})] \
            == ["carol"]
        assert "username_caseless" in users.index_information()
        Browser("CAROL", "juniper-vault-cascade").sign_in(services[1].base)  # the file's password, set on Carol
        Browser("Carol", "juniper-vault-cascade").sign_in(services[0].base)
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


def test_processes_of_this_release_starting_together_drop_a_retired_index_once(primary, oldest, tmp_path_factory,
                                                                               capsys):
    """Four processes starting at once on a store holding an index 0.9.0 replaced: one drops
    it, the others find it gone, and every one serves. Beside them, on the same server, the
    previous release serves another database: none of this store's concern (no warning at any
    heartbeat, nothing connected in ``storage status``)."""
    primary.db["tokensvc"]["families"].create_index([("grant_id", 1)], name="grant_id")
    deployment = Deployment(primary, oldest, tmp_path_factory)
    try:
        with ThreadPoolExecutor(5) as pool:
            elsewhere = pool.submit(deployment.start, "previous", database="third")
            services = list(pool.map(deployment.start, ["current"] * 4))
            elsewhere.result()
        assert "grant_id" not in primary.db["tokensvc"]["families"].index_information()
        looks = len(looks_at_connections(primary))
        wait_until(lambda: len(looks_at_connections(primary)) >= looks + 4 * 3,  # three looks a heartbeat
                   "a heartbeat's look at the connections, each process's")
        code, out, _ = deployment.storage(capsys, "status", "--json")
        status = json.loads(out)
        assert code == 0 and status["warnings"] == [] and status["finalizeBlockers"] == []
        assert {seen["release"] for seen in status["connections"]} == {__version__}
        assert None not in {seen["release"] for seen in status["releasesSeen"]}
        for service in services:
            assert "is connected from" not in service.output()
            assert metric(service, "tokensvc_store_old_release_connections") == 0
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


def test_the_previous_release_started_while_finalize_raises_the_version_stops_at_start_up(primary, oldest,
                                                                                          tmp_path_factory, capsys):
    """Finalize places its tripwire before it raises the compatibility version, and looks at who
    is connected in between: with the raise held, a process of the previous release started
    meanwhile stops at its start-up (never ready: it cannot be the one that answers every
    credential as unknown), and the raise then goes on."""
    import threading

    deployment = Deployment(primary, oldest, tmp_path_factory)
    try:
        old = deployment.start("previous")
        deployment.start("current")
        deployment.stop(old)

        def ready_to_finalize() -> bool:
            code, out, _ = deployment.storage(capsys, "status", "--json")
            return code == 0 and json.loads(out)["finalizeBlockers"] == []

        wait_until(ready_to_finalize, "the previous release's sockets closed")
        patient = deployment.tmp.mktemp("finalize") / "tokensvc.toml"  # a budget longer than the raise is held
        patient.write_text("demo = true\n" + storage(primary).replace("timeout_ms = 5000", "timeout_ms = 120000"))
        held = Fault("update", "hold", collection="meta",
                     when=lambda doc: "compatibility" in str(doc["updates"][0]["u"].get("$set", {})))
        primary.script(held)
        finalized: list[int] = []
        finalizing = threading.Thread(target=lambda: finalized.append(
            cli.main(["storage", "finalize", "--config", str(patient)])))
        finalizing.start()
        wait_until(lambda: held.hits, "the raise, held")
        refused = deployment.start("previous", ready=False)
        refused.process.wait(timeout=60)
        assert refused.returncode == 1, refused.output()
        assert f"tokensvc: index failures.{TRIPWIRE} (tokensvc's ttl) exists with other options" in refused.output()
        assert primary.db["tokensvc"]["meta"].find_one({"_id": "format"})["compatibility"] == 1
        primary.release(held)
        finalizing.join(timeout=120)
        assert finalized == [0], capsys.readouterr().err
        assert primary.db["tokensvc"]["meta"].find_one({"_id": "format"})["compatibility"] == 3
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


def test_each_release_is_found_by_its_tag_and_without_it(monkeypatch):
    # A checkout without tags still finds the previous release by its recorded commit; with
    # tags, the tag and the record name the same commit.
    found, oldest = releases.previous(), releases.oldest()
    assert found.commit == releases.RELEASED[found.version] and oldest.commit == releases.RELEASED[oldest.version]
    assert oldest.version == "0.9.0" and release_key(oldest.version) < release_key(found.version)
    real_git = releases._git
    monkeypatch.setattr(releases, "_git", lambda *args: "" if args[0] == "tag" else real_git(*args))
    assert releases.previous() == found and releases.oldest() == oldest


def test_a_family_keeps_this_releases_fields_through_the_previous_releases_rotation(primary, oldest,
                                                                                     tmp_path_factory):
    """This release's family fields (the successor's serial, salt and key id, the access token
    the last rotation replaced, a second holder) survive a rotation by the previous release,
    which sets the pair's fields and leaves the rest; its random pair is never taken for a
    derived one (a presentation of the token it rotated out is decided by the grace rules, and
    the family lives on). A code exchanged here and presented again there, within the grace and
    while its pair is unused, is exchanged again by the previous release: its own rule, as
    UPGRADE.md says (the first pair dies)."""
    deployment = Deployment(primary, oldest, tmp_path_factory)
    try:
        old, new = deployment.start("previous"), deployment.start("current")
        browser = Browser().sign_in(new.base)
        first = exchange(new.base, browser.code(new.base))
        second = refresh(new.base, first)
        assert not works(new.base, first)  # the access token this rotation replaced: a second holder
        families = primary.db["tokensvc"]["families"]
        (document,) = list(families.find())
        assert document["salt"] and document["key_id"] and document["serial"] == 1
        assert document["previous_access_hash"] and document["second_holder_at"] is not None
        third = refresh(old.base, second)  # the previous release rotates: a random pair
        (after,) = list(families.find())
        assert {key: after[key] for key in ("salt", "key_id", "serial", "second_holder_at")} \
            == {key: document[key] for key in ("salt", "key_id", "serial", "second_holder_at")}
        assert after["refresh_hash"] != document["refresh_hash"]
        again = refresh(new.base, second)  # within the grace, its pair unused: replaced, never recomputed
        assert again["refresh_token"] != third["refresh_token"]
        assert works(new.base, again) and not works(new.base, third)
        # A code exchanged here, presented again at the previous release.
        code = browser.code(new.base)
        mine = exchange(new.base, code)
        replayed = exchange(old.base, code)
        assert replayed["refresh_token"] != mine["refresh_token"]
        assert works(new.base, replayed) and not works(new.base, mine)
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


RESOURCE_SERVER = ('\n[[clients]]\nclient_id = "notes-api"\nname = "Notes API"\nkind = "resource-server"\n'
                   'client_secret = "notes-api-upgrade-secret-0123456789abcdef01"\n')


def test_a_resource_server_the_previous_release_rewrote_may_do_nothing(primary, oldest, tmp_path_factory):
    """The previous release replaces a client's whole document when it rotates its secret, and
    drops ``kind``: what is left is a third-party client with no redirect URI and no scope, which
    this release lets neither introspect, nor read the revocation feed, nor start an
    authorization. It never gains a right."""
    import os
    import subprocess

    deployment = Deployment(primary, oldest, tmp_path_factory)
    try:
        old = deployment.start("previous")  # first: the store is then one the previous release reads
        new = deployment.start("current", extra=RESOURCE_SERVER)

        def introspect(secret: str) -> requests.Response:
            return requests.post(new.base + "/oauth/token/introspect", data={"token": "x" * 43}, timeout=30,
                                 auth=("notes-api", secret))

        assert introspect("notes-api-upgrade-secret-0123456789abcdef01").json() == {"active": False}
        rotated = subprocess.run(
            [oldest.python, "-m", "tokensvc", "clients", "rotate-secret", "notes-api", "--config",
             str(old.log_path.parent / "tokensvc.toml")], capture_output=True, text=True, cwd=oldest.cwd,
            env={**os.environ, **oldest.env}, timeout=60)
        assert rotated.returncode == 0, rotated.stderr
        secret = rotated.stdout.split("client_secret: ")[1].split()[0]
        document = primary.db["tokensvc"]["clients"].find_one({"_id": "notes-api"})
        assert "kind" not in document and document["redirect_uris"] == [] and document["allowed_scopes"] == []
        # This process may answer from the client's record it read a moment ago, for at most
        # CACHE_SECONDS (the previous release announces no rotation): the new secret is refused
        # as unknown until then (401), never accepted, then as a client with no right (403).
        answers: list[int] = []

        def refused_for_want_of_a_right() -> bool:
            answers.append(introspect(secret).status_code)
            return answers[-1] == 403

        # Asked every 0.3 s: each 401 is a failed authentication of the client, and ten of them
        # would put it over its limit, where the right secret gets the wrong one's answer.
        wait_until(refused_for_want_of_a_right, "the rotated record read, no longer the cached one",
                   seconds=CACHE_SECONDS + 10, interval=0.3)
        assert set(answers) <= {401, 403}, answers
        feed = requests.get(new.base + "/oauth/revocations", auth=("notes-api", secret), timeout=30, headers={
            "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
        assert feed.status_code == 403
        authorize = requests.get(new.base + "/oauth/authorize", allow_redirects=False, timeout=30, params={
            "response_type": "code", "client_id": "notes-api", "redirect_uri": NOWHERE["webapp"],
            "code_challenge": CHALLENGE, "code_challenge_method": "S256"})
        assert authorize.status_code == 400
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


ROLLING = '''
[[clients]]
client_id = "rolling"
name = "Rolling app"
redirect_uris = ["https://rolling.example/cb"]
first_party = true
client_secret_sha256 = "{digest}"
description = "{description}"
'''


def proves(base: str, secret: str) -> bool:
    """Whether ``secret`` proves the client ``rolling`` at the token endpoints."""
    answer = requests.post(base + "/oauth/token/introspect", timeout=30, auth=("rolling", secret),
                           data={"token": "not-a-token"})
    assert answer.status_code in (200, 401), answer.text
    return answer.status_code == 200


def test_a_previous_secret_outlives_the_previous_release_rewriting_its_client(primary, oldest, tmp_path_factory,
                                                                              capsys):
    """A rotation at this release keeps the old secret for an hour; the previous release then
    rewrites the client's document whole (its start-up seeding, from a configuration that now
    names the new secret), dropping every field it does not know. The old secret still proves
    the client at this release, which keeps it in a record the previous release never reads
    nor writes; the previous release itself takes only the current one. The rotation's mark
    (``credentials_changed_at``) goes with that rewrite, which weakens nothing: a rotation at this
    release of the document the previous release wrote is marked again, and closes the client's
    feed reader on the secret it replaced."""
    import hashlib

    from tokensvc.oauth import hashing

    old_secret = "rolling-old-secret-0123456789abcdef"
    digest = hashing.digest(old_secret)
    deployment = Deployment(primary, oldest, tmp_path_factory)
    try:
        old = deployment.start("previous", extra=ROLLING.format(digest=digest, description="First"))
        new = deployment.start("current")  # its file names no rolling: the operator's to rotate here
        assert cli.main(["clients", "rotate-secret", "rolling", "--keep-previous", "1h", "--json",
                         "--config", deployment.operators_config()]) == 0
        rotated = json.loads(capsys.readouterr().out)
        new_secret = rotated["clientSecret"]
        assert proves(new.base, old_secret) and proves(new.base, new_secret)
        document = primary.db["tokensvc"]["clients"].find_one({"_id": "rolling"})
        assert document["credentials_changed_at"] is not None and document.get("narrowed_at") is None
        # The deploy that follows names the new secret; the previous release restarts first.
        deployment.stop(old)
        rewritten = ROLLING.format(digest=hashlib.sha256(new_secret.encode()).hexdigest(), description="Second")
        old = deployment.start("previous", extra=rewritten)
        document = primary.db["tokensvc"]["clients"].find_one({"_id": "rolling"})
        assert document["description"] == "Second" and document["secret_hash"] == hashing.digest(new_secret)
        assert "credentials_changed_at" not in document  # a field the previous release does not know
        assert primary.db["tokensvc"]["previous_secrets"].count_documents({"_id": "rolling"}) == 1
        assert proves(new.base, old_secret) and proves(new.base, new_secret)
        assert proves(old.base, new_secret) and not proves(old.base, old_secret)
        # This release restarted with the same configuration: the overlap holds there too.
        deployment.stop(new)
        new = deployment.start("current")
        assert proves(new.base, old_secret) and proves(new.base, new_secret)
        assert cli.main(["clients", "show", "rolling", "--json", "--config", deployment.config()]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["previousSecretExpiresAt"] == rotated["previousSecretExpiresAt"]
        assert digest not in json.dumps(shown)
        # Rotated at this release again, without overlap: marked, and the reader on the secret it
        # replaced is closed (4403), told of no revocation.
        def rotate() -> None:
            assert cli.main(["clients", "rotate-secret", "rolling", "--config", deployment.operators_config()]) == 0

        assert closed_while_reading_the_feed(new.base, "rolling", new_secret, rotate) == ([], 4403)
        document = primary.db["tokensvc"]["clients"].find_one({"_id": "rolling"})
        assert document["credentials_changed_at"] is not None
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


def test_a_generated_secret_the_previous_release_rewrote_is_limited_until_rotated_again(primary, previous,
                                                                                       tmp_path_factory, capsys):
    """A secret this release generated (a rotation) is recorded as such, and its right answer is
    never refused by a limit. The previous release then sets another secret (its seeding, from a
    configuration that names one set by hand), which it does without that record: this release
    limits the client again, as it limits any secret set by hand, until it rotates it. An older
    process never makes a secret exempt; it can only take an exemption away."""
    from tokensvc.oauth import hashing

    def answered(secret: str) -> int:
        return requests.post(new.base + "/oauth/token/introspect", timeout=30, auth=("rolling", secret),
                             data={"token": "not-a-token"}).status_code

    hand_set = "rolling-hand-set-secret-0123456789abcdef"
    deployment = Deployment(primary, previous, tmp_path_factory)
    try:
        old = deployment.start("previous", extra=ROLLING.format(digest=hashing.digest(hand_set), description="First"))
        new = deployment.start("current")  # its file names no rolling: the operator's to rotate here
        rotate = ["clients", "rotate-secret", "rolling", "--json", "--config", deployment.operators_config()]
        assert cli.main(rotate) == 0
        generated = json.loads(capsys.readouterr().out)["clientSecret"]
        clients = primary.db["tokensvc"]["clients"]
        assert clients.find_one({"_id": "rolling"})["generated_secret_hash"] == hashing.digest(generated)
        # limits.failed_client_auth_per_client (10), from this address; the generated secret is answered.
        assert [answered("guess") for _ in range(11)] == [401] * 10 + [429]
        assert answered(generated) == 200
        deployment.stop(old)
        set_by_hand = "rolling-set-by-hand-again-0123456789abcdef"
        old = deployment.start("previous", extra=ROLLING.format(digest=hashing.digest(set_by_hand),
                                                                 description="Second"))
        document = clients.find_one({"_id": "rolling"})
        assert document["secret_hash"] == hashing.digest(set_by_hand)
        assert document.get("generated_secret_hash") != document["secret_hash"]
        # Limited again: once its key is over the limit, the right secret is answered as a wrong one.
        assert [answered("guess") for _ in range(10)] == [401] * 10
        assert answered(set_by_hand) == 429 and answered("guess") == 429
        # Rotated at this release, it is generated again, and answered.
        assert cli.main(rotate) == 0
        rotated = json.loads(capsys.readouterr().out)["clientSecret"]
        assert answered(rotated) == 200
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


def test_a_client_under_removal_stays_gone_when_the_previous_release_writes_it_back(primary, oldest,
                                                                                   tmp_path_factory, capsys):
    """A removal at this release stops after its record (the store refuses the sweep); the
    previous release then restarts and its seeding writes the client's document back whole. At
    this release the client stays gone (its tokens refused, its secret no proof) until the same
    removal, run again, finishes it: its grants revoked, so the previous release refuses the
    tokens too, and the document deleted again."""
    from primary import Fault

    deployment = Deployment(primary, oldest, tmp_path_factory)
    try:
        old = deployment.start("previous")
        new = deployment.start("current")
        deployment.unmark("clients", "webapp")
        alice = Browser().sign_in(old.base)
        tokens = exchange(old.base, alice.code(old.base))
        bearer = {"Authorization": f"Bearer {tokens['access_token']}"}
        assert requests.get(new.base + "/v1/me", headers=bearer, timeout=30).status_code == 200
        primary.script(Fault("update", "error", collection="families", code=262, labels=("RetryableWriteError",),
                             times=100_000))
        assert cli.main(["clients", "remove", "webapp", "--config", deployment.operators_config()]) == 1
        assert "tokensvc: " in capsys.readouterr().err
        with primary.lock:
            primary.faults.clear()
        assert primary.db["tokensvc"]["removals"].count_documents({"_id": "webapp"}) == 1
        deployment.stop(old)
        old = deployment.start("previous")  # its seeding writes the webapp's document back
        assert primary.db["tokensvc"]["clients"].count_documents({"_id": "webapp"}) == 1
        assert requests.get(new.base + "/v1/me", headers=bearer, timeout=30).status_code == 401
        introspected = requests.post(new.base + "/oauth/token/introspect", timeout=30,
                                     auth=("webapp", WEBAPP_SECRET), data={"token": tokens["access_token"]})
        assert introspected.status_code == 401  # the client is gone: its secret proves nothing
        assert requests.post(new.base + "/oauth/token/refresh", timeout=30, auth=("webapp", WEBAPP_SECRET),
                             data={"refresh_token": tokens["refresh_token"]}).status_code == 401
        # The same removal again finishes it, whichever release wrote the document meanwhile.
        assert cli.main(["clients", "remove", "webapp", "--config", deployment.operators_config()]) == 0
        assert "1 grants revoked" in capsys.readouterr().out
        assert primary.db["tokensvc"]["removals"].count_documents({}) == 0
        assert primary.db["tokensvc"]["clients"].count_documents({"_id": "webapp"}) == 0
        assert requests.get(old.base + "/v1/me", headers=bearer, timeout=30).status_code == 401
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


AN_ADMINISTRATOR = '\n[[users]]\nusername = "carol"\npassword = "granite-willow-comet"\nadmin = {admin}\n'


def after_reading_the_feed(base: str, action, until, client_id: str = "webapp", secret: str = WEBAPP_SECRET) -> dict:
    """Open the revocation feed at ``base`` (as the first-party web app, or ``client_id``), run
    ``action`` once it is ready, and read until a message ``until`` accepts: that message."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    from tokensvc.resource.settings import Settings, basic_authorization

    basic = basic_authorization(Settings(base, client_id, secret))

    async def read() -> dict:
        reader = await websocket_connect(HTTPRequest(base.replace("http", "ws", 1) + "/oauth/revocations",
                                                     headers={"Authorization": basic}))
        try:
            assert json.loads(await asyncio.wait_for(reader.read_message(), 30))["type"] == "ready"
            await asyncio.to_thread(action)
            while True:
                raw = await asyncio.wait_for(reader.read_message(), 30)
                assert raw is not None, "the feed closed"
                if until(message := json.loads(raw)):
                    return message
        finally:
            reader.close()

    return asyncio.run(read())


def closed_while_reading_the_feed(base: str, client_id: str, secret: str, action) -> tuple[list[dict], int | None]:
    """Open the revocation feed at ``base`` as ``client_id``, run ``action`` once it is ready,
    and read until the feed closes the reader: the messages before, and the close code."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    from tokensvc.resource.settings import Settings, basic_authorization

    basic = basic_authorization(Settings(base, client_id, secret))

    async def read() -> tuple[list[dict], int | None]:
        reader = await websocket_connect(HTTPRequest(base.replace("http", "ws", 1) + "/oauth/revocations",
                                                     headers={"Authorization": basic}))
        assert json.loads(await asyncio.wait_for(reader.read_message(), 30))["type"] == "ready"
        await asyncio.to_thread(action)
        messages = []
        while (raw := await asyncio.wait_for(reader.read_message(), 30)) is not None:
            messages.append(json.loads(raw))
        return messages, reader.close_code

    return asyncio.run(read())


def test_a_demotion_outlives_the_previous_release_rewriting_the_user(primary, oldest, tmp_path_factory, capsys):
    """This release demotes carol: the write carries the user's mark (``narrowed_at``), which
    this release's relay hears, and its revocation feed names her. The previous release then
    replaces her whole document (its ``users set-password --keep-grants``), dropping the mark: the
    demotion holds (the flag is one it knows), and nothing is lost, as the mark is an event, heard
    when it was written, and nothing reads it afterwards. Its seeding (``$set`` of the password
    and the flag) keeps the mark, and this release marks and names a later demotion of the
    document the previous release rewrote."""
    import os
    import subprocess

    deployment = Deployment(primary, oldest, tmp_path_factory)
    users = primary.db["tokensvc"]["users"]
    try:
        old = deployment.start("previous", extra=AN_ADMINISTRATOR.format(admin="true"))
        new = deployment.start("current")  # its file names no carol: the operator's to change here
        carol = users.find_one({"username": "carol"})
        assert carol["admin"] is True and "narrowed_at" not in carol  # what the previous release wrote

        def set_admin(admin: str):
            return lambda: cli.main(["users", "set-admin", "carol", admin, "--config", deployment.operators_config()])

        named = after_reading_the_feed(new.base, set_admin("no"), lambda message: "sub" in message)
        assert named == {"type": "revoked", "seq": named["seq"], "sub": carol["_id"]}
        demoted = users.find_one({"_id": carol["_id"]})
        assert demoted["admin"] is False and demoted["narrowed_at"] is not None

        # The previous release rewrites her whole document: the mark is gone, the demotion holds.
        rewritten = subprocess.run(
            [oldest.python, "-m", "tokensvc", "users", "set-password", "carol", "--keep-grants", "--password-stdin",
             "--config", str(old.log_path.parent / "tokensvc.toml")], input="cobalt-meadow-lantern\n",
            capture_output=True, text=True, cwd=oldest.cwd, env={**os.environ, **oldest.env}, timeout=60)
        assert rewritten.returncode == 0, rewritten.stderr
        document = users.find_one({"_id": carol["_id"]})
        assert "narrowed_at" not in document and document["admin"] is False
        assert Browser("carol", "cobalt-meadow-lantern").sign_in(new.base).me(new.base) == 200

        # Promoted and demoted again at this release: marked and named again.
        assert cli.main(["users", "set-admin", "carol", "yes", "--config", deployment.operators_config()]) == 0
        named = after_reading_the_feed(new.base, set_admin("no"), lambda message: "sub" in message)
        assert named["sub"] == carol["_id"]
        marked = users.find_one({"_id": carol["_id"]})["narrowed_at"]

        # The previous release restarts, its configuration now saying what the store holds: its
        # seeding sets the password and the flag, and leaves the mark.
        deployment.stop(old)
        old = deployment.start("previous", extra=AN_ADMINISTRATOR.format(admin="false"))
        document = users.find_one({"_id": carol["_id"]})
        assert document["admin"] is False and document["narrowed_at"] == marked
    finally:
        outputs = deployment.close()
    capsys.readouterr()
    assert not any("Traceback" in output for output in outputs), outputs


ROOT = '\n[[users]]\nusername = "root"\npassword = "quartz-river-beacon"\nadmin = true\n'
CLI_REDIRECT = "http://127.0.0.1:5/callback"  # a loopback port of tokensvc login's public client


def cli_code(browser: Browser, base: str) -> tuple[str, str | None]:
    """A code for admin to tokensvc login's client, its page answered, and the confirmation
    code the page showed (None: a release whose page shows none)."""
    from helpers import confirmation_shown

    url = base + "/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": "tokensvc-cli", "redirect_uri": CLI_REDIRECT, "scope": "admin",
        "state": "s", "code_challenge": CHALLENGE, "code_challenge_method": "S256"})
    answer = browser.agent.get(url, timeout=30, allow_redirects=False)
    shown = None
    if answer.status_code == 200:  # the page where the user decides
        shown = confirmation_shown(answer.text)
        answer = answer_when_read(browser.agent, urljoin(url, "/oauth/authorize"), answer.text)
    assert answer.status_code == 302, answer.text
    return parse_qs(urlsplit(answer.headers["Location"]).query)["code"][0], shown


def cli_exchange(base: str, code: str, confirmation: str | None = None) -> requests.Response:
    return requests.post(base + "/oauth/token", timeout=30, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": CLI_REDIRECT, "code_verifier": VERIFIER,
        "client_id": "tokensvc-cli", **({"confirmation_code": confirmation} if confirmation else {})})


def test_a_code_names_its_grant_and_either_release_exchanges_the_others(primary, previous, tmp_path_factory):
    """This release's codes name the grant they were issued under (grant_id), which its exchange
    reads by its key: the previous release ignores the field, exchanges such a code by its
    subject, and leaves the field as it was. A code of the previous release names no grant, and
    this release exchanges it by its subject."""
    deployment = Deployment(primary, previous, tmp_path_factory)
    codes = primary.db["tokensvc"]["codes"]

    def stored(code: str) -> dict:
        key = hashing.digest(code)
        return codes.find_one({"_id": {"$in": [key, bytes.fromhex(key)]}})

    try:
        old = deployment.start("previous")
        new = deployment.start("current")
        alice = Browser().sign_in(new.base)
        here = alice.code(new.base)
        named = stored(here)["grant_id"]
        assert named is not None
        assert works(old.base, exchange(old.base, here))
        assert stored(here)["grant_id"] == named and stored(here)["consumed_at"] is not None
        there = alice.code(old.base)
        assert "grant_id" not in stored(there)
        tokens = exchange(new.base, there)
        assert works(new.base, tokens) and works(old.base, tokens)
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


def test_admin_to_the_command_line_needs_its_confirmation_at_either_release(primary, previous, tmp_path_factory):
    """A code this release issued for admin to tokensvc login's client is stored under the digest
    of the code and the confirmation its page showed: the previous release, which looks a code up
    by the code alone, finds nothing (invalid_grant), given the confirmation or not, and spends
    nothing, so the code is still good here with it. A code the previous release issued without
    showing a confirmation is refused here, as clicks alone would have been."""
    deployment = Deployment(primary, previous, tmp_path_factory)
    try:
        old = deployment.start("previous", extra=ROOT)
        new = deployment.start("current", extra=ROOT)
        root = Browser("root", "quartz-river-beacon").sign_in(new.base)
        code, shown = cli_code(root, new.base)
        assert shown is not None
        for confirmation in (None, shown):
            refused = cli_exchange(old.base, code, confirmation)
            assert (refused.status_code, refused.json()["error"]) == (400, "invalid_grant"), refused.text
        here = cli_exchange(new.base, code, shown)
        assert here.status_code == 200 and here.json()["scope"] == "admin", here.text
        code, none_shown = cli_code(root, old.base)
        assert none_shown is None
        refused = cli_exchange(new.base, code)
        assert (refused.status_code, refused.json()["error"]) == (400, "invalid_grant"), refused.text
        assert "redeemed only with the confirmation code its page showed" in refused.json()["error_description"]
    finally:
        deployment.close()


def test_an_entry_this_releases_file_writes_is_served_by_the_previous_release_and_keeps_its_mark(
        primary, previous, tmp_path_factory, capsys):
    """This release marks the client and the user its file names (``owner``: the file's path).
    The previous release reads both as before (the field is one it does not know), so the client's
    secret proves it there and the user signs in there. The previous release knows no mark: its
    commands on the store, given a file that names neither, change both (a rotated secret, a
    promotion), as they did before this release, and its writes (``$set``) keep the mark. So this
    release still refuses to change them, naming its file, and its next start writes the file's
    values back. The mark only limits who writes an entry: a release that ignores it grants
    nothing more."""
    import os
    import subprocess

    from tokensvc.oauth import hashing

    secret = "rolling-file-secret-0123456789abcdef"
    carol = ("carol", "juniper-vault-cascade")
    deployment = Deployment(primary, previous, tmp_path_factory)
    clients, users = primary.db["tokensvc"]["clients"], primary.db["tokensvc"]["users"]
    named = ROLLING.format(digest=hashing.digest(secret), description="First") + "\n" + CAROL
    try:
        # The previous release first: a store this release makes is at format 3, which it cannot read.
        old = deployment.start("previous")  # its file names neither
        new = deployment.start("current", extra=named)
        assert clients.find_one({"_id": "rolling"})["owner"] == deployment.config()
        assert users.find_one({"username": "carol"})["owner"] == deployment.config()
        assert proves(old.base, secret) and proves(new.base, secret)
        assert Browser(*carol).sign_in(old.base).me(old.base) == 200

        def previous_command(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run([previous.python, "-m", "tokensvc", *argv, "--json", "--config",
                                   str(old.log_path.parent / "tokensvc.toml")], capture_output=True, text=True,
                                  cwd=previous.cwd, env={**os.environ, **previous.env}, timeout=60)

        rotated = previous_command("clients", "rotate-secret", "rolling")
        assert rotated.returncode == 0, rotated.stderr
        promoted = previous_command("users", "set-admin", "carol", "yes")
        assert promoted.returncode == 0, promoted.stderr
        assert not proves(new.base, secret)  # the previous release's change holds until a start
        assert clients.find_one({"_id": "rolling"})["owner"] == deployment.config()
        assert users.find_one({"username": "carol"})["owner"] == deployment.config()
        # This release refuses both still, whatever file its command is given.
        for argv in (["clients", "rotate-secret", "rolling"], ["users", "set-admin", "carol", "no"]):
            assert cli.main([*argv, "--config", deployment.operators_config()]) == 1
            assert f"is written by the configuration file {deployment.config()} at every start" in \
                capsys.readouterr().err
        # Its next start writes the file's values back, and marks them again.
        deployment.stop(new)
        new = deployment.start("current", extra=named)
        assert proves(new.base, secret) and proves(old.base, secret)
        assert users.find_one({"username": "carol"})["admin"] is False
        assert clients.find_one({"_id": "rolling"})["owner"] == str(new.log_path.parent / "tokensvc.toml")
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


def previous_cli(deployment: Deployment, old: Service, *argv: str) -> subprocess.CompletedProcess:
    """A command of the previous release's command line, with its process's configuration."""
    release, config = deployment.previous, str(old.log_path.parent / "tokensvc.toml")
    return subprocess.run([release.python, "-m", "tokensvc", *argv, "--config", config], cwd=release.cwd,
                          env={**os.environ, **release.env}, capture_output=True, text=True, timeout=120)


def test_a_removal_of_either_release_takes_a_client_of_the_others_registration(primary, previous, tmp_path_factory,
                                                                               capsys):
    """This release registers a client with a claim; the previous release removes it whole. The
    previous release starts a removal and stops short (its record holds no claim): this release
    refuses to register the id meanwhile, and finishing the removal takes whatever document
    holds the id, the one this release registered included (fail closed)."""
    deployment = Deployment(primary, previous, tmp_path_factory)
    clients, removals = primary.db["tokensvc"]["clients"], primary.db["tokensvc"]["removals"]
    try:
        old = deployment.start("previous")
        deployment.start("current")
        add = ["clients", "add", "--client-id", "transient", "--name", "Transient", "--redirect-uri", "https://t.example/cb",
               "--config", deployment.operators_config()]
        assert cli.main(add) == 0
        capsys.readouterr()
        assert clients.find_one({"_id": "transient"}).get("claim")  # registered with a claim of its own
        removed = previous_cli(deployment, old, "clients", "remove", "transient")
        assert removed.returncode == 0, removed.stderr
        assert clients.count_documents({"_id": "transient"}) == 0 and removals.count_documents({}) == 0
        # Registered again here; the previous release's removal of it stops after its record.
        assert cli.main(add) == 0
        capsys.readouterr()
        primary.script(Fault("update", "error", collection="families", code=262, labels=("RetryableWriteError",),
                             times=100_000))
        created = clients.find_one({"_id": "transient"})["created_at"]
        primary.db["tokensvc"]["grants"].insert_one({  # a grant of it, whose families' sweep the store refuses
            "_id": "g-transient", "client_id": "transient", "user_id": "u_x", "installation_id": None,
            "scopes": ["read"], "created_at": created, "revoked_at": None, "generation": 0})
        assert previous_cli(deployment, old, "clients", "remove", "transient").returncode == 1
        with primary.lock:
            primary.faults.clear()
        recorded = removals.find_one({"_id": "transient"})
        assert recorded is not None and "client_claim" not in recorded  # the previous release's record
        clients.insert_one({"_id": "transient", "name": "Transient", "redirect_uris": ["https://t.example/cb"],
                            "claim": "a-registration-of-this-release"})  # as one landing before the record
        assert cli.main(add) == 1  # being removed: refused
        assert "being removed" in capsys.readouterr().err
        assert cli.main(["clients", "remove", "transient", "--config", deployment.operators_config()]) == 0
        assert clients.count_documents({"_id": "transient"}) == 0 and removals.count_documents({}) == 0
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


NOTES = "https://notes.example"
NOTES_API = ('\n[[clients]]\nclient_id = "notes-api"\nname = "Notes API"\nkind = "resource-server"\n'
             'client_secret = "notes-api-upgrade-secret-0123456789abcdef01"\nresources = ["https://notes.example"]\n')


def test_tokens_are_bound_to_an_audience_only_once_no_release_that_ignores_it_may_serve(primary, previous,
                                                                                        tmp_path_factory, capsys):
    """The previous release would ignore a family's audience (RFC 8707) and accept its tokens
    everywhere. While it may serve (compatibility 2), this release refuses a request naming
    ``resource`` (``invalid_target``, saying to finalize) and issues what names none as before;
    once finalized (format 3), tokens are bound, a resource server the token is not meant for
    is told it is not active, tokensvc's own API refuses it, a successor's access token carries
    its routing part, and the previous release refuses to start on the store."""

    def authorize(base: str, browser: Browser, *resources: str) -> dict[str, list[str]]:
        query = [("response_type", "code"), ("client_id", "webapp"), ("redirect_uri", NOWHERE["webapp"]),
                 ("scope", "read"), ("state", "s"), ("code_challenge", CHALLENGE), ("code_challenge_method", "S256"),
                 *(("resource", resource) for resource in resources)]
        answer = browser.agent.get(base + "/oauth/authorize?" + urlencode(query), timeout=30, allow_redirects=False)
        assert answer.status_code == 302, answer.text
        return parse_qs(urlsplit(answer.headers["Location"]).query)

    def introspected(base: str, tokens: dict, client_id: str, secret: str) -> dict:
        return requests.post(base + "/oauth/token/introspect", timeout=30, auth=(client_id, secret),
                             data={"token": tokens["access_token"]}).json()

    notes_secret = "notes-api-upgrade-secret-0123456789abcdef01"
    deployment = Deployment(primary, previous, tmp_path_factory)
    try:
        old = deployment.start("previous")
        new = deployment.start("current", extra=NOTES_API)
        alice = Browser().sign_in(new.base)
        refused = authorize(new.base, alice, NOTES)
        assert refused["error"] == ["invalid_target"] and "finalize" in refused["error_description"][0], refused
        unbound = exchange(new.base, authorize(new.base, alice)["code"][0])
        assert works(old.base, unbound) and works(new.base, unbound)
        assert introspected(new.base, unbound, "notes-api", notes_secret)["active"] is True
        assert all(doc.get("audience") is None and doc.get("access_audience") is None
                   for doc in primary.db["tokensvc"]["families"].find())

        deployment.stop(old)

        def finalized() -> str | None:
            code, _, err = deployment.storage(capsys, "finalize")
            assert code == 0 or f"tokensvc {previous.version} is" in err, err  # its sockets are still closing
            return "finalized" if code == 0 else None

        wait_until(finalized, "finalize, once the previous release's sockets are closed")
        assert primary.db["tokensvc"]["meta"].find_one({"_id": "format"})["compatibility"] == 3
        wait_until(lambda: metric(new, 'tokensvc_store_format{of="compatibility"}') == 3,
                   "this release's process following the new version at its heartbeat",
                   retry=(requests.RequestException,))

        bound = exchange(new.base, authorize(new.base, alice, NOTES)["code"][0])
        answer = introspected(new.base, bound, "notes-api", notes_secret)
        assert answer["active"] is True and answer["aud"] == [NOTES]
        me = requests.get(new.base + "/v1/me", timeout=30, headers={"Authorization": f"Bearer {bound['access_token']}"})
        assert me.status_code == 401  # tokensvc's own /v1 is not among its audience
        assert works(new.base, refresh(new.base, unbound))  # naming none: as before
        # A successor's access token carries its routing part once no previous release may serve.
        renewed = refresh(new.base, bound)
        assert len(renewed["access_token"]) == 86 and introspected(new.base, renewed, "notes-api",
                                                                  notes_secret)["active"] is True

        refused_start = deployment.start("previous", ready=False)
        refused_start.process.wait(timeout=60)
        assert refused_start.returncode == 1, refused_start.output()
        assert "format 3" in refused_start.output(), refused_start.output()
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs


NOTES_API = RESOURCE_SERVER + 'resources = ["https://notes.example"]\n'


def test_the_feed_by_audience_across_releases(primary, previous, tmp_path_factory):
    """The previous release revokes a grant: its mark carries no audience, which this release's
    relay hears as every reader's, so a resource server reading this release's feed hears it (its
    tokens may be meant for that API). This release writes each mark with its audience beside it
    (null here: before finalize no token is bound), which the previous release ignores: a reader
    of its feed hears the revocation as before."""
    deployment = Deployment(primary, previous, tmp_path_factory)
    grants = primary.db["tokensvc"]["grants"]
    try:
        old = deployment.start("previous")  # first: the store is then one the previous release reads
        new = deployment.start("current", extra=NOTES_API)
        alice = Browser().sign_in(old.base)
        by_the_previous = exchange(old.base, alice.code(old.base))
        heard = after_reading_the_feed(new.base, lambda: revoke_grant(old.base, by_the_previous),
                                       lambda message: "grant_id" in message, "notes-api",
                                       "notes-api-upgrade-secret-0123456789abcdef01")
        marked = grants.find_one({"_id": heard["grant_id"]})
        assert marked["revoked_at"] is not None and "mark_audience" not in marked  # as 0.10.0 writes it
        by_this_release = exchange(new.base, alice.code(new.base))  # the same grant, consented again
        heard = after_reading_the_feed(old.base, lambda: revoke_grant(new.base, by_this_release),
                                       lambda message: "grant_id" in message)
        marked = grants.find_one({"_id": heard["grant_id"]})
        assert marked["mark_audience"] == {"at": marked["revoked_at"], "audience": None}
    finally:
        outputs = deployment.close()
    assert not any("Traceback" in output for output in outputs), outputs
