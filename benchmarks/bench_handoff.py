"""Hand-off benchmark: a contended lock passed on by release notifications (pushed) or by polling.

Usage::

    python benchmarks/bench_handoff.py [--quick] [--json PATH]

Exit status 1 when two lock bodies overlapped or a task failed with an error
(a timeout of a blocking acquire is counted, not fatal).

One run starts ``LocalNodes(5)`` (real valkey-server processes on 127.0.0.1)
and, in rounds (the order of the two modes alternates from round to round, so
that both see the same machine noise), measures:

1. **baseline**: one uncontended ``async with lock:`` (empty body) on a
   resource of its own, sequential: *acquire* is the time from just before
   ``async with`` to the first line of the body, *acquire+release* the time
   to just after the block. The same code path (``__aenter__``/``__aexit__``,
   watchdog included) as the contended tasks.
2. **contention**, once per mode, each time with two fresh ``Redlock``
   instances (4 tasks each, 8 in all) on ONE resource; every task loops
   ``async with lock: await asyncio.sleep(0.001)`` until the window ends:

   * ``pushed``: ``Redlock(urls)`` (``wait_for_release=True``, the default):
     a waiter is woken by the release's PUBLISH, with the jittered fallback
     retry after ``retry_delay``;
   * ``queued``: ``Redlock(urls, queue=True)``: the nodes keep the waiters in line and the
     release script hands the key to the first, publishing a grant (docs/algorithm.md, "The
     grant queue"): one round trip per hand-off to either Redlock;
   * ``polling``: ``Redlock(urls, wait_for_release=False)``: retries after
     ``retry_delay`` only (uniform 0.1-0.3 s at the default 0.2 s).

   Each window is preceded by an untimed warm-up with the same Redlocks.
   Both Redlocks share this process's event loop: a release wakes one waiter
   of each, and which of the two sends its SETs first is decided by the order
   the loop reads their notifications in, not by chance as between processes.

Definitions (all from ``time.perf_counter_ns`` in the one process):

* *grant*: a task entered its body; it records *wanted* (just before
  ``async with``), *entered* (first line of the body) and *left* (last line of
  the body, just before the block exits and releases).
* *hand-off*: for consecutive grants in order of *entered*, the next grant's
  *entered* minus the previous grant's *left*: the release, the notification
  (or the poll) and the next acquire. Counted for grants entered within the
  window. *Cross-task* hand-offs go to another task; a *self re-grant* is the
  releasing task winning again (it wants the lock again at once, and its fresh
  attempt does not queue behind the waiters).
* *wait*: *entered* minus *wanted*, for every grant (the tasks that still wait
  when the window closes are served and counted too).
* *mutual exclusion*: no grant enters before the previous one left.
* *contested win*: a grant whose winning attempt heard at least one ``no``
  before the majority decided (another client's key on that node: a split vote
  that still reached a majority). Votes still pending at the decision are not seen.
* server-side, from ``INFO commandstats`` before and after the window (drain
  included): ``SET`` calls over the number of nodes are acquire attempts;
  ``PUBLISH`` calls (summed over the nodes) are keys the release script
  deleted: 5 per grant when every release found its key on all 5 nodes and no
  failed attempt had to give a key back; more means split votes given back.
* *listener wakeups*: ``Redlock.statistics().wakeups``, waiters woken by a
  notification (one per release per Redlock at most, by design).

Targets (median over rounds of ratios taken within each round):

* pushed hand-off p50 <= 3x the uncontended *acquire* p50 of the same round
  (a hand-off is one notification plus one acquire, so acquire-only is the
  fair baseline; the ratio to acquire+release is shown too);
* pushed grants/s >= 20x polling grants/s.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from _common import add_loop_option, library_commit, loop_lag, run_on

from redlock_async import Lock, LockNotAcquired, Redlock
from redlock_async.testing import LocalNodes

NODES = 5
INSTANCES = 2  # Redlock instances per contention scenario
TASKS_PER_INSTANCE = 4
HOLD_SECONDS = 0.001  # time each grant holds the lock (asyncio.sleep inside the body)
RESOURCE = "bench:handoff"
SOLO_RESOURCE = "bench:handoff:solo"
IDLE_MS = 50  # a hand-off this long means the lock sat free while 7 tasks wanted it
FALLBACK_MIN_SECONDS = 0.1  # the shortest fallback retry at the default retry_delay (0.2 s x 0.5)
MODES = ("pushed", "queued", "polling")

TARGET_HANDOFF_RATIO = 3.0  # pushed hand-off p50 <= 3x uncontended acquire p50
TARGET_HANDOVER_RATIO = 2.0  # issue 20: hand-off p50 <= 2x; judged on hand-offs within one Redlock (handed over)
TARGET_GRANTS_RATIO = 20.0  # pushed grants/s >= 20x polling grants/s

perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class Config:
    rounds: int
    window_seconds: float  # timed contention window per mode per round
    warmup_seconds: float  # untimed contention before each window, same Redlocks
    baseline_ops: int  # timed sequential uncontended ops per round
    baseline_warmup_ops: int
    max_grants_per_task: int  # hard bound on a contending task's loop
    phase_seconds: float  # hard bound (asyncio.timeout) on one phase beyond its own window
    budget_seconds: float  # hard bound on the whole run


FULL = Config(
    rounds=5,
    window_seconds=3.0,
    warmup_seconds=0.4,
    baseline_ops=500,
    baseline_warmup_ops=50,
    max_grants_per_task=50_000,
    phase_seconds=20.0,
    budget_seconds=160.0,
)
QUICK = Config(
    rounds=2,
    window_seconds=1.5,
    warmup_seconds=0.25,
    baseline_ops=200,
    baseline_warmup_ops=30,
    max_grants_per_task=20_000,
    phase_seconds=8.0,
    budget_seconds=42.0,
)


# -- statistics --------------------------------------------------------------------


def pct(samples: Sequence[float], q: int) -> float:
    """The q-th percentile (inclusive method); NaN when empty."""
    if not samples:
        return float("nan")
    if len(samples) == 1:
        return float(samples[0])
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def median_of(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else float("nan")


def ms(ns: float) -> float:
    return ns / 1e6


def us(ns: float) -> float:
    return ns / 1e3


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def jain(values: Sequence[int]) -> float:
    """Jain's fairness index: 1.0 when every task got as many grants, 1/n when one got all."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else float("nan")


