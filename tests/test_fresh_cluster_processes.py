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
from pathlib import Path
from typing import Any

import pytest

from redlock_async.testing import LocalNodes

from .conftest import LOOP

TRY = """
import asyncio, json, os, sys, time
from pathlib import Path
from redlock_async import Redlock

urls, room, count = json.loads(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
blocking, loop = sys.argv[4] == "1", sys.argv[5]

def everyone(what):
    return len(list(room.glob(what + "-*"))) >= count

async def main():
    (room / f"ready-{os.getpid()}").touch()
    while not everyone("ready"):  # all processes are up: they try within a millisecond of each other
        await asyncio.sleep(0.0005)
    began = time.time()
    async with Redlock(urls) as redlock:  # the default ttl: a waiter served late would wait 10 s
        lock = redlock.lock("fresh", acquire_timeout=8.0)
        won = await (lock.acquire() if blocking else lock.acquire(blocking=False))
        got = time.time()
        (room / f"tried-{os.getpid()}").touch()
        if won:
            await asyncio.sleep(0.1)
            while not blocking and not everyone("tried") and time.time() < got + 30:
                await asyncio.sleep(0.01)  # every try of the round meets the winner holding
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


def _round(urls: list[str], room: Path, processes: int, *, blocking: bool) -> list[tuple[dict[str, Any], str]]:
    room.mkdir()
    loop = "uvloop" if LOOP == "uvloop" else "asyncio"
    args = [json.dumps(urls), str(room), str(processes), "1" if blocking else "0", loop]
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
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        results.append((json.loads(out), err))
    return results


@pytest.mark.slow
@pytest.mark.parametrize(("nodes", "processes"), [(3, 3), (5, 4)])
@pytest.mark.parametrize("blocking", [False, True], ids=["blocking=False", "blocking"])
def test_fresh_processes_on_a_fresh_cluster(nodes: int, processes: int, blocking: bool, tmp_path: Path) -> None:
    for round_ in range(3):
        with LocalNodes(nodes) as cluster:
            results = _round(cluster.urls, tmp_path / str(round_), processes, blocking=blocking)
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
