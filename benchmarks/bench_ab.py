"""Same-run A/B of the uncontended path: two trees of the library, or two settings of one tree.

Usage::

    python benchmarks/bench_ab.py --trees OLD_DIR NEW_DIR [--rounds 8] [--loop asyncio|uvloop]
    python benchmarks/bench_ab.py --settings 'clock_guard=False' 'clock_guard=True' [--rounds 8] [--loop uvloop]

Each round runs two child processes one after the other (the order alternates between rounds) against
the same 5 local nodes: each imports one side (a tree's ``redlock_async`` on PYTHONPATH, or this tree
with the given Redlock keyword settings) and measures, after a warm-up, the p50 of 600 sequential
acquire+release pairs on one lock, then 64 tasks on locks of their own for 2 s (pairs per second, and
client CPU per pair by ``time.process_time``). Printed: each round, and the median of the per-round
ratios new/old (the machine is noisy: only ratios taken within a round are compared). A tree is a
directory holding ``redlock_async/`` (e.g. ``git worktree add --detach /tmp/old <commit>``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from redlock_async.testing import LocalNodes

HERE = Path(__file__).resolve().parent

CHILD = r"""
import asyncio, json, sys, time
urls, loop, options = sys.argv[1].split(","), sys.argv[2], json.loads(sys.argv[3])
from redlock_async import Redlock

async def main():
    async with Redlock(urls, **options) as redlock:
        lock = redlock.lock("ab:seq", ttl=10.0)
        for _ in range(100):
            await lock.acquire()
            await lock.release()
        pairs = []
        for _ in range(600):
            began = time.perf_counter()
            await lock.acquire()
            await lock.release()
            pairs.append(time.perf_counter() - began)
        pairs.sort()

        async def worker(i, stop):
            mine, done = redlock.lock(f"ab:{i}", ttl=10.0), 0
            while time.perf_counter() < stop:
                await mine.acquire()
                await mine.release()
                done += 1
            return done

        stop = time.perf_counter() + 2.0
        cpu = time.process_time()
        counts = await asyncio.gather(*(worker(i, stop) for i in range(64)))
        cpu = time.process_time() - cpu
        print(json.dumps({"p50": pairs[len(pairs) // 2], "ops": sum(counts) / 2.0, "cpu": cpu / sum(counts)}))

if loop == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


def settings_of(text: str) -> dict[str, object]:
    """``'clock_guard=False, ttl=5'`` as keyword settings (values are Python literals)."""
    import ast

    call = ast.parse(f"f({text})", mode="eval").body
    assert isinstance(call, ast.Call)
    return {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords if keyword.arg}


def run(side: tuple[str, dict[str, object]], urls: list[str], loop: str) -> dict[str, float]:
    tree, options = side
    env = dict(os.environ, PYTHONPATH=tree) if tree else dict(os.environ)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, ",".join(urls), loop, json.dumps(options)],
        env=env,
        cwd=tree or str(HERE.parent),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sides = parser.add_mutually_exclusive_group(required=True)
    sides.add_argument("--trees", nargs=2, metavar=("OLD", "NEW"), help="two directories holding redlock_async/")
    sides.add_argument("--settings", nargs=2, metavar=("OLD", "NEW"), help="two Redlock keyword settings, e.g. 'x=1'")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    if args.trees:
        old: tuple[str, dict[str, object]] = (args.trees[0], {})
        new: tuple[str, dict[str, object]] = (args.trees[1], {})
        names = args.trees
    else:
        old, new = ("", settings_of(args.settings[0])), ("", settings_of(args.settings[1]))
        names = args.settings
    ratios: dict[str, list[float]] = {"p50": [], "ops": [], "cpu": []}
    with LocalNodes(5) as nodes:
        for n in range(args.rounds):
            if n % 2 == 0:
                a, b = run(old, nodes.urls, args.loop), run(new, nodes.urls, args.loop)
            else:
                b = run(new, nodes.urls, args.loop)
                a = run(old, nodes.urls, args.loop)
            for key, values in ratios.items():
                values.append(b[key] / a[key])
            print(
                f"round {n}: old p50 {a['p50'] * 1e6:.0f} us, {a['ops']:.0f} pairs/s, {a['cpu'] * 1e6:.1f} us CPU | "
                f"new p50 {b['p50'] * 1e6:.0f} us, {b['ops']:.0f} pairs/s, {b['cpu'] * 1e6:.1f} us CPU",
                flush=True,
            )
    print(
        f"{args.loop}: [{names[1]}] / [{names[0]}], median of {args.rounds} rounds: "
        f"p50 {statistics.median(ratios['p50']):.3f}x, throughput {statistics.median(ratios['ops']):.3f}x, "
        f"CPU per pair {statistics.median(ratios['cpu']):.3f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
