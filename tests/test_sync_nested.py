"""Nested acquires in the blocking API: a thread asking for what it already holds fails at once.

Before, the blocking API ran each acquire as a new task on its background loop, so the async side's
"this task holds it" never matched: a nested ``with`` of a name the thread held waited out its acquire
timeout and then said LockNotAcquired (a nested ``campaign()``, with no timeout, waited for ever), and
the same Lock entered again said a plain RuntimeError. Nesting there is by thread: another thread
waits as any other client, as another task does in asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from redlock_async import LockLost, NestedAcquire
from redlock_async.sync import Redlock
from redlock_async.testing._inside import loop_of

from .conftest import Cluster, keys_everywhere
from .threads import elsewhere, held_elsewhere

LONG = 30.0  # an acquire timeout no test waits out: a nested acquire that waited would break the AT_ONCE bound
AT_ONCE = 5.0  # the bound a refusal must come within (it comes before any node is asked)


@pytest.fixture
def redlock(cluster: Cluster) -> Iterator[Redlock]:
    with Redlock(cluster.urls, ttl=2.0, acquire_timeout=LONG) as redlock:
        yield redlock


@contextlib.contextmanager
def refused(what: str) -> Iterator[None]:
    """The block raises NestedAcquire, within AT_ONCE, saying what this thread holds and why it fails."""
    began = time.monotonic()
    with pytest.raises(NestedAcquire) as caught:
        yield
    assert time.monotonic() - began < AT_ONCE, "waited for itself"
    text = str(caught.value)
    assert what in text, text
    name = threading.current_thread().name
    for words in (f"this thread ({name}) already holds", "would wait for itself", "reentrant=True", "`with`"):
        assert words in text, text
    assert caught.value.outcomes == ()  # no node was asked


def nothing_left(cluster: Cluster, within: float = 2.0) -> bool:
    """No lock key on any node within a moment (a node whose yes came after the grant was decided has its
    release queued); fencing counters and a semaphore's limit key (which outlives its permits by a ttl) aside."""
    stop = time.monotonic() + within
    while True:
        keys = [
            [key for key in node if not key.startswith(b"redlock-fence:") and not key.endswith(b"\x00limit")]
            for node in keys_everywhere(cluster)
        ]
        if not any(keys):
            return True
        if time.monotonic() > stop:
            print("keys left:", keys)
            return False
        time.sleep(0.01)


def test_the_same_lock_entered_again_in_its_thread(redlock: Redlock, cluster: Cluster) -> None:
    """Every way in (``with``, ``acquire()``, ``blocking=False``, a ``timeout=``): NestedAcquire, and the
    outer hold is untouched (before, a refused ``acquire(timeout=)`` left ``held`` reading False)."""
    lock = redlock.lock("again")
    with lock:
        token = lock.token
        for attempt in (
            lock.__enter__,
            lock.acquire,
            lambda: lock.acquire(blocking=False),
            lambda: lock.acquire(timeout=0.5),
            lambda: lock.acquire(timeout=LONG),
        ):
            with refused("lock 'again'"):
                attempt()
            assert lock.held
            assert lock.validity > 0
            assert lock.token == token
        lock.check()
    assert not lock.held
    assert nothing_left(cluster)
    assert lock.acquire()  # acquire() holds for its thread as `with` does, until release()
    with refused("lock 'again'"):
        lock.acquire()
    lock.release()
    assert nothing_left(cluster)


def test_another_lock_of_the_name_in_the_same_thread(redlock: Redlock, cluster: Cluster) -> None:
    outer, inner = redlock.lock("name"), redlock.lock("name")
    with outer:
        for attempt in (
            inner.__enter__,
            inner.acquire,
            lambda: inner.acquire(blocking=False),
            lambda: inner.acquire(timeout=LONG),
            lambda: redlock.lock("name", reentrant=True).acquire(),  # a reentrant lock joins reentrant holds only
        ):
            with refused("lock 'name'"):
                attempt()
            assert outer.held
            assert not inner.held
        assert inner.outcomes == ()
    assert nothing_left(cluster)
    with inner:  # released: taken again at once
        pass
    assert outer.acquire()
    with refused("lock 'name'"):
        inner.acquire(timeout=LONG)
    outer.release()
    with redlock.lock("name", reentrant=True) as reentrant:
        with redlock.lock("name", reentrant=True) as joined:  # reentrant in reentrant: joins, by design
            assert joined.depth == 1
        with refused("lock 'name'"):
            inner.acquire()  # a plain lock inside a reentrant hold
        assert reentrant.held
    assert nothing_left(cluster)


