"""In-process A/B of the uncontended path: two trees side by side in one process, on one event loop.

Usage::

    python benchmarks/bench_inproc.py --trees OLD_DIR NEW_DIR [--rounds 30] [--loop asyncio|uvloop]

:mod:`bench_ab` runs each side in a child process of its own, one after the other: on a shared,
busy machine the load changes between the two runs, and its ratios move by several percent from
one run to the next. Here each tree's ``redlock_async/`` is copied under a package name of its own
(``redlock_ab0``, ``redlock_ab1``: every ``redlock_async`` in its sources renamed), both are
imported into one process, and blocks of sequential acquire+release pairs alternate between the two
Redlocks on the same loop against the same 5 local nodes, so the machine's load falls on both alike.
Printed: the median p50 of each side and the median of the per-round ratios new/old; with
``--concurrent``, also 64 tasks on locks of their own (pairs per second, client CPU per pair).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from redlock_async.testing import LocalNodes

BLOCK = 300  # sequential pairs per side per round
TASKS = 64
PER_TASK = 20


def renamed_copy(tree: Path, name: str, into: Path) -> None:
    """*tree*'s ``redlock_async`` package as package *name* under *into*."""
    target = into / name
    shutil.copytree(tree / "redlock_async", target, ignore=shutil.ignore_patterns("__pycache__"))
    for source in target.rglob("*.py"):
        source.write_text(source.read_text().replace("redlock_async", name))


async def sequential(lock: Any, n: int) -> float:
    """The p50 of *n* acquire+release pairs, in seconds."""
    times = []
    for _ in range(n):
        began = time.perf_counter()
        await lock.acquire()
        await lock.release()
        times.append(time.perf_counter() - began)
    times.sort()
    return times[len(times) // 2]


async def concurrent(redlock: Any, tag: str) -> tuple[float, float]:
    """(pairs per second, client CPU seconds per pair) of TASKS tasks on locks of their own."""

    async def worker(i: int) -> None:
        mine = redlock.lock(f"inproc:{tag}:{i}", ttl=10.0)
        for _ in range(PER_TASK):
            await mine.acquire()
            await mine.release()

    began, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(i) for i in range(TASKS)))
    pairs = TASKS * PER_TASK
    return pairs / (time.perf_counter() - began), (time.process_time() - cpu) / pairs


def setting(text: str) -> tuple[str, object]:
    """``name=value`` (a Python literal: ``queue=False``, ``ttl=10.0``) for ``--new-settings``."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected name=value (e.g. queue=False), got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Python literal (True, 10.0, 'x')") from None


async def run(
    names: list[str], urls: list[str], rounds: int, with_concurrent: bool, new_settings: dict[str, object]
) -> None:
    modules = [importlib.import_module(name) for name in names]
    redlocks = [modules[0].Redlock(urls), modules[1].Redlock(urls, **new_settings)]
    for redlock in redlocks:
        await redlock.connect()
    try:
        locks = [redlock.lock(f"inproc:seq:{k}", ttl=10.0) for k, redlock in enumerate(redlocks)]
        for lock in locks:
            await sequential(lock, 100)  # warm-up
        p50: list[list[float]] = [[], []]
        ops: list[list[float]] = [[], []]
        cpu: list[list[float]] = [[], []]
        for n in range(rounds):
            for k in (0, 1) if n % 2 == 0 else (1, 0):
                p50[k].append(await sequential(locks[k], BLOCK))
                if with_concurrent:
                    rate, used = await concurrent(redlocks[k], names[k])
                    ops[k].append(rate)
                    cpu[k].append(used)
    finally:
        for redlock in redlocks:
            await redlock.aclose()
    ratio = statistics.median(new / old for old, new in zip(p50[0], p50[1], strict=True))
    print(
        f"p50 old {statistics.median(p50[0]) * 1e6:.1f} us, new {statistics.median(p50[1]) * 1e6:.1f} us; "
        f"median of {rounds} per-round ratios new/old: {ratio:.3f}x"
    )
    if with_concurrent:
        throughput = statistics.median(new / old for old, new in zip(ops[0], ops[1], strict=True))
        used = statistics.median(new / old for old, new in zip(cpu[0], cpu[1], strict=True))
        print(f"{TASKS} tasks: throughput {throughput:.3f}x, CPU per pair {used:.3f}x (median of per-round ratios)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trees", nargs=2, metavar=("OLD", "NEW"), required=True)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--concurrent", action="store_true", help="also 64 tasks on locks of their own")
    parser.add_argument(
        "--new-settings",
        nargs="*",
        type=setting,
        default=[],
        metavar="NAME=VALUE",
        help="Redlock settings of the NEW side only (e.g. queue=False clock_guard=False: what a default costs)",
    )
    args = parser.parse_args()
    names = ["redlock_ab0", "redlock_ab1"]
    with tempfile.TemporaryDirectory(prefix="redlock-inproc-") as scratch, LocalNodes(5) as nodes:
        for tree, name in zip(args.trees, names, strict=True):
            renamed_copy(Path(tree), name, Path(scratch))
        sys.path.insert(0, scratch)
        work = run(names, nodes.urls, args.rounds, args.concurrent, dict(args.new_settings))
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(work)
        else:
            asyncio.run(work)
    given = " ".join(f"{name}={value!r}" for name, value in args.new_settings)
    print(f"{args.loop}: [{args.trees[1]}{' ' + given if given else ''}] / [{args.trees[0]}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
