"""Every event loop users deploy: uvloop, asyncio's eager tasks, anyio's cancel scopes; trio refused clearly.

The whole suite also runs on uvloop and on eager tasks in CI (``REDLOCK_TEST_LOOP``,
see tests/conftest.py); these tests check the loop-specific edges on every leg.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
import trio
import uvloop

from redlock_async import EventKind, LockEvent, LockLost, Redlock, RedlockError
from redlock_async._nodes._node import Node
from redlock_async._shared._handoff import Listener
from redlock_async._shared._watchdog import Watchdog
from tests.conftest import LOOP, Cluster, assert_no_library_tasks, eventually, lock_keys


def our_connections(cluster: Cluster) -> int:
    """Connections the servers see from redlock_async (CLIENT SETNAME names them)."""
    total = 0
    for i in range(len(cluster)):
        listing = cluster[i].command("CLIENT", "LIST")
        assert isinstance(listing, bytes)
        total += listing.count(b"name=redlock_async ")
    return total


async def no_connections_left(cluster: Cluster) -> bool:
    return await eventually(lambda: our_connections(cluster) == 0, 5.0)


def test_the_suite_runs_on_the_loop_it_was_asked_for() -> None:
    async def which() -> tuple[str, object]:
        loop = asyncio.get_running_loop()
        return type(loop).__module__, loop.get_task_factory()

    from tests.conftest import eager_loop

    if LOOP == "uvloop":
        module, _ = uvloop.run(which())
        assert module.startswith("uvloop")
    elif LOOP == "eager":
        with asyncio.Runner(loop_factory=eager_loop) as runner:
            assert runner.run(which())[1] is asyncio.eager_task_factory  # type: ignore[attr-defined,unused-ignore]


async def test_the_async_tests_run_on_the_loop_asked_for() -> None:
    loop = asyncio.get_running_loop()
    if LOOP == "uvloop":
        assert type(loop).__module__.startswith("uvloop")
    else:
        assert type(loop).__module__.startswith("asyncio")
    if LOOP == "eager":
        assert loop.get_task_factory() is asyncio.eager_task_factory  # type: ignore[attr-defined,unused-ignore]


# -- uvloop, whatever the suite's loop -------------------------------------------------------


def test_uvloop_run_acquires_extends_and_releases(cluster: Cluster) -> None:
    """Under uvloop, ``async with Redlock(...)`` used to wait forever (its transports are not asyncio's class)."""

    async def main() -> list[str]:
        seen = []
        async with asyncio.timeout(20), Redlock(cluster.urls, ttl=1.0) as redlock:
            lock = redlock.lock("uvloop:basic")
            assert await lock.acquire(blocking=False)
            seen.append("acquired")
            await lock.extend()
            await lock.release()
            async with redlock.lock("uvloop:with", fencing=True) as held:
                assert held.fencing_token is not None
                await asyncio.sleep(1.0)  # the watchdog extends past the 1 s ttl
                assert held.held
                seen.append("held past its ttl")
            # Hand-off: a waiter is woken by the holder's release.
            first = redlock.lock("uvloop:handoff")
            assert await first.acquire()
            second = redlock.lock("uvloop:handoff")
            waiter = asyncio.create_task(second.acquire(timeout=5))
            await asyncio.sleep(0.05)
            await first.release()
            assert await waiter
            await second.release()
            seen.append("handed off")
        return seen

    assert uvloop.run(main()) == ["acquired", "held past its ttl", "handed off"]
    # Nothing left but the fencing counter and its fencer, which never expire by design.
    left = [b"redlock-fence:uvloop:with", b"redlock-fence:uvloop:with\x00by"]
    assert all(lock_keys(cluster[i]) == left for i in range(len(cluster)))


@pytest.mark.skipif(sys.version_info < (3, 12), reason="asyncio.eager_task_factory is Python 3.12+")
def test_eager_tasks_acquire_and_hand_off(cluster: Cluster) -> None:
    from tests.conftest import eager_loop

    async def main() -> int:
        async with asyncio.timeout(20), Redlock(cluster.urls) as redlock:
            inside = 0
            most = 0

            async def worker() -> None:
                nonlocal inside, most
                for _ in range(5):
                    async with redlock.lock("eager:contended"):
                        inside += 1
                        most = max(most, inside)
                        await asyncio.sleep(0.001)
                        inside -= 1

            await asyncio.gather(*(worker() for _ in range(4)))
            return most

    with asyncio.Runner(loop_factory=eager_loop) as runner:
        assert runner.run(main()) == 1


# -- trio: refused at the first call, in one line -----------------------------------------------


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(lambda main: trio.run(main), id="trio.run"),
        pytest.param(lambda main: anyio.run(main, backend="trio"), id="anyio-trio"),
    ],
)
def test_trio_is_refused_in_one_line(cluster: Cluster, run: Callable[[Callable[[], Awaitable[None]]], None]) -> None:
    async def enter() -> None:
        async with Redlock(cluster.urls):
            pass

    redlock = Redlock(cluster.urls)
    lock = redlock.lock("trio")

    async def acquire() -> None:
        await lock.acquire()

    for main in (enter, acquire):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a coroutine never awaited would be a RuntimeWarning
            with pytest.raises(RuntimeError) as caught:
                run(main)
        text = str(caught.value)
        assert "\n" not in text
        assert "not on trio" in text
        assert "backend='asyncio'" in text


