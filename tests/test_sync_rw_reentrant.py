"""The blocking API's read/write writer ``downgrade()`` and ``lock(name, reentrant=True)`` on real nodes:
the downgrade leaves no gap and no key behind; the same thread enters a reentrant lock again at once, the
key goes at the outermost exit, and other threads wait."""

from __future__ import annotations

import multiprocessing
import threading
import time
import warnings
from multiprocessing.queues import Queue
from typing import Any

import pytest

from redlock_async import NestedAcquire
from redlock_async.sync import Redlock, ReentrantLock, WriteLock

from .conftest import Cluster, holders, keys_everywhere
from .threads import elsewhere

W = b"redlock:\x00rw\x00doc"


def settled(cluster: Cluster, within: float = 1.0) -> list[list[bytes]]:
    """The nodes' lock keys (fencing counters aside, which outlive their locks) once none is left (or what
    is left after *within* seconds)."""
    stop = time.monotonic() + within
    while True:
        keys = [[key for key in node if not key.startswith(b"redlock-fence:")] for node in keys_everywhere(cluster)]
        if not any(keys) or time.monotonic() > stop:
            return keys
        time.sleep(0.01)


# -- downgrade -------------------------------------------------------------------------------------------


def test_a_blocking_writer_downgrades_without_a_gap(cluster: Cluster) -> None:
    with Redlock(cluster.urls) as redlock, Redlock(cluster.urls) as other:
        rw = redlock.rw_lock("doc", fencing=True)
        writer = rw.write()
        assert isinstance(writer, WriteLock)
        with writer:
            token = writer.fencing_token
            assert token is not None
            with writer.downgrade() as reader:
                assert not writer.held
                assert reader.held
                assert reader.fencing_token == token  # the last writer's: its own
                assert all(W not in keys for keys in keys_everywhere(cluster))
                beside = other.rw_lock("doc").read()
                assert beside.acquire(blocking=False)  # readers join at once
                beside.release()
                assert not other.rw_lock("doc").write().acquire(blocking=False)  # no writer comes between
            assert not reader.held
        assert not writer.held  # leaving the writer's block after the downgrade releases nothing more
    assert settled(cluster) == [[]] * len(cluster)


def test_the_downgrade_is_the_readers_first_acquire_whatever_its_timeout(cluster: Cluster) -> None:
    with Redlock(cluster.urls) as redlock, Redlock(cluster.urls) as other:
        rw = redlock.rw_lock("doc")
        writer = rw.write()
        assert writer.acquire(blocking=False)
        reader = writer.downgrade()
        assert reader.acquire(blocking=False)  # a step, never a wait for the writer (its own)
        assert not writer.held
        beside = other.rw_lock("doc").read()
        assert beside.acquire(blocking=False)
        beside.release()
        writer.release()  # already released by the downgrade: nothing more, no error
        reader.release()
        # Its later acquires are a plain reader's: it waits for another writer like any reader.
        with other.rw_lock("doc").write():
            assert not reader.acquire(timeout=0.2)
    assert settled(cluster) == [[]] * len(cluster)


def test_a_downgrade_of_a_writer_not_held_says_so(cluster: Cluster) -> None:
    with Redlock(cluster.urls) as redlock:
        writer = redlock.rw_lock("doc").write()
        with pytest.raises(RuntimeError, match="not held"):
            writer.downgrade()
        with writer:
            pass
        with pytest.raises(RuntimeError, match="not held"):
            writer.downgrade()


def test_a_downgraded_writer_excludes_writers_of_other_threads_until_the_reader_leaves(cluster: Cluster) -> None:
    with Redlock(cluster.urls, retry_delay=0.02) as redlock:
        rw = redlock.rw_lock("doc", ttl=5.0)
        order: list[str] = []
        entered = threading.Event()

        def write_after() -> None:
            entered.wait(10)
            with rw.write():
                order.append("writer")

        thread = threading.Thread(target=write_after)
        thread.start()
        with rw.write() as writer:
            order.append("wrote")
            with writer.downgrade():
                entered.set()
                time.sleep(0.3)
                order.append("read")
        thread.join(10)
        assert order == ["wrote", "read", "writer"]
    assert settled(cluster) == [[]] * len(cluster)


# -- reentrancy --------------------------------------------------------------------------------------------


