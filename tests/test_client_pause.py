"""A client paused (SIGSTOP) for longer than its validity: what a lease can and cannot promise.

The holder runs in a process of its own (tests/_paused_client.py), so that it
can be frozen the way a long GC pause, a swapped-out VM or a stopped container
freezes a real one. While it is frozen its lease runs out and another client
takes the lock: the two critical sections overlap, as the analysis of Redlock
(and of any lease) predicts. What the library does promise is checked too: on
resume the paused client is told (LockLost) instead of carrying on, and with
fencing the new holder's token is larger, so a fenced resource refuses the
paused one's late writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path

import pytest
import redis.asyncio

from redlock_async._core._algorithm import quorum
from redlock_async.fencing import StaleFencingToken, fenced_set
from redlock_async.testing import History
from redlock_async.testing._history import Section

from .conftest import Cluster, MakeRedlock, next_event

CHILD = str(Path(__file__).with_name("_paused_client.py"))
RESOURCE = "pause-victim"
TTL = 1.0


def process_state(pid: int) -> bytes:
    """The kernel's one-letter state of *pid* (``T`` when stopped), from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rpartition(b")")[2].split()[0]


async def wait_state(pid: int, stopped: bool) -> None:
    """Signals are delivered asynchronously: wait (bounded) until the process is (no longer) stopped."""
    async with asyncio.timeout(2):
        while (process_state(pid) in (b"T", b"t")) != stopped:
            await asyncio.sleep(0.001)


@pytest.mark.slow
async def test_client_paused_longer_than_its_validity_overlaps_and_then_reports_lock_lost(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, CHILD, RESOURCE, str(TTL), *cluster.urls,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    history = History()
    try:
        entered = await next_event(child, timeout=20)
        assert entered["event"] == "entered", entered
        child.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        await wait_state(child.pid, stopped=True)
        lease_end = entered["now"] + entered["validity"]  # the paused client's own view of its lease

        # Another client gets the lock as soon as the frozen holder's keys expire on the nodes.
        other = await make_redlock(fencing=True, retry_delay=0.05)
        lock = other.lock(RESOURCE, ttl=2.0, acquire_timeout=10.0)
        async with asyncio.timeout(15), lock:
            with history.section("second", lock):
                acquired_at = time.monotonic()
                assert acquired_at > lease_end, "granted before the first lease ran out"
                await asyncio.sleep(0.1)  # the second holder's work
                assert process_state(child.pid) in (b"T", b"t")  # frozen the whole time, believing it holds the lock
                assert lock.token is not None
                # The new holder's keys: on a majority at least (a node where the frozen holder's SET
                # landed last may still have held its key when the new SET came, and said no).
                before = [cluster[i].command("GET", f"redlock:{RESOURCE}") for i in range(len(cluster))]
                assert before.count(lock.token.encode()) >= quorum(len(cluster)), before
                resumed_at = time.monotonic()  # before the signal: the child may run before this line would
                child.send_signal(signal.SIGCONT)
                lost = await next_event(child, timeout=5)
                told_after = time.monotonic() - resumed_at
                # The paused client's clean-up (compare-and-delete) left the new holder's keys alone.
                assert lock.held
                values = [cluster[i].command("GET", f"redlock:{RESOURCE}") for i in range(len(cluster))]
                assert [v for v in values if v == lock.token.encode()] == [
                    v for v in before if v == lock.token.encode()
                ], (before, values)
        async with asyncio.timeout(10):
            _, errors = await child.communicate()
    finally:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.kill()  # SIGKILL ends a stopped process too
            await child.wait()

    # Told on resume, at once, instead of carrying on.
    assert child.returncode == 0, (lost, errors.decode())
    assert lost["event"] == "lost", lost
    assert f"lock {RESOURCE!r} expired before the watchdog could extend it" in lost["message"]
    assert told_after < 1.0
    paused = Section(**lost["section"])
    assert paused.start < stopped_at
    assert paused.end > resumed_at > lease_end  # frozen past its validity: its section spans the pause

    # The overlap Redlock's analysis predicts: exactly this one, the paused holder's and the new one's.
    history.sections.append(paused)
    second = history.sections[0]
    assert [(a.client, b.client) for a, b in history.overlaps()] == [("paused", "second")]
    assert stopped_at < second.start < paused.end

    # Fencing is the fix: the new holder's token is larger, so a fenced resource refuses the paused one.
    assert paused.fencing_token is not None
    assert second.fencing_token is not None
    assert second.fencing_token > paused.fencing_token
    assert history.fencing_regressions() == []
    resource = redis.asyncio.Redis.from_url(cluster.urls[0])
    try:
        await fenced_set(resource, "pause-victim:data", "second", second.fencing_token)
        with pytest.raises(StaleFencingToken) as refused:
            await fenced_set(resource, "pause-victim:data", "paused", paused.fencing_token)
        assert (refused.value.token, refused.value.seen) == (paused.fencing_token, second.fencing_token)
        assert await resource.get("pause-victim:data") == b"second"
    finally:
        await resource.aclose()

    # Both released: no lease is left on any node.
    assert [cluster[i].command("EXISTS", f"redlock:{RESOURCE}") for i in range(len(cluster))] == [0] * len(cluster)
