"""lock_many through the grant queue (the default): one claim per name, one token and one place in every
line (``redlock_async/_queue/_wait.py``), against real servers.

Checked: that a lock_many waiter is handed its names by the holders' releases alone (no retry of its
own), and holds them only once every name is its own on a majority; that lock_many waiters on
overlapping names and single locks on those names exclude each other per name and all progress (no
deadlock: a name granted while another is held elsewhere is given back), fenced or not, with tokens
growing per name in the order the bodies ran; that a waiter that gives up (every way a caller gives
up) leaves no key and no line entry behind; and the same on uvloop.
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest
import uvloop

from redlock_async import LockNotAcquired, Redlock
from redlock_async.lock import Lock
from redlock_async.testing import History
from redlock_async.testing._history import Section

from .conftest import Cluster, MakeRedlock, eventually, keys_everywhere
from .test_queue import (
    GIVE_UPS,
    PROMPT,
    SLOW,
    assert_nothing_left,
    cancel_first_around_release,
    give_up,
    in_line,
    key_of,
    values_on,
)

BOUND = 10.0
"""The acquire timeout in the contention tests: a task starved for this long fails loudly."""


async def test_a_lock_many_waiter_is_handed_its_names_by_the_releases(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """a and b held by another Redlock; a lock_many(["a", "b"]) waiter with a retry delay of SLOW: a's
    release hands it a, and it does not hold the lock (b is held); b's release hands it b, and it holds
    the lock at once, on every node. Its release leaves nothing behind."""
    holder = await make_redlock()
    waiter_redlock = await make_redlock(retry_delay=SLOW)
    a, b = holder.lock("qm:a"), holder.lock("qm:b")
    assert await a.acquire(blocking=False)
    assert await b.acquire(blocking=False)
    many = waiter_redlock.lock_many(["qm:a", "qm:b"])
    task = asyncio.create_task(many.acquire(timeout=30))
    await in_line(cluster, "qm:a", 1)
    await in_line(cluster, "qm:b", 1)
    await a.release()
    await asyncio.sleep(0.3)
    assert not task.done()
    assert not many.held
    released = time.monotonic()
    await b.release()
    async with asyncio.timeout(PROMPT):
        assert await task
    assert time.monotonic() - released < PROMPT  # the grant, not its timer (SLOW / 2 at the earliest)
    token = many.token
    assert token is not None
    assert await eventually(lambda: values_on(cluster, "qm:a") == [token.encode()] * len(cluster), PROMPT)
    assert await eventually(lambda: values_on(cluster, "qm:b") == [token.encode()] * len(cluster), PROMPT)
    await many.release()
    await assert_nothing_left(cluster)


@pytest.mark.serial
@pytest.mark.parametrize("how", GIVE_UPS)
async def test_a_lock_many_waiter_that_gives_up_leaves_nothing_behind(
    cluster: Cluster, make_redlock: MakeRedlock, how: str
) -> None:
    """b held (ttl 30 s); a lock_many(["a", "b"]) waiter gives up after 0.35 s: a (which it may hold
    meanwhile) and its entries in both lines go at once, only b's key is left; b's release then frees b
    (not granted to the departed waiter)."""
    holder = await make_redlock()
    other = await make_redlock(retry_delay=0.1)
    b = holder.lock("qm-gone:b", ttl=30)
    assert await b.acquire(blocking=False)
    many = other.lock_many(["qm-gone:a", "qm-gone:b"], ttl=30)
    waiting = asyncio.create_task(give_up(how, many, 0.35))
    await in_line(cluster, "qm-gone:b", 1, within=0.3)
    async with asyncio.timeout(5):
        assert await waiting in ("timed out", "moved on", "cancelled")
    assert not many.held
    key = key_of("qm-gone:b")
    assert await eventually(lambda: keys_everywhere(cluster) == [[key]] * len(cluster), PROMPT), keys_everywhere(
        cluster
    )
    await b.release()
    await assert_nothing_left(cluster)


async def contend_many(
    redlocks: list[Redlock], seconds: float, *, fenced: bool
) -> tuple[dict[str, History], collections.Counter[str], int]:
    """On each Redlock: 2 tasks of lock_many(a, b), 1 of lock_many(b, c), and 1 single lock each of a, b
    and c, for *seconds*, 2 ms bodies. Returns each name's history, each task's grants and the timeouts."""
    histories = {name: History() for name in "abc"}
    grants: collections.Counter[str] = collections.Counter()
    timeouts = [0]
    stop = time.monotonic() + seconds
    shapes = [("ab", 2), ("bc", 1), ("a", 1), ("b", 1), ("c", 1)]

    async def worker(client: str, lock: Lock, names: str) -> None:
        while time.monotonic() < stop:
            try:
                async with lock:
                    start = time.monotonic()
                    await asyncio.sleep(0.002)
                    end = time.monotonic()
                    tokens = lock.fencing_tokens
                    for name in names:
                        token = None if tokens is None else tokens[f"qmc:{name}"]
                        histories[name].sections.append(Section(client, lock.token or "?", token, start, end))
                    grants[client] += 1
            except LockNotAcquired:
                timeouts[0] += 1
            await asyncio.sleep(0.001)

    workers = []
    for r, redlock in enumerate(redlocks):
        for names, count in shapes:
            for n in range(count):
                full = [f"qmc:{name}" for name in names]
                lock = redlock.lock_many(full, acquire_timeout=BOUND, fencing=fenced)
                workers.append(asyncio.create_task(worker(f"r{r}.{names}.{n}", lock, names)))
    try:
        async with asyncio.timeout(seconds + BOUND + 15):
            await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
    return histories, grants, timeouts[0]


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("fenced", [False, True], ids=["plain", "fenced"])
async def test_lock_many_and_single_locks_on_overlapping_names_all_progress(
    cluster: Cluster, make_redlock: MakeRedlock, fenced: bool
) -> None:
    """Two Redlocks x (2 tasks of lock_many(a, b), 1 of lock_many(b, c), 1 lock each of a, b, c), 2 s:
    per name no overlap (fenced: tokens grow in the order the bodies ran), every task served (no
    deadlock, none starved), no acquire timed out, and nothing left on the nodes."""
    redlocks = [await make_redlock(retry_delay=0.05) for _ in range(2)]
    histories, grants, timeouts = await contend_many(redlocks, 2.0, fenced=fenced)
    for history in histories.values():
        history.check()
    print(f"grants {dict(grants)}")
    assert timeouts == 0
    assert len(grants) == 12, grants  # every task of both Redlocks
    assert min(grants.values()) >= 3, grants
    if not fenced:
        await assert_nothing_left(cluster)
        return

    def left() -> list[list[bytes]]:  # the fencing counters stay (they never expire here)
        return [[key for key in keys if not key.startswith(b"redlock-fence:")] for keys in keys_everywhere(cluster)]

    assert await eventually(lambda: left() == [[]] * len(cluster), PROMPT), left()


@pytest.mark.slow
@pytest.mark.serial
def test_lock_many_through_the_queue_on_uvloop(cluster: Cluster) -> None:
    """The contention above, plain, on uvloop whatever REDLOCK_TEST_LOOP says."""

    async def main() -> None:
        async with Redlock(cluster.urls, retry_delay=0.05) as first, Redlock(cluster.urls, retry_delay=0.05) as second:
            histories, grants, timeouts = await contend_many([first, second], 1.5, fenced=False)
        for history in histories.values():
            history.check()
        assert timeouts == 0
        assert len(grants) == 12, grants
        assert min(grants.values()) >= 2, grants
        await assert_nothing_left(cluster)

    uvloop.run(main())


@pytest.mark.slow
@pytest.mark.serial
async def test_a_lock_many_waiter_cancelled_around_its_grants_never_leaves_a_name_to_no_one(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """A sweep over the moment of cancellation (as tests/test_queue.py's for a lock): holder H of
    lock_many(a, b) (ttl 30 s), first waiter W1 of lock_many(a, b) (in ``async with``, then holding for
    30 s), second waiter W2 of lock b alone (retry delay SLOW). H releases: the nodes grant W1 both
    names, and W1 is cancelled k loop turns later. Whatever W1 ended with, W2 holds b promptly, and
    nothing is left after."""
    holders = await make_redlock(retry_delay=SLOW)
    firsts = await make_redlock(retry_delay=SLOW)
    seconds = await make_redlock(retry_delay=SLOW)
    for k in range(-1, 10):
        holder = holders.lock_many(["qmt:a", "qmt:b"], ttl=30)
        assert await holder.acquire(blocking=False), k
        first = firsts.lock_many(["qmt:a", "qmt:b"], ttl=30, acquire_timeout=20)
        second = seconds.lock("qmt:b", ttl=30)
        await cancel_first_around_release(
            k,
            holder,
            first,
            second,
            lambda n: in_line(cluster, "qmt:b", n),
            lambda: f"keys {keys_everywhere(cluster)}",
        )
        await assert_nothing_left(cluster)
