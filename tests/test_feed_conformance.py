"""The feed's conformance run (``python -m tokensvc.resource.conformance``,
docs/reference/feed.md) against the clients of this package: the gate, whose verifier follows the
stand-in's feed, passes every scenario; a client that keeps its answers whatever the feed says
fails the ones that drop them; and a client broken as each of the offline bound, the expiry at
``exp``, the silence of a feed and a resume from behind the buffer would find it fails that
scenario. In process: the stand-in, the gate and the run share one loop."""

from __future__ import annotations

import dataclasses

import pytest
import tornado.httpserver
import tornado.testing
from helpers import DEADLINE

from tokensvc.gate import Gate
from tokensvc.gate.server import make_app as gate_app
from tokensvc.gate.settings import from_dict
from tokensvc.resource import Verifier
from tokensvc.resource.cache import AnswerCache
from tokensvc.resource.conformance import StandIn, conform, main
from tokensvc.resource.conformance import make_app as stand_in_app

SECRET = "conformance-secret-0123456789abcdef"
# The gate's verifier under test takes a feed silent for a second for down, and uses a cached
# answer a second at most while the feed is down, so the run says the same of it.
BOUNDS = {"ping_seconds": 1.0, "offline_ttl": 1.0}
RUN_BOUNDS = {"offline_bound": 1.0, "silence": 1.0}


def serve(app) -> str:
    sock, port = tornado.testing.bind_unused_port()
    server = tornado.httpserver.HTTPServer(app)
    server.add_sockets([sock])
    return f"http://127.0.0.1:{port}"


async def gate_before(stand_in_url: str, cache: type[AnswerCache] = AnswerCache,
                      **verifier: float) -> tuple[str, Verifier]:
    """The gate (the API under test: /auth/envoy/notes, any active token) reading the stand-in,
    its verifier's settings ``BOUNDS`` and ``verifier``."""
    settings = from_dict({"tokensvc_url": stand_in_url, "client_id": "conformance-api", "client_secret": SECRET,
                          "verifier": {"retry_seconds": 0.2, **BOUNDS, **verifier}})
    verifier_settings = settings.verifier_settings()
    verifier = Verifier(verifier_settings, cache=cache(verifier_settings, __import__("time").monotonic))
    await verifier.start()
    return serve(gate_app(Gate(settings, verifier))) + "/auth/envoy/notes", verifier


@pytest.mark.gen_test(timeout=120)
async def test_the_gates_verifier_passes_every_scenario():
    stand_in = StandIn("conformance-api", SECRET)
    api, verifier = await gate_before(serve(stand_in_app(stand_in)))
    try:
        outcomes = await conform(stand_in, api, within=DEADLINE, **RUN_BOUNDS)
    finally:
        await verifier.close()
    assert [(outcome.name, outcome.reason) for outcome in outcomes if not outcome.passed] == []
    assert len(outcomes) == 17
    assert stand_in.refused_credentials == 0


class Deaf(AnswerCache):
    """A client that never drops an answer: what a client that ignores the feed does."""

    def revoke(self, named):
        return []

    def flush(self):
        pass


@pytest.mark.gen_test(timeout=120)
async def test_a_client_that_keeps_its_answers_fails_the_scenarios_that_drop_them():
    stand_in = StandIn("conformance-api", SECRET)
    api, verifier = await gate_before(serve(stand_in_app(stand_in)), Deaf)
    try:
        # It never drops: failing sooner says the same.
        outcomes = await conform(stand_in, api, within=0.3, **RUN_BOUNDS)
    finally:
        await verifier.close()
    failed = {outcome.name for outcome in outcomes if not outcome.passed}
    assert failed == {"revoked naming family_id", "revoked naming grant_id", "revoked naming client_id",
                      "revoked naming sub", "flush drops every answer",
                      "closed with 1012: resumed after the last message, the missed one replayed",
                      "ready with resumed: false drops every answer",
                      "a message out of sequence: resumed after the last one processed",
                      "a message of an unknown type drops every answer",
                      "a silent feed (no message, no pong) taken for down and resumed",
                      "a resume behind the buffer: resumed false on the same stream drops every answer"}
    assert all("still allowed" in outcome.reason for outcome in outcomes if not outcome.passed)


class Immortal(AnswerCache):
    """A client that keeps an answer past its token's exp."""

    def store(self, key, entry):
        super().store(key, dataclasses.replace(entry, expires=entry.expires + 3600))


class Unbounded(AnswerCache):
    """A client that uses its cached answers however long the feed is down."""

    def get(self, key, down_since):
        return super().get(key, None)


def trusting(verifier: Verifier) -> None:
    """The verifier's feed trusts a ``ready`` on its own stream to resume, whatever it says: what
    a client that tells a restart only by a new stream does."""
    follower = verifier._feed
    judge = follower._ready

    def ready(message):
        judge({**message, "resumed": True} if message.get("stream") == follower._stream else message)

    follower._ready = ready


@pytest.mark.parametrize(("broken", "scenario", "reason"), [
    ({"cache": Immortal}, "a cached answer is not used past its token's exp", "after its exp, the token was still"),
    ({"cache": Unbounded}, "the feed down longer than the offline bound: no cached answer used",
     "after the feed down longer than the offline bound (1 s), the token was still allowed"),
    ({"ping_seconds": 3600.0}, "a silent feed (no message, no pong) taken for down and resumed",
     "a feed silent for 1 s (no message, no pong) was not taken for down"),
    ({"ready": trusting}, "a resume behind the buffer: resumed false on the same stream drops every answer",
     "after a ready with resumed: false for a resume point behind the buffer, the token was still allowed"),
], ids=["expiry", "offline", "silence", "behind-the-buffer"])
@pytest.mark.gen_test(timeout=180)
async def test_each_scenario_catches_the_fault_it_names(broken, scenario, reason):
    stand_in = StandIn("conformance-api", SECRET)
    settings = {name: value for name, value in broken.items() if name not in ("cache", "ready")}
    api, verifier = await gate_before(serve(stand_in_app(stand_in)), broken.get("cache", AnswerCache), **settings)
    if "ready" in broken:
        broken["ready"](verifier)
    try:
        outcomes = await conform(stand_in, api, within=0.3, **RUN_BOUNDS)
    finally:
        await verifier.close()
    failed = {outcome.name: outcome.reason for outcome in outcomes if not outcome.passed}
    assert scenario in failed, failed
    assert failed[scenario].startswith(reason), failed[scenario]


def test_the_command_line_says_it_when_the_api_never_connects(capsys):
    """Run as an operator types it, against an API that never opens the feed: it waits its
    bound, says so, and exits 1 (the bound made short here)."""
    import tokensvc.resource.conformance as conformance

    patch = pytest.MonkeyPatch()
    patch.setattr(conformance, "CONNECT_SECONDS", 0.2)
    port = tornado.testing.bind_unused_port()
    port[0].close()
    try:
        assert main(["--api", "http://127.0.0.1:9/notes", "--port", str(port[1])]) == 1
    finally:
        patch.undo()
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "FAIL  the feed opened: no connection to the feed within 0.2 s"
    assert out[-1] == "0 of 1 passed"
