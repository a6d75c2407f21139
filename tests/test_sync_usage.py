"""The blocking API as workers use it: a forked child, the decorator, at most once per period (both APIs)."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import warnings
from collections.abc import Iterator
from multiprocessing.queues import Queue
from typing import Any

import pytest

from redlock_async import LockNotAcquired
from redlock_async import Redlock as AsyncRedlock
from redlock_async.sync import Lock, Redlock
from tests.conftest import Cluster, keys_everywhere, keys_on
from tests.threads import held_elsewhere

LOOP_THREAD = "redlock-sync-loop"


@pytest.fixture
def sync_redlock(cluster: Cluster) -> Iterator[Redlock]:
    with Redlock(cluster.urls, ttl=1.0) as redlock:
        yield redlock
    assert [t for t in threading.enumerate() if t.name == LOOP_THREAD] == []


# -- fork -------------------------------------------------------------------------------------------


def _child(redlock: Redlock, shared: Lock, parent_lock: Lock, held_by_parent: str, results: Queue[Any]) -> None:
    try:
        threads_at_start = sorted(t.name for t in threading.enumerate())
        with shared:  # made and used by the parent before the fork
            inside = shared.held
        refused = not redlock.lock(held_by_parent).acquire(blocking=False)  # the parent is another client
        # The parent's Lock object, held there at the fork, is not held here, and takes nothing here.
        refused = refused and not parent_lock.held and not parent_lock.acquire(blocking=False)
        with redlock.lock("fork:child", ttl=0.5) as own:
            time.sleep(1.0)  # the child's own watchdog keeps it
            kept = own.held
        threads = sorted(t.name for t in threading.enumerate())
        redlock.close()
        results.put((threads_at_start, inside, refused, kept, threads, os.getpid()))
    except BaseException as exc:
        results.put(repr(exc))


def test_a_forked_child_uses_its_own_loop_and_the_parent_goes_on(sync_redlock: Redlock, cluster: Cluster) -> None:
    shared = sync_redlock.lock("fork:shared")
    with shared:
        pass  # the parent's loop thread runs, and its connections are open
    parent_lock = sync_redlock.lock("fork:parent")
    assert parent_lock.acquire()
    context = multiprocessing.get_context("fork")
    results: Queue[Any] = context.Queue()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() of a process with threads
        child = context.Process(target=_child, args=(sync_redlock, shared, parent_lock, "fork:parent", results))
        child.start()
    result = results.get(timeout=30)
    child.join(timeout=30)
    assert not isinstance(result, str), result
    threads_at_start, inside, refused, kept, threads, pid = result
    assert pid != os.getpid()
    assert LOOP_THREAD not in threads_at_start  # the parent's thread is not in the child...
    assert threads.count(LOOP_THREAD) == 1  # ...which started its own
    assert inside
    assert refused
    assert kept
    assert child.exitcode == 0
    # The parent's connections and loop were not touched by the child.
    assert parent_lock.held
    parent_lock.release()
    for _ in range(20):
        with shared:
            assert shared.held
    assert keys_everywhere(cluster) == [[]] * len(cluster)


# -- the decorator ------------------------------------------------------------------------------------


def test_synchronized_names_the_lock_from_the_arguments(sync_redlock: Redlock) -> None:
    seen: list[str | None] = []

    @sync_redlock.synchronized("report:{customer_id}:{kind}")
    def report(customer_id: int, kind: str = "daily") -> str:
        seen.append(sync_redlock.inspect(f"report:{customer_id}:{kind}").state)
        return f"report {customer_id}"

    assert report(7) == "report 7"
    assert report(customer_id=8, kind="weekly") == "report 8"
    assert seen == ["held", "held"]
    assert report.__name__ == "report"


def test_synchronized_skip_runs_the_body_once_among_concurrent_calls(sync_redlock: Redlock) -> None:
    ran: list[int] = []
    skipped: list[int] = []
    all_skipped = threading.Event()  # the body holds the lock until the other three callers were turned away

    @sync_redlock.synchronized("job:{job}", blocking=False, on_busy="skip")
    def job(job: int, caller: int) -> int:
        ran.append(caller)
        assert all_skipped.wait(30)
        return caller

    results: list[int | None] = [None] * 4

    def call(caller: int) -> None:
        results[caller] = job(1, caller)
        if results[caller] is None:
            skipped.append(caller)
            if len(skipped) == 3:
                all_skipped.set()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ran) == 1
    assert [r for r in results if r is not None] == ran
    assert sorted(skipped + ran) == [0, 1, 2, 3]


def test_synchronized_raise_and_bad_templates(sync_redlock: Redlock) -> None:
    @sync_redlock.synchronized("busy", blocking=False)
    def busy() -> None:
        raise AssertionError("must not run")

    with held_elsewhere(sync_redlock.lock("busy")), pytest.raises(LockNotAcquired):
        busy()  # held by another thread: busy (in this thread it would be nested: test_sync_nested.py)
    with pytest.raises(ValueError, match="does not take"):

        @sync_redlock.synchronized("x:{missing}")
        def f(present: int) -> None: ...

    with pytest.raises(ValueError, match="on_busy"):
        sync_redlock.synchronized("x", on_busy="wait")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="async function"):

        @sync_redlock.synchronized("x")
        async def g() -> None: ...

    # A LockNotAcquired raised by the body is the body's, even with on_busy="skip".
    @sync_redlock.synchronized("outer", on_busy="skip")
    def nested() -> None:
        with sync_redlock.lock("busy", acquire_timeout=0.0):
            pass

    with held_elsewhere(sync_redlock.lock("busy")), pytest.raises(LockNotAcquired):
        nested()


async def test_async_synchronized(cluster: Cluster) -> None:
    async with AsyncRedlock(cluster.urls) as redlock:

        @redlock.synchronized("order:{order.id}", blocking=False, on_busy="skip")
        async def handle(order: Any) -> str:
            return f"handled {order.id}"

        class Order:
            id = 42

        assert await handle(Order()) == "handled 42"
        async with redlock.lock("order:42"):
            assert await handle(Order()) is None
        with pytest.raises(TypeError, match="not an async function"):
            redlock.synchronized("x")(lambda: None)  # type: ignore[arg-type,return-value]


# -- at most once per period --------------------------------------------------------------------------


def test_cooldown_keeps_the_key_after_the_body(sync_redlock: Redlock, cluster: Cluster) -> None:
    lock = sync_redlock.lock("nightly", cooldown=1.5)
    rival = sync_redlock.lock("nightly")
    with lock:
        pass
    released_at = time.monotonic()
    pttls = [keys_on(cluster[i], "redlock:nightly")[1] for i in range(len(cluster))]
    assert all(1000 < pttl <= 1500 for pttl in pttls), pttls  # ~1500: reset at release, read a moment later
    assert not rival.acquire(blocking=False)
    assert sync_redlock.inspect("nightly").state == "held"
    while time.monotonic() - released_at < 1.6:
        time.sleep(0.05)
    assert rival.acquire(blocking=False)  # the period is over
    rival.release()


def test_cooldown_once_per_period_with_the_decorator(sync_redlock: Redlock) -> None:
    runs: list[int] = []

    @sync_redlock.synchronized("digest", blocking=False, on_busy="skip", cooldown=60.0)
    def digest(n: int) -> None:
        runs.append(n)

    for n in range(3):
        digest(n)
    assert runs == [0]


async def test_cooldown_on_the_async_api(cluster: Cluster) -> None:
    async with AsyncRedlock(cluster.urls, ttl=1.0) as redlock:
        lock = redlock.lock("hourly", cooldown=2.0)
        async with lock:
            pass
        assert not lock.held
        pttls = [keys_on(cluster[i], "redlock:hourly")[1] for i in range(len(cluster))]
        assert all(1500 < pttl <= 2000 for pttl in pttls), pttls  # not the 1 s ttl: the cooldown
        assert not await redlock.lock("hourly").acquire(blocking=False)
        assert await lock.acquire(blocking=False) is False  # the same lock too: the key is kept, not ours
        # A lock lost before its release says so, rather than start a cooldown it cannot keep.
        lost = redlock.lock("lost-cooldown", cooldown=2.0)
        assert await lost.acquire()
        cluster.flush()
        from redlock_async import LockLost

        with pytest.raises(LockLost):
            await lost.release()
        with pytest.raises(ValueError, match="cooldown"):
            redlock.lock("x", cooldown=0.01)


# -- the plain-threads example --------------------------------------------------------------------------


def test_threads_example_loses_no_increment() -> None:
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "threads.py"
    assert example.name == "threads.py"
    result = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=120, check=True)
    assert "counter = 40 (expected 40)" in result.stdout
