"""Counts per concurrent ``async with lock`` pair on real nodes, which a loaded machine cannot blur.

Usage::

    python benchmarks/bench_pair_counts.py [--trees DIR_OR_REV ...] [--settings 'queue=False' ...] [--tasks 1]
    python benchmarks/bench_pair_counts.py --node-instructions
    python benchmarks/bench_pair_counts.py --node-instructions --trees dfc4c98 main .
    python benchmarks/bench_pair_counts.py --client-instructions --trees dfc4c98 main .
    python benchmarks/bench_pair_counts.py --client-instructions --trees dfc4c98 . --loop uvloop --keep /tmp/cg
    python benchmarks/bench_pair_counts.py --tasks 1 --top-calls 40
    python benchmarks/bench_pair_counts.py --gc --trees dfc4c98 . --loop uvloop [--rounds 4]

Each tree (a directory holding ``redlock_async/`` or a git revision, as for ``bench_ab.py``) and each
setting runs in a child process of its own against the same 5 local nodes: ``--tasks`` tasks (64) on
locks of their own, warmed up, then ``--pairs`` pairs each under ``sys.settrace`` with opcode events.
Printed per pair: the Python bytecodes run (the library's, asyncio's, the rest), and the commands each
node ran (``INFO commandstats``). Unlike ``bench_bytecodes.py`` (fake nodes, no I/O) this counts the
real path: replies parsed, writes gathered, the clock guard's ``TIME``. With 64 tasks the counts move
by up to a few percent from run to run (how commands and replies batch depends on the machine's
load); with ``--tasks 1`` (one pair at a time: every write carries one acquire) the library's count
moves by about 0.2%: compare trees with that.

Also printed: Python calls per pair (a coroutine's every resumption is one: a coroutine less in an await
chain shows twice), and with ``--top-calls N`` the N functions called most. The eviction watch's policy
recheck (once a second per node, by the clock) is switched off in the child: under the tracer a pair
takes ~50 times longer, and the recheck's ``INFO`` parse would be counted as if it came per pair.

``--client-instructions``: the client's CPU instructions per pair, C included (the interpreter, hiredis,
asyncio's C parts, allocation: what bytecode counts miss), under ``valgrind --tool=callgrind``: 64 tasks
on names of their own, 10 and then 30 pairs per task, the difference over the 1,280 pairs between. It
moves by a few percent from run to run (how 64 tasks' commands batch depends on timing under callgrind);
compare trees in the same run, and repeat. ``--loop uvloop`` runs it (and the bytecode counts) on uvloop;
``--keep DIR`` keeps each run's profile (``TREE.LOOP.PAIRS.callgrind``) for ``callgrind_annotate``: the
difference of two runs' per-function figures over 1,280 is a function's instructions per pair.

``--gc``: the garbage collector's runs per 1,000 pairs (generations 0, 1, 2) and its time per pair
(``gc.callbacks``), 64 tasks for 2 s per run, the trees alternating, ``--rounds`` runs each (medians).
Unlike the counts above this depends on timing (a generation-0 run comes once the objects the collector
tracks, allocated less freed, pass 700: how many of them live across the pairs' awaits decides it, and
the loop's own, asyncio's Python handles and selector events, add to it where uvloop's do not), so
compare trees in the same run. Each generation-2 run walks every object of the process.

``--node-instructions``: the CPU instructions one ``valkey-server`` (under ``valgrind --tool=callgrind``,
which must be installed) spends per ``SET NX PX`` + release, pipelined, for ``RELEASE`` (1 key: the
release without the queue, and dfc4c98's default), ``QUEUE_LEAVE`` given 4 keys (no listening mark
named: it always publishes, as before issue 36), 5 keys with no one listening (the default's release
now: no ``PUBLISH``), ``QUEUE_LEAVE_NATIVE`` so (``DELIFEQ`` in place of ``GET`` and ``DEL``: the default's
release where the user may run it) and 5 keys with the key's listening mark set (someone listens), and
a ``TIME`` before each pair (the clock guard's, one per pair when pairs go one at a time): what each
part of a release costs a node, exactly (``bench_server_cpu.py --scripts`` times the same on a live
server). With ``--trees``: the real path of each tree instead, a ``Redlock`` of one node (under
callgrind) with 64 tasks on names of their own, default settings, run for 10 and then 40 pairs per
task: the difference over the 1,920 pairs between (less the ``INFO`` replies, which come by the
clock, not by the pair) is what one pair costs a node, parsing, replies and the clock guard's
``TIME`` included, and no other load on the machine moves it (unlike ``bench_ab.py``'s ``INFO cpu``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from _ab_gc import gc_runs
from bench_ab import settings_of, tree_of

CHILD = r"""
import asyncio, collections, json, os, sys
import redis
from redlock_async import Redlock

