"""The watchdog: leases kept for as long as the body runs, the body cancelled the moment one is lost."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from redlock_async import LockLost, Redlock
from redlock_async._core._algorithm import Vote
from redlock_async.testing import lose

from .conftest import Cluster, MakeRedlock, assert_no_library_tasks

KEY = "redlock:{}"


def watchdog_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "redlock-watchdog" and not t.done()]


def assert_clean_task() -> None:
    """No cancellation of ours is left on the running task, counted or pending."""
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    assert watchdog_tasks() == []


@pytest.mark.serial
@pytest.mark.slow
async def test_lease_is_kept_for_many_ttls_and_others_never_get_it(make_redlock: MakeRedlock) -> None:
    holder, prober = await make_redlock(), await make_redlock()
    lock = holder.lock("kept", ttl=0.5)
    probes = granted = 0
    async with lock:
        assert watchdog_tasks() != []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            other = prober.lock("kept", ttl=0.5)
            probes += 1
            if await other.acquire(blocking=False):
                granted += 1
                await other.release()
            assert lock.held
            await asyncio.sleep(0.02)
        assert lock.statistics().extensions >= 5  # 3 s of a 0.5 s lease
    assert probes > 50
    assert granted == 0
    assert_clean_task()


async def test_majority_stopped_inside_the_block_raises_lock_lost_within_the_ttl(faulty: Cluster) -> None:
    async with Redlock(faulty.urls) as redlock:
        lock = redlock.lock("stopped", ttl=0.6)
        reached = False
        with pytest.raises(LockLost) as caught:
            async with lock:
                # Stop mid-lease (not at once): loss can only be known when validity ends,
                # which is the ttl minus drift after the acquire: leave the test a margin.
                await asyncio.sleep(0.2)
                for i in (0, 1, 2):
                    faulty[i].pause()
                stopped_at = time.monotonic()
                await asyncio.sleep(5)
                reached = True
        lost_after = time.monotonic() - stopped_at
        assert not reached
        assert lost_after < 0.6
        assert caught.value.name == "stopped"
        assert [o.vote for o in caught.value.outcomes].count(Vote.TIMEOUT) >= 3
        assert not lock.held
        assert_clean_task()
        for i in (0, 1, 2):
            faulty[i].resume()


async def test_keys_taken_away_is_a_loss_before_validity_ends(cluster: Cluster, redlock: Redlock) -> None:
    lock = redlock.lock("taken", ttl=1.0)
    with pytest.raises(LockLost, match="gone from a majority"):
        async with lock:
            for i in range(3):
                cluster[i].command("SET", KEY.format("taken"), "intruder")
            await asyncio.sleep(3)
    # A majority answered "not yours": lost at the first extension, not at expiry.
    assert [o.vote for o in lock.outcomes].count(Vote.NO) >= 3
    assert [cluster[i].command("GET", KEY.format("taken")) for i in range(5)] == [b"intruder"] * 3 + [None] * 2
    assert_clean_task()


async def test_event_loop_stall_past_validity_is_a_loss_not_an_extension(make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(node_timeout=0.02)
    lock = redlock.lock("stall", ttl=0.3)
    with pytest.raises(LockLost, match=r"expired|ran out"):
        async with lock:
            time.sleep(0.4)  # blocks the loop: the watchdog cannot run
            await asyncio.sleep(0.5)  # its next chance: it must see the lease has run out
    assert lock.statistics().extensions == 0
    assert_clean_task()


async def test_stall_until_the_body_returns_is_reported_on_exit(redlock: Redlock) -> None:
    lock = redlock.lock("stall-exit", ttl=0.5, max_hold=10)
    with pytest.raises(LockLost, match="ran out while the body ran"):
        async with lock:
            time.sleep(0.55)
    assert_clean_task()


@pytest.mark.slow
@pytest.mark.serial
async def test_max_hold_ends_the_lock(redlock: Redlock) -> None:
    lock = redlock.lock("hold-limit", ttl=0.5, max_hold=1.2)
    started = time.monotonic()
    with pytest.raises(LockLost, match="hold limit"):
        async with lock:
            await asyncio.sleep(10)
    assert 1.1 < time.monotonic() - started < 2.0
    assert_clean_task()


@pytest.mark.serial
async def test_max_extensions_ends_the_lock(redlock: Redlock) -> None:
    lock = redlock.lock("extension-limit", ttl=0.5, max_extensions=2)
    with pytest.raises(LockLost, match="hold limit"):
        async with lock:
            await asyncio.sleep(10)
    assert lock.statistics().extensions == 2


async def test_on_lost_tells_instead_of_cancelling(cluster: Cluster, redlock: Redlock) -> None:
    told: list[LockLost] = []
    lock = redlock.lock("told", ttl=0.5, on_lost=told.append)
    finished = False
    async with lock:
        cluster.flush()
        for _ in range(100):
            if told:
                break
            await asyncio.sleep(0.02)
        finished = True
    assert finished
    assert len(told) == 1
    assert told[0].name == "told"
    assert not lock.held
    assert_clean_task()


async def test_callers_timeout_is_a_timeout_not_a_loss(cluster: Cluster, redlock: Redlock) -> None:
    lock = redlock.lock("caller-timeout", ttl=0.5)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.8), lock:
            await asyncio.sleep(5)
    assert [cluster[i].command("GET", KEY.format("caller-timeout")) for i in range(5)] == [None] * 5
    assert_clean_task()


async def test_callers_cancellation_passes_through(redlock: Redlock) -> None:
    lock = redlock.lock("caller-cancel", ttl=0.5)
    inside = asyncio.Event()

    async def body() -> None:
        async with lock:
            inside.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(body())
    await inside.wait()
    await asyncio.sleep(0.5)  # a few extensions
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not lock.held
    assert watchdog_tasks() == []


async def test_body_exception_is_not_wrapped(redlock: Redlock) -> None:
    lock = redlock.lock("plain-error", ttl=0.5)
    with pytest.raises(ValueError, match=r"^mine$") as caught:
        async with lock:
            await asyncio.sleep(0.4)
            raise ValueError("mine")
    assert type(caught.value) is ValueError
    assert_clean_task()


async def test_no_watchdog_task_outlives_the_block(make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    for n in range(5):
        async with redlock.lock(f"many-{n}", ttl=0.5):
            await asyncio.sleep(0.01)
        assert watchdog_tasks() == []
    async with redlock.lock("a", ttl=0.5), redlock.lock("b", ttl=0.5):
        assert len(watchdog_tasks()) == 1  # one watchdog for every lock of a Redlock
    assert watchdog_tasks() == []


async def test_auto_extend_off_lets_the_lease_run_out(redlock: Redlock) -> None:
    lock = redlock.lock("manual", ttl=0.5, auto_extend=False)
    async with lock:
        assert watchdog_tasks() == []
        await lock.extend(1.0)  # explicit extends still work inside
        assert lock.validity > 0.9


@pytest.mark.parametrize("when", ["at-last-await", "after-last-await-resolved", "swallowed-by-body"])
async def test_loss_just_as_the_body_returns(redlock: Redlock, when: str) -> None:
    """The cancel lands at the body's last await, or while its result is on its way, or is swallowed.

    Each way, the block raises LockLost (the body did not run under the lock
    to its end), and no cancellation is left behind for the caller: on 3.11
    and 3.12 a cancel requested but not yet delivered cannot be withdrawn.
    """
    loop = asyncio.get_running_loop()
    lock = redlock.lock(f"edge-{when}", ttl=1.0)
    with pytest.raises(LockLost):
        async with lock:
            last: asyncio.Future[None] = loop.create_future()
            if when == "at-last-await":
                loop.call_soon(lose, lock, "lost at the last await")
            else:
                # The awaited result is set first, then the loss: the task is
                # already scheduled to resume, so the cancel is pending (3.11).
                loop.call_soon(last.set_result, None)
                loop.call_soon(lose, lock, "lost as the body returns")
            if when == "swallowed-by-body":
                with contextlib.suppress(asyncio.CancelledError):
                    await last
            else:
                await (last if when != "at-last-await" else asyncio.sleep(1))
    await asyncio.sleep(0)  # a leftover pending cancel would be raised here
    assert_clean_task()


# -- memory, closing, and a loss seen from extend() ---------------------------------------------


async def test_released_locks_are_not_kept_alive_while_another_lock_is_watched(redlock: Redlock) -> None:
    """The watchdog's heap held every released lock until its old due time (ttl 60: RSS grew per lock)."""
    import gc
    import weakref

    async with redlock.lock("kept", ttl=60.0):
        refs = []
        for n in range(400):
            lock = redlock.lock(f"released-{n}", ttl=60.0)
            async with lock:
                pass
            refs.append(weakref.ref(lock))
        del lock
        gc.collect()
        alive = sum(ref() is not None for ref in refs)
        assert alive < 100  # bounded by the heap's compaction (2 x watched + 64), not all 400


