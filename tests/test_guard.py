"""_guard without servers: ``async with`` on fake nodes: the loss that cancels the body and comes out
as LockLost, the caller's own cancellation that stays one, and the lock's binding to its task."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from redlock_async.errors import LockLost, NestedAcquire
from redlock_async.lock import Lock
from redlock_async.testing import lose
from redlock_async.testing._inside import cluster_of

from .fakes import virtual
from .parts import fake_lock


def test_a_loss_while_the_body_waits_cancels_it_and_comes_out_as_lock_lost() -> None:
    async def test() -> None:
        lock, _, answers = fake_lock()
        reached: list[str] = []
        with pytest.raises(LockLost, match="lost for a test") as raised:
            async with lock:
                asyncio.get_running_loop().call_later(1.0, lose, lock, "lost for a test")
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    reached.append("cancelled")
                    raise
        assert reached == ["cancelled"]
        assert isinstance(raised.value.__cause__, asyncio.CancelledError)
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]  # our cancel taken back
        assert lock.statistics().phase == "lost"
        assert not lock.statistics().watched
        assert not cluster_of(lock).bound
        assert not cluster_of(lock).held
        assert all(answer.seen[-1] == "release" for answer in answers)
        await cluster_of(lock).watchdog.aclose()

    virtual(test)


def test_the_callers_own_cancellation_is_not_turned_into_lock_lost() -> None:
    async def test() -> None:
        lock, _, answers = fake_lock()
        entered = asyncio.Event()

        async def body(lock: Lock) -> None:
            async with lock:
                entered.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(body(lock))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert lock.statistics().phase == "idle"  # released on the way out
        assert all(answer.seen == ["acquire", "release"] for answer in answers)
        await cluster_of(lock).watchdog.aclose()

    virtual(test)


def test_a_body_that_swallows_the_cancel_of_a_loss_still_comes_out_as_lock_lost() -> None:
    async def test() -> None:
        lock, _, _ = fake_lock()
        with pytest.raises(LockLost, match="lost under a stubborn body"):
            async with lock:
                asyncio.get_running_loop().call_later(1.0, lose, lock, "lost under a stubborn body")
                with contextlib.suppress(asyncio.CancelledError):  # returns normally: not under the lock throughout
                    await asyncio.sleep(60)
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await cluster_of(lock).watchdog.aclose()

    virtual(test)


def test_a_nested_acquire_by_the_same_task_fails_at_once_and_another_task_waits() -> None:
    async def test() -> None:
        lock, _, _ = fake_lock()
        again = Lock(cluster_of(lock), "r", cluster_of(lock).settings)
        async with lock:
            with pytest.raises(NestedAcquire, match="already holds lock 'r'"):
                await again.acquire()
            other = Lock(cluster_of(lock), "r", cluster_of(lock).settings)
            # Another task asks the nodes (these fakes keep no keys, and grant it): no NestedAcquire.
            assert await asyncio.create_task(other.acquire(blocking=False))
            await other.release()
        assert not cluster_of(lock).bound  # unbound when the lease ended
        await cluster_of(lock).watchdog.aclose()

    virtual(test)
