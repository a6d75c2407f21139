"""A Sentinel-managed primary as one voter (``redis+sentinel://HOST:PORT/SERVICE``), on real processes: a
master, a replica and 3 Sentinels from the same binary (``LocalSentinels``), beside standalone voters."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from redlock_async import Redlock, Vote
from redlock_async.sync import Redlock as SyncRedlock
from redlock_async.testing import LocalNodes, LocalSentinels

from .conftest import assert_no_library_tasks, mark_in_service
from .test_failover import cut_link, uptime

pytestmark = pytest.mark.slow

TTL = 15.0


@pytest.fixture
def group() -> Iterator[LocalSentinels]:
    with LocalSentinels(1, 3) as sentinels:
        yield sentinels


@pytest.fixture
def others() -> Iterator[LocalNodes]:
    with LocalNodes(2) as nodes:
        yield nodes


async def connected(redlock: Redlock, index: int) -> None:
    """Use *redlock* until its connection to voter *index* is up (bounded)."""
    deadline = time.monotonic() + 20.0
    while not redlock.statistics().nodes[index].connected:
        assert time.monotonic() < deadline, f"voter {index} never connected"
        with contextlib.suppress(Exception):
            lock = redlock.lock("sentinel:scratch", ttl=TTL)
            if await lock.acquire(blocking=False):
                await lock.release()
        await asyncio.sleep(0.05)


async def wins(redlock: Redlock, name: str, seconds: float) -> int:
    """Non-blocking acquires of *name* for *seconds* once voter 0 is connected; how many got it (released)."""
    await connected(redlock, 0)
    won = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lock = redlock.lock(name, ttl=TTL)
        if await lock.acquire(blocking=False):
            won += 1
            await lock.release()
        await asyncio.sleep(0.05)
    return won


async def test_a_sentinel_voter_locks_on_its_master_and_follows_a_failover(
    group: LocalSentinels, others: LocalNodes
) -> None:
    first = group.master()
    async with Redlock([group.url, *others.urls], ttl=1.0) as redlock:
        await redlock.connect()
        stats = redlock.statistics().nodes[0]
        assert stats.address == f"sentinel:127.0.0.1:{group.sentinels[0].port}/voter"
        assert stats.server_id == first.command("INFO", "server")["run_id"]  # type: ignore[index]
        lock = redlock.lock("sentinel:a", ttl=1.0)
        # A bare majority: the Sentinel voter's yes is needed, so its vote is in (not pending behind an early
        # decision of the two standalone voters, as under load it once was).
        others.nodes[1].pause()
        try:
            assert await lock.acquire(blocking=False)
        finally:
            others.nodes[1].resume()
        assert lock.outcomes[0].vote is Vote.YES
        assert first.command("EXISTS", "redlock:sentinel:a") == 1
        await lock.release()

        second = await asyncio.to_thread(group.failover)
        assert second is not first
        # The promoted replica is a new server behind the voter: it sits out a period (1 s ttl + drift),
        # then counts, its keys written on it.
        deadline = time.monotonic() + 20.0
        seen: set[Vote] = set()
        while True:
            lock = redlock.lock("sentinel:b", ttl=1.0)
            held = await lock.acquire(blocking=False)  # the two standalone voters are a majority
            vote = lock.outcomes[0].vote
            seen.add(vote)
            if held and vote is Vote.YES:
                assert second.command("EXISTS", "redlock:sentinel:b") == 1
                await lock.release()
                break
            if held:
                await lock.release()
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.1)
        assert Vote.QUARANTINED in seen
        assert redlock.statistics().nodes[0].server_id == second.command("INFO", "server")["run_id"]  # type: ignore[index]
    assert_no_library_tasks()


async def test_a_failover_mid_hold_never_lets_a_second_holder_in(group: LocalSentinels, others: LocalNodes) -> None:
    """The replica never received the holder's key (its link cut, the master killed): promoted by the
    Sentinels, it would give a second client the lock with the standalone voter the holder lacks. Clients
    that knew the old master and one that meets the new one first keep it out; a client with the restart
    quarantine switched off takes the lock (the danger is real, and the quarantine is what stops it)."""
    old, replica = group.servers
    urls = [group.url, *others.urls]
    for node in (old, *others):
        mark_in_service(node, TTL + 1.0)
    # The replica's uptime must not excuse it: older than a quarantine period when promoted.
    while uptime(replica) < TTL + 2.0:
        await asyncio.sleep(0.25)
    async with Redlock(urls, ttl=TTL, auto_extend=False) as holder, Redlock(urls, ttl=TTL) as knew:
        await holder.connect()
        await knew.connect()
        cut_link(replica)  # the master's writes never reach its replica
        lock = holder.lock("sentinel:held", ttl=TTL)
        assert await lock.acquire(blocking=False)
        others[1].command("DEL", "redlock:sentinel:held")  # held on a bare majority: the master, others[0]
        old.kill()
        assert await asyncio.to_thread(group.await_failover, old) is replica
        assert replica.command("EXISTS", "redlock:sentinel:held") == 0

        async with Redlock(urls, ttl=TTL) as fresh:
            won_fresh = await wins(fresh, "sentinel:held", 1.0)
        won_knew = await wins(knew, "sentinel:held", 1.0)
        async with Redlock(urls, ttl=TTL, restart_quarantine=0) as careless:
            won_careless = await wins(careless, "sentinel:held", 1.0)
        assert lock.validity > 0, "the holder's lease ran out before the contenders were done: too slow a box"
        assert (won_fresh, won_knew) == (0, 0), "a second holder, on the promoted replica and others[1]"
        assert won_careless > 0, "without the quarantine the promoted replica should have let a second holder in"
    assert_no_library_tasks()


def test_the_blocking_api_and_redlock_status_take_a_sentinel_voter(group: LocalSentinels, others: LocalNodes) -> None:
    urls = [group.url, *others.urls]
    for node in (group.master(), *others):
        mark_in_service(node, 11.0)
    with SyncRedlock(urls) as redlock, redlock.lock("sentinel:status", ttl=30.0):
        assert group.master().command("EXISTS", "redlock:sentinel:status") == 1
        done = subprocess.run(
            [sys.executable, "-m", "redlock_async", "status", "sentinel:status"],
            env={**os.environ, "REDLOCK_NODES": ",".join(urls)},
            capture_output=True,
            timeout=30.0,
            check=False,
        )
    out, err = done.stdout, done.stderr
    text = out.decode()
    assert f"sentinel:127.0.0.1:{group.sentinels[0].port}/voter" in text, (text, err.decode())
    assert "on 3 of 3 nodes (a majority)" in text, (text, err.decode())


def subscribed(group: LocalSentinels) -> bool:
    """Whether a client listens to one of the group's Sentinels (this test's watch: nothing else subscribes)."""
    for sentinel in group.sentinels:
        clients = sentinel.command("CLIENT", "LIST")
        if b" sub=1 " in (clients if isinstance(clients, bytes) else b""):
            return True
    return False


async def test_an_idle_sentinel_voter_follows_switch_master(group: LocalSentinels, others: LocalNodes) -> None:
    """Before: a connection to the old master stayed up until a command failed there (READONLY, a vote lost);
    one cut off from the Sentinels answered on. Now the +switch-master word drops it at once."""
    async with Redlock([group.url, *others.urls], ttl=1.0) as redlock:
        old_id = redlock.statistics().nodes[0].server_id
        deadline = time.monotonic() + 10.0
        while not subscribed(group):
            assert time.monotonic() < deadline, "the voter's watch never subscribed to a Sentinel"
            await asyncio.sleep(0.05)
        new = await asyncio.to_thread(group.failover)
        while redlock.statistics().nodes[0].connected:  # no command sent: only the watch can drop it
            assert time.monotonic() < deadline + 20.0, "still connected to the old master"
            await asyncio.sleep(0.05)
        lock = redlock.lock("sentinel:idle", ttl=1.0)
        await lock.acquire(blocking=False)
        assert "READONLY" not in str(lock.outcomes)
        await connected(redlock, 0)
        stats = redlock.statistics().nodes[0]
        assert stats.server_id != old_id
        assert stats.server_id == new.command("INFO", "server")["run_id"]  # type: ignore[index]
    assert_no_library_tasks()


async def test_every_primitive_runs_on_a_sentinel_voter(group: LocalSentinels, others: LocalNodes) -> None:
    """A lock with fencing, several names at once, a semaphore, a read/write lock and an election, each
    writing its keys on the Sentinel group's master as on a standalone voter."""
    master = group.master()
    urls = [group.url, *others.urls]
    async with Redlock(urls, ttl=5.0) as redlock, Redlock(urls, ttl=5.0) as other:
        async with redlock.lock("prim:fenced", fencing=True) as lock:
            assert lock.fencing_token is not None
            assert master.command("EXISTS", "redlock:prim:fenced") == 1
        async with redlock.lock_many(["prim:a", "prim:b"]):
            assert master.command("EXISTS", "redlock:prim:a", "redlock:prim:b") == 2
        async with redlock.semaphore("prim:sem", limit=1):
            assert not await other.semaphore("prim:sem", limit=1).acquire(blocking=False)
        async with redlock.rw_lock("prim:rw").read():
            assert not await other.rw_lock("prim:rw").write().acquire(blocking=False)
        async with redlock.election("prim:leader").campaign() as term:
            assert term >= 1
            assert (await other.election("prim:leader").leader()).owner is not None
        # (Its key was seen on the master above; an early quorum may leave its vote pending under load.)
        assert lock.outcomes[0].vote in (Vote.YES, Vote.PENDING)
    assert_no_library_tasks()