# -- baseline ------------------------------------------------------------------------


@dataclass
class Baseline:
    ops: int
    acquire_p50_us: float
    acquire_p99_us: float
    cycle_p50_us: float  # acquire+release
    cycle_p99_us: float
    failures: int


async def measure_baseline(redlock: Redlock, cfg: Config) -> Baseline:
    """Sequential uncontended ``async with`` on a resource nobody else uses."""
    lock = redlock.lock(SOLO_RESOURCE)
    acquire_ns: list[int] = []
    cycle_ns: list[int] = []
    failures = 0
    async with asyncio.timeout(cfg.phase_seconds):
        for _ in range(cfg.baseline_warmup_ops):
            async with lock:
                pass
        gc.collect()
        deadline = perf_ns() + int(cfg.phase_seconds / 2 * 1e9)
        for _ in range(cfg.baseline_ops):
            started = perf_ns()
            entered = 0
            try:
                async with lock:
                    entered = perf_ns()
            except LockNotAcquired:
                failures += 1
                continue
            acquire_ns.append(entered - started)
            cycle_ns.append(perf_ns() - started)
            if perf_ns() > deadline:
                break
    return Baseline(
        ops=len(cycle_ns),
        acquire_p50_us=us(pct(acquire_ns, 50)),
        acquire_p99_us=us(pct(acquire_ns, 99)),
        cycle_p50_us=us(pct(cycle_ns, 50)),
        cycle_p99_us=us(pct(cycle_ns, 99)),
        failures=failures,
    )


