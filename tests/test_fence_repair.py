"""A node back from a restart gets its fencing counters back before it counts again (issue 35, item 6).

Without it, a restarted node counted again after its quarantine with the counters it came back with: two
nodes of the last fence majority restarted empty one after the other (each after the other's quarantine)
left too few nodes with the last token, and the next grant, on a majority that met none of them, read a
lower counter: 8, then 6.
"""

from __future__ import annotations

import asyncio

from redlock_async import Redlock
from redlock_async.testing._inside import cluster_of

from .conftest import Cluster

COUNTER = "redlock-fence:ledger"


def counters(nodes: Cluster) -> list[int]:
    return [int(nodes[i].command("GET", COUNTER) or 0) for i in range(len(nodes))]  # type: ignore[call-overload]


async def back_in_service(redlock: Redlock, i: int, before: str | None) -> None:
    """Until *redlock* met node *i*'s new server process and counts it again (its quarantine is over).
    A connection comes back when a command needs it: a lock of another name is taken meanwhile."""
    async with asyncio.timeout(30):
        while True:
            node = redlock.statistics().nodes[i]
            if node.connected and node.server_id not in (None, before) and not node.quarantined:
                return
            other = redlock.lock("other")
            if await other.acquire(blocking=False):
                await other.release()
            await asyncio.sleep(0.05)


async def grant(redlock: Redlock) -> int:
    lock = redlock.lock("ledger")
    assert await lock.acquire(timeout=5.0)
    token = lock.fencing_token
    assert token is not None
    await lock.release()
    return token


async def test_two_nodes_of_the_last_fence_majority_restarted_empty_in_turn_never_lower_the_token(
    faulty: Cluster,
) -> None:
    async with Redlock(faulty.urls, fencing=True, ttl=1.0) as redlock:  # a quarantine of about a second
        tokens = [await grant(redlock) for _ in range(5)]
        faulty[4].command("SET", "redlock:ledger", "another holder's")  # node 4 refuses the next grants
        tokens += [await grant(redlock) for _ in range(3)]  # fenced on nodes 0-3 only
        faulty[4].command("DEL", "redlock:ledger")
        assert counters(faulty) == [8, 8, 8, 8, 5]
        for i in (0, 1):  # each restarted after the other's quarantine is over
            before = redlock.statistics().nodes[i].server_id
            faulty[i].restart(keep_data=False)
            await back_in_service(redlock, i, before)
        restarted = counters(faulty)
        for i in (2, 3):
            faulty[i].pause()  # the next grant's majority is nodes 0, 1 and 4
        try:
            tokens.append(await grant(redlock))
        finally:
            for i in (2, 3):
                faulty[i].resume()
        assert tokens == list(range(1, 10)), f"tokens {tokens}"  # before: [1, ..., 8, 6]
        # Raised from the others before they counted again (before: 0 and 0, and only nodes 2 and 3 had 8).
        assert restarted == [8, 8, 8, 8, 5]


async def test_a_restarted_node_sits_out_until_its_counters_can_be_raised(faulty: Cluster) -> None:
    """With too few other nodes to read (three of the four stopped), the restarted node keeps sitting out
    past its quarantine, saying why; once they answer, its counters are raised and it counts."""
    async with Redlock(faulty.urls, fencing=True, ttl=1.0, connect_timeout=0.2) as redlock:
        tokens = [await grant(redlock) for _ in range(3)]
        before = redlock.statistics().nodes[0].server_id
        faulty[0].restart(keep_data=False)
        for i in (2, 3, 4):
            faulty[i].pause()
        try:
            async with asyncio.timeout(30):
                while "fencing counters not raised yet" not in cluster_of(redlock).nodes[0].quarantine_reason:
                    other = redlock.lock("other")
                    assert not await other.acquire(blocking=False)
                    await asyncio.sleep(0.05)
            assert redlock.statistics().nodes[0].quarantined
            assert faulty[0].command("GET", COUNTER) is None
        finally:
            for i in (2, 3, 4):
                faulty[i].resume()
        await back_in_service(redlock, 0, before)
        assert counters(faulty) == [3, 3, 3, 3, 3]
        tokens.append(await grant(redlock))
        assert tokens == [1, 2, 3, 4]


async def test_a_cluster_restarted_empty_all_at_once_comes_back(faulty: Cluster) -> None:
    """Every node restarted empty at once (none kept its data to copy from): each is copied to from the
    others as they are, with a warning, and the cluster serves again (as it did before the copy)."""
    async with Redlock(faulty.urls, fencing=True, ttl=1.0) as redlock:
        assert await grant(redlock) == 1
        for i in range(len(faulty)):
            faulty[i].restart(keep_data=False)
        async with asyncio.timeout(30):
            while True:
                lock = redlock.lock("ledger")
                if await lock.acquire(blocking=False):
                    break
                await asyncio.sleep(0.05)
        assert lock.fencing_token == 1  # counters lost on a majority: nothing keeps the token then
        await lock.release()


async def test_nodes_that_sat_out_a_longer_quarantine_than_their_marks_are_not_copied_to(faulty: Cluster) -> None:
    """Nodes marked in service by a client with short leases sit out the rest of a longer-lease client's
    quarantine, all five at once; they lost nothing, so they count once it is over, with no copy (a copy
    there would need other nodes in service, and there are none: they would sit out for ever)."""
    async with Redlock(faulty.urls, ttl=0.5) as short:  # marks every node under a 0.5 s quarantine
        first = short.lock("first")
        assert await first.acquire(timeout=5.0)
        await first.release()
    async with Redlock(faulty.urls, fencing=True, ttl=3.0) as longer:
        lock = longer.lock("ledger")
        assert await lock.acquire(timeout=15.0), lock.outcomes
        await lock.release()