def test_outside_any_loop_the_error_says_what_to_do(cluster: Cluster) -> None:
    lock = Redlock(cluster.urls).lock("no-loop")
    coro = lock.acquire()
    with pytest.raises(RuntimeError, match="needs a running asyncio event loop"):
        coro.send(None)


# -- anyio's cancel scopes: closing cannot be cut short -----------------------------------------


async def test_redlock_closed_inside_a_cancelled_anyio_scope_leaves_no_task_or_socket(cluster: Cluster) -> None:
    with anyio.move_on_after(0.2) as scope:
        async with Redlock(cluster.urls) as redlock:
            assert await redlock.lock("anyio:close").acquire(blocking=False)
            assert our_connections(cluster) > 0
            await anyio.sleep(30)
    assert scope.cancelled_caught
    assert_no_library_tasks()
    assert await no_connections_left(cluster)


async def test_redlock_closed_when_a_task_group_sibling_fails(cluster: Cluster) -> None:
    async def fail_soon() -> None:
        await anyio.sleep(0.1)
        raise ValueError("sibling failed")

    async def hold() -> None:
        async with Redlock(cluster.urls) as redlock:
            waiter = redlock.lock("anyio:sibling")
            assert await waiter.acquire(blocking=False)
            await anyio.sleep(30)

    with pytest.raises(ExceptionGroup) as caught:
        async with anyio.create_task_group() as group:
            group.start_soon(hold)
            group.start_soon(fail_soon)
    assert caught.group_contains(ValueError)
    assert_no_library_tasks()
    assert await no_connections_left(cluster)


async def test_aclose_cancelled_at_every_await_still_closes(cluster: Cluster) -> None:
    redlock = Redlock(cluster.urls)
    await redlock.connect()
    with anyio.CancelScope() as scope:
        scope.cancel()  # every await inside is cancelled, again and again
        await redlock.aclose()
    assert_no_library_tasks()
    assert await no_connections_left(cluster)


async def test_redlock_entered_inside_fail_after_times_out_cleanly(cluster: Cluster) -> None:
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.3):
            async with Redlock(cluster.urls) as redlock:
                holder = redlock.lock("anyio:fail-after")
                assert await holder.acquire(blocking=False)
                await redlock.lock("anyio:fail-after").acquire(timeout=10)  # waits on the holder
    assert_no_library_tasks()
    assert await no_connections_left(cluster)


# -- fail loud: a background task's unexpected exception ----------------------------------------
# These tests patch private methods (Node._preload_scripts, Node._handshake, Watchdog._start_round) and
# Listener.on_connect on purpose: fault injection into the background tasks, which no public call reaches.


class Injected(Exception):
    pass


def break_node(monkeypatch: pytest.MonkeyPatch, method: str, name: str | None = None) -> None:
    """Make *method* of Node raise Injected (for the node called *name* only, when given)."""
    original = getattr(Node, method)

    def broken(self: Node, *args: Any) -> Any:
        if name is None or self.name == name:
            raise Injected(f"injected into {method}")
        return original(self, *args)

    monkeypatch.setattr(Node, method, broken)


