"""Read/write locks through the nodes' grant queue (the default) on real nodes: the order across OS
processes (a writer queued before a reader gets in first; readers queued together get in together),
cancellation around a grant (asyncio and anyio), a SIGKILLed waiter, nodes restarted empty, and
``queue=False`` still waiting for release words.

The other OS processes are ``tests/_rw_child.py read|write``: ttl 1.5 s, retry delay 0.2 s.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from typing import Any

import anyio
import pytest

from redlock_async import Redlock
from redlock_async.testing import LocalNodes

from ._rw_layout import node_ms
from .conftest import Cluster, MakeRedlock, eventually, finish_child, keys_everywhere, kill_child, next_event
from .conftest import start_module as start

W = b"redlock:\x00rw\x00doc"
LINE = W + b"\x00queue"


HOLD = 60.0
"""The holder's lease where the children queue behind it: it is released by hand, and no watchdog extends
a lock taken by ``acquire()``. With the default 10 s, three children started one after another on a loaded
CI box outlasted it (each waits up to 10 s to start): the lease ran out, the children took the lock
instead of queueing, and the lines stayed empty ([0, 0, 0, 0, 0], twice in one CI run)."""


def in_line(nodes: Any) -> list[int]:
    return [int(nodes[i].command("ZCARD", LINE)) for i in range(len(nodes))]


async def lines_hold(nodes: Any, waiters: int, within: float = 10.0) -> None:
    """Wait until every node keeps *waiters* waiters in the name's line."""
    assert await eventually(lambda: min(in_line(nodes)) >= waiters, within), in_line(nodes)


async def nothing_left(nodes: Any, within: float = 3.0) -> None:
    """No lock key and no line on any node (fencing counters and restart markers aside)."""

    def left() -> list[list[bytes]]:
        return [[k for k in keys if not k.startswith(b"redlock-fence:")] for keys in keys_everywhere(nodes)]

    assert await eventually(lambda: not any(left()), within), left()


async def child(kind: str, seconds: float, urls: list[str]) -> asyncio.subprocess.Process:
    """A reader or writer process, once it says it is about to ask. One that does not say so in time is
    killed here: left running, it took the lock after the test gave up, and failed the next tests of its
    worker (their holder refused, its pipes reported unclosed in another test: one CI run)."""
    process = await start("tests._rw_child", kind, "doc", str(seconds), *urls)
    try:
        assert "waiting" in await next_event(process, 30)  # (a process start under CI's load took over 10 s)
    except BaseException:
        await kill_child(process)
        raise
    return process


# -- order across processes ------------------------------------------------------------------------------


async def test_a_writer_queued_before_a_reader_gets_in_first(redlock: Redlock, cluster: Cluster) -> None:
    holder = redlock.rw_lock("doc", ttl=HOLD).write()
    assert await holder.acquire(blocking=False)
    writer = await child("write", 0.3, cluster.urls)
    try:
        await lines_hold(cluster, 1)
        reader = await child("read", 0.1, cluster.urls)
        try:
            await lines_hold(cluster, 2)
            released = time.monotonic()
            await holder.release()
            wrote = await next_event(writer, 10)
            read = await next_event(reader, 10)
            assert "held" in wrote, wrote
            assert "held" in read, read
            assert wrote["start"] - released < 1.0  # granted by the release, not a fallback try
            done = await next_event(writer, 10)
            assert read["start"] >= done["end"], (wrote, done, read)  # the reader after the writer left
            assert read["start"] - done["end"] < 1.0  # and woken by its release
            await finish_child(reader, 10)
        finally:
            await kill_child(reader)
        await finish_child(writer, 10)
    finally:
        await kill_child(writer)
    await nothing_left(cluster)


async def test_readers_and_writers_are_served_in_arrival_order(redlock: Redlock, cluster: Cluster) -> None:
    """Writer 1, then a reader, then writer 2 queue (three processes): the reader goes between the two
    writers. (Release words served writers first: a waiting writer 2 kept the reader out.)"""
    holder = redlock.rw_lock("doc", ttl=HOLD).write()
    assert await holder.acquire(blocking=False)
    processes = []
    try:
        for i, kind in enumerate(["write", "read", "write"]):
            processes.append(await child(kind, 0.2, cluster.urls))
            await lines_hold(cluster, i + 1)
        await holder.release()
        starts = []
        for process in processes:
            held = await next_event(process, 10)
            assert "held" in held, held
            starts.append(held["start"])
            await finish_child(process, 10)
        assert starts == sorted(starts), starts
    finally:
        for process in processes:
            await kill_child(process)
    await nothing_left(cluster)


async def test_readers_queued_together_get_in_together(redlock: Redlock, cluster: Cluster) -> None:
    holder = redlock.rw_lock("doc", ttl=HOLD).write()
    assert await holder.acquire(blocking=False)
    readers = [await child("read", 0.6, cluster.urls) for _ in range(3)]
    try:
        await lines_hold(cluster, 3)
        released = time.monotonic()
        await holder.release()
        held = [await next_event(reader, 10) for reader in readers]
        ended = [await next_event(reader, 10) for reader in readers]
        assert max(h["start"] for h in held) < min(e["end"] for e in ended), (held, ended)  # together
        assert max(h["start"] for h in held) - released < 1.0  # all granted by the one release
        for reader in readers:
            await finish_child(reader, 10)
    finally:
        for reader in readers:
            await kill_child(reader)
    await nothing_left(cluster)


