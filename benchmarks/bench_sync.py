"""The blocking API (redlock_async.sync) against the async API it fronts, and the synchronous peers.

Usage::

    python benchmarks/bench_sync.py [--quick] [--json PATH]

One run starts ``LocalNodes(5)`` and measures, in alternating rounds so that every side sees the
same machine noise:

1. uncontended latency: ``with lock: pass`` (acquire + release of one name), sequential, p50 and
   p99 per round: the blocking front (a caller thread handing each call to the background loop
   thread) against ``async with lock: pass`` on the async API in the main thread's own loop;
2. throughput: 8 threads, each on its own name, ``with lock: pass`` in a loop, against 8 tasks
   of the async API doing the same;
3. the synchronous libraries blocking code uses today, as peers: pottery's ``Redlock`` (5 nodes,
   redis-py sync clients) and python-redis-lock's ``Lock`` (one node: it is a single-node lock),
   sequential latency and 8-thread throughput, when installed.

The front's overhead is the ratio of (1): sync p50 / async p50, taken within each round, median
over rounds. The issue's bound is 1.5.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import library_commit

from redlock_async import Redlock as AsyncRedlock
from redlock_async.sync import Redlock
from redlock_async.testing import LocalNodes

THREADS = 8


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sync_latency(redlock: Redlock, n: int) -> list[float]:
    lock = redlock.lock("bench:sync:latency")
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        with lock:
            pass
        samples.append(time.perf_counter() - start)
    return samples


async def async_latency(redlock: AsyncRedlock, n: int) -> list[float]:
    lock = redlock.lock("bench:async:latency")
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        async with lock:
            pass
        samples.append(time.perf_counter() - start)
    return samples


def threads_throughput(make: Callable[[int], Callable[[], None]], seconds: float) -> float:
    """Pairs per second of THREADS threads, each running its own ``pair()`` in a loop for *seconds*."""
    counts = [0] * THREADS
    stop = time.perf_counter() + seconds
    go = threading.Barrier(THREADS + 1)

    def run(index: int) -> None:
        pair = make(index)
        go.wait()
        done = 0
        while time.perf_counter() < stop:
            pair()
            done += 1
        counts[index] = done

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    go.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - began)


def sync_pair(redlock: Redlock, name: str) -> Callable[[], None]:
    lock = redlock.lock(name)

    def pair() -> None:
        with lock:
            pass

    return pair


async def async_throughput(redlock: AsyncRedlock, seconds: float) -> float:
    stop = time.perf_counter() + seconds
    counts = [0] * THREADS

    async def run(index: int) -> None:
        lock = redlock.lock(f"bench:async:tp:{index}")
        while time.perf_counter() < stop:
            async with lock:
                pass
            counts[index] += 1

    began = time.perf_counter()
    await asyncio.gather(*(run(i) for i in range(THREADS)))
    return sum(counts) / (time.perf_counter() - began)


def pottery_pair(urls: Sequence[str]) -> Callable[[str], Callable[[], None]] | str:
    try:
        import redis
        from pottery import Redlock as PotteryRedlock
    except ImportError as exc:
        return f"not installed ({exc})"
    masters = {redis.Redis.from_url(url) for url in urls}

    def make(name: str) -> Callable[[], None]:
        lock = PotteryRedlock(key=name, masters=masters, auto_release_time=10)

        def pair() -> None:
            if not lock.acquire(blocking=False):
                raise RuntimeError("pottery: not acquired")
            lock.release()

        return pair

    return make


def redis_lock_pair(url: str) -> Callable[[str], Callable[[], None]] | str:
    try:
        import redis
        import redis_lock
    except ImportError as exc:
        return f"not installed ({exc})"
    conn = redis.Redis.from_url(url)

    def make(name: str) -> Callable[[], None]:
        def pair() -> None:
            lock = redis_lock.Lock(conn, name, expire=10)  # one per acquisition: its token is made here
            if not lock.acquire(blocking=False):
                raise RuntimeError("python-redis-lock: not acquired")
            lock.release()

        return pair

    return make


def peer_latency(pair: Callable[[], None], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        pair()
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and shorter runs (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    rounds, n, seconds = (2, 100, 0.5) if args.quick else (7, 500, 2.0)

    with LocalNodes(5) as nodes:
        urls = nodes.urls
        ratios: list[float] = []
        results: dict[str, list[float]] = {}

        def keep(name: str, value: float) -> None:
            results.setdefault(name, []).append(value)

        pottery = pottery_pair(urls)
        redis_lock = redis_lock_pair(urls[0])
        with Redlock(urls) as redlock:
            async_redlock = AsyncRedlock(urls)
            runner = asyncio.Runner()
            runner.run(async_redlock.connect())
            sync_latency(redlock, 50)  # warm up both
            runner.run(async_latency(async_redlock, 50))
            for round_ in range(rounds):
                order = ("sync", "async") if round_ % 2 == 0 else ("async", "sync")
                p50 = {}
                for side in order:
                    if side == "sync":
                        samples = sync_latency(redlock, n)
                    else:
                        samples = runner.run(async_latency(async_redlock, n))
                    p50[side] = statistics.median(samples)
                    keep(f"{side}_p50_us", p50[side] * 1e6)
                    keep(f"{side}_p99_us", percentile(samples, 0.99) * 1e6)
                ratios.append(p50["sync"] / p50["async"])
                keep("sync_8_threads_per_s", threads_throughput(lambda i: sync_pair(redlock, f"bench:tp:{i}"), seconds))
                keep("async_8_tasks_per_s", runner.run(async_throughput(async_redlock, seconds)))
                for peer, make in (("pottery", pottery), ("python_redis_lock", redis_lock)):
                    if isinstance(make, str):
                        continue
                    keep(f"{peer}_p50_us", statistics.median(peer_latency(make(f"bench:{peer}"), n)) * 1e6)
                    keep(f"{peer}_8_threads_per_s", threads_throughput(lambda i, m=make: m(f"bench:{i}"), seconds))  # type: ignore[misc]
            runner.run(async_redlock.aclose())
            runner.close()

    summary: dict[str, Any] = {name: round(statistics.median(values), 1) for name, values in results.items()}
    summary["sync_over_async_p50"] = round(statistics.median(ratios), 3)
    summary["rounds"] = rounds
    summary["pairs_per_round"] = n
    summary["commit"] = library_commit()
    summary["python"] = platform.python_version()
    summary["peers_missing"] = {
        peer: make for peer, make in (("pottery", pottery), ("python_redis_lock", redis_lock)) if isinstance(make, str)
    }
    width = max(map(len, summary))
    for name, value in summary.items():
        print(f"{name:<{width}}  {value}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    if summary["sync_over_async_p50"] > 1.5:
        print("the blocking front costs more than 1.5x the async p50", file=sys.stderr)


if __name__ == "__main__":
    main()
