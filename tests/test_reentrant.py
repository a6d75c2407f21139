"""Reentrant locks (redlock.lock(name, reentrant=True)) on real nodes: the same task enters again at once,
the key goes at the outermost exit; other tasks, child tasks too, wait."""

from __future__ import annotations

import asyncio
import time

import pytest

from redlock_async import LockLost, NestedAcquire, Redlock

from .conftest import Cluster, assert_empty, holders


async def test_the_same_task_enters_again_at_once_and_the_key_goes_at_the_outermost_exit(
    redlock: Redlock, cluster: Cluster
) -> None:
    outer = redlock.lock("job", reentrant=True, acquire_timeout=5.0)
    async with outer:
        token = outer.token
        began = time.monotonic()
        async with redlock.lock("job", reentrant=True) as inner:  # another Lock of the name
            async with outer:  # the same Lock again
                assert time.monotonic() - began < 0.1  # nothing waited for
                assert inner.held
                assert inner.token == token  # it shows the hold it joined
                assert inner.validity > 0
            assert outer.held
        assert inner.token is None  # left: no longer held through it
        assert not inner.held
        assert len(holders(cluster, "job")) == 5  # still held: the outer block runs on
    await assert_empty(cluster)


async def test_acquire_and_release_join_as_async_with_does(redlock: Redlock, cluster: Cluster) -> None:
    outer = redlock.lock("job", reentrant=True)
    async with outer:
        inner = redlock.lock("job", reentrant=True)
        assert await inner.acquire(blocking=False)
        assert await inner.acquire(blocking=False) is True  # again, on the same Lock
        await inner.release()
        assert inner.held  # one join still open
        await inner.release()
        assert not inner.held
        with pytest.raises(RuntimeError, match="not held"):
            await inner.release()
        assert outer.held
    await assert_empty(cluster)


async def test_other_tasks_wait_child_tasks_too(redlock: Redlock) -> None:
    async with redlock.lock("job", reentrant=True):

        async def child() -> bool:
            return await redlock.lock("job", reentrant=True).acquire(timeout=0.3)

        began = time.monotonic()
        assert await asyncio.create_task(child()) is False  # a child task is another task: it waited
        assert time.monotonic() - began >= 0.3
    later = redlock.lock("job", reentrant=True)
    assert await asyncio.create_task(later.acquire(blocking=False))
    await later.release()


async def test_without_reentrant_a_nested_acquire_still_fails_at_once(redlock: Redlock) -> None:
    async with redlock.lock("job", reentrant=True):
        with pytest.raises(NestedAcquire, match="reentrant=True"):
            await redlock.lock("job").acquire()
    async with redlock.lock("job"):
        with pytest.raises(NestedAcquire, match="reentrant=True"):  # a plain hold is not joined
            await redlock.lock("job", reentrant=True).acquire()


async def test_the_holder_cannot_release_under_an_open_join(redlock: Redlock) -> None:
    outer = redlock.lock("job", reentrant=True)
    assert await outer.acquire(blocking=False)
    inner = redlock.lock("job", reentrant=True)
    assert await inner.acquire(blocking=False)
    with pytest.raises(RuntimeError, match="still joined"):
        await outer.release()
    await inner.release()
    await outer.release()


async def test_a_lost_lease_cancels_the_nested_body_and_the_outer_exit_says_so(
    redlock: Redlock, cluster: Cluster
) -> None:
    outer = redlock.lock("job", reentrant=True, ttl=1.0)
    reached = False
    with pytest.raises(LockLost):
        async with outer, redlock.lock("job", reentrant=True):
            for i in range(len(cluster)):
                cluster[i].command("DEL", "redlock:job")  # the keys go: the next extension is refused
            await asyncio.sleep(3)
            reached = True
    assert not reached


async def test_reentrant_is_checked(redlock: Redlock) -> None:
    with pytest.raises(TypeError, match="reentrant must be True or False"):
        redlock.lock("job", reentrant="yes")  # type: ignore[call-overload]


async def test_an_anyio_cancel_scope_in_the_nested_body_leaves_nothing(redlock: Redlock, cluster: Cluster) -> None:
    import anyio

    with anyio.CancelScope() as scope:
        async with redlock.lock("job", reentrant=True) as outer, redlock.lock("job", reentrant=True):
            assert outer.depth == 1
            scope.cancel()
            await anyio.sleep(1)
    assert scope.cancelled_caught
    await assert_empty(cluster)
    again = redlock.lock("job", reentrant=True)
    assert await again.acquire(blocking=False)  # no hold left behind to join
    assert again.depth == 0
    await again.release()