# -- contention ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Grant:
    task: int
    instance: int
    wanted: int  # perf_counter_ns just before `async with`
    entered: int  # first line of the body
    left: int  # last line of the body, before the block exits
    no_votes: int  # "no" votes in the winning attempt


@dataclass
class Tally:
    grants: list[Grant] = field(default_factory=list)
    timeouts: int = 0
    errors: list[str] = field(default_factory=list)


async def contend(lock: Lock, task: int, instance: int, stop_at: int, cap: int, tally: Tally) -> None:
    """Want the lock again and again until *stop_at* (or *cap* grants); hold it HOLD_SECONDS each time."""
    for _ in range(cap):
        if perf_ns() >= stop_at:
            return
        wanted = perf_ns()
        entered = left = no_votes = 0
        try:
            async with lock:
                entered = perf_ns()
                no_votes = sum(1 for outcome in lock.outcomes if outcome.vote.value == "no")
                await asyncio.sleep(HOLD_SECONDS)
                left = perf_ns()
        except LockNotAcquired:
            tally.timeouts += 1
        except Exception as exc:
            tally.errors.append(f"task {task}: {type(exc).__name__}: {exc}")
        if entered:
            tally.grants.append(Grant(task, instance, wanted, entered, left or perf_ns(), no_votes))


def server_counts(cluster: LocalNodes) -> Counter[str]:
    """Calls of SET, PUBLISH and EVALSHA, summed over the nodes (INFO commandstats)."""
    totals: Counter[str] = Counter()
    for node in cluster:
        stats = node.command("INFO", "commandstats")
        if not isinstance(stats, dict):
            continue
        for name in ("set", "publish", "evalsha", "eval"):
            entry = stats.get(f"cmdstat_{name}")
            if isinstance(entry, dict):
                totals[name] += int(entry.get("calls", 0))
    return totals


@dataclass
class Contention:
    mode: str
    window_s: float
    grants: int  # entered within the window
    grants_total: int  # window plus the tasks served after it closed
    grants_per_s: float
    handoff_p50_us: float
    handoff_p99_us: float
    handoff_max_ms: float
    idle_handoffs: int  # hand-offs >= IDLE_MS: the lock sat free while tasks waited (a missed or late wake-up)
    cross_task_handoffs: int
    cross_task_handoff_p50_us: float
    cross_task_handoff_p99_us: float
    cross_task_handoffs_per_s: float
    self_regrant_share: float  # consecutive grants to the same task
    wait_p50_ms: float
    wait_p99_ms: float
    wait_max_ms: float
    waits_over_fallback: int  # waits >= FALLBACK_MIN_SECONDS (in pushed mode: likely a fallback retry)
    per_task: list[int]  # grants in the window, per task
    per_task_min: int
    per_task_max: int
    per_task_stdev: float
    jain: float
    instance_share: list[float]  # share of the window's grants per Redlock instance
    top_instance_share: float  # the larger of the two (0.5 is even)
    other_instance_handoff_share: float  # hand-offs that went to the other Redlock instance
    same_instance_handoff_p50_us: float  # hand-offs to another task of the same Redlock (handed over)
    other_instance_handoff_p50_us: float  # hand-offs to a task of the other Redlock (woken by the release's words)
    contested_share: float  # grants whose winning attempt saw a "no" vote
    wakeups: list[int]  # listener.wakeups per instance, during the window and the drain
    wakeups_per_grant: float
    attempts_per_grant: float  # SET calls per node per grant (server side)
    publishes_per_grant: float  # PUBLISH calls (summed over the nodes) per grant
    overlaps: int
    timeouts: int
    errors: list[str]
    max_loop_lag_ms: float
    drain_ms: float  # from the window's end until every task stopped


