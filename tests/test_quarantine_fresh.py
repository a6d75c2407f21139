"""The restart quarantine's new-cluster judgement: a cluster is new only when nothing could have been granted on it.

Issue 35, item 1: nodes 3 and 4 of 5 are down when the cluster goes into service (a first client
marks 0, 1 and 2); A holds ``job`` on 0, 1 and 2; 3 and 4 come up empty and are never marked; node 2
restarts empty; 0 and 1 are slow. A fresh client saw 2, 3 and 4 answer first, judged the cluster new
on that majority, marked them and took ``job`` beside A. A cluster is judged new only once every
node has answered without a marker; a node that cannot be reached may hold keys, so then the nodes
without marker sit out their quarantine (``docs/algorithm.md``, the new-cluster rule).
"""

from __future__ import annotations

import asyncio
import math

import pytest

from redlock_async import Redlock
from redlock_async._core._algorithm import Vote
from redlock_async._health._markers import marker_value
from redlock_async.testing._inside import cluster_of

from .conftest import Cluster, eventually

TTL = 30.0
PERIOD = TTL + 0.01 * TTL + 0.002  # the quarantine of a client whose ttl is 30 s (ttl plus drift)


def _mark(node: object, period: float = PERIOD) -> None:
    """Write the marker a client writes on a node it judged in service."""
    run_id = node.command("INFO", "server")["run_id"]  # type: ignore[attr-defined]
    node.command("SET", "redlock:", marker_value(run_id.encode(), period))  # type: ignore[attr-defined]


def _probed(redlock: Redlock, i: int) -> bool:
    """Node *i*'s restart check (INFO, GET of the marker) is answered, whatever it decided."""
    node = cluster_of(redlock).nodes[i]
    return node.connected and not math.isinf(node.quarantined_until)


@pytest.mark.parametrize("slow", ["slow", "unreachable"])
async def test_unmarked_nodes_answering_first_make_no_new_cluster_beside_a_holder(faulty: Cluster, slow: str) -> None:
    """Before the fix: B judged the cluster new on 2, 3 and 4 and took ``job`` beside A (slow: 0 and 1
    answer later, with their markers; unreachable: they do not answer within B's connect timeout)."""
    for i in (3, 4):
        faulty[i].kill()  # down when the cluster goes into service
    for i in (0, 1, 2):
        _mark(faulty[i])  # a first client judged 0, 1 and 2 in service
    async with Redlock(faulty.urls, ttl=TTL, connect_timeout=0.5) as a:
        held = a.lock("job", auto_extend=False)
        assert await held.acquire(blocking=False), held.outcomes
        assert [o.vote for o in held.outcomes][:3] == [Vote.YES] * 3, held.outcomes
        for i in (3, 4):
            faulty[i].start()  # type: ignore[attr-defined]  # back, empty, never marked (no client stays up a whole quarantine)
        faulty[2].restart(keep_data=False)
        assert [faulty[i].command("EXISTS", "redlock:job") for i in range(5)] == [1, 1, 0, 0, 0]
        # 0 and 1 say nothing for a moment (SIGSTOP): 2, 3 and 4 answer B first.
        for i in (0, 1):
            faulty[i].pause()
        b = Redlock(faulty.urls, ttl=TTL, connect_timeout=10.0 if slow == "slow" else 0.3)
        try:
            lock = b.lock("job")
            trying = asyncio.ensure_future(lock.acquire(blocking=False))
            assert await eventually(lambda: all(_probed(b, i) for i in (2, 3, 4)), 10.0)
            if slow == "slow":
                await asyncio.sleep(0.5)  # long enough for B to decide on 2, 3 and 4 alone, as it did
            else:
                # B's connections to 0 and 1 time out: it cannot know what they hold.
                assert await eventually(lambda: trying.done(), 10.0)
            for i in (0, 1):
                faulty[i].resume()
            won = await trying
            assert not won, f"B took the lock beside A: {lock.outcomes}"
            assert held.held
            if slow == "slow":
                # 0 and 1 answered since, with their markers: B knows the cluster was in service.
                assert await eventually(lambda: all(_probed(b, i) for i in (0, 1)), 10.0)
            assert not await lock.acquire(blocking=False), lock.outcomes
            votes = [o.vote for o in lock.outcomes]
            assert [votes[i] for i in (2, 3, 4) if votes[i] is not Vote.PENDING] != [], lock.outcomes
            assert Vote.YES not in votes[2:] or votes.count(Vote.YES) < 3, lock.outcomes
            # A fresh client meeting all five at once judges the same: 2, 3 and 4 sit out.
            async with Redlock(faulty.urls, ttl=TTL) as c:
                other = c.lock("job")
                assert not await other.acquire(blocking=False), other.outcomes
                assert [o.vote for o in other.outcomes][:2] == [Vote.NO, Vote.NO], other.outcomes
        finally:
            for i in (0, 1):
                faulty[i].resume()
            await b.aclose()
        assert held.held
        await held.release()
