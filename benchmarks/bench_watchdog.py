"""Watchdog benchmark: 10,000 auto-extended locks held at once, against a naive per-lock extend loop.

Usage::

    python benchmarks/bench_watchdog.py [--locks 10000] [--hold 10] [--repeats 1] [--quick] [--json PATH]

Exit status 1 when the watchdog lost a lock, a pass did not finish within the budget, or the
window's EXTEND_MANY count does not fit one command per node per CHUNK locks of each round
(:func:`chunking_check`, on averages).

One run starts ``LocalNodes(5)`` (real valkey-server processes on 127.0.0.1) and
holds ``--locks`` locks (ttl 1 s) for ``--hold`` seconds on one event loop, two ways:

* **watchdog**: ``async with lock: await hold_event.wait()`` with ``auto_extend=True``:
  the Redlock's one watchdog extends every lock in batched rounds (EXTEND_MANY);
* **naive** (the baseline): ``auto_extend=False`` and each holder task loops
  ``await asyncio.sleep(ttl / 3); await lock.extend()``: one timer and one
  extend (one EXTEND per node) per lock.

Each pass uses a fresh Redlock (ttl set Redlock-wide, so the locks share one
Settings; ``rl.lock(name, ttl=1.0)`` would copy it per lock) on flushed nodes
whose script cache was loaded once at start (see :func:`preload_scripts`).
Locks are acquired with at most ``--concurrency`` acquires in flight (the node
queue cap is 1024 commands), and the hold window starts once every lock is held
or refused. Within the window the run measures: process CPU
(``time.process_time``), extensions, the servers' EVALSHA/EVAL calls (``INFO
commandstats``: the real round trips, per node), the servers' own CPU (``INFO
cpu``), extension latency, watchdog retries, GC pauses, event-loop lag and the
lowest validity seen on a sample of the locks (a small probe task whose own CPU
is measured and taken off).

The client side is read through the library's public API only (no private
attribute, nothing patched): commands sent are the delta of the nodes'
``sent`` in ``Redlock.statistics()`` (only extensions run in the window, plus
the releases of locks lost in it); watchdog rounds and retries come from
``statistics()``; extension latency, lateness (``late_by``), margins and the
nodes' failed votes come from the ``EXTENDED`` and ``LOST`` events that
``Redlock(on_event=...)`` hands to :class:`EventRecorder`. Both modes run with
that callback, so both pay for one ``LockEvent`` per extension. Watchdog
latency is an ``EXTENDED`` event's ``duration``: from the round's start to
this lock's majority decision (naive: one ``await lock.extend()``, timed
around the call). Locks and EXTEND_MANY commands per round are averages over
the window (decisions / rounds, commands / rounds / nodes): public data has
no per-round or per-command record, so the former per-round maximum and the
count of EXTEND_MANY replies slower than ``node_timeout`` are gone (a reply
after the decision is not seen; votes that were errors, timeouts or skipped
at the decision are counted instead). Then every holder exits and
releases, in waves of ``EXIT_WAVE`` per loop turn (see there); a LockLost is
counted wherever it happens (while acquiring, in the window, at exit). With
``--repeats N`` the passes alternate (naive, watchdog,
then watchdog, naive, ...) and ratios are taken within each pair, then the
median; the default is one pair, which fits the 2-minute budget at 10,000 locks.

Memory per held lock comes from one extra pass per mode under ``tracemalloc``
(which slows Python down, so it never overlaps the timed passes): traced bytes
from before the locks were made to all held, after ``gc.collect()``, over the
lock count. Everything runs under one overall ``asyncio.timeout`` (``--budget``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import math
import os
import platform
import re
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import hiredis
import redis
from _common import library_commit

from redlock_async import EventKind, Lock, LockEvent, LockLost, LockNotAcquired, Redlock, Vote

# Public names of private modules, read only: the script sources to preload, and the
# watchdog's batch size (for the environment line and the chunking check on averages).
from redlock_async._scripts import EXTEND, EXTEND_MANY, RELEASE
from redlock_async._shared._watchdog import CHUNK
from redlock_async.testing import LocalNodes

Mode = Literal["naive", "watchdog"]

NODES = 5
TTL = 1.0
PROBE_INTERVAL = 0.02  # seconds between event-loop lag probes
VALIDITY_SAMPLE = 250  # locks whose validity the probe reads at each wake-up
MEMORY_TOP = 8  # allocation sites listed for the memory pass
MEMORY_TTL = 120.0  # ttl of the memory pass: nothing expires or is extended while tracemalloc blocks the loop

perf = time.perf_counter


# -- configuration and results ------------------------------------------------------


@dataclass(frozen=True)
class Config:
    locks: int
    hold: float
    repeats: int  # pairs of (naive, watchdog) passes
    concurrency: int  # acquires in flight at once
    memory: bool  # run the tracemalloc passes
    budget: float  # overall asyncio.timeout, seconds
    phase_timeout: float  # bound on acquiring all locks, and on draining them


@dataclass
class PassResult:
    mode: Mode
    order: int
    locks: int
    acquired: int = 0
    not_acquired: int = 0
    lost: int = 0
    lost_before_window: int = 0  # lost while the other locks were still being acquired
    lost_in_window: int = 0
    lost_reasons: dict[str, int] = field(default_factory=dict)
    acquire_s: float = 0.0
    hold_wall_s: float = 0.0
    hold_cpu_s: float = 0.0  # process CPU in the window, probe CPU taken off
    probe_cpu_s: float = 0.0
    extensions: int = 0  # successful extensions in the window
    extend_attempts: int = 0  # naive: extend() calls; watchdog: decisions (extended + retried + lost) in the window
    extensions_total: int = 0  # whole pass, including during the acquire phase
    rounds: int = 0  # watchdog rounds started in the window (statistics().watchdog_rounds)
    client_commands: int = 0  # commands sent in the window, all nodes (statistics(): delta of the nodes' sent)
    failed_votes: int = 0  # node votes error/timeout/skipped in the window's EXTENDED and LOST events (per lock)
    retries: int = 0  # watchdog: locks rescheduled without an extension (their round failed)
    watchdog_lost_events: int = 0  # LOST events with watchdog=True in the window
    first_loss_s: float = math.nan  # seconds from the start of acquiring to the first LockLost
    gc_collections: dict[int, int] = field(default_factory=dict)  # in the window, per generation
    gc_pause_s: float = 0.0  # total GC pause in the window
    gc_max_pause_ms: float = 0.0
    locks_per_round_mean: float = 0.0  # extend_attempts / rounds
    chunks_per_round_mean: float = 0.0  # EXTEND_MANY commands per round per node: commands / rounds / nodes
    chunk_check: str = ""  # empty, or why those averages do not fit ceil(locks / CHUNK) per round
    server_calls: list[int] = field(default_factory=list)  # EVALSHA+EVAL calls in the window, per node
    server_usec_per_call: float = 0.0
    server_cpu_s: float = 0.0  # the servers' CPU in the window, all nodes
    latency_ms: dict[str, float] = field(default_factory=dict)  # naive: extend(); watchdog: EXTENDED duration
    event_duration_ms: dict[str, float] = field(default_factory=dict)  # EXTENDED events' duration, both modes
    late_by_ms: dict[str, float] = field(default_factory=dict)  # watchdog: EXTENDED events' late_by
    min_margin_s: float = math.nan  # lowest EXTENDED margin: validity the old lease had left at the decision
    loop_lag_ms: dict[str, float] = field(default_factory=dict)
    min_validity_s: float = math.nan
    drain_s: float = 0.0
    leftover_keys: int = 0
    log_warnings: int = 0  # the library's WARNING records during the pass (one per lost lock, per node problem)

    @property
    def cpu_per_wall(self) -> float:
        return self.hold_cpu_s / self.hold_wall_s if self.hold_wall_s else math.nan

    @property
    def server_round_trips(self) -> int:
        return sum(self.server_calls)

    @property
    def extensions_per_s(self) -> float:
        return self.extensions / self.hold_wall_s if self.hold_wall_s else math.nan

    @property
    def round_trips_per_s(self) -> float:
        return self.server_round_trips / self.hold_wall_s if self.hold_wall_s else math.nan

    @property
    def cpu_us_per_extension(self) -> float:
        return self.hold_cpu_s / self.extensions * 1e6 if self.extensions else math.nan

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            cpu_per_wall=self.cpu_per_wall,
            server_round_trips=self.server_round_trips,
            extensions_per_s=self.extensions_per_s,
            round_trips_per_s=self.round_trips_per_s,
            cpu_us_per_extension=self.cpu_us_per_extension,
        )
        return data


@dataclass
class MemoryResult:
    mode: Mode
    locks: int
    held: int
    lock_objects_bytes: float  # per lock: Lock objects, names and keys (before any acquire)
    held_bytes: float  # per lock: everything from before the locks were made to all held
    top_sites: list[tuple[str, float]]  # (file:line, bytes per lock) of the held snapshot's growth


# -- helpers -----------------------------------------------------------------------


class CountingHandler(logging.Handler):
    """Counts the library's log records instead of printing one line per lost lock to stderr."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.levels: Counter[str] = Counter()
        self.first: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.levels[record.levelname] += 1
        self.first.setdefault(record.levelname, record.getMessage()[:300])


