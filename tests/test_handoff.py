"""Pushed hand-off of release words (``queue=False``, pinned here; the default is the grant queue):
waiters woken by the release, not by their retry timer."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from typing import Any, cast

import pytest

from redlock_async import Lock, Redlock
from redlock_async._nodes._node import Node
from redlock_async._shared._handoff import Listener

from .conftest import Cluster, MakeRedlock

SLOW_POLL = 5.0  # a retry delay so long that only a notification can explain a quick grant


async def hold_then_release(lock_holder: Redlock, name: str, after: float) -> asyncio.Task[None]:
    lock = lock_holder.lock(name)
    assert await lock.acquire()

    async def release() -> None:
        await asyncio.sleep(after)
        await lock.release()

    return asyncio.create_task(release())


@pytest.mark.serial
async def test_waiter_is_woken_by_the_release(make_redlock: MakeRedlock) -> None:
    holder, waiter = await make_redlock(queue=False), await make_redlock(queue=False, retry_delay=SLOW_POLL)
    releasing = await hold_then_release(holder, "pushed", after=0.2)
    started = time.monotonic()
    lock = waiter.lock("pushed")
    assert await lock.acquire(timeout=10)
    waited = time.monotonic() - started
    await releasing
    # Its first retry timer would fire after SLOW_POLL / 2 at the earliest: this was the release.
    assert waited < SLOW_POLL / 4
    assert waiter.statistics().wakeups == 1
    await lock.release()


async def test_polling_when_pushed_hand_off_is_off(make_redlock: MakeRedlock) -> None:
    holder, waiter = await make_redlock(queue=False), await make_redlock(retry_delay=0.05, wait_for_release=False)
    releasing = await hold_then_release(holder, "polled", after=0.2)
    lock = waiter.lock("polled")
    assert await lock.acquire(timeout=5)
    await releasing
    assert waiter.statistics().wakeups == 0
    await lock.release()


async def test_one_release_wakes_one_waiter_oldest_first(make_redlock: MakeRedlock) -> None:
    holder, waiters = await make_redlock(queue=False), await make_redlock(queue=False, retry_delay=SLOW_POLL)
    first = holder.lock("queue")
    assert await first.acquire()
    order: list[int] = []
    locks = [waiters.lock("queue") for _ in range(4)]

    async def wait_turn(n: int) -> None:
        async with locks[n]:
            order.append(n)
            await asyncio.sleep(0.005)

    tasks = []
    for n in range(4):
        tasks.append(asyncio.create_task(wait_turn(n)))
        await asyncio.sleep(0.05)  # queue up in a known order
    await first.release()
    await asyncio.sleep(0.002)
    async with asyncio.timeout(SLOW_POLL / 2):
        await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3]  # FIFO among one Redlock's waiters
    assert waiters.statistics().wakeups == 4  # one per release, no stampede


@pytest.mark.serial
async def test_waiter_still_acquires_when_notifications_are_lost(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    holder, waiter = await make_redlock(queue=False), await make_redlock(queue=False, retry_delay=0.3)
    first = holder.lock("lost-word")
    assert await first.acquire()
    task = asyncio.create_task(waiter.lock("lost-word").acquire(timeout=10))
    await asyncio.sleep(0.1)  # the waiter listens now
    for i in range(len(cluster)):
        cluster[i].command("CLIENT", "KILL", "TYPE", "pubsub")  # every subscriber connection dropped
    await first.release()  # published to no one
    started = time.monotonic()
    assert await task
    assert time.monotonic() - started < 1.0  # the jittered fallback (<= 0.45 s), or a re-subscription


async def test_waiter_still_acquires_across_a_node_restart(faulty: Cluster) -> None:
    async with (
        Redlock(faulty.urls, queue=False) as holder,
        Redlock(faulty.urls, queue=False, retry_delay=0.3) as waiter,
    ):
        first = holder.lock("restart-word", ttl=30)
        assert await first.acquire()
        task = asyncio.create_task(waiter.lock("restart-word").acquire(timeout=10))
        await asyncio.sleep(0.1)
        faulty[0].restart(keep_data=True)
        faulty[1].restart(keep_data=True)
        await first.release()
        assert await task


async def test_no_subscriber_connection_or_task_outlives_the_redlock(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    def subscribers() -> int:
        listed = 0
        for i in range(len(cluster)):
            clients = cluster[i].command("CLIENT", "LIST", "TYPE", "pubsub")
            listed += len(clients) if isinstance(clients, list) else str(clients).count("id=")
        return listed

    holder = await make_redlock(queue=False)
    first = holder.lock("leak")
    assert await first.acquire()
    before = set(asyncio.all_tasks())
    async with Redlock(cluster.urls, queue=False, retry_delay=0.05) as waiter:
        task = asyncio.create_task(waiter.lock("leak").acquire(timeout=0.3))
        deadline = time.monotonic() + 2  # (under load, a subscription may take longer than a try)
        while subscribers() < len(cluster) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert subscribers() == len(cluster)  # one subscriber connection per node, not per waiter
        assert not await task
    deadline = time.monotonic() + 2
    while subscribers() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert subscribers() == 0
    assert [t for t in asyncio.all_tasks() - before if not t.done()] == []
    await first.release()


async def test_two_redlocks_contending_make_progress(make_redlock: MakeRedlock) -> None:
    """8 tasks over 2 Redlocks on one resource: every task gets its grants, no overlap, no livelock."""
    redlocks = [await make_redlock(queue=False, retry_delay=SLOW_POLL) for _ in range(2)]
    inside: list[int] = []
    overlaps = 0
    grants = [0] * 8

    async def worker(n: int) -> None:
        nonlocal overlaps
        lock = redlocks[n % 2].lock("duel")
        for _ in range(10):
            async with lock:
                overlaps += bool(inside)
                inside.append(n)
                await asyncio.sleep(0.001)
                inside.remove(n)
                grants[n] += 1

    async with asyncio.timeout(20):
        await asyncio.gather(*(worker(n) for n in range(8)))
    assert overlaps == 0
    assert grants == [10] * 8


async def test_late_words_of_a_release_heard_by_another_redlock_wake_no_one() -> None:
    """Two Redlocks of one process hear every release twice (one subscriber connection each).

    The first listener to hear a majority wakes the oldest waiter; when the second one's
    majority comes after that waiter already finished, it must not wake the next waiter
    for the same release (that waiter would only find the lock taken).
    """
    scope = ("n0", "n1", "n2", "n3", "n4")
    first, second = Listener(0.01, scope), Listener(0.01, scope)
    channel, message = b"redlock:k", [b"message", b"redlock:k", b"digest-of-token-1"]
    for listener in (first, second):
        await listener.subscribe(channel)  # no subscriber nodes yet: nothing to send
        listener.nodes = cast(Sequence[Node], [object()] * 5)  # the words are fed by hand: only 5 counts
    oldest = asyncio.create_task(first.wait(channel, 5.0, 0))
    await asyncio.sleep(0)
    following = asyncio.create_task(second.wait(channel, 0.3, 1))
    await asyncio.sleep(0)
    for _ in range(3):
        second.on_message(message)  # the second Redlock's listener hears a majority first
    assert await oldest is True
    first.done(channel)  # the woken waiter got the lock and is done trying
    for _ in range(5):
        first.on_message(message)  # the same release, heard late by the first Redlock
    assert await following is False  # woken by its own timer, not by the stale words
    assert first.wakeups + second.wakeups == 1
    for listener in (first, second):
        listener.nodes = ()
        listener.unsubscribe(channel)


async def test_a_wait_that_times_out_is_not_a_wake_up_and_leaves_the_queue() -> None:
    listener = Listener(0.01, ("n0",))
    channel = b"redlock:timeout"
    await listener.subscribe(channel)  # no subscriber nodes: nothing to send
    assert await listener.wait(channel, 0.05, 0) is False  # the fallback timer, not a release
    assert listener.wakeups == 0
    # It keeps its place in line until it departs, and its turn was not taken: a woken waiter
    # would hold the line until done(), and the next release would wake no one.
    assert listener.waiting(channel)
    listener.nodes = cast(Sequence[Node], [object()])  # one node: each word is a majority
    listener.on_message([b"message", channel, b"release"])
    assert listener.wakeups == 1
    assert await listener.wait(channel, 5.0, 0) is True  # its turn, at once
    listener.done(channel)
    listener.depart(channel, 0)
    assert not listener.waiting(channel)
    listener.nodes = ()
    listener.unsubscribe(channel)


def fake_listener(name: str) -> Listener:
    listener = Listener(0.01, (name,))
    return listener


async def test_a_waiter_cancelled_in_the_turn_it_is_woken_passes_its_turn_on() -> None:
    """Cancelled (its own timeout, a task group) in the loop turn its wake-up came: it will not try,
    so the next waiter must be woken; before, the key's queue stayed "woken" for good."""
    listener = fake_listener("cancelled-turn")
    channel, message = b"redlock:turn", [b"message", b"redlock:turn", b"digest"]
    await listener.subscribe(channel)
    listener.nodes = cast(Sequence[Node], [object()])  # one node: each word is a majority
    oldest = asyncio.create_task(listener.wait(channel, 5.0, 0))
    following = asyncio.create_task(listener.wait(channel, 5.0, 1))
    await asyncio.sleep(0)
    listener.on_message(message)  # wakes the oldest...
    oldest.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await oldest
    async with asyncio.timeout(1.0):  # woken by the same release, not by its 5 s timer
        assert await following is True
    assert listener.wakeups == 2
    listener.done(channel)
    listener.nodes = ()
    listener.unsubscribe(channel)


