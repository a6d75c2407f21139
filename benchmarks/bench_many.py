"""lock_many and semaphores against single locks, on 5 local nodes.

Usage::

    python benchmarks/bench_many.py [--quick] [--json PATH] [--loop asyncio|uvloop]

One run starts ``LocalNodes(5)`` (real valkey-server processes on 127.0.0.1)
and one ``Redlock``, and measures in rounds. Within a round every side is
measured seconds apart from the sides it is compared with, and the order of
the sides is reversed from one round to the next, so both sides of a ratio
see the same machine noise:

1. **lock_many** of 2 and of 8 names against as many single locks taken one
   after another (``lock(name).acquire()`` for each, then ``release()`` of
   each in reverse order, as nested ``async with`` blocks do). Every op takes
   names nobody used before (``auto_extend=False``, ``acquire(blocking=False)``,
   uncontended): the p50 of the whole acquire+release, one op at a time; and
   the throughput of 64 tasks, each op on its own names. An op is one
   acquisition of all the names (lock_many: one script per node; sequential:
   one fan-out per name).
2. **Semaphore** of limit 1, 4 and 16 against a single lock (``auto_extend=False``):

   * the uncontended acquire+release p50, one task, ``acquire(blocking=False)``
     on one semaphore (one lock);
   * the throughput of 64 tasks on ONE semaphore of limit L, each task with
     its own ``Semaphore`` object, blocking ``acquire()`` then ``release()``
     in a loop (empty critical section); against 64 tasks each on its own
     lock name (uncontended: what the nodes give), and 64 tasks contending for
     ONE lock name (the limit-1 comparison: the same contention).

Every figure is the median over the rounds; each ratio is taken within a
round, then the median over rounds. Each semaphore limit has a name of its
own (a semaphore keeps the widest limit it was used with, and an acquire
looks at that many slots).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import hiredis
import redis
import redis.asyncio as aioredis
from _common import add_loop_option, library_commit, loop_lag, run_on

from redlock_async import Lock, Redlock
from redlock_async.testing import LocalNodes

NODES = 5
TASKS = 64  # concurrent tasks of every throughput window
NAME_COUNTS = (2, 8)  # names per lock_many (and single locks per sequential op)
LIMITS = (1, 4, 16)  # semaphore limits

perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class Config:
    rounds: int
    latency_ops: int  # timed sequential ops per side per round
    warmup_ops: int  # untimed sequential ops before each latency run
    throughput_seconds: float  # timed window per side per round
    throughput_warmup_seconds: float  # untimed window before each timed one (same side)
    max_ops_per_task: int  # hard bound on a throughput worker's loop
    phase_seconds: float  # hard bound (asyncio.timeout) on any one phase


FULL = Config(
    rounds=5,
    latency_ops=400,
    warmup_ops=50,
    throughput_seconds=1.5,
    throughput_warmup_seconds=0.2,
    max_ops_per_task=1_000_000,
    phase_seconds=60.0,
)
QUICK = Config(
    rounds=3,
    latency_ops=100,
    warmup_ops=20,
    throughput_seconds=0.4,
    throughput_warmup_seconds=0.1,
    max_ops_per_task=200_000,
    phase_seconds=15.0,
)


# -- the sides -------------------------------------------------------------------


class Side(Protocol):
    name: str
    failures: int  # failed acquires in every op, warm-ups included

    async def cycle(self, task: int) -> bool:
        """One acquire+release by task *task*; False when the acquire failed."""
        ...


class ManySide:
    """``lock_many`` of *count* names nobody used before, per op: one acquisition of them all."""

    def __init__(self, redlock: Redlock, count: int) -> None:
        self.name = f"lock_many {count}"
        self.redlock = redlock
        self.count = count
        self.serial = itertools.count()
        self.failures = 0

    async def cycle(self, task: int) -> bool:
        op = next(self.serial)
        lock = self.redlock.lock_many(
            [f"bench:many{self.count}:{op}:{k}" for k in range(self.count)], auto_extend=False
        )
        ok = await lock.acquire(blocking=False)
        if ok:
            await lock.release()
        else:
            self.failures += 1
        return ok


class SequentialSide:
    """*count* single locks on names nobody used before, acquired one after another, released in reverse."""

    def __init__(self, redlock: Redlock, count: int) -> None:
        self.name = f"sequential {count}"
        self.redlock = redlock
        self.count = count
        self.serial = itertools.count()
        self.failures = 0

    async def cycle(self, task: int) -> bool:
        op = next(self.serial)
        locks = [self.redlock.lock(f"bench:seq{self.count}:{op}:{k}", auto_extend=False) for k in range(self.count)]
        held: list[Lock] = []
        for lock in locks:
            if not await lock.acquire(blocking=False):
                break
            held.append(lock)
        for lock in reversed(held):
            await lock.release()
        ok = len(held) == self.count
        self.failures += not ok
        return ok


class ReusedSide:
    """One Lock (or Semaphore) object per task, acquired and released over and over."""

    def __init__(self, name: str, locks: Sequence[Lock], *, blocking: bool) -> None:
        self.name = name
        self.locks = list(locks)
        self.blocking = blocking
        self.failures = 0

    async def cycle(self, task: int) -> bool:
        lock = self.locks[task]
        if not await lock.acquire(blocking=self.blocking):
            self.failures += 1
            return False
        await lock.release()
        return True


# -- statistics --------------------------------------------------------------------


def us(ns: float) -> float:
    return ns / 1000.0


def p99(samples: Sequence[int]) -> float:
    if len(samples) < 2:
        return float(samples[0]) if samples else float("nan")
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def median_of(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]  # drop NaN
    return statistics.median(finite) if finite else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


# -- measurements --------------------------------------------------------------------


@dataclass
class Latency:
    ops: int
    failures: int
    cycle_p50_us: float
    cycle_p99_us: float


async def measure_latency(side: Side, cfg: Config) -> Latency:
    """Sequential acquire+release by one task: warm up, then time each op."""
    cycle_ns: list[int] = []
    failures = 0
    async with asyncio.timeout(cfg.phase_seconds):
        for _ in range(cfg.warmup_ops):
            await side.cycle(0)
        gc.collect()
        deadline = perf_ns() + int(cfg.phase_seconds / 2 * 1e9)
        for _ in range(cfg.latency_ops):
            started = perf_ns()
            ok = await side.cycle(0)
            cycle_ns.append(perf_ns() - started)
            failures += not ok
            if perf_ns() > deadline:
                break
    return Latency(
        ops=len(cycle_ns),
        failures=failures,
        cycle_p50_us=us(statistics.median(cycle_ns)),
        cycle_p99_us=us(p99(cycle_ns)),
    )


@dataclass
class Throughput:
    ops: int
    failures: int
    seconds: float  # the window and the drain (tasks finish the op they are in)
    ops_per_s: float
    max_loop_lag_ms: float  # worst lateness of a 5 ms timer during the window


async def run_throughput(side: Side, seconds: float, cfg: Config) -> Throughput:
    stop_at = perf_ns() + int(seconds * 1e9)

    async def worker(task: int) -> tuple[int, int]:
        done = failed = 0
        while done < cfg.max_ops_per_task and perf_ns() < stop_at:
            ok = await side.cycle(task)
            done += 1
            failed += not ok
        return done, failed

    started = perf_ns()
    async with asyncio.timeout(seconds + cfg.phase_seconds):
        lag = asyncio.ensure_future(loop_lag(stop_at))
        results = await asyncio.gather(*(worker(task) for task in range(TASKS)))
        elapsed = (perf_ns() - started) / 1e9
        max_lag = await lag
    ops = sum(done for done, _ in results)
    return Throughput(
        ops=ops,
        failures=sum(failed for _, failed in results),
        seconds=elapsed,
        ops_per_s=ops / elapsed,
        max_loop_lag_ms=max_lag,
    )


async def measure_throughput(side: Side, cfg: Config) -> Throughput:
    await run_throughput(side, cfg.throughput_warmup_seconds, cfg)
    gc.collect()
    return await run_throughput(side, cfg.throughput_seconds, cfg)


# -- rounds ------------------------------------------------------------------------------


@dataclass
class Sides:
    many: dict[int, ManySide]
    sequential: dict[int, SequentialSide]
    lock_latency: ReusedSide  # one lock, one task
    semaphore_latency: dict[int, ReusedSide]  # one semaphore per limit, one task
    lock_own: ReusedSide  # 64 tasks, each on its own lock name
    lock_one: ReusedSide  # 64 tasks on one lock name (blocking)
    semaphore: dict[int, ReusedSide]  # 64 tasks on one semaphore per limit (blocking)


def make_sides(redlock: Redlock) -> Sides:
    def semaphores(limit: int, count: int) -> list[Lock]:
        return [redlock.semaphore(f"bench:sem{limit}", limit=limit, auto_extend=False) for _ in range(count)]

    return Sides(
        many={n: ManySide(redlock, n) for n in NAME_COUNTS},
        sequential={n: SequentialSide(redlock, n) for n in NAME_COUNTS},
        lock_latency=ReusedSide("lock", [redlock.lock("bench:lock", auto_extend=False)], blocking=False),
        semaphore_latency={
            limit: ReusedSide(f"semaphore {limit}", semaphores(limit, 1), blocking=False) for limit in LIMITS
        },
        lock_own=ReusedSide(
            "lock, own names",
            [redlock.lock(f"bench:own:{task}", auto_extend=False) for task in range(TASKS)],
            blocking=True,
        ),
        lock_one=ReusedSide(
            "lock, one name", [redlock.lock("bench:one", auto_extend=False) for _ in range(TASKS)], blocking=True
        ),
        semaphore={
            limit: ReusedSide(f"semaphore {limit}", semaphores(limit, TASKS), blocking=True) for limit in LIMITS
        },
    )


@dataclass
class Round:
    orders: dict[str, list[str]]
    latency: dict[str, Latency]
    throughput: dict[str, Throughput]
    seconds: float = 0.0
    ratios: dict[str, float] = field(default_factory=dict)


def _ordered(index: int, sides: list[Side]) -> list[Side]:
    return sides if index % 2 == 0 else sides[::-1]


async def run_round(index: int, s: Sides, cfg: Config) -> Round:
    started = perf_ns()
    many_sides: list[Side] = []
    for n in NAME_COUNTS:
        many_sides += [s.many[n], s.sequential[n]]
    semaphore_latency: list[Side] = [s.lock_latency, *(s.semaphore_latency[limit] for limit in LIMITS)]
    semaphore_throughput: list[Side] = [s.lock_own, s.lock_one, *(s.semaphore[limit] for limit in LIMITS)]
    orders = {
        "lock_many": [side.name for side in _ordered(index, many_sides)],
        "semaphore_latency": [side.name for side in _ordered(index, semaphore_latency)],
        "semaphore_throughput": [side.name for side in _ordered(index, semaphore_throughput)],
    }
    latency: dict[str, Latency] = {}
    throughput: dict[str, Throughput] = {}
    for side in _ordered(index, many_sides):
        latency[side.name] = await measure_latency(side, cfg)
    for side in _ordered(index, many_sides):
        throughput[side.name] = await measure_throughput(side, cfg)
    for side in _ordered(index, semaphore_latency):
        latency[side.name] = await measure_latency(side, cfg)
    for side in _ordered(index, semaphore_throughput):
        throughput[side.name] = await measure_throughput(side, cfg)
    result = Round(orders=orders, latency=latency, throughput=throughput)
    for n in NAME_COUNTS:
        many, seq = f"lock_many {n}", f"sequential {n}"
        result.ratios[f"many{n}_p50"] = ratio(latency[many].cycle_p50_us, latency[seq].cycle_p50_us)
        result.ratios[f"many{n}_p99"] = ratio(latency[many].cycle_p99_us, latency[seq].cycle_p99_us)
        result.ratios[f"many{n}_throughput"] = ratio(throughput[many].ops_per_s, throughput[seq].ops_per_s)
    own, one = throughput[s.lock_own.name].ops_per_s, throughput[s.lock_one.name].ops_per_s
    result.ratios["lock_one_throughput_vs_own"] = ratio(one, own)
    for limit in LIMITS:
        name = f"semaphore {limit}"
        result.ratios[f"sem{limit}_p50"] = ratio(latency[name].cycle_p50_us, latency["lock"].cycle_p50_us)
        result.ratios[f"sem{limit}_throughput_vs_own"] = ratio(throughput[name].ops_per_s, own)
        result.ratios[f"sem{limit}_throughput_vs_one"] = ratio(throughput[name].ops_per_s, one)
    result.seconds = (perf_ns() - started) / 1e9
    return result


# -- environment and report ------------------------------------------------------------


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


async def environment(clients: Sequence[aioredis.Redis], redlock: Redlock) -> dict[str, Any]:
    info: dict[str, Any] = await clients[0].info("server")
    server = str(info.get("server_name", "redis"))
    version = info.get(f"{server}_version", info.get("redis_version", "?"))
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "redis_py": redis.__version__,
        "hiredis": getattr(hiredis, "__version__", "?"),
        "server": f"{server} {version}",
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "event_loop": type(asyncio.get_running_loop()).__name__,
        "nodes": NODES,
        "commit": library_commit(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_start": _load(),
        "redlock_settings": dataclasses.asdict(redlock.settings),
    }


async def keys_left(clients: Sequence[aioredis.Redis]) -> list[int]:
    """Keys on each node after the run, but the ones kept by design: the restart-quarantine marker
    (a key named after the prefix) and each semaphore's widest limit (a few bytes, no expiry)."""
    left = []
    for client in clients:
        names = [key if isinstance(key, bytes) else key.encode() for key in await client.keys("*")]
        left.append(len([k for k in names if not k.endswith(b":") and not k.endswith(b"\x00limit")]))
    return left


