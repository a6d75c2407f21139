"""Core benchmark of redlock_async against a raw redis-py floor, on 5 local nodes.

Usage::

    python benchmarks/bench_core.py [--quick] [--json PATH] [--loop asyncio|uvloop|both]

One run starts ``LocalNodes(5)`` (real valkey-server processes on 127.0.0.1)
and measures, interleaved in rounds so that both sides see the same machine
noise (the order of floor and redlock_async alternates from round to round):

1. uncontended latency: one acquire+release on one resource, sequential;
2. throughput: 64 tasks, each on its own resource, acquire+release in a loop;
3. one node stopped (SIGSTOP): uncontended acquire latency, redlock_async only,
   once acquires skip the stalled node (steady state), against healthy blocks
   of the same lock alternating with the stopped ones.

Every figure is the median over the rounds; ratios are computed within each
round (both sides of a ratio measured seconds apart) and then the median taken.

The floor is what a hand-written client does with redis-py (hiredis parser):
one ``redis.asyncio.Redis`` per node, ``gather`` of SET NX PX on all nodes,
then ``gather`` of a compare-and-delete script on all nodes. Nothing about it
waits for a majority only, so with a SIGSTOPped node it would hang: the floor is
not measured in scenario 3.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import platform
import secrets
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import hiredis
import redis
import redis.asyncio as aioredis
from _common import add_loop_option, library_commit, loop_lag, run_on
from redis.commands.core import AsyncScript

from redlock_async import Lock, Redlock
from redlock_async.testing import LocalNodes

NODES = 5
STOPPED = 4  # index of the node SIGSTOPped in scenario 3
TASKS = 64  # concurrent tasks of the throughput scenario
TOKEN_BYTES = 20
TTL_MS = 10_000
RELEASE_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"

TARGET_P50_RATIO = 0.6  # redlock_async p50 <= 0.6x floor p50
TARGET_THROUGHPUT_RATIO = 5.0  # redlock_async ops/s >= 5x floor ops/s
TARGET_STOPPED_RATIO = 1.2  # acquire p50 with one node stopped <= 1.2x healthy acquire p50

perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class Config:
    rounds: int
    latency_ops: int  # timed sequential ops per side per round
    warmup_ops: int  # untimed sequential ops before each latency run
    throughput_seconds: float  # timed window per side per round
    throughput_warmup_seconds: float
    max_ops_per_task: int  # hard bound on a throughput worker's loop
    stopped_ops: int  # timed sequential ops with the node stopped (and as many healthy ones)
    stopped_blocks: int  # pause/resume cycles per round, alternating with healthy blocks
    block_warmup_ops: int  # untimed ops before each block of scenario 3
    precap_ops: int  # sequential ops timed right after each pause, before acquires skip the stalled node
    fill_seconds: float  # bound on the wait until acquires skip the stalled node
    phase_seconds: float  # hard bound (asyncio.timeout) on any one phase


FULL = Config(
    rounds=5,
    latency_ops=2000,
    warmup_ops=200,
    throughput_seconds=2.0,
    throughput_warmup_seconds=0.25,
    max_ops_per_task=1_000_000,
    stopped_ops=2000,
    stopped_blocks=2,
    block_warmup_ops=50,
    precap_ops=5,
    fill_seconds=10.0,
    phase_seconds=60.0,
)
QUICK = Config(
    rounds=3,
    latency_ops=400,
    warmup_ops=50,
    throughput_seconds=0.4,
    throughput_warmup_seconds=0.1,
    max_ops_per_task=200_000,
    stopped_ops=400,
    stopped_blocks=2,
    block_warmup_ops=20,
    precap_ops=3,
    fill_seconds=5.0,
    phase_seconds=15.0,
)


class PhaseConfig(Protocol):
    """What the shared phases (measure_latency, run_throughput) read from a benchmark's Config."""

    @property
    def latency_ops(self) -> int: ...
    @property
    def warmup_ops(self) -> int: ...
    @property
    def max_ops_per_task(self) -> int: ...
    @property
    def phase_seconds(self) -> float: ...


# -- the two sides ---------------------------------------------------------------


class Side(Protocol):
    name: str

    async def cycle(self, slot: int) -> tuple[int, int, bool]:
        """One acquire+release on resource *slot*: (acquire ns, acquire+release ns, acquired)."""
        ...


