"""Same-run A/B of the uncontended path, with an A/A control beside every ratio: two trees of the
library (directories or git revisions), or two settings of one tree.

Usage::

    python benchmarks/bench_ab.py --trees OLD NEW [NEW2 ...] [--rounds 4] [--seconds 3] [--loop asyncio|uvloop]
    python benchmarks/bench_ab.py --settings 'clock_guard=False' 'clock_guard=True' [--rounds 4]
    python benchmarks/bench_ab.py --guard [--attempts 3]     # CI: this tree against benchmarks/BASELINE

A tree is a directory holding ``redlock_async/`` (``.`` for this one) or a git revision of this
repository (``dfc4c98``, ``main``): its ``redlock_async/`` is unpacked into ``.cache/ab/<sha>`` by
``git archive``. Every phase runs in a child process of its own against the same 5 local nodes: it
imports one side, warms up, takes the p50 of sequential ``async with lock`` pairs for a while, then
runs 64 tasks on locks of their own for ``--seconds`` (pairs per second; client CPU per pair from
``time.process_time``; the nodes' CPU per pair per node: the deltas of ``INFO cpu``'s ``used_cpu_sys``
+ ``used_cpu_user`` of every node over the phase, divided by the nodes and the pairs). The nodes' CPU
is printed as well as a ratio: microseconds per pair on one node, and the pairs per second one node
core serves at that cost (``1 / cost``).

More than two trees (``--trees dfc4c98 main .``): each round runs every tree twice (A, B, C, A', B',
C', rotated by one tree each round, the second runs first in every other turn of rotations: rounds in
a multiple of twice the trees, 6 or 12 for three, balance the orders; 8 left the first tree's A
before A' in 5 rounds of 8, and its control off by 5.7%), and each later tree is reported against
the first, with the first's A/A control, all from the same run.

Each round runs A, B, A', B' in one of four orders, in turn (``ORDERS``: each side first as often,
and A' before A as often as after, so rounds come in fours): A'/A is the **A/A control**, the same
tree against itself in the same conditions, printed beside each ratio B/A (the mean of B and B' over
the mean of A and A', median over the rounds). A ratio whose control is off by more than 3% (median
over the rounds) is refused: the box was too noisy for it, and the exit status is 2. ``--judge cpu``
asks only that metric's control to be clean.

``--guard`` (CI, about a minute per attempt): this tree against the baseline revision named on the
first line of ``benchmarks/BASELINE`` (the rest of the file says why; it moves forward only in a
commit that says why), CPU per pair judged. Tried again while the control is unclean, at most
``--attempts`` times: FAIL (exit 1) only on a clean control with CPU per pair above ``--max-cpu``
(1.10x) the baseline's; after as many unclean controls it prints NOT JUDGED and exits 0, so a
noisy box never fails CI.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = ROOT / ".cache" / "ab"
CONTROL = 0.03
"""The most an A/A control may be off (median over the rounds) for its ratio to be reported."""
METRICS = {
    "ops": "throughput",
    "cpu": "client CPU per pair",
    "p50": "uncontended p50",
    "node": "node CPU per pair",
}

CHILD = r"""
import asyncio, json, sys, time
import redis
urls, loop, options, seconds = sys.argv[1].split(","), sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
from redlock_async import Redlock


def nodes_cpu():
    used = 0.0
    for url in urls:
        client = redis.Redis.from_url(url)
        info = client.info("cpu")
        client.close()
        used += info["used_cpu_sys"] + info["used_cpu_user"]
    return used


