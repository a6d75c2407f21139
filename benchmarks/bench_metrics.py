"""What redlock_async.metrics costs: CPU per acquire+release with each adapter, against none, in one run.

Usage::

    python benchmarks/bench_metrics.py [--quick] [--json PATH] [--loop asyncio|uvloop]

One run starts ``LocalNodes(5)`` and makes one Redlock per side, all connected to the same
nodes: ``none`` (no ``on_event``: the events are not even made), ``null`` (an ``on_event``
that does nothing: what making the events costs), ``prometheus``
(``Prometheus()`` on a registry of its own), ``otel-metrics`` (``OpenTelemetry(traces=False)``
on the SDK with an in-memory reader) and ``otel`` (the same with traces: an SDK tracer
provider whose BatchSpanProcessor exports to memory, as a production exporter would, off
the event loop). Each round runs every side in turn (the order rotates from round to round),
twice: ``sequential`` (one task, one lock: mostly waiting for the nodes) and ``64 tasks``
(each on its own lock: the loop busy, where the callbacks weigh most); within a round the
sides take short turns, so that all see the same machine. The figure is the process's CPU
time (``time.process_time``: every thread, the exporter's too) per acquire+release; the ratio
against ``none`` is taken within each round, and the median of those is reported. Target:
each adapter <= 1.15x.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import add_loop_option, library_commit, run_on
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from redlock_async import Redlock
from redlock_async.events import OnEvent
from redlock_async.metrics import OpenTelemetry, Prometheus
from redlock_async.testing import LocalNodes

TARGET = 1.15
TASKS = 64
SIDES = ("none", "null", "prometheus", "otel-metrics", "otel")


@dataclass(frozen=True)
class Config:
    rounds: int
    sequential_ops: int
    concurrent_ops: int  # per task


FULL = Config(rounds=9, sequential_ops=40, concurrent_ops=4)
QUICK = Config(rounds=3, sequential_ops=20, concurrent_ops=2)
SLICES = 10
"""Turns per round: each side runs SLICES short batches, taking turns with the others."""


def _null(event: object) -> None:
    """An on_event that does nothing: what making the events costs the library."""


def hooks() -> tuple[dict[str, OnEvent | None], list[Any]]:
    """Each side's on_event, and what must be shut down after."""
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    tracers = TracerProvider()
    tracers.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    return {
        "none": None,
        "null": _null,
        "prometheus": Prometheus(registry=CollectorRegistry()),
        "otel-metrics": OpenTelemetry(meter_provider=meters, traces=False),
        "otel": OpenTelemetry(
            meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]), tracer_provider=tracers
        ),
    }, [meters, tracers]


async def cpu_of(redlock: Redlock, side: str, tasks: int, ops: int) -> float:
    """CPU seconds for *tasks* tasks, each doing *ops* acquire+release pairs on a lock of its own."""

    async def worker(slot: int) -> None:
        lock = redlock.lock(f"bench-metrics:{side}:{slot}", ttl=10.0)
        for _ in range(ops):
            # Blocking: on a loaded machine a node may time out now and then, and the acquire tries again.
            if not await lock.acquire():
                raise RuntimeError(f"{side}: not acquired: {lock.outcomes}")
            await lock.release()

    started = time.process_time()
    await asyncio.gather(*(worker(slot) for slot in range(tasks)))
    return time.process_time() - started


async def bench(urls: list[str], cfg: Config) -> dict[str, Any]:
    on_event, providers = hooks()
    redlocks = {side: Redlock(urls, on_event=on_event[side]) for side in SIDES}
    modes = (("sequential", 1, cfg.sequential_ops), (f"{TASKS} tasks", TASKS, cfg.concurrent_ops))
    results: dict[str, dict[str, list[float]]] = {mode: {side: [] for side in SIDES} for mode, _, _ in modes}
    try:
        for redlock in redlocks.values():
            await redlock.connect()
        for _mode, tasks, ops in modes:  # warm-up: connections, scripts, caches, the adapters' first series
            for side in SIDES:
                await cpu_of(redlocks[side], side, tasks, ops)
        for _ in range(cfg.rounds):
            for mode, tasks, ops in modes:
                # The sides take short turns (the order rotating), so that each sees the same machine.
                cpu = dict.fromkeys(SIDES, 0.0)
                for turn in range(SLICES):
                    gc.collect()
                    for side in SIDES[turn % len(SIDES) :] + SIDES[: turn % len(SIDES)]:
                        cpu[side] += await cpu_of(redlocks[side], side, tasks, ops)
                for side in SIDES:
                    results[mode][side].append(cpu[side] / (SLICES * tasks * ops))
    finally:
        for redlock in redlocks.values():
            await redlock.aclose()
        for provider in providers:
            provider.shutdown()
    return results


def report(results: dict[str, dict[str, list[float]]], loop: str, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"loop": loop, "commit": library_commit(), "seconds": round(seconds, 1), "modes": {}}
    worst = 0.0
    print(f"redlock_async.metrics: CPU per acquire+release (loop {loop}, commit {out['commit']})")
    for mode, sides in results.items():
        base = sides["none"]
        print(f"  {mode}: none {statistics.median(base) * 1e6:.1f} us")
        figures: dict[str, Any] = {"none_us": statistics.median(base) * 1e6}
        for side in SIDES[1:]:
            ratios = [cpu / none for cpu, none in zip(sides[side], base, strict=True)]
            ratio = statistics.median(ratios)
            worst = max(worst, ratio)
            figures[side] = {"us": statistics.median(sides[side]) * 1e6, "ratio": ratio, "ratios": ratios}
            verdict = "ok" if ratio <= TARGET else "OVER"
            print(
                f"    {side:13} {statistics.median(sides[side]) * 1e6:7.1f} us  {ratio:.3f}x none "
                f"(rounds {min(ratios):.3f}-{max(ratios):.3f})  target <= {TARGET}x: {verdict}"
            )
        out["modes"][mode] = figures
    out["worst_ratio"] = worst
    out["target"] = TARGET
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and ops, for a smoke run (< 30 s)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the figures to PATH")
    add_loop_option(parser)
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    with LocalNodes(5) as cluster:
        started = time.perf_counter()
        results = run_on(args.loop, bench(cluster.urls, cfg))
        figures = report(results, args.loop, time.perf_counter() - started)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
