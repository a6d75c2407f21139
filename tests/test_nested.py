"""Nested acquires: a task asking for what it already holds inside ``async with`` fails at once.

Before, it waited for itself until its acquire timeout and then said "could not acquire" (a nested
``campaign()``, with no timeout, waited for ever). Another task, a child task of the holder too,
still waits as any other.
"""

from __future__ import annotations

import asyncio

import pytest

from redlock_async import LockLost, LockNotAcquired, NestedAcquire, Redlock, RedlockError

from .conftest import Cluster, MakeRedlock, assert_empty, lock_keys

LONG = 30.0  # an acquire timeout no test waits out: a nested acquire that waited would hit the test's bound
AT_ONCE = 5.0  # the bound a refusal must come within (it comes before any node is asked)


def refused(exc: pytest.ExceptionInfo[NestedAcquire], what: str) -> None:
    """The refusal says what the task holds, why it fails, and that reentrancy is only planned."""
    text = str(exc.value)
    assert what in text, text
    for words in ("already holds", "would wait for itself", "reentrant=True"):
        assert words in text, text
    assert exc.value.outcomes == ()  # no node was asked


async def test_two_locks_of_one_name_nested_in_one_task(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(acquire_timeout=LONG)
    async with asyncio.timeout(AT_ONCE), redlock.lock("a") as outer:
        inner = redlock.lock("a")
        with pytest.raises(NestedAcquire) as exc:
            async with inner:
                pass
        refused(exc, "lock 'a'")
        assert exc.value.name == "a"
        # The same with acquire(), blocking or not: none of them sent a round.
        with pytest.raises(NestedAcquire):
            await inner.acquire()
        with pytest.raises(NestedAcquire):
            await inner.acquire(blocking=False)
        assert inner.statistics().attempts == 0
        assert outer.held
        assert all(keys == [b"redlock:a"] for keys in (lock_keys(cluster[i]) for i in range(len(cluster))))
    assert not outer.held
    await assert_empty(cluster)


async def test_the_error_is_a_misuse_not_contention(make_redlock: MakeRedlock) -> None:
    """A RuntimeError (misuse, as documented) and a RedlockError; not a LockNotAcquired, so handlers
    that answer "busy, try again later" do not catch it: retrying can never succeed."""
    assert issubclass(NestedAcquire, RedlockError)
    assert issubclass(NestedAcquire, RuntimeError)
    assert not issubclass(NestedAcquire, LockNotAcquired)
    redlock = await make_redlock(acquire_timeout=LONG)
    busy = 0
    with pytest.raises(NestedAcquire):
        async with asyncio.timeout(AT_ONCE), redlock.lock("handler"):
            try:
                async with redlock.lock("handler"):
                    pass
            except LockNotAcquired:
                busy += 1
    assert busy == 0


async def test_the_same_lock_entered_twice(make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(acquire_timeout=LONG)
    lock = redlock.lock("same")
    async with asyncio.timeout(AT_ONCE), lock:
        with pytest.raises(NestedAcquire) as exc:
            async with lock:
                pass
        refused(exc, "lock 'same'")
        assert lock.held  # the failed entry did not touch the outer hold
    assert not lock.held
    # Another task acquiring a Lock object held elsewhere is misuse of the object, as before.
    assert await lock.acquire()
    with pytest.raises(RuntimeError, match="already held") as other:
        await asyncio.create_task(lock.acquire())
    assert not isinstance(other.value, NestedAcquire)
    await lock.release()


async def test_lock_many_with_a_name_the_task_holds(make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(acquire_timeout=LONG)
    async with asyncio.timeout(AT_ONCE):
        async with redlock.lock("b"):
            with pytest.raises(NestedAcquire) as exc:
                async with redlock.lock_many(["a", "b", "c"]):
                    pass
            refused(exc, "lock 'b'")
            assert "lock_many(['a', 'b', 'c'])" in str(exc.value)
            async with redlock.lock_many(["a", "c"]):  # the names it does not hold: taken as usual
                pass
        async with redlock.lock_many(["x", "y"]):
            with pytest.raises(NestedAcquire, match="lock 'y'"):
                async with redlock.lock("y"):
                    pass
            with pytest.raises(NestedAcquire, match="lock 'x'"):
                async with redlock.lock_many(["w", "x"]):
                    pass


async def test_a_semaphore_refuses_only_when_the_task_holds_every_permit(make_redlock: MakeRedlock) -> None:
    """A task holding some permits may ask for another: a permit held elsewhere may come free (a job may
    take two slots). Holding every permit, only its own release could free one: that is refused."""
    redlock = await make_redlock(acquire_timeout=LONG)
    async with asyncio.timeout(AT_ONCE):
        async with redlock.semaphore("pool", limit=2) as one, redlock.semaphore("pool", limit=2) as two:
            assert one.held
            assert two.held
            with pytest.raises(NestedAcquire) as exc:
                async with redlock.semaphore("pool", limit=2):
                    pass
            refused(exc, "every permit (2 of limit 2) of semaphore 'pool'")
        async with redlock.semaphore("single", limit=1):
            with pytest.raises(NestedAcquire, match="semaphore 'single'"):
                await redlock.semaphore("single", limit=1).acquire()
            async with redlock.lock("single"):  # a lock of the same name is another resource
                pass


async def test_a_child_task_of_the_holder_waits_as_any_other(make_redlock: MakeRedlock) -> None:
    """A child task is a different task: not refused; it gets the lock once the parent releases it."""
    redlock = await make_redlock(acquire_timeout=LONG, retry_delay=0.05)
    order: list[str] = []

    async def child() -> None:
        async with redlock.lock("family"):
            order.append("child")

    async with asyncio.timeout(AT_ONCE):
        async with redlock.lock("family"):
            task = asyncio.create_task(child())
            await asyncio.sleep(0.2)
            assert not task.done()  # waiting for the parent, not refused
            order.append("parent")
        await task
    assert order == ["parent", "child"]


async def test_a_hold_that_ended_inside_the_block_no_longer_counts(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Released by the body, or lost with on_lost set (the body goes on): the task holds nothing, so
    taking the name again is not refused."""
    redlock = await make_redlock(acquire_timeout=LONG, ttl=1.0)
    async with asyncio.timeout(AT_ONCE):
        async with redlock.lock("again") as lock:
            await lock.release()
            async with redlock.lock("again"):
                pass
    lost = asyncio.Event()

    def on_lost(_: LockLost) -> None:
        lost.set()

    async with asyncio.timeout(AT_ONCE):
        async with redlock.lock("lost", on_lost=on_lost) as lock:
            for i in range(len(cluster)):
                cluster[i].command("DEL", "redlock:lost")  # its next extension is refused everywhere
            await lost.wait()
            assert not lock.held
            async with redlock.lock("lost"):
                pass


async def test_explicit_acquire_is_not_bound_to_its_task(make_redlock: MakeRedlock) -> None:
    """A lock taken with acquire() may be released by another task (a dispatcher acquires, a worker
    releases), so its task asking again is an ordinary wait, as before: not refused."""
    redlock = await make_redlock(acquire_timeout=LONG, retry_delay=0.05)
    dispatched = redlock.lock("job")
    assert await dispatched.acquire()

    async def worker() -> None:
        await asyncio.sleep(0.1)
        await dispatched.release()

    async with asyncio.timeout(AT_ONCE):
        done = asyncio.create_task(worker())
        async with redlock.lock("job"):  # the same task: waits for the worker's release
            assert not dispatched.held
        await done


async def test_another_redlock_is_another_client(make_redlock: MakeRedlock) -> None:
    """Holds are known per Redlock: one of another Redlock is another client's, waited for as such."""
    first, second = await make_redlock(), await make_redlock()
    async with first.lock("two-clients"):
        assert not await second.lock("two-clients").acquire(timeout=0.1)


async def test_a_nested_campaign_fails_at_once(make_redlock: MakeRedlock) -> None:
    """Before, it waited for itself for ever (a campaign has no timeout by default)."""
    redlock = await make_redlock(fencing=True)
    election = redlock.election("leader")
    async with asyncio.timeout(AT_ONCE):
        async with election.campaign() as term:
            with pytest.raises(NestedAcquire, match="already leads election 'leader'") as exc:
                async with election.campaign():
                    pass
            assert exc.value.name == "leader"
            with pytest.raises(NestedAcquire):  # another Election object of the name: the same
                async with redlock.election("leader").campaign():
                    pass
            with pytest.raises(NestedAcquire):
                async with redlock.lock("leader"):
                    pass
            assert (await election.leader()).fencing_counter == term
        async with redlock.lock("leader"):
            with pytest.raises(NestedAcquire, match="or holds its lock"):
                async with election.campaign():
                    pass


def test_nested_on_uvloop(cluster: Cluster) -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        redlock = Redlock(cluster.urls, acquire_timeout=LONG)
        async with redlock, asyncio.timeout(AT_ONCE), redlock.lock("uv"):
            with pytest.raises(NestedAcquire):
                async with redlock.lock("uv"):
                    pass

    uvloop.run(main())


async def test_nested_in_anyio_task_groups(make_redlock: MakeRedlock) -> None:
    """anyio's tasks are asyncio tasks: the holder's nested acquire is refused; a task of its task group
    is another task, which waits its turn."""
    anyio = pytest.importorskip("anyio")
    redlock = await make_redlock(acquire_timeout=LONG, retry_delay=0.05)
    order: list[str] = []

    async def sibling() -> None:
        async with redlock.lock("anyio"):
            order.append("sibling")

    with anyio.fail_after(AT_ONCE):
        async with anyio.create_task_group() as group, redlock.lock("anyio"):
            group.start_soon(sibling)
            with pytest.raises(NestedAcquire):
                async with redlock.lock("anyio"):
                    pass
            await anyio.sleep(0.1)
            order.append("holder")
    assert order == ["holder", "sibling"]


async def test_a_block_left_by_a_cancelled_scope_binds_nothing(make_redlock: MakeRedlock) -> None:
    """Left by a timeout (asyncio) or a cancelled scope (anyio, which cancels again at every await of
    the exit): the task holds nothing afterwards, and takes the name again at once."""
    anyio = pytest.importorskip("anyio")
    redlock = await make_redlock(acquire_timeout=LONG)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05), redlock.lock("cancelled"):
            await asyncio.sleep(10)
    with anyio.move_on_after(0.05):
        async with redlock.lock("cancelled"):
            await anyio.sleep(10)
    async with asyncio.timeout(AT_ONCE), redlock.lock("cancelled"):
        pass


async def test_a_synchronized_call_nested_in_one_of_the_same_name(make_redlock: MakeRedlock) -> None:
    """Recursion under ``@synchronized``: "skip" skips the inner call at once (the lock is held, by its
    caller), "raise" raises NestedAcquire; neither waits for itself."""
    redlock = await make_redlock(acquire_timeout=LONG)
    calls: list[int] = []

    @redlock.synchronized("tree:{depth}", on_busy="skip")
    async def skip(depth: int, inner: int) -> str | None:
        calls.append(inner)
        return await skip(depth, inner + 1) if inner == 0 else "inner ran"

    @redlock.synchronized("tree:{depth}")
    async def raises(depth: int) -> None:
        await raises(depth)

    async with asyncio.timeout(AT_ONCE):
        assert await skip(1, 0) is None  # the inner call was skipped
        assert calls == [0]
        with pytest.raises(NestedAcquire, match="lock 'tree:2'"):
            await raises(2)
