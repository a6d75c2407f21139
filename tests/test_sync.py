"""The blocking API (redlock_async.sync) against real nodes: threads, the watchdog under blocking bodies, loss."""

from __future__ import annotations

import gc
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from redlock_async import LockLost, LockNotAcquired, NestedAcquire
from redlock_async.sync import Lock, Redlock
from redlock_async.testing import History
from tests.conftest import Cluster, client_connections, keys_everywhere
from tests.threads import elsewhere, held_elsewhere

LOOP_THREAD = "redlock-sync-loop"


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == LOOP_THREAD]


@pytest.fixture
def sync_redlock(cluster: Cluster) -> Iterator[Redlock]:
    with Redlock(cluster.urls, ttl=1.0) as redlock:
        yield redlock
    assert loop_threads() == []


def test_lock_acquire_release_and_state(sync_redlock: Redlock, cluster: Cluster) -> None:
    lock = sync_redlock.lock("orders:42", fencing=True)
    other = sync_redlock.lock("orders:42")
    with lock as entered:
        assert entered is lock
        assert lock.held
        assert 0.9 < lock.validity <= 1.0
        assert lock.token is not None
        assert lock.fencing_token is not None
        assert lock.name == "orders:42"
        assert lock.names == ("orders:42",)
        assert not elsewhere(lambda: other.acquire(blocking=False))  # another thread: contention, not nesting
        for timeout in (0.01, 0.02, 0.03, 0.04):  # a deadline's timeouts, each another value
            assert not elsewhere(lambda t=timeout: other.acquire(timeout=t))  # type: ignore[misc]
        lock.extend(2.0)
        assert lock.validity > 1.5
        lock.check()  # held: nothing to say
    assert not lock.held
    assert lock.token is None
    assert lock.validity == 0.0
    counter = [b"redlock-fence:orders:42", b"redlock-fence:orders:42\x00by"]  # the counter and its fencer stay
    assert keys_everywhere(cluster) == [counter] * len(cluster)
    assert other.acquire(blocking=False)
    with pytest.raises(NestedAcquire, match="already holds lock 'orders:42'"):
        other.acquire()
    other.release()
    with pytest.raises(RuntimeError, match="not held"):
        other.release()
    with pytest.raises(RuntimeError, match="not held"):
        other.check()


def test_with_raises_lock_not_acquired_when_held_elsewhere(sync_redlock: Redlock) -> None:
    with (
        held_elsewhere(sync_redlock.lock("busy")),
        pytest.raises(LockNotAcquired),
        sync_redlock.lock("busy", acquire_timeout=0.2),
    ):
        pass


def test_threads_contend_under_history(sync_redlock: Redlock) -> None:
    history = History()
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        lock = sync_redlock.lock("contended", acquire_timeout=30.0)
        try:
            for _ in range(5):
                with lock, history.section(f"thread-{index}", lock):
                    time.sleep(0.002)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(history.sections) == 40
    history.check()


def test_watchdog_keeps_the_lease_while_a_blocking_body_sleeps(cluster: Cluster) -> None:
    with Redlock(cluster.urls, ttl=0.5) as redlock:
        lock = redlock.lock("long")
        rival = redlock.lock("long")
        with lock:
            time.sleep(1.5)  # three ttls: only the watchdog on the loop thread keeps it
            assert lock.held
            assert not lock.lost.is_set()
            assert not elsewhere(lambda: rival.acquire(blocking=False))
            lock.check()
            assert lock.statistics().extensions >= 2
        assert keys_everywhere(cluster) == [[]] * len(cluster)


def test_loss_sets_the_event_check_raises_and_exit_raises(cluster: Cluster) -> None:
    with Redlock(cluster.urls, ttl=0.6) as redlock:
        lock = redlock.lock("lost")
        with pytest.raises(LockLost) as raised, lock:
            cluster.flush()  # the keys are gone: the watchdog's next extension is refused
            assert lock.lost.wait(timeout=5.0)
            assert not lock.held
            with pytest.raises(LockLost) as checked:
                lock.check()
        assert raised.value is checked.value
        assert "gone from a majority" in str(raised.value)
        # The next acquisition starts afresh.
        with lock:
            assert not lock.lost.is_set()


