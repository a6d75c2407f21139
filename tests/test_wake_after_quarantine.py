"""A waiter whose try failed only because nodes sat out (a restart quarantine, a clock or eviction hold) tries
again when the first of them counts again, not at its next retry: nothing else would tell it (no release word
comes: the lock is free). Found by issue 39's attacks: after a Sentinel failover a waiter with a long
retry_delay waited out its whole timeout beside a free lock."""

from __future__ import annotations

import asyncio
import time

import pytest

from redlock_async import Redlock, Vote

from .conftest import Cluster

QUARANTINE = 1.0
RETRY = 60.0
"""The waiter's retry_delay: past the test's bound, so only the quarantine's end can make it try in time."""


@pytest.mark.slow
@pytest.mark.parametrize("queue", [True, False], ids=["queue", "no-queue"])
async def test_a_waiter_tries_again_when_a_quarantine_ends(faulty: Cluster, queue: bool) -> None:
    name = f"back-{queue}"
    key = f"redlock:{name}"
    async with Redlock(
        faulty.urls, restart_quarantine=QUARANTINE, reconnect_delay=0.0, queue=queue, retry_delay=RETRY
    ) as redlock:
        await redlock.connect()
        # Nodes 3 and 4 hold the key for someone else that never releases (no word comes): 0, 1 and 2 are needed.
        for i in (3, 4):
            faulty[i].command("SET", key, "someone else", "PX", 60_000)
        faulty[0].restart(keep_data=False)
        # Node 0's connections come back (its probe puts it in quarantine) before the waiter's first try: a
        # subscription made again wakes waiters too (a word may have been lost meanwhile), which is not this.
        probe = redlock.lock(f"{name}-probe", ttl=10.0)
        async with asyncio.timeout(5.0):
            while not redlock.statistics().nodes[0].quarantined:
                if await probe.acquire(blocking=False):  # (its tries make node 0 connect again)
                    await probe.release()
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        lock = redlock.lock(name, ttl=10.0)
        sent = redlock.statistics().nodes[1].sent
        began = time.monotonic()
        # Bounded far below the retry delay (15..45 s after a failed try) and far above the quarantine (1 s).
        async with asyncio.timeout(10.0):
            assert await lock.acquire()
        assert time.monotonic() - began >= QUARANTINE * 0.5  # it did sit out first
        assert lock.outcomes[0].vote is Vote.YES  # node 0 counted once back
        # It tried when node 0 came back, not every round trip meanwhile: a failed try that 0, 1 and 2 said
        # yes to gives its keys back on a majority, and those words (its own) woke it again at once (535 tries
        # in 0.8 s before; here about 2, each a few commands to node 1).
        assert redlock.statistics().nodes[1].sent - sent < 40
        await lock.release()
        for i in (3, 4):
            faulty[i].command("DEL", key)
