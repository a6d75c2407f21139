"""Hand-off across OS processes: the grant queue (the default) against release words and a second fan-out.

Usage::

    python benchmarks/bench_crossproc.py [--quick] [--json PATH] [--loop asyncio|uvloop]

Exit status 1 when two lock bodies overlapped or a process failed.

One run starts ``LocalNodes(5)`` (real valkey-server processes on 127.0.0.1) and, in rounds (the
order of the modes alternates from round to round, so that both see the same machine noise):

1. **baseline**: this process's uncontended ``acquire()`` p50 on a resource of its own, sequential,
   with the default settings (the same for both modes; the first try of a grant-queue acquire is the
   same SET NX round as with release words, so both modes' uncontended acquires are one round trip).
2. **contention**, once per mode: PROCESSES child processes, TASKS tasks each, all on ONE resource,
   every task looping ``async with lock: await asyncio.sleep(HOLD)`` for the window:

   * ``words``: ``Redlock(urls, queue=False)``: a release publishes a word; a waiter woken by a
     majority of words sends its own SETs (two round trips from release to the next holder);
   * ``default``: ``Redlock(urls)`` (the grant queue): the nodes keep the waiters in line and the
     release script hands the key to the first, publishing a grant; the waiter holds the lock once a
     majority of grants came (one round trip).

Each child records, per grant, when its body started and ended (``time.monotonic``, system-wide
on Linux); the parent merges them. A *cross-process hand-off* is the next body's start minus the
previous body's end, for consecutive bodies in different processes: the release, the word or
grant, and whatever else the next holder needed. Bodies that overlap are a violation.

Target (issue 27): the default's cross-process hand-off p50 <= 2.5x the uncontended acquire p50, as
the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import add_loop_option, library_commit, run_on

from redlock_async import LockNotAcquired, Redlock
from redlock_async.testing import LocalNodes

NODES = 5
PROCESSES = 2
TASKS = 2
HOLD = 0.001
RESOURCE = "bench:crossproc"
SOLO = "bench:crossproc:solo"
MODES = ("words", "default")
TARGET = 2.5


@dataclass(frozen=True)
class Config:
    rounds: int
    window: float
    baseline_ops: int
    budget: float


FULL = Config(rounds=5, window=3.0, baseline_ops=400, budget=150.0)
QUICK = Config(rounds=2, window=1.5, baseline_ops=150, budget=60.0)


# -- the child processes -----------------------------------------------------------------------


async def child(urls: list[str], queue: bool | None, stop_at: float) -> None:
    """Contend until *stop_at* (monotonic); print every grant as JSON lines [start, end]."""
    grants: list[tuple[float, float]] = []
    errors: list[str] = []

    async def task(redlock: Redlock) -> None:
        lock = redlock.lock(RESOURCE)
        for _ in range(100_000):
            if time.monotonic() >= stop_at:
                return
            try:
                async with lock:
                    start = time.monotonic()
                    await asyncio.sleep(HOLD)
                    grants.append((start, time.monotonic()))
            except LockNotAcquired:
                errors.append("timeout")
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return

    async with Redlock(urls, queue=queue) as redlock:
        await redlock.connect()
        print("ready", flush=True)
        go = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        stop_at = float(go.split()[1])
        await asyncio.gather(*(task(redlock) for _ in range(TASKS)))
    print(json.dumps({"grants": grants, "errors": errors}), flush=True)


# -- the parent ----------------------------------------------------------------------------------


@dataclass
class Contention:
    mode: str
    grants: int
    cross: int  # hand-offs between processes
    cross_p50_us: float
    cross_p99_us: float
    overlaps: int
    errors: list[str]


async def contend(urls: list[str], mode: str, cfg: Config, loop_name: str) -> Contention:
    argv = [sys.executable, __file__, "--child", mode, "--loop", loop_name, ",".join(urls)]
    procs = [
        await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        for _ in range(PROCESSES)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            async with asyncio.timeout(30):
                line = await proc.stdout.readline()
            if line.strip() != b"ready":
                raise RuntimeError(f"a child did not start: {line!r}")
        stop_at = time.monotonic() + 0.2 + cfg.window
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {stop_at}\n".encode())
            await proc.stdin.drain()
        results = []
        async with asyncio.timeout(cfg.window + 30):
            for proc in procs:
                assert proc.stdout is not None
                results.append(json.loads(await proc.stdout.readline()))
                await proc.wait()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    bodies = sorted((start, end, p) for p, result in enumerate(results) for start, end in result["grants"])
    errors = [e for result in results for e in result["errors"]]
    overlaps = sum(1 for a, b in itertools.pairwise(bodies) if b[0] < a[1])
    cross = [b[0] - a[1] for a, b in itertools.pairwise(bodies) if a[2] != b[2] and b[0] >= a[1]]
    return Contention(
        mode=mode,
        grants=len(bodies),
        cross=len(cross),
        cross_p50_us=percentile(cross, 50) * 1e6,
        cross_p99_us=percentile(cross, 99) * 1e6,
        overlaps=overlaps,
        errors=errors[:5],
    )


def percentile(samples: Sequence[float], q: int) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


async def baseline(urls: list[str], cfg: Config, *, queue: bool | None = None) -> float:
    """Uncontended acquire p50 (us), sequential; default settings, or *queue*."""
    async with Redlock(urls, queue=queue) as redlock:
        lock = redlock.lock(SOLO, auto_extend=False)
        samples = []
        for i in range(cfg.baseline_ops + 20):
            started = time.perf_counter()
            await lock.acquire()
            if i >= 20:
                samples.append(time.perf_counter() - started)
            await lock.release()
    return statistics.median(samples) * 1e6


async def run(cfg: Config, loop_name: str) -> tuple[dict[str, Any], bool]:
    with LocalNodes(NODES) as nodes:
        urls = nodes.urls
        rounds: list[dict[str, Any]] = []
        async with asyncio.timeout(cfg.budget):
            for index in range(cfg.rounds):
                base = await baseline(urls, cfg)
                words = await baseline(urls, cfg, queue=False)  # release words' own uncontended acquire, for the record
                order = MODES if index % 2 == 0 else tuple(reversed(MODES))
                modes = {mode: await contend(urls, mode, cfg, loop_name) for mode in order}
                rounds.append(
                    {"baseline_us": base, "words_baseline_us": words, "modes": {m: asdict(c) for m, c in modes.items()}}
                )
    ratios = {m: statistics.median(r["modes"][m]["cross_p50_us"] / r["baseline_us"] for r in rounds) for m in MODES}
    bad = any(r["modes"][m]["overlaps"] or r["modes"][m]["errors"] for r in rounds for m in MODES)
    print(
        f"\n## Hand-off across {PROCESSES} processes x {TASKS} tasks, hold {HOLD * 1e3:g} ms, {NODES} nodes "
        f"({loop_name}, commit {library_commit()})\n"
    )
    print("| round | acquire p50 | mode | grants | cross-process hand-offs | p50 | p99 | p50 / acquire |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for i, r in enumerate(rounds):
        for m in MODES:
            c = r["modes"][m]
            share = c["cross_p50_us"] / r["baseline_us"]
            print(
                f"| {i + 1} | {r['baseline_us']:.0f} us | {m} | {c['grants']} | {c['cross']} | "
                f"{c['cross_p50_us']:.0f} us | {c['cross_p99_us']:.0f} us | {share:.2f}x |"
            )
    print()
    own = statistics.median(r["words_baseline_us"] / r["baseline_us"] for r in rounds)
    print(f"- uncontended acquire p50 with queue=False: {own:.2f}x the default's (median of rounds)")
    for m in MODES:
        print(f"- {m}: cross-process hand-off p50 = {ratios[m]:.2f}x the uncontended acquire p50 (median of rounds)")
    passed = ratios["default"] <= TARGET
    print(f"- {'PASS' if passed else 'MISS'} default <= {TARGET:g}x (issue 27)")
    overlaps = sum(r["modes"][m]["overlaps"] for r in rounds for m in MODES)
    print(f"- mutual exclusion: {'held' if not overlaps else f'VIOLATED ({overlaps})'}")
    data = {"benchmark": "crossproc", "config": asdict(cfg), "rounds": rounds, "ratios": ratios, "target": TARGET}
    return data, bad


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("urls", nargs="?", help=argparse.SUPPRESS)
    add_loop_option(parser)
    args = parser.parse_args(argv)
    if args.child:
        run_on(args.loop, child(args.urls.split(","), False if args.child == "words" else None, 0.0))
        return 0
    cfg = QUICK if args.quick else FULL
    data, bad = run_on(args.loop, run(cfg, args.loop))
    if args.json:
        args.json.write_text(json.dumps(data, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
