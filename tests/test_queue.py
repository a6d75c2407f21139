"""The grant queue (``Redlock(queue=True)``): the nodes keep a key's waiters in line, and a release
(or a give-up, or a split's give-back) hands the key straight to the first live waiter, published as a
grant word the waiter counts by the node clock.

Checked here against real servers, the way production breaks things: that a lock changes hands by the
grant alone (no retry of the waiter's) within a process and across OS processes; exclusion under
contention of two Redlocks and another process, and with clients without the queue on the same name
(which must not starve); that waiters that time out or are cancelled (in any loop turn around the grant
they are given) leave no key and no line behind, and never leave the key held by no one; that a holder
or a queued waiter SIGKILLed delays the others by about a ttl (plus an entry's life), not for ever;
exclusion and progress under a paused node, a node restarted empty (its quarantine respected) and a
node wiped (FLUSHALL); uvloop; and the settings the queue refuses.

``python -m tests.test_queue contend URLS NAME TASKS RETRY_DELAY QUEUE`` (started with the test's other
contenders: conftest's ``start_together``) and
``... wait URLS NAME RETRY_DELAY TTL HOLD`` are the other OS process of these tests (:func:`child_main`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvloop

from redlock_async import LockNotAcquired, Redlock
from redlock_async._core._algorithm import Vote
from redlock_async._lock._strategies import Queued
from redlock_async._queue import queue_keys
from redlock_async.lock import Lock
from redlock_async.testing import History
from redlock_async.testing._history import Section
from redlock_async.testing._inside import cluster_of, strategy_of

from .conftest import (
    CHILDREN_TIMEOUT,
    ROUNDS,
    Cluster,
    MakeRedlock,
    assert_no_library_tasks,
    calls,
    eventually,
    finish_child,
    keys_everywhere,
    kill_child,
    next_event,
    start_module,
    start_together,
)

SLOW = 5.0
"""A retry delay so long (the first fallback try 2.5 s after a failed one at the earliest) that within
these tests only a grant (or a release's word) can explain a waiter's prompt lock."""

PROMPT = 1.0
"""How soon a waiter must hold the lock once it is handed on. The mechanism takes one script run and one
published word (~1 ms on loopback); 1 s is for a box of 2 noisy cores running 5 servers and 2 processes,
and still far below SLOW / 2."""

BOUND = 10.0
"""The acquire timeout in the contention tests: a client starved for this long fails loudly."""

ROOT = Path(__file__).resolve().parent.parent


# -- helpers -------------------------------------------------------------------------------------


def key_of(name: str) -> bytes:
    return b"redlock:" + name.encode()


def line_lengths(cluster: Any, name: str) -> list[int]:
    """How many waiters each node keeps in the line of *name* (ZCARD of ``<key>\\x00queue``)."""
    queue = queue_keys(key_of(name))[1]
    return [int(cluster[i].command("ZCARD", queue)) for i in range(len(cluster))]


def values_on(cluster: Any, name: str) -> list[object]:
    """The value of *name*'s lock key on each node (None where absent)."""
    return [cluster[i].command("GET", key_of(name)) for i in range(len(cluster))]


def listening(cluster: Any, name: str) -> int:
    """How many subscriber connections listen on *name*'s channel, on the node that has fewest."""
    return min(int(cluster[i].command("PUBSUB", "NUMSUB", key_of(name))[1]) for i in range(len(cluster)))


async def assert_nothing_left(cluster: Any, within: float = PROMPT) -> None:
    """No lock key and no queue key (``\\x00queue``, ``\\x00waits``) on any node, within *within* seconds
    (a release or a leave queued in the background runs a moment later)."""
    empty: list[list[bytes]] = [[]] * len(cluster)
    assert await eventually(lambda: keys_everywhere(cluster) == empty, within), keys_everywhere(cluster)


async def handed_everywhere(cluster: Any, name: str, token: bytes) -> bool:
    """Every node's key of *name* holds *token*, within PROMPT (the slower nodes' grants a moment later)."""
    return await eventually(lambda: values_on(cluster, name) == [token] * len(cluster), PROMPT)


async def in_line(cluster: Any, name: str, waiters: int, within: float = 10.0) -> None:
    """Wait until every node keeps at least *waiters* waiters in *name*'s line."""
    assert await eventually(lambda: min(line_lengths(cluster, name)) >= waiters, within), line_lengths(cluster, name)


# -- the other OS process --------------------------------------------------------------------------------


async def start_child(urls: list[str], *args: str) -> asyncio.subprocess.Process:
    return await start_module("tests.test_queue", args[0], ",".join(urls), *args[1:], stdin=args[0] == "contend")


async def child_contend(
    urls: list[str], name: str, tasks: int, retry_delay: float, queue: bool, fencing: bool = False
) -> None:
    """Tasks taking *name* until the test's stop time; prints each critical section and how long its acquire
    waited: [client, token, fencing token (None unfenced), start, end, waited]; then {"timeouts": n}.
    (tests/test_queue_fencing.py runs it fenced.)

    It starts with the test's other contenders (conftest's :func:`start_together`): connected, it says
    ``{"ready": ...}`` and reads the moment to stop (``{"stop": monotonic}``) from its standard input; with
    ``"rounds": n`` there too, each task stops sooner, after n sections."""
    rows: list[list[Any]] = []
    timeouts = 0
    async with Redlock(urls, retry_delay=retry_delay, queue=queue, fencing=fencing) as redlock:
        await redlock.connect()
        print(json.dumps({"ready": os.getpid()}), flush=True)
        go = json.loads(await asyncio.to_thread(sys.stdin.readline))
        stop, rounds = float(go["stop"]), go.get("rounds")

        async def task(n: int) -> None:
            nonlocal timeouts
            lock = redlock.lock(name, acquire_timeout=BOUND)
            done = 0
            while time.monotonic() < stop and (rounds is None or done < rounds):
                wanted = time.monotonic()
                try:
                    async with lock:
                        start = time.monotonic()
                        await asyncio.sleep(0.0005)
                        done += 1
                        row = [f"pid{os.getpid()}.{n}", lock.token, lock.fencing_token, start, time.monotonic()]
                        rows.append([*row, start - wanted])
                except LockNotAcquired:
                    timeouts += 1
                await asyncio.sleep(0.001)

        await asyncio.gather(*(task(n) for n in range(tasks)))
    for row in rows:
        print(json.dumps(row))
    print(json.dumps({"timeouts": timeouts}))


async def child_wait(urls: list[str], name: str, retry_delay: float, ttl: float, hold: float) -> None:
    """Take *name* through the queue (blocking); print when, with which token, after how many attempts and
    until when the lease is valid; hold it *hold* seconds (no watchdog), release, and say so."""
    # The Redlock's default ttl, as the test's: one with a longer ttl would quarantine nodes whose
    # restart marker vouches for a shorter quarantine (for its ttl), the test's Redlock's.
    async with Redlock(urls, retry_delay=retry_delay, queue=True) as redlock:
        lock = redlock.lock(name, ttl=ttl, acquire_timeout=30)
        print(json.dumps({"started": time.monotonic()}), flush=True)
        acquired = await lock.acquire()
        now = time.monotonic()
        event = {
            "acquired": now,
            "ok": acquired,
            "token": lock.token,
            "attempts": lock.statistics().attempts,
            "valid_until": now + lock.validity,
        }
        print(json.dumps(event), flush=True)
        if acquired:
            await asyncio.sleep(hold)
            await lock.release()
            print(json.dumps({"released": time.monotonic()}), flush=True)


def child_main(argv: list[str]) -> None:
    mode, urls = argv[0], argv[1].split(",")
    if mode == "contend":
        queue, fencing = argv[5] == "queue", argv[6:] == ["fenced"]
        asyncio.run(child_contend(urls, argv[2], int(argv[3]), float(argv[4]), queue, fencing))
    else:
        asyncio.run(child_wait(urls, argv[2], float(argv[3]), float(argv[4]), float(argv[5])))


# -- 1. the lock changes hands by the grant: no retry -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.serial
async def test_a_waiter_in_another_process_gets_the_lock_by_the_grant(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """We hold; another OS process waits in line (retry delay SLOW: no fallback try for 2.5 s). Our
    release hands the key to it on the nodes themselves (the key is never free: right after our release
    returns, a majority of nodes hold the child's token) and it holds the lock well under a second
    later, with no attempt beyond its first try and the one it makes once it listens."""
    redlock = await make_redlock(queue=True, retry_delay=SLOW)
    holder = redlock.lock("across", ttl=30)
    assert await holder.acquire(blocking=False)
    ours = holder.token
    assert ours is not None
    child = await start_child(cluster.urls, "wait", "across", str(SLOW), "30", "0.5")
    try:
        assert "started" in await next_event(child, 15)
        await in_line(cluster, "across", 1)
        assert await eventually(lambda: listening(cluster, "across") >= 1, 10.0)
        await asyncio.sleep(0.2)  # its entry again once it listens: it waits for a grant now
        released = time.monotonic()
        await holder.release()
        values = values_on(cluster, "across")
        event = await next_event(child, PROMPT + 1)
        assert event["ok"], event
        # Handed on where the release ran: no node was left free for a SET of the child's own.
        assert sum(v == event["token"].encode() for v in values) >= 3, (values, event["token"])
        assert ours.encode() not in values, values
        assert event["acquired"] - released < PROMPT, event["acquired"] - released
        assert event["attempts"] <= 2, event  # no fallback try: its timer is seconds away
        assert "released" in await next_event(child, 5)
        await finish_child(child, 10)
    finally:
        await kill_child(child)
    await assert_nothing_left(cluster)


@pytest.mark.serial
async def test_two_redlocks_of_one_process_hand_off_by_the_grant(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Holder in one Redlock, a chain of 3 waiters in 3 others (retry delay SLOW): each release hands the
    key to the next in line (by their order of arrival), which holds it at once; the nodes run one SET per
    node per hand-off (the release's own script's), so no waiter sent an attempt of its own meanwhile."""
    redlocks = [await make_redlock(queue=True, retry_delay=SLOW) for _ in range(4)]
    holder = redlocks[0].lock("chain", ttl=30)
    assert await holder.acquire(blocking=False)
    waiters = [r.lock("chain", ttl=30, acquire_timeout=20) for r in redlocks[1:]]
    tasks = []
    for n, waiter in enumerate(waiters):
        tasks.append(asyncio.create_task(waiter.acquire()))
        await in_line(cluster, "chain", n + 1)
    await asyncio.sleep(0.2)  # each entered again once listening
    order: list[Lock] = [holder, *waiters]
    for previous, (waiter, task) in zip(order, zip(waiters, tasks, strict=True), strict=False):
        sets = calls(cluster, "set")
        released = time.monotonic()
        await previous.release()
        async with asyncio.timeout(PROMPT):
            assert await task
        waited = time.monotonic() - released
        assert waiter.held
        assert waiter.statistics().attempts <= 2, waiter.statistics()
        assert waited < PROMPT, waited
        token = waiter.token
        assert token is not None
        assert await handed_everywhere(cluster, "chain", token.encode())
        # The release's QUEUE_LEAVE SETs the key to the next waiter on each node; nothing else ran.
        assert calls(cluster, "set") - sets == len(cluster), calls(cluster, "set") - sets
    await waiters[-1].release()
    await assert_nothing_left(cluster)


@pytest.mark.serial
async def test_a_waiter_joining_a_subscription_still_being_made_hears_its_grant(
    cluster: Cluster, make_redlock: MakeRedlock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subscriber connections answer SUBSCRIBE 0.3 s late (a busy or reconnecting connection; under
    contention on uvloop the same race happens by itself, see test_contention_on_uvloop). W1 starts
    waiting and subscribes the Redlock; W2 of the same Redlock joins while that SUBSCRIBE is still on its
    way, and W1 gives up. The holder's release grants the key to W2 before the nodes run the SUBSCRIBE:
    that word is lost, and W2 (retry delay SLOW) must still hold the lock within PROMPT (by entering
    again once the subscription is in place), not after its fallback try 2.5-7.5 s later, while the
    key is held for it on every node and everyone else waits behind it."""
    redlock = await make_redlock(queue=True, retry_delay=SLOW)
    other = await make_redlock(queue=True)
    holder = other.lock("late-subscription", ttl=30)
    assert await holder.acquire(blocking=False)
    loop = asyncio.get_running_loop()
    for node in cluster_of(redlock).listener.nodes:  # the subscriber connections of the waiters' Redlock
        original = node.send

        def late_send(*args: Any, original: Callable[..., asyncio.Future[Any]] = original, **kw: Any) -> Any:
            if args[:1] != (b"SUBSCRIBE",):
                return original(*args, **kw)
            answer: asyncio.Future[Any] = loop.create_future()

            def answered(sent: asyncio.Future[Any]) -> None:
                if not answer.done():
                    answer.set_result(None if sent.cancelled() or sent.exception() else sent.result())

            def send_now() -> None:
                original(*args, **kw).add_done_callback(answered)

            loop.call_later(0.3, send_now)
            return answer

        monkeypatch.setattr(node, "send", late_send)
    first = redlock.lock("late-subscription", ttl=30)
    w1 = asyncio.create_task(first.acquire(timeout=0.12))
    await asyncio.sleep(0.06)  # W1 is in line and its SUBSCRIBE is on its way
    second = redlock.lock("late-subscription", ttl=30)
    w2 = asyncio.create_task(second.acquire(timeout=20))
    try:
        async with asyncio.timeout(PROMPT):
            assert not await w1  # gave up: W2 is alone in line
        assert line_lengths(cluster, "late-subscription") == [1] * len(cluster)
        released = time.monotonic()
        await holder.release()
        token = values_on(cluster, "late-subscription")[0]
        assert token is not None  # granted to W2 on the nodes
        done, _ = await asyncio.wait({w2}, timeout=PROMPT)  # (a timeout around `await w2` would cancel it)
        assert done, (
            f"W2 not served within {PROMPT} s of the release though the nodes hold the key for it: "
            f"{values_on(cluster, 'late-subscription')} (W2's token {token!r})"
        )
        assert w2.result()
        assert time.monotonic() - released < PROMPT
    finally:
        w2.cancel()
    await second.release()
    await assert_nothing_left(cluster)


# -- 2. exclusion under contention ------------------------------------------------------------------------


@dataclasses.dataclass
class Contention:
    history: History
    """Every process's sections, merged."""
    longest: dict[str, float]
    """Each client's longest wait for the lock."""
    grants: dict[str, int]
    timeouts: int
    """How many acquires timed out (BOUND) in all."""


async def contend(
    cluster: Cluster,
    clients: list[tuple[str, Redlock, int]],
    name: str,
    seconds: float,
    child: tuple[int, bool] | None = None,
    retry_delay: float = 0.2,
    rounds: int | None = None,
) -> Contention:
    """Tasks of Redlocks (``(label, redlock, tasks)``) and, with *child* ``(tasks, queue)``, of another OS
    process (started together) take *name* for *seconds* (with *rounds*: each task until it held it that
    many times, within *seconds*)."""
    history = History()
    longest: dict[str, float] = collections.defaultdict(float)
    timeouts = [0]
    process = None
    if child is not None:
        mode = "queue" if child[1] else "plain"
        process = await start_child(cluster.urls, "contend", name, str(child[0]), str(retry_delay), mode)
    try:
        stop = (
            time.monotonic() + seconds if process is None else await start_together([process], seconds, rounds=rounds)
        )
    except BaseException:
        if process is not None:
            await kill_child(process)
        raise

    async def worker(client: str, redlock: Redlock) -> None:
        lock = redlock.lock(name, acquire_timeout=BOUND)
        done = 0
        while time.monotonic() < stop and (rounds is None or done < rounds):
            wanted = time.monotonic()
            try:
                async with lock:
                    longest[client] = max(longest[client], time.monotonic() - wanted)
                    with history.section(client, lock):
                        await asyncio.sleep(0.0005)
                    done += 1
            except LockNotAcquired:
                timeouts[0] += 1
            await asyncio.sleep(0.001)

    workers = [
        asyncio.create_task(worker(f"{label}.{n}", redlock)) for label, redlock, tasks in clients for n in range(tasks)
    ]
    try:
        async with asyncio.timeout(seconds + BOUND + 15):
            await asyncio.gather(*workers)
        if process is not None:
            rows = await finish_child(process, BOUND + 15)
            timeouts[0] += rows.pop()["timeouts"]
            for client, token, fencing_token, start, end, waited in rows:
                history.sections.append(Section(client, token, fencing_token, start, end))
                longest[client] = max(longest[client], waited)
    finally:
        for task in workers:
            task.cancel()
        if process is not None:
            await kill_child(process)
    grants = collections.Counter(section.client for section in history.sections)
    return Contention(history, dict(longest), dict(grants), timeouts[0])


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.timeout(CHILDREN_TIMEOUT)
async def test_two_redlocks_and_another_process_exclude_each_other(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """3 + 1 tasks of two Redlocks and 2 tasks of another process, all queue=True, on one key, started
    together, each task taking it ROUNDS times (retry delay SLOW: the lock moves by grants only): one
    history across processes with no overlap, every task served, every acquire served by the line (no
    wait as long as the first fallback timer: a lost grant costs one), and nothing left on the nodes.

    Counted in grants, not in seconds: it used to ask for 100 grants in 2 s and every wait under 1 s,
    which a loaded box could break without anything being wrong."""
    first = await make_redlock(queue=True, retry_delay=SLOW)
    second = await make_redlock(queue=True, retry_delay=SLOW)
    run = await contend(
        cluster, [("r0", first, 3), ("r1", second, 1)], "contended", 60.0, (2, True), SLOW, rounds=ROUNDS
    )
    run.history.check()
    print(f"grants {run.grants}, longest waits {run.longest}")
    assert run.timeouts == 0
    assert len(run.grants) == 6, run.grants  # every task of both Redlocks and of the child
    assert set(run.grants.values()) == {ROUNDS}, run.grants
    # Every grant came by the line, none after a fallback timer (the first fires SLOW / 2 after a try).
    assert max(run.longest.values()) < SLOW / 2, run.longest
    await assert_nothing_left(cluster)


@pytest.mark.slow
@pytest.mark.timeout(CHILDREN_TIMEOUT)
async def test_clients_with_and_without_the_queue_exclude_each_other_and_all_progress(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """On one name: 2 tasks of a queue=True Redlock, 2 tasks of a queue=False Redlock of this process and
    2 tasks of another process without the queue, for 2 s: no overlap, and every task gets the lock
    (none times out after BOUND): the queue's clients must not keep the lock among themselves for good."""
    queued = await make_redlock(queue=True)
    plain = await make_redlock(queue=False)
    run = await contend(cluster, [("q", queued, 2), ("p", plain, 2)], "mixed", 2.0, child=(2, False))
    run.history.check()
    print(f"grants {run.grants}, longest waits {run.longest}, timeouts {run.timeouts}")
    assert len(run.grants) == 6, run.grants
    assert run.timeouts == 0, (run.timeouts, run.grants)
    assert max(run.longest.values()) < BOUND, run.longest
    await assert_nothing_left(cluster)


# -- 3. nothing left behind ----------------------------------------------------------------------------------


GIVE_UPS = ("acquire-timeout", "task-cancel", "asyncio-timeout", "anyio-move-on-after", "anyio-cancel-scope")


async def give_up(how: str, lock: Lock, after: float) -> str:
    """Acquire *lock* (blocking), giving up after *after* seconds as *how* says; how it ended."""
    try:
        if how == "acquire-timeout":
            return "held it" if await lock.acquire(timeout=after) else "timed out"
        if how == "asyncio-timeout":
            async with asyncio.timeout(after):
                await lock.acquire()
        elif how == "anyio-move-on-after":
            with anyio.move_on_after(after) as scope:
                await lock.acquire()
            if scope.cancelled_caught:
                return "moved on"
        elif how == "anyio-cancel-scope":
            with anyio.CancelScope() as scope:
                asyncio.get_running_loop().call_later(after, scope.cancel)
                await lock.acquire()
            if scope.cancelled_caught:
                return "cancelled"
        else:
            task = asyncio.create_task(lock.acquire())
            await asyncio.sleep(after)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return "cancelled"
    except TimeoutError:
        return "timed out"
    return "held it"


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("how", GIVE_UPS)
async def test_a_waiter_that_gives_up_leaves_nothing_behind(
    cluster: Cluster, make_redlock: MakeRedlock, how: str
) -> None:
    """A holder (ttl 30 s) and a waiter of another Redlock (re-entering its line every ~0.1 s) that
    gives up after 0.35 s: its entry leaves every node's line at once (only the lock key is left), and
    the holder's release then frees the key (not granted to the departed waiter: it would be held by no
    one for 30 s): a non-blocking acquire takes it at once, and nothing is left after it."""
    redlock = await make_redlock(queue=True)
    other = await make_redlock(queue=True, retry_delay=0.1)
    holder = redlock.lock("gives-up", ttl=30)
    assert await holder.acquire(blocking=False)
    waiter = other.lock("gives-up", ttl=30)
    waiting = asyncio.create_task(give_up(how, waiter, 0.35))
    await in_line(cluster, "gives-up", 1, within=0.3)
    async with asyncio.timeout(5):
        assert await waiting in ("timed out", "moved on", "cancelled")
    assert not waiter.held
    key = key_of("gives-up")
    assert await eventually(lambda: keys_everywhere(cluster) == [[key]] * len(cluster), PROMPT), keys_everywhere(
        cluster
    )
    await holder.release()
    await assert_nothing_left(cluster)
    late = redlock.lock("gives-up", ttl=30)
    assert await late.acquire(blocking=False), late.outcomes
    await late.release()
    await assert_nothing_left(cluster)


@pytest.mark.serial
async def test_a_non_blocking_try_on_a_held_key_leaves_no_entry(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """acquire(blocking=False) on a held key joins each node's line for its one try: it must leave again,
    so that the holder's release frees the key instead of granting it to a try long over."""
    redlock = await make_redlock(queue=True)
    other = await make_redlock(queue=True)
    holder = redlock.lock("one-try", ttl=30)
    assert await holder.acquire(blocking=False)
    for _ in range(3):
        assert not await other.lock("one-try", ttl=30).acquire(blocking=False)
    key = key_of("one-try")
    assert await eventually(lambda: keys_everywhere(cluster) == [[key]] * len(cluster), PROMPT), keys_everywhere(
        cluster
    )
    await holder.release()
    await assert_nothing_left(cluster)


# -- 4. cancelled in the loop turn of the grant ---------------------------------------------------------------


TURNS = range(-1, 16)
"""When the first waiter is cancelled: -1 in the loop turn before the release is sent, k >= 0 after k
loop iterations (asyncio.sleep(0)) once the release was sent; its grant comes ~0.2-1 ms later."""


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("waiter_in", ["the-holders-redlock", "another-redlock"])
async def test_a_waiter_cancelled_around_its_grant_never_leaves_the_key_to_no_one(
    cluster: Cluster, make_redlock: MakeRedlock, waiter_in: str
) -> None:
    """A sweep over the moment of cancellation (:func:`cancel_first_around_release`) for a lock: whatever
    W1 ended with, W2 must hold the lock promptly (a key granted to a W1 that is gone would hold it for
    30 s), and nothing is left once W2 releases."""
    redlock = await make_redlock(queue=True, retry_delay=SLOW)
    other = await make_redlock(queue=True, retry_delay=SLOW) if waiter_in == "another-redlock" else redlock
    third = await make_redlock(queue=True, retry_delay=SLOW)
    ended: collections.Counter[str] = collections.Counter()
    for k in TURNS:
        holder = redlock.lock("turns", ttl=30)
        assert await holder.acquire(blocking=False), k
        first = other.lock("turns", ttl=30, acquire_timeout=20)
        second = third.lock("turns", ttl=30)
        held = await cancel_first_around_release(
            k,
            holder,
            first,
            second,
            lambda n: in_line(cluster, "turns", n),
            lambda: f"values {values_on(cluster, 'turns')}",
        )
        ended["held it" if held else "cancelled waiting"] += 1
        await assert_nothing_left(cluster)
    print(f"{waiter_in}: {dict(ended)}")  # how W1 ended over the sweep (timing decides it)


async def cancel_first_around_release(
    k: int,
    holder: Lock,
    first: Lock,
    second: Lock,
    in_line: Callable[[int], Awaitable[None]],
    nodes_hold: Callable[[], str],
) -> bool:
    """One step of a sweep over the moment of cancellation, for any primitive in the grant queue: *holder*
    holds; *first* (W1, in ``async with``, then holding for 30 s) and *second* (W2) wait in line (*in_line(n)*
    returns once every node keeps n waiters there).
    The holder releases, the nodes grant W1, which is cancelled *k* loop turns later (k < 0: before the
    release's script is written), before or after its grant, counted or not. W2 must then hold promptly
    (*nodes_hold* says what the nodes hold, for the failure's message); both end released. Returns whether
    W1 had entered its body."""
    entered = asyncio.Event()

    async def take_and_hold() -> None:
        async with first:
            entered.set()
            await asyncio.sleep(30)

    w1 = asyncio.create_task(take_and_hold())
    await in_line(1)
    w2 = asyncio.create_task(second.acquire(timeout=20))
    await in_line(2)
    await asyncio.sleep(0.1)  # both entered again once listening: they wait for grants now
    if k < 0:
        asyncio.get_running_loop().call_soon(w1.cancel)  # runs before the release's script is written
    releasing = asyncio.ensure_future(holder.release())
    for _ in range(max(k, 0)):
        await asyncio.sleep(0)
    if k >= 0:
        w1.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await w1
    done, _ = await asyncio.wait({w2}, timeout=PROMPT)  # (a timeout around `await w2` would cancel it)
    if not done:
        w2.cancel()
        raise AssertionError(f"k={k}: W2 not served within {PROMPT} s; {nodes_hold()}, W1 entered: {entered.is_set()}")
    assert w2.result(), k
    waited = time.monotonic() - started
    assert waited < PROMPT, (k, waited)
    await releasing
    assert not first.held
    await second.release()
    return entered.is_set()


# -- 5. killed processes ---------------------------------------------------------------------------------------


async def test_a_holder_killed_without_releasing_is_followed_after_its_ttl(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """Another process takes the lock (ttl 1 s, no watchdog) and is SIGKILLed; our waiter, queued with
    a retry delay of 0.3 s, gets the lock once the key ran out, by entering its line again: not before
    the dead holder's validity ended (exclusion), and within ttl + 1.5 retry delays + 1 s of the kill."""
    ttl = 1.0
    child = await start_child(cluster.urls, "wait", "killed-holder", "0.3", str(ttl), "60")
    try:
        assert "started" in await next_event(child, 15)
        held = await next_event(child, 5)
        assert held["ok"], held
        redlock = await make_redlock(queue=True, retry_delay=0.3)
        waiter = redlock.lock("killed-holder", ttl=ttl, auto_extend=False)
        waiting = asyncio.create_task(waiter.acquire(timeout=10))
        await in_line(cluster, "killed-holder", 1)
        killed = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        await child.wait()
        async with asyncio.timeout(ttl + 3):
            assert await waiting
        acquired = time.monotonic()
    finally:
        await kill_child(child)
    assert acquired >= held["valid_until"], (acquired, held["valid_until"])
    assert acquired - killed < ttl + 1.5 * 0.3 + 1.0, acquired - killed
    await waiter.release()
    await assert_nothing_left(cluster)


@pytest.mark.slow
@pytest.mark.parametrize("release", ["at-once", "after-the-entry-life"])
async def test_a_waiter_killed_in_line_delays_the_others_by_a_ttl_at_most(
    cluster: Cluster, make_redlock: MakeRedlock, release: str
) -> None:
    """We hold; another process waits first in line (ttl 1 s, retry delay 0.2 s: its entry lives 1 s),
    our waiter W behind it; the process is SIGKILLed. Released at once, the key may go to the dead
    waiter's live entry and run out after its ttl: W holds the lock within ttl + an entry's life + 1 s.
    Released once the dead entry expired, the release itself hands the key to W on every node (read
    right after it: a state, not a time, so a loaded box cannot fail it)."""
    redlock = await make_redlock(queue=True, retry_delay=0.2)
    holder = redlock.lock("killed-waiter", ttl=30)
    assert await holder.acquire(blocking=False)
    child = await start_child(cluster.urls, "wait", "killed-waiter", "0.2", "1", "60")
    try:
        assert "started" in await next_event(child, 15)
        await in_line(cluster, "killed-waiter", 1)
        waiter = redlock.lock("killed-waiter", ttl=30)
        waiting = asyncio.create_task(waiter.acquire(timeout=15))
        await in_line(cluster, "killed-waiter", 2)
        os.kill(child.pid, signal.SIGKILL)
        await child.wait()
        if release == "after-the-entry-life":
            await asyncio.sleep(1.5)  # the entry's life is 1 s since its last entering
        released = time.monotonic()
        await holder.release()
        handed = values_on(cluster, "killed-waiter")  # who the release gave the key to, on each node
        async with asyncio.timeout(5):
            assert await waiting
        waited = time.monotonic() - released
    finally:
        await kill_child(child)
    if release == "after-the-entry-life":
        assert waiter.token is not None
        assert handed == [waiter.token.encode()] * len(cluster), (handed, waiter.token)
    else:
        assert waited < 1.0 + 1.0 + 1.0, waited
    await waiter.release()
    await assert_nothing_left(cluster, within=2.5)  # the dead waiter's entries expire (1 s)


# -- 6. faults ---------------------------------------------------------------------------------------------------


async def contend_through_faults(
    faulty: Cluster, seconds: float, chaos: Callable[[], Awaitable[None]], ttl: float = 1.0
) -> tuple[History, list[tuple[float, list[Vote]]], int]:
    """Two queue=True Redlocks (3 + 2 tasks) on one key for *seconds* while *chaos* runs; the history,
    each grant's (start, votes), and the timeouts."""
    history = History()
    votes: list[tuple[float, list[Vote]]] = []
    timeouts = [0]
    stop = time.monotonic() + seconds

    async def client(name: str, redlock: Redlock) -> None:
        lock = redlock.lock("faults", acquire_timeout=8)
        while time.monotonic() < stop:
            try:
                async with lock:
                    votes.append((time.monotonic(), [o.vote for o in lock.outcomes]))
                    with history.section(name, lock):
                        await asyncio.sleep(0.0005)
            except LockNotAcquired:
                timeouts[0] += 1
            await asyncio.sleep(0.001)

    redlocks = [Redlock(faulty.urls, queue=True, ttl=ttl, retry_delay=0.2) for _ in range(2)]
    try:
        for redlock in redlocks:
            await redlock.connect()
        async with asyncio.timeout(seconds + 20):
            await asyncio.gather(chaos(), *(client(f"r{n % 2}.{n}", redlocks[n % 2]) for n in range(5)))
    finally:
        for i in range(len(faulty)):
            faulty[i].resume()
        for redlock in redlocks:
            await redlock.aclose()
    assert_no_library_tasks()
    return history, votes, timeouts[0]


@pytest.mark.slow
async def test_contention_with_a_paused_node(faulty: Cluster) -> None:
    """Node 4 is SIGSTOPped for 1.5 s, then node 0 for 1 s, mid-contention: no overlap, grants keep
    coming while a node is paused, and no key is left once the runs are over (a paused node's keys
    run out after their ttl, its entries after their life)."""
    paused: list[tuple[float, float]] = []

    async def pause(i: int, seconds: float) -> None:
        await asyncio.to_thread(faulty[i].pause)
        began = time.monotonic()
        await asyncio.sleep(seconds)
        paused.append((began, time.monotonic()))
        await asyncio.to_thread(faulty[i].resume)

    async def chaos() -> None:
        await asyncio.sleep(0.3)
        await pause(4, 1.5)
        await asyncio.sleep(0.3)
        await pause(0, 1.0)

    history, _, timeouts = await contend_through_faults(faulty, 3.8, chaos)
    history.check()
    during = [sum(b <= s.start < e for b, e in paused) for s in history.sections]
    print(f"grants {len(history.sections)}, while paused {sum(during)}, timeouts {timeouts}")
    assert timeouts == 0
    assert len(history.sections) >= 100, len(history.sections)
    assert sum(during) >= 20, sum(during)
    assert await eventually(lambda: keys_everywhere(faulty) == [[]] * len(faulty), 3.0), keys_everywhere(faulty)


@pytest.mark.slow
async def test_contention_with_a_node_restarted_empty(faulty: Cluster) -> None:
    """Node 2 is restarted without its data mid-contention (its keys and lines are gone), then node 3:
    no overlap, grants go on, and a restarted node counts toward no grant for its quarantine (ttl)."""
    ttl = 1.0
    restarts: list[tuple[int, float]] = []

    async def chaos() -> None:
        await asyncio.sleep(0.4)
        await asyncio.to_thread(faulty[2].restart, keep_data=False)
        restarts.append((2, time.monotonic()))
        await asyncio.sleep(ttl + 0.5)
        await asyncio.to_thread(faulty[3].restart, keep_data=False)
        restarts.append((3, time.monotonic()))

    history, votes, timeouts = await contend_through_faults(faulty, 4.0, chaos, ttl=ttl)
    history.check()
    print(f"grants {len(history.sections)}, timeouts {timeouts}")
    assert timeouts == 0
    assert len(history.sections) >= 100, len(history.sections)
    for node, restarted in restarts:
        # Quarantined for ttl + drift from when the client sees it back (after `restarted`).
        quarantined = [v for t, v in votes if restarted <= t < restarted + ttl * 0.9]
        assert quarantined, (node, "no grant during the quarantine")
        assert all(v[node] is not Vote.YES for v in quarantined), (node, quarantined[:5])
    assert await eventually(lambda: keys_everywhere(faulty) == [[]] * len(faulty), 3.0), keys_everywhere(faulty)


@pytest.mark.slow
async def test_the_restart_quarantine_holds_for_grants_from_the_queue(faulty: Cluster) -> None:
    """The analysis sequence, queued: A holds nodes 0, 1, 2 (ttl 2 s, no watchdog; 3 and 4 free and
    their lines empty); B waits in line. Node 2 restarts empty: B's entry there is granted at once, as
    on 3 and 4 — three nodes — but node 2 sits out its quarantine, so B may hold the lock only once
    A's validity ended."""
    ttl = 2.0
    async with Redlock(faulty.urls, queue=True, ttl=ttl) as a, Redlock(faulty.urls, queue=True, ttl=ttl) as b:
        holder = a.lock("analysis", auto_extend=False)
        for i in (3, 4):
            faulty[i].command("SET", "redlock:analysis", "someone else", "PX", 60_000)
        assert await holder.acquire(blocking=False)
        valid_until = time.monotonic() + holder.validity
        for i in (3, 4):
            faulty[i].command("DEL", *queue_keys(b"redlock:analysis"))
        assert [faulty[i].command("EXISTS", "redlock:analysis") for i in range(5)] == [1, 1, 1, 0, 0]
        waiter = b.lock("analysis", auto_extend=False)
        waiting = asyncio.create_task(waiter.acquire(timeout=10))
        # B holds 3 and 4 (granted on entering), and waits in line on 0, 1 and 2.
        assert await eventually(lambda: line_lengths(faulty, "analysis")[:3] == [1, 1, 1], 2.0)
        await asyncio.to_thread(faulty[2].restart, keep_data=False)
        async with asyncio.timeout(ttl + 5):
            assert await waiting
        acquired = time.monotonic()
        assert acquired >= valid_until, (acquired, valid_until)
        await waiter.release()
    assert await eventually(lambda: keys_everywhere(faulty) == [[]] * len(faulty), 2.0), keys_everywhere(faulty)


@pytest.mark.slow
@pytest.mark.serial
async def test_nodes_wiped_under_a_holder_grant_nothing_to_the_waiter(faulty: Cluster) -> None:
    """A holds on all 5 nodes (ttl 30 s); B waits in line (re-entering every ~0.2 s); nodes 0 and 1
    are wiped (FLUSHALL: A's key and B's entries go). B's next entries are granted there at once: 2
    nodes, no majority; it must not hold the lock while A holds 3, and must hold it promptly once A
    releases; nothing is left after."""
    async with Redlock(faulty.urls, queue=True) as a, Redlock(faulty.urls, queue=True, retry_delay=0.2) as b:
        holder = a.lock("wiped", ttl=30)
        assert await holder.acquire(blocking=False)
        waiter = b.lock("wiped", ttl=30)
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        await in_line(faulty, "wiped", 1)
        for i in (0, 1):
            faulty[i].command("FLUSHALL")
        token = holder.token
        assert token is not None
        assert await eventually(lambda: values_on(faulty, "wiped")[:2] != [None, None], 2.0)  # B's now
        await asyncio.sleep(1.0)
        assert not waiting.done(), "B holds the lock while A holds 3 nodes of 5"
        assert values_on(faulty, "wiped")[2:] == [token.encode()] * 3
        released = time.monotonic()
        await holder.release()
        async with asyncio.timeout(PROMPT):
            assert await waiting
        assert time.monotonic() - released < PROMPT
        await waiter.release()
    assert await eventually(lambda: keys_everywhere(faulty) == [[]] * len(faulty), 2.0), keys_everywhere(faulty)


# -- 7. uvloop ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.serial
def test_contention_on_uvloop(cluster: Cluster) -> None:
    """On uvloop, whatever REDLOCK_TEST_LOOP says: two queue=True Redlocks (3 + 2 tasks, retry delay
    SLOW) on one key, each task taking it ROUNDS times: no overlap, every task served, every acquire by
    the line (no wait as long as a fallback timer: with SLOW, only grants move the lock sooner), and
    nothing left."""

    async def main() -> None:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        async with (
            Redlock(cluster.urls, queue=True, retry_delay=SLOW) as first,
            Redlock(cluster.urls, queue=True, retry_delay=SLOW) as second,
        ):
            run = await contend(
                cluster, [("a", first, 3), ("b", second, 2)], "uvloop", 60.0, retry_delay=SLOW, rounds=ROUNDS
            )
        run.history.check()
        print(f"grants {run.grants}, longest waits {run.longest}")
        assert run.timeouts == 0
        assert len(run.grants) == 5, run.grants
        assert set(run.grants.values()) == {ROUNDS}, run.grants
        assert max(run.longest.values()) < SLOW / 2, run.longest  # by the line, never by a fallback timer
        await assert_nothing_left(cluster)
        assert_no_library_tasks()

    uvloop.run(main())


# -- 8. bad input -------------------------------------------------------------------------------------------------


def test_the_queue_is_the_default_where_grants_are_published(cluster: Cluster) -> None:
    """queue=None (the default) resolves to wait_for_release: the grant queue unless polling was asked for."""
    assert Redlock(cluster.urls).settings.queue is True
    assert Redlock(cluster.urls, fencing=True).settings.queue is True
    assert Redlock(cluster.urls, queue=None).settings.queue is True
    assert Redlock(cluster.urls, wait_for_release=False).settings.queue is False
    assert Redlock(cluster.urls, queue=False).settings.queue is False
    assert isinstance(strategy_of(Redlock(cluster.urls).lock("a")), Queued)
    assert isinstance(strategy_of(Redlock(cluster.urls).lock_many(["a", "b"])), Queued)
    assert not isinstance(strategy_of(Redlock(cluster.urls, queue=False).lock("a")), Queued)


def test_the_queue_takes_fencing_and_refuses_non_bools(cluster: Cluster) -> None:
    # queue=True with fencing=True: tests/test_queue_fencing.py.
    Redlock(cluster.urls, queue=True, fencing=True)
    redlock = Redlock(cluster.urls, queue=True)
    redlock.lock("fenced", fencing=True)
    redlock.lock_many(["a", "b"], fencing=True)
    with pytest.raises(TypeError, match=r"queue must be True or False, got str"):
        Redlock(cluster.urls, queue="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"queue must be True or False, got int"):
        Redlock(cluster.urls, queue=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"queue=True needs wait_for_release=True"):
        Redlock(cluster.urls, queue=True, wait_for_release=False)


if __name__ == "__main__":
    child_main(sys.argv[1:])
