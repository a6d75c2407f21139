"""Every primitive on three Cluster voters of three shards each (issue 39 item 4): nine primaries, no
replicas, every voter a Redis/Valkey Cluster. The names spread over the shards of each voter; what a
primitive keeps for one name sits in one slot, so each of its scripts runs on one shard per voter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from redlock_async import LockInfo, Redlock
from redlock_async.testing import LocalCluster

from .test_cluster_voter import mark_shards

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def clusters() -> Iterator[list[LocalCluster]]:
    with contextlib.ExitStack() as stack:
        found = [stack.enter_context(LocalCluster(3, 0)) for _ in range(3)]
        yield found


@pytest.fixture
def urls(clusters: list[LocalCluster]) -> list[str]:
    for cluster in clusters:
        cluster.flush()
        mark_shards(cluster)
    return [cluster.url for cluster in clusters]


def served_by(cluster: LocalCluster, key: str) -> int:
    """The index of the shard whose primary serves *key*."""
    slot = int(cluster.nodes[0].command("CLUSTER", "KEYSLOT", key))  # type: ignore[call-overload]
    for shard in range(len(cluster.shards)):
        first, last = cluster.slot_ranges(shard)
        if first <= slot <= last:
            return shard
    raise AssertionError(f"no shard serves slot {slot}")


async def test_the_names_spread_over_every_shard_of_every_voter(urls: list[str], clusters: list[LocalCluster]) -> None:
    names = [f"job-{i}" for i in range(12)]
    for cluster in clusters:
        assert {served_by(cluster, f"redlock:{name}") for name in names} == {0, 1, 2}
    async with Redlock(urls) as redlock:
        for name in names:
            async with redlock.lock(name, ttl=5.0) as lock:
                assert lock.held
                for cluster in clusters:
                    owner = cluster.master_of(served_by(cluster, f"redlock:{name}"))
                    assert owner.command("GET", f"redlock:{name}") is not None
        for cluster in clusters:
            for name in names:
                owner = cluster.master_of(served_by(cluster, f"redlock:{name}"))
                assert owner.command("GET", f"redlock:{name}") is None


async def test_lock_hand_off_fencing_and_the_watchdog(urls: list[str]) -> None:
    async with Redlock(urls) as first, Redlock(urls) as second:
        mine = first.lock("report", ttl=10.0, fencing=True)
        assert await mine.acquire(blocking=False), mine.outcomes
        token = mine.fencing_token
        assert token is not None
        waiter = second.lock("report", ttl=10.0, fencing=True, acquire_timeout=20.0)
        waiting = asyncio.ensure_future(waiter.acquire())
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await mine.release()
        assert await asyncio.wait_for(waiting, 20.0)  # handed over through the grant queue
        assert waiter.fencing_token is not None
        assert waiter.fencing_token > token
        await waiter.release()
        watched = first.lock("watched", ttl=2.0)
        async with watched:
            await asyncio.sleep(5.0)  # two ttls and a half: only the watchdog's extensions keep it
            assert watched.held
            assert not await second.lock("watched", ttl=2.0).acquire(blocking=False)


async def test_lock_many_semaphore_and_rw_lock(urls: list[str]) -> None:
    async with Redlock(urls) as first, Redlock(urls) as second:
        both = first.lock_many(["{batch}:a", "{batch}:b"], ttl=5.0)  # one hash tag: one slot on each voter
        assert await both.acquire(blocking=False), both.outcomes
        assert not await second.lock("{batch}:b", ttl=5.0).acquire(blocking=False)
        await both.release()
        assert await second.lock("{batch}:b", ttl=5.0).acquire(blocking=False)

        one, two = first.semaphore("pool", limit=2), second.semaphore("pool", limit=2)
        assert await one.acquire(blocking=False)
        assert await two.acquire(blocking=False)
        assert not await first.semaphore("pool", limit=2).acquire(blocking=False)
        await one.release()
        assert await first.semaphore("pool", limit=2).acquire(blocking=False)

        reading = first.rw_lock("shelf").read()
        assert await reading.acquire(blocking=False)
        assert await second.rw_lock("shelf").read().acquire(blocking=False)  # readers share
        assert not await second.rw_lock("shelf").write().acquire(blocking=False)
        await reading.release()


async def test_an_election_and_its_observer_hear_each_new_leader(urls: list[str]) -> None:
    # ttl 60: an observer looks again on its own only every 6 s, so a leader seen sooner was announced.
    async with Redlock(urls, ttl=60.0) as one, Redlock(urls, ttl=60.0) as two, Redlock(urls, ttl=60.0) as watcher:
        seen: asyncio.Queue[LockInfo] = asyncio.Queue()

        async def observe() -> None:
            async for info in watcher.election("leader").observe():
                await seen.put(info)

        observing = asyncio.ensure_future(observe())
        try:
            await asyncio.sleep(1.0)  # the observer's subscriptions in place
            async with one.election("leader", owner="first").campaign() as term:
                first: Any = await asyncio.wait_for(seen.get(), 4.0)
                assert (first.owner, first.fencing_counter) == ("first", term)
            async with two.election("leader", owner="second").campaign(timeout=10.0) as later:
                assert later > term
                second: Any = await asyncio.wait_for(seen.get(), 4.0)
                assert (second.owner, second.fencing_counter) == ("second", later)
        finally:
            observing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await observing