async def test_closing_the_redlock_releases_held_locks_and_cancels_their_bodies(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    redlock = Redlock(cluster.urls)
    await redlock.connect()
    entered = asyncio.Event()

    async def body() -> None:
        async with redlock.lock("closing", ttl=30.0):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    plain = redlock.lock("closing-plain", ttl=30.0)
    assert await plain.acquire(blocking=False)
    await entered.wait()
    await redlock.aclose()
    with pytest.raises(LockLost, match="its Redlock was closed while it was held"):
        await task
    with pytest.raises(LockLost, match="its Redlock was closed"):
        await plain.extend()
    assert cluster[0].command("EXISTS", "redlock:closing", "redlock:closing-plain") == 0  # released, not left
    warnings = [r.getMessage() for r in caplog.records if "closed while 2 locks were held" in r.getMessage()]
    assert len(warnings) == 1
    assert "'closing'" in warnings[0]
    assert "'closing-plain'" in warnings[0]
    assert_no_library_tasks()


async def test_extend_after_the_watchdog_declared_the_loss_raises(redlock: Redlock) -> None:
    """extend() awaiting its ballot while the watchdog declares the lock lost must not return normally,
    even when the nodes then confirm the extension."""
    lock = redlock.lock("both", ttl=1.0, on_lost=lambda _: None)  # told, not cancelled
    async with lock:
        extending = asyncio.create_task(lock.extend())
        await asyncio.sleep(0)  # its EXTENDs are out, its ballot awaited
        lose(lock, "declared lost by the watchdog meanwhile")  # what a failed round does
        with pytest.raises(LockLost, match="declared lost by the watchdog meanwhile"):
            await extending
        assert not lock.held