async def run_tasks(redlocks: Sequence[Redlock], seconds: float, cfg: Config) -> tuple[Tally, int, int, float, float]:
    """All tasks on the resource for *seconds*: (tally, started, stop_at, max loop lag ms, drain ms)."""
    tally = Tally()
    started = perf_ns()
    stop_at = started + int(seconds * 1e9)
    workers = [
        contend(
            redlock.lock(RESOURCE),
            i * TASKS_PER_INSTANCE + j,
            i,
            stop_at,
            cfg.max_grants_per_task,
            tally,
        )
        for i, redlock in enumerate(redlocks)
        for j in range(TASKS_PER_INSTANCE)
    ]
    async with asyncio.timeout(seconds + cfg.phase_seconds):
        lag = asyncio.ensure_future(loop_lag(stop_at))
        await asyncio.gather(*workers)
        ended = perf_ns()
        max_lag = await lag
    return tally, started, stop_at, max_lag, ms(max(0, ended - stop_at))


async def measure_contention(mode: str, cluster: LocalNodes, cfg: Config) -> Contention:
    push, queue = mode != "polling", mode == "queued"
    async with (
        Redlock(cluster.urls, wait_for_release=push, queue=queue) as a,
        Redlock(cluster.urls, wait_for_release=push, queue=queue) as b,
    ):
        redlocks = (a, b)
        await run_tasks(redlocks, cfg.warmup_seconds, cfg)
        gc.collect()
        wakeups_before = [r.statistics().wakeups for r in redlocks]
        server_before = server_counts(cluster)
        tally, started, stop_at, max_lag, drain = await run_tasks(redlocks, cfg.window_seconds, cfg)
        server = server_counts(cluster)
        server.subtract(server_before)
        wakeups = [r.statistics().wakeups - w for r, w in zip(redlocks, wakeups_before, strict=True)]
    return analyse(mode, tally, started, stop_at, cfg.window_seconds, wakeups, server, max_lag, drain)


def analyse(
    mode: str,
    tally: Tally,
    started: int,
    stop_at: int,
    window: float,
    wakeups: list[int],
    server: Counter[str],
    max_lag: float,
    drain: float,
) -> Contention:
    grants = sorted(tally.grants, key=lambda g: g.entered)
    overlaps = 0
    latest_left = 0
    for g in grants:
        if g.entered < latest_left:
            overlaps += 1
        latest_left = max(latest_left, g.left)
    in_window = [g for g in grants if g.entered < stop_at]
    handoff: list[int] = []
    cross_task: list[int] = []
    same_gaps: list[int] = []
    other_gaps: list[int] = []
    self_regrants = other_instance = 0
    for prev, g in itertools.pairwise(grants):
        if g.entered >= stop_at:
            break
        gap = g.entered - prev.left
        handoff.append(gap)
        if g.task == prev.task:
            self_regrants += 1
        else:
            cross_task.append(gap)
        other_instance += g.instance != prev.instance
        if g.task != prev.task:
            (other_gaps if g.instance != prev.instance else same_gaps).append(gap)
    waits = [g.entered - g.wanted for g in grants]
    tasks = INSTANCES * TASKS_PER_INSTANCE
    per_task = [0] * tasks
    per_instance = [0] * INSTANCES
    for g in in_window:
        per_task[g.task] += 1
        per_instance[g.instance] += 1
    total = len(grants)
    n_window = len(in_window)
    return Contention(
        mode=mode,
        window_s=window,
        grants=n_window,
        grants_total=total,
        grants_per_s=n_window / window,
        handoff_p50_us=us(pct(handoff, 50)),
        handoff_p99_us=us(pct(handoff, 99)),
        handoff_max_ms=ms(max(handoff)) if handoff else float("nan"),
        idle_handoffs=sum(gap >= IDLE_MS * 1e6 for gap in handoff),
        cross_task_handoffs=len(cross_task),
        cross_task_handoff_p50_us=us(pct(cross_task, 50)),
        cross_task_handoff_p99_us=us(pct(cross_task, 99)),
        cross_task_handoffs_per_s=len(cross_task) / window,
        same_instance_handoff_p50_us=us(pct(same_gaps, 50)),
        other_instance_handoff_p50_us=us(pct(other_gaps, 50)),
        self_regrant_share=ratio(self_regrants, len(handoff)),
        wait_p50_ms=ms(pct(waits, 50)),
        wait_p99_ms=ms(pct(waits, 99)),
        wait_max_ms=ms(max(waits)) if waits else float("nan"),
        waits_over_fallback=sum(w >= FALLBACK_MIN_SECONDS * 1e9 for w in waits),
        per_task=per_task,
        per_task_min=min(per_task),
        per_task_max=max(per_task),
        per_task_stdev=statistics.pstdev(per_task),
        jain=jain(per_task),
        instance_share=[ratio(n, n_window) for n in per_instance],
        top_instance_share=ratio(max(per_instance), n_window),
        other_instance_handoff_share=ratio(other_instance, len(handoff)),
        contested_share=ratio(sum(g.no_votes > 0 for g in grants), total),
        wakeups=wakeups,
        wakeups_per_grant=ratio(sum(wakeups), total),
        attempts_per_grant=ratio(server["set"] / NODES, total),
        publishes_per_grant=ratio(server["publish"], total),
        overlaps=overlaps,
        timeouts=tally.timeouts,
        errors=tally.errors[:10],
        max_loop_lag_ms=max_lag,
        drain_ms=drain,
    )


