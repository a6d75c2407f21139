"""Many tasks on many Redlock instances contend for one resource: never two inside at once."""

from __future__ import annotations

import asyncio
import itertools
import time

from redlock_async import Redlock

from .conftest import Cluster, MakeRedlock, lock_keys

CLIENTS = 4
TASKS_PER_CLIENT = 6
GRANTS_PER_TASK = 15


async def test_no_two_holders_overlap(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlocks = [await make_redlock(retry_delay=0.005, ttl=5.0) for _ in range(CLIENTS)]
    sections: list[tuple[float, float, str]] = []
    inside: list[str] = []
    violations: list[str] = []

    async def worker(redlock: Redlock, name: str) -> None:
        lock = redlock.lock("stress")
        for _ in range(GRANTS_PER_TASK):
            async with lock:
                if inside:
                    violations.append(f"{name} entered while {inside} held it")
                inside.append(name)
                entered = time.monotonic()
                await asyncio.sleep(0.001)
                assert lock.held
                sections.append((entered, time.monotonic(), name))
                inside.remove(name)

    async with asyncio.timeout(60):
        await asyncio.gather(
            *(
                worker(redlock, f"client{c}-task{t}")
                for c, redlock in enumerate(redlocks)
                for t in range(TASKS_PER_CLIENT)
            )
        )
    assert violations == []
    assert len(sections) == CLIENTS * TASKS_PER_CLIENT * GRANTS_PER_TASK
    sections.sort()
    overlaps = [(a, b) for a, b in itertools.pairwise(sections) if b[0] < a[1]]
    assert overlaps == []
    # Every client got turns: contention did not starve anyone entirely.
    assert {name.split("-")[0] for _, _, name in sections} == {f"client{c}" for c in range(CLIENTS)}
    assert [lock_keys(cluster[i]) for i in range(len(cluster))] == [[]] * len(cluster)


async def test_distinct_resources_run_in_parallel(make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    held = 0
    most = 0

    async def worker(n: int) -> None:
        nonlocal held, most
        for _ in range(20):
            async with redlock.lock(f"parallel:{n}"):
                held += 1
                most = max(most, held)
                await asyncio.sleep(0.002)
                held -= 1

    await asyncio.gather(*(worker(n) for n in range(32)))
    assert most > 1  # locks on different resources do not exclude each other
