"""Mutual exclusion under faults, checked on the recorded history of every critical section."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time

import pytest

from redlock_async import Redlock
from redlock_async.testing import History
from redlock_async.testing._history import Section

from .conftest import Cluster


def test_checker_finds_overlaps_and_fencing_regressions() -> None:
    history = History()
    history.sections += [
        Section("a", "t1", 1, 0.0, 1.0),
        Section("b", "t2", 2, 1.0, 2.0),  # touching is fine
        Section("c", "t3", 3, 1.5, 2.5),  # overlaps b
        Section("d", "t4", 2, 3.0, 4.0),  # token went back
    ]
    assert [(a.client, b.client) for a, b in history.overlaps()] == [("b", "c")]
    assert [(a.client, b.client) for a, b in history.fencing_regressions()] == [("c", "d")]
    with pytest.raises(AssertionError, match="2 safety violations"):
        history.check()


def test_checker_passes_a_clean_history() -> None:
    history = History()
    history.sections += [Section("a", "t1", 1, 0.0, 1.0), Section("b", "t2", 2, 1.0, 2.0)]
    history.check()


@pytest.mark.slow
async def test_minority_faults_during_contention_never_break_mutual_exclusion(faulty: Cluster) -> None:
    """4 clients x 3 tasks contend for one fenced lock for 6 s, and on until 200 sections (a loaded box is
    slower; at most 30 s more), while minorities of nodes fail."""
    history = History()
    stop = time.monotonic() + 6.0

    def running() -> bool:
        now = time.monotonic()
        return now < stop or (len(history.sections) <= 200 and now < stop + 30)

    rng = random.Random(7)
    faults: list[str] = []

    quarantine = 1.0  # each restart takes one node out for this long, whether it kept its data or not
    restarted = [-math.inf] * 5

    # A wipe first (nothing is in quarantine yet), so every run has one; then a mix.
    kinds = itertools.chain(["wipe", "pause"], iter(lambda: rng.choice(["pause", "restart", "wipe"]), None))

    async def chaos() -> None:
        while running():
            down = rng.sample(range(5), 2)  # a minority
            kind = next(kinds)
            if kind != "pause" and time.monotonic() - max(restarted) < quarantine:
                kind = "pause"  # one node in quarantine at a time, so that a minority is out at most
            faults.append(f"{kind} {down}")
            if kind == "pause":
                for i in down:
                    faulty[i].pause()
                await asyncio.sleep(0.3)
                for i in down:
                    faulty[i].resume()
            else:
                # With its data or without: the restart quarantine keeps it out of every quorum meanwhile.
                faulty[down[0]].restart(keep_data=kind == "restart")
                restarted[down[0]] = time.monotonic()
            await asyncio.sleep(0.2)

    async def client(n: int, redlock: Redlock) -> None:
        lock = redlock.lock("contended", ttl=2.0, acquire_timeout=3.0)
        while running():
            async with lock:
                with history.section(f"client{n}", lock):
                    await asyncio.sleep(rng.uniform(0.0, 0.004))

    redlocks = [Redlock(faulty.urls, fencing=True, retry_delay=0.02, restart_quarantine=quarantine) for _ in range(4)]
    try:
        async with asyncio.timeout(60):
            await asyncio.gather(chaos(), *(client(n, redlocks[n % 4]) for n in range(12)))
    finally:
        for redlock in redlocks:
            await redlock.aclose()
    history.check()
    assert len(faults) >= 5
    assert any(f.startswith("wipe") for f in faults), faults
    assert len(history.sections) > 200  # locks kept being granted through the faults


@pytest.mark.slow
async def test_several_processes_under_minority_faults_never_overlap() -> None:
    """OS processes, not tasks: each its own Redlock, connections and event loop; pauses, wipes and
    slow nodes one at a time; every critical section of every process checked as one history."""
    from redlock_async.testing._soak import soak

    result = await soak(processes=3, seconds=6.0)
    assert result.sections > 30, result.faults
    assert len({s.client.split(".")[0] for s in result.history.sections}) == 3  # every process got the lock
    assert {fault.split()[0] for fault in result.faults} == {"pause", "wipe", "slow"}
    assert result.leftover == 0
    result.history.check()