async def test_waiters_whose_timers_fire_keep_their_place_in_line() -> None:
    listener = fake_listener("fifo")
    channel, message = b"redlock:fifo", [b"message", b"redlock:fifo"]
    await listener.subscribe(channel)
    listener.nodes = cast(Sequence[Node], [object()])
    order: list[int] = []

    async def waiter(place: int) -> None:
        while not await listener.wait(channel, 0.002 * (10 - place), place):  # the oldest time out most
            pass
        order.append(place)
        listener.done(channel)

    tasks = []
    for place in range(10):
        tasks.append(asyncio.create_task(waiter(place)))
        await asyncio.sleep(0.003)
    await asyncio.sleep(0.05)  # every waiter's timer fired several times
    for n in range(10):
        listener.on_message([*message[:2], b"release-%d" % n])
        await asyncio.sleep(0.01)
    async with asyncio.timeout(5):
        await asyncio.gather(*tasks)
    assert order == list(range(10))
    listener.nodes = ()
    listener.unsubscribe(channel)


async def test_late_release_words_leave_no_memory_behind() -> None:
    listener = fake_listener("late-words")
    five = cast(Sequence[Node], [object()] * 5)  # the words are fed by hand: only the count matters
    for n in range(200):
        channel = f"redlock:name-{n}".encode()
        await listener.subscribe(channel)  # no subscriber nodes while entering and leaving: nothing to send
        listener.nodes = five
        listener.on_message([b"message", channel, b"a"])  # a partial count, while listening
        listener.nodes = ()
        listener.unsubscribe(channel)
        listener.nodes = five
        listener.on_message([b"message", channel, b"b"])  # a word after the waiter left
        listener.nodes = ()
    assert listener.remembered() == 0