async def test_a_writer_is_granted_by_the_last_readers_release(make_redlock: MakeRedlock, cluster: Cluster) -> None:
    redlock = await make_redlock(retry_delay=5.0)  # no fallback try within the test: only a grant lets it in
    rw = redlock.rw_lock("doc", acquire_timeout=4.0)
    readers = [rw.read(), rw.read()]
    for reader in readers:
        assert await reader.acquire(blocking=False)
    other = await make_redlock(retry_delay=5.0)
    writer = other.rw_lock("doc", acquire_timeout=4.0).write()
    task = asyncio.create_task(writer.acquire())
    await lines_hold(cluster, 1)
    late = other.rw_lock("doc").read()
    assert not await late.acquire(blocking=False)  # a waiting writer keeps new readers out
    await readers[0].release()
    await asyncio.sleep(0.2)
    assert not task.done()  # a reader still reads
    released = time.monotonic()
    await readers[1].release()
    assert await task
    assert time.monotonic() - released < 1.0
    await writer.release()
    await nothing_left(cluster)


# -- cancellation around a grant ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["read", "write"])
async def test_cancelled_in_the_turn_of_its_grant_passes_the_turn_on(
    make_redlock: MakeRedlock, cluster: Cluster, kind: str
) -> None:
    """A waiter cancelled in the same loop turn as the release that grants it (or a few turns later):
    nothing of it stays, and the waiter behind it gets in by the grant, not a fallback try."""
    redlock = await make_redlock(retry_delay=5.0)
    other = await make_redlock(retry_delay=5.0)
    for turns in range(8):
        holder = redlock.rw_lock("doc").write() if kind == "read" else redlock.rw_lock("doc").read()
        assert await holder.acquire(blocking=False)
        first = redlock.rw_lock("doc", acquire_timeout=4.0)
        waiter = first.read() if kind == "read" else first.write()
        task = asyncio.create_task(waiter.acquire())
        await lines_hold(cluster, 1)
        behind = other.rw_lock("doc", acquire_timeout=4.0).write()
        second = asyncio.create_task(behind.acquire())
        await lines_hold(cluster, 2)
        await holder.release()
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        try:
            acquired = await task
        except asyncio.CancelledError:
            acquired = False
        assert waiter.held is acquired
        if acquired:
            await waiter.release()
        began = time.monotonic()
        assert await second  # the turn went on
        assert time.monotonic() - began < 1.5
        await behind.release()
        await nothing_left(cluster)


@pytest.mark.parametrize("kind", ["read", "write"])
async def test_an_anyio_scope_cancelled_around_a_grant_leaves_nothing(
    make_redlock: MakeRedlock, cluster: Cluster, kind: str
) -> None:
    redlock = await make_redlock(retry_delay=5.0)
    for delay in (0.0, 0.002, 0.01, 0.05):
        holder = redlock.rw_lock("doc").write() if kind == "read" else redlock.rw_lock("doc").read()
        assert await holder.acquire(blocking=False)
        rw = redlock.rw_lock("doc", acquire_timeout=4.0)
        waiter = rw.read() if kind == "read" else rw.write()
        entered = anyio.Event()

        async def wait(lock: Any = waiter, flag: anyio.Event = entered) -> None:
            flag.set()
            async with lock:
                await anyio.sleep(3600)

        async with anyio.create_task_group() as group:
            group.start_soon(wait)
            await entered.wait()
            await lines_hold(cluster, 1)
            await holder.release()
            await anyio.sleep(delay)
            group.cancel_scope.cancel()
        assert not waiter.held
        await nothing_left(cluster)


# -- faults -----------------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_sigkilled_waiting_writer_delays_the_readers_behind_it_a_ttl_at_most(
    redlock: Redlock, cluster: Cluster
) -> None:
    """A writer process waits in line (ttl 1.5 s, entries living 1 s) and is SIGKILLed; our release may
    grant W to the dead entry, which then sits for its ttl: the reader behind it gets in within ttl + an
    entry's life + 1 s, and nothing is left after."""
    holder = redlock.rw_lock("doc").read()
    assert await holder.acquire(blocking=False)
    writer = await child("write", 0.1, cluster.urls)
    try:
        await lines_hold(cluster, 1)
        reader = redlock.rw_lock("doc", acquire_timeout=10.0).read()
        waiting = asyncio.create_task(reader.acquire())
        await lines_hold(cluster, 2)
        killed = time.monotonic()
        os.kill(writer.pid, signal.SIGKILL)
        await writer.wait()
        await holder.release()
        assert await waiting
        waited = time.monotonic() - killed
    finally:
        await kill_child(writer)
    assert waited < 1.5 + 1.0 + 1.0, waited
    await reader.release()
    await nothing_left(cluster)