def test_release_after_loss_raises(cluster: Cluster) -> None:
    with Redlock(cluster.urls, ttl=0.6) as redlock:
        lock = redlock.lock("lost-release")
        assert lock.acquire()
        cluster.flush()
        assert lock.lost.wait(timeout=5.0)
        with pytest.raises(LockLost):
            lock.release()
        assert lock.acquire(blocking=False)
        lock.release()


def test_a_body_exception_is_not_masked_by_the_loss(cluster: Cluster) -> None:
    with Redlock(cluster.urls, ttl=0.6) as redlock:
        lock = redlock.lock("masked")
        with pytest.raises(ValueError, match="body"), lock:
            cluster.flush()
            assert lock.lost.wait(timeout=5.0)
            raise ValueError("body")


def test_interrupt_main_raises_lock_lost_in_a_sleeping_main_thread(cluster: Cluster) -> None:
    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGURG)
    with Redlock(cluster.urls, ttl=0.6) as redlock:
        lock = redlock.lock("interrupted", interrupt_main=True)
        started = time.monotonic()
        with pytest.raises(LockLost), lock:
            cluster.flush()
            time.sleep(30)  # interrupted at the loss (~0.4 s), not after 30 s
        assert time.monotonic() - started < 10
        assert lock.lost.is_set()
        # A lock kept to its end is not interrupted, and the handler is put back.
        with lock:
            time.sleep(0.1)
    assert signal.getsignal(signal.SIGURG) == before


def test_interrupt_main_is_refused_in_another_thread(sync_redlock: Redlock) -> None:
    lock = sync_redlock.lock("elsewhere", interrupt_main=True)
    raised: list[BaseException] = []

    def worker() -> None:
        try:
            lock.acquire()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert len(raised) == 1
    assert isinstance(raised[0], RuntimeError)
    assert "main thread" in str(raised[0])
    assert not lock.held
    assert sync_redlock.lock("elsewhere").acquire(blocking=False)  # released when refused


def test_ctrl_c_during_a_blocking_acquire_leaves_nothing(sync_redlock: Redlock, cluster: Cluster) -> None:
    holder = sync_redlock.lock("waited")
    waiter = sync_redlock.lock("waited", acquire_timeout=30.0)
    main = threading.main_thread().ident
    assert main is not None
    # Ctrl-C as a terminal sends it, whatever handler the test runner (or an xdist worker) installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupted_acquire(holder, waiter, main, cluster)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert keys_everywhere(cluster) == [[]] * len(cluster)
    assert waiter.acquire(blocking=False)
    waiter.release()


def _interrupted_acquire(holder: Lock, waiter: Lock, main: int, cluster: Cluster) -> None:
    with held_elsewhere(holder):  # another thread's (in this one, waiter's acquire would be nested)
        timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            waiter.acquire()
        timer.join()
        assert not waiter.held
        assert keys_everywhere(cluster) == [[b"redlock:waited"]] * len(cluster)  # the holder's key only


def test_calling_from_an_event_loop_fails_at_once() -> None:
    import asyncio

    redlock = Redlock(["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"])
    lock = redlock.lock("x")

    async def inside() -> None:
        with pytest.raises(RuntimeError, match="from redlock_async import"):
            lock.acquire()
        with pytest.raises(RuntimeError, match="async API"):
            redlock.inspect("x")

    asyncio.run(inside())

    import trio

    async def inside_trio() -> None:
        with pytest.raises(RuntimeError, match="thread that runs trio"):
            lock.acquire()
        assert loop_threads() == []  # refused before any thread was started

    trio.run(inside_trio)
    redlock.close()
    assert loop_threads() == []