@pytest.mark.slow
async def test_impatient_acquirers_never_leave_the_queue_stuck(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Looping workers, and a stream of acquirers that give up at random (asyncio.timeout):
    afterwards a release still wakes a waiter at once."""
    redlock = await make_redlock(queue=False, retry_delay=5.0)  # a wait ends by a wake-up, or after seconds
    stop = time.monotonic() + 4.0

    async def worker() -> None:
        while time.monotonic() < stop:
            async with redlock.lock("impatient", acquire_timeout=10):
                await asyncio.sleep(0.003)

    async def impatient() -> None:
        while time.monotonic() < stop:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(random.uniform(0, 0.05)), redlock.lock("impatient", acquire_timeout=10):
                    await asyncio.sleep(0.001)

    await asyncio.gather(*(worker() for _ in range(3)), *(impatient() for _ in range(6)))
    holder = redlock.lock("impatient")
    assert await holder.acquire(blocking=False)
    waiter = asyncio.create_task(redlock.lock("impatient", acquire_timeout=10).acquire())
    async with asyncio.timeout(5):  # its subscription in place on every node (a fixed 0.1 s was short under load)
        while min(int(cluster[i].command("PUBSUB", "NUMSUB", "redlock:impatient")[1]) for i in range(len(cluster))) < 1:  # type: ignore[index]
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # and its first look at the key done (it waits now)
    before = redlock.statistics().wakeups
    await holder.release()
    async with asyncio.timeout(5):
        assert await waiter
    assert redlock.statistics().wakeups == before + 1  # woken by the release, not by its timer


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
async def test_a_blocking_acquire_tries_at_once_behind_waiters_that_wait_for_their_timers(
    cluster: Cluster, make_redlock: MakeRedlock, kind: str
) -> None:
    """The holder's lease ran out (no release word): a waiter of the same Redlock waits for its timer
    (seconds), and a newcomer must take the free lock at once, not join the line behind it. Before, it
    joined, and tried once at its deadline (``acquire(timeout=0.5)``: at 0.5 s; here: after 15 s)."""
    redlock = await make_redlock(queue=False, retry_delay=30.0)  # a waiter's timer fires after 15-45 s

    def make(**settings: Any) -> Lock:
        if kind == "lock":
            lock: Lock = redlock.lock("expires", **settings)
            return lock
        return redlock.semaphore("expires", limit=1, **settings)

    holder = make(ttl=0.5, auto_extend=False)
    assert await holder.acquire(blocking=False)
    queued = asyncio.create_task(make().acquire(timeout=60))
    await asyncio.sleep(0.7)  # the holder's lease ran out: free, and no release word
    assert not queued.done()
    newcomer = make()
    async with asyncio.timeout(5):  # far below the newcomer's first timer (15 s)
        assert await newcomer.acquire(timeout=20)
    assert newcomer.statistics().attempts == 1
    before = redlock.statistics().wakeups
    await newcomer.release()  # heard: wakes the waiter in line
    async with asyncio.timeout(5):
        assert await queued
    assert redlock.statistics().wakeups == before + 1


@pytest.mark.serial
async def test_a_newcomer_joins_the_line_when_this_redlock_holds_the_lock(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """Held inside `async with` by a lock of the same Redlock, with waiters in line: a newcomer does not
    send a round it would lose; it waits its turn (FIFO) and is woken by the releases."""
    redlock = await make_redlock(queue=False, retry_delay=SLOW_POLL)
    order: list[str] = []
    release = asyncio.Event()

    async def take(name: str) -> None:
        async with redlock.lock("line") as lock:
            order.append(name)
            if name == "holder":
                await release.wait()
        attempts[name] = lock.statistics().attempts

    attempts: dict[str, int] = {}

    tasks = [asyncio.create_task(take("holder"))]
    await asyncio.sleep(0.1)
    tasks.append(asyncio.create_task(take("first")))
    await asyncio.sleep(0.1)
    tasks.append(asyncio.create_task(take("second")))
    await asyncio.sleep(0.1)
    release.set()
    async with asyncio.timeout(SLOW_POLL / 4):
        await asyncio.gather(*tasks)
    assert order == ["holder", "first", "second"]
    # "first" found no line: it tried, subscribed and looked again, then got it handed over. "second"
    # found the line and the holder here: its only round is the one handed over to it.
    assert attempts == {"holder": 1, "first": 3, "second": 1}, attempts


async def test_taking_tells_a_newcomer_whether_the_line_takes_the_key_now() -> None:
    """A waiter woken by a release (or having its turn), or a release left to other processes: the line
    takes the key, a newcomer joins it. Waiters that wait for their timers, or are between two waits:
    the key may be free, a newcomer tries at once."""
    listener = fake_listener("taking")
    channel = b"redlock:taking"
    await listener.subscribe(channel)
    listener.nodes = cast(Sequence[Node], [object()])  # one node: each word is a majority
    assert not listener.taking(channel)
    assert await listener.wait(channel, 0.01, 0) is False  # its timer fired: between two waits
    assert listener.waiting(channel)
    assert not listener.taking(channel)
    waiting = asyncio.create_task(listener.wait(channel, 5.0, 0))
    await asyncio.sleep(0)
    assert not listener.taking(channel)
    listener.on_message([b"message", channel, b"release-1"])
    assert listener.taking(channel)  # woken, trying
    assert await waiting is True
    listener.done(channel)
    assert not listener.taking(channel)
    listener.depart(channel, 0)
    listener.nodes = ()
    listener.unsubscribe(channel)