class Floor:
    """The raw floor: redis-py clients, gather SET NX PX everywhere, then gather compare-and-delete."""

    name = "floor"

    def __init__(self, urls: Sequence[str], slots: int) -> None:
        self.clients: list[aioredis.Redis] = [aioredis.Redis.from_url(url) for url in urls]
        self.scripts: list[AsyncScript] = [client.register_script(RELEASE_LUA) for client in self.clients]
        self.keys = [f"bench:floor:{i}" for i in range(slots)]
        self.failures = 0  # failed acquires in every op, warm-ups included
        self.failed: list[dict[str, Any]] = []  # the first few of them, for the JSON

    async def cycle(self, slot: int) -> tuple[int, int, bool]:
        key = self.keys[slot]
        started = perf_ns()
        token = secrets.token_urlsafe(TOKEN_BYTES)
        replies = await asyncio.gather(*(c.set(key, token, nx=True, px=TTL_MS) for c in self.clients))
        acquired = perf_ns()
        released = await asyncio.gather(*(script(keys=[key], args=[token]) for script in self.scripts))
        ended = perf_ns()
        ok = all(replies)
        if not ok:
            self.failures += 1
            if len(self.failed) < 10:
                await self._record_failure(key, token, replies, released)
        return acquired - started, ended - started, ok

    async def _record_failure(self, key: str, token: str, replies: list[Any], released: list[Any]) -> None:
        values = await asyncio.gather(*(c.get(key) for c in self.clients))
        ttls = await asyncio.gather(*(c.pttl(key) for c in self.clients))
        self.failed.append(
            {
                "key": key,
                "token": token,
                "set": [repr(r) for r in replies],
                "release": [repr(r) for r in released],
                "value_after": [repr(v) for v in values],
                "pttl_after": [int(t) for t in ttls],
            }
        )

    async def aclose(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self.clients))


class RedlockSide:
    """redlock_async: one Lock per resource, ``acquire(blocking=False)`` then ``release()``."""

    name = "redlock_async"

    def __init__(self, redlock: Redlock, slots: int) -> None:
        self.redlock = redlock
        self.locks: list[Lock] = [redlock.lock(f"bench:{i}") for i in range(slots)]
        self.failures = 0  # failed acquires in every op, warm-ups included
        self.failed: list[dict[str, Any]] = []  # the first few of them, for the JSON

    async def cycle(self, slot: int) -> tuple[int, int, bool]:
        lock = self.locks[slot]
        started = perf_ns()
        ok = await lock.acquire(blocking=False)
        acquired = perf_ns()
        if ok:
            await lock.release()
        else:
            self.failures += 1
            record_failure(self.failed, lock, acquired - started)
        return acquired - started, perf_ns() - started, ok


def record_failure(into: list[dict[str, Any]], lock: Lock, acquire_ns: int) -> None:
    """Keep the first few failed acquires (votes and reasons per node) for the report."""
    if len(into) < 10:
        into.append(
            {
                "resource": lock.name,
                "acquire_us": round(us(acquire_ns), 1),
                "votes": [o.vote.value for o in lock.outcomes],
                "details": [o.detail for o in lock.outcomes],
            }
        )


# -- statistics ------------------------------------------------------------------


def p50(samples: Sequence[int]) -> float:
    return float(statistics.median(samples))


def p99(samples: Sequence[int]) -> float:
    if len(samples) < 2:
        return float(samples[0]) if samples else float("nan")
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def us(ns: float) -> float:
    return ns / 1000.0


def median_of(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]  # drop NaN
    return statistics.median(finite) if finite else float("nan")


# -- scenarios ---------------------------------------------------------------------


@dataclass
class Latency:
    ops: int
    failures: int
    acquire_p50_us: float
    acquire_p99_us: float
    cycle_p50_us: float
    cycle_p99_us: float


def latency_of(acquire_ns: Sequence[int], cycle_ns: Sequence[int], failures: int) -> Latency:
    return Latency(
        ops=len(cycle_ns),
        failures=failures,
        acquire_p50_us=us(p50(acquire_ns)),
        acquire_p99_us=us(p99(acquire_ns)),
        cycle_p50_us=us(p50(cycle_ns)),
        cycle_p99_us=us(p99(cycle_ns)),
    )