def test_on_event_calling_the_blocking_api_is_refused(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []
    redlock: Redlock

    def on_event(event: object) -> None:
        try:
            redlock.inspect("x")
        except RuntimeError as exc:
            seen.append(str(exc))

    with Redlock(cluster.urls, on_event=on_event) as redlock, redlock.lock("evented"):
        pass
    assert seen
    assert all("own loop" in text for text in seen)


def test_close_stops_the_thread_and_leaves_nothing(cluster: Cluster) -> None:
    connections = [client_connections(cluster[i]) for i in range(len(cluster))]
    first = Redlock(cluster.urls)
    second = Redlock(cluster.urls)
    assert loop_threads() == []  # made, not used: no thread yet
    held = first.lock("closing")
    assert held.acquire()
    second.lock("other").acquire(blocking=False)
    assert len(loop_threads()) == 1  # one per process, shared
    first.close()  # releases what it held; its holder hears LockLost
    assert held.lost.is_set()
    with pytest.raises(LockLost):
        held.release()
    assert len(loop_threads()) == 1  # the second still uses it
    second.close()
    second.close()  # idempotent
    assert loop_threads() == []
    assert keys_everywhere(cluster) == [[]] * len(cluster)
    with pytest.raises(RuntimeError, match="closed"):
        first.lock("closing").acquire()
    gc.collect()  # an unclosed socket or loop would warn here (ResourceWarning is an error in this suite)
    deadline = time.monotonic() + 5
    while [client_connections(cluster[i]) for i in range(len(cluster))] != connections:
        assert time.monotonic() < deadline, "connections left open on the nodes"
        time.sleep(0.02)


def test_semaphore_and_lock_many(sync_redlock: Redlock) -> None:
    permits = [sync_redlock.semaphore("pool", limit=2) for _ in range(3)]
    assert permits[0].acquire(blocking=False)
    assert permits[1].acquire(blocking=False)
    assert not elsewhere(lambda: permits[2].acquire(blocking=False))
    permits[0].release()
    assert permits[2].acquire(blocking=False)
    permits[1].release()
    permits[2].release()
    both = sync_redlock.lock_many(["b", "a"])
    with both:
        assert both.names == ("a", "b")
        assert not elsewhere(lambda: sync_redlock.lock("a").acquire(blocking=False))


def test_election(sync_redlock: Redlock) -> None:
    first = sync_redlock.election("leader", owner="one")
    second = sync_redlock.election("leader", owner="two")
    with first.campaign() as term:
        assert sync_redlock.election("leader").leader().owner == "one"
        with pytest.raises(LockNotAcquired):
            elsewhere(lambda: second.campaign(timeout=0.2).__enter__())
    with second.campaign() as later:
        assert later > term
        observed = second.observe()
        info = next(observed)
        assert info.owner == "two"
        assert info.fencing_counter == later
        observed.close()  # stops watching on the loop


def test_bad_input_raises_when_made(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="node_timeout"):
        Redlock(cluster.urls, ttl=0.1, node_timeout=0.05)
    redlock = Redlock(cluster.urls)
    with pytest.raises(ValueError, match="empty"):
        redlock.lock("")
    with pytest.raises(ValueError, match="cooldown"):
        redlock.lock("x", cooldown=0.1)
    with pytest.raises(ValueError, match="one attempt"):
        redlock.lock("x").acquire(blocking=False, timeout=1.0)
    redlock.close()
    assert loop_threads() == []


def test_close_wakes_a_thread_blocked_in_acquire(cluster: Cluster) -> None:
    holder, waiter = Redlock(cluster.urls), Redlock(cluster.urls)
    raised: list[BaseException] = []
    waited: list[float] = []

    def wait() -> None:
        started = time.monotonic()
        try:
            waiter.lock("closing-wait", acquire_timeout=30.0).acquire()
        except BaseException as exc:
            raised.append(exc)
        waited.append(time.monotonic() - started)

    with holder.lock("closing-wait"):
        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)
        waiter.close()
        thread.join(timeout=10)
    holder.close()
    assert not thread.is_alive()
    assert len(raised) == 1
    assert isinstance(raised[0], RuntimeError)
    assert "closed" in str(raised[0])
    assert waited[0] < 5
    assert loop_threads() == []
    assert keys_everywhere(cluster) == [[]] * len(cluster)


def test_no_majority_of_nodes_is_nodes_unavailable() -> None:
    from redlock_async.sync import NodesUnavailable

    down = ["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"]
    with Redlock(down, connect_timeout=0.2, acquire_timeout=0.3) as redlock:
        lock = redlock.lock("nowhere")
        with pytest.raises(NodesUnavailable), lock:
            pass
        assert lock.acquire(blocking=False) is False  # acquire() says False, as the async one does
    assert loop_threads() == []
