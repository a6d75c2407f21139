"""``bench_pair_counts.py --gc``: the garbage collector's runs per 1,000 pairs and its time per pair, per tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from bench_ab import tree_of

GC_CHILD = r"""
import asyncio, gc, json, sys, time
from redlock_async import Redlock

urls, loop, seconds = sys.argv[1].split(","), sys.argv[2], float(sys.argv[3])
runs, spent, began, on = [0, 0, 0], [0.0], [0.0], [False]


def watch(phase, info):
    if on[0]:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - began[0]
            runs[info["generation"]] += 1


gc.callbacks.append(watch)


async def main():
    async with Redlock(urls) as redlock:
        async def worker(i, stop):
            lock, done = redlock.lock(f"gc:{i}", ttl=10.0), 0
            while time.perf_counter() < stop:
                async with lock:
                    pass
                done += 1
            return done

        await asyncio.gather(*(worker(i, time.perf_counter() + 0.5) for i in range(64)))
        on[0] = True
        done = sum(await asyncio.gather(*(worker(i, time.perf_counter() + seconds) for i in range(64))))
        on[0] = False
    print(json.dumps({"runs": [n * 1000 / done for n in runs], "seconds": spent[0] / done}))


if loop == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


def gc_runs(trees: list[str], loop: str, rounds: int) -> None:
    """Per tree: the garbage collector's runs per 1,000 pairs and its time per pair (medians over *rounds*)."""
    import statistics

    from redlock_async.testing import LocalNodes

    found: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with LocalNodes(5) as nodes:
        for _ in range(rounds):
            for name in trees:
                tree = tree_of(name)
                done = subprocess.run(
                    [sys.executable, "-c", GC_CHILD, ",".join(nodes.urls), loop, "2"],
                    env=dict(os.environ, PYTHONPATH=tree),
                    cwd=tree,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=True,
                )
                found[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name, got in found.items():
        runs = [statistics.median(one["runs"][g] for one in got) for g in range(3)]
        each = " ".join(f"{one['runs'][0]:.1f}" for one in got)
        print(
            f"{name:12s} {loop}: gc runs per 1,000 pairs (generation 0/1/2, medians of {rounds}) "
            f"{runs[0]:.2f} / {runs[1]:.2f} / {runs[2]:.2f}  (generation 0 each: {each}), "
            f"gc time {statistics.median(one['seconds'] for one in got) * 1e6:.2f} us per pair"
        )