@pytest.mark.slow
async def test_nodes_restarted_empty_under_a_line_keep_exclusion_and_the_line_recovers(
    make_redlock: MakeRedlock,
) -> None:
    """A writer holds and a reader waits in line; two nodes restart empty (the line and W gone there). The
    reader is not let in beside the writer while the writer's lease lasts (the quarantine keeps the
    restarted nodes out), and once the writer releases, the reader gets in."""
    with LocalNodes(5) as nodes:
        redlock = await make_redlock(nodes.urls, retry_delay=0.1)
        other = await make_redlock(nodes.urls, retry_delay=0.1)
        writer = redlock.rw_lock("doc", ttl=2.0).write()
        assert await writer.acquire(blocking=False)
        reader = other.rw_lock("doc", ttl=2.0, acquire_timeout=15.0).read()
        waiting = asyncio.create_task(reader.acquire())
        await lines_hold(nodes, 1)
        nodes[0].restart(keep_data=False)
        nodes[1].restart(keep_data=False)
        await asyncio.sleep(1.0)
        assert not waiting.done()  # never beside the writer
        assert writer.held or not reader.held
        await writer.release()
        assert await asyncio.wait_for(waiting, 15)
        await reader.release()
        await nothing_left(nodes, 5.0)


# -- the opt-out ------------------------------------------------------------------------------------------


async def test_queue_false_waits_for_release_words(make_redlock: MakeRedlock, cluster: Cluster) -> None:
    redlock = await make_redlock(queue=False, retry_delay=5.0)
    rw = redlock.rw_lock("doc", acquire_timeout=4.0)
    writer = rw.write()
    assert await writer.acquire(blocking=False)
    readers = [rw.read(), rw.read()]
    tasks = [asyncio.create_task(reader.acquire()) for reader in readers]
    await asyncio.sleep(0.2)
    assert in_line(cluster) == [0] * len(cluster)  # no line on the nodes
    released = time.monotonic()
    await writer.release()
    assert all(await asyncio.gather(*tasks))
    assert time.monotonic() - released < 1.0  # woken by the release words
    for reader in readers:
        await reader.release()
    await nothing_left(cluster)


async def test_a_lease_granted_by_the_line_never_takes_a_node_that_did_not_grant_it(
    make_redlock: MakeRedlock, cluster: Cluster
) -> None:
    """A writer granted W by the line on 4 nodes (node 0 keeps a live reader's entry: it cannot grant) is
    extended; an extension must never SET W on node 0, where the reader's entry lives (the
    rule on one node), as a mutex's extension would regain a free node."""
    redlock = await make_redlock(retry_delay=0.05)
    reader = redlock.rw_lock("doc", ttl=5.0).read()
    assert await reader.acquire(blocking=False)
    stray = b"stray-reader"
    expiry = node_ms(cluster[0]) + 20_000
    cluster[0].command("HSET", W + b"\x00readers", hashlib.sha1(stray).hexdigest(), stray + b" %d" % expiry)
    writer = redlock.rw_lock("doc", ttl=0.6, acquire_timeout=5.0).write()
    task = asyncio.create_task(writer.acquire())
    await lines_hold(cluster, 1)
    await reader.release()
    assert await task
    assert cluster[0].command("EXISTS", W) == 0
    for _ in range(3):  # extensions, as the watchdog sends them
        await writer.extend()
        await asyncio.sleep(0.1)
    assert writer.held
    assert cluster[0].command("EXISTS", W) == 0, "an extension took node 0: W beside a live reader key"
    await writer.release()
    cluster[0].command("HDEL", W + b"\x00readers", hashlib.sha1(stray).hexdigest())
    await nothing_left(cluster)


async def test_fenced_grants_from_the_line_grow_and_readers_see_the_last_writers_token(
    make_redlock: MakeRedlock, cluster: Cluster
) -> None:
    """Fenced, with every acquire after the first taken by a grant of the line: each writer's token is
    larger than the last, and a reader granted after a writer left reads that writer's token."""
    redlock = await make_redlock(retry_delay=5.0)  # no fallback try: only grants let waiters in
    rw = redlock.rw_lock("doc", fencing=True, acquire_timeout=4.0)
    holder = rw.write()
    assert await holder.acquire(blocking=False)
    last = holder.fencing_token
    assert last is not None
    for _ in range(3):
        writer, reader = rw.write(), rw.read()
        wrote = asyncio.create_task(writer.acquire())
        await lines_hold(cluster, 1)
        read = asyncio.create_task(reader.acquire())
        await lines_hold(cluster, 2)
        await holder.release()
        assert await wrote
        assert writer.fencing_token is not None
        assert writer.fencing_token > last
        last = writer.fencing_token
        await writer.release()
        assert await read
        assert reader.fencing_token == last  # the last writer's
        holder = rw.write()
        held = asyncio.create_task(holder.acquire())
        await lines_hold(cluster, 1)
        await reader.release()  # the last reader: the writer behind it is granted
        assert await held
        assert holder.fencing_token is not None
        assert holder.fencing_token > last
        last = holder.fencing_token
    await holder.release()
    await nothing_left(cluster)
