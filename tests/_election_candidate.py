"""A candidate of an election in a process of its own, for tests that kill or stop it (tests/test_election.py).

usage: python tests/_election_candidate.py OWNER TTL URL [URL ...]

Campaigns for the election ``ELECTION`` under the label OWNER (lease TTL seconds), and prints
one JSON line per event, flushed:

* ``{"event": "ready"}`` once connected, before campaigning;
* ``{"event": "leading", "term": T, "owner": OWNER, "now": monotonic}`` when it leads; it then
  stays in its block (sleeps) far longer than any test waits;
* ``{"event": "lost", "term": T, "message": ..., "now": monotonic}`` when the block raised
  LockLost (exit status 0), what a leader that lost its lease should see;
* ``{"event": "carried-on", "term": T}`` if the block ran to its end (exit 1);
* ``{"event": "error", "message": ...}`` for anything else (exit 2).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from redlock_async import LockLost, Redlock

ELECTION = "scheduler"
BODY = 60.0
"""Seconds the leader's block would last if nothing ended it."""


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def main(owner: str, ttl: float, urls: list[str]) -> int:
    term: int | None = None
    try:
        async with Redlock(urls, retry_delay=0.05) as redlock:
            election = redlock.election(ELECTION, owner=owner, ttl=ttl)
            say(event="ready")
            try:
                async with election.campaign() as term:
                    say(event="leading", term=term, owner=owner, now=time.monotonic())
                    await asyncio.sleep(BODY)
            except LockLost as exc:
                say(event="lost", term=term, message=str(exc), now=time.monotonic())
                return 0
    except Exception as exc:
        say(event="error", message=f"{type(exc).__name__}: {exc}")
        return 2
    say(event="carried-on", term=term)
    return 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], float(sys.argv[2]), sys.argv[3:])))
