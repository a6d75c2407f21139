"""One node as a mode: redlock_async on one node against redis-py's ``Lock``, and against itself on 5 nodes.

    python benchmarks/bench_single.py [--quick] [--loop asyncio|uvloop] [--json PATH]

In one run, against embedded valkey-server nodes (one node for the single-node locks, 5 for the
quorum): each round times OPS sequential uncontended acquire+release pairs of each client, in an
order that rotates from round to round, then the throughput of 64 tasks on distinct names for a
window each. redis-py's ``Lock`` is ``redis.asyncio.Redis.lock(name, timeout=10)`` on a client with
hiredis (``acquire(blocking=False)`` then ``release()``: one SET NX PX, one release script). Every
figure is a median over rounds of per-round ratios (the machine is noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_loop_option, library_commit, run_on

from redlock_async import Redlock
from redlock_async.testing import LocalNodes

Pair = Callable[[str], Awaitable[None]]
"""One uncontended acquire+release of a name."""

TASKS = 64


MISSES: dict[str, int] = {}
"""Uncontended tries of redlock_async that failed, per client: with one node, one reply later than
node_timeout (a loaded machine) fails the try; it is tried again, and the time counts."""


def redlock_pair(redlock: Redlock, label: str) -> Pair:
    async def pair(name: str) -> None:
        lock = redlock.lock(name)
        while not await lock.acquire(blocking=False):
            MISSES[label] = MISSES.get(label, 0) + 1
            if MISSES[label] > 1000:
                raise RuntimeError(f"uncontended acquire of {name} keeps failing: {lock.outcomes}")
        await lock.release()

    return pair


def redis_py_pair(client: redis.asyncio.Redis) -> Pair:
    async def pair(name: str) -> None:
        lock = client.lock(name, timeout=10)
        if not await lock.acquire(blocking=False):
            raise RuntimeError(f"uncontended acquire of {name} failed")
        await lock.release()

    return pair


async def latency(pair: Pair, prefix: str, ops: int) -> float:
    """Median microseconds of one acquire+release, over *ops* sequential pairs."""
    samples = []
    for i in range(ops):
        started = time.perf_counter_ns()
        await pair(f"{prefix}:{i % 16}")
        samples.append((time.perf_counter_ns() - started) / 1000)
    return statistics.median(samples)


async def throughput(pair: Pair, prefix: str, seconds: float) -> float:
    """Acquire+release pairs per second, TASKS tasks on distinct names."""
    done = 0
    stop = time.perf_counter() + seconds

    async def worker(n: int) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await pair(f"{prefix}:{n}")
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(TASKS)))
    return done / (time.perf_counter() - started)


async def main(rounds: int, ops: int, window: float) -> dict[str, Any]:
    with LocalNodes(1) as one, LocalNodes(5) as five:
        client = redis.asyncio.Redis.from_url(one.urls[0])
        async with Redlock(one.urls) as single, Redlock(five.urls) as quorum:
            pairs = {
                "redlock_async, 1 node": redlock_pair(single, "redlock_async, 1 node"),
                "redis-py Lock, 1 node": redis_py_pair(client),
                "redlock_async, 5 nodes": redlock_pair(quorum, "redlock_async, 5 nodes"),
            }
            names = list(pairs)
            for name, pair in pairs.items():  # warm up: connections, scripts loaded
                await latency(pair, f"warm-{names.index(name)}", 200)
            rows: list[dict[str, tuple[float, float]]] = []
            for r in range(rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                row: dict[str, tuple[float, float]] = {}
                for name in order:
                    p50 = await latency(pairs[name], f"lat-{names.index(name)}-{r}", ops)
                    ops_s = await throughput(pairs[name], f"thr-{names.index(name)}-{r}", window)
                    row[name] = (p50, ops_s)
                rows.append(row)
        await client.aclose()

    def ratio(a: str, b: str, i: int) -> float:
        return statistics.median(row[a][i] / row[b][i] for row in rows)

    one_node, redis_py, five_nodes = names
    figures: dict[str, Any] = {
        "rounds": rounds,
        "ops": ops,
        "window_s": window,
        "tasks": TASKS,
        "commit": library_commit(),
        "p50_us": {name: statistics.median(row[name][0] for row in rows) for name in names},
        "ops_per_s": {name: statistics.median(row[name][1] for row in rows) for name in names},
        "single_to_redis_py_p50": ratio(one_node, redis_py, 0),
        "single_to_redis_py_throughput": ratio(one_node, redis_py, 1),
        "single_to_five_p50": ratio(one_node, five_nodes, 0),
        "single_to_five_throughput": ratio(one_node, five_nodes, 1),
        "failed_tries": dict(MISSES),
    }
    print(f"{rounds} rounds: {ops} sequential acquire+release pairs, then {TASKS} tasks for {window:g} s, per client\n")
    print("| client | acquire+release p50 (µs) | throughput (ops/s, 64 tasks) |")
    print("| --- | ---: | ---: |")
    for name in names:
        print(f"| {name} | {figures['p50_us'][name]:.0f} | {figures['ops_per_s'][name]:.0f} |")
    print(
        f"\nredlock_async on 1 node / redis-py Lock: p50 {figures['single_to_redis_py_p50']:.2f}x, "
        f"throughput {figures['single_to_redis_py_throughput']:.2f}x"
    )
    print(
        f"redlock_async on 1 node / on 5 nodes: p50 {figures['single_to_five_p50']:.2f}x, "
        f"throughput {figures['single_to_five_throughput']:.2f}x (medians of per-round ratios)"
    )
    print(f"uncontended tries that failed (a reply later than node_timeout) and were tried again: {MISSES or 0}")
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds of 200 pairs, 0.5 s windows")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the figures as JSON")
    add_loop_option(parser)
    args = parser.parse_args()
    figures = run_on(args.loop, main(2, 200, 0.5) if args.quick else main(6, 1000, 1.5))
    figures["loop"] = args.loop
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
