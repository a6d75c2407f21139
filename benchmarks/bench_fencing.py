"""What fencing=True costs: uncontended acquire+release, plain vs fenced, interleaved in one run.

    python benchmarks/bench_fencing.py [--quick] [--json PATH]

Against 5 embedded nodes. Each round times OPS sequential acquire+release
pairs of each kind, alternating which goes first; the figures are medians
over rounds, and the ratio is taken within each round (the machine is noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from redlock_async import Redlock
from redlock_async.testing import LocalNodes


async def timed(redlock: Redlock, resource: str, ops: int) -> list[float]:
    """Microseconds of each acquire+release (and of each acquire alone, interleaved)."""
    lock = redlock.lock(resource)
    samples: list[float] = []
    for _ in range(ops):
        started = time.perf_counter_ns()
        if not await lock.acquire(blocking=False):
            raise RuntimeError(f"uncontended acquire of {resource} failed: {lock.outcomes}")
        await lock.release()
        samples.append((time.perf_counter_ns() - started) / 1000)
    return samples


def p(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100)[int(q) - 1] if q < 100 else max(samples)


async def main(rounds: int, ops: int) -> dict[str, Any]:
    with LocalNodes(5) as cluster:
        async with Redlock(cluster.urls) as plain, Redlock(cluster.urls, fencing=True) as fenced:
            await timed(plain, "warm-plain", 100)
            await timed(fenced, "warm-fenced", 100)
            rows: list[tuple[float, float, float, float]] = []
            for r in range(rounds):
                order = [(plain, "plain"), (fenced, "fenced")]
                if r % 2:
                    order.reverse()
                results = {name: await timed(redlock, f"{name}-{r}", ops) for redlock, name in order}
                rows.append(
                    (
                        statistics.median(results["plain"]),
                        statistics.median(results["fenced"]),
                        p(results["plain"], 99),
                        p(results["fenced"], 99),
                    )
                )
            plain_p50 = statistics.median(row[0] for row in rows)
            fenced_p50 = statistics.median(row[1] for row in rows)
            ratio = statistics.median(row[1] / row[0] for row in rows)
            print(f"{rounds} rounds x {ops} acquire+release pairs each, 5 embedded nodes\n")
            print("| acquire+release | p50 (µs) | p99 (µs) |")
            print("| --- | ---: | ---: |")
            print(
                f"| plain (1 round trip to acquire) | {plain_p50:.0f} | {statistics.median(r[2] for r in rows):.0f} |"
            )
            print(f"| fencing=True (2 round trips) | {fenced_p50:.0f} | {statistics.median(r[3] for r in rows):.0f} |")
            print(f"\nfenced / plain p50: {ratio:.2f}x (median of per-round ratios)")
            return {
                "rounds": rounds,
                "ops": ops,
                "plain_p50_us": plain_p50,
                "fenced_p50_us": fenced_p50,
                "fenced_to_plain_p50": ratio,
            }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds of 200")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the figures as JSON")
    args = parser.parse_args()
    figures = asyncio.run(main(2, 200) if args.quick else main(5, 1500))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