async def test_a_failing_connection_task_fails_connect_loudly(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    redlock = Redlock(cluster.urls)
    break_node(monkeypatch, "_preload_scripts", redlock.nodes[0])
    with caplog.at_level(logging.ERROR), pytest.raises(RedlockError, match="internal error") as caught:
        async with redlock:
            pass
    assert isinstance(caught.value.__cause__, Injected)
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1
    assert logged[0].exc_info is not None
    assert logged[0].exc_info[0] is Injected
    assert_no_library_tasks()


async def test_a_task_failing_while_an_acquire_waits_fails_the_acquire(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with Redlock(cluster.urls) as redlock:
        holder = redlock.lock("loud:wait")
        assert await holder.acquire(blocking=False)
        waiter = asyncio.create_task(redlock.lock("loud:wait").acquire(timeout=30))
        await asyncio.sleep(0.3)
        assert not waiter.done()
        # The node's connection breaks, and its reconnect meets a bug.
        break_node(monkeypatch, "_handshake", redlock.nodes[2])
        cluster[2].command("CLIENT", "KILL", "TYPE", "normal")
        with caplog.at_level(logging.ERROR), pytest.raises(RedlockError, match="internal error") as caught:
            async with asyncio.timeout(5):  # well before the acquire's own 30 s
                await waiter
        told = time.time()
        assert isinstance(caught.value.__cause__, Injected)
        logged = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
        assert len(logged) == 1
        # The waiter is told within about a node timeout of the fault, not at its next retry.
        assert told - logged[0].created < 0.15, told - logged[0].created
        with pytest.raises(RedlockError):
            await redlock.lock("loud:later").acquire(blocking=False)
        monkeypatch.undo()
    assert_no_library_tasks()


@pytest.mark.serial  # it times the failure (0.15 s): a 2-core box running the other legs beside it took 0.1504
async def test_a_failing_subscriber_task_fails_the_waiting_acquire(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Listener, node: Node) -> None:
        raise Injected("injected into the subscriber")

    monkeypatch.setattr(Listener, "on_connect", broken)
    async with Redlock(cluster.urls) as redlock:
        holder = redlock.lock("loud:subscriber")
        assert await holder.acquire(blocking=False)
        with caplog.at_level(logging.ERROR), pytest.raises(RedlockError, match="internal error") as caught:
            async with asyncio.timeout(5):
                await redlock.lock("loud:subscriber").acquire(timeout=30)
        told = time.time()
        assert isinstance(caught.value.__cause__, Injected)
        logged = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
        # Every subscriber connection met the bug: each task logged it once, with its traceback.
        assert len(logged) == len(cluster)
        assert len({r.getMessage() for r in logged}) == len(cluster)
        assert all(r.exc_info is not None and r.exc_info[0] is Injected for r in logged)
        assert told - logged[0].created < 0.15, told - logged[0].created
        with pytest.raises(RedlockError, match="internal error"):  # later calls too
            await redlock.lock("loud:subscriber-later").acquire(blocking=False)
    assert_no_library_tasks()


@pytest.mark.slow
async def test_a_fault_ends_a_polling_acquire_s_pause_at_once(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the pushed hand-off, a waiting acquire sleeps between tries: a fault ends the sleep."""
    async with Redlock(cluster.urls, wait_for_release=False, retry_delay=2.0) as redlock:
        holder = redlock.lock("loud:polling")
        assert await holder.acquire(blocking=False)
        waiter = asyncio.create_task(redlock.lock("loud:polling").acquire(timeout=30))
        await asyncio.sleep(0.2)  # its first try failed; it sleeps 1-3 s before the next
        assert not waiter.done()
        break_node(monkeypatch, "_handshake", redlock.nodes[1])
        cluster[1].command("CLIENT", "KILL", "TYPE", "normal")
        with caplog.at_level(logging.ERROR), pytest.raises(RedlockError, match="internal error"):
            async with asyncio.timeout(5):
                await waiter
        told = time.time()
        logged = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
        assert len(logged) == 1
        assert told - logged[0].created < 0.15, told - logged[0].created
        monkeypatch.undo()
    assert_no_library_tasks()


async def test_a_failing_watchdog_task_gives_its_locks_up_loudly(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the watchdog must not leave a lease to run out with the body still trusting it."""

    def broken(self: Watchdog, locks: list[Any], now: float) -> None:
        raise Injected("injected into the watchdog")

    monkeypatch.setattr(Watchdog, "_start_round", broken)
    async with Redlock(cluster.urls) as redlock:
        with caplog.at_level(logging.ERROR), pytest.raises(LockLost, match="internal error") as caught:
            async with asyncio.timeout(5):  # the body would sleep 30 s: well before that
                async with redlock.lock("loud:watchdog", ttl=1.0):
                    await asyncio.sleep(30)
        assert isinstance(caught.value.__cause__, Injected)
        logged = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
        assert len(logged) == 1
        assert logged[0].exc_info is not None
        assert logged[0].exc_info[0] is Injected
        with pytest.raises(RedlockError, match="internal error") as later:
            await redlock.lock("loud:watchdog-later").acquire(blocking=False)
        assert isinstance(later.value.__cause__, Injected)
    assert await eventually(lambda: all(not lock_keys(cluster[i]) for i in range(len(cluster))), 3.0)
    assert_no_library_tasks()


# -- anyio's cancel scopes around a held lock ---------------------------------------------------


async def test_an_anyio_timeout_while_holding_releases_the_lock(cluster: Cluster) -> None:
    events: list[LockEvent] = []
    async with Redlock(cluster.urls, on_event=events.append) as redlock:
        lock = redlock.lock("anyio:holding")
        with anyio.move_on_after(0.2) as scope:
            async with lock:
                await anyio.sleep(30)
        assert scope.cancelled_caught
        assert not lock.held
        assert [e.kind for e in events] == [EventKind.ACQUIRED, EventKind.RELEASED]
        assert all(not lock_keys(cluster[i]) for i in range(len(cluster)))
    assert_no_library_tasks()


async def test_a_scope_cancelled_from_another_task_while_the_watchdog_declares_a_loss(faulty: Cluster) -> None:
    events: list[LockEvent] = []
    async with Redlock(faulty.urls, on_event=events.append) as redlock:
        lock = redlock.lock("anyio:loss", ttl=0.5)
        with anyio.CancelScope() as scope:

            async def cancel_at_the_loss() -> None:
                await eventually(lambda: any(e.kind is EventKind.LOST for e in events), 5.0, step=0.001)
                scope.cancel()  # in the same moment as the watchdog's cancellation of the body

            async with anyio.create_task_group() as group:
                group.start_soon(cancel_at_the_loss)
                try:
                    async with lock:
                        for i in (0, 1, 2):
                            faulty[i].pause()  # a majority silent: the lease cannot be kept
                        await anyio.sleep(30)
                except LockLost:
                    pass  # or the scope's cancellation: either way the loss is reported once
        for i in (0, 1, 2):
            faulty[i].resume()
        assert not lock.held
        assert [e.kind for e in events].count(EventKind.LOST) == 1
        assert "extended" in (events[-1].reason or ""), events[-1]
    assert_no_library_tasks()


@pytest.mark.slow
async def test_an_anyio_cancel_right_after_the_lease_ran_out_still_reports_the_loss(faulty: Cluster) -> None:
    """The exit's confirmation round is not cut short by anyio's repeated cancellation."""
    events: list[LockEvent] = []
    async with Redlock(faulty.urls, on_event=events.append) as redlock:
        # The watchdog is due at 0.8 s: time enough, on a loaded box, to reach the blocking sleep before it.
        lock = redlock.lock("anyio:overrun", ttl=1.2)
        with anyio.CancelScope() as scope:
            async with lock:
                for i in (0, 1, 2):
                    faulty[i].pause()
                await anyio.sleep(0.01)  # the watchdog's task starts, and waits for its due time (0.8 s)
                # The deadline is set here, not by a move_on_after around the acquire: under load, a
                # deadline counted from before it could pass before the lease ran out (CI saw that: the
                # exit released a live lease, and no loss was reported).
                scope.deadline = anyio.current_time() + 0.2
                time.sleep(1.3)  # the loop blocked past the validity and the deadline: the watchdog cannot run
                await anyio.sleep(30)  # the scope's deadline has passed: cancelled here, at once
        for i in (0, 1, 2):
            faulty[i].resume()
        assert scope.cancelled_caught
        assert not lock.held
        lost = [e for e in events if e.kind is EventKind.LOST]
        assert len(lost) == 1, events
        assert "did not answer the release" in (lost[0].reason or ""), lost[0].reason
    assert_no_library_tasks()


def test_a_redlock_used_from_a_second_event_loop_says_so(cluster: Cluster) -> None:
    """Its connections belong to the loop of its first call: another loop gets a clear error, not a hang."""
    redlock = Redlock(cluster.urls)
    lock = redlock.lock("two-loops")

    async def take_and_close() -> None:
        assert await lock.acquire(blocking=False)
        await lock.release()
        await redlock.aclose()

    async def take_again() -> None:
        await lock.acquire(blocking=False)

    asyncio.run(take_and_close())
    with pytest.raises(RuntimeError, match="bound to another event loop: make the Redlock inside the loop"):
        asyncio.run(take_again())
