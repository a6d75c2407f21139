"""A read/write writer's downgrade racing an extension of that writer, on real nodes.

The downgrade swaps, on each node in one step, the writer's key for the reader's: an extension of the
writer that lands after the swap is refused there although nothing was lost. So a downgrade sent in the
same loop turn as the watchdog's round, or with ``extend()`` in flight, must end holding the read lock,
never in LockLost; the extension goes to the read hold; a real loss (the writer's key gone from a
majority) during a downgrade is still LockLost, with nothing left on the nodes.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from redlock_async import LockEvent, LockLost, Redlock, testing
from redlock_async.events import EventKind
from redlock_async.sync import Redlock as SyncRedlock
from redlock_async.testing import History, LocalNodes

from ._rw_layout import live_readers
from .conftest import Cluster, MakeRedlock, assert_empty, keys_everywhere

W = b"redlock:\x00rw\x00doc"
READERS = W + b"\x00readers"
FENCE = (b"redlock-fence:doc", b"redlock-fence:doc\x00by")


def drop_writer_key(nodes: Cluster | LocalNodes, *indexes: int) -> None:
    """The writer's key vanishes from these nodes (a restart without data, an eviction)."""
    for i in indexes:
        # A node whose yes came after the grant was decided may set it a moment later (the SET is out).
        give_up = time.monotonic() + 2.0
        while nodes[i].command("EXISTS", W) != 1 and time.monotonic() < give_up:
            time.sleep(0.005)
        assert nodes[i].command("DEL", W) == 1


def readers_per_node(nodes: Cluster | LocalNodes) -> list[int]:
    """The live readers' entries on each node."""
    return [len(live_readers(nodes[i], READERS)) for i in range(len(nodes))]


@pytest.mark.parametrize("queue", [True, False])
async def test_a_downgrade_in_the_watchdogs_turn_holds_the_read_lock(
    make_redlock: MakeRedlock, cluster: Cluster, queue: bool
) -> None:
    redlock = await make_redlock(queue=queue, extend_threshold=0.5)
    rw = redlock.rw_lock("doc", ttl=1.0, fencing=True)
    loop = asyncio.get_running_loop()
    writer = rw.write()
    async with writer:
        token = writer.fencing_token
        assert token is not None
        # Two nodes lost the writer's key (still held on three): the watchdog's extension is refused there
        # at once, and by every node that did the swap first, so its refusal can count before the downgrade.
        drop_writer_key(cluster, 0, 1)
        due = writer.validity - 0.5  # the watchdog's next round (extend_threshold=0.5 of ttl=1.0)
        rounds = redlock.statistics().watchdog_rounds
        # A stalled loop (one long callback) wakes this task and then the watchdog in one turn: the downgrade
        # and the watchdog's round go out in one write per node, the downgrade first.
        loop.call_later(due - 0.1, time.sleep, 0.2)
        await asyncio.sleep(due - 0.05)
        async with writer.downgrade() as reader:
            assert reader.held
            assert not writer.held
            assert writer.fencing_token is None
            assert reader.fencing_token == token  # the last writer's: its own
            assert all(W not in keys for keys in keys_everywhere(cluster))  # no writer beside the reader
            assert readers_per_node(cluster) == [0, 0, 1, 1, 1]
            await asyncio.sleep(0.7)  # past the reader's own first round: it keeps the read lock
            assert reader.held
            assert redlock.statistics().watchdog_rounds > rounds
    assert not writer.held
    await assert_empty(cluster, *FENCE)


@pytest.mark.parametrize("lost", [(), (0, 1)], ids=["all-nodes", "minority-lost"])
async def test_an_extend_in_flight_goes_to_the_read_hold(
    make_redlock: MakeRedlock, cluster: Cluster, lost: tuple[int]
) -> None:
    events: list[LockEvent] = []
    redlock = await make_redlock(on_event=events.append)
    rw = redlock.rw_lock("doc", ttl=5.0, fencing=True)
    writer = rw.write()
    async with writer:
        token = writer.fencing_token
        drop_writer_key(cluster, *lost)
        reader = writer.downgrade()
        # Both in the next loop turn, the downgrade first: an extension sent there lands after the swap.
        downgrading = asyncio.create_task(reader.acquire())
        extending = asyncio.create_task(writer.extend())
        assert await downgrading
        del events[:]
        await extending  # no LockLost: the hold went on as a read
        assert [event.kind for event in events] == [EventKind.EXTENDED]  # the read hold's extension
        assert 4.5 < reader.validity <= 5.0
        assert reader.held
        assert reader.fencing_token == token
        assert not writer.held
        assert all(W not in keys for keys in keys_everywhere(cluster))
        with pytest.raises(RuntimeError, match="not held"):
            await writer.extend()  # after the downgrade: the writer is released
        await reader.release()
    await assert_empty(cluster, *FENCE)