async def main():
    async with Redlock(urls, **options) as redlock:
        lock = redlock.lock("ab:seq", ttl=10.0)
        for _ in range(200):
            async with lock:
                pass
        pairs, stop = [], time.perf_counter() + min(seconds / 4, 1.0)
        while time.perf_counter() < stop:
            began = time.perf_counter()
            async with lock:
                pass
            pairs.append(time.perf_counter() - began)
        pairs.sort()

        async def worker(i, stop):
            mine, done = redlock.lock(f"ab:{i}", ttl=10.0), 0
            while time.perf_counter() < stop:
                async with mine:
                    pass
                done += 1
            return done

        await asyncio.gather(*(worker(i, time.perf_counter() + 0.3) for i in range(64)))  # warm-up
        node = nodes_cpu()
        began, cpu = time.perf_counter(), time.process_time()
        counts = await asyncio.gather(*(worker(i, began + seconds) for i in range(64)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - began
        node = nodes_cpu() - node
        done = sum(counts)
        print(json.dumps({
            "p50": pairs[len(pairs) // 2], "ops": done / wall, "cpu": cpu / done, "node": node / len(urls) / done,
        }))

if loop == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""

Side = tuple[str, dict[str, object]]


def settings_of(text: str) -> dict[str, object]:
    """``'clock_guard=False, ttl=5'`` as keyword settings (values are Python literals)."""
    call = ast.parse(f"f({text})", mode="eval").body
    assert isinstance(call, ast.Call)
    return {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords if keyword.arg}


def tree_of(name: str) -> str:
    """A directory holding ``redlock_async/``, or a git revision of this repository unpacked into .cache/ab."""
    path = Path(name)
    if (path / "redlock_async").is_dir():
        return str(path.resolve())
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if found.returncode != 0:
        raise SystemExit(f"{name!r} is neither a directory holding redlock_async/ nor a git revision of {ROOT}")
    sha = found.stdout.strip()
    target = CACHE / sha
    if not (target / "redlock_async").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha, "redlock_async"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return str(target)


def run(side: Side, urls: list[str], loop: str, seconds: float) -> dict[str, float]:
    tree, options = side
    env = dict(os.environ, PYTHONPATH=tree) if tree else dict(os.environ)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, ",".join(urls), loop, json.dumps(options), str(seconds)],
        env=env,
        cwd=tree or str(ROOT),
        capture_output=True,
        text=True,
        timeout=120 + 4 * seconds,
    )
    if done.returncode != 0:
        raise SystemExit(f"the phase of {tree or ROOT} {options} failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


ORDERS = (("a", "b", "a2", "b2"), ("b", "a", "b2", "a2"), ("a2", "b2", "a", "b"), ("b2", "a2", "b", "a"))
"""The rounds' orders, in turn: each side first and second in as many rounds, and each side's two runs
(A and A') each the earlier in as many rounds. A phase later in a round runs ~5% cheaper on this box
(quiet, same tree: the A/A of a fixed A-before-A' order was 0.94-0.95x CPU in three runs of three
pairs of trees), so a control whose A always came first was off by that drift, not by noise, and
refused every ratio, although the ratio itself, balanced over positions, carries no such bias."""


def order_of(n: int, sides: int) -> list[str]:
    """Round *n*'s order of the runs of *sides* sides (``a``, ``a2``, ``b``, ...): two sides take ORDERS; more
    take a rotation of the sides, twice over, the second runs first every other turn of rotations."""
    if sides == 2:
        return list(ORDERS[n % len(ORDERS)])
    names = [chr(ord("a") + (n + i) % sides) for i in range(sides)]
    first, second = names, [name + "2" for name in names]
    return second + first if (n // sides) % 2 else first + second


def ab_many(sides: list[Side], rounds: int, loop: str, seconds: float) -> list[dict[str, tuple[float, float, float]]]:
    """Per later side, per metric: (its ratio to the first side, the first's A/A control, its own control),
    medians over the rounds; each side's medians per pair are in ``MEDIANS`` (its letter)."""
    from redlock_async.testing import LocalNodes

    letters = [chr(ord("a") + i) for i in range(len(sides))]
    ratios: list[dict[str, list[tuple[float, float, float]]]] = [{key: [] for key in METRICS} for _ in sides[1:]]
    per_side: dict[str, dict[str, list[float]]] = {letter: {key: [] for key in METRICS} for letter in letters}
    with LocalNodes(5) as nodes:
        for n in range(rounds):
            order = order_of(n, len(sides))
            got = {which: run(sides[ord(which[0]) - ord("a")], nodes.urls, loop, seconds) for which in order}
            a, a2 = got["a"], got["a2"]
            for letter in letters:
                for key in METRICS:
                    per_side[letter][key].append((got[letter][key] + got[letter + "2"][key]) / 2)
            for j, letter in enumerate(letters[1:]):
                b, b2 = got[letter], got[letter + "2"]
                for key, values in ratios[j].items():
                    values.append(((b[key] + b2[key]) / (a[key] + a2[key]), a2[key] / a[key], b2[key] / b[key]))
            print(
                f"round {n} ({' '.join(order)}): "
                + " | ".join(
                    f"{which} {r['ops']:.0f} pairs/s, {r['cpu'] * 1e6:.1f} us CPU, p50 {r['p50'] * 1e6:.0f} us, "
                    f"node {r['node'] * 1e6:.2f} us"
                    for which, r in sorted(got.items())
                ),
                flush=True,
            )
    MEDIANS.clear()
    MEDIANS.update({letter: {key: statistics.median(v) for key, v in m.items()} for letter, m in per_side.items()})
    return [
        {
            key: (
                statistics.median(v[0] for v in values),
                statistics.median(v[1] for v in values),
                statistics.median(v[2] for v in values),
            )
            for key, values in found.items()
        }
        for found in ratios
    ]


MEDIANS: dict[str, dict[str, float]] = {}
"""The last run's medians per pair of each side (by letter: ``a`` the first), per metric."""


def ab(old: Side, new: Side, rounds: int, loop: str, seconds: float) -> dict[str, tuple[float, float, float]]:
    """Per metric: (the ratio new/old, the A/A control old'/old, the B/B control new'/new), medians."""
    return ab_many([old, new], rounds, loop, seconds)[0]


def tell_nodes(names: list[str]) -> None:
    """Each side's nodes' CPU per pair (median over the rounds): microseconds on one node, and what one node
    core serves at that cost."""
    for letter, name in zip(MEDIANS, names, strict=True):
        cost = MEDIANS[letter]["node"]
        served = f"one node core serves ~{1 / cost:,.0f} pairs/s"
        print(f"  {name}: node CPU {cost * 1e6:.2f} us per pair per node: {served}")


def report(found: dict[str, tuple[float, float, float]], title: str, judged: tuple[str, ...]) -> bool:
    """Print each ratio beside its A/A control; True when every *judged* metric's control is clean."""
    print(f"{title}, medians over the rounds (A/A control: the old side against itself; B/B: the new):")
    clean = True
    for key, (ratio, control, control_b) in found.items():
        off = abs(control - 1.0)
        line = f"  {METRICS[key]:20s} A/A {control:.3f}x  B/B {control_b:.3f}x  "
        if off > CONTROL:
            line += f"REFUSED (the A/A control is off by {off:.1%}, more than {CONTROL:.0%}; was {ratio:.3f}x)"
            if key in judged:
                clean = False
        else:
            line += f"new/old {ratio:.3f}x"
        print(line, flush=True)
    return clean


def guard(args: argparse.Namespace) -> int:
    """CI: this tree against benchmarks/BASELINE, CPU per pair judged (see the module's docstring)."""
    lines = (HERE / "BASELINE").read_text().split("\n")
    rev = lines[0].split()[0]
    old: Side = (tree_of(rev), {})
    new: Side = (str(ROOT), {})
    for attempt in range(1, args.attempts + 1):
        found = ab(old, new, args.rounds, args.loop, args.seconds)
        title = f"attempt {attempt} of {args.attempts}, {args.loop}: this tree / baseline {rev}"
        clean = report(found, title, ("cpu",))
        tell_nodes([rev, "this tree"])
        if not clean:
            print(f"attempt {attempt}: the A/A control of CPU per pair is off by more than {CONTROL:.0%}: again")
            continue
        ratio = found["cpu"][0]
        if ratio > args.max_cpu:
            print(f"FAIL: CPU per pair {ratio:.3f}x the baseline's ({rev}), more than {args.max_cpu:.2f}x")
            return 1
        print(f"PASS: CPU per pair {ratio:.3f}x the baseline's ({rev}), at most {args.max_cpu:.2f}x")
        return 0
    print(f"NOT JUDGED: the A/A control was off by more than {CONTROL:.0%} in all {args.attempts} attempts (noisy box)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--trees", nargs="+", metavar="TREE", help="two or more directories or git revisions")
    group.add_argument("--settings", nargs=2, metavar=("OLD", "NEW"), help="two Redlock keyword settings, e.g. 'x=1'")
    group.add_argument("--guard", action="store_true", help="CI: this tree against benchmarks/BASELINE")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of A, B, A', B' (4: a multiple of 4 balances the orders; of 2 x the trees for more)",
    )
    parser.add_argument("--seconds", type=float, default=None, help="each concurrent phase (3; --guard: 2)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--judge", nargs="*", choices=tuple(METRICS), default=tuple(METRICS))
    parser.add_argument("--attempts", type=int, default=3, help="--guard: tries while the control is unclean")
    parser.add_argument("--max-cpu", type=float, default=1.10, help="--guard: the largest CPU per pair ratio")
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 4
    if args.seconds is None:
        args.seconds = 2.0 if args.guard else 3.0
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be at least 1 and --seconds above 0")
    if args.guard:
        return guard(args)
    if args.trees:
        if len(args.trees) < 2:
            parser.error("--trees takes at least two trees (the first is the one the others are measured against)")
        sides: list[Side] = [(tree_of(tree), {}) for tree in args.trees]
        names = args.trees
    else:
        sides = [("", settings_of(args.settings[0])), ("", settings_of(args.settings[1]))]
        names = args.settings
    clean = True
    for name, found in zip(names[1:], ab_many(sides, args.rounds, args.loop, args.seconds), strict=True):
        title = f"{args.loop}: [{name}] / [{names[0]}], {args.rounds} rounds of {args.seconds:g} s phases"
        clean = report(found, title, tuple(args.judge)) and clean
    tell_nodes(names)
    return 0 if clean else 2


if __name__ == "__main__":
    raise SystemExit(main())