async def measure_latency(side: Side, cfg: PhaseConfig, slot: int = 0) -> Latency:
    """Sequential acquire+release on one resource: warm up, then time each op."""
    acquire_ns: list[int] = []
    cycle_ns: list[int] = []
    failures = 0
    async with asyncio.timeout(cfg.phase_seconds):
        for _ in range(cfg.warmup_ops):
            await side.cycle(slot)
        gc.collect()
        deadline = perf_ns() + int(cfg.phase_seconds / 2 * 1e9)
        for _ in range(cfg.latency_ops):
            acq, total, ok = await side.cycle(slot)
            acquire_ns.append(acq)
            cycle_ns.append(total)
            failures += not ok
            if perf_ns() > deadline:
                break
    return latency_of(acquire_ns, cycle_ns, failures)


@dataclass
class Throughput:
    ops: int
    failures: int
    seconds: float
    ops_per_s: float
    max_loop_lag_ms: float  # worst lateness of a 5 ms timer during the run (a stalled or starved loop)


async def run_throughput(side: Side, seconds: float, cfg: PhaseConfig, tasks: int = TASKS) -> Throughput:
    """*tasks* workers, each on its own resource (slot), acquire+release in a loop for *seconds*."""
    stop_at = perf_ns() + int(seconds * 1e9)

    async def worker(slot: int) -> tuple[int, int]:
        done = failed = 0
        while done < cfg.max_ops_per_task and perf_ns() < stop_at:
            _, _, ok = await side.cycle(slot)
            done += 1
            failed += not ok
        return done, failed

    started = perf_ns()
    async with asyncio.timeout(seconds + cfg.phase_seconds):
        lag = asyncio.ensure_future(loop_lag(stop_at))
        results = await asyncio.gather(*(worker(slot) for slot in range(tasks)))
        elapsed = (perf_ns() - started) / 1e9
        max_lag = await lag
    ops = sum(done for done, _ in results)
    return Throughput(
        ops=ops,
        failures=sum(f for _, f in results),
        seconds=elapsed,
        ops_per_s=ops / elapsed,
        max_loop_lag_ms=max_lag,
    )


async def measure_throughput(side: Side, cfg: Config) -> Throughput:
    await run_throughput(side, cfg.throughput_warmup_seconds, cfg)  # connections, pools, caches
    gc.collect()
    return await run_throughput(side, cfg.throughput_seconds, cfg)


def _stalled_queue(redlock: Redlock) -> int:
    """Commands sent to the stopped node or waiting to be sent, not yet answered (from ``statistics()``)."""
    return redlock.statistics().nodes[STOPPED].unanswered


@dataclass
class Samples:
    """Raw per-op times of a sequential loop on one lock."""

    acquire_ns: list[int] = field(default_factory=list)
    cycle_ns: list[int] = field(default_factory=list)
    failures: int = 0
    votes: Counter[str] = field(default_factory=Counter)  # the stopped node's vote in each timed acquire
    failed: list[dict[str, Any]] = field(default_factory=list)  # the first few failed acquires
    warmup_failures: int = 0

    def latency(self) -> Latency:
        return latency_of(self.acquire_ns, self.cycle_ns, self.failures)


def _stopped_vote(lock: Lock) -> str:
    outcomes = lock.outcomes
    return outcomes[STOPPED].vote.value if len(outcomes) > STOPPED else "?"


async def _timed_cycles(lock: Lock, warmup: int, ops: int, into: Samples) -> None:
    """Sequential acquire+release of *lock*; the acquire alone and the whole op are timed."""
    for _ in range(warmup):
        started = perf_ns()
        if await lock.acquire(blocking=False):
            await lock.release()
        else:
            into.warmup_failures += 1
            record_failure(into.failed, lock, perf_ns() - started)
    gc.collect()
    for _ in range(ops):
        started = perf_ns()
        ok = await lock.acquire(blocking=False)
        acquired = perf_ns()
        vote = _stopped_vote(lock)  # before release() replaces the outcomes
        if ok:
            await lock.release()
        else:
            record_failure(into.failed, lock, acquired - started)
        into.cycle_ns.append(perf_ns() - started)
        into.acquire_ns.append(acquired - started)
        into.failures += not ok
        into.votes[vote] += 1


