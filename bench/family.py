"""A refresh token family refreshed 100,000 times on the memory backend: ``bench/family.py``.

tests/test_families.py proves with 300 refreshes that a family stays one record, that its first
token is still taken for reuse, and that revoking its grant costs what it costs after one
refresh. This runs the same check at the scale a long-lived installation reaches (a node
refreshing every minute for two months), and prints the time a refresh took. It exits 1 when
the check fails."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

from helpers import Clock, make_config  # noqa: E402
from test_families import refreshed_often  # noqa: E402

from tokensvc.bootstrap import seed  # noqa: E402
from tokensvc.storage.memory import MemoryStore  # noqa: E402

EXPECTED = (["families_audience", "mark_grant_revoked", "families_audience", "revoke_grant_families"], 1)


async def run(rounds: int) -> int:
    store = MemoryStore()
    await seed(store, make_config())
    started = time.perf_counter()
    costs = await refreshed_often(store, Clock(), rounds)
    seconds = time.perf_counter() - started
    print(f"{rounds:,} refreshes of one family: one record; revoking its grant: {costs[1][0]} "
          f"({costs[1][1]} family); {seconds / rounds * 1e6:.0f} µs a refresh, {seconds:.1f} s in all")
    if costs[0] != EXPECTED or costs[1] != EXPECTED:
        print(f"revoking cost {costs}, expected {EXPECTED} after one refresh and after {rounds:,}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--refreshes", type=int, default=100_000, help="how often the family is refreshed")
    return asyncio.run(run(parser.parse_args().refreshes))


if __name__ == "__main__":
    sys.exit(main())
