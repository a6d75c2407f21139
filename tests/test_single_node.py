"""One node as a mode: ``Redlock(["redis://..."])`` is the efficiency lock with everything else kept
(the watchdog, fencing, the hand-off, the grant queue, the CLI), and its trade-off is what the docs
say: one node is a single point of failure, with no quorum to outvote a node that lost its keys.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from redlock_async import LockLost, NodesUnavailable, Redlock

from .conftest import Cluster, MakeRedlock

PY = sys.executable


async def test_one_node_holds_extends_and_fences(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(urls=cluster.urls[:1], fencing=True)
    tokens = []
    for _ in range(2):
        lock = redlock.lock("single:job", ttl=0.6)
        async with lock:
            assert lock.fencing_token is not None
            tokens.append(lock.fencing_token)
            await asyncio.sleep(1.5)  # more than twice the ttl: the watchdog keeps it
            assert lock.held
            assert cluster[0].command("EXISTS", "redlock:single:job") == 1
    assert tokens[1] > tokens[0]
    assert cluster[0].command("EXISTS", "redlock:single:job") == 0


@pytest.mark.parametrize("queue", [False, True])
async def test_one_node_hands_the_lock_to_a_waiter_at_release(
    cluster: Cluster, make_redlock: MakeRedlock, queue: bool
) -> None:
    holder = (await make_redlock(urls=cluster.urls[:1], queue=queue)).lock("single:turns")
    # A waiter that would poll only every 30 s: the release itself must wake it.
    waiter = (await make_redlock(urls=cluster.urls[:1], queue=queue, retry_delay=30.0)).lock(
        "single:turns", acquire_timeout=10.0
    )
    assert await holder.acquire(blocking=False)
    waiting = asyncio.create_task(waiter.acquire())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await holder.release()
    async with asyncio.timeout(2):
        assert await waiting
    await waiter.release()


async def test_a_single_node_down_is_unavailable_not_busy(faulty: Cluster) -> None:
    """The trade-off: with its one node down nothing can be locked, and the error says so."""
    async with Redlock(faulty.urls[:1], acquire_timeout=0.5) as redlock:
        faulty[0].pause()
        try:
            with pytest.raises(NodesUnavailable):
                async with redlock.lock("single:down"):
                    pass
        finally:
            faulty[0].resume()


async def test_a_single_node_that_restarts_empty_sits_out_its_quarantine(faulty: Cluster) -> None:
    """No other node can outvote one that lost its keys: it sits out (NodesUnavailable) for the
    longest ttl, so a holder's lease ends before anyone else is granted the name."""
    async with Redlock(faulty.urls[:1], ttl=1.0, acquire_timeout=0.3) as redlock:
        lock = redlock.lock("single:restart")
        assert await lock.acquire(blocking=False)
        faulty[0].restart(keep_data=False)
        other = redlock.lock("single:restart")
        with pytest.raises(NodesUnavailable):
            async with other:
                pass
        with pytest.raises(LockLost):
            await lock.extend()
        # Once the quarantine (the ttl and drift) is over, the node counts again.
        late = redlock.lock("single:restart", acquire_timeout=5.0)
        async with late:
            assert late.held


async def test_the_command_line_on_one_node(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    url = cluster.urls[0]
    lock = (await make_redlock(urls=[url])).lock("single:cli", ttl=30.0, owner="lonely")
    assert await lock.acquire(blocking=False)
    status = await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", "status", "single:cli", "--nodes", url, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await status.communicate()
    assert status.returncode == 1, out
    assert b"verdict: held by" in out
    assert b"(lonely) on 1 of 1 nodes" in out
    broken = await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", "break", "single:cli", "--nodes", url, "--yes", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await broken.communicate()
    assert broken.returncode == 0, out
    with pytest.raises(LockLost):
        await lock.extend()
    run = await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", "run", "single:cli", "--nodes", url, "--", PY, "-c", "print('ran')",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await run.communicate()
    assert (run.returncode, out.strip()) == (0, b"ran")