urls, options, pairs, tasks = sys.argv[1].split(","), json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
count = collections.Counter()
calls = collections.Counter()
try:  # the eviction watch's policy recheck comes by the clock (1 s), not by the pair: not counted
    import redlock_async._health._evictions as _evictions
    _evictions.RECHECK = 1e9
except ImportError:
    pass


def where(code):
    name = code.co_filename
    at = name.rfind("redlock_async")
    return (name[at + 14 :] if at >= 0 else os.path.basename(name)) + ":" + code.co_qualname


def tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    name = frame.f_code.co_filename
    key = "library" if "redlock_async" in name else "asyncio" if "asyncio" in name else "other"
    if event == "call":  # (a coroutine's every resumption is one too)
        calls[where(frame.f_code)] += 1

    def local(frame, event, arg):
        if event == "opcode":
            count[key] += 1
        return local

    return local


def commands():
    found = collections.Counter()
    for url in urls:
        client = redis.Redis.from_url(url)
        for name, figures in client.info("commandstats").items():
            found[name.removeprefix("cmdstat_")] += figures["calls"]
        client.close()
    return found


async def main():
    async with Redlock(urls, **options) as redlock:
        async def worker(i, n):
            lock = redlock.lock(f"counts:{i}", ttl=10.0)
            for _ in range(n):
                async with lock:
                    pass

        await asyncio.gather(*(worker(i, 20) for i in range(tasks)))
        before = commands()
        sys.settrace(tracer)
        await asyncio.gather(*(worker(i, pairs) for i in range(tasks)))
        sys.settrace(None)
        ran = commands() - before
    done = tasks * pairs
    print(json.dumps({
        "bytecodes": {key: value / done for key, value in count.items()},
        "calls": {key: value / done for key, value in calls.most_common(int(os.environ.get("TOP_CALLS", "0")))},
        "all_calls": sum(calls.values()) / done,
        "commands": {name: calls / done / len(urls) for name, calls in ran.most_common() if name != "info"},
    }))


if os.environ.get("LOOP") == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


