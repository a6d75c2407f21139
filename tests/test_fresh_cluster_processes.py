"""Fresh OS processes meeting a fresh cluster at the same instant (the restart quarantine's held yes).

Each process makes its client and tries at one agreed moment, as workers started together do (a
deploy, a Celery pool): the first connection of each meets nodes some of which the others have
marked and some not yet. Exactly one wins each round of ``blocking=False`` tries, every blocking
one is served once the one before leaves, and no process warns that a node of the new cluster lost
its data.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from redlock_async.testing import LocalNodes

from .conftest import LOOP

TRY = """
import asyncio, json, sys, time
from redlock_async import Redlock

urls, start, blocking, loop = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]

async def main():
    while time.time() < start:
        await asyncio.sleep(0.001)
    began = time.time()
    async with Redlock(urls) as redlock:  # the default ttl: a waiter served late would wait 10 s
        lock = redlock.lock("fresh", acquire_timeout=8.0)
        won = await (lock.acquire() if blocking else lock.acquire(blocking=False))
        got = time.time()
        if won:
            await asyncio.sleep(0.1 if blocking else 2.0)  # every try of a round meets the winner holding
        left = time.time()
        if won:
            await lock.release()
    print(json.dumps({"won": won, "began": began, "got": got, "left": left}), flush=True)

if loop == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


def _round(urls: list[str], processes: int, *, blocking: bool) -> list[tuple[dict[str, Any], str]]:
    start = time.time() + 1.5  # every process is up and waiting by then (nearly: see the winner's hold)
    loop = "uvloop" if LOOP == "uvloop" else "asyncio"
    args = [json.dumps(urls), repr(start), "1" if blocking else "0", loop]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", TRY, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ,
        )
        for _ in range(processes)
    ]
    results = []
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        results.append((json.loads(out), err))
    return results


@pytest.mark.slow
@pytest.mark.parametrize(("nodes", "processes"), [(3, 3), (5, 4)])
@pytest.mark.parametrize("blocking", [False, True], ids=["blocking=False", "blocking"])
def test_fresh_processes_on_a_fresh_cluster(nodes: int, processes: int, blocking: bool) -> None:
    for _ in range(3):
        with LocalNodes(nodes) as cluster:
            results = _round(cluster.urls, processes, blocking=blocking)
        said = [err for _, err in results if "lost its data" in err]
        assert not said, said  # a new cluster: no node of it lost anything
        outcomes = [result for result, _ in results]
        won = sorted((o for o in outcomes if o["won"]), key=lambda o: float(o["got"]))
        if not blocking:
            assert len(won) == 1, outcomes
            continue
        assert len(won) == processes, outcomes
        for before, after in itertools.pairwise(won):
            assert after["got"] >= before["left"], outcomes
            # Served by the hand-off once the one before left, not by its key's expiry (10 s).
            assert after["got"] - before["left"] < 3.0, outcomes
