"""``redlock break NAME`` and the grant queue's lines, against real nodes and real processes.

A waiter that died in line leaves an entry that lives five of its retry delays. Were the lines kept,
break's release would hand the key (a semaphore's slot, a read/write lock's writer key) to that dead
waiter for its whole ttl, and the next client would wait for it. Break drops the name's lines first:
dead waiters go, live ones enter again at their next try (at once, woken by the release word).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import typing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from redlock_async import Redlock
from redlock_async._core._names import rw_writer_key, semaphore_keys
from redlock_async._queue import queue_keys

from .conftest import Cluster, MakeRedlock
from .test_cli_break import redlock_break

PY = sys.executable

CHILD = """
import asyncio, sys, time
from redlock_async import Redlock

urls, kind, role, name, ttl = sys.argv[1].split(","), *sys.argv[2:5], float(sys.argv[5])

async def main():
    # retry_delay 5 s: an entry lives 25 s after the waiter's last try, far longer than the test.
    async with Redlock(urls, retry_delay=5.0) as redlock:
        if kind == "lock":
            lock = redlock.lock(name, ttl=ttl)
        elif kind == "semaphore":
            lock = redlock.semaphore(name, limit=1, ttl=ttl)
        else:
            lock = redlock.rw_lock(name, ttl=ttl).write()
        if role == "hold":
            assert await lock.acquire(blocking=False)
            print("holding", flush=True)
        elif role == "live":  # waits, holds 0.3 s, says when (one monotonic clock for every process)
            print("waiting", flush=True)
            assert await lock.acquire(timeout=20)
            start = time.monotonic()
            await asyncio.sleep(0.3)
            end = time.monotonic()
            await lock.release()
            print(start, end, flush=True)
            return
        else:
            print("waiting", flush=True)
            await lock.acquire(timeout=600)
            print("acquired", flush=True)  # (never: it is killed while in line)
        await asyncio.sleep(600)

asyncio.run(main())
"""

KINDS = ("lock", "semaphore", "rw")


def line_key(kind: str, name: str) -> bytes:
    """The key of *name*'s line for *kind* (a sorted set of the waiting tokens)."""
    if kind == "lock":
        return queue_keys(b"redlock:" + name.encode())[1]
    if kind == "semaphore":
        return semaphore_keys("redlock:", name).line
    return rw_writer_key("redlock:", name) + b"\x00queue"


def held_key(kind: str, name: str) -> bytes:
    """The key a holder of *name* for *kind* sets (a semaphore of limit 1: its slot 0)."""
    if kind == "lock":
        return b"redlock:" + name.encode()
    if kind == "semaphore":
        return semaphore_keys("redlock:", name).slot_key(0)
    return rw_writer_key("redlock:", name)


def in_line(cluster: Cluster, key: bytes) -> list[int]:
    return [typing.cast(int, cluster[i].command("ZCARD", key)) for i in range(len(cluster))]