@pytest.mark.parametrize("queue", [True, False])
async def test_a_real_loss_during_a_downgrade_is_lock_lost(
    make_redlock: MakeRedlock, cluster: Cluster, queue: bool
) -> None:
    redlock = await make_redlock(queue=queue)
    rw = redlock.rw_lock("doc", ttl=5.0, fencing=True)
    writer = rw.write()
    extending: asyncio.Task[None] | None = None
    with pytest.raises(LockLost, match="was lost before its downgrade: its write lock is gone from a majority"):
        async with writer:
            drop_writer_key(cluster, 0, 1, 2)
            reader = writer.downgrade()
            extending = asyncio.create_task(writer.extend())
            with pytest.raises(LockLost, match="was lost before its downgrade"):
                await reader.acquire()  # never a plain read instead: a writer could have come between
            assert not reader.held
    assert extending is not None
    with pytest.raises(LockLost, match="was lost before its downgrade"):
        await extending  # the extension in flight hears the same verdict
    assert not writer.held
    await assert_empty(cluster, *FENCE)
    assert await rw.write().acquire(blocking=False)  # nothing left behind: not a waiting writer, not a reader


async def test_a_downgrade_no_majority_answers_is_lock_lost(faulty: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(faulty.urls, node_timeout=0.05, ttl=5.0)
    writer = redlock.rw_lock("doc").write()
    with pytest.raises(LockLost, match="could not be downgraded") as outer:
        async with writer:
            for i in (0, 1, 2):
                faulty[i].pause()
            try:
                with pytest.raises(LockLost, match="could not be downgraded on a majority of nodes in time") as inner:
                    async with writer.downgrade():
                        pytest.fail("downgraded without a majority")
            finally:
                for i in (0, 1, 2):
                    faulty[i].resume()
            assert not writer.held
    # The body went on after the loss: its block says so, as for any loss it outlived.
    assert outer.value is inner.value
    await assert_empty(faulty)


async def test_a_writer_whose_body_runs_in_another_task_is_told_of_a_failed_downgrade(
    redlock: Redlock, cluster: Cluster
) -> None:
    writer = redlock.rw_lock("doc", ttl=5.0).write()
    inside = asyncio.Event()

    async def body() -> None:
        async with writer:
            inside.set()
            await asyncio.sleep(10)

    holder = asyncio.create_task(body())
    await inside.wait()
    drop_writer_key(cluster, 0, 1, 2)
    with pytest.raises(LockLost):
        await writer.downgrade().acquire()
    with pytest.raises(LockLost, match="was lost before its downgrade"):
        await asyncio.wait_for(holder, 2.0)  # cancelled as the watchdog cancels a body, as LockLost
    await assert_empty(cluster)


@pytest.mark.parametrize("when", ["votes-out", "replies-in"])
async def test_a_cancelled_downgrade_releases_the_writer_and_is_no_loss(
    redlock: Redlock, cluster: Cluster, when: str
) -> None:
    rw = redlock.rw_lock("doc", ttl=5.0)
    writer = rw.write()
    async with writer:  # no LockLost on the way out
        reader = writer.downgrade()
        if when == "votes-out":
            with anyio.CancelScope() as scope:
                asyncio.get_running_loop().call_soon(scope.cancel)
                await reader.acquire()
            if not scope.cancelled_caught:
                # anyio delivers the cancel a turn later: the replies (local nodes) may have come first, and
                # the downgrade was done. Consistent either way: the writer released, the reader held.
                assert reader.held
                assert all(W not in keys for keys in keys_everywhere(cluster))
                await reader.release()
        else:
            acquiring = asyncio.create_task(reader.acquire())
            await asyncio.sleep(0)  # the downgrade goes out
            time.sleep(0.05)  # (blocking) its replies are in: cancelled in the turn they are read
            acquiring.cancel()
            with pytest.raises(asyncio.CancelledError):
                await acquiring
        assert not writer.held
        assert not reader.held
    await assert_empty(cluster)
    assert await rw.write().acquire(blocking=False)


def test_the_blocking_writer_hears_a_real_loss_during_its_downgrade(cluster: Cluster) -> None:
    with SyncRedlock(cluster.urls) as redlock:
        rw = redlock.rw_lock("doc", ttl=5.0)
        writer = rw.write()
        with pytest.raises(LockLost, match="was lost before its downgrade"), writer:
            drop_writer_key(cluster, 0, 1, 2)
            with writer.downgrade():
                pytest.fail("downgraded a writer that was lost")
        assert writer.lost.is_set()  # told as any loss is told in this API
        assert not writer.held
        held = threading.Event()
        with rw.write():
            held.set()
    assert held.is_set()


@pytest.fixture(scope="module")
def slow_nodes() -> Iterator[LocalNodes]:
    with LocalNodes(3, proxied=True) as nodes:
        yield nodes


@pytest.mark.parametrize("queue", [True, False])
async def test_downgrades_over_a_slow_network_beside_a_contender_keep_exclusion(
    slow_nodes: LocalNodes, make_redlock: MakeRedlock, queue: bool
) -> None:
    """Writers downgrade at random moments while their watchdog extends every ~0.25 s over a 10-20 ms
    round trip, beside another client's readers and writers: never a writer beside another holder,
    fencing tokens in order, and no LockLost but for a downgrade whose nodes did not answer in time
    (under load: the write lock is then given up, truly)."""
    slow_nodes.flush()
    for i, proxy in enumerate(slow_nodes.proxies):
        proxy.latency(0.005 + 0.0025 * i)
    settings = {"queue": queue, "node_timeout": 0.05, "extend_threshold": 0.5, "retry_delay": 0.02}
    ours = await make_redlock(slow_nodes.urls, **settings)
    theirs = await make_redlock(slow_nodes.urls, **settings)
    history = History()
    rng = random.Random(7)
    stop = False
    slow: list[LockLost] = []

    async def downgrader() -> int:
        rw = ours.rw_lock("doc", ttl=0.5, fencing=True)
        done = 0
        for _ in range(6):
            writer = rw.write()
            try:
                async with writer:
                    with history.section("downgrader", writer):
                        await asyncio.sleep(rng.uniform(0.0, 0.6))
                    async with writer.downgrade() as reader:
                        with history.section("downgrader", reader, shared=True):
                            await asyncio.sleep(rng.uniform(0.0, 0.05))
                    done += 1
            except LockLost as lost:
                slow.append(lost)  # checked below: only a downgrade not answered in time
        return done

    async def contender() -> None:
        rw = theirs.rw_lock("doc", ttl=0.5, fencing=True)
        while not stop:
            read = rng.random() < 0.5
            lock = rw.read() if read else rw.write()
            if await lock.acquire(timeout=0.5):
                with history.section("contender", lock, shared=read):
                    await asyncio.sleep(0.01)
                await lock.release()

    other = asyncio.create_task(contender())
    try:
        assert await downgrader() + len(slow) == 6
    finally:
        stop = True
        await other
        slow_nodes.heal()
    history.check()
    assert all("could not be downgraded on a majority of nodes in time" in str(lost) for lost in slow), slow
    assert len(slow) <= 3, slow  # most downgrades are done
    assert sum(1 for section in history.sections if section.client == "contender") > 0


async def test_a_writer_released_while_its_failing_downgrade_is_out_says_so(redlock: Redlock, cluster: Cluster) -> None:
    writer = redlock.rw_lock("doc", ttl=5.0).write()
    assert await writer.acquire()
    drop_writer_key(cluster, 0, 1, 2)
    reader = writer.downgrade()
    acquiring = asyncio.create_task(reader.acquire())
    await asyncio.sleep(0)  # the downgrade is out
    await writer.release()  # (another task's misuse) released before the downgrade's verdict: no loss to tell
    with pytest.raises(RuntimeError, match="its writer was released meanwhile"):
        await acquiring
    assert not reader.held
    await assert_empty(cluster)


@pytest.mark.parametrize("queue", [True, False])
async def test_a_downgrade_of_a_writer_lost_a_moment_earlier_is_its_lock_lost(
    make_redlock: MakeRedlock, cluster: Cluster, queue: bool
) -> None:
    """Issue 35: downgrade() of a writer lost a moment earlier raised RuntimeError ("whose writer is not
    held"), as did the first acquire of a reader made before the loss; both are the writer's LockLost.
    A writer whose validity ran out (no watchdog) is LockLost too; one released is still a RuntimeError."""
    redlock = await make_redlock(queue=queue)
    rw = redlock.rw_lock("doc", ttl=5.0)
    writer = rw.write()
    assert await writer.acquire(blocking=False)
    testing.lose(writer, "lost a moment earlier")
    with pytest.raises(LockLost, match="lost a moment earlier"):
        writer.downgrade()

    assert await writer.acquire(blocking=False)
    reader = writer.downgrade()
    testing.lose(writer, "lost after downgrade()")
    with pytest.raises(LockLost, match="lost after downgrade"):
        await reader.acquire()
    assert not reader.held

    brief = redlock.rw_lock("doc", ttl=0.5, auto_extend=False).write()
    assert await brief.acquire(blocking=False)
    await asyncio.sleep(0.6)
    with pytest.raises(LockLost, match="validity ran out"):
        brief.downgrade()

    assert await writer.acquire(blocking=False)
    await writer.release()
    with pytest.raises(RuntimeError, match="whose writer is not held"):
        writer.downgrade()


def test_a_blocking_downgrade_of_a_writer_lost_a_moment_earlier_is_its_lock_lost(cluster: Cluster) -> None:
    with SyncRedlock(cluster.urls) as redlock:
        writer = redlock.rw_lock("doc", ttl=0.5, auto_extend=False).write()
        with writer:
            time.sleep(0.6)
            with pytest.raises(LockLost, match="validity ran out"):
                writer.downgrade()
        with pytest.raises(RuntimeError, match="whose writer is not held"):
            writer.downgrade()
