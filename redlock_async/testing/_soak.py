"""Several OS processes contending for one lock under minority faults, checked as one history."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field

from redlock_async.testing._history import History, Section
from redlock_async.testing._servers import LocalNodes

NODES = 5
QUARANTINE = 1.5


@dataclass
class SoakResult:
    processes: int
    sections: int
    overlaps: int
    """Overlapping sections of a lock; for a semaphore, moments with more than its limit inside."""
    regressions: int
    leftover: int = 0
    """Nodes still holding the lock's key a ttl after the faults healed (must be 0)."""
    faults: list[str] = field(default_factory=list)
    history: History = field(default_factory=History)


async def _faults(nodes: LocalNodes, until: float, rng: random.Random) -> list[str]:
    """Minority faults, one at a time: a pause, a restart without data, a slow node."""
    done: list[str] = []
    kinds = ["pause", "wipe", "slow"]
    while time.monotonic() < until - 0.8:
        kind = kinds[len(done) % len(kinds)]
        i = rng.randrange(NODES)
        if kind == "pause":
            nodes[i].pause()
            await asyncio.sleep(0.3)
            nodes[i].resume()
        elif kind == "wipe":
            await asyncio.to_thread(nodes[i].restart, keep_data=False)
        else:
            nodes[i].proxy.latency(0.1, duration=0.4)
            await asyncio.sleep(0.4)
        done.append(f"{kind} {i}")
        await asyncio.sleep(0.2 if kind != "wipe" else QUARANTINE + 0.2)  # one node out at a time
    return done


async def soak(processes: int, seconds: float, *, seed: int = 0, limit: int = 0) -> SoakResult:
    """*processes* OS processes contend for the lock ``soak`` (with *limit*: for permits of the semaphore
    ``soak``) for *seconds* under minority faults; their sections are checked as one history."""
    rng = random.Random(seed)
    with LocalNodes(NODES, proxied=True) as nodes:
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "redlock_async.testing._contender",
                ",".join(nodes.urls),
                str(seconds),
                "soak",
                str(QUARANTINE),
                str(limit),
                stdout=asyncio.subprocess.PIPE,
            )
            for _ in range(processes)
        ]
        outputs = asyncio.gather(*(child.communicate() for child in children))
        faults = await _faults(nodes, time.monotonic() + seconds, rng)
        async with asyncio.timeout(seconds + 60):
            results = await outputs
        nodes.heal()
        await asyncio.sleep(1.2)  # a ttl and a little: whatever a crash left has expired
        pattern = "redlock:\x00semaphore\x00soak\x00slot\x00[0-9]*" if limit else "redlock:soak"
        leftover = 0
        for i in range(NODES):
            found = nodes[i].command("KEYS", pattern)
            assert isinstance(found, list)
            leftover += len(found)
    history = History()
    for (out, _), child in zip(results, children, strict=True):
        if child.returncode != 0:
            raise RuntimeError(f"a contender process exited with {child.returncode}")
        for line in out.decode().splitlines():
            client, token, fencing, start, end = json.loads(line)
            history.sections.append(Section(client, token, fencing, start, end))
    return SoakResult(
        processes=processes,
        sections=len(history.sections),
        overlaps=len(history.overlaps()) if not limit else sum(len(c) > limit for _, c in history.crowds()),
        regressions=len(history.fencing_regressions()),
        leftover=leftover,
        faults=faults,
        history=history,
    )