LIBRARY_LOG = CountingHandler()


def quantiles_ms(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {"n": float(len(ordered)), "p50": at(0.5), "p99": at(0.99), "max": ordered[-1] * 1000}


def server_snapshot(cluster: LocalNodes) -> list[tuple[int, int, float]]:
    """Per node: (EVALSHA+EVAL calls, their total usec, used CPU seconds) since the server started."""
    out: list[tuple[int, int, float]] = []
    for node in cluster:
        info = node.command("INFO", "commandstats", "cpu")
        assert isinstance(info, dict)
        calls = usec = 0
        for name in ("cmdstat_evalsha", "cmdstat_eval"):
            stat = info.get(name) or {}
            calls += int(stat.get("calls", 0))
            usec += int(stat.get("usec", 0))
        out.append((calls, usec, float(info["used_cpu_user"]) + float(info["used_cpu_sys"])))
    return out


def preload_scripts(cluster: LocalNodes) -> None:
    """SCRIPT LOAD the library's scripts on every node, as on servers that have served this app before.

    On fresh servers every EVALSHA of the first burst fails with NOSCRIPT and is
    resent as EVAL with the full source; that one-off stampede is not what
    this benchmark measures (FLUSHALL between passes keeps the script cache).
    """
    for node in cluster:
        for script in (RELEASE, EXTEND, EXTEND_MANY):
            node.command("SCRIPT", "LOAD", script.source)


def key_count(cluster: LocalNodes) -> int:
    total = 0
    for node in cluster:
        reply = node.command("KEYS", "*")
        assert isinstance(reply, list)
        total += sum(1 for key in reply if not key.endswith(b":"))  # not the restart-quarantine marker
    return total


class GcMonitor:
    """Garbage-collector pauses while active (gc.callbacks): a full collection stalls the loop."""

    def __init__(self) -> None:
        self.active = False
        self.count: Counter[int] = Counter()
        self.total = 0.0
        self.max_pause = 0.0
        self._start = 0.0

    def reset(self) -> None:
        self.count.clear()
        self.total = self.max_pause = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.active:
            return
        if phase == "start":
            self._start = perf()
            return
        pause = perf() - self._start
        self.count[info["generation"]] += 1
        self.total += pause
        self.max_pause = max(self.max_pause, pause)


GC_MONITOR = GcMonitor()


class Probe:
    """A task that wakes every PROBE_INTERVAL: event-loop lag, and the lowest validity of a lock sample."""

    def __init__(self, sample: Sequence[Lock]) -> None:
        self.sample = sample
        self.lags: list[float] = []
        self.min_validity = math.inf
        self.cpu = 0.0
        self.stopped = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stopped:
            before = loop.time()
            await asyncio.sleep(PROBE_INTERVAL)
            c0 = time.process_time()
            self.lags.append(loop.time() - before - PROBE_INTERVAL)
            lowest = min((lock.validity for lock in self.sample), default=math.inf)
            self.min_validity = min(self.min_validity, lowest)
            self.cpu += time.process_time() - c0


class EventRecorder:
    """The Redlock's ``on_event`` callback: what the hold window's extensions said, from public events.

    Given to the Redlock of both modes, so both pay for one LockEvent per
    extension; outside the window it returns at once. Per EXTENDED event it
    keeps the ``duration`` (watchdog: from the round's start to this lock's
    majority decision; extend(): from its first send to the decision), the
    watchdog's ``late_by`` and the lowest ``margin``; per EXTENDED or LOST event
    the nodes' votes that were errors, timeouts or skipped when it was decided
    (a reply after the decision is not in the event).
    """

    FAILED = frozenset({Vote.ERROR, Vote.TIMEOUT, Vote.SKIPPED})

    def __init__(self) -> None:
        self.active = False
        self.watchdog_extended = 0
        self.explicit_extended = 0
        self.watchdog_lost = 0
        self.lost = 0
        self.failed_votes = 0
        self.durations: list[float] = []
        self.late_by: list[float] = []
        self.min_margin = math.inf

    def __call__(self, event: LockEvent) -> None:
        if not self.active:
            return
        if event.kind is EventKind.EXTENDED:
            if event.watchdog:
                self.watchdog_extended += 1
                if event.late_by is not None:
                    self.late_by.append(event.late_by)
            else:
                self.explicit_extended += 1
            if event.duration is not None:
                self.durations.append(event.duration)
            if event.margin is not None:
                self.min_margin = min(self.min_margin, event.margin)
        elif event.kind is EventKind.LOST:
            self.lost += 1
            self.watchdog_lost += event.watchdog
        else:
            return
        self.failed_votes += sum(1 for outcome in event.outcomes if outcome.vote in self.FAILED)


def chunking_check(decisions: int, commands: int, rounds: int, held: int, lost: int) -> str:
    """Empty when the window's averages fit one EXTEND_MANY per node per CHUNK locks of each round.

    Per round ``chunks = ceil(locks / CHUNK)``, so over the window
    ``locks / CHUNK <= chunks < locks / CHUNK + rounds``. Public data gives the
    chunks (commands / nodes, less at most one release per node per lost lock)
    and the decisions, not the locks sent: a round in flight at either edge of
    the window, and a lock found lost at its round's start (not sent), can put
    the two apart by up to the locks held plus the losses, hence the slack.
    """
    if not rounds:
        return ""
    chunks_hi = commands / NODES
    chunks_lo = (commands - lost * NODES) / NODES
    lo = (decisions - held - lost) / CHUNK
    hi = (decisions + held) / CHUNK + rounds
    if chunks_hi < lo or chunks_lo >= hi:
        return (
            f"{chunks_lo:,.0f}-{chunks_hi:,.0f} EXTEND_MANY per node for {decisions:,} decisions in {rounds:,} "
            f"rounds: outside [{lo:,.1f}, {hi:,.1f}), what ceil(locks / {CHUNK}) per round allows"
        )
    return ""


# -- one pass --------------------------------------------------------------------------


EXIT_WAVE = 250
"""Holders that leave per loop turn at the end of a pass.

Holders of a real service finish at different times. Waking 10,000 at
once makes one loop turn run 10,000 exits (release sends, ballots): about
2 s on this machine, longer than the 1 s ttl, so leases really run out on
the servers before they are released, on any single event loop. Waves of
250, each let go once the one before has left, keep the loop within what
it can do; losses at exit are still counted and reported apart."""


async def drain(holders: Holders, count: int) -> None:
    """Let the watched holders exit in waves, each once the one before has left (naive ones watch hold_over)."""
    deadline = perf() + 60
    for start in range(0, count, EXIT_WAVE):
        wave = min(EXIT_WAVE, count - start)
        for _ in range(wave):
            holders.exit_gate.release()
        while holders.exited < start + wave and perf() < deadline:  # noqa: ASYNC110 - a count, not an event
            await asyncio.sleep(0.001)


class Holders:
    """The holder tasks of one pass and their shared counters."""

    def __init__(self, mode: Mode, locks: Sequence[Lock], concurrency: int) -> None:
        self.mode = mode
        self.locks = locks
        self.sem = asyncio.Semaphore(concurrency)
        self.all_settled = asyncio.Event()
        self.hold_over = asyncio.Event()
        # Watched holders leave through this gate, EXIT_WAVE per loop turn (see drain()).
        self.exit_gate = asyncio.Semaphore(0)
        self.exited = 0
        self.settled = 0
        self.held = 0
        self.not_acquired = 0
        self.lost = 0
        self.lost_reasons: Counter[str] = Counter()
        self.extends = 0  # naive: successful extend() calls
        self.attempts = 0  # naive: extend() calls (each sends one EXTEND per node)
        self.extend_latencies: list[float] = []
        self.recording = False
        self.started = perf()
        self.first_loss: float | None = None  # seconds after the holders started

    def _settle(self, held: bool) -> None:
        self.settled += 1
        self.held += held
        if self.settled == len(self.locks):
            self.all_settled.set()

    def _lost(self, exc: LockLost) -> None:
        self.lost += 1
        if self.first_loss is None:
            self.first_loss = perf() - self.started
        self.lost_reasons[re.sub(r"'[^']*'", "'...'", str(exc)).split(";")[0][:100]] += 1

    async def watched(self, lock: Lock) -> None:
        await self.sem.acquire()
        entered = False
        try:
            async with lock:
                entered = True
                self.sem.release()
                self._settle(True)
                await self.exit_gate.acquire()
        except LockNotAcquired:
            self.not_acquired += 1
            self._settle(False)
        except LockLost as exc:
            self._lost(exc)
        finally:
            if not entered:
                self.sem.release()
            self.exited += 1

    async def naive(self, lock: Lock) -> None:
        async with self.sem:
            acquired = await lock.acquire()
        if not acquired:
            self.not_acquired += 1
            self._settle(False)
            return
        self._settle(True)
        try:
            period = lock.ttl / 3
            while not self.hold_over.is_set():
                await asyncio.sleep(period)
                if self.hold_over.is_set():
                    break
                started = perf()
                self.attempts += 1
                await lock.extend()
                if self.recording:
                    self.extend_latencies.append(perf() - started)
                self.extends += 1
        except LockLost as exc:
            self._lost(exc)
        finally:
            if lock.token is not None:  # still held: also when the holder is cancelled
                await lock.release()


async def run_pass(cluster: LocalNodes, mode: Mode, order: int, cfg: Config) -> PassResult:
    cluster.flush()
    gc.collect()
    result = PassResult(mode=mode, order=order, locks=cfg.locks)
    warnings0 = LIBRARY_LOG.levels["WARNING"]
    recorder = EventRecorder()
    async with Redlock(cluster.urls, ttl=TTL, auto_extend=mode == "watchdog", on_event=recorder) as rl:
        locks = [rl.lock(f"bench:wd:{i}") for i in range(cfg.locks)]
        holders = Holders(mode, locks, cfg.concurrency)
        body = holders.watched if mode == "watchdog" else holders.naive
        started = perf()
        tasks = [asyncio.create_task(body(lock)) for lock in locks]
        try:
            async with asyncio.timeout(cfg.phase_timeout):
                await holders.all_settled.wait()
            result.acquire_s = perf() - started
            result.acquired, result.not_acquired = holders.held, holders.not_acquired

            # -- the hold window --
            probe = Probe(locks[:: max(1, len(locks) // VALIDITY_SAMPLE)])
            server0 = server_snapshot(cluster)
            ext0 = sum(lock.statistics().extensions for lock in locks)
            before = rl.statistics()
            lost0, extends0, attempts0 = holders.lost, holders.extends, holders.attempts
            recorder.active = True
            holders.recording = True
            GC_MONITOR.reset()
            GC_MONITOR.active = True
            probe_task = asyncio.create_task(probe.run())
            wall0, cpu0 = perf(), time.process_time()
            await asyncio.sleep(cfg.hold)
            cpu1, wall1 = time.process_time(), perf()
            probe.stopped = True
            holders.recording = False
            GC_MONITOR.active = False
            recorder.active = False
            ext1 = sum(lock.statistics().extensions for lock in locks)
            after = rl.statistics()
            lost1, extends1, attempts1 = holders.lost, holders.extends, holders.attempts
            server1 = server_snapshot(cluster)
            await probe_task

            # -- drain: every holder exits and releases --
            drain0 = perf()
            holders.hold_over.set()
            if mode == "watchdog":
                await drain(holders, len(locks))
            async with asyncio.timeout(cfg.phase_timeout):
                await asyncio.gather(*tasks)
            result.drain_s = perf() - drain0
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    result.hold_wall_s = wall1 - wall0
    result.probe_cpu_s = probe.cpu
    result.hold_cpu_s = cpu1 - cpu0 - probe.cpu
    result.lost, result.lost_before_window, result.lost_in_window = holders.lost, lost0, lost1 - lost0
    result.lost_reasons = dict(holders.lost_reasons)
    result.loop_lag_ms = quantiles_ms(probe.lags)
    result.min_validity_s = probe.min_validity
    result.server_calls = [b[0] - a[0] for a, b in zip(server0, server1, strict=True)]
    calls = result.server_round_trips
    result.server_usec_per_call = (
        sum(b[1] - a[1] for a, b in zip(server0, server1, strict=True)) / calls if calls else 0
    )
    result.server_cpu_s = sum(b[2] - a[2] for a, b in zip(server0, server1, strict=True))
    result.client_commands = sum(n.sent for n in after.nodes) - sum(n.sent for n in before.nodes)
    result.failed_votes = recorder.failed_votes
    result.event_duration_ms = quantiles_ms(recorder.durations)
    result.min_margin_s = recorder.min_margin if math.isfinite(recorder.min_margin) else math.nan
    if mode == "watchdog":
        result.extensions = ext1 - ext0
        result.extensions_total = ext1
        result.rounds = after.watchdog_rounds - before.watchdog_rounds
        result.retries = after.watchdog_retries - before.watchdog_retries
        result.watchdog_lost_events = recorder.watchdog_lost
        # Each lock sent in a round is decided once: extended, tried again, or lost.
        result.extend_attempts = recorder.watchdog_extended + result.retries + recorder.watchdog_lost
        result.latency_ms = quantiles_ms(recorder.durations)
        result.late_by_ms = quantiles_ms(recorder.late_by)
        if result.rounds:
            result.locks_per_round_mean = result.extend_attempts / result.rounds
            result.chunks_per_round_mean = result.client_commands / result.rounds / NODES
        result.chunk_check = chunking_check(
            result.extend_attempts, result.client_commands, result.rounds, result.acquired, recorder.lost
        )
    else:
        result.extensions = extends1 - extends0
        result.extensions_total = holders.extends
        result.extend_attempts = attempts1 - attempts0
        result.latency_ms = quantiles_ms(holders.extend_latencies)
    result.first_loss_s = holders.first_loss if holders.first_loss is not None else math.nan
    result.gc_collections = dict(GC_MONITOR.count)
    result.gc_pause_s = GC_MONITOR.total
    result.gc_max_pause_ms = GC_MONITOR.max_pause * 1000
    result.leftover_keys = key_count(cluster)
    result.log_warnings = LIBRARY_LOG.levels["WARNING"] - warnings0
    return result


async def memory_pass(cluster: LocalNodes, mode: Mode, cfg: Config) -> MemoryResult:
    """Traced bytes per held lock: Lock + name/key/token + holder task + its frames + watchdog entry.

    The ttl is MEMORY_TTL here: tracemalloc snapshots block the loop for seconds,
    and no lock may run out (or be extended) while they do. What a held lock
    keeps in memory does not depend on its ttl.
    """
    cluster.flush()
    async with Redlock(cluster.urls, ttl=MEMORY_TTL, auto_extend=mode == "watchdog") as rl:
        gc.collect()
        tracemalloc.start()
        try:
            base_bytes = tracemalloc.get_traced_memory()[0]
            base = tracemalloc.take_snapshot()
            locks = [rl.lock(f"bench:wd:{i}") for i in range(cfg.locks)]
            gc.collect()
            made_bytes = tracemalloc.get_traced_memory()[0]
            holders = Holders(mode, locks, cfg.concurrency)
            body = holders.watched if mode == "watchdog" else holders.naive
            tasks = [asyncio.create_task(body(lock)) for lock in locks]
            try:
                async with asyncio.timeout(cfg.phase_timeout * 2):
                    await holders.all_settled.wait()
                gc.collect()
                held_bytes = tracemalloc.get_traced_memory()[0]
                held = tracemalloc.take_snapshot()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            tracemalloc.stop()
    growth = [s for s in held.compare_to(base, "lineno") if s.traceback[0].filename != tracemalloc.__file__]
    n = cfg.locks
    top = [
        (f"{Path(s.traceback[0].filename).name}:{s.traceback[0].lineno}", s.size_diff / n) for s in growth[:MEMORY_TOP]
    ]
    return MemoryResult(
        mode=mode,
        locks=n,
        held=holders.held,
        lock_objects_bytes=(made_bytes - base_bytes) / n,
        held_bytes=(held_bytes - base_bytes) / n,
        top_sites=top,
    )


# -- the run and the report ------------------------------------------------------------


def environment(cluster: LocalNodes) -> dict[str, Any]:
    info = cluster[0].command("INFO", "server")
    assert isinstance(info, dict)
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "redis_py": redis.__version__,
        "hiredis": hiredis.__version__,
        "server": f"valkey {info.get('valkey_version', '?')}" if "valkey_version" in info else info["redis_version"],
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "platform": platform.platform(),
        "nodes": NODES,
        "chunk": CHUNK,
        "library": library_commit(),
    }


def memory_pass_estimate(locks: int) -> float:
    """Seconds one tracemalloc pass takes here (about 17 s for 10,000 locks on 2 slow cores), with margin."""
    return 3.0 + locks * 0.002


async def run_all(cluster: LocalNodes, cfg: Config) -> tuple[list[PassResult], list[MemoryResult], list[str]]:
    """Every pass within cfg.budget seconds; what ran out of time is reported, not hidden."""
    passes: list[PassResult] = []
    memory: list[MemoryResult] = []
    notes: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cfg.budget
    try:
        async with asyncio.timeout_at(deadline):
            await _run_passes(cluster, cfg, passes, memory, notes, deadline)
    except TimeoutError:
        notes.append(f"the overall budget of {cfg.budget:.0f} s ran out: figures of the unfinished pass are missing")
    return passes, memory, notes


async def _run_passes(
    cluster: LocalNodes,
    cfg: Config,
    passes: list[PassResult],
    memory: list[MemoryResult],
    notes: list[str],
    deadline: float,
) -> None:
    loop = asyncio.get_running_loop()
    order = 0
    for pair in range(cfg.repeats):
        modes: tuple[Mode, Mode] = ("naive", "watchdog") if pair % 2 == 0 else ("watchdog", "naive")
        for mode in modes:
            res = await run_pass(cluster, mode, order, cfg)
            order += 1
            passes.append(res)
            if res.chunk_check:
                notes.append(f"pass {res.order} ({mode}) failed the chunking check: {res.chunk_check}")
            print(
                f"  pass {res.order} {mode:8}: held {res.acquired}/{res.locks} in {res.acquire_s:.2f} s, "
                f"lost {res.lost}, cpu {res.cpu_per_wall:.2f} s/s, {res.extensions_per_s:,.0f} ext/s, "
                f"{res.round_trips_per_s:,.0f} server calls/s",
                flush=True,
            )
    if cfg.memory:
        for mode in ("naive", "watchdog"):
            if deadline - loop.time() < memory_pass_estimate(cfg.locks):
                notes.append(f"memory pass ({mode}) skipped: not enough of the time budget left")
                continue
            mem = await memory_pass(cluster, mode, cfg)
            memory.append(mem)
            print(f"  memory {mode:8}: {mem.held_bytes:,.0f} B per held lock", flush=True)


def median(values: Sequence[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return statistics.median(clean) if clean else math.nan


def pair_ratios(passes: Sequence[PassResult], metric: Callable[[PassResult], float]) -> float:
    """Median over pairs of metric(watchdog) / metric(naive), each pair measured back to back."""
    ratios: list[float] = []
    for i in range(0, len(passes) - 1, 2):
        a, b = passes[i], passes[i + 1]
        wd, nv = (a, b) if a.mode == "watchdog" else (b, a)
        denominator = metric(nv)
        if denominator:
            ratios.append(metric(wd) / denominator)
    return median(ratios)


def fmt(value: float, spec: str = ",.0f") -> str:
    return "n/a" if math.isnan(value) else format(value, spec)


def verdicts(cfg: Config, by_mode: dict[str, list[PassResult]]) -> list[str]:
    """One line per mode: did it keep every lock, and what that means for the ratios."""
    out: list[str] = []
    for mode, label in (("watchdog", "Watchdog"), ("naive", "Naive baseline")):
        results = by_mode[mode]
        lost = [p.lost for p in results]
        if not results:
            out.append(f"- {label}: no pass finished.")
            continue
        if not any(lost):
            out.append(f"- {label}: kept all {cfg.locks:,} locks in every pass (0 LockLost).")
            continue
        first = min(p.first_loss_s for p in results if p.lost)
        out.append(
            f"- **{label}: LOST locks** ({', '.join(f'{n:,}' for n in lost)} of {cfg.locks:,} per pass; first "
            f"LockLost {first:.2f} s after acquiring began). Its CPU and round-trip figures then cover fewer "
            "locks than were asked for: compare CPU per extension, not CPU totals."
        )
        if mode == "naive":
            attempts = median([p.extend_attempts for p in results])
            cpu = median([p.hold_cpu_s for p in results])
            if attempts < 1000:
                out.append("  Too few extend() calls in the window to project what keeping every lock would cost.")
            else:
                need = cfg.locks / (TTL / 3)
                out.append(
                    f"  Keeping all {cfg.locks:,} locks the naive way needs {need:,.0f} extend() calls/s; at the "
                    f"measured {cpu / attempts * 1e6:,.0f} us CPU per call that is {cpu / attempts * need:.2f} "
                    "CPU s per s on one event loop (projection)."
                )
    return out


def report(
    env: dict[str, Any],
    cfg: Config,
    passes: Sequence[PassResult],
    memory: Sequence[MemoryResult],
    notes: Sequence[str] = (),
) -> str:
    by_mode = {mode: [p for p in passes if p.mode == mode] for mode in ("naive", "watchdog")}

    def med(mode: str, metric: Callable[[PassResult], float]) -> float:
        return median([metric(p) for p in by_mode[mode]])

    def worst(mode: str, metric: Callable[[PassResult], float], how: Callable[[list[float]], float]) -> float:
        values = [metric(p) for p in by_mode[mode]]
        return how(values) if values else math.nan

    rows: list[tuple[str, Callable[[PassResult], float], str, bool, Callable[[list[float]], float] | None]] = [
        # label, metric, format, ratio?, how to aggregate passes (None: the median)
        ("locks held / of", lambda p: p.acquired, ",.0f", False, None),
        ("acquire all (s)", lambda p: p.acquire_s, ".2f", False, None),
        ("locks lost (LockLost), worst pass", lambda p: p.lost, ",.0f", False, max),
        ("  lost before the window (while acquiring)", lambda p: p.lost_before_window, ",.0f", False, max),
        ("locks lost in the hold window, worst pass", lambda p: p.lost_in_window, ",.0f", False, max),
        (
            "  lost at exit (holders all woken at once), worst pass",
            lambda p: p.lost - p.lost_before_window - p.lost_in_window,
            ",.0f",
            False,
            max,
        ),
        ("hold window (s)", lambda p: p.hold_wall_s, ".2f", False, None),
        ("process CPU in window (s)", lambda p: p.hold_cpu_s, ".2f", True, None),
        ("process CPU s per wall s", lambda p: p.cpu_per_wall, ".3f", True, None),
        ("extension attempts in window", lambda p: p.extend_attempts, ",.0f", True, None),
        ("successful extensions in window", lambda p: p.extensions, ",.0f", True, None),
        ("extensions per s", lambda p: p.extensions_per_s, ",.0f", True, None),
        ("extensions per lock per s", lambda p: p.extensions_per_s / p.locks, ".2f", True, None),
        ("CPU us per extension", lambda p: p.cpu_us_per_extension, ".1f", True, None),
        ("watchdog rounds per s", lambda p: p.rounds / p.hold_wall_s, ",.1f", False, None),
        ("locks per round (mean: decisions / rounds)", lambda p: p.locks_per_round_mean, ",.0f", False, None),
        (
            "EXTEND_MANY per node per round (mean: commands / rounds / nodes)",
            lambda p: p.chunks_per_round_mean,
            ".2f",
            False,
            None,
        ),
        (
            "commands sent per s (client, all nodes: statistics() sent)",
            lambda p: p.client_commands / p.hold_wall_s,
            ",.0f",
            True,
            None,
        ),
        (
            "server EVALSHA calls per s, node 0 (round trips)",
            lambda p: p.server_calls[0] / p.hold_wall_s,
            ",.0f",
            True,
            None,
        ),
        ("server EVALSHA calls per s, all nodes", lambda p: p.round_trips_per_s, ",.0f", True, None),
        (
            "  less the RELEASE of locks lost in the window (1 per node each)",
            lambda p: (p.server_round_trips - p.lost_in_window * NODES) / p.hold_wall_s,
            ",.0f",
            True,
            None,
        ),
        ("server usec per call", lambda p: p.server_usec_per_call, ".1f", False, None),
        ("server CPU s per wall s (5 nodes)", lambda p: p.server_cpu_s / p.hold_wall_s, ".3f", True, None),
        ("extension latency p50 (ms)", lambda p: p.latency_ms.get("p50", math.nan), ".2f", False, None),
        ("extension latency p99 (ms)", lambda p: p.latency_ms.get("p99", math.nan), ".2f", False, None),
        ("extension latency max (ms), worst pass", lambda p: p.latency_ms.get("max", math.nan), ".2f", False, max),
        (
            "EXTENDED event duration p50 (ms): send to decision",
            lambda p: p.event_duration_ms.get("p50", math.nan),
            ".2f",
            False,
            None,
        ),
        (
            "EXTENDED event duration p99 (ms): send to decision",
            lambda p: p.event_duration_ms.get("p99", math.nan),
            ".2f",
            False,
            None,
        ),
        ("watchdog late_by p99 (ms)", lambda p: p.late_by_ms.get("p99", math.nan), ".2f", False, None),
        ("watchdog late_by max (ms), worst pass", lambda p: p.late_by_ms.get("max", math.nan), ".2f", False, max),
        ("lowest margin at an extension (s), worst pass", lambda p: p.min_margin_s, ".3f", False, min),
        (
            "node votes error/timeout/skipped at decisions, worst pass",
            lambda p: p.failed_votes,
            ",.0f",
            False,
            max,
        ),
        ("watchdog retries (round missed a majority), worst pass", lambda p: p.retries, ",.0f", False, max),
        ("first LockLost, s after acquiring began", lambda p: p.first_loss_s, ".2f", False, min),
        ("GC pause in window (s), worst pass", lambda p: p.gc_pause_s, ".3f", False, max),
        ("longest GC pause (ms), worst pass", lambda p: p.gc_max_pause_ms, ".1f", False, max),
        ("full (gen 2) collections in window", lambda p: p.gc_collections.get(2, 0), ",.0f", False, max),
        ("event-loop lag p50 (ms)", lambda p: p.loop_lag_ms.get("p50", math.nan), ".2f", False, None),
        ("event-loop lag p99 (ms)", lambda p: p.loop_lag_ms.get("p99", math.nan), ".2f", False, None),
        ("event-loop lag max (ms), worst pass", lambda p: p.loop_lag_ms.get("max", math.nan), ".2f", False, max),
        ("lowest validity seen, sampled locks (s)", lambda p: p.min_validity_s, ".3f", False, min),
        ("drain: exit + release all (s)", lambda p: p.drain_s, ".2f", False, None),
        ("keys left on the nodes after release", lambda p: p.leftover_keys, ",.0f", False, max),
        ("library WARNING log records", lambda p: p.log_warnings, ",.0f", False, max),
    ]
    lines = [
        f"## redlock_async watchdog: {cfg.locks:,} locks, ttl {TTL:g} s, held {cfg.hold:g} s, "
        f"{cfg.repeats} pair(s) of passes",
        "",
        "| metric | naive (sleep+extend per lock) | watchdog | watchdog / naive |",
        "|---|---:|---:|---:|",
    ]
    for label, metric, spec, ratio, how in rows:
        cells = []
        for mode in ("naive", "watchdog"):
            value = med(mode, metric) if how is None else worst(mode, metric, how)
            cells.append(fmt(value, spec))
        if label.startswith("locks held"):
            cells = [f"{c} / {cfg.locks:,}" for c in cells]
        ratio_cell = fmt(pair_ratios(passes, metric), ".3f") if ratio else ""
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio_cell} |")
    if memory:
        mem = {m.mode: m for m in memory}
        objects = [fmt(mem[m].lock_objects_bytes) if m in mem else "n/a" for m in ("naive", "watchdog")]
        held = [fmt(mem[m].held_bytes) if m in mem else "n/a" for m in ("naive", "watchdog")]
        mem_ratio = fmt(mem["watchdog"].held_bytes / mem["naive"].held_bytes, ".3f") if len(mem) == 2 else ""
        lines.append(f"| memory per lock, Lock objects only (B, tracemalloc) | {objects[0]} | {objects[1]} | |")
        lines.append(f"| memory per held lock, all in (B, tracemalloc) | {held[0]} | {held[1]} | {mem_ratio} |")
    lines += ["", *verdicts(cfg, by_mode)]
    lines += [f"- Note: {note}." for note in notes]
    lines += [
        "",
        'Figures are medians over passes ("worst pass": the max, or the min for validity); ratios are '
        "watchdog / naive within each back-to-back pair, then the median. Process CPU excludes the probe "
        "task (loop lag + validity sample). Server calls are `INFO commandstats` EVALSHA+EVAL deltas over "
        "the window: only extensions run then (and the releases of locks lost in it); so are the client's "
        "commands sent (`statistics()`: the nodes' `sent`). Naive latency is one `await lock.extend()`; "
        "watchdog latency is an EXTENDED event's `duration`: the round's time to a majority decision for "
        "that lock (from the round's start), not one command's send-to-reply time. The EXTENDED event "
        "duration rows are the same measure for both modes (extend(): first send to decision). Both modes "
        "run with an `on_event` callback, so CPU figures include one LockEvent per extension. Locks and "
        "EXTEND_MANY per round are window averages; failed votes are per lock and node, as seen when the "
        "decision was taken.",
    ]
    if memory:
        lines += [
            "",
            "Memory per held lock: traced bytes from before `rl.lock()` to all held (after gc), over the lock count. "
            "It includes the Lock, its name/key/token, the holder Task and its coroutine frames, what the task "
            "waits on (naive: a sleep timer + future; watchdog: an Event waiter future), the watchdog's heap "
            "entry and dict slot, and the benchmark's two list slots (16 B). Top growth sites (B per lock):",
            "",
        ]
        for m in memory:
            sites = ", ".join(f"{site} {size:,.0f}" for site, size in m.top_sites[:5])
            lines.append(f"- {m.mode}: {sites}")
    reasons: Counter[str] = Counter()
    for p in passes:
        reasons.update(p.lost_reasons)
    if reasons:
        lines += ["", "LockLost reasons (all passes):", ""]
        lines += [f"- {count:,} x {reason}" for reason, count in reasons.most_common(5)]
    lines += [
        "",
        f"Environment: Python {env['python']} ({env['implementation']}), redis-py {env['redis_py']}, "
        f"hiredis {env['hiredis']}, {env['server']}, cpu_count {env['cpu_count']} (affinity {env['cpu_affinity']}), "
        f"{env['nodes']} local nodes, EXTEND_MANY chunk {env['chunk']}, {env['platform']}, "
        f"redlock_async at {env['library']}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--locks", type=int, default=None, help="locks held at once (default 10000; quick 1000)")
    parser.add_argument("--hold", type=float, default=None, help="hold window in seconds (default 10; quick 3)")
    parser.add_argument(
        "--repeats", type=int, default=1, help="pairs of passes, order alternating (default 1: 2 minutes allow one)"
    )
    parser.add_argument("--budget", type=float, default=None, help="overall time bound in seconds (110; quick 25)")
    parser.add_argument("--concurrency", type=int, default=256, help="acquires in flight at once")
    parser.add_argument("--quick", action="store_true", help="1,000 locks for 3 s, one pair: under 30 s")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc passes")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    args = parser.parse_args(argv)
    locks = args.locks if args.locks is not None else (1000 if args.quick else 10_000)
    hold = args.hold if args.hold is not None else (3.0 if args.quick else 10.0)
    budget = args.budget if args.budget is not None else (25.0 if args.quick else 110.0)
    if locks < 1 or hold <= 0 or args.repeats < 1 or args.concurrency < 1 or budget <= 0:
        parser.error("--locks, --hold, --repeats, --concurrency and --budget must be positive")
    cfg = Config(
        locks=locks,
        hold=hold,
        repeats=args.repeats,
        concurrency=args.concurrency,
        memory=not args.no_memory,
        budget=budget,
        phase_timeout=min(budget, 30.0 + locks / 500),
    )
    library_logger = logging.getLogger("redlock_async")
    library_logger.addHandler(LIBRARY_LOG)
    library_logger.propagate = False
    gc.callbacks.append(GC_MONITOR)
    started = perf()
    with LocalNodes(NODES) as cluster:
        env = environment(cluster)
        preload_scripts(cluster)
        print(f"{NODES} nodes up; {cfg.locks:,} locks, hold {cfg.hold:g} s, {cfg.repeats} pair(s)", flush=True)
        passes, memory, notes = asyncio.run(run_all(cluster, cfg))
    text = report(env, cfg, passes, memory, notes)
    print()
    print(text)
    print(f"\n(total {perf() - started:.1f} s)")
    if args.json is not None:
        payload = {
            "environment": env,
            "config": asdict(cfg),
            "passes": [p.summary() for p in passes],
            "memory": [asdict(m) for m in memory],
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    lost = sum(p.lost for p in passes if p.mode == "watchdog")
    chunking = any(p.chunk_check for p in passes)
    return 1 if lost or chunking or len(passes) < 2 * cfg.repeats else 0


if __name__ == "__main__":
    sys.exit(main())