def report(rounds: list[Round], env: dict[str, Any], cfg: Config, total_seconds: float) -> dict[str, Any]:
    def lat(name: str) -> float:
        return median_of([r.latency[name].cycle_p50_us for r in rounds])

    def ops(name: str) -> float:
        return median_of([r.throughput[name].ops_per_s for r in rounds])

    def rat(key: str) -> float:
        return median_of([r.ratios[key] for r in rounds])

    def spread(key: str) -> str:
        values = [r.ratios[key] for r in rounds]
        return f"{min(values):.2f}-{max(values):.2f}"

    f0 = "{:,.0f}".format
    medians: dict[str, float] = {}
    for r0 in rounds[:1]:
        for name in r0.latency:
            medians[f"{name} p50_us"] = lat(name)
        for name in r0.throughput:
            medians[f"{name} ops_per_s"] = ops(name)
    ratios = {key: rat(key) for key in rounds[0].ratios}

    print()
    print(f"## lock_many and semaphores ({'quick' if cfg is QUICK else 'full'}, {len(rounds)} rounds)")
    print()
    print(
        f"python {env['python']} ({env['implementation']}), redis-py {env['redis_py']} (hiredis {env['hiredis']}), "
        f"server {env['server']}, cpu_count {env['cpu_count']} (affinity {env['cpu_affinity']}), "
        f"{env['nodes']} nodes, {env['event_loop']}, redlock_async at {env['commit']}, {env['date_utc']}, "
        f"load average {env['load_average_start']} at start, {env['load_average_end']} at end"
    )
    print()
    print("| lock_many vs single locks taken one after another | lock_many | sequential | ratio | range over rounds |")
    print("|---|---:|---:|---:|---:|")
    for n in NAME_COUNTS:
        many, seq = f"lock_many {n}", f"sequential {n}"
        print(
            f"| {n} names: acquire+release p50 (µs), 1 task | {f0(lat(many))} | {f0(lat(seq))} "
            f"| {ratios[f'many{n}_p50']:.2f}x | {spread(f'many{n}_p50')} |"
        )
        print(
            f"| {n} names: throughput, {TASKS} tasks (ops/s) | {f0(ops(many))} | {f0(ops(seq))} "
            f"| {ratios[f'many{n}_throughput']:.2f}x | {spread(f'many{n}_throughput')} |"
        )
    print()
    print(
        "An op takes all the names (lock_many: one script per node; sequential: one fan-out per name, then a "
        "release per name in reverse order); every op on names nobody used before, uncontended, "
        "`acquire(blocking=False)`. p50 ratio < 1 and throughput ratio > 1: lock_many is better."
    )
    print()
    lock_lat, own, one = lat("lock"), ops("lock, own names"), ops("lock, one name")
    print(
        "| semaphore vs single lock | semaphore | single lock | ratio | range over rounds "
        f"| vs {TASKS} tasks on one lock name |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| single lock, {TASKS} tasks on one name (ops/s) | | {f0(one)} | {ratios['lock_one_throughput_vs_own']:.2f}x "
        f"| {spread('lock_one_throughput_vs_own')} | 1.00x |"
    )
    for limit in LIMITS:
        name = f"semaphore {limit}"
        print(
            f"| limit {limit}: acquire+release p50 (µs), 1 task, uncontended | {f0(lat(name))} | {f0(lock_lat)} "
            f"| {ratios[f'sem{limit}_p50']:.2f}x | {spread(f'sem{limit}_p50')} | |"
        )
        print(
            f"| limit {limit}: {TASKS} tasks on one semaphore (ops/s) | {f0(ops(name))} | {f0(own)} "
            f"| {ratios[f'sem{limit}_throughput_vs_own']:.2f}x | {spread(f'sem{limit}_throughput_vs_own')} "
            f"| {ratios[f'sem{limit}_throughput_vs_one']:.2f}x |"
        )
    print()
    print(
        f"Single lock: one lock, one task, for the p50; {TASKS} tasks each on its own lock name (uncontended) for "
        f"the throughput column; {TASKS} tasks contending for one lock name for the 'vs one lock name' column "
        "(the limit-1 comparison). Contended tasks use a blocking `acquire()`, an empty critical section, and "
        "`release()`."
    )
    print()
    print("Per round (variance):")
    print()
    head = ["round"]
    head += [f"many{n} p50 / ops ratio" for n in NAME_COUNTS]
    head += [f"sem{limit} p50 / ops ratio" for limit in LIMITS]
    head += ["one/own ops", "worst loop lag ms", "round s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for i, r in enumerate(rounds):
        cells = [str(i + 1)]
        cells += [f"{r.ratios[f'many{n}_p50']:.2f} / {r.ratios[f'many{n}_throughput']:.2f}" for n in NAME_COUNTS]
        cells += [
            f"{r.ratios[f'sem{limit}_p50']:.2f} / {r.ratios[f'sem{limit}_throughput_vs_own']:.2f}" for limit in LIMITS
        ]
        cells += [
            f"{r.ratios['lock_one_throughput_vs_own']:.2f}",
            f"{max(t.max_loop_lag_ms for t in r.throughput.values()):.0f}",
            f"{r.seconds:.1f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print()
    timed_failures = sum(x.failures for r in rounds for x in r.latency.values()) + sum(
        t.failures for r in rounds for t in r.throughput.values()
    )
    print(
        f"Failed acquires in timed ops: {timed_failures}; in all ops, warm-ups included: {env['all_failures']}. "
        f"Keys left on the nodes: {env['keys_left']}. Total {total_seconds:.1f} s."
    )
    return {
        "config": dataclasses.asdict(cfg),
        "environment": env,
        "medians": medians,
        "ratios": ratios,
        "failed_acquires": timed_failures,
        "total_seconds": total_seconds,
        "rounds": [dataclasses.asdict(r) for r in rounds],
    }


def _all_sides(s: Sides) -> list[Side]:
    return [
        *s.many.values(),
        *s.sequential.values(),
        s.lock_latency,
        *s.semaphore_latency.values(),
        s.lock_own,
        s.lock_one,
        *s.semaphore.values(),
    ]


async def bench(urls: list[str], cfg: Config) -> tuple[list[Round], dict[str, Any]]:
    clients = [aioredis.Redis.from_url(url) for url in urls]
    try:
        async with Redlock(urls) as redlock:
            env = await environment(clients, redlock)
            sides = make_sides(redlock)
            rounds: list[Round] = []
            for index in range(cfg.rounds):
                result = await run_round(index, sides, cfg)
                rounds.append(result)
                print(
                    f"round {index + 1}/{cfg.rounds}: {result.seconds:.1f} s, lock_many/sequential p50 "
                    + ", ".join(f"{n} names {result.ratios[f'many{n}_p50']:.2f}x" for n in NAME_COUNTS)
                    + "; semaphore/lock ops "
                    + ", ".join(
                        f"limit {limit} {result.ratios[f'sem{limit}_throughput_vs_own']:.2f}x" for limit in LIMITS
                    ),
                    file=sys.stderr,
                    flush=True,
                )
            env["load_average_end"] = _load()
            env["keys_left"] = await keys_left(clients)
            env["all_failures"] = {side.name: side.failures for side in _all_sides(sides) if side.failures}
            return rounds, env
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller, for smoke runs (< 40 s)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the raw figures to PATH")
    add_loop_option(parser)
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    started = perf_ns()
    with LocalNodes(NODES) as cluster:
        rounds, env = run_on(args.loop, bench(cluster.urls, cfg))
    data = report(rounds, env, cfg, (perf_ns() - started) / 1e9)
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