def test_the_same_thread_enters_again_at_once_and_the_key_goes_at_the_outermost_exit(cluster: Cluster) -> None:
    with Redlock(cluster.urls) as redlock:
        outer = redlock.lock("job", reentrant=True, acquire_timeout=5.0)
        assert isinstance(outer, ReentrantLock)
        with outer:
            token = outer.token
            began = time.monotonic()
            with redlock.lock(b"job", reentrant=True) as inner:  # another lock of the name (bytes: the same)
                with outer:  # the same lock again
                    assert time.monotonic() - began < 0.1  # nothing waited for
                    assert inner.held
                    assert inner.token == token  # it shows the hold it joined
                    assert outer.depth == 2
                assert outer.held
            assert not inner.held
            assert inner.token is None
            assert outer.depth == 0
            assert len(holders(cluster, "job")) == len(cluster)  # the outer block runs on
        assert not outer.held
    assert settled(cluster) == [[]] * len(cluster)


def test_acquire_and_release_join_as_with_does(cluster: Cluster) -> None:
    with Redlock(cluster.urls) as redlock:
        outer = redlock.lock("job", reentrant=True)
        with outer:
            inner = redlock.lock("job", reentrant=True)
            assert inner.acquire(blocking=False)
            assert inner.acquire(timeout=1.0)  # again, on the same lock
            inner.release()
            assert inner.held  # one join still open
            inner.release()
            assert not inner.held
            with pytest.raises(RuntimeError, match="not held"):
                inner.release()
            assert outer.held
        again = redlock.lock("job", reentrant=True)
        assert again.acquire(blocking=False)
        joined = redlock.lock("job", reentrant=True)
        assert joined.acquire(blocking=False)
        with pytest.raises(RuntimeError, match="nested entries of this thread are still joined"):
            again.release()  # the outer one first: refused, the key stays
        assert again.held
        joined.release()
        again.release()
    assert settled(cluster) == [[]] * len(cluster)


def test_other_threads_wait(cluster: Cluster) -> None:
    with Redlock(cluster.urls, retry_delay=0.02) as redlock:
        results: list[bool] = []
        with redlock.lock("job", reentrant=True):

            def other() -> None:
                results.append(redlock.lock("job", reentrant=True).acquire(timeout=0.3))

            began = time.monotonic()
            thread = threading.Thread(target=other)
            thread.start()
            thread.join(10)
            assert results == [False]  # another thread is another holder: it waited, in vain
            assert time.monotonic() - began >= 0.3
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
        assert results == [False, True]  # free now; its hold is that thread's (released with the Redlock)


def test_a_hold_that_ran_out_is_not_joined(cluster: Cluster) -> None:
    with Redlock(cluster.urls) as redlock:
        outer = redlock.lock("job", reentrant=True, ttl=0.5, auto_extend=False)
        with outer:
            with redlock.lock("job", reentrant=True) as inner:
                time.sleep(0.7)  # the lease runs out (no watchdog)
                assert not inner.held
            late = redlock.lock("job", reentrant=True)
            # Not a join of the hold that ran out: a lock of its own, which this thread's open block (never
            # told a loss without a watchdog) still holds, as a task's does in the async API.
            with pytest.raises(NestedAcquire, match="this thread"):
                late.acquire(blocking=False)
            assert late.depth == 0
            assert not late.held
            assert not outer.held
            assert elsewhere(lambda: late.acquire(blocking=False))  # another thread takes the expired key
            late.release()
    assert settled(cluster) == [[]] * len(cluster)


def test_reentrant_must_be_a_bool(cluster: Cluster) -> None:
    with Redlock(cluster.urls) as redlock, pytest.raises(TypeError, match="reentrant must be True or False"):
        redlock.lock("job", reentrant=1)  # type: ignore[call-overload]


def _forked(redlock: Redlock, outer: ReentrantLock, results: Queue[Any]) -> None:
    try:
        # The thread that forked is this child's main thread, the same Thread object: the parent's hold of
        # "job" is recorded under it, and still must not be joined here (the parent holds it, not the child).
        other = redlock.lock("job", reentrant=True)
        refused = not other.acquire(blocking=False) and not outer.acquire(blocking=False)
        results.put((refused, outer.held, other.depth))
        redlock.close()
    except BaseException as exc:
        results.put(repr(exc))


def test_a_forked_child_never_joins_the_parents_hold(cluster: Cluster) -> None:
    with Redlock(cluster.urls) as redlock:
        outer = redlock.lock("job", reentrant=True)
        with outer:
            context = multiprocessing.get_context("fork")
            results: Queue[Any] = context.Queue()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() of a process with threads
                child = context.Process(target=_forked, args=(redlock, outer, results))
                child.start()
            result = results.get(timeout=30)
            child.join(timeout=30)
            assert result == (True, False, 0)
            assert outer.held
            assert outer.depth == 0