# -- rounds and report ---------------------------------------------------------------


@dataclass
class Round:
    order: list[str]
    baseline: Baseline
    modes: dict[str, Contention]
    ratios: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


async def run_round(index: int, cluster: LocalNodes, solo: Redlock, cfg: Config) -> Round:
    started = perf_ns()
    baseline = await measure_baseline(solo, cfg)
    order = list(MODES) if index % 2 == 0 else list(reversed(MODES))
    modes = {mode: await measure_contention(mode, cluster, cfg) for mode in order}
    pushed, queued, polling = modes["pushed"], modes["queued"], modes["polling"]
    result = Round(order=order, baseline=baseline, modes=modes)
    result.ratios = {
        "queued_handoff_vs_acquire": ratio(queued.handoff_p50_us, baseline.acquire_p50_us),
        "queued_cross_task_handoff_vs_acquire": ratio(queued.cross_task_handoff_p50_us, baseline.acquire_p50_us),
        "queued_other_instance_handoff_vs_acquire": ratio(
            queued.other_instance_handoff_p50_us, baseline.acquire_p50_us
        ),
        "handoff_vs_acquire": ratio(pushed.handoff_p50_us, baseline.acquire_p50_us),
        "handoff_vs_cycle": ratio(pushed.handoff_p50_us, baseline.cycle_p50_us),
        "cross_task_handoff_vs_acquire": ratio(pushed.cross_task_handoff_p50_us, baseline.acquire_p50_us),
        "same_instance_handoff_vs_acquire": ratio(pushed.same_instance_handoff_p50_us, baseline.acquire_p50_us),
        "other_instance_handoff_vs_acquire": ratio(pushed.other_instance_handoff_p50_us, baseline.acquire_p50_us),
        "grants_pushed_vs_polling": ratio(pushed.grants_per_s, polling.grants_per_s),
        "cross_task_handoffs_pushed_vs_polling": ratio(
            pushed.cross_task_handoffs_per_s, polling.cross_task_handoffs_per_s
        ),
    }
    result.seconds = (perf_ns() - started) / 1e9
    return result


def environment(cluster: LocalNodes, solo: Redlock) -> dict[str, Any]:
    info = cluster[0].command("INFO", "server")
    server = "?"
    if isinstance(info, dict):
        name = str(info.get("server_name", "redis"))
        server = f"{name} {info.get(f'{name}_version', info.get('redis_version', '?'))}"
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "redis_py": redis.__version__,
        "server": server,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "nodes": NODES,
        "tasks": INSTANCES * TASKS_PER_INSTANCE,
        "instances": INSTANCES,
        "hold_seconds": HOLD_SECONDS,
        "commit": library_commit(),
        "redlock_settings": dataclasses.asdict(solo.settings),
    }


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _fmt(value: float, digits: int = 0) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f}%"


