"""Peer comparison: redlock_async against the raw redis-py floor, aioredlock, pottery and redis-py's Lock.

Usage::

    python benchmarks/compare.py            # full run (< 4 min on 2 cores), writes docs/
    python benchmarks/compare.py --quick    # smoke run (< 60 s), prints only
    pip install '.[bench]'                  # the peers and matplotlib

One run starts ``LocalNodes(9)`` (real valkey-server processes on 127.0.0.1);
scenarios 1-4 use the first 5 nodes, scenario 5 the first N. The libraries are
interleaved within each repeat (their order rotates from repeat to repeat), and
every figure is the median over the repeats; a ratio to the floor is taken
within each repeat, then the median over repeats. Scenarios:

1. uncontended acquire+release latency p50/p99 (sequential, one resource);
2. throughput: 64 tasks on distinct resources, acquire+release in a loop;
3. contended hand-off: 8 tasks, one resource, ~1 ms critical section, each
   library's own blocking acquire (``async with``) with its default retries;
4. one node stopped (SIGSTOP): acquire latency, with a bound per op, so a
   library that waits for every node shows as "hangs";
5. uncontended acquire+release p50 against the node count, N = 1, 3, 5, 7, 9,
   with a *wire* reference (blocking sockets, no event loop, no library): how
   the machine itself scales with N.

Every library runs with its documented defaults, and a 10 s lease. A peer that
is not installed, errs, hangs or gives a wrong result says so in its cells.
The full run also profiles redlock_async's uncontended loop (cProfile).

The same page's table of redlock_async against a raw-Protocol reference client (bench_machine.py)
is not this script's: benchmarks/report.py renders it from docs/performance.json, between its own
markers, which this script's rewrite leaves alone.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import gc
import importlib
import importlib.metadata
import itertools
import math
import os
import platform
import pstats
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from _common import library_commit, loop_lag
from _peers import PEERS, Handle, Peer, RedisPyLock, Wire

from redlock_async import Redlock
from redlock_async.testing import LocalNodes

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
PNG = ROOT / "docs" / "img" / "compare.png"
DEV_LOG = ROOT / "docs" / "development-log.md"
"""The profile goes here: it is for whoever works on the library, not for choosing one."""
BEGIN = "<!-- compare.py: generated from here to the end marker; rerun to refresh -->"
END = "<!-- compare.py: end -->"

NODES = 5  # scenarios 1-4
STOPPED = 4  # the node SIGSTOPped in scenario 4
NODE_COUNTS = (1, 3, 5, 7, 9)  # scenario 5
TASKS = 64  # scenario 2
CONTENDERS = 8  # scenario 3
CRITICAL_S = 0.001  # scenario 3's critical section

FLOOR = "floor"
REDLOCK = "redlock_async"
NAMES = [peer.name for peer in PEERS if not peer.nodes_only]  # scenarios 1-4
NODES_NAMES = [peer.name for peer in PEERS]  # scenario 5 adds the wire reference

perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class Config:
    name: str
    repeats: int  # scenarios 1 and 2
    latency_ops: int  # timed sequential ops per library per repeat (scenario 1)
    latency_blocks: int  # ... split into this many interleaved blocks
    warmup_ops: int  # untimed ops before each library's first block of a repeat
    throughput_seconds: float
    throughput_warmup_seconds: float
    max_ops_per_task: int
    contended_repeats: int
    contended_seconds: float  # the window in which grants are counted
    drain_seconds: float  # bound on the waiters' last grants after the window
    max_grants_per_task: int
    stopped_repeats: int
    stopped_ops: int  # timed acquires per library with the node stopped
    stopped_warmup_ops: int
    op_timeout: float  # bound on one acquire or release with the node stopped ("hangs" past it)
    nodes_repeats: int
    nodes_ops: int
    nodes_warmup_ops: int
    profile_ops: int
    block_seconds: float  # bound on any one library's block
    scenario_seconds: float  # bound on a whole scenario (asyncio.timeout)


FULL = Config(
    name="full",
    repeats=5,
    latency_ops=400,
    latency_blocks=2,
    warmup_ops=50,
    throughput_seconds=1.0,
    throughput_warmup_seconds=0.2,
    max_ops_per_task=100_000,
    contended_repeats=3,
    contended_seconds=2.5,
    drain_seconds=5.0,
    max_grants_per_task=5_000,
    stopped_repeats=3,
    stopped_ops=300,
    stopped_warmup_ops=10,
    op_timeout=2.0,
    nodes_repeats=5,
    nodes_ops=200,
    nodes_warmup_ops=30,
    profile_ops=2000,
    block_seconds=30.0,
    scenario_seconds=150.0,
)
QUICK = Config(
    name="quick",
    repeats=2,
    latency_ops=150,
    latency_blocks=1,
    warmup_ops=20,
    throughput_seconds=0.4,
    throughput_warmup_seconds=0.1,
    max_ops_per_task=20_000,
    contended_repeats=1,
    contended_seconds=1.2,
    drain_seconds=3.0,
    max_grants_per_task=2_000,
    stopped_repeats=1,
    stopped_ops=100,
    stopped_warmup_ops=5,
    op_timeout=1.0,
    nodes_repeats=1,
    nodes_ops=60,
    nodes_warmup_ops=10,
    profile_ops=500,
    block_seconds=15.0,
    scenario_seconds=40.0,
)


# -- results ---------------------------------------------------------------------


@dataclass
class Outcome:
    """One library's figures in one repeat of one scenario, or what went wrong."""

    values: dict[str, float] = field(default_factory=dict)
    problem: str | None = None  # "hangs: ...", "errors: ...", "wrong result: ...", "not installed: ..."
    note: str = ""  # something to show next to the figures (not a failure)
    samples: dict[str, list[int]] = field(default_factory=dict)  # sparse samples, pooled over repeats


Results = dict[str, dict[str, list[Outcome]]]  # scenario key -> library -> one Outcome per repeat


