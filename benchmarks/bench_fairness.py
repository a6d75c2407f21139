"""Fairness across OS processes: who gets the lock, and how often it changes process (issue 27).

Usage::

    python benchmarks/bench_fairness.py [--rounds N] [--window S] [--modes default,fencing,words,words+fencing]
                                        [--json PATH] [--loop asyncio|uvloop]

Exit status 1 when two bodies overlapped, a fencing token did not grow in the order the bodies ran,
or a process failed.

One run starts ``LocalNodes(5)`` (real valkey-server processes on 127.0.0.1). In each round, for each
mode (the order rotates from round to round, so every mode sees the same machine noise), PROCESSES
child processes with TASKS tasks each loop ``async with lock: await asyncio.sleep(HOLD)`` on ONE
resource for the window. Each child records its bodies (``time.monotonic``, system-wide on Linux) and
their fencing tokens; the parent merges them and reports, per mode:

* **share**: each process's fraction of the grants (the lowest and the highest); the issue's bar is
  every process within 35-65%;
* **changed**: the fraction of grants (after the first) that went to another process than the one
  before; the bar is >= 40% (a perfectly alternating line of 2 processes gives ~50%);
* grants per second, overlaps and fencing-token regressions (which must be 0).

Modes: ``default`` (``Redlock(urls)``: the grant queue), ``fencing`` (``fencing=True``), ``words``
(``queue=False``: release words, the default before issue 27), ``words+fencing`` (both).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
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
HOLD = 0.002
RESOURCE = "bench:fairness"
MODES = ("default", "fencing", "words", "words+fencing")


# -- the child processes -----------------------------------------------------------------------


async def child(urls: list[str], mode: str) -> None:
    """Contend until the parent's stop time; print every grant as [start, end, fencing token]."""
    grants: list[tuple[float, float, int | None]] = []
    errors: list[str] = []

    async def task(redlock: Redlock, stop_at: float) -> None:
        lock = redlock.lock(RESOURCE)
        while time.monotonic() < stop_at:
            try:
                async with lock:
                    start = time.monotonic()
                    await asyncio.sleep(HOLD)
                    grants.append((start, time.monotonic(), lock.fencing_token))
            except LockNotAcquired:
                errors.append("timeout")
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return

    async with Redlock(urls, queue=False if "words" in mode else None, fencing="fencing" in mode) as redlock:
        await redlock.connect()
        print("ready", flush=True)
        go = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        stop_at = float(go.split()[1])
        await asyncio.gather(*(task(redlock, stop_at) for _ in range(TASKS)))
    print(json.dumps({"grants": grants, "errors": errors}), flush=True)


# -- the parent ----------------------------------------------------------------------------------


@dataclass
class Run:
    mode: str
    grants: int
    shares: list[float]
    changed: float
    overlaps: int
    regressions: int
    errors: list[str]


async def contend(urls: list[str], mode: str, window: float, loop_name: str) -> Run:
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
        stop_at = time.monotonic() + 0.2 + window
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {stop_at}\n".encode())
            await proc.stdin.drain()
        results = []
        async with asyncio.timeout(window + 30):
            for proc in procs:
                assert proc.stdout is not None
                results.append(json.loads(await proc.stdout.readline()))
                await proc.wait()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    bodies = sorted((start, end, p, token) for p, r in enumerate(results) for start, end, token in r["grants"])
    counts = collections.Counter(body[2] for body in bodies)
    pairs = list(itertools.pairwise(bodies))
    return Run(
        mode=mode,
        grants=len(bodies),
        shares=[counts[p] / max(1, len(bodies)) for p in range(PROCESSES)],
        changed=sum(a[2] != b[2] for a, b in pairs) / max(1, len(pairs)),
        overlaps=sum(b[0] < a[1] for a, b in pairs),
        regressions=sum(a[3] is not None and b[3] is not None and b[3] <= a[3] for a, b in pairs),
        errors=[e for r in results for e in r["errors"]][:5],
    )


async def run(rounds: int, window: float, modes: Sequence[str], loop_name: str) -> tuple[dict[str, Any], bool]:
    runs: dict[str, list[Run]] = {mode: [] for mode in modes}
    with LocalNodes(NODES) as nodes:
        for index in range(rounds):
            shift = index % len(modes)
            for mode in (*modes[shift:], *modes[:shift]):
                runs[mode].append(await contend(nodes.urls, mode, window, loop_name))
    print(
        f"\n## Fairness: {PROCESSES} processes x {TASKS} tasks, {HOLD * 1e3:g} ms bodies, {window:g} s, "
        f"{rounds} rounds, {NODES} nodes ({loop_name}, commit {library_commit()})\n"
    )
    print("| mode | grants/s (median) | lowest share (min over rounds) | highest share (max) | changed process "
          "(median, min) | overlaps | token regressions |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    bad = False
    for mode, done in runs.items():
        rate = statistics.median(r.grants / window for r in done)
        low = min(min(r.shares) for r in done)
        high = max(max(r.shares) for r in done)
        changed = [r.changed for r in done]
        overlaps = sum(r.overlaps for r in done)
        regressions = sum(r.regressions for r in done)
        bad = bad or bool(overlaps or regressions or any(r.errors for r in done))
        print(
            f"| {mode} | {rate:.0f} | {low:.0%} | {high:.0%} | {statistics.median(changed):.0%}, "
            f"{min(changed):.0%} | {overlaps} | {regressions} |"
        )
    print("\nPer round (shares of process 0 / 1, changed):")
    for mode, done in runs.items():
        cells = ", ".join(f"{r.shares[0]:.0%}/{r.shares[1]:.0%} {r.changed:.0%}" for r in done)
        print(f"- {mode}: {cells}")
    data = {
        "benchmark": "fairness",
        "window": window,
        "rounds": rounds,
        "runs": {mode: [asdict(r) for r in done] for mode, done in runs.items()},
    }
    return data, bad


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("urls", nargs="?", help=argparse.SUPPRESS)
    add_loop_option(parser)
    args = parser.parse_args(argv)
    if args.child:
        run_on(args.loop, child(args.urls.split(","), args.child))
        return 0
    modes = tuple(args.modes.split(","))
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}: choose from {', '.join(MODES)}")
    data, bad = run_on(args.loop, run(args.rounds, args.window, modes, args.loop))
    if args.json:
        args.json.write_text(json.dumps(data, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