async def _fill(redlock: Redlock, locks: Sequence[Lock], cfg: Config) -> tuple[int, float, bool]:
    """Concurrent acquire+release until acquires skip the stalled node (its SETs refused).

    The library refuses them once max_unanswered commands wait on the node (and, since
    ab15679, once it has also been silent for a while): 64 tasks get there fastest.
    Returns (ops, seconds, whether the node was being skipped at the end).
    """
    capped = asyncio.Event()
    started = perf_ns()
    stop_at = started + int(cfg.fill_seconds * 1e9)
    limit = 4 * redlock.settings.max_unanswered

    async def filler(lock: Lock) -> int:
        done = 0
        while not capped.is_set() and done < limit and perf_ns() < stop_at:
            ok = await lock.acquire(blocking=False)
            if _stopped_vote(lock) == "skipped":
                capped.set()
            if ok:
                await lock.release()
            done += 1
        return done

    ops = sum(await asyncio.gather(*(filler(lock) for lock in locks)))
    return ops, (perf_ns() - started) / 1e9, capped.is_set()


async def _drain(redlock: Redlock) -> float:
    """After the resume, wait (bounded) until the node answered its backlog; seconds waited."""
    started = perf_ns()
    deadline = started + int(5e9)
    while perf_ns() < deadline:
        if _stalled_queue(redlock) == 0:
            break
        await asyncio.sleep(0.01)
    return (perf_ns() - started) / 1e9


@dataclass
class Stopped:
    healthy: Latency  # the same lock, in healthy blocks alternating with the stopped ones
    precap: Latency  # the first ops after each pause, before acquires skip the stalled node
    steady: Latency  # the timed ops with the node stopped and its queue full
    stopped_votes: dict[str, int]  # the stopped node's votes in the steady ops
    fill_ops: list[int]  # per pause: concurrent ops until the stalled node's SETs were refused
    fill_seconds: list[float]
    capped: bool  # whether acquires skipped the stalled node before every stopped block
    queued_before: list[int]  # the stalled node's queue when timing started / ended (statistics())
    queued_after: list[int]
    drain_seconds: list[float]
    untimed_failures: int  # failed acquires in the warm-ups
    failed: list[dict[str, Any]]  # the first few failed acquires of this scenario


