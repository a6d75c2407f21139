"""``redlock run``: no process of the command outlives its lock (a script's own children included).

The command runs in a process group of its own. Whether redlock is SIGKILLed, loses its lease or is
sent SIGTERM, every process of that group ends: redlock's reaper (a process watching a pipe from
redlock) kills the group when redlock dies, and redlock ends the group itself otherwise.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from redlock_async.cli._codes import EXIT_LOST
from tests.conftest import Cluster

TTL = 30.0
"""The lease of these runs: the group must be gone well within it (the next holder may start then)."""

SCRIPT = "sleep 1000 </dev/null >/dev/null 2>&1 & echo $$ $!; wait"
"""A script (as backup.sh) whose own child, a `sleep`, keeps running: prints its group and the sleep's pid."""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def members(pgid: int, *pids: int) -> list[int]:
    """The processes of group *pgid*, and of *pids*, that still run (zombies, dead but not yet reaped, are not)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if (int(fields[2]) == pgid or int(entry) in pids) and fields[0] != b"Z":
            found.append(int(entry))
    return found


async def gone_within(pgid: int, sleeper: int, seconds: float) -> list[int]:
    """Poll until no process of group *pgid* (nor *sleeper*) runs, at most *seconds*: what still runs then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := members(pgid, sleeper)) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    return left


async def started(
    urls: list[str], name: str, *args: str, ttl: float = TTL
) -> tuple[asyncio.subprocess.Process, int, int]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "redlock_async",
        "run",
        "--nodes",
        ",".join(urls),
        "--ttl",
        str(ttl),
        *args,
        name,
        "--",
        "sh",
        "-c",
        SCRIPT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    async with asyncio.timeout(30):
        line = await process.stdout.readline()
    assert line, (await process.stderr.read()).decode() if process.stderr else ""
    pgid, sleeper = map(int, line.split())
    assert sleeper in members(pgid, sleeper)  # the script's own child runs
    return process, pgid, sleeper


async def cleanup(process: asyncio.subprocess.Process, pgid: int, sleeper: int) -> None:
    if process.returncode is None:
        process.kill()
        await process.wait()
    for pid in members(pgid, sleeper):  # a failing test leaves no sleep behind
        os.kill(pid, signal.SIGKILL)


async def test_sigkill_of_redlock_ends_the_whole_group(cluster: Cluster) -> None:
    process, pgid, sleeper = await started(cluster.urls, "killed-run")
    try:
        process.kill()
        await process.wait()
        assert await gone_within(pgid, sleeper, TTL / 2) == []
    finally:
        await cleanup(process, pgid, sleeper)


async def test_sigterm_ends_the_whole_group_before_redlock_exits(cluster: Cluster) -> None:
    process, pgid, sleeper = await started(cluster.urls, "terminated-run")
    try:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TTL):
            await process.communicate()
        assert process.returncode == 128 + signal.SIGTERM
        assert members(pgid, sleeper) == []  # ended before redlock released the lock and exited
    finally:
        await cleanup(process, pgid, sleeper)


async def test_a_command_that_ends_leaves_nothing_of_its_group(cluster: Cluster) -> None:
    script = "sleep 1000 </dev/null >/dev/null 2>&1 & echo $$ $!"  # exits at once, its sleep does not
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "redlock_async", "run", "--nodes", ",".join(cluster.urls), "--grace", "1",
        "left-run", "--", "sh", "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(TTL):
        out, err = await process.communicate()
    pgid, sleeper = map(int, out.split())
    try:
        assert process.returncode == 0, err
        assert members(pgid, sleeper) == []
    finally:
        await cleanup(process, pgid, sleeper)


@pytest.mark.slow
async def test_a_lost_lease_ends_the_whole_group(faulty: Cluster) -> None:
    process, pgid, sleeper = await started(faulty.urls, "lost-run", "--grace", "2", ttl=2.0)
    try:
        for i in (0, 1, 2):
            faulty[i].pause()
        async with asyncio.timeout(TTL * 2):
            _, err = await process.communicate()
        assert process.returncode == EXIT_LOST, err
        assert members(pgid, sleeper) == []  # ended before redlock exited 76
    finally:
        for i in (0, 1, 2):
            faulty[i].resume()
        await cleanup(process, pgid, sleeper)
