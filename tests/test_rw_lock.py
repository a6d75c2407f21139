"""Read/write locks (Redlock.rw_lock) on real nodes: readers share, a writer holds alone, a waiting
writer is not starved, a crashed reader frees only its share, faults and cancellation leave nothing."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import anyio
import pytest

from redlock_async import Lock, LockNotAcquired, NestedAcquire, ReadWriteLock, Redlock
from redlock_async.testing import History, LocalNodes
from redlock_async.testing._history import Section

from .conftest import (
    Cluster,
    MakeRedlock,
    assert_empty,
    keys_everywhere,
    kill_child,
    mark_in_service,
    next_event,
    rest_of,
    start_module,
)

W = b"redlock:\x00rw\x00doc"


async def hold(lock: Lock, seconds: float) -> None:
    async with lock:
        await asyncio.sleep(seconds)


# -- History of readers and writers ------------------------------------------------------------------


def test_history_lets_readers_overlap_and_nothing_else() -> None:
    history = History()
    history.sections += [
        Section("r1", "a", 1, 0.0, 2.0, shared=True),
        Section("r2", "b", 1, 0.5, 1.0, shared=True),  # readers overlap: fine
        Section("w", "c", 2, 2.0, 3.0),  # touches the readers' end: fine
        Section("r3", "d", 2, 3.0, 4.0, shared=True),  # sees the last writer's token
    ]
    history.check()
    history.sections.append(Section("r4", "e", 2, 2.5, 2.6, shared=True))  # a reader inside the writer
    with pytest.raises(AssertionError, match=r"overlap: w held it 2\.000000-3\.000000 while r4 entered at 2\.500000"):
        history.check()
    history.sections.pop()
    history.sections.append(Section("w2", "f", 3, 1.5, 1.6))  # a writer inside the readers (r1 ends last)
    with pytest.raises(AssertionError, match="overlap: r1 held it"):
        history.check()
    history.sections.pop()
    history.sections.append(Section("r5", "g", 1, 4.5, 5.0, shared=True))  # a token older than the last writer's
    with pytest.raises(AssertionError, match="fencing token went backwards"):
        history.check()


# -- the basics --------------------------------------------------------------------------------------


async def test_readers_share_and_a_writer_holds_alone(redlock: Redlock, cluster: Cluster) -> None:
    rw = redlock.rw_lock("doc", ttl=5.0)
    assert isinstance(rw, ReadWriteLock)
    r1, r2 = rw.read(), rw.read()
    assert await r1.acquire(blocking=False)
    assert await r2.acquire(blocking=False)
    assert r1.held
    assert r2.held
    assert 0 < r1.validity <= 5.0
    writer = rw.write()
    assert not await writer.acquire(blocking=False)
    assert [node.count(W) for node in keys_everywhere(cluster)] == [0] * len(cluster)  # no writer key anywhere
    await r1.release()
    assert not await writer.acquire(blocking=False)  # r2 still reads
    await r2.release()
    assert await writer.acquire(blocking=False)
    assert not await rw.read().acquire(blocking=False)
    assert not await rw.write().acquire(blocking=False)
    await writer.release()
    await assert_empty(cluster)


async def test_rw_keys_are_apart_from_a_locks(redlock: Redlock) -> None:
    async with redlock.lock("doc"), redlock.rw_lock("doc").write():
        pass


async def test_many_readers_and_writers_never_overlap_a_writer(make_redlock: MakeRedlock, cluster: Cluster) -> None:
    clients = [await make_redlock(retry_delay=0.02) for _ in range(3)]
    history = History()
    stop = time.monotonic() + 3.0
    readers_at_once = 0
    inside = 0

    async def reader(name: str, redlock: Redlock) -> None:
        nonlocal inside, readers_at_once
        while time.monotonic() < stop:
            lock = redlock.rw_lock("doc", ttl=2.0).read()
            async with lock:
                inside += 1
                readers_at_once = max(readers_at_once, inside)
                with history.section(name, lock, shared=True):
                    await asyncio.sleep(random.uniform(0.005, 0.03))
                inside -= 1
            await asyncio.sleep(random.uniform(0, 0.01))

    async def writer(name: str, redlock: Redlock) -> int:
        writes = 0
        while time.monotonic() < stop:
            lock = redlock.rw_lock("doc", ttl=2.0).write()
            async with lock:
                with history.section(name, lock):
                    await asyncio.sleep(random.uniform(0.002, 0.01))
                writes += 1
            await asyncio.sleep(random.uniform(0.02, 0.05))
        return writes

    async with asyncio.TaskGroup() as group:
        for i in range(9):
            group.create_task(reader(f"r{i}", clients[i % 3]))
        writes = [group.create_task(writer(f"w{i}", clients[i])) for i in range(3)]
    history.check()
    assert readers_at_once >= 2, "readers never held together"
    assert all(task.result() > 0 for task in writes), [task.result() for task in writes]
    await assert_empty(cluster)


async def test_readers_and_writers_in_three_processes(cluster: Cluster) -> None:
    # Each process: 4 readers and 1 writer, fenced; every section merged into one History (monotonic
    # time is system-wide here): no writer overlaps anyone, readers overlap, writers' tokens grow and
    # each reader's is the last writer's.
    children = [await start_module("tests._rw_child", "mix", "doc", "3", *cluster.urls) for _ in range(3)]
    history = History()
    try:
        for n, child in enumerate(children):
            rows, err = await rest_of(child, 60.0)
            assert child.returncode == 0, err
            for row in rows:
                history.sections.append(
                    Section(
                        f"p{n}-{row['client']}", row["token"], row["fencing"], row["start"], row["end"], row["shared"]
                    )
                )
    finally:
        for child in children:
            await kill_child(child)
    history.check()
    assert sum(not s.shared for s in history.sections) >= 3
    assert history.most_inside() >= 2  # readers of different processes together


async def test_a_writer_is_not_starved_by_a_stream_of_readers(make_redlock: MakeRedlock) -> None:
    # Eight readers that overlap each other without a gap: without the waiting writers' entry, some
    # reader always holds and the writer never gets in before its timeout.
    redlock = await make_redlock(retry_delay=0.05)
    other = await make_redlock(retry_delay=0.05)
    rw = redlock.rw_lock("doc", ttl=2.0)
    stop = asyncio.Event()

    async def reader(i: int) -> None:
        await asyncio.sleep(i * 0.01)
        while not stop.is_set():
            try:
                async with rw.read():
                    await asyncio.sleep(0.08)
            except LockNotAcquired:
                pass

    tasks = [asyncio.create_task(reader(i)) for i in range(8)]
    await asyncio.sleep(0.3)  # the readers' stream is running
    began = time.monotonic()
    writer = other.rw_lock("doc", ttl=2.0, acquire_timeout=2.0).write()
    try:
        assert await writer.acquire(), "the writer starved"
        waited = time.monotonic() - began
        await writer.release()
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert waited < 1.5  # the readers then inside finish (80 ms), and the writer's turn comes


async def test_a_sigkilled_reader_frees_its_share_within_its_ttl(redlock: Redlock, cluster: Cluster) -> None:
    ttl = 1.0
    child = await start_module("tests._rw_child", "hold", "doc", str(ttl), *cluster.urls)
    try:
        assert (await next_event(child, 20.0))["held"]
        other = redlock.rw_lock("doc", ttl=ttl).read()
        assert await other.acquire(blocking=False)  # readers share with it
        writer = redlock.rw_lock("doc", ttl=ttl, acquire_timeout=3 * ttl).write()
        assert not await writer.acquire(blocking=False)
        await other.release()
        child.kill()
        killed = time.monotonic()
        assert await writer.acquire()
        waited = time.monotonic() - killed
        # Its share goes with its own key: within the ttl (the watchdog extended it a third before),
        # and the writer sees it at its next try (retry_delay 0.2 s: within 0.3 s), on a busy machine too.
        assert waited <= ttl + 0.6, waited
        await writer.release()
    finally:
        await kill_child(child)


async def test_every_reader_has_its_own_lease(redlock: Redlock, cluster: Cluster) -> None:
    rw = redlock.rw_lock("doc", ttl=0.5)
    long = redlock.rw_lock("doc", ttl=5.0).read()
    short = rw.read()
    assert await long.acquire(blocking=False)
    assert await short.acquire(blocking=False)
    await asyncio.sleep(0.6)  # the short reader died without a word: only its share is gone
    assert not short.held
    assert long.held
    await long.extend()
    writer = rw.write()
    assert not await writer.acquire(blocking=False)
    await long.release()
    assert await writer.acquire(blocking=False)
    await writer.release()


async def test_waking_readers_together_when_the_writer_leaves(make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(retry_delay=5.0)  # no fallback poll within the test: only release words
    rw = redlock.rw_lock("doc", ttl=5.0, acquire_timeout=4.0)
    writer = rw.write()
    assert await writer.acquire(blocking=False)
    granted: list[float] = []

    async def read() -> None:
        async with rw.read():
            granted.append(time.monotonic())
            await asyncio.sleep(0.3)

    tasks = [asyncio.create_task(read()) for _ in range(5)]
    await asyncio.sleep(0.2)
    released = time.monotonic()
    await writer.release()
    await asyncio.gather(*tasks)
    assert len(granted) == 5
    # Together: one after the other (one per 0.3 s hold) would spread them over 1.2 s.
    assert max(granted) - released < 0.6, [g - released for g in granted]


async def test_the_last_reader_wakes_the_writer(make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(retry_delay=5.0)
    other = await make_redlock(retry_delay=5.0)
    readers = [redlock.rw_lock("doc").read() for _ in range(3)]
    for reader in readers:
        assert await reader.acquire(blocking=False)
    writer = other.rw_lock("doc", acquire_timeout=4.0).write()
    task = asyncio.create_task(writer.acquire())
    await asyncio.sleep(0.2)
    for reader in readers[:2]:
        await reader.release()
    await asyncio.sleep(0.1)
    assert not task.done()
    released = time.monotonic()
    await readers[2].release()
    assert await task
    assert time.monotonic() - released < 1.0  # woken: the fallback poll would be 2.5 s or more
    await writer.release()


# -- nesting, downgrade, fencing -----------------------------------------------------------------------


async def test_nested_read_or_write_in_a_task_that_holds_it_fails_at_once(redlock: Redlock) -> None:
    rw = redlock.rw_lock("doc", acquire_timeout=5.0)
    async with rw.read():
        for inner in (rw.write(), rw.read()):
            began = time.monotonic()
            with pytest.raises(NestedAcquire, match="read/write lock 'doc'"):
                await inner.acquire()
            assert time.monotonic() - began < 0.1
        # another task is another holder: it reads beside us
        beside = rw.read()
        assert await asyncio.create_task(beside.acquire(blocking=False))
        await beside.release()
    async with rw.write():
        with pytest.raises(NestedAcquire):
            await rw.read().acquire()


async def test_downgrade_without_a_gap(redlock: Redlock, make_redlock: MakeRedlock, cluster: Cluster) -> None:
    other = await make_redlock()
    rw = redlock.rw_lock("doc", fencing=True)
    writer = rw.write()
    async with writer:
        token = writer.fencing_token
        assert token is not None
        async with writer.downgrade() as reader:
            assert not writer.held
            assert reader.held
            assert reader.fencing_token == token  # the last writer's: its own
            assert await other.rw_lock("doc").read().acquire(blocking=False)  # readers join
            assert not await other.rw_lock("doc").write().acquire(blocking=False)
            assert all(W not in keys for keys in keys_everywhere(cluster))
    assert not writer.held


async def test_fenced_writers_grow_and_readers_see_the_last_writers_token(redlock: Redlock) -> None:
    rw = redlock.rw_lock("doc", fencing=True)
    tokens: list[int] = []
    for _ in range(3):
        async with rw.write() as writer:
            assert writer.fencing_token is not None
            tokens.append(writer.fencing_token)
        async with rw.read() as reader:
            assert reader.fencing_token == tokens[-1]
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 3


# -- faults ------------------------------------------------------------------------------------------


async def test_minority_paused_readers_and_writers_go_on(faulty: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(faulty.urls, node_timeout=0.05, retry_delay=0.02)
    history = History()
    faulty[0].pause()
    faulty[1].pause()
    try:
        stop = time.monotonic() + 1.5

        async def reader(i: int) -> None:
            while time.monotonic() < stop:
                lock = redlock.rw_lock("doc", ttl=2.0).read()
                async with lock:
                    with history.section(f"r{i}", lock, shared=True):
                        await asyncio.sleep(0.01)

        async def writer() -> None:
            while time.monotonic() < stop:
                lock = redlock.rw_lock("doc", ttl=2.0).write()
                async with lock:
                    with history.section("w", lock):
                        await asyncio.sleep(0.01)
                await asyncio.sleep(0.03)

        async with asyncio.TaskGroup() as group:
            for i in range(4):
                group.create_task(reader(i))
            group.create_task(writer())
    finally:
        faulty[0].resume()
        faulty[1].resume()
    history.check()
    assert any(s.shared for s in history.sections)
    assert any(not s.shared for s in history.sections)


@pytest.mark.slow
async def test_readers_and_writers_on_a_slow_network() -> None:
    # Every node 40-60 ms away (a round trip of 80-120 ms), watchdog extensions under way (ttl 1 s).
    history = History()
    with LocalNodes(5, proxied=True) as nodes:
        for i, node in enumerate(nodes):
            node.proxy.latency(0.04 + 0.005 * i)
        async with Redlock(nodes.urls, retry_delay=0.05) as redlock:
            stop = time.monotonic() + 3.0

            async def reader(i: int) -> None:
                while time.monotonic() < stop:
                    lock = redlock.rw_lock("doc", ttl=1.0, acquire_timeout=10.0).read()
                    async with lock:
                        with history.section(f"r{i}", lock, shared=True):
                            await asyncio.sleep(0.4)  # past the watchdog's first extension

            async def writer() -> None:
                while time.monotonic() < stop:
                    lock = redlock.rw_lock("doc", ttl=1.0, acquire_timeout=10.0).write()
                    async with lock:
                        with history.section("w", lock):
                            await asyncio.sleep(0.05)
                    await asyncio.sleep(0.1)

            await asyncio.gather(*(reader(i) for i in range(3)), writer())
    history.check()
    assert sum(not s.shared for s in history.sections) >= 2
    assert history.most_inside() >= 2


@pytest.mark.slow
async def test_three_processes_under_minority_faults() -> None:
    # Three OS processes (4 readers, 1 writer each, fenced) while one node at a time is paused, restarted
    # without its data (then left out for the restart quarantine) or slowed: one History, no violation.
    rng = random.Random(31)
    history = History()
    with LocalNodes(5, proxied=True) as nodes:
        for i in range(len(nodes)):
            mark_in_service(nodes[i])  # a cluster in service: one met new with a node paused is not known to be new
        children = [await start_module("tests._rw_child", "mix", "doc", "8", *nodes.urls) for _ in range(3)]
        try:
            done = time.monotonic() + 7.0
            faults = 0
            while time.monotonic() < done:
                i = rng.randrange(5)
                kind = ("pause", "wipe", "slow")[faults % 3]
                if kind == "pause":
                    nodes[i].pause()
                    await asyncio.sleep(0.3)
                    nodes[i].resume()
                elif kind == "wipe":
                    await asyncio.to_thread(nodes[i].restart, keep_data=False)
                    await asyncio.sleep(2.5)  # one node out at a time: its quarantine (the 2 s ttl) first
                else:
                    nodes[i].proxy.latency(0.1, duration=0.4)
                    await asyncio.sleep(0.4)
                faults += 1
                await asyncio.sleep(0.2)
            for n, child in enumerate(children):
                rows, err = await rest_of(child, 60.0)
                assert child.returncode == 0, err
                for row in rows:
                    client, token, fencing = f"p{n}-{row['client']}", row["token"], row["fencing"]
                    history.sections.append(Section(client, token, fencing, row["start"], row["end"], row["shared"]))
        finally:
            for child in children:
                await kill_child(child)
    history.check()
    assert faults >= 3
    assert sum(not s.shared for s in history.sections) >= 3
    assert history.most_inside() >= 2


@pytest.mark.parametrize("keep_data", [True, False])
async def test_a_node_restarted_does_not_let_a_writer_in_beside_a_reader(
    faulty: Cluster, make_redlock: MakeRedlock, keep_data: bool
) -> None:
    # A reader holds on nodes 0-2 only (3 and 4 refuse it: a writer key there for a moment); node 2
    # restarts, with or without its data. A writer then finds 2, 3 and 4 free where the data went:
    # the restart quarantine keeps node 2's yes from counting, so no writer majority forms while the
    # reader reads (with restart_quarantine=0 this writer is granted: two holders).
    # (node_timeout 0.2 s: the reader needs all of nodes 0-2 to answer, on a busy machine too.)
    reader_client = await make_redlock(faulty.urls, node_timeout=0.2)
    writer_client = await make_redlock(faulty.urls, node_timeout=0.2)
    assert await writer_client.rw_lock("warm").read().acquire(blocking=False)  # knows every node's run_id
    for i in (3, 4):
        faulty[i].command("SET", W, "someone else", "PX", 60_000)
    reader = reader_client.rw_lock("doc", ttl=5.0).read()
    assert await reader.acquire(blocking=False), reader.outcomes
    for i in (3, 4):
        faulty[i].command("DEL", W)
    faulty[2].restart(keep_data=keep_data)
    writer = writer_client.rw_lock("doc", ttl=5.0).write()
    # Long enough for the writer's client to reconnect to node 2 and try again, well inside the
    # reader's validity and the quarantine (the writer's Redlock: 10 s leases).
    assert not await writer.acquire(timeout=1.5)
    assert reader.held
    await reader.release()


# -- cancellation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["read", "write"])
async def test_cancelled_at_every_moment_leaves_nothing(redlock: Redlock, cluster: Cluster, kind: str) -> None:
    rw = redlock.rw_lock("doc", ttl=5.0)
    holder = rw.read() if kind == "write" else rw.write()  # the other kind holds: the acquire waits
    for turns in range(12):
        assert await holder.acquire(blocking=False)
        lock = rw.write() if kind == "write" else rw.read()
        task = asyncio.create_task(lock.acquire())
        for _ in range(turns):
            await asyncio.sleep(0)
        if turns % 3 == 2:
            await holder.release()  # the release and the cancel in the same loop turn
        task.cancel()
        try:
            acquired = await task  # the release may hand it over before the cancel lands (the grant queue)
        except asyncio.CancelledError:
            acquired = False
        assert lock.held is acquired
        if acquired:
            await lock.release()
        if holder.held:
            await holder.release()
        await assert_empty(cluster)
        # and the next reader is not kept out by a writer that left
        probe = rw.read()
        assert await probe.acquire(blocking=False)
        await probe.release()


async def test_a_reader_cancelled_as_it_is_woken_passes_the_turn_on(
    make_redlock: MakeRedlock, cluster: Cluster
) -> None:
    # No fallback poll within the test (retry_delay 5 s): the second reader gets in only if the turn
    # a cancelled reader was given (by the release's words, or by a reader sharing) is passed on.
    redlock = await make_redlock(retry_delay=5.0)
    rw = redlock.rw_lock("doc", ttl=5.0, acquire_timeout=4.0)
    for turns in range(8):
        writer = rw.write()
        assert await writer.acquire(blocking=False)
        first, second = rw.read(), rw.read()
        waiting = [asyncio.create_task(first.acquire()), asyncio.create_task(second.acquire())]
        await asyncio.sleep(0.1)  # both wait in line
        await writer.release()
        for _ in range(turns):
            await asyncio.sleep(0)
        waiting[0].cancel()
        began = time.monotonic()
        assert await asyncio.wait_for(waiting[1], 2.0)
        assert time.monotonic() - began < 1.0
        try:
            if await waiting[0]:
                await first.release()  # it got in before the cancel came
        except asyncio.CancelledError:
            pass
        await second.release()
        await assert_empty(cluster)


async def test_cancelled_in_a_granted_round_gives_it_back(redlock: Redlock, cluster: Cluster) -> None:
    rw = redlock.rw_lock("doc", ttl=5.0)
    for turns in range(10):
        lock = rw.read() if turns % 2 else rw.write()
        task = asyncio.create_task(lock.acquire())
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        try:
            if await task:
                await lock.release()
        except asyncio.CancelledError:
            pass
        await assert_empty(cluster)


async def test_anyio_cancel_scope_around_a_waiting_writer(redlock: Redlock, cluster: Cluster) -> None:
    rw = redlock.rw_lock("doc", ttl=5.0)
    reader = rw.read()
    assert await reader.acquire(blocking=False)
    for delay in (0.0, 0.001, 0.01, 0.05):
        with anyio.move_on_after(delay) as scope:
            async with rw.write():
                pytest.fail("the writer got in beside a reader")
        assert scope.cancelled_caught
    await reader.release()
    await assert_empty(cluster)
    assert await rw.read().acquire(blocking=False)  # no waiting writer left behind


async def test_anyio_cancel_scope_inside_the_body_releases(redlock: Redlock, cluster: Cluster) -> None:
    rw = redlock.rw_lock("doc", ttl=5.0)
    for kind in ("read", "write"):
        with anyio.CancelScope() as scope:
            async with rw.read() if kind == "read" else rw.write():
                scope.cancel()
                await anyio.sleep(1)
        await assert_empty(cluster)


# -- bad input ------------------------------------------------------------------------------------------


async def test_bad_input_says_what_to_change(redlock: Redlock) -> None:
    with pytest.raises(TypeError, match="read/write lock name must be str or bytes"):
        redlock.rw_lock(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        redlock.rw_lock("")
    with pytest.raises(ValueError, match="ttl"):
        redlock.rw_lock("doc", ttl=-1)
    writer = redlock.rw_lock("doc").write()
    with pytest.raises(RuntimeError, match="not held"):
        writer.downgrade()


def _unused(*_: Any) -> None:
    return None
