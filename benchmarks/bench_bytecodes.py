"""Bytecodes the library runs per uncontended acquire+release: a count, not a time, so a loaded machine
cannot blur it.

Usage::

    python benchmarks/bench_bytecodes.py --trees OLD_DIR NEW_DIR [--queue | --release-words]

Each tree (a directory holding ``redlock_async/`` and ``tests/fakes.py``, e.g. ``git worktree add
--detach /tmp/old <commit>``) runs in a child process: one lock on 5 fake nodes that answer at once
(no server, no I/O), warmed up, then 200 acquire+release pairs under ``sys.settrace`` with opcode
events. Printed: the Python bytecodes executed per pair in ``redlock_async`` and elsewhere (asyncio,
the fakes), and the ratio new/old of the library's. What C code does (hiredis, the event loop's
internals) is not counted: use ``bench_ab.py`` for times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import asyncio, json, sys
try:
    from redlock_async._shared._cluster import Cluster
    from redlock_async._shared._handoff import Listener
    from redlock_async._core._settings import Settings
except ImportError:  # a tree from before the wings (issue 37)
    from redlock_async._cluster import Cluster
    from redlock_async._handoff import Listener
    from redlock_async._settings import Settings
from redlock_async.lock import Lock
from tests.fakes import FakeNode, as_nodes

PAIRS = 200
count = {"library": 0, "other": 0}


def tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    key = "library" if "redlock_async" in frame.f_code.co_filename else "other"

    def local(frame, event, arg):
        if event == "opcode":
            count[key] += 1
        return local

    return local


def respond(request):
    return b"OK" if request.args[0] == b"SET" else 1


async def main():
    nodes = [FakeNode(f"fake:{i}", respond=respond) for i in range(5)]
    for node in nodes:
        node.requests = type("Forget", (list,), {"append": lambda self, request: None})()
    settings = Settings(ttl=10.0, clock_guard=False, queue=sys.argv[1] == "queue")
    cluster = Cluster(tuple(as_nodes(nodes)), settings, Listener(0.05, scope=("bytecodes",)), None)
    lock = Lock(cluster, "bytecodes", cluster.settings)
    for _ in range(50):
        await lock.acquire()
        await lock.release()
    sys.settrace(tracer)
    for _ in range(PAIRS):
        await lock.acquire()
        await lock.release()
    sys.settrace(None)
    await cluster.watchdog.aclose()
    print(json.dumps({key: value / PAIRS for key, value in count.items()}))


asyncio.run(main())
"""


def count(tree: str, queue: bool) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "queue" if queue else "words"],
        env=dict(os.environ, PYTHONPATH=tree),
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trees", nargs=2, metavar=("OLD", "NEW"), required=True)
    hand_off = parser.add_mutually_exclusive_group()
    hand_off.add_argument("--queue", action="store_true", default=True, help="the grant queue (the default)")
    hand_off.add_argument("--release-words", dest="queue", action="store_false", help="queue=False")
    args = parser.parse_args()
    old, new = (count(tree, args.queue) for tree in args.trees)
    for tree, figures in zip(args.trees, (old, new), strict=True):
        print(f"{tree}: {figures['library']:.0f} bytecodes per pair in redlock_async, {figures['other']:.0f} elsewhere")
    print(f"library bytecodes per pair, new/old: {new['library'] / old['library']:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
