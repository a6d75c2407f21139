"""Ctrl-C and the blocking API, in a process of its own: an interruption never hangs it and never leaves a key.

The child (tests/_sigint_child.py) runs ``with lock: pass`` round after round while SIGINT lands at a
random moment (as the answer of a blocking call arrives, too); each round must end with the
interruption raised and no key left on any node, and the process must still end on the next Ctrl-C.
A hang shows as a round that does not print within HANG seconds (a bound for a hang, not a speed).
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest
import redis.asyncio

from tests.conftest import INTERRUPTIBLE, Cluster, kill_child, next_event, rest_of

HANG = 30.0
"""Seconds without a word from the child that count as a hang (a round takes milliseconds)."""


async def start(how: str, rounds: int, urls: list[str]) -> asyncio.subprocess.Process:
    from tests.conftest import ROOT_DIR

    return await asyncio.create_subprocess_exec(
        *INTERRUPTIBLE,
        INTERRUPTIBLE[0],
        "-m",
        "tests._sigint_child",
        how,
        str(rounds),
        *urls,
        cwd=ROOT_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def rounds_of(how: str, rounds: int, cluster: Cluster) -> list[dict[str, Any]]:
    process = await start(how, rounds, cluster.urls)
    rows: list[dict[str, Any]] = []
    try:
        for _ in range(rounds):
            try:
                rows.append(await next_event(process, HANG))
            except TimeoutError:
                raise AssertionError(f"round {len(rows)} of {how!r} hung: {rows[-3:]}") from None
        assert await next_event(process, HANG) == {"ready": True}
        process.send_signal(signal.SIGINT)  # Ctrl-C still ends it
        _, err = await rest_of(process, HANG)
    finally:
        await kill_child(process)
    assert "KeyboardInterrupt" in err, err
    assert process.returncode not in (0, None)
    return rows


@pytest.mark.parametrize("how", ["kill", "interrupt"])
async def test_ctrl_c_in_with_lock_never_hangs_and_leaves_no_key(how: str, cluster: Cluster) -> None:
    rows = await rounds_of(how, 60, cluster)
    assert {row["raised"] for row in rows} == {"KeyboardInterrupt"}, rows
    assert [row for row in rows if row["keys"]] == []
    assert sum(row["passes"] for row in rows) > 0  # the rounds did take the lock


async def test_a_loss_as_with_lock_enters_leaves_the_lock_usable(cluster: Cluster) -> None:
    stop = asyncio.Event()

    async def delete(url: str) -> None:
        async with redis.asyncio.Redis.from_url(url) as client:
            while not stop.is_set():
                await client.delete("redlock:sigint")

    deleters = [asyncio.create_task(delete(url)) for url in cluster.urls]
    try:
        rows = await rounds_of("lost", 20, cluster)
    finally:
        stop.set()
        await asyncio.gather(*deleters)
    cluster.flush()
    assert {row["raised"] for row in rows} == {"LockLost"}, rows
    assert [row for row in rows if not row["sigurg_restored"]] == []  # the handler is put back each time