def test_lock_many_and_a_semaphore_over_its_permits(redlock: Redlock, cluster: Cluster) -> None:
    with redlock.lock("b"), refused("lock 'b'"):
        redlock.lock_many(["a", "b", "c"]).acquire(timeout=LONG)
    with redlock.lock_many(["a", "b"]), refused("lock 'a'"):
        redlock.lock("a").acquire(timeout=LONG)
    permits = [redlock.semaphore("pool", limit=2) for _ in range(3)]
    with permits[0]:
        with permits[1]:  # a permit left: not nested, taken
            assert permits[1].held
            with refused("every permit (2 of limit 2) of semaphore 'pool'"):
                permits[2].acquire(timeout=LONG)
        with permits[2]:
            pass
    assert nothing_left(cluster)


def test_the_read_write_lock_faces(redlock: Redlock, cluster: Cluster) -> None:
    rw = redlock.rw_lock("doc")
    words = "read/write lock 'doc'"
    with rw.write():
        for face in (rw.read, rw.write):
            with refused(words):
                face().acquire(timeout=LONG)
    beside = rw.read()
    with rw.read():
        for face in (rw.read, rw.write):  # a second read of the same thread too, as a task's in asyncio
            with refused(words):
                face().acquire(timeout=LONG)
        assert elsewhere(lambda: beside.acquire(blocking=False))  # another thread's reader shares it
        assert not elsewhere(lambda: rw.write().acquire(blocking=False))  # (a writer of its own waits)
    beside.release()
    with rw.write() as writer, writer.downgrade() as reader:  # no nested acquire: the writer turns into it
        assert reader.held
    assert nothing_left(cluster)


def test_synchronized_calling_itself(redlock: Redlock, cluster: Cluster) -> None:
    """Recursion under ``@synchronized``: "raise" raises NestedAcquire, "skip" skips the inner call at once."""
    calls: list[int] = []

    @redlock.synchronized("tree:{depth}", timeout=LONG)
    def raises(depth: int) -> None:
        raises(depth)

    @redlock.synchronized("tree:{depth}", timeout=LONG, on_busy="skip")
    def skips(depth: int, inner: int) -> str | None:
        calls.append(inner)
        return skips(depth, inner + 1) if inner == 0 else "inner ran"

    with refused("lock 'tree:2'"):
        raises(2)
    began = time.monotonic()
    assert skips(1, 0) is None
    assert time.monotonic() - began < AT_ONCE
    assert calls == [0]

    @redlock.synchronized("job")
    def job() -> str:
        with redlock.lock("job"):  # a nested acquire from inside the decorated function
            return "ran"

    with refused("lock 'job'"):
        job()
    assert nothing_left(cluster)


def test_a_nested_campaign(redlock: Redlock) -> None:
    """Before, a nested campaign (no timeout by default) waited for itself for ever."""
    election = redlock.election("leader")
    with election.campaign() as term:
        for nested in (redlock.election("leader"), election):
            began = time.monotonic()
            with pytest.raises(NestedAcquire, match=r"this thread \(.*\) already leads election 'leader'"):
                nested.campaign(timeout=LONG).__enter__()
            assert time.monotonic() - began < AT_ONCE
        with refused("lock 'leader'"):
            redlock.lock("leader").acquire()
        assert election.leader().fencing_counter == term
    with election.campaign() as later:
        assert later > term


# -- other threads: another client, as another task is in asyncio ------------------------------------------