async def measure_stopped(cluster: LocalNodes, redlock: Redlock, cfg: Config) -> Stopped:
    """SIGSTOP one node; time acquires (and acquire+release) against healthy blocks on the same lock.

    Blocks alternate H S H S ... S H (the node is paused for each S and resumed after it):
    this box is noisy, and a healthy figure from seconds earlier can be off by 2x.
    """
    locks = [redlock.lock(f"bench:stopped:{i}") for i in range(TASKS)]
    lock = redlock.lock("bench:stopped")
    blocks = cfg.stopped_blocks
    healthy, precap, steady = Samples(), Samples(), Samples()
    fills: list[tuple[int, float, bool]] = []
    queued_before: list[int] = []
    queued_after: list[int] = []
    drains: list[float] = []
    async with asyncio.timeout(cfg.phase_seconds):
        await _timed_cycles(lock, cfg.warmup_ops, cfg.stopped_ops // (blocks + 1), healthy)
        for _ in range(blocks):
            cluster[STOPPED].pause()
            try:
                # Right after the pause every acquire still queues a SET on the stalled node.
                await _timed_cycles(lock, 0, cfg.precap_ops, precap)
                fills.append(await _fill(redlock, locks, cfg))
                await _timed_cycles(lock, cfg.block_warmup_ops, 0, steady)
                queued_before.append(_stalled_queue(redlock))
                await _timed_cycles(lock, 0, cfg.stopped_ops // blocks, steady)
                queued_after.append(_stalled_queue(redlock))
            finally:
                cluster[STOPPED].resume()
            drains.append(await _drain(redlock))
            await _timed_cycles(lock, cfg.block_warmup_ops, cfg.stopped_ops // (blocks + 1), healthy)
    return Stopped(
        healthy=healthy.latency(),
        precap=precap.latency(),
        steady=steady.latency(),
        stopped_votes=dict(steady.votes),
        fill_ops=[ops for ops, _, _ in fills],
        fill_seconds=[seconds for _, seconds, _ in fills],
        capped=all(capped for _, _, capped in fills),
        queued_before=queued_before,
        queued_after=queued_after,
        drain_seconds=drains,
        untimed_failures=healthy.warmup_failures + precap.warmup_failures + steady.warmup_failures,
        failed=(healthy.failed + precap.failed + steady.failed)[:10],
    )


# -- rounds and report ---------------------------------------------------------------


@dataclass
class Round:
    order: list[str]
    floor_latency: Latency
    redlock_latency: Latency
    floor_throughput: Throughput
    redlock_throughput: Throughput
    stopped: Stopped
    seconds: float = 0.0
    ratios: dict[str, float] = field(default_factory=dict)


async def run_round(index: int, cluster: LocalNodes, floor: Floor, side: RedlockSide, cfg: Config) -> Round:
    started = perf_ns()
    sides: list[Side] = [floor, side] if index % 2 == 0 else [side, floor]
    latency: dict[str, Latency] = {}
    for s in sides:
        latency[s.name] = await measure_latency(s, cfg)
    throughput: dict[str, Throughput] = {}
    for s in sides:
        throughput[s.name] = await measure_throughput(s, cfg)
    stopped = await measure_stopped(cluster, side.redlock, cfg)
    fl, rl = latency["floor"], latency["redlock_async"]
    ft, rt = throughput["floor"], throughput["redlock_async"]
    result = Round(
        order=[s.name for s in sides],
        floor_latency=fl,
        redlock_latency=rl,
        floor_throughput=ft,
        redlock_throughput=rt,
        stopped=stopped,
    )
    result.ratios = {
        "cycle_p50": rl.cycle_p50_us / fl.cycle_p50_us,
        "cycle_p99": rl.cycle_p99_us / fl.cycle_p99_us,
        "acquire_p50": rl.acquire_p50_us / fl.acquire_p50_us,
        "throughput": rt.ops_per_s / ft.ops_per_s,
        "stopped_acquire_p50_vs_healthy": stopped.steady.acquire_p50_us / rl.acquire_p50_us,
        "stopped_acquire_p99_vs_healthy": stopped.steady.acquire_p99_us / rl.acquire_p99_us,
        "stopped_cycle_p50_vs_healthy": stopped.steady.cycle_p50_us / rl.cycle_p50_us,
        "stopped_acquire_p50_vs_adjacent": stopped.steady.acquire_p50_us / stopped.healthy.acquire_p50_us,
        "stopped_acquire_p99_vs_adjacent": stopped.steady.acquire_p99_us / stopped.healthy.acquire_p99_us,
        "stopped_cycle_p50_vs_adjacent": stopped.steady.cycle_p50_us / stopped.healthy.cycle_p50_us,
    }
    result.seconds = (perf_ns() - started) / 1e9
    return result


async def environment(floor: Floor, redlock: Redlock) -> dict[str, Any]:
    info: dict[str, Any] = await floor.clients[0].info("server")
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
        "redlock_settings": dataclasses.asdict(redlock.settings),
    }


def _most(values: Sequence[int]) -> str:
    return str(max(values)) if values else "?"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    return f"{fmt(min(values))}-{fmt(max(values))}"


def report(rounds: list[Round], env: dict[str, Any], cfg: Config, total_seconds: float) -> dict[str, Any]:
    def med(get: Callable[[Round], float]) -> float:
        return median_of([get(r) for r in rounds])

    def ratio(name: str) -> float:
        return median_of([r.ratios[name] for r in rounds])

    f0 = "{:.0f}".format
    f2 = "{:.2f}".format

    medians = {
        "floor_cycle_p50_us": med(lambda r: r.floor_latency.cycle_p50_us),
        "floor_cycle_p99_us": med(lambda r: r.floor_latency.cycle_p99_us),
        "floor_acquire_p50_us": med(lambda r: r.floor_latency.acquire_p50_us),
        "redlock_cycle_p50_us": med(lambda r: r.redlock_latency.cycle_p50_us),
        "redlock_cycle_p99_us": med(lambda r: r.redlock_latency.cycle_p99_us),
        "redlock_acquire_p50_us": med(lambda r: r.redlock_latency.acquire_p50_us),
        "redlock_acquire_p99_us": med(lambda r: r.redlock_latency.acquire_p99_us),
        "floor_ops_per_s": med(lambda r: r.floor_throughput.ops_per_s),
        "redlock_ops_per_s": med(lambda r: r.redlock_throughput.ops_per_s),
        "stopped_acquire_p50_us": med(lambda r: r.stopped.steady.acquire_p50_us),
        "stopped_acquire_p99_us": med(lambda r: r.stopped.steady.acquire_p99_us),
        "stopped_cycle_p50_us": med(lambda r: r.stopped.steady.cycle_p50_us),
        "stopped_cycle_p99_us": med(lambda r: r.stopped.steady.cycle_p99_us),
        "adjacent_healthy_acquire_p50_us": med(lambda r: r.stopped.healthy.acquire_p50_us),
        "adjacent_healthy_acquire_p99_us": med(lambda r: r.stopped.healthy.acquire_p99_us),
        "adjacent_healthy_cycle_p50_us": med(lambda r: r.stopped.healthy.cycle_p50_us),
        "precap_acquire_p50_us": med(lambda r: r.stopped.precap.acquire_p50_us),
        "precap_cycle_p50_us": med(lambda r: r.stopped.precap.cycle_p50_us),
    }
    ratios = {name: ratio(name) for name in rounds[0].ratios}
    passes = {
        "p50_latency": ratios["cycle_p50"] <= TARGET_P50_RATIO,
        "throughput": ratios["throughput"] >= TARGET_THROUGHPUT_RATIO,
        "stopped_acquire_p50": ratios["stopped_acquire_p50_vs_healthy"] <= TARGET_STOPPED_RATIO,
        "stopped_acquire_p50_adjacent": ratios["stopped_acquire_p50_vs_adjacent"] <= TARGET_STOPPED_RATIO,
    }
    m = medians
    rows = [
        (
            "1. uncontended acquire+release p50 (µs)",
            f0(m["floor_cycle_p50_us"]),
            f0(m["redlock_cycle_p50_us"]),
            f"{f2(ratios['cycle_p50'])}x",
            f"<= {TARGET_P50_RATIO}x floor: {_verdict(passes['p50_latency'])}",
        ),
        (
            "1. uncontended acquire+release p99 (µs)",
            f0(m["floor_cycle_p99_us"]),
            f0(m["redlock_cycle_p99_us"]),
            f"{f2(ratios['cycle_p99'])}x",
            "",
        ),
        (
            "1. uncontended acquire only p50 (µs)",
            f0(m["floor_acquire_p50_us"]),
            f0(m["redlock_acquire_p50_us"]),
            f"{f2(ratios['acquire_p50'])}x",
            "",
        ),
        (
            f"2. throughput, {TASKS} tasks (ops/s)",
            f0(m["floor_ops_per_s"]),
            f0(m["redlock_ops_per_s"]),
            f"{f2(ratios['throughput'])}x",
            f">= {TARGET_THROUGHPUT_RATIO:g}x floor: {_verdict(passes['throughput'])}",
        ),
        (
            f"3. node {STOPPED} stopped: acquire p50 (µs)",
            "not run",
            f0(m["stopped_acquire_p50_us"]),
            f"{f2(ratios['stopped_acquire_p50_vs_healthy'])}x healthy (1.)",
            f"<= {TARGET_STOPPED_RATIO}x healthy: {_verdict(passes['stopped_acquire_p50'])}",
        ),
        (
            "3. same, vs adjacent healthy acquire p50 (µs)",
            "not run",
            f0(m["adjacent_healthy_acquire_p50_us"]),
            f"{f2(ratios['stopped_acquire_p50_vs_adjacent'])}x adjacent",
            f"<= {TARGET_STOPPED_RATIO}x healthy: {_verdict(passes['stopped_acquire_p50_adjacent'])}",
        ),
        (
            f"3. node {STOPPED} stopped: acquire p99 (µs)",
            "not run",
            f0(m["stopped_acquire_p99_us"]),
            f"{f2(ratios['stopped_acquire_p99_vs_healthy'])}x healthy (1.), "
            f"{f2(ratios['stopped_acquire_p99_vs_adjacent'])}x adjacent",
            "",
        ),
        (
            f"3. node {STOPPED} stopped: acquire+release p50 (µs)",
            "not run",
            f0(m["stopped_cycle_p50_us"]),
            f"{f2(ratios['stopped_cycle_p50_vs_healthy'])}x healthy (1.), "
            f"{f2(ratios['stopped_cycle_p50_vs_adjacent'])}x adjacent",
            "",
        ),
        (
            f"3. node {STOPPED} stopped, first {cfg.precap_ops} ops per pause: acquire / acquire+release p50 (µs)",
            "not run",
            f"{f0(m['precap_acquire_p50_us'])} / {f0(m['precap_cycle_p50_us'])}",
            "",
            "before acquires skip the stalled node",
        ),
    ]
    print()
    print(f"## redlock_async core benchmark ({'quick' if cfg is QUICK else 'full'}, {len(rounds)} rounds)")
    print()
    print(
        f"python {env['python']} ({env['implementation']}), redis-py {env['redis_py']} (hiredis {env['hiredis']}), "
        f"server {env['server']}, cpu_count {env['cpu_count']} (affinity {env['cpu_affinity']}), "
        f"{env['nodes']} nodes, {env['event_loop']}, {env['platform']}, redlock_async at {env['commit']}"
    )
    print()
    print("| scenario | floor | redlock_async | ratio | target |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print(
        "Medians over rounds; each ratio is redlock_async/floor (or stopped/healthy) within a round, median over "
        "rounds. 'healthy (1.)' is scenario 1's acquire p50 of the same round; 'adjacent' is the same lock timed in "
        f"healthy blocks alternating with the {cfg.stopped_blocks} stopped blocks of the round (H S H ... S H), far "
        "less exposed to this noisy box's drift. The floor is not run with a node stopped: its gather on all 5 "
        "nodes would hang (no socket timeout)."
    )
    print()
    print("Per round (variance):")
    print()
    print(
        "| round | order | floor p50/p99 µs | redlock p50/p99 µs | floor ops/s (max lag ms) | redlock ops/s (lag) "
        "| healthy acq p50 (1. / adjacent) µs | stopped acq p50/p99 µs | stopped acq+rel p50 µs "
        "| fill ops per pause (s) | stalled queue before/after | stalled votes | round s |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for i, r in enumerate(rounds):
        s = r.stopped
        print(
            f"| {i + 1} | {'>'.join(r.order)} "
            f"| {f0(r.floor_latency.cycle_p50_us)}/{f0(r.floor_latency.cycle_p99_us)} "
            f"| {f0(r.redlock_latency.cycle_p50_us)}/{f0(r.redlock_latency.cycle_p99_us)} "
            f"| {f0(r.floor_throughput.ops_per_s)} ({f0(r.floor_throughput.max_loop_lag_ms)}) "
            f"| {f0(r.redlock_throughput.ops_per_s)} ({f0(r.redlock_throughput.max_loop_lag_ms)}) "
            f"| {f0(r.redlock_latency.acquire_p50_us)} / {f0(s.healthy.acquire_p50_us)} "
            f"| {f0(s.steady.acquire_p50_us)}/{f0(s.steady.acquire_p99_us)} | {f0(s.steady.cycle_p50_us)} "
            f"| {'/'.join(map(str, s.fill_ops))} ({sum(s.fill_seconds):.2f}){'' if s.capped else ' NOT CAPPED'} "
            f"| {_most(s.queued_before)}/{_most(s.queued_after)} "
            f"| {', '.join(f'{k} {v}' for k, v in sorted(s.stopped_votes.items()))} | {r.seconds:.1f} |"
        )
    print()
    spreads = {
        "redlock p50": _spread([r.redlock_latency.cycle_p50_us for r in rounds], f0),
        "floor p50": _spread([r.floor_latency.cycle_p50_us for r in rounds], f0),
        "p50 ratio": _spread([r.ratios["cycle_p50"] for r in rounds], f2),
        "throughput ratio": _spread([r.ratios["throughput"] for r in rounds], f2),
        "stopped/healthy": _spread([r.ratios["stopped_acquire_p50_vs_healthy"] for r in rounds], f2),
        "stopped/adjacent": _spread([r.ratios["stopped_acquire_p50_vs_adjacent"] for r in rounds], f2),
    }
    print("Range over rounds: " + "; ".join(f"{k} {v}" for k, v in spreads.items()))
    failed_by = {
        "floor latency": sum(r.floor_latency.failures for r in rounds),
        "redlock latency": sum(r.redlock_latency.failures for r in rounds),
        "floor throughput": sum(r.floor_throughput.failures for r in rounds),
        "redlock throughput": sum(r.redlock_throughput.failures for r in rounds),
        "stopped": sum(r.stopped.precap.failures + r.stopped.steady.failures for r in rounds),
        "stopped's healthy blocks": sum(r.stopped.healthy.failures for r in rounds),
    }
    failures = sum(failed_by.values())
    detail = ", ".join(f"{k} {v}" for k, v in failed_by.items() if v)
    detail = f" ({detail})" if detail else ""
    untimed = env.get("all_failures", {})
    print(
        f"Failed acquires in timed ops: {failures}{detail}; in all ops, warm-ups included: {untimed}. "
        f"Keys left on the nodes: {env.get('keys_left')}."
    )
    examples = env.get("redlock_failures", []) + [f for r in rounds for f in r.stopped.failed]
    for example in examples[:1]:
        print(f"First failed redlock_async acquire: {example}")
    print(f"Total {total_seconds:.1f} s.")
    return {
        "config": dataclasses.asdict(cfg),
        "environment": env,
        "medians": medians,
        "ratios": ratios,
        "targets": {
            "p50_latency_ratio_max": TARGET_P50_RATIO,
            "throughput_ratio_min": TARGET_THROUGHPUT_RATIO,
            "stopped_acquire_p50_ratio_max": TARGET_STOPPED_RATIO,
        },
        "pass": passes,
        "failed_acquires": failures,
        "total_seconds": total_seconds,
        "rounds": [dataclasses.asdict(r) for r in rounds],
    }


async def bench(cluster: LocalNodes, cfg: Config) -> tuple[list[Round], dict[str, Any]]:
    floor = Floor(cluster.urls, TASKS)
    try:
        async with Redlock(cluster.urls) as redlock:
            side = RedlockSide(redlock, TASKS)
            env = await environment(floor, redlock)
            rounds: list[Round] = []
            for index in range(cfg.rounds):
                result = await run_round(index, cluster, floor, side, cfg)
                rounds.append(result)
                print(
                    f"round {index + 1}/{cfg.rounds}: {result.seconds:.1f} s, p50 ratio "
                    f"{result.ratios['cycle_p50']:.2f}x, throughput ratio {result.ratios['throughput']:.2f}x, "
                    f"stopped/healthy {result.ratios['stopped_acquire_p50_vs_healthy']:.2f}x "
                    f"(adjacent {result.ratios['stopped_acquire_p50_vs_adjacent']:.2f}x)",
                    file=sys.stderr,
                    flush=True,
                )
            # Every lease was released (the stalled node's backlog too, once resumed): nothing is left.
            # (The restart-quarantine marker, a key named after the prefix, stays by design.)
            env["keys_left"] = []
            for client in floor.clients:
                names = [key if isinstance(key, bytes) else key.encode() for key in await client.keys("*")]
                env["keys_left"].append(len([name for name in names if not name.endswith(b":")]))
            env["floor_failures"] = floor.failed
            env["redlock_failures"] = side.failed
            env["all_failures"] = {
                "floor": floor.failures,
                "redlock_async": side.failures
                + sum(
                    r.stopped.untimed_failures
                    + r.stopped.precap.failures
                    + r.stopped.steady.failures
                    + r.stopped.healthy.failures
                    for r in rounds
                ),
            }
            return rounds, env
    finally:
        await floor.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="~5x smaller, for CI smoke runs (< 30 s)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the raw figures to PATH")
    add_loop_option(parser, both=True)
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    loops = ["asyncio", "uvloop"] if args.loop == "both" else [args.loop]
    results = {}
    with LocalNodes(NODES) as cluster:
        for loop in loops:  # one run, the same servers: both loops against the same floor's machine
            started = perf_ns()
            try:
                rounds, env = run_on(loop, bench(cluster, cfg))
            finally:
                for node in cluster:
                    node.resume()
            results[loop] = report(rounds, env, cfg, (perf_ns() - started) / 1e9)
    if args.json is not None:
        data = results[loops[0]] if len(loops) == 1 else results
        args.json.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