@asynccontextmanager
async def child(
    cluster: Cluster, kind: str, role: str, name: str, ttl: float = 60.0
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A process that holds *name* or waits for it (a lease of *ttl*); SIGKILLed (if still running) on the way out."""
    process = await asyncio.create_subprocess_exec(
        PY, "-c", CHILD, ",".join(cluster.urls), kind, role, name, str(ttl), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            said = (await process.stdout.readline()).decode().strip()
        assert said == ("holding" if role == "hold" else "waiting")
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def until(predicate: Callable[[], bool], within: float) -> None:
    async with asyncio.timeout(within):
        while not predicate():
            await asyncio.sleep(0.02)


def kill(process: asyncio.subprocess.Process) -> None:
    process.send_signal(signal.SIGKILL)


def fresh(redlock: Redlock, kind: str, name: str) -> object:
    """The next client of *name* (a read/write lock's: a reader, which a waiting writer keeps out)."""
    if kind == "lock":
        return redlock.lock(name, ttl=10.0)
    if kind == "semaphore":
        return redlock.semaphore(name, limit=1, ttl=10.0)
    return redlock.rw_lock(name, ttl=10.0).read()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_waiter_killed_in_line_is_not_handed_the_broken_lock(
    cluster: Cluster, make_redlock: MakeRedlock, kind: str
) -> None:
    """Holder and waiter SIGKILLed (the waiter in line on every node), break: a fresh client acquires at
    once, without waiting (blocking=False). On main, break's release granted the dead waiter the key for
    its 60 s ttl."""
    name = f"dead-line-{kind}"
    async with child(cluster, kind, "hold", name) as holder, child(cluster, kind, "wait", name) as waiter:
        await until(lambda: in_line(cluster, line_key(kind, name)) == [1] * len(cluster), 10)
        kill(waiter)
        kill(holder)
        await waiter.wait()
        await holder.wait()
    code, out, err = await redlock_break(cluster.urls, name, "--yes")
    assert code == 0, out + err
    assert out.count("dropped 1 waiter from the line") == len(cluster), out
    assert "live waiters enter again at their next try" in out
    assert in_line(cluster, line_key(kind, name)) == [0] * len(cluster)
    after = fresh(await make_redlock(), kind, name)
    assert await after.acquire(blocking=False)  # type: ignore[attr-defined]
    await after.release()  # type: ignore[attr-defined]


async def test_a_live_waiter_behind_a_dead_one_gets_the_lock_at_once(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """A live waiter is not lost when the line goes: the release word wakes it (its retry delay is 30 s), it
    enters again and is granted the lock once, the dead waiter ahead of it never."""
    name = "dead-ahead"
    async with child(cluster, "lock", "hold", name) as holder, child(cluster, "lock", "wait", name) as dead:
        await until(lambda: in_line(cluster, line_key("lock", name)) == [1] * len(cluster), 10)
        live = (await make_redlock(retry_delay=30.0)).lock(name, ttl=10.0, acquire_timeout=20.0)
        waiting = asyncio.create_task(live.acquire())
        await until(lambda: in_line(cluster, line_key("lock", name)) == [2] * len(cluster), 10)
        kill(dead)
        kill(holder)
        await dead.wait()
        await holder.wait()
    code, out, err = await redlock_break(cluster.urls, name, "--yes")
    assert code == 0, out + err
    assert out.count("dropped 2 waiters from the line") == len(cluster), out
    async with asyncio.timeout(3):  # only the release word can wake it this soon
        assert await waiting
    assert live.held
    # Held once: no one else can have it while it holds, and once it releases the next one can.
    others = (await make_redlock()).lock(name)
    assert not await others.acquire(blocking=False)
    await live.release()
    assert await others.acquire(blocking=False)
    await others.release()


@pytest.mark.parametrize("kind", KINDS)
async def test_with_no_holder_left_it_drops_a_dead_waiters_line(
    cluster: Cluster, make_redlock: MakeRedlock, kind: str
) -> None:
    """The holder's lease ran out after it died; the waiter killed in line is still in it (its entry
    outlives the lease). The next acquire would hand it the lock for 60 s: break offers to drop the lines,
    though no one holds the name. On main: "nothing to break", and the fresh client was refused."""
    name = f"no-holder-{kind}"
    # The holder's lease is long (60 s) and is made to run out by hand once it is dead: the key expires (it is
    # deleted, as expiry deletes it). With short leases (1, 3, then 6 s) a loaded CI box kept the waiter out of
    # line: with 1 and 3 s the starved holder was seen to lose its lease and the waiter to take the lock; with
    # 6 s once (line not [1] * 5 within 30 s), most likely the same.
    async with child(cluster, kind, "hold", name) as holder, child(cluster, kind, "wait", name) as waiter:
        await until(lambda: in_line(cluster, line_key(kind, name)) == [1] * len(cluster), 30)
        kill(waiter)
        kill(holder)
        await waiter.wait()
        await holder.wait()
    for i in range(len(cluster)):  # the holder's lease runs out: no one holds the name
        assert cluster[i].command("PEXPIRE", held_key(kind, name), 1) == 1
    await until(lambda: all(cluster[i].command("EXISTS", held_key(kind, name)) == 0 for i in range(len(cluster))), 5)
    code, out, err = await redlock_break(cluster.urls, name, "--yes")
    assert code == 0, out + err
    assert "no one holds" in out
    assert "but its lines have up to 1 waiter:" in out
    assert out.count("nothing to delete; dropped 1 waiter from the line") == len(cluster), out
    assert in_line(cluster, line_key(kind, name)) == [0] * len(cluster)
    after = fresh(await make_redlock(), kind, name)
    assert await after.acquire(blocking=False)  # type: ignore[attr-defined]
    # The next one waits in line; the release hands it the lock, not the dead waiter (still in line on
    # main: its entry lives 25 s, and it would get the lock for 60 s).
    second = fresh(await make_redlock(), kind, name)
    waiting = asyncio.create_task(second.acquire(timeout=5.0))  # type: ignore[attr-defined]
    await asyncio.sleep(0.3)
    await after.release()  # type: ignore[attr-defined]
    assert await waiting
    await second.release()  # type: ignore[attr-defined]


async def test_with_no_one_holding_or_waiting_there_is_nothing_to_break(cluster: Cluster) -> None:
    code, out, err = await redlock_break(cluster.urls, "idle-name", "--yes")
    assert code == 0, out + err
    assert "nothing to break: no node that answered holds idle-name, and no one waits for it" in out


async def test_live_waiters_of_other_processes_are_each_served_once_after_break(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """Two live waiters in processes of their own (retry delay 5 s: only the release word wakes them at
    once), behind a waiter killed in line: after break each gets the lock once, one after the other."""
    name = "live-processes"
    async with child(cluster, "lock", "hold", name) as holder, child(cluster, "lock", "wait", name) as dead:
        await until(lambda: in_line(cluster, line_key("lock", name)) == [1] * len(cluster), 10)
        async with child(cluster, "lock", "live", name) as first, child(cluster, "lock", "live", name) as second:
            await until(lambda: in_line(cluster, line_key("lock", name)) == [3] * len(cluster), 10)
            kill(dead)
            kill(holder)
            await dead.wait()
            await holder.wait()
            code, out, err = await redlock_break(cluster.urls, name, "--yes")
            assert code == 0, out + err
            assert out.count("dropped 3 waiters from the line") == len(cluster), out
            held: list[tuple[float, float]] = []
            async with asyncio.timeout(8):
                for live in (first, second):
                    assert live.stdout is not None
                    start, end = (float(t) for t in (await live.stdout.readline()).split())
                    held.append((start, end))
                    assert await live.wait() == 0
    earlier, later = sorted(held)
    assert earlier[1] <= later[0], held  # one after the other, never both
    after = (await make_redlock()).lock(name, ttl=10.0)
    assert await after.acquire(blocking=False)  # and nothing is left for the dead waiter
    await after.release()