def report(rounds: list[Round], env: dict[str, Any], cfg: Config, total_seconds: float) -> dict[str, Any]:
    def base(get: Callable[[Baseline], float]) -> float:
        return median_of([get(r.baseline) for r in rounds])

    def med(mode: str, get: Callable[[Contention], float]) -> float:
        return median_of([get(r.modes[mode]) for r in rounds])

    def total(mode: str, get: Callable[[Contention], int]) -> int:
        return sum(get(r.modes[mode]) for r in rounds)

    def ratio_of(name: str) -> float:
        return median_of([r.ratios[name] for r in rounds])

    print(
        f"\n## Hand-off: {env['tasks']} tasks on {env['instances']} Redlocks, one resource, hold "
        f"{HOLD_SECONDS * 1e3:g} ms, {NODES} nodes ({env['server']})\n"
    )
    print(
        f"{len(rounds)} rounds x {cfg.window_seconds:g} s per mode; medians over rounds "
        f"(counts: sums). Python {env['python']}, {env['cpu_count']} CPUs, commit {env['commit']}.\n"
    )
    print("| baseline (uncontended `async with`, sequential) | p50 | p99 |")
    print("| --- | ---: | ---: |")
    print(
        f"| acquire (to body start) | {_fmt(base(lambda b: b.acquire_p50_us))} us "
        f"| {_fmt(base(lambda b: b.acquire_p99_us))} us |"
    )
    print(
        f"| acquire+release | {_fmt(base(lambda b: b.cycle_p50_us))} us | {_fmt(base(lambda b: b.cycle_p99_us))} us |"
    )

    rows: list[tuple[str, Callable[[str], str]]] = [
        ("grants/s", lambda m: _fmt(med(m, lambda c: c.grants_per_s))),
        (
            "hand-off p50 / p99 (all consecutive grants)",
            lambda m: f"{_fmt(med(m, lambda c: c.handoff_p50_us))} / {_fmt(med(m, lambda c: c.handoff_p99_us))} us",
        ),
        (
            f"longest hand-off; hand-offs >= {IDLE_MS} ms (sum)",
            lambda m: (
                f"{_fmt(max(r.modes[m].handoff_max_ms for r in rounds), 1)} ms; {total(m, lambda c: c.idle_handoffs)}"
            ),
        ),
        (
            "hand-off p50 / p99 to another task",
            lambda m: (
                f"{_fmt(med(m, lambda c: c.cross_task_handoff_p50_us))} / "
                f"{_fmt(med(m, lambda c: c.cross_task_handoff_p99_us))} us"
            ),
        ),
        ("hand-offs to another task /s", lambda m: _fmt(med(m, lambda c: c.cross_task_handoffs_per_s))),
        ("self re-grants (releaser wins again)", lambda m: _pct(med(m, lambda c: c.self_regrant_share))),
        (
            "wait p50 / p99 / max",
            lambda m: (
                f"{_fmt(med(m, lambda c: c.wait_p50_ms), 1)} / {_fmt(med(m, lambda c: c.wait_p99_ms), 1)} / "
                f"{_fmt(med(m, lambda c: c.wait_max_ms), 1)} ms"
            ),
        ),
        (f"waits >= {FALLBACK_MIN_SECONDS * 1e3:g} ms (sum)", lambda m: str(total(m, lambda c: c.waits_over_fallback))),
        (
            "grants per task min / max / stdev",
            lambda m: (
                f"{_fmt(med(m, lambda c: c.per_task_min))} / {_fmt(med(m, lambda c: c.per_task_max))} / "
                f"{_fmt(med(m, lambda c: c.per_task_stdev), 1)}"
            ),
        ),
        ("Jain fairness (1 = even)", lambda m: _fmt(med(m, lambda c: c.jain), 2)),
        ("grants to the busier Redlock (50% = even)", lambda m: _pct(med(m, lambda c: c.top_instance_share))),
        ("hand-offs to the other Redlock", lambda m: _pct(med(m, lambda c: c.other_instance_handoff_share))),
        (
            "hand-off p50 to another task: same Redlock (handed over) / other Redlock",
            lambda m: (
                f"{_fmt(med(m, lambda c: c.same_instance_handoff_p50_us))} / "
                f"{_fmt(med(m, lambda c: c.other_instance_handoff_p50_us))} us"
            ),
        ),
        ("contested wins (a `no` heard before the majority)", lambda m: _pct(med(m, lambda c: c.contested_share))),
        (
            "listener wakeups A / B (sum)",
            lambda m: f"{total(m, lambda c: c.wakeups[0])} / {total(m, lambda c: c.wakeups[1])}",
        ),
        ("wakeups per grant", lambda m: _fmt(med(m, lambda c: c.wakeups_per_grant), 2)),
        ("acquire attempts per grant (server SETs)", lambda m: _fmt(med(m, lambda c: c.attempts_per_grant), 2)),
        (
            "PUBLISHes per grant, all nodes (5 = releases only)",
            lambda m: _fmt(med(m, lambda c: c.publishes_per_grant), 2),
        ),
        ("overlapping bodies (sum)", lambda m: str(total(m, lambda c: c.overlaps))),
        (
            "timeouts / errors (sum)",
            lambda m: f"{total(m, lambda c: c.timeouts)} / {total(m, lambda c: len(c.errors))}",
        ),
        ("max event-loop lag", lambda m: f"{_fmt(max(r.modes[m].max_loop_lag_ms for r in rounds), 1)} ms"),
    ]
    print("\n| contention | pushed | queued (`queue=True`) | polling |")
    print("| --- | ---: | ---: | ---: |")
    for label, cell in rows:
        print(f"| {label} | {cell('pushed')} | {cell('queued')} | {cell('polling')} |")

    print("\nPer round (pushed hand-off p50 us, grants/s pushed / polling, grants to A in pushed, acquire p50 us):")
    for i, r in enumerate(rounds):
        p, q = r.modes["pushed"], r.modes["polling"]
        print(
            f"- round {i + 1} ({' then '.join(r.order)}, {r.seconds:.1f} s): hand-off {_fmt(p.handoff_p50_us)}, "
            f"grants/s {_fmt(p.grants_per_s)} / {_fmt(q.grants_per_s)}, A {_pct(p.instance_share[0])}, "
            f"per task pushed {p.per_task} polling {q.per_task}, acquire {_fmt(r.baseline.acquire_p50_us)}"
        )

    handoff_vs_acquire = ratio_of("handoff_vs_acquire")
    grants_ratio = ratio_of("grants_pushed_vs_polling")
    targets = {
        "handoff_p50_vs_acquire_p50": {
            "value": handoff_vs_acquire,
            "target": TARGET_HANDOFF_RATIO,
            "pass": handoff_vs_acquire <= TARGET_HANDOFF_RATIO,
        },
        "same_redlock_handoff_p50_vs_acquire_p50": {
            "value": ratio_of("same_instance_handoff_vs_acquire"),
            "target": TARGET_HANDOVER_RATIO,
            "pass": ratio_of("same_instance_handoff_vs_acquire") <= TARGET_HANDOVER_RATIO,
        },
        "queued_handoff_p50_vs_acquire_p50": {
            "value": ratio_of("queued_handoff_vs_acquire"),
            "target": TARGET_HANDOVER_RATIO,
            "pass": ratio_of("queued_handoff_vs_acquire") <= TARGET_HANDOVER_RATIO,
        },
        "grants_per_s_pushed_vs_polling": {
            "value": grants_ratio,
            "target": TARGET_GRANTS_RATIO,
            "pass": grants_ratio >= TARGET_GRANTS_RATIO,
        },
    }
    print("\nTargets (median of per-round ratios):\n")
    print(
        f"- {_verdict(handoff_vs_acquire <= TARGET_HANDOFF_RATIO)} pushed hand-off p50 = "
        f"{_fmt(handoff_vs_acquire, 2)}x the uncontended acquire p50 (target <= {TARGET_HANDOFF_RATIO:g}x); "
        f"{_fmt(ratio_of('handoff_vs_cycle'), 2)}x acquire+release p50; "
        f"to another task only: {_fmt(ratio_of('cross_task_handoff_vs_acquire'), 2)}x acquire p50"
    )
    same = ratio_of("same_instance_handoff_vs_acquire")
    print(
        f"- {_verdict(same <= TARGET_HANDOVER_RATIO)} hand-off p50 within one Redlock (handed over: the release "
        f"sends the next waiter's round) = {_fmt(same, 2)}x the uncontended acquire p50 "
        f"(target <= {TARGET_HANDOVER_RATIO:g}x); to the other Redlock (woken by the release's words, then a "
        f"fan-out of its own): {_fmt(ratio_of('other_instance_handoff_vs_acquire'), 2)}x"
    )
    queued = ratio_of("queued_handoff_vs_acquire")
    print(
        f"- {_verdict(queued <= TARGET_HANDOVER_RATIO)} hand-off p50 with the grant queue (`queue=True`: the "
        f"release script hands the key to the first waiter in line) = {_fmt(queued, 2)}x the uncontended acquire "
        f"p50 (target <= {TARGET_HANDOVER_RATIO:g}x); to another task only: "
        f"{_fmt(ratio_of('queued_cross_task_handoff_vs_acquire'), 2)}x; to the other Redlock: "
        f"{_fmt(ratio_of('queued_other_instance_handoff_vs_acquire'), 2)}x"
    )
    print(
        f"- {_verdict(grants_ratio >= TARGET_GRANTS_RATIO)} pushed grants/s = {_fmt(grants_ratio, 2)}x polling "
        f"(target >= {TARGET_GRANTS_RATIO:g}x); hand-offs to another task/s: "
        f"{_fmt(ratio_of('cross_task_handoffs_pushed_vs_polling'), 2)}x"
    )
    overlaps = sum(r.modes[m].overlaps for r in rounds for m in MODES)
    errors = [e for r in rounds for m in MODES for e in r.modes[m].errors]
    print(
        f"- mutual exclusion: {'held' if overlaps == 0 else f'VIOLATED ({overlaps} overlapping bodies)'}; "
        f"errors: {len(errors)}"
    )
    for e in errors[:5]:
        print(f"  - {e}")
    print(f"\nTotal {total_seconds:.1f} s.")
    return {
        "benchmark": "handoff",
        "config": dataclasses.asdict(cfg),
        "environment": env,
        "targets": targets,
        "rounds": [dataclasses.asdict(r) for r in rounds],
        "total_seconds": total_seconds,
    }


async def main_async(cfg: Config) -> tuple[dict[str, Any], bool]:
    """Every round on one set of nodes: (the report's data, whether mutual exclusion or a task failed)."""
    started = perf_ns()
    with LocalNodes(NODES) as cluster:
        async with asyncio.timeout(cfg.budget_seconds), Redlock(cluster.urls) as solo:
            env = environment(cluster, solo)
            rounds = [await run_round(i, cluster, solo, cfg) for i in range(cfg.rounds)]
        data = report(rounds, env, cfg, (perf_ns() - started) / 1e9)
    bad = any(r.modes[m].overlaps or r.modes[m].errors for r in rounds for m in MODES)
    return data, bad


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (under 30 s)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every figure as JSON")
    add_loop_option(parser)
    args = parser.parse_args(argv)
    data, bad = run_on(args.loop, main_async(QUICK if args.quick else FULL))
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"JSON written to {args.json}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
