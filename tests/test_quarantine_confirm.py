"""A yes held for a suspect's recheck is confirmed at once by the marker read right behind it (``_health/_held.py``).

The simulator's seed 8136 (docs/safety.md): three clients meet a new cluster within milliseconds. One
racer probed node 2 before another client's marker landed there, so its yes on node 2 was held for the
node's first recheck (0.1 s after the probe); the marker was on node 2 before that yes was even asked
for, but node 2 was paused between the yes and the recheck, the hold ran out, the yes was refused, and
both racers' ``blocking=False`` tries were refused on a free cluster. Now the first yes held sends a
``GET`` of the marker right behind it on the same connection: a current marker counts the node at once.

Here the recheck is pushed past the hold (as a fault between the vote and the recheck did there), so
only the confirmation behind the vote can count the held votes.
"""

from __future__ import annotations

import math

import pytest

from redlock_async import Redlock
from redlock_async._core._algorithm import Vote
from redlock_async._health import _quarantine
from redlock_async._health._markers import marker_value
from redlock_async.testing._inside import cluster_of

from .conftest import Cluster, eventually

TTL = 60.0
PERIOD = TTL + 0.01 * TTL + 0.002  # the quarantine of a client whose ttl is 60 s (ttl plus drift)
KEY = "redlock:moment"


def _run_id(node: object) -> bytes:
    return node.command("INFO", "server")["run_id"].encode()  # type: ignore[attr-defined,no-any-return]


def _mark(node: object) -> None:
    """Write the marker another client writes on a node it judged in service."""
    node.command("SET", "redlock:", marker_value(_run_id(node), PERIOD))  # type: ignore[attr-defined]


def _watched(node: object) -> bool:
    marker = node.command("GET", "redlock:")  # type: ignore[attr-defined]
    return isinstance(marker, bytes) and marker.startswith(_run_id(node) + b"/since/")


async def test_a_held_yes_counts_at_once_when_the_node_was_marked_before_it(
    faulty: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B meets 3 and 4 without marker (0, 1 and 2 show theirs; 0 and 1 hold another client's key), so it
    watches them; another client then marks 3 and 4 (a new cluster's judge, landing late). B's try turns
    on its yes votes of 3 and 4: counted at once (won, 2, 3 and 4 yes), not refused when the hold ends
    (before: refused after 20 s, the recheck coming only at 60 s)."""
    monkeypatch.setattr(_quarantine, "RECHECK_FIRST", 120.0)
    monkeypatch.setattr(_quarantine, "VOUCH_WAIT", 20.0)
    for i in (0, 1, 2):
        _mark(faulty[i])
    for i in (0, 1):
        faulty[i].command("SET", KEY, "the other client", "PX", 60_000)
    try:
        async with Redlock(faulty.urls, ttl=TTL) as b:
            nodes = cluster_of(b).nodes
            assert await eventually(lambda: all(not math.isinf(n.quarantined_until) for n in nodes), 10.0)
            assert await eventually(lambda: all(_watched(faulty[i]) for i in (3, 4)), 10.0)
            assert [nodes[i].vouching is not None for i in range(5)] == [False, False, False, True, True]
            for i in (3, 4):
                _mark(faulty[i])
            lock = b.lock("moment", auto_extend=False)
            assert await lock.acquire(blocking=False), lock.outcomes
            # 0 and 1 hold another's key: the majority is 2, 3 and 4, the held yes votes of 3 and 4 counted.
            assert [o.vote for o in lock.outcomes][2:] == [Vote.YES] * 3, lock.outcomes
            assert all(not nodes[i].quarantined_until for i in (3, 4))
            await lock.release()
    finally:
        for i in (0, 1):
            faulty[i].command("DEL", KEY)


async def test_a_held_yes_of_a_node_still_unmarked_waits_for_its_recheck(
    faulty: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, but nobody marks 3 and 4: the marker read behind each yes shows only B's own watch, so the
    held votes are refused when the hold ends, as before (the node may have lost its data)."""
    monkeypatch.setattr(_quarantine, "RECHECK_FIRST", 120.0)
    monkeypatch.setattr(_quarantine, "VOUCH_WAIT", 1.0)
    for i in (0, 1, 2):
        _mark(faulty[i])
    for i in (0, 1):
        faulty[i].command("SET", KEY, "the other client", "PX", 60_000)
    try:
        async with Redlock(faulty.urls, ttl=TTL) as b:
            nodes = cluster_of(b).nodes
            assert await eventually(lambda: all(_watched(faulty[i]) for i in (3, 4)), 10.0)
            lock = b.lock("moment", auto_extend=False)
            assert not await lock.acquire(blocking=False), lock.outcomes
            votes = [o.vote for o in lock.outcomes]
            assert votes[3] is Vote.QUARANTINED or votes[4] is Vote.QUARANTINED, lock.outcomes
            assert all(nodes[i].quarantined_until for i in (3, 4))
    finally:
        for i in (0, 1):
            faulty[i].command("DEL", KEY)