def short(text: str, limit: int = 140) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    return short(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


async def guarded(run: Callable[[], Awaitable[Outcome]], bound: float) -> Outcome:
    """Run one library's block under a time bound; a hang or an exception becomes the Outcome's problem."""
    timeout = asyncio.timeout(bound)
    try:
        async with timeout:
            return await run()
    except TimeoutError as exc:
        if timeout.expired():
            return Outcome(problem=f"hangs: no result within {bound:g} s")
        return Outcome(problem=f"errors: {describe(exc)}")
    except Exception as exc:  # a peer may raise anything: that is the finding
        return Outcome(problem=f"errors: {describe(exc)}")


def rotated(names: Sequence[str], index: int) -> list[str]:
    k = index % len(names)
    return list(names[k:]) + list(names[:k])


# -- statistics ------------------------------------------------------------------


def p50(samples: Sequence[int]) -> float:
    return float(statistics.median(samples)) if samples else float("nan")


def p99(samples: Sequence[int]) -> float:
    if len(samples) < 2:
        return float(samples[0]) if samples else float("nan")
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def median(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else float("nan")


# -- scenario 1 and 5: sequential latency ---------------------------------------------


@dataclass
class Samples:
    acquire_ns: list[int] = field(default_factory=list)
    cycle_ns: list[int] = field(default_factory=list)
    refused: int = 0
    why: str = ""  # the library's word on the first refusal


async def sequential(handle: Handle, warmup: int, ops: int, into: Samples) -> None:
    """acquire (one attempt) + release on one resource, *ops* times; each acquire and whole op timed."""
    for _ in range(warmup):
        if await handle.try_acquire():
            await handle.release()
    gc.collect()
    for _ in range(ops):
        started = perf_ns()
        ok = await handle.try_acquire()
        acquired = perf_ns()
        if ok:
            await handle.release()
        else:
            into.refused += 1
            if not into.why:
                into.why = f"first after {(acquired - started) / 1e6:.0f} ms: {handle.diagnose()}"
        into.cycle_ns.append(perf_ns() - started)
        into.acquire_ns.append(acquired - started)


def latency_outcome(samples: Samples) -> Outcome:
    outcome = Outcome(
        values={
            "cycle_p50_us": p50(samples.cycle_ns) / 1000,
            "cycle_p99_us": p99(samples.cycle_ns) / 1000,
            "acquire_p50_us": p50(samples.acquire_ns) / 1000,
            "acquire_p99_us": p99(samples.acquire_ns) / 1000,
            "ops": len(samples.cycle_ns),
        }
    )
    if samples.refused:
        outcome.problem = (
            f"wrong result: {samples.refused}/{len(samples.cycle_ns)} uncontended acquires refused ({samples.why})"
        )
    return outcome


async def run_latency(peers: dict[str, Peer], cfg: Config, results: Results, key: str, repeat: int) -> None:
    names = list(peers)
    handles = {name: peers[name].handle(f"{key}:lat") for name in names}
    samples = {name: Samples() for name in names}
    failed: dict[str, Outcome] = {}
    per_block = max(1, cfg.latency_ops // cfg.latency_blocks)
    for block in range(cfg.latency_blocks):
        order = rotated(names, repeat + block)
        for name in order:
            if name in failed:
                continue
            warmup = cfg.warmup_ops if block == 0 else 0

            async def run(name: str = name, warmup: int = warmup) -> Outcome:
                await sequential(handles[name], warmup, per_block, samples[name])
                return Outcome()

            outcome = await guarded(run, cfg.block_seconds)
            if outcome.problem:
                failed[name] = outcome
    for name in names:
        results.setdefault(key, {}).setdefault(name, []).append(failed.get(name) or latency_outcome(samples[name]))


# -- scenario 2: throughput -------------------------------------------------------------


async def throughput(handles: Sequence[Handle], seconds: float, cfg: Config) -> Outcome:
    stop_at = perf_ns() + int(seconds * 1e9)
    why: list[str] = []

    async def worker(handle: Handle) -> tuple[int, int]:
        done = refused = 0
        while done < cfg.max_ops_per_task and perf_ns() < stop_at:
            started = perf_ns()
            if await handle.try_acquire():
                await handle.release()
            else:
                refused += 1
                if not why:
                    why.append(f"first after {(perf_ns() - started) / 1e6:.0f} ms: {handle.diagnose()}")
            done += 1
        return done, refused

    started = perf_ns()
    lag = asyncio.ensure_future(loop_lag(stop_at))
    counts = await asyncio.gather(*(worker(h) for h in handles))
    elapsed = (perf_ns() - started) / 1e9
    max_lag = await lag
    ops = sum(done for done, _ in counts)
    refused = sum(r for _, r in counts)
    outcome = Outcome(values={"ops_per_s": ops / elapsed, "ops": ops, "max_lag_ms": max_lag})
    if refused:
        outcome.problem = (
            f"wrong result: {refused}/{ops} acquires on free resources refused (loop lag up to {max_lag:.0f} ms; "
            f"{why[0] if why else ''})"
        )
    return outcome


async def run_throughput(peers: dict[str, Peer], cfg: Config, results: Results, repeat: int) -> None:
    for name in rotated(list(peers), repeat):
        handles = [peers[name].handle(f"tp:{slot}") for slot in range(TASKS)]

        async def run(handles: list[Handle] = handles) -> Outcome:
            await throughput(handles, cfg.throughput_warmup_seconds, cfg)  # connections, pools, caches
            gc.collect()
            return await throughput(handles, cfg.throughput_seconds, cfg)

        outcome = await guarded(run, cfg.throughput_seconds + cfg.throughput_warmup_seconds + cfg.block_seconds)
        results.setdefault("throughput", {}).setdefault(name, []).append(outcome)


# -- scenario 3: contended hand-off -------------------------------------------------------


async def contended(peer: Peer, resource: str, cfg: Config) -> Outcome:
    """8 tasks take turns on one resource with the library's blocking acquire; every grant timestamped."""
    handles = [peer.handle(resource) for _ in range(CONTENDERS)]
    events: list[tuple[int, int, int]] = []  # (granted, left: the body ended and release begins, task)
    inside = 0
    overlaps = 0
    gave_up_before = peer.gave_up
    started = perf_ns()
    stop_at = started + int(cfg.contended_seconds * 1e9)

    async def worker(task: int) -> None:
        nonlocal inside, overlaps
        handle = handles[task]
        for _ in range(cfg.max_grants_per_task):
            if perf_ns() >= stop_at:
                return
            async with handle.hold():
                granted = perf_ns()
                overlaps += inside > 0  # another holder is inside: mutual exclusion broken
                inside += 1
                try:
                    await asyncio.sleep(CRITICAL_S)
                finally:
                    inside -= 1
                    left = perf_ns()
            events.append((granted, left, task))

    tasks = [asyncio.create_task(worker(i), name=f"contender {i}") for i in range(CONTENDERS)]
    _, pending = await asyncio.wait(tasks, timeout=cfg.contended_seconds + cfg.drain_seconds)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    errors = [exc for t in tasks if t not in pending and (exc := t.exception()) is not None]
    events.sort()
    in_window = [e for e in events if e[0] <= stop_at]
    handoffs = [cur[0] - prev[1] for prev, cur in itertools.pairwise(in_window)]
    to_other = [cur[0] - prev[1] for prev, cur in itertools.pairwise(in_window) if prev[2] != cur[2]]
    changes = len(to_other)
    per_task = Counter(e[2] for e in in_window)
    window = (min(perf_ns(), stop_at) - started) / 1e9
    outcome = Outcome(
        values={
            "grants": len(in_window),
            "grants_per_s": len(in_window) / window,
            "handoff_p50_ms": p50(handoffs) / 1e6,
            "handoff_p99_ms": p99(handoffs) / 1e6,
            "other_task_pct": 100.0 * changes / len(handoffs) if handoffs else float("nan"),
            "task_min": min(per_task.get(i, 0) for i in range(CONTENDERS)),
            "task_max": max(per_task.values(), default=0),
            "gave_up": peer.gave_up - gave_up_before,
            "overlaps": overlaps,
            "stuck": len(pending),
        },
        samples={"handoff_other_ns": to_other},
    )
    if overlaps:
        outcome.problem = f"wrong result: {overlaps} grants while another task held the lock"
    elif errors:
        outcome.problem = f"errors: {describe(errors[0])}" + (f" (x{len(errors)})" if len(errors) > 1 else "")
    elif not in_window:
        outcome.problem = f"hangs: no grant in {cfg.contended_seconds:g} s"
    if pending:
        outcome.note = f"{len(pending)} tasks still waiting {cfg.drain_seconds:g} s after the window (cancelled)"
    return outcome


async def run_contended(peers: dict[str, Peer], cfg: Config, results: Results, repeat: int) -> None:
    for name in rotated(list(peers), repeat):

        async def run(peer: Peer = peers[name]) -> Outcome:
            return await contended(peer, f"contended:{repeat}", cfg)

        outcome = await guarded(run, cfg.contended_seconds + cfg.drain_seconds + cfg.block_seconds)
        results.setdefault("contended", {}).setdefault(name, []).append(outcome)


# -- scenario 4: one node stopped -----------------------------------------------------------


async def stopped_block(handle: Handle, cfg: Config) -> Outcome:
    """Sequential acquires with the node stopped, each acquire and release bounded by op_timeout."""
    samples = Samples()
    for i in range(cfg.stopped_warmup_ops + cfg.stopped_ops):
        started = perf_ns()
        phase = "acquire"
        try:
            async with asyncio.timeout(cfg.op_timeout):
                ok = await handle.try_acquire()
            acquired = perf_ns()
            phase = "release"
            if ok:
                async with asyncio.timeout(cfg.op_timeout):
                    await handle.release()
        except TimeoutError:
            outcome = latency_outcome(samples) if samples.cycle_ns else Outcome()
            outcome.problem = f"hangs: {phase} #{i + 1} got no answer within {cfg.op_timeout:g} s"
            return outcome
        if i < cfg.stopped_warmup_ops:
            continue
        if not ok:
            samples.refused += 1
            samples.why = samples.why or handle.diagnose()
        samples.acquire_ns.append(acquired - started)
        samples.cycle_ns.append(perf_ns() - started)
    outcome = latency_outcome(samples)
    if samples.refused:
        outcome.problem = (
            f"wrong result: {samples.refused}/{len(samples.cycle_ns)} acquires refused with 4 of 5 nodes up "
            f"({samples.why})"
        )
    return outcome


async def recovered(handle: Handle, cfg: Config) -> str:
    """After the resume: does one acquire+release work again?"""
    try:
        async with asyncio.timeout(cfg.op_timeout * 2):
            ok = await handle.try_acquire()
            if ok:
                await handle.release()
    except TimeoutError:
        return f"still hangs ({cfg.op_timeout * 2:g} s)"
    except Exception as exc:
        return f"errors: {describe(exc)}"
    return "ok" if ok else "refused"


async def run_stopped(cluster: LocalNodes, peers: dict[str, Peer], cfg: Config, results: Results, repeat: int) -> None:
    outcomes: dict[str, Outcome] = {}
    # A healthy block of each library right before the pause: the reference for its stopped figures
    # (this box drifts: a healthy figure from minutes earlier can be off by 1.5x).
    healthy: dict[str, float] = {}
    for name in rotated(list(peers), repeat):
        samples = Samples()
        reference_handle = peers[name].handle(f"stopped:{repeat}")

        async def warm(handle: Handle = reference_handle, samples: Samples = samples) -> Outcome:
            await sequential(handle, cfg.stopped_warmup_ops, cfg.stopped_ops // 2, samples)
            return latency_outcome(samples)

        reference = await guarded(warm, cfg.block_seconds)
        healthy[name] = reference.values.get("acquire_p50_us", float("nan")) if not reference.problem else float("nan")
    cluster[STOPPED].pause()
    try:
        for name in rotated(list(peers), repeat):
            handle = peers[name].handle(f"stopped:{repeat}")

            async def run(handle: Handle = handle) -> Outcome:
                return await stopped_block(handle, cfg)

            outcomes[name] = await guarded(run, cfg.op_timeout * 2 + cfg.block_seconds)
    finally:
        cluster[STOPPED].resume()
    await asyncio.sleep(0.5)  # let the backlogs drain
    for name in peers:
        after = await recovered(peers[name].handle(f"stopped:{repeat}:after"), cfg)
        outcomes[name].note = f"after resume: {after}"
        outcomes[name].values["healthy_acquire_p50_us"] = healthy.get(name, float("nan"))
        outcomes[name].values["floor_healthy_acquire_p50_us"] = healthy.get(FLOOR, float("nan"))
        results.setdefault("stopped", {}).setdefault(name, []).append(outcomes[name])


# -- the run -------------------------------------------------------------------------


async def open_peers(
    urls: Sequence[str], results_note: dict[str, str], *, single: bool = True, references: bool = False
) -> dict[str, Peer]:
    """Every available peer, connected; the others are noted with why (not installed, errors).

    *references*: also the scenario-5-only references (the wire)."""
    peers: dict[str, Peer] = {}
    for cls in PEERS:
        if (cls.single_node and not single) or (cls.nodes_only and not references):
            continue
        reason = cls.unavailable()
        if reason is None:
            peer = cls(urls)
            try:
                async with asyncio.timeout(10):
                    await peer.open()
            except Exception as exc:
                reason = f"errors at connect: {describe(exc)}"
                await close_peer(peer)
            else:
                peers[cls.name] = peer
        if reason is not None:
            results_note[cls.name] = reason
    return peers


async def close_peer(peer: Peer) -> None:
    try:
        async with asyncio.timeout(5):
            await peer.aclose()
    except Exception as exc:  # closing a peer that failed: report, don't mask the run
        print(f"closing {peer.name}: {describe(exc)}", file=sys.stderr)


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def scenario(
    title: str, cfg: Config, body: Callable[[], Awaitable[None]], problems: dict[str, str], key: str
) -> float:
    started = perf_ns()
    timeout = asyncio.timeout(cfg.scenario_seconds)
    try:
        async with timeout:
            await body()
    except TimeoutError:
        if not timeout.expired():
            raise
        problems[key] = f"scenario stopped at its {cfg.scenario_seconds:g} s bound"
    seconds = (perf_ns() - started) / 1e9
    progress(f"{title}: {seconds:.1f} s")
    return seconds


@dataclass
class Run:
    cfg: Config
    results: Results = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # library -> why it is not in the run
    scenario_problems: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)
    profile: str = ""
    total_seconds: float = 0.0


async def bench(cluster: LocalNodes, cfg: Config, profile: bool) -> Run:
    run = Run(cfg)
    urls = cluster.urls
    peers = await open_peers(urls[:NODES], run.unavailable)
    run.env = await environment(urls[0])
    for cls in PEERS:
        try:
            run.defaults[cls.name] = cls(urls).defaults() if cls.name not in run.unavailable else ""
        except Exception as exc:
            run.defaults[cls.name] = f"(could not read: {describe(exc)})"
    try:

        async def s1() -> None:
            for r in range(cfg.repeats):
                await run_latency(peers, cfg, run.results, "latency", r)

        async def s2() -> None:
            for r in range(cfg.repeats):
                await run_throughput(peers, cfg, run.results, r)

        async def s3() -> None:
            for r in range(cfg.contended_repeats):
                await run_contended(peers, cfg, run.results, r)

        async def s4() -> None:
            for r in range(cfg.stopped_repeats):
                await run_stopped(cluster, peers, cfg, run.results, r)

        run.seconds["latency"] = await scenario("1. uncontended latency", cfg, s1, run.scenario_problems, "latency")
        run.seconds["throughput"] = await scenario("2. throughput", cfg, s2, run.scenario_problems, "throughput")
        run.seconds["contended"] = await scenario("3. contended", cfg, s3, run.scenario_problems, "contended")
        run.seconds["nodes"] = await scenario(
            "5. node count", cfg, lambda: run_nodes(urls, cfg, run), run.scenario_problems, "nodes"
        )
        # Last: a stopped node may leave a peer broken (that is reported, and must not spoil the rest).
        run.seconds["stopped"] = await scenario("4. node stopped", cfg, s4, run.scenario_problems, "stopped")
        if profile:
            started = perf_ns()
            run.profile = await profile_redlock(urls[:NODES], cfg)
            run.seconds["profile"] = (perf_ns() - started) / 1e9
            progress(f"profile: {run.seconds['profile']:.1f} s")
    finally:
        for peer in peers.values():
            await close_peer(peer)
    return run


async def run_nodes(urls: Sequence[str], cfg: Config, run: Run) -> None:
    """Scenario 5: one instance of each multi-node library per N; redis-py's Lock once, at N=1."""
    sets: dict[int, dict[str, Peer]] = {}
    try:
        for n in NODE_COUNTS:
            ignored: dict[str, str] = {}
            sets[n] = await open_peers(urls[:n], ignored, single=n == 1, references=True)
            for name, why in ignored.items():
                if name not in run.unavailable:
                    run.results.setdefault(f"nodes:{n}", {}).setdefault(name, []).append(Outcome(problem=why))
        for r in range(cfg.nodes_repeats):
            counts = NODE_COUNTS if r % 2 == 0 else tuple(reversed(NODE_COUNTS))
            for n in counts:
                peers = sets[n]
                names = rotated(list(peers), r)
                for name in names:

                    async def one(peer: Peer = peers[name], n: int = n) -> Outcome:
                        samples = Samples()
                        await sequential(peer.handle(f"nodes:{n}"), cfg.nodes_warmup_ops, cfg.nodes_ops, samples)
                        return latency_outcome(samples)

                    outcome = await guarded(one, cfg.block_seconds)
                    run.results.setdefault(f"nodes:{n}", {}).setdefault(name, []).append(outcome)
    finally:
        for peers in sets.values():
            for peer in peers.values():
                await close_peer(peer)


# -- profile ---------------------------------------------------------------------------


def category(filename: str, function: str) -> str:
    """Where a profiled function's self time belongs."""
    path = filename.replace("\\", "/")
    if "/redlock_async/" in path:
        return "redlock_async"
    if "hiredis" in function or "/redis/_parsers/" in path:
        return "redis-py parsing (hiredis)"
    if "/redis/" in path:
        return "redis-py connection (other)"
    if function.startswith(("<method 'poll' of 'select.", "<method 'select' of 'select.")):
        return "waiting in epoll (servers answering)"
    if "/asyncio/" in path or "_asyncio" in function or "_contextvars" in function or "selectors.py" in path:
        return "asyncio event loop"
    if "socket" in function or "sock_" in function or "/socket.py" in path or "_ssl" in function:
        return "socket syscalls"
    if "/benchmarks/" in path:
        return "benchmark loop"
    return "other (stdlib, builtins)"


async def profile_redlock(urls: Sequence[str], cfg: Config) -> str:
    """cProfile of redlock_async's uncontended acquire(blocking=False)+release loop; a markdown summary."""
    async with Redlock(urls) as rl:
        lock = rl.lock("profile")

        async def loop(ops: int) -> float:
            started = perf_ns()
            for _ in range(ops):
                if await lock.acquire(blocking=False):
                    await lock.release()
            return (perf_ns() - started) / 1e3 / ops

        await loop(200)
        gc.collect()
        plain_us = await loop(cfg.profile_ops)
        profiler = cProfile.Profile()
        profiler.enable()
        profiled_us = await loop(cfg.profile_ops)
        profiler.disable()
    stats = pstats.Stats(profiler)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]  # (file, line, func) -> (cc, nc, tt, ct, callers)
    rows = [(tt, nc, fn) for fn, (_, nc, tt, _, _) in raw.items()]
    total = sum(tt for tt, _, _ in rows)
    by_cat: Counter[str] = Counter()
    for tt, _, (filename, _, function) in rows:
        by_cat[category(filename, function)] += tt
    busy = total - by_cat["waiting in epoll (servers answering)"]

    def calls(name: str, where: str = "base_events") -> float:
        """Calls per op of the function *name* (in a file containing *where*; "~" for builtins)."""
        found: int = sum(nc for _, nc, (filename, _, function) in rows if function == name and where in filename)
        return found / cfg.profile_ops

    sends = calls("<method 'send' of '_socket.socket' objects>", "~")
    per_op = (
        f"Per acquire+release: {sends:.1f} socket sends, {calls('create_future'):.1f} futures created, "
        f"{calls('call_soon'):.1f} callbacks scheduled (`call_soon`), {calls('_run_once'):.1f} event-loop "
        "iterations."
    )
    lines = [
        f"cProfile of {cfg.profile_ops} sequential `acquire(blocking=False)` + `release()` on {len(urls)} nodes "
        f"(one resource): {plain_us:.0f} µs per op unprofiled, {profiled_us:.0f} µs under cProfile "
        "(its overhead inflates small Python functions; the shares are indicative).",
        "",
        per_op,
        "",
        "| where | self time | % of all | % of CPU (without epoll wait) |",
        "|---|---:|---:|---:|",
    ]
    for cat, tt in by_cat.most_common():
        share_busy = "" if cat.startswith("waiting") else f"{100 * tt / busy:.1f}%"
        lines.append(f"| {cat} | {tt * 1e3:.0f} ms | {100 * tt / total:.1f}% | {share_busy} |")
    lines += [
        "",
        "Top functions by self time:",
        "",
        "| function | calls | self ms | % | where |",
        "|---|---:|---:|---:|---|",
    ]
    for tt, nc, (filename, line, function) in sorted(rows, reverse=True)[:15]:
        where = filename if filename == "~" else _short_path(filename) + f":{line}"
        lines.append(
            f"| `{short(function, 70)}` | {nc} | {tt * 1e3:.0f} | {100 * tt / total:.1f}% | "
            f"{category(filename, function)}: `{where}` |"
        )
    return "\n".join(lines)


def _short_path(filename: str) -> str:
    path = filename.replace("\\", "/")
    for marker in ("/site-packages/", "/lib/python3.", "/work/main/"):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3." else tail
    return path


# -- environment ------------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


async def environment(url: str) -> dict[str, str]:
    client = aioredis.Redis.from_url(url)
    try:
        info: dict[str, Any] = await client.info("server")
    finally:
        await client.aclose()
    server = str(info.get("server_name", "redis"))
    version = info.get(f"{server}_version", info.get("redis_version", "?"))
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return {
        "python": f"{sys.version.split()[0]} ({platform.python_implementation()})",
        "platform": platform.platform(),
        "cpus": f"{os.cpu_count()} (affinity {affinity})",
        "server": f"{server} {version}, {NODES} nodes on 127.0.0.1 (9 for scenario 5)",
        "redis-py": f"{redis.__version__} (hiredis {_version('hiredis')})",
        "redlock_async": f"{_version('redlock_async')} at {library_commit()}",
        "aioredlock": f"{_version('aioredlock')} (aioredis {_version('aioredis')})",
        "pottery": _version("pottery"),
        "matplotlib": _version("matplotlib"),
        "event loop": type(asyncio.get_running_loop()).__name__,
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


# -- report --------------------------------------------------------------------------------


def f0(value: float) -> str:
    return "-" if value != value else f"{value:,.0f}"


def f1(value: float) -> str:
    return "-" if value != value else f"{value:.1f}"


def fx(value: float) -> str:
    return "-" if value != value else f"{value:.2f}x"


class Table:
    """The figures of one scenario: medians over repeats, ratios within repeats."""

    def __init__(self, run: Run, key: str) -> None:
        self.run = run
        self.key = key
        self.by_lib = run.results.get(key, {})

    def ok(self, name: str) -> list[Outcome]:
        return [o for o in self.by_lib.get(name, []) if o.problem is None]

    def med(self, name: str, metric: str) -> float:
        return median([o.values.get(metric, float("nan")) for o in self.ok(name)])

    def ratio(self, name: str, metric: str, base: str = FLOOR, base_metric: str | None = None) -> float:
        """Median over repeats of name/base within each repeat where both worked."""
        mine, theirs = self.by_lib.get(name, []), self.by_lib.get(base, [])
        ratios = [
            a.values[metric] / b.values[base_metric or metric]
            for a, b in zip(mine, theirs, strict=False)
            if a.problem is None and b.problem is None and b.values.get(base_metric or metric)
        ]
        return median(ratios)

    def status(self, name: str) -> str | None:
        """None when every repeat worked; else what went wrong (and how often), for the cells."""
        if name in self.run.unavailable:
            return self.run.unavailable[name]
        outcomes = self.by_lib.get(name, [])
        if not outcomes:
            return self.run.scenario_problems.get(self.key.split(":")[0], "not run")
        bad = [o.problem for o in outcomes if o.problem]
        if not bad:
            return None
        first = bad[0] or ""
        return first if len(bad) == len(outcomes) else f"{len(bad)}/{len(outcomes)} repeats: {first}"

    def failed(self, name: str) -> bool:
        return not self.ok(name)

    def notes(self, name: str) -> str:
        notes = sorted({o.note for o in self.by_lib.get(name, []) if o.note})
        status = self.status(name)
        parts = ([f"**{status}**"] if status else []) + notes
        return "; ".join(short(p, 200) for p in parts)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _failed_row(name: str, columns: int, status: str) -> str:
    return _row([name, f"**{short(status, 160)}**"] + [""] * (columns - 2))


def table_latency(run: Run) -> list[str]:
    t = Table(run, "latency")
    lines = [
        "| library | acquire+release p50 µs | p99 µs | acquire p50 µs | p50 vs floor | p99 vs floor | notes |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name in NAMES:
        if t.failed(name):
            lines.append(_failed_row(name, 7, t.status(name) or "no data"))
            continue
        lines.append(
            _row(
                [
                    name,
                    f0(t.med(name, "cycle_p50_us")),
                    f0(t.med(name, "cycle_p99_us")),
                    f0(t.med(name, "acquire_p50_us")),
                    fx(t.ratio(name, "cycle_p50_us")),
                    fx(t.ratio(name, "cycle_p99_us")),
                    t.notes(name),
                ]
            )
        )
    return lines


def table_throughput(run: Run) -> list[str]:
    t = Table(run, "throughput")
    lines = ["| library | ops/s | vs floor (higher is better) | notes |", "|---|---:|---:|---|"]
    for name in NAMES:
        if t.failed(name):
            lines.append(_failed_row(name, 4, t.status(name) or "no data"))
            continue
        lines.append(_row([name, f0(t.med(name, "ops_per_s")), fx(t.ratio(name, "ops_per_s")), t.notes(name)]))
    return lines


def table_contended(run: Run) -> list[str]:
    t = Table(run, "contended")
    lines = [
        "| library | grants/s | vs floor (higher is better) | hand-off p50 ms | hand-off p99 ms | p50 vs floor "
        "| grants to another task | hand-off to another task p50 / p99 ms (n) | grants per task min-max "
        "| give-ups | overlaps | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name in NAMES:
        if t.failed(name):
            lines.append(_failed_row(name, 12, t.status(name) or "no data"))
            continue
        other = [x for o in t.ok(name) for x in o.samples.get("handoff_other_ns", [])]
        lines.append(
            _row(
                [
                    name,
                    f1(t.med(name, "grants_per_s")),
                    fx(t.ratio(name, "grants_per_s")),
                    f1(t.med(name, "handoff_p50_ms")),
                    f1(t.med(name, "handoff_p99_ms")),
                    fx(t.ratio(name, "handoff_p50_ms")),
                    f"{t.med(name, 'other_task_pct'):.0f}%",
                    f"{f1(p50(other) / 1e6)} / {f1(p99(other) / 1e6)} ({len(other)})",
                    f"{t.med(name, 'task_min'):.0f}-{t.med(name, 'task_max'):.0f}",
                    f0(sum(o.values.get("gave_up", 0) for o in t.ok(name))),
                    f0(sum(o.values.get("overlaps", 0) for o in t.by_lib.get(name, []))),
                    t.notes(name),
                ]
            )
        )
    return lines


def table_stopped(run: Run) -> list[str]:
    t = Table(run, "stopped")
    lines = [
        f"| library | with node {STOPPED} stopped | acquire p50 µs | acquire p99 µs | healthy acquire p50 µs "
        "| p50 vs floor healthy | p50 vs own healthy | notes |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]

    def within(name: str, base: str) -> float:
        return median([o.values["acquire_p50_us"] / o.values[base] for o in t.ok(name) if o.values.get(base)])

    for name in NAMES:
        status = t.status(name)
        outcomes = t.by_lib.get(name, [])
        verdict = "works" if status is None else status.split(":")[0].split(" repeats")[0]
        if name in run.unavailable:
            lines.append(_failed_row(name, 8, status or ""))
            continue
        own = median([o.values.get("healthy_acquire_p50_us", float("nan")) for o in outcomes])
        if t.failed(name):
            verdict = "hangs" if any((o.problem or "").startswith("hangs") for o in outcomes) else "fails"
            lines.append(_row([name, f"**{verdict}**", "-", "-", f0(own), "-", "-", t.notes(name)]))
            continue
        lines.append(
            _row(
                [
                    name,
                    verdict if name != RedisPyLock.name else f"{verdict} (its one node, 0, is up)",
                    f0(t.med(name, "acquire_p50_us")),
                    f0(t.med(name, "acquire_p99_us")),
                    f0(own),
                    fx(within(name, "floor_healthy_acquire_p50_us")),
                    fx(within(name, "healthy_acquire_p50_us")),
                    t.notes(name),
                ]
            )
        )
    return lines


def table_nodes(run: Run) -> list[str]:
    header = "| library | " + " | ".join(f"N={n}" for n in NODE_COUNTS) + " | N=9 / N=3 |"
    lines = [header, "|---|" + "---:|" * (len(NODE_COUNTS) + 1)]
    for name in NODES_NAMES:
        cells = [name]
        for n in NODE_COUNTS:
            t = Table(run, f"nodes:{n}")
            if name == RedisPyLock.name and n != 1:
                cells.append("(1 node)")
            elif t.failed(name):
                cells.append(f"**{short(t.status(name) or 'no data', 60)}**")
            else:
                ratio = "" if name == FLOOR else f" ({fx(t.ratio(name, 'cycle_p50_us'))})"
                cells.append(f"{f0(t.med(name, 'cycle_p50_us'))}{ratio}")
        cells.append("" if name == RedisPyLock.name else fx(scaling(run, name)))
        lines.append(_row(cells))
    return lines


def scaling(run: Run, name: str, high: int = 9, low: int = 3) -> float:
    """p50 at N=*high* over p50 at N=*low*, taken within each repeat (same moment of the run), then the median."""
    outcomes_high = run.results.get(f"nodes:{high}", {}).get(name, [])
    outcomes_low = run.results.get(f"nodes:{low}", {}).get(name, [])
    ratios = [
        a.values["cycle_p50_us"] / b.values["cycle_p50_us"]
        for a, b in zip(outcomes_high, outcomes_low, strict=False)
        if not a.problem and not b.problem and a.values.get("cycle_p50_us") and b.values.get("cycle_p50_us")
    ]
    return statistics.median(ratios) if ratios else math.nan


def problem_details(run: Run, limit: int = 40) -> list[str]:
    """Each distinct failure once, untruncated (the table cells shorten them), hangs of whole peers aside."""
    seen: set[tuple[str, str]] = set()
    lines: list[str] = []
    for key, by_lib in run.results.items():
        for name, outcomes in by_lib.items():
            for i, outcome in enumerate(outcomes):
                if not outcome.problem or (name, outcome.problem) in seen:
                    continue
                seen.add((name, outcome.problem))
                lines.append(f"{key}, {name}, repeat {i + 1}: {' '.join(outcome.problem.split())}")
    return lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])


def report(run: Run, command: str) -> str:
    cfg = run.cfg
    out: list[str] = []
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out += [
        f"Command: `{command}` ({cfg.name} run, {run.total_seconds:.0f} s), {now}.",
        "",
        "| environment | |",
        "|---|---|",
    ]
    out += [_row([k, v]) for k, v in run.env.items()]
    out += ["", "Libraries and the defaults they run with (a 10 s lease everywhere):", ""]
    out += ["| library | defaults |", "|---|---|"]
    for name in NAMES:
        text = run.defaults.get(name, "") or run.unavailable.get(name, "")
        if name in run.unavailable:
            text = f"**{run.unavailable[name]}**" + (f" {text}" if text != run.unavailable[name] else "")
        out.append(_row([name, text]))
    out += [
        "",
        f"### 1. Uncontended acquire+release (sequential, one resource; median of {cfg.repeats} repeats, "
        f"{cfg.latency_ops} ops each)",
        "",
        *table_latency(run),
        "",
        f"### 2. Throughput ({TASKS} tasks, each on its own resource, acquire+release in a loop; median of "
        f"{cfg.repeats} repeats of {cfg.throughput_seconds:g} s)",
        "",
        *table_throughput(run),
        "",
        f"### 3. Contended hand-off ({CONTENDERS} tasks, one resource, {CRITICAL_S * 1000:g} ms critical section, "
        f"each library's blocking `async with`; median of {cfg.contended_repeats} repeats of "
        f"{cfg.contended_seconds:g} s)",
        "",
        *table_contended(run),
        "",
        "Hand-off: from the end of one holder's critical section (its release begins) to the next grant (any "
        "task, the releasing one included: a task acquires again right after it released); the release itself "
        "is inside it, as in `bench_handoff.py`. 'to another task': share of grants that "
        "went to a different task than the previous one. Give-ups: blocking acquires that ran out of retries "
        "(aioredlock: 3 tries) and were called again. Overlaps: grants while another task was inside its "
        "critical section (must be 0). Hand-offs to another task are few, so they are pooled over the repeats "
        "(n of them); the grants per task are the median over repeats of the least and most served task.",
        "",
        f"### 4. Node {STOPPED} of 5 stopped (SIGSTOP) — acquire latency ({cfg.stopped_repeats} repeats of "
        f"{cfg.stopped_ops} sequential acquire+release after {cfg.stopped_warmup_ops} untimed; each acquire and "
        f"release bounded by {cfg.op_timeout:g} s)",
        "",
        *table_stopped(run),
        "",
        "'healthy': the same lock, timed right before the pause in the same repeat; 'vs floor healthy' divides by "
        "the floor's (the floor itself hangs once the node is stopped: its `gather` waits for every node, with no "
        "timeout). Ratios are taken within each repeat. 'after resume': one acquire+release 0.5 s after SIGCONT.",
        "",
        f"### 5. Uncontended acquire+release p50 (µs) against the node count (median of {cfg.nodes_repeats} "
        f"repeats of {cfg.nodes_ops} ops; in brackets: vs the floor at the same N)",
        "",
        *table_nodes(run),
        "",
        "N=9 / N=3: the p50 at 9 nodes over the p50 at 3, taken within each repeat, then the median. "
        f"'{Wire.name}' is not a library: blocking sockets, no event loop, no timeouts, hiredis to pack and "
        "parse. It is the least any client can do here, so its growth with N is the machine's own: each node "
        "costs a send and a receive system call and a server process woken on a 2-core box.",
        "",
        "Scenario times: " + ", ".join(f"{k} {v:.0f} s" for k, v in run.seconds.items()) + ".",
    ]
    if run.scenario_problems:
        out += ["", "Scenario problems: " + "; ".join(f"{k}: {v}" for k, v in run.scenario_problems.items())]
    details = problem_details(run)
    if details:
        out += ["", "Every failure in full (scenario, library, repeat: what happened):", ""]
        out += [f"- {line}" for line in details]
    return "\n".join(out) + "\n"


def profile_report(run: Run, command: str) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Made by `{command}` at commit {library_commit()}, {now}.\n\n"
        f"### Profile of redlock_async's uncontended loop\n\n{run.profile}\n"
    )


# -- the figure ----------------------------------------------------------------------


def plot(run: Run, path: Path) -> str:
    """Write the PNG; returns a line for stdout (written, or why not)."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
    except ImportError:
        return "figure not written: matplotlib is not installed: pip install '.[bench]'"
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5.8), gridspec_kw={"width_ratios": [1, 1.5]})
    colors = dict(zip(NODES_NAMES, ["#444444", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c8c8c"], strict=True))
    for name in NODES_NAMES:
        if name == RedisPyLock.name:
            value = Table(run, "nodes:1").med(name, "cycle_p50_us")
            if value == value:
                ax1.axhline(value, color=colors[name], linestyle=":", label=f"{name}, measured at N=1")
            continue
        xs, ys = [], []
        for n in NODE_COUNTS:
            t = Table(run, f"nodes:{n}")
            if not t.failed(name):
                xs.append(n)
                ys.append(t.med(name, "cycle_p50_us"))
        if xs:
            style = "--" if name == Wire.name else "-"
            ax1.plot(xs, ys, style, marker="o", color=colors[name], label=name, linewidth=2 if name == REDLOCK else 1.3)
    ax1.set_xticks(NODE_COUNTS)
    ax1.set_xlabel("nodes N")
    ax1.set_ylabel("acquire+release p50 (µs)")
    ax1.set_ylim(bottom=0)
    ax1.set_title("(a) uncontended latency vs node count")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)

    groups: list[tuple[str, str, str, bool]] = [
        ("1. latency p50\n(lower is better)", "latency", "cycle_p50_us", False),
        ("1. latency p99\n(lower is better)", "latency", "cycle_p99_us", False),
        ("2. throughput\n(higher is better)", "throughput", "ops_per_s", True),
        ("3. grants/s\n(higher is better)", "contended", "grants_per_s", True),
        ("3. hand-off p50\n(lower is better)", "contended", "handoff_p50_ms", False),
        ("4. node stopped:\nacquire p50 vs\nhealthy floor (lower)", "stopped", "acquire_p50_us", False),
    ]
    width = 0.8 / len(NAMES)
    for g, (_, key, metric, _) in enumerate(groups):
        t = Table(run, key)
        for i, name in enumerate(NAMES):
            x = g + (i - (len(NAMES) - 1) / 2) * width
            if key == "stopped":
                value = median(
                    [
                        o.values[metric] / o.values["floor_healthy_acquire_p50_us"]
                        for o in t.ok(name)
                        if o.values.get("floor_healthy_acquire_p50_us")
                    ]
                )
            else:
                value = t.ratio(name, metric) if not t.failed(name) else float("nan")
            if value == value and value > 0:
                ax2.bar(x, value, width, color=colors[name], label=name if g == 0 else None)
            else:
                status = t.status(name) or ""
                label = "n/i" if status.startswith("not installed") else status.split(":")[0].split()[0] or "n/a"
                ax2.bar(x, 1, width, color="none", edgecolor=colors[name], hatch="//", label=None)
                ax2.text(x, 1.05, label, rotation=90, ha="center", va="bottom", fontsize=7, color=colors[name])
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_yscale("log")
    ticker: Any = importlib.import_module("matplotlib.ticker")
    ax2.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax2.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x" if f"{v:.0e}"[0] in "235" else ""))
    ax2.set_xticks(range(len(groups)))
    ax2.set_xticklabels([g[0] for g in groups], fontsize=8)
    ax2.set_ylabel("ratio to the raw floor (log)")
    ax2.set_title("(b) each scenario, as a ratio to the raw redis-py floor (hatched: hangs / errors)")
    ax2.grid(alpha=0.3, axis="y")
    ax2.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"redlock_async vs peers, 5 local valkey nodes ({run.cfg.name} run, medians over repeats)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"figure: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"


def write_docs(path: Path, body: str) -> None:
    """Replace the generated part of the doc, keeping any hand-written text around it."""
    block = f"{BEGIN}\n\n{body}\n{END}\n"
    if path.exists():
        text = path.read_text()
        pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.S)
        if pattern.search(text):
            path.write_text(pattern.sub(lambda _: block, text, count=1))
            return
        path.write_text(text.rstrip("\n") + "\n\n" + block)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# Benchmarks: redlock_async against its peers\n\n"
        "Generated by `python benchmarks/compare.py` (`pip install '.[bench]'` for the peers).\n\n" + block
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run, < 60 s; prints only (see --docs)")
    parser.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"write {DOCS.relative_to(ROOT)} and {PNG.relative_to(ROOT)} (default: yes for the full run)",
    )
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="profile redlock_async's uncontended loop (default: yes for the full run)",
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    docs = (not args.quick) if args.docs is None else args.docs
    profile = (not args.quick) if args.profile is None else args.profile
    command = "python benchmarks/compare.py" + (" --quick" if args.quick else "")
    started = perf_ns()
    with LocalNodes(max(NODE_COUNTS)) as cluster:
        try:
            run = asyncio.run(bench(cluster, cfg, profile))
        finally:
            for node in cluster:
                node.resume()
    run.total_seconds = (perf_ns() - started) / 1e9
    run.env["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    body = report(run, command)
    print()
    print(body)
    if docs:
        print(plot(run, PNG))
        write_docs(DOCS, body)
        print(f"tables: {DOCS.relative_to(ROOT)}")
        if run.profile:
            write_docs(DEV_LOG, profile_report(run, command))
            print(f"profile: {DEV_LOG.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
