"""The hand-over: a release whose next waiter in line waits in the same Redlock sends that waiter's
round right behind its compare-and-delete, in one write per node, and wakes it to count it. That is
the hand-off of release words (``queue=False``): every Redlock here says so (the default is the grant
queue, tests/test_queue*.py).

Checked here against real servers: that hand-overs happen and cost no extra round; that a waiter
cancelled (or timing out) in the loop turn it is handed the lock leaves nothing behind and lets the
next waiter in at once; that waiters of another Redlock and of another OS process are neither
overlapped nor starved (MAX_CHAIN); that exclusion and fencing hold under paused and wiped nodes;
and the same on uvloop.

``python -m tests.test_handover contend URLS NAME SECONDS TASKS RETRY_DELAY`` and ``... wait URLS NAME`` are
the other OS process of these tests (see :func:`child_main`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvloop

from redlock_async import LockNotAcquired, Redlock
from redlock_async._rounds import _requests
from redlock_async._shared._handoff import Listener
from redlock_async.lock import Lock
from redlock_async.testing import History
from redlock_async.testing._history import Section

from .conftest import (
    Cluster,
    MakeRedlock,
    assert_no_library_tasks,
    calls,
    eventually,
    finish_child,
    keys_everywhere,
    passed_over,
    start_module,
)

SLOW = 5.0
"""A retry delay so long (a first fallback try after 2.5 s at the earliest) that within these tests
only a hand-over or a release's words can explain a waiter's prompt grant."""

DOCUMENTED_CHAIN = 8
"""MAX_CHAIN as docs/algorithm.md states it: hand-overs in a row before a release is told to everyone
(spelled out, not imported, so that a change of the bound shows here)."""

PROMPT = 1.0
"""How soon a waiter must get the lock once it is free: well under SLOW / 2, robust on a loaded box."""

ROOT = Path(__file__).resolve().parent.parent


# -- helpers -------------------------------------------------------------------------------------


def lock_keys_left(cluster: Cluster) -> list[list[bytes]]:
    """The lock keys (``redlock:*``: not the fence counters, nor the restart-quarantine marker ``redlock:``)."""
    return [[key for key in keys if key.startswith(b"redlock:")] for keys in keys_everywhere(cluster)]


async def assert_no_lock_key(cluster: Cluster, within: float = PROMPT) -> None:
    assert await eventually(lambda: lock_keys_left(cluster) == [[]] * len(cluster), within), lock_keys_left(cluster)


@contextlib.contextmanager
def counting(cls: object, method: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count the calls of *cls.method* (a class's or a module's; still called through) while the block runs:
    ``count[0]``."""
    count = [0]
    original: Callable[..., Any] = getattr(cls, method)

    def spy(self: Any, *args: Any) -> Any:
        count[0] += 1
        return original(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(cls, method, spy)
        yield count


async def queued(*tasks: asyncio.Task[Any]) -> None:
    """Let each task reach its wait in line, in the order given (each gets its own ticket first)."""
    for task in tasks:
        await asyncio.sleep(0.05)
        assert not task.done(), task


# -- 1. hand-overs happen, and cost no extra round ------------------------------------------------


async def contend_in_one_redlock(redlock: Redlock, name: str, seconds: float, tasks: int = 4) -> History:
    """*tasks* tasks of *redlock* take *name* with ``async with`` (2 ms bodies) for *seconds*.

    Not shorter: uvloop's timers count whole milliseconds, and a body that ends at once releases
    before the previous holder is back in line (no waiter: the release is told, and the ones coming
    back try at once, some in vain), which is not what is measured here."""
    history = History()
    stop = time.monotonic() + seconds

    async def worker(n: int) -> None:
        lock = redlock.lock(name, acquire_timeout=10)
        while time.monotonic() < stop:
            async with lock:
                with history.section(f"task{n}", lock):
                    await asyncio.sleep(0.002)

    async with asyncio.timeout(seconds + 15):
        await asyncio.gather(*(worker(n) for n in range(tasks)))
    return history


async def test_hand_overs_happen_and_cost_no_extra_round(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """4 tasks of one Redlock on one key for 1 s: each grant is one SET per node (the hand-over's round
    is the waiter's own, only sent sooner), only 1 release in MAX_CHAIN + 1 is announced (the others
    hand the lock over silently), and every grant but the first was a wake-up."""
    redlock = await make_redlock(queue=False, retry_delay=2.0)
    nodes = len(cluster)
    sets, published = calls(cluster, "set"), calls(cluster, "publish")
    history = await contend_in_one_redlock(redlock, "busy", 1.0)
    rounds = (calls(cluster, "set") - sets) / nodes
    told = (calls(cluster, "publish") - published) / nodes  # releases that published their words on every node
    history.check()
    grants = len(history.sections)
    # Hundreds normally; without working hand-overs (the round lost to the release, and no word),
    # each grant waits for a fallback timer of 1-3 s: a handful.
    assert grants >= 50, grants
    # At the start 3 tasks find it held (and one looks again once it listens); then none but the
    # hand-overs and the woken waiters' rounds (the fallback timers fire after 1 s at the earliest).
    assert rounds <= grants * 1.05 + 8, (rounds, grants)
    period = DOCUMENTED_CHAIN + 1
    assert told <= grants / period + 6, (told, grants)  # hand-overs: their releases tell no one
    assert told >= grants / period - 2, (told, grants)  # but the chain is bounded: every 9th release is told
    assert redlock.statistics().wakeups >= grants - 8, (redlock.statistics().wakeups, grants)
    await assert_no_lock_key(cluster)


# -- 2. a waiter cancelled (or giving up) in the turn it is handed the lock ---------------------------


ORDERS = ("cancel-after-the-hand-over", "cancel-before-the-hand-over", "cancel-once-released")


@pytest.mark.serial
@pytest.mark.parametrize("order", ORDERS)
async def test_a_waiter_cancelled_as_it_is_handed_the_lock_leaves_nothing(
    cluster: Cluster, make_redlock: MakeRedlock, monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """Holder H, waiters W1 then W2 of one Redlock (ttl 30 s: a key left behind would block W2 for
    good). H's release hands the lock over to W1, which is cancelled:

    * after the hand-over, in the same loop turn (its wake-up is scheduled, it has not run);
    * before it, in the same loop turn (its wait's future is cancelled, the hand-over still picks it);
    * once H's release returned (W1 counts its round, or holds the lock in its body).

    W1's round must be given back, W2 must get the lock at once (its fallback timer is seconds
    away), and nothing stays on any node once W2 releases."""
    redlock = await make_redlock(queue=False, retry_delay=SLOW)
    holder = redlock.lock("cancelled", ttl=30)
    assert await holder.acquire(blocking=False)
    first, second = redlock.lock("cancelled", ttl=30, acquire_timeout=20), redlock.lock("cancelled", ttl=30)
    entered = asyncio.Event()

    async def take_and_hold() -> None:
        async with first:
            entered.set()
            await asyncio.sleep(30)

    w1 = asyncio.create_task(take_and_hold())
    w2 = asyncio.create_task(second.acquire(timeout=20))
    await queued(w1, w2)
    loop = asyncio.get_running_loop()
    sets = calls(cluster, "set")
    wakeups = redlock.statistics().wakeups
    with counting(_requests, "give_back", monkeypatch) as given_back:  # a round given back (only Lock does)
        if order == "cancel-before-the-hand-over":
            loop.call_soon(w1.cancel)  # runs in the next loop turn, just before the release's first step
        releasing = asyncio.ensure_future(holder.release())
        if order == "cancel-after-the-hand-over":
            loop.call_soon(w1.cancel)  # runs in the next loop turn, just after the release's first step
        await releasing
        if order == "cancel-once-released":
            w1.cancel()
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await w1
        async with asyncio.timeout(PROMPT):
            assert await w2
        waited = time.monotonic() - started
    assert second.held
    assert waited < PROMPT
    if order == "cancel-after-the-hand-over":
        # W1 was handed a round (5 SETs), never counted it, and gave it back; W2 sent its own.
        assert given_back[0] == 1
        assert (calls(cluster, "set") - sets) == 2 * len(cluster)
        assert redlock.statistics().wakeups == wakeups + 2  # W1 by the hand-over, W2 by W1's passing its turn on
    else:
        assert given_back[0] <= 1
    assert not entered.is_set() or order == "cancel-once-released"
    await second.release()
    await assert_no_lock_key(cluster)


IMPATIENCE = ("acquire-timeout", "asyncio-timeout", "anyio-move-on-after", "anyio-cancel-scope")
OFFSETS_MS = (-3.0, -1.5, -1.0, -0.5, -0.25, 0.0, 0.0, 0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0)
"""When the impatient waiter gives up, relative to the release that hands it the lock."""


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("how", IMPATIENCE)
async def test_waiters_giving_up_as_the_lock_is_handed_to_them(
    cluster: Cluster, make_redlock: MakeRedlock, how: str
) -> None:
    """A sweep: the holder's release is armed for a loop time T; waiter W1 gives up at T + offset
    (its acquire timeout, asyncio.timeout, anyio's move_on_after, or an anyio scope cancelled from a
    timer), W2 waits behind it. Whatever W1 ends with (the lock, or nothing), W2 gets the lock
    promptly, and no key is left on any node once everyone released."""
    redlock = await make_redlock(queue=False, retry_delay=SLOW)
    loop = asyncio.get_running_loop()
    ended: collections.Counter[str] = collections.Counter()
    for offset in OFFSETS_MS:
        holder = redlock.lock("impatient", ttl=30)
        assert await holder.acquire(timeout=PROMPT)
        when = loop.time() + 0.1
        deadline = when + offset / 1000
        impatient = redlock.lock(
            "impatient", ttl=30, acquire_timeout=max(deadline - loop.time(), 0.001) if how == "acquire-timeout" else 20
        )

        async def give_up(impatient: Lock = impatient, deadline: float = deadline) -> str:
            try:
                if how == "acquire-timeout":
                    async with impatient:
                        await asyncio.sleep(0.002)
                elif how == "asyncio-timeout":
                    async with asyncio.timeout_at(deadline), impatient:
                        await asyncio.sleep(0.002)
                elif how == "anyio-move-on-after":
                    with anyio.move_on_after(deadline - anyio.current_time()) as scope:
                        async with impatient:
                            await asyncio.sleep(0.002)
                    if scope.cancelled_caught:
                        return "timed out"
                else:
                    with anyio.CancelScope() as scope:
                        loop.call_at(deadline, scope.cancel)
                        async with impatient:
                            await asyncio.sleep(0.002)
                    if scope.cancelled_caught:
                        return "cancelled"
            except (LockNotAcquired, TimeoutError) as exc:
                return type(exc).__name__
            return "held it"

        w1 = asyncio.create_task(give_up())
        await asyncio.sleep(0.01)
        second = redlock.lock("impatient", ttl=30)
        w2 = asyncio.create_task(second.acquire(timeout=20))
        await asyncio.sleep(0.01)
        releasing: list[asyncio.Future[None]] = []

        def release(holder: Lock = holder, releasing: list[asyncio.Future[None]] = releasing) -> None:
            releasing.append(asyncio.ensure_future(holder.release()))

        loop.call_at(when, release)
        async with asyncio.timeout(0.1 + PROMPT):
            assert await w2, f"offset {offset} ms"
            ended[await w1] += 1
            await releasing[0]
        await second.release()
        assert not impatient.held
        await assert_no_lock_key(cluster)
    print(f"{how}: {dict(ended)}")  # how W1 ended, over the sweep (for the log; timing decides it)


# -- 3. another Redlock, another process: exclusion, and no starvation ------------------------------------


async def start_child(cluster: Cluster, *args: str) -> asyncio.subprocess.Process:
    return await start_module("tests.test_handover", args[0], ",".join(cluster.urls), *args[1:])


BOUND = 10.0
"""The longest any client may wait for the lock while others keep taking it (and the acquire timeout
of every client in these tests: a starved one fails loudly). Generous: before the chain's last release
went to other processes first, another process's waiter was seen waiting up to 4.5 s on an idle box
(test_a_waiter_of_another_process_is_served_when_a_chain_ends checks the tight bound)."""


@dataclasses.dataclass
class Contention:
    history: History
    longest: dict[str, float]
    """Each client's longest wait for the lock."""
    grants: dict[str, int]
    child_wakeups: int
    """The child's Redlock's wake-ups (by a release's words, or by a hand-over within the child)."""

    def ours(self) -> int:
        return sum(n for client, n in self.grants.items() if client.startswith("r"))

    def children(self) -> int:
        return sum(n for client, n in self.grants.items() if client.startswith("pid"))


async def contend_against_a_child(
    cluster: Cluster,
    redlocks: list[Redlock],
    tasks: list[int],
    seconds: float,
    child_tasks: int = 2,
    retry_delay: float = SLOW,
    rounds: int | None = None,
) -> Contention:
    """Tasks of *redlocks* (``tasks[i]`` of the i-th) and *child_tasks* tasks of another OS process take
    one fenced key until the child is done (*seconds* of its own; with *rounds*, once each of its tasks
    held it that many times, within *seconds*)."""
    history = History()
    longest: dict[str, float] = collections.defaultdict(float)
    more = () if rounds is None else (str(rounds),)
    child = await start_child(cluster, "contend", "mixed", str(seconds), str(child_tasks), str(retry_delay), *more)
    finished = asyncio.Event()

    async def worker(client: str, redlock: Redlock) -> None:
        lock = redlock.lock("mixed", acquire_timeout=BOUND)
        while not finished.is_set():
            wanted = time.monotonic()
            async with lock:
                longest[client] = max(longest[client], time.monotonic() - wanted)
                with history.section(client, lock):
                    await asyncio.sleep(0.0005)

    workers = [
        asyncio.create_task(worker(f"r{r}.{n}", redlock)) for r, redlock in enumerate(redlocks) for n in range(tasks[r])
    ]
    try:
        rows = await finish_child(child, seconds + BOUND + 10)
    finally:
        finished.set()
        async with asyncio.timeout(BOUND + 5):
            await asyncio.gather(*workers)
    statistics = rows.pop()
    for client, token, fencing_token, start, end, waited in rows:
        history.sections.append(Section(client, token, fencing_token, start, end))
        longest[client] = max(longest[client], waited)
    grants = collections.Counter(section.client for section in history.sections)
    return Contention(history, dict(longest), dict(grants), statistics["wakeups"])


@pytest.mark.slow
async def test_another_process_is_not_starved_by_hand_overs(
    cluster: Cluster, make_redlock: MakeRedlock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 tasks of one Redlock want the lock back at once, all the time, and would hand it over to
    each other for good; the other process's waiters (no fallback timer within the test: SLOW) get it
    within BOUND because after MAX_CHAIN hand-overs a release goes to every process's waiters."""
    redlock = await make_redlock(queue=False, retry_delay=SLOW, fencing=True)
    with counting(Listener, "hand_over", monkeypatch) as handed:
        run = await contend_against_a_child(cluster, [redlock], [4], seconds=2.5)
    run.history.check()
    print(f"grants {run.grants}, longest waits {run.longest}, hand-overs {handed[0]}")
    assert len(run.grants) == 6, run.grants  # both of the child's tasks got the lock, each time within BOUND
    assert max(run.longest.values()) < BOUND, run.longest
    assert run.ours() >= 50, run.grants
    assert handed[0] >= run.ours() / 2, (handed[0], run.ours())  # most of our grants were hand-overs meanwhile
    await assert_no_lock_key(cluster)


@pytest.mark.slow
async def test_a_waiter_of_another_process_is_served_when_a_chain_ends(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """The other process's single waiter is woken only by releases that end a chain (the others tell no
    one): it must mostly get the lock when woken (6 times in 10 at least: ~10 in 10 on an idle box,
    8 to 10 under a CPU hog on both cores), so that it waits for about one chain of MAX_CHAIN
    hand-overs, not for many: between two of its grants this process has at most 10 chains' worth
    (DOCUMENTED_CHAIN grants each; 12 to 18 grants seen; before the chain's last release went to other
    processes first, the child waited through ~1500).
    The child takes the lock 100 times (a count, not 2 s: a loaded box slows it, and 2 s gave 22
    wake-ups once, against a floor of 20).

    Before the chain's last release went to other processes first, the releasing process's own next
    waiter raced for it and mostly won (it hears the words in the loop turn its replies come, awake
    and busy): the other process's waiter won 1 to 42% of those races on an idle box, and waited up
    to 4.5 s while this process took ~1500 grants."""
    redlock = await make_redlock(queue=False, retry_delay=SLOW, fencing=True)
    run = await contend_against_a_child(cluster, [redlock], [4], seconds=60.0, child_tasks=1, rounds=100)
    run.history.check()
    owners = [s.client.split(".")[0] for s in sorted(run.history.sections, key=lambda s: s.start)]
    without = passed_over(owners)
    print(f"grants {run.grants}, child wake-ups {run.child_wakeups}, grants to others between two {without}")
    assert run.children() == 100, run.grants
    assert run.child_wakeups >= 20, run.child_wakeups
    assert run.children() >= 0.6 * run.child_wakeups, (run.children(), run.child_wakeups)
    assert max(without.values()) <= 10 * DOCUMENTED_CHAIN, without


@pytest.mark.slow
async def test_two_redlocks_and_another_process_exclude_each_other(
    cluster: Cluster, make_redlock: MakeRedlock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiters of two Redlocks of this process (one queue: the lock is handed over within each, told
    to the other) and of another process on one fenced key: one history across processes, no overlap,
    fencing tokens growing, and no one waiting long."""
    # Not SLOW: with 3 or more rounds at once the votes can split so that no round wins, and each
    # gives back on a minority of nodes: no release word reaches a majority, and every waiter sleeps
    # until its fallback timer (seen here: everyone waiting 2.6 to 4.1 s with SLOW).
    redlocks = [await make_redlock(queue=False, retry_delay=1.0, fencing=True) for _ in range(2)]
    with counting(Listener, "hand_over", monkeypatch) as handed:
        run = await contend_against_a_child(cluster, redlocks, [3, 1], seconds=2.0, retry_delay=1.0)
    run.history.check()
    print(f"grants {run.grants}, longest waits {run.longest}, hand-overs {handed[0]}")
    assert len(run.grants) == 6, run.grants  # every task of both Redlocks and of the child got the lock
    assert max(run.longest.values()) < BOUND, run.longest
    # A release hands over when the next in line waits in the same Redlock (3 tasks of 4 are in one):
    # some do, the others are told to the other Redlock (and process) by their words.
    assert 0 < handed[0] < run.ours(), (handed[0], run.ours())
    await assert_no_lock_key(cluster)


# -- a lock_many waiter handed a round it cannot win ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("waiter_in", ["another-redlock", "the-releasers-redlock"])
async def test_a_release_handed_to_a_lock_many_waiter_that_loses_still_frees_the_key_for_others(
    cluster: Cluster, make_redlock: MakeRedlock, monkeypatch: pytest.MonkeyPatch, waiter_in: str
) -> None:
    """H holds "a", "b" is held; W = lock_many(["a", "b"]) waits for "a" (first in line in this
    process), and another process waits for "a" too (retry_delay 10 s: it relies on the words).
    H releases "a": handed over to W when W waits in H's Redlock, whose round (all or none) fails
    on "b". "a" is free then: the other process must hear of it and get it promptly, as it does
    when W waits in another Redlock (H's release is then announced)."""
    redlock = await make_redlock(queue=False, retry_delay=10.0)
    other = await make_redlock(queue=False, retry_delay=10.0)
    holder, blocker = redlock.lock("a"), redlock.lock("b")
    assert await holder.acquire(blocking=False)
    assert await blocker.acquire(blocking=False)
    waiter = (redlock if waiter_in == "the-releasers-redlock" else other).lock_many(["a", "b"], acquire_timeout=30)
    waiting = asyncio.create_task(waiter.acquire())
    child = await start_child(cluster, "wait", "a")
    try:
        # Both processes listen on "a" (one subscriber connection per Redlock and node).
        def listening() -> bool:
            return int(cluster[0].command("PUBSUB", "NUMSUB", "redlock:a")[1]) >= 2  # type: ignore[index]

        assert await eventually(listening, 10.0)
        await asyncio.sleep(0.2)  # the child made its attempts and waits for a word
        released = time.monotonic()
        with counting(Listener, "hand_over", monkeypatch) as handed:
            await holder.release()
        assert handed[0] == (waiter_in == "the-releasers-redlock")  # the case is the one meant
        assert child.stdout is not None
        async with asyncio.timeout(2 * PROMPT):
            line = await child.stdout.readline()
        event = json.loads(line)
        assert event["acquired"] - released < PROMPT, event["acquired"] - released
        await finish_child(child, 10)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        await blocker.release()
        async with asyncio.timeout(PROMPT):
            assert await waiting
        await waiter.release()
    await assert_no_lock_key(cluster)


# -- 4. faults while the lock is handed over --------------------------------------------------------


@pytest.mark.slow
async def test_hand_overs_under_paused_and_wiped_nodes_keep_exclusion_and_fencing(
    faulty: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two Redlocks (4 + 2 tasks) on one fenced key while minorities of nodes are paused (SIGSTOP)
    and one node is restarted empty: no overlap, fencing tokens strictly growing across hand-overs,
    hand-overs keep happening while nodes are paused, and no lock key is left at the end."""
    ttl = 1.0
    history = History()
    paused: set[int] = set()
    handed_while_paused = [0]
    original = Listener.hand_over

    def hand_over(self: Listener, *args: Any) -> None:
        handed_while_paused[0] += bool(paused)
        original(self, *args)

    monkeypatch.setattr(Listener, "hand_over", hand_over)
    stop = time.monotonic() + 4.0

    async def pause(*indexes: int, seconds: float) -> None:
        for i in indexes:
            await asyncio.to_thread(faulty[i].pause)
            paused.add(i)
        await asyncio.sleep(seconds)
        for i in indexes:
            paused.discard(i)
            await asyncio.to_thread(faulty[i].resume)

    async def chaos() -> None:
        await asyncio.sleep(0.3)
        await pause(3, 4, seconds=0.6)
        await asyncio.sleep(0.2)
        await asyncio.to_thread(faulty[2].restart, keep_data=False)  # quarantined for ~ttl: one node out
        await pause(0, seconds=0.5)  # and one more: still a majority up
        await asyncio.sleep(ttl)  # node 2 is back in quorums
        await pause(1, 4, seconds=0.6)

    async def client(name: str, redlock: Redlock) -> None:
        lock = redlock.lock("faults", acquire_timeout=8)
        while time.monotonic() < stop:
            async with lock:
                with history.section(name, lock):
                    await asyncio.sleep(0.0005)

    redlocks = [Redlock(faulty.urls, queue=False, fencing=True, ttl=ttl, retry_delay=0.5) for _ in range(2)]
    try:
        for redlock in redlocks:
            await redlock.connect()
        async with asyncio.timeout(30):
            await asyncio.gather(chaos(), *(client(f"r{n % 2}.{n}", redlocks[n % 2]) for n in (0, 2, 4, 6, 1, 3)))
    finally:
        for i in range(len(faulty)):
            faulty[i].resume()
        for redlock in redlocks:
            await redlock.aclose()
    history.check()
    tokens = [s.fencing_token for s in sorted(history.sections, key=lambda s: s.start)]
    assert None not in tokens
    assert tokens == sorted(set(tokens)), "fencing tokens must strictly grow"  # type: ignore[type-var]
    assert len(history.sections) >= 100, len(history.sections)
    assert handed_while_paused[0] >= 10, handed_while_paused[0]
    # Keys whose release a paused node never got run out after ttl; nothing outlives that.
    assert await eventually(lambda: lock_keys_left(faulty) == [[]] * len(faulty), ttl + 1.0), lock_keys_left(faulty)
    assert_no_library_tasks()


# -- 5. uvloop ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.serial
def test_hand_overs_on_uvloop(cluster: Cluster) -> None:
    """On uvloop, whatever REDLOCK_TEST_LOOP says: two Redlocks' tasks contend (hand-overs within each),
    no overlap, hand-overs happen; then a waiter cancelled in the turn it is handed the lock leaves
    nothing behind and the next waiter gets it at once."""

    async def main() -> None:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        published = calls(cluster, "publish")
        # The default retry delay, not SLOW: when the two Redlocks' first rounds meet a third (one that
        # looks again once it listens), their votes can split so that none wins and no release word is
        # said on a majority; then everyone waits for a fallback timer (seen once in ~120 runs: SLOW
        # left 8 grants in the 0.8 s).
        async with Redlock(cluster.urls, queue=False) as first, Redlock(cluster.urls, queue=False) as second:
            histories = await asyncio.gather(
                contend_in_one_redlock(first, "uvloop", 0.8, tasks=3),
                contend_in_one_redlock(second, "uvloop", 0.8, tasks=2),
            )
            history = History()
            history.sections = histories[0].sections + histories[1].sections
            history.check()
            told = (calls(cluster, "publish") - published) / len(cluster)
            assert len(history.sections) >= 50, len(history.sections)
            assert told < len(history.sections) * 0.9, (told, len(history.sections))  # some were handed over

        async with Redlock(cluster.urls, queue=False, retry_delay=SLOW) as redlock:
            holder = redlock.lock("uvloop-cancel", ttl=30)
            assert await holder.acquire(blocking=False)
            w1 = asyncio.create_task(redlock.lock("uvloop-cancel", ttl=30).acquire(timeout=20))
            follower = redlock.lock("uvloop-cancel", ttl=30)
            w2 = asyncio.create_task(follower.acquire(timeout=20))
            await queued(w1, w2)
            releasing = asyncio.ensure_future(holder.release())
            asyncio.get_running_loop().call_soon(w1.cancel)
            await releasing
            with pytest.raises(asyncio.CancelledError):
                await w1
            async with asyncio.timeout(PROMPT):
                assert await w2
            await follower.release()
            await assert_no_lock_key(cluster)
        assert_no_library_tasks()

    uvloop.run(main())


# -- the other process --------------------------------------------------------------------------------


async def child_contend(
    urls: list[str], name: str, seconds: float, tasks: int, retry_delay: float, rounds: int | None = None
) -> None:
    """Tasks taking the fenced lock *name* for *seconds* (with *rounds*: until each held it that many times,
    within *seconds*); prints each critical section and how long its acquire waited: [client, token,
    fencing token, start, end, waited]."""
    rows: list[list[Any]] = []
    async with Redlock(urls, queue=False, fencing=True, retry_delay=retry_delay) as redlock:
        stop = time.monotonic() + seconds

        async def task(n: int) -> None:
            lock = redlock.lock(name, acquire_timeout=BOUND)
            done = 0
            while time.monotonic() < stop and (rounds is None or done < rounds):
                wanted = time.monotonic()
                async with lock:
                    start = time.monotonic()
                    await asyncio.sleep(0.0005)
                    row = [f"pid{os.getpid()}.{n}", lock.token, lock.fencing_token, start, time.monotonic()]
                    rows.append([*row, start - wanted])
                    done += 1
                await asyncio.sleep(0.001)

        await asyncio.gather(*(task(n) for n in range(tasks)))
        wakeups = redlock.statistics().wakeups
    for row in rows:
        print(json.dumps(row))
    print(json.dumps({"wakeups": wakeups}))


async def child_wait(urls: list[str], name: str) -> None:
    """Wait for *name* (relying on the release's words: a 10 s retry delay); print when it was acquired."""
    async with Redlock(urls, queue=False, retry_delay=10.0) as redlock:
        lock = redlock.lock(name, acquire_timeout=30)
        acquired = await lock.acquire()
        print(json.dumps({"acquired": time.monotonic(), "ok": acquired}), flush=True)
        if acquired:
            await lock.release()


def child_main(argv: list[str]) -> None:
    mode, urls = argv[0], argv[1].split(",")
    if mode == "contend":
        rounds = int(argv[6]) if len(argv) > 6 else None
        asyncio.run(child_contend(urls, argv[2], float(argv[3]), int(argv[4]), float(argv[5]), rounds))
    else:
        asyncio.run(child_wait(urls, argv[2]))


if __name__ == "__main__":
    child_main(sys.argv[1:])
