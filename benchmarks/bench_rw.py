"""A read-mostly workload on a read/write lock against the plain mutex on the same work, same run.

Usage::

    python benchmarks/bench_rw.py [--rounds N] [--seconds S] [--json PATH] [--loop asyncio|uvloop]

One run starts ``LocalNodes(5)`` (real valkey-server processes on 127.0.0.1) and 4 ``Redlock``
clients. The workload: 16 reader tasks and 1 writer task, spread over the clients. A reader holds
its lock for ``READ_WORK`` (a sleep: the read it protects), then comes back at once; the writer
holds for ``WRITE_WORK``, then pauses ``WRITE_PAUSE``. Side ``rw``: readers take
``rw_lock(name).read()``, the writer ``.write()``; side ``mutex``: every task takes ``lock(name)``.
Each side runs ``--seconds`` per round; the sides alternate, and their order flips each round, so
both see the same machine noise. Reported per side (medians over rounds): reads and writes done per
second, the readers' and the writer's acquire latency (p50, p99), and the rw/mutex ratios taken
within each round, then their median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from _common import add_loop_option, library_commit, run_on

from redlock_async import Lock, Redlock
from redlock_async.testing import LocalNodes

READERS = 16
WRITERS = 1
CLIENTS = 4
READ_WORK = 0.010
"""Seconds a reader holds (the read it protects)."""
WRITE_WORK = 0.010
WRITE_PAUSE = 0.050
"""Seconds between two writes: a read-mostly workload."""


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def side(clients: list[Redlock], kind: str, seconds: float, name: str) -> dict[str, float]:
    stop = time.monotonic() + seconds
    reads: list[float] = []  # acquire latencies
    writes: list[float] = []

    def make(client: Redlock, reader: bool) -> Lock:
        if kind == "mutex":
            return client.lock(name, ttl=5.0, acquire_timeout=30.0)
        rw = client.rw_lock(name, ttl=5.0, acquire_timeout=30.0)
        return rw.read() if reader else rw.write()

    async def reader(client: Redlock) -> None:
        while time.monotonic() < stop:
            lock = make(client, True)
            began = time.perf_counter()
            async with lock:
                reads.append(time.perf_counter() - began)
                await asyncio.sleep(READ_WORK)

    async def writer(client: Redlock) -> None:
        while time.monotonic() < stop:
            lock = make(client, False)
            began = time.perf_counter()
            async with lock:
                writes.append(time.perf_counter() - began)
                await asyncio.sleep(WRITE_WORK)
            await asyncio.sleep(WRITE_PAUSE)

    began = time.monotonic()
    async with asyncio.TaskGroup() as group:
        for i in range(READERS):
            group.create_task(reader(clients[i % len(clients)]))
        for i in range(WRITERS):
            group.create_task(writer(clients[(READERS + i) % len(clients)]))
    took = time.monotonic() - began
    return {
        "reads_per_s": len(reads) / took,
        "writes_per_s": len(writes) / took,
        "read_p50_ms": pct(reads, 0.5) * 1e3,
        "read_p99_ms": pct(reads, 0.99) * 1e3,
        "write_p50_ms": pct(writes, 0.5) * 1e3,
        "write_p99_ms": pct(writes, 0.99) * 1e3,
    }


async def main(rounds: int, seconds: float) -> dict[str, Any]:
    with LocalNodes(5) as cluster:
        clients = [Redlock(cluster.urls, retry_delay=0.05) for _ in range(CLIENTS)]
        for client in clients:
            await client.connect()
        try:
            results: dict[str, list[dict[str, float]]] = {"rw": [], "mutex": []}
            ratios: dict[str, list[float]] = {"reads_per_s": [], "writes_per_s": [], "ops_per_s": []}
            for n in range(rounds):
                order = ("rw", "mutex") if n % 2 == 0 else ("mutex", "rw")
                got = {}
                for kind in order:
                    got[kind] = await side(clients, kind, seconds, f"bench-rw-{n}-{kind}")
                    results[kind].append(got[kind])
                    print(f"round {n + 1} {kind:<5} " + "  ".join(f"{k} {v:.1f}" for k, v in got[kind].items()))
                for key in ("reads_per_s", "writes_per_s"):
                    ratios[key].append(got["rw"][key] / got["mutex"][key] if got["mutex"][key] else float("inf"))
                ops = {kind: got[kind]["reads_per_s"] + got[kind]["writes_per_s"] for kind in got}
                ratios["ops_per_s"].append(ops["rw"] / ops["mutex"])
        finally:
            for client in clients:
                await client.aclose()
    medians = {kind: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for kind, rows in results.items()}
    return {
        "workload": {
            "readers": READERS,
            "writers": WRITERS,
            "clients": CLIENTS,
            "read_work_s": READ_WORK,
            "write_work_s": WRITE_WORK,
            "write_pause_s": WRITE_PAUSE,
            "seconds_per_side": seconds,
            "rounds": rounds,
        },
        "medians": medians,
        "rw_over_mutex": {k: statistics.median(v) for k, v in ratios.items()},
        "commit": library_commit(),
        "python": platform.python_version(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    add_loop_option(parser)
    args = parser.parse_args()
    report = run_on(args.loop, main(args.rounds, args.seconds))
    report["loop"] = args.loop
    print(json.dumps({"medians": report["medians"], "rw_over_mutex": report["rw_over_mutex"]}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
