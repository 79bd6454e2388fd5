"""The store chaos run of :mod:`chaos`, shortened for the suite: 30 s in which the replica set
goes down and comes back, steps down and crashes (another member elected each time), in a
seeded order, while clients sign in, exchange, refresh, introspect, hold WebSockets and revoke
through two ``tokensvc serve`` processes. ``bench/chaos.py`` runs it for 60 s by default."""

from __future__ import annotations

import pytest
from chaos import failures, run, summary

pytestmark = pytest.mark.e2e

SECONDS = 30.0
SEED = 47


def test_a_store_chaos_run_costs_503s_and_nothing_else(tmp_path):
    report = run(SECONDS, SEED, tmp_path)
    print(summary(report))
    kinds = " ".join(what for _, what in report["transitions"])
    assert "down" in kinds and "back" in kinds and "step-down" in kinds and "crashes" in kinds, kinds
    assert report["revocations"] > 0 and report["sockets_closed_by_revocation"] > 0, summary(report)
    assert report["by_status"].get("503"), summary(report)  # the store was away, and said so
    assert failures(report) == [], summary(report)
    assert report["by_status"].get("500", 0) == 0 and report["unanswered"] == []
    assert report["unheard"] == [] and report["accepted_late"] == [] and report["live_pairs"] == []
    assert report["longest_refusal_seconds"] <= 1.0 and report["longest_socket_close_seconds"] <= 1.0
    assert [stop["exit"] for stop in report["stops"]] == [0, 0]
