"""No false alarm from the clock guard: clocks off by less than the drift factor, over a jittery network.

Five nodes behind fault proxies, two of them with clocks running 0.5 % fast and 0.5 % slow (half the
default drift factor, 1 %), every proxy's latency redrawn from 0-10 ms each way (0-20 ms per round
trip) every 20-80 ms, for SOAK seconds: locks taken and released with pauses from nothing to a
second between them (the guard's windows, short and long). The guard must never judge a clock
(no clock event, no vote counted as quarantined), and the locks must work throughout.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

from redlock_async import Redlock, Vote
from redlock_async.events import EventKind, LockEvent
from redlock_async.testing import History, LocalNodes

from .conftest import needs_faketime

pytestmark = needs_faketime

SOAK = float(os.environ.get("REDLOCK_CLOCK_SOAK", "30"))
"""Seconds of soak (the issue asks for 60: REDLOCK_CLOCK_SOAK=60)."""


async def test_clocks_within_the_drift_factor_over_jittery_latency_raise_no_alarm() -> None:
    with LocalNodes(5, clock=True, proxied=True) as nodes:
        nodes[0].clock.run_at(1.005)
        nodes[1].clock.run_at(1 / 1.005)
        events: list[LockEvent] = []
        histories = (History(), History())  # one per name
        stop = time.monotonic() + SOAK
        rng = random.Random(28)

        async def jitter() -> None:
            while time.monotonic() < stop:
                for node in nodes:
                    node.proxy.latency(rng.uniform(0.0, 0.010))
                await asyncio.sleep(rng.uniform(0.02, 0.08))

        # ttl 2 s: the wait for a node may grow to ttl/10 = 200 ms, well above the jitter.
        async with Redlock(nodes.urls, ttl=2.0, retry_delay=0.05, on_event=events.append) as redlock:

            async def worker(n: int) -> int:
                lock = redlock.lock(f"soak:{n % 2}")
                taken = 0
                while time.monotonic() < stop:
                    if await lock.acquire(timeout=1.0):
                        taken += 1
                        with histories[n % 2].section(f"w{n}", lock):
                            await asyncio.sleep(rng.uniform(0.0, 0.02))
                        await lock.release()
                    await asyncio.sleep(rng.choice((0.0, 0.0, 0.01, 0.1, 0.5, 1.0)))
                return taken

            jitters = asyncio.create_task(jitter())
            taken = await asyncio.gather(*(worker(n) for n in range(4)))
            await jitters
            # A lock held across the soak's end: the watchdog's extensions carry readings too.
            async with redlock.lock("soak:held", ttl=1.0):
                await asyncio.sleep(1.5)

        clock_events = [e for e in events if e.kind is EventKind.CLOCK]
        assert clock_events == []
        quarantined = [e for e in events if Vote.QUARANTINED in e.votes]
        assert quarantined == []
        for history in histories:
            history.check()
        assert all(n > 0 for n in taken), taken
        print(f"soak {SOAK:g} s: {sum(taken)} grants, no clock event, no vote quarantined")
