"""Redlock.statistics() and Lock.statistics(): public snapshots, so nothing outside reads private state."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from redlock_async import LockStatistics, NodeStatistics, Redlock, RedlockStatistics

from .conftest import Cluster, eventually


async def test_a_new_redlock_knows_its_nodes_before_connecting(cluster: Cluster) -> None:
    redlock = Redlock(cluster.urls)
    stats = redlock.statistics()
    assert isinstance(stats, RedlockStatistics)
    assert [node.address for node in stats.nodes] == list(redlock.nodes)
    assert not any(node.connected for node in stats.nodes)
    assert all(node.server_id is None and node.round_trip is None and node.sent == 0 for node in stats.nodes)
    assert (stats.held_locks, stats.watched_locks, stats.watchdog_rounds, stats.wakeups) == (0, 0, 0, 0)
    assert not stats.closed
    await redlock.aclose()
    assert redlock.statistics().closed


async def test_connected_nodes_show_their_server_and_round_trip(cluster: Cluster) -> None:
    async with Redlock(cluster.urls) as redlock:
        await redlock.connect()
        lock = redlock.lock("stats:nodes")
        assert await lock.acquire(blocking=False)
        await lock.release()
        nodes = redlock.statistics().nodes
        assert all(isinstance(node, NodeStatistics) for node in nodes)
        assert all(node.connected and node.server_id and len(node.server_id) == 40 for node in nodes)
        assert len({node.server_id for node in nodes}) == len(nodes)  # distinct servers
        assert all(node.round_trip is not None and 0 < node.round_trip < 1.0 for node in nodes)
        assert all(node.sent >= 2 for node in nodes)  # at least the SET and the release
        assert all(node.fault is None and not node.quarantined for node in nodes)
        # release() returns once the nodes that granted said so: a late node's reply may still be
        # on its way, and is counted as queued until it lands (CI saw one in flight).
        assert await eventually(lambda: all(node.unanswered == 0 for node in redlock.statistics().nodes), 2.0)


async def test_a_lock_through_its_phases(cluster: Cluster) -> None:
    async with Redlock(cluster.urls, fencing=True) as redlock:
        lock = redlock.lock("stats:phases", ttl=0.5)
        idle = lock.statistics()
        assert isinstance(idle, LockStatistics)
        assert (idle.phase, idle.held, idle.validity, idle.held_for, idle.fencing_token) == (
            "idle",
            False,
            0,
            None,
            None,
        )
        async with lock:
            held = lock.statistics()
            assert (held.phase, held.held, held.watched, held.attempts) == ("held", True, True, 1)
            assert held.fencing_token is not None
            assert 0 < held.validity <= 0.5
            assert held.held_for is not None
            assert held.held_for >= 0
            group = redlock.statistics()
            assert (group.held_locks, group.watched_locks) == (1, 1)
            await asyncio.sleep(0.6)  # longer than the ttl: the watchdog extended it
            assert lock.statistics().extensions >= 1
            assert redlock.statistics().watchdog_rounds >= 1
        after = lock.statistics()
        assert (after.phase, after.held, after.watched) == ("idle", False, False)
        assert after.extensions >= 1  # of the last acquisition
        assert redlock.statistics().held_locks == 0


async def test_a_lost_lock_says_so(faulty: Cluster) -> None:
    async with Redlock(faulty.urls) as redlock:
        lock = redlock.lock("stats:lost", ttl=0.5, auto_extend=False)
        assert await lock.acquire(blocking=False)
        for i in range(5):
            faulty[i].command("DEL", "redlock:stats:lost")
        with pytest.raises(Exception, match="gone from a majority"):
            await lock.extend()
        assert lock.statistics().phase == "lost"
        assert redlock.statistics().held_locks == 0


async def test_a_release_wakes_a_waiter_and_it_is_counted(cluster: Cluster) -> None:
    async with Redlock(cluster.urls, retry_delay=5.0) as redlock:
        holder = redlock.lock("stats:wake")
        assert await holder.acquire(blocking=False)
        waiter = asyncio.create_task(redlock.lock("stats:wake").acquire(timeout=10))
        await asyncio.sleep(0.2)
        await holder.release()
        assert await asyncio.wait_for(waiter, 3)  # well before the 2.5-7.5 s fallback timer
        assert redlock.statistics().wakeups == 1


async def test_the_snapshots_are_frozen(cluster: Cluster) -> None:
    async with Redlock(cluster.urls) as redlock:
        snapshots: list[RedlockStatistics | NodeStatistics | LockStatistics] = [
            redlock.statistics(),
            redlock.statistics().nodes[0],
            redlock.lock("stats:frozen").statistics(),
        ]
    for snapshot in snapshots:
        field = dataclasses.fields(snapshot)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(snapshot, field, None)