def counts(
    tree: str, settings: str, urls: list[str], pairs: int, tasks: int, top: int = 0, loop: str = "asyncio"
) -> dict[str, Any]:
    options = settings_of(settings)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, ",".join(urls), json.dumps(options), str(pairs), str(tasks)],
        env=dict(os.environ, PYTHONPATH=tree, TOP_CALLS=str(top), LOOP=loop),
        cwd=tree,  # (python -c puts the working directory first on sys.path)
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree} [{settings or 'defaults'}]: the child failed:\n{done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def pair_counts(
    trees: list[str], settings: list[str], pairs: int, tasks: int, top: int = 0, loop: str = "asyncio"
) -> None:
    from redlock_async.testing import LocalNodes

    with LocalNodes(5) as nodes:
        for tree in trees:
            for text in settings:
                found = counts(tree_of(tree), text, nodes.urls, pairs, tasks, top, loop)
                codes = found["bytecodes"]
                ran = ", ".join(f"{name} {calls:.2f}" for name, calls in found["commands"].items() if calls >= 0.005)
                print(
                    f"{tree} [{text or 'defaults'}]: {sum(codes.values()):.0f} bytecodes per pair "
                    f"(library {codes.get('library', 0):.0f}, asyncio {codes.get('asyncio', 0):.0f}, "
                    f"other {codes.get('other', 0):.0f}), {found['all_calls']:.1f} Python calls (a coroutine's "
                    f"resumptions counted); per node per pair: {ran}"
                )
                for where, calls in found["calls"].items():
                    print(f"    {calls:6.2f}  {where}")


CLIENT = r"""
import asyncio, sys
from redlock_async import Redlock
try:  # (as the tracer's child: the eviction watch's recheck comes by the clock, and callgrind is slow)
    import redlock_async._health._evictions as _evictions
    _evictions.RECHECK = 1e9
except ImportError:
    pass

async def main(urls, n):
    async with Redlock(urls) as redlock:
        async def worker(i, n):
            lock = redlock.lock(f"instructions:{i}", ttl=10.0)
            for _ in range(n):
                async with lock:
                    pass

        await asyncio.gather(*(worker(i, 5) for i in range(64)))
        await asyncio.gather(*(worker(i, n) for i in range(64)))

if sys.argv[3] == "uvloop":
    import uvloop
    uvloop.run(main(sys.argv[1].split(","), int(sys.argv[2])))
else:
    asyncio.run(main(sys.argv[1].split(","), int(sys.argv[2])))
"""


GRIND = ("valgrind", "--tool=callgrind")


def client_instructions(trees: list[str], loop: str = "asyncio", keep: str = "") -> None:
    """Per tree: the client's CPU instructions per ``async with`` pair (64 tasks), under callgrind, C included.

    With *keep* (a directory), each run's callgrind profile is kept there (for ``callgrind_annotate``).
    """
    from redlock_async.testing import LocalNodes

    short, long = 10, 30

    def run(tree: str, urls: list[str], n: int) -> int:
        out = f"/tmp/bench_pair_counts.client.{os.getpid()}.{n}.callgrind"
        if keep:
            out = os.path.join(keep, f"{os.path.basename(tree)}.{loop}.{n}.callgrind")
        done = subprocess.run(
            [*GRIND, f"--callgrind-out-file={out}", sys.executable, "-c", CLIENT, ",".join(urls), str(n), loop],
            env=dict(os.environ, PYTHONPATH=tree),
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if done.returncode != 0:
            raise SystemExit(f"{tree}: the client under callgrind failed:\n{done.stderr[-3000:]}")
        with open(out) as profile:
            total = re.search(r"^(?:summary|totals): (\d+)", profile.read(), re.M)
        if not keep:
            os.unlink(out)
        assert total is not None
        return int(total.group(1))

    with LocalNodes(5) as nodes:
        for name in trees:
            tree = tree_of(name)
            used = run(tree, nodes.urls, long) - run(tree, nodes.urls, short)
            print(
                f"{name:12s} {used / (64 * (long - short)):8.0f} client instructions per async with pair "
                f"(64 tasks, {loop})"
            )


def node_instructions(pairs: int) -> None:
    import redis

    from redlock_async._scripts import QUEUE_LEAVE, QUEUE_LEAVE_NATIVE, RELEASE
    from redlock_async.testing import server_binary

    leave = QUEUE_LEAVE.source
    variants: dict[str, tuple[bytes, int, str]] = {
        "RELEASE, 1 key": (RELEASE.source, 1, ""),
        "QUEUE_LEAVE, 4 keys (no mark)": (leave, 4, ""),
        "QUEUE_LEAVE, 5, no one listens": (leave, 5, ""),
        "QUEUE_LEAVE_NATIVE, 5, no one": (QUEUE_LEAVE_NATIVE.source, 5, ""),
        "QUEUE_LEAVE, 5, marked": (leave, 5, "marked"),
        "TIME + QUEUE_LEAVE, 5": (leave, 5, "time"),
    }
    binary = server_binary()

    def run(source: bytes | None, nkeys: int, how: str = "") -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        out = f"/tmp/bench_pair_counts.{os.getpid()}.{port}.callgrind"
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary, "--port", str(port), "--save", ""],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=port)
        for _ in range(600):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        if source is not None:
            sha, token = client.script_load(source), b"t" * 24
            if how == "marked":
                for i in range(64):
                    client.set(f"counts:{i}:m", 1)
            pipe = client.pipeline(transaction=False)
            for i in range(pairs):
                key = f"counts:{i % 64}"
                if how == "time":
                    pipe.time()
                pipe.set(key, token, px=10_000, nx=True)
                pipe.evalsha(sha, nkeys, *(key, key + ":q", key + ":w", key + ":f", key + ":m")[:nkeys], token)
                if i % 500 == 499:
                    pipe.execute()
                    pipe = client.pipeline(transaction=False)
            pipe.execute()
        with contextlib.suppress(redis.ConnectionError):
            client.shutdown(nosave=True)
        server.wait()
        with open(out) as profile:
            total = re.search(r"^(?:summary|totals): (\d+)", profile.read(), re.M)
        os.unlink(out)
        assert total is not None
        return int(total.group(1))

    idle = run(None, 0)
    for name, (source, nkeys, how) in variants.items():
        used = (run(source, nkeys, how) - idle) / pairs
        print(f"{name:31s} {used:8.0f} instructions per SET NX PX + release on one node")