def test_another_thread_waits_for_the_holder(redlock: Redlock, cluster: Cluster) -> None:
    """Another thread's Lock of the name waits (contention, not nesting), and gets it at the release."""
    holder = redlock.lock("shared")
    order: list[str] = []
    waiting = threading.Event()

    def other() -> bool:
        waiting.set()
        with redlock.lock("shared"):
            order.append("other")
        return True

    with holder:
        thread = threading.Thread(target=lambda: order.append("ok" if other() else "no"))
        thread.start()
        waiting.wait(AT_ONCE)
        time.sleep(0.2)  # (the other thread waits in its acquire meanwhile: it gets the lock only after)
        order.append("holder")
    thread.join(LONG)
    assert order == ["holder", "other", "ok"]
    assert nothing_left(cluster)


def test_the_same_lock_object_from_another_thread(redlock: Redlock, cluster: Cluster) -> None:
    """A Lock serves one acquisition at a time: another thread using the same object gets a RuntimeError at
    once (as another task using the same async Lock does), never a NestedAcquire, never a second hold."""
    lock = redlock.lock("one-object")
    with lock:
        with pytest.raises(RuntimeError, match=r"held by another thread \(MainThread\)") as caught:
            elsewhere(lambda: lock.acquire(timeout=LONG))
        assert not isinstance(caught.value, NestedAcquire)
        assert lock.held
    # Being acquired (waiting for a third thread's hold): another thread's acquire of the object is refused
    # too, before it changes what the object shows (before, it started a second acquisition beside it).
    with held_elsewhere(redlock.lock("one-object")):
        waiter = threading.Thread(target=lambda: lock.acquire(timeout=LONG))
        waiter.start()
        stop = time.monotonic() + LONG
        while lock.statistics().phase != "acquiring" and time.monotonic() < stop:
            time.sleep(0.01)  # until the waiter's acquire runs (a busy machine may start it late)
        with pytest.raises(RuntimeError, match=r"being acquired by another thread"):
            lock.acquire(timeout=1.0)
    waiter.join(LONG)
    assert lock.held  # the waiter's acquisition, taken once the third thread let go
    lock.release()
    assert nothing_left(cluster)


# -- no false positive: released, lost, another Redlock ------------------------------------------------------


def test_a_hold_that_ended_no_longer_counts(cluster: Cluster) -> None:
    with Redlock(cluster.urls, ttl=0.6, acquire_timeout=LONG) as redlock:
        first, second = redlock.lock("ended"), redlock.lock("ended")
        assert first.acquire()
        first.release()
        with second:  # released: not nested
            pass
        lock = redlock.lock("lost")
        with pytest.raises(LockLost), lock:  # the loss is raised at the block's exit
            for i in range(len(cluster)):
                cluster[i].command("DEL", "redlock:lost")  # its next extension is refused everywhere
            assert lock.lost.wait(LONG)
            with redlock.lock("lost") as again:  # the thread no longer holds it: taken, not refused
                assert again.held
            with pytest.raises(RuntimeError, match="lost, not yet released") as caught:
                lock.acquire()  # the same object: its block is still open (one acquisition at a time)
            assert not isinstance(caught.value, NestedAcquire)
        with lock:  # left: usable again
            assert lock.held
    assert nothing_left(cluster)


def test_another_redlock_is_another_client(cluster: Cluster, redlock: Redlock) -> None:
    with Redlock(cluster.urls) as other, redlock.lock("two-clients"):
        assert not other.lock("two-clients").acquire(timeout=0.1)


def test_a_refused_acquire_leaves_the_object_free(redlock: Redlock) -> None:
    lock = redlock.lock("free")
    with redlock.lock("free"):
        with refused("lock 'free'"):
            lock.acquire()
        assert not elsewhere(lambda: lock.acquire(blocking=False))  # busy, not "being acquired by MainThread"
    assert lock.acquire(blocking=False)
    lock.release()


def test_on_uvloop(cluster: Cluster) -> None:
    """The background loop made under uvloop's policy: nesting is by thread there too."""
    uvloop = pytest.importorskip("uvloop")
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        with Redlock(cluster.urls, acquire_timeout=LONG) as redlock:
            lock = redlock.lock("uv")
            with lock:
                assert type(loop_of(redlock)).__module__.startswith("uvloop")
                with refused("lock 'uv'"):
                    redlock.lock("uv").acquire()
                assert not elsewhere(lambda: redlock.lock("uv").acquire(blocking=False))
    finally:
        asyncio.set_event_loop_policy(previous)
    assert nothing_left(cluster)
