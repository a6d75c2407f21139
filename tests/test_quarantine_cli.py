"""``redlock run`` after nodes restarted empty: the quarantine's promised end is kept for the next process.

Issue 35, item 1: after 3 of 5 nodes restarted without persistence, every fresh ``redlock run``
exited 69 ("a majority can vote again in 10.0 s") for over 6 minutes: each process met the nodes
without marker and started a quarantine of its own, and none lived to its end. The first client to
meet such a node now writes on it when its watch began, in the node's own time, and every client
reads that: a process started after the promised time runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from redlock_async.testing import LocalNodes

TTL = "4"
PROMISE = re.compile(r"a majority can vote again in ([0-9.]+) s")


def _start(urls: list[str], name: str) -> tuple[float, subprocess.Popen[str]]:
    argv = [sys.executable, "-m", "redlock_async", "run", "--ttl", TTL, "--nodes", ",".join(urls), name, "--", "true"]
    began = time.monotonic()
    return began, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)


def _wave(urls: list[str], names: list[str]) -> list[tuple[float, float, int, str]]:
    """Run ``redlock run NAME -- true`` for each name at once: (began, ended, exit status, stderr) each."""
    started = [_start(urls, name) for name in names]
    results = []
    for began, process in started:
        _, err = process.communicate(timeout=120)
        results.append((began, time.monotonic(), process.returncode, err))
    return results


def _promise(err: str) -> float:
    found = PROMISE.search(err)
    assert found, err
    return float(found[1])


@pytest.mark.slow
def test_a_run_after_the_promised_time_runs() -> None:
    with LocalNodes(5) as nodes:
        [(_, _, code, err)] = _wave(nodes.urls, ["first"])
        assert code == 0, err  # a new cluster: marked in service
        for i in (2, 3, 4):
            nodes[i].restart(keep_data=False)
        # Several processes meet the restarted nodes at once: each is refused, and says when a majority
        # can vote again.
        wave = _wave(nodes.urls, ["a", "b", "c"])
        assert [code for *_, code, _ in wave] == [69, 69, 69], [err for *_, err in wave]
        promised = max(ended + _promise(err) for _, ended, _, err in wave)  # the latest it can mean
        # Processes started before then are refused too, and none moves the promise later (before, each
        # started a quarantine of its own: a fresh 4 s from its own start).
        while time.monotonic() < promised - 0.5:
            [(began, _, code, err)] = _wave(nodes.urls, ["between"])
            if code == 0:
                break  # it ran: its check came after the promised time
            assert code == 69, err
            assert began + _promise(err) <= promised + 0.2, (began, err, promised)
        time.sleep(max(0.0, promised + 0.3 - time.monotonic()))
        # After the promised time: every fresh process runs (several at once, names of their own).
        after = _wave(nodes.urls, ["x", "y", "z"])
        assert [code for *_, code, _ in after] == [0, 0, 0], [err for *_, err in after]