REAL_PATH = r"""
import asyncio, sys
from redlock_async import Redlock

async def main(url, n):
    # connect_timeout: a node under callgrind answers the handshake in seconds; a connect given up and retried
    # would add its own commands to one run and not the other.
    async with Redlock([url], connect_timeout=30.0) as redlock:
        async def worker(i):
            lock = redlock.lock(f"real:{i}", ttl=10.0)
            for _ in range(n):
                async with lock:
                    pass

        await asyncio.gather(*(worker(i) for i in range(64)))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def callgrind_server(work: Callable[[int], None]) -> int:
    """The instructions a valkey-server under callgrind ran while *work(port)* ran, less its ``INFO`` replies."""
    from redlock_async.testing import server_binary

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = f"/tmp/bench_pair_counts.{os.getpid()}.{port}.callgrind"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", server_binary(), "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(port=port)
    for _ in range(600):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    work(port)
    with contextlib.suppress(redis.ConnectionError):
        client.shutdown(nosave=True)
    server.wait()
    with open(out) as profile:
        total = re.search(r"^(?:summary|totals): (\d+)", profile.read(), re.M)
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", out], capture_output=True, text=True).stdout
    info = re.search(r"^\s*([\d,]+) \([^)]*\)\s+\S*:infoCommand\b", annotated, re.M)
    os.unlink(out)
    assert total is not None
    return int(total.group(1)) - (int(info.group(1).replace(",", "")) if info else 0)


def real_path(trees: list[str]) -> None:
    """Per tree: a node's instructions per uncontended pair of the real client (see the module's docstring)."""
    short, long = 10, 40

    def client(tree: str, n: int) -> Callable[[int], None]:
        def work(port: int) -> None:
            subprocess.run(
                [sys.executable, "-c", REAL_PATH, f"redis://127.0.0.1:{port}", str(n)],
                env=dict(os.environ, PYTHONPATH=tree),
                cwd=tree,
                check=True,
                timeout=1200,
            )

        return work

    for name in trees:
        tree = tree_of(name)
        used = callgrind_server(client(tree, long)) - callgrind_server(client(tree, short))
        print(
            f"{name:12s} {used / (64 * (long - short)):8.0f} instructions per async with pair on the node (real path)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trees", nargs="+", default=None, help="directories or git revisions (default: .)")
    parser.add_argument("--settings", nargs="+", default=[""], help="Redlock keyword settings, e.g. 'queue=False'")
    parser.add_argument("--pairs", type=int, default=30, help="pairs per task under the tracer")
    parser.add_argument("--tasks", type=int, default=64, help="tasks at once (1: one pair at a time)")
    parser.add_argument("--node-instructions", action="store_true", help="a node's instructions per release")
    parser.add_argument(
        "--client-instructions", action="store_true", help="the client's instructions per pair (callgrind)"
    )
    parser.add_argument("--top-calls", type=int, default=0, help="print the N functions called most per pair")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio", help="the event loop")
    parser.add_argument("--gc", action="store_true", help="the garbage collector's runs per pair (timed)")
    parser.add_argument("--rounds", type=int, default=4, help="with --gc: runs per tree")
    parser.add_argument("--keep", default="", help="with --client-instructions: keep the callgrind profiles here")
    args = parser.parse_args()
    if args.gc:
        gc_runs(args.trees or ["."], args.loop, args.rounds)
    elif args.client_instructions:
        client_instructions(args.trees or ["."], args.loop, args.keep)
    elif args.node_instructions and args.trees:
        real_path(args.trees)
    elif args.node_instructions:
        node_instructions(3000)
    else:
        pair_counts(args.trees or ["."], args.settings, args.pairs, args.tasks, args.top_calls, args.loop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
