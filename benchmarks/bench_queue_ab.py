"""Same-run A/B of the grant queue's uncontended cost: the default (the queue) against ``queue=False`` (issue 27).

Usage::

    python benchmarks/bench_queue_ab.py [--rounds N] [--ops N] [--fencing] [--loop asyncio|uvloop]

``LocalNodes(5)``; two Redlocks on the same nodes, one with ``queue=False`` (both with ``fencing=True``
when asked). In each round, alternating which goes first: each Redlock's uncontended acquire,
release and acquire+release p50 (one task, its own name, OPS cycles), then its throughput with 64
tasks, each on a name of its own, looping acquire+release for WINDOW s. Reported: the median over
rounds of the per-round ratios queue / release words (p50s: lower is better; throughput: higher). The
issue's bar for the queue as the default: p50 ratio <= 1.05, throughput ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Sequence

from _common import add_loop_option, library_commit, run_on

from redlock_async import Redlock
from redlock_async.testing import LocalNodes

TASKS = 64
WINDOW = 1.0


async def latency(redlock: Redlock, name: str, ops: int) -> tuple[float, float, float]:
    """p50 of acquire, release and the pair, in us."""
    lock = redlock.lock(name, ttl=10.0, auto_extend=False)
    acquire, release, pair = [], [], []
    for _ in range(ops):
        t0 = time.perf_counter()
        await lock.acquire()
        t1 = time.perf_counter()
        await lock.release()
        t2 = time.perf_counter()
        acquire.append(t1 - t0)
        release.append(t2 - t1)
        pair.append(t2 - t0)
    return tuple(statistics.median(x) * 1e6 for x in (acquire, release, pair))  # type: ignore[return-value]


async def throughput(redlock: Redlock, prefix: str) -> float:
    """Acquire+release pairs per second of TASKS tasks, each on its own name."""
    stop = time.perf_counter() + WINDOW
    done = [0]

    async def task(n: int) -> None:
        lock = redlock.lock(f"{prefix}:{n}", ttl=10.0, auto_extend=False)
        while time.perf_counter() < stop:
            await lock.acquire()
            await lock.release()
            done[0] += 1

    began = time.perf_counter()
    await asyncio.gather(*(task(n) for n in range(TASKS)))
    return done[0] / (time.perf_counter() - began)


async def run(rounds: int, ops: int, fencing: bool, loop_name: str) -> None:
    with LocalNodes(5) as nodes:
        async with (
            Redlock(nodes.urls, fencing=fencing, queue=False) as plain,
            Redlock(nodes.urls, fencing=fencing, queue=True) as queued,
        ):
            sides = {"default": plain, "queue": queued}
            for label, redlock in sides.items():  # warm up connections and scripts
                await latency(redlock, f"warm:{label}", 100)
                await throughput(redlock, f"warm:{label}")
            ratios: dict[str, list[float]] = {k: [] for k in ("acquire", "release", "pair", "throughput")}
            print(f"\n## queue=True vs queue=False{' (both fencing=True)' if fencing else ''}, {loop_name}, "
                  f"commit {library_commit()}\n")  # fmt: skip
            print("| round | acquire p50 d/q (us) | release p50 d/q | pair p50 d/q | pair ratio | 64-task ops/s d/q |")
            print("| --- | --- | --- | --- | ---: | --- |")
            for r in range(rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                lat = {label: await latency(sides[label], f"{label}:{r}", ops) for label in order}
                rate = {label: await throughput(sides[label], f"{label}:t{r}") for label in order}
                d, q = lat["default"], lat["queue"]
                for key, i in (("acquire", 0), ("release", 1), ("pair", 2)):
                    ratios[key].append(q[i] / d[i])
                ratios["throughput"].append(rate["queue"] / rate["default"])
                print(
                    f"| {r + 1} | {d[0]:.0f}/{q[0]:.0f} | {d[1]:.0f}/{q[1]:.0f} | {d[2]:.0f}/{q[2]:.0f} | "
                    f"{q[2] / d[2]:.3f} | {rate['default']:.0f}/{rate['queue']:.0f} |"
                )
            print()
            for key, values in ratios.items():
                print(f"- {key}: queue / default = {statistics.median(values):.3f} (median of {rounds} rounds)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--fencing", action="store_true", help="both Redlocks with fencing=True")
    add_loop_option(parser)
    args = parser.parse_args(argv)
    run_on(args.loop, run(args.rounds, args.ops, args.fencing, args.loop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
