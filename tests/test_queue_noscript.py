"""The grant queue when the servers lose their scripts (``SCRIPT FLUSH``, a restart that kept its data).

Every script goes out as EVALSHA; a server that lost it answers NOSCRIPT and the node sends it again
as EVAL, after whatever was already on the wire. A waiter's leave (``QUEUE_LEAVE``) must run even
then: left out, the departed waiter keeps its place, the next release hands it the key, and the lock
sits with no one for a whole ttl. Checked here exactly as it was seen (one holder, two waiters, one of
them cancelled in the loop turn of the holder's release), and under a flush every few milliseconds
while waiters come, go and are cancelled: no gap with no holder, no key left once every client closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest
import redis
import redis.asyncio

from redlock_async import LockNotAcquired
from redlock_async._queue import queue_keys
from redlock_async._scripts import QUEUE_ENTER, QUEUE_LEAVE

from .conftest import CHILDREN_TIMEOUT, Cluster, MakeRedlock, eventually, keys_everywhere
from .test_queue import contend

PROMPT = 1.0
"""How soon the next waiter must hold a lock given up in its favour: one script run and one published
word on loopback (~1 ms); 1 s for a box of 2 noisy cores, still far below the ttl these tests use."""


def key_of(name: str) -> bytes:
    return b"redlock:" + name.encode()


def line_lengths(cluster: Cluster, name: str) -> list[int]:
    queue = queue_keys(key_of(name))[1]
    return [int(cluster[i].command("ZCARD", queue)) for i in range(len(cluster))]  # type: ignore[call-overload]


@pytest.mark.serial  # bounds on gaps and waits: load skews them
async def test_a_waiter_cancelled_as_the_holder_releases_after_a_script_flush_leaves_the_line(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """H holds, W1 and W2 wait in line; every node flushes its scripts; in one loop turn W1 is cancelled
    and H releases. W1's leave meets NOSCRIPT with H's release (on the same key) behind it on the wire:
    it must still run, before the release is sent again, so that the release hands the key to W2, not to
    the departed W1 (which held it on every node for the whole ttl: W2 got the lock 5.1 s later)."""
    redlock = await make_redlock(queue=True, ttl=5.0, retry_delay=5.0)
    holder = redlock.lock("flushed", owner="h")
    assert await holder.acquire(blocking=False)
    first, second = redlock.lock("flushed", owner="w1"), redlock.lock("flushed", owner="w2")
    w1 = asyncio.create_task(first.acquire(timeout=30))
    await asyncio.sleep(0.05)  # W1 enters the line first
    w2 = asyncio.create_task(second.acquire(timeout=30))
    assert await eventually(lambda: min(line_lengths(cluster, "flushed")) == 2, 10.0), line_lengths(cluster, "flushed")
    await asyncio.sleep(0.1)  # both listen, no script of theirs on the wire
    for i in range(len(cluster)):
        cluster[i].command("SCRIPT", "FLUSH")
    w1.cancel()  # its leave goes out when its task runs, in this loop turn, before ...
    release = asyncio.create_task(holder.release())  # ... the holder's release
    with contextlib.suppress(asyncio.CancelledError):
        await w1
    await release
    started = time.monotonic()
    async with asyncio.timeout(PROMPT):
        assert await w2
    assert time.monotonic() - started < PROMPT
    values = [cluster[i].command("GET", key_of("flushed")) for i in range(len(cluster))]
    assert not any(isinstance(value, bytes) and value.endswith(b"~w1") for value in values), values
    await second.release()
    empty: list[list[bytes]] = [[]] * len(cluster)
    assert await eventually(lambda: keys_everywhere(cluster) == empty, PROMPT), keys_everywhere(cluster)


async def _flush_scripts(urls: list[str], every: float, stop: asyncio.Event, sent: list[int] | None = None) -> int:
    """SCRIPT FLUSH on every node every *every* seconds until *stop*; how many rounds were sent (counted
    in ``sent[0]`` as they go, too)."""
    clients = [redis.asyncio.Redis.from_url(url) for url in urls]
    rounds = 0
    try:
        while not stop.is_set():
            await asyncio.gather(*(client.script_flush() for client in clients))
            rounds += 1
            if sent is not None:
                sent[0] = rounds
            await asyncio.sleep(every)
    finally:
        for client in clients:
            await client.aclose()
    return rounds


FLUSHES = 100
SECTIONS = 50


@pytest.mark.serial  # bounds on gaps and waits: load skews them
async def test_under_a_script_flush_every_few_ms_the_lock_is_never_left_to_no_one(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """Two Redlocks (queue=True, ttl 10 s), six tasks taking one name for about a millisecond each, some
    cancelled while they wait (in the same loop turn as another's release, or not), while every node's
    scripts are flushed every 3 ms, for 3 s and until at least FLUSHES flushes and SECTIONS sections came
    (a count, so that a loaded box takes longer but tests as much). Then: every gap between one holder's
    release and the next holder's grant while someone waited is far below the ttl (a leave that never ran
    cost 10 s gaps), and once every client has closed, no lock key and no line is left on any node."""
    rng = random.Random(26_9)
    redlocks = [await make_redlock(queue=True, ttl=10.0, retry_delay=0.2) for _ in range(2)]
    stop = asyncio.Event()
    flushed = [0]
    flusher = asyncio.create_task(_flush_scripts(cluster.urls, 0.003, stop, flushed))
    released_at: list[float] = []
    gaps: list[float] = []
    sections = 0
    deadline = time.monotonic() + 3.0
    cap = deadline + 60.0

    def going() -> bool:
        now = time.monotonic()
        return now < deadline or (now < cap and (flushed[0] < FLUSHES or sections < SECTIONS))

    async def take(n: int) -> None:
        nonlocal sections
        lock = redlocks[n % 2].lock("churn", acquire_timeout=15.0, owner=f"t{n}")
        while going():
            attempt = asyncio.create_task(lock.acquire())
            if rng.random() < 0.3:
                await asyncio.sleep(rng.choice((0.0, 0.0005, 0.002)))
                attempt.cancel()  # a waiter that quits (or one just granted: it gives the lock back)
            try:
                acquired = await attempt
            except asyncio.CancelledError:
                continue
            except LockNotAcquired:
                acquired = False
            assert acquired, "a waiter starved for 15 s"
            if released_at:
                gaps.append(time.monotonic() - released_at[-1])
            sections += 1
            await asyncio.sleep(0.001)
            released_at.append(time.monotonic())
            await lock.release()

    try:
        await asyncio.gather(*(take(n) for n in range(6)))
    finally:
        stop.set()
        rounds = await flusher
    for redlock in redlocks:
        await redlock.aclose()
    assert rounds >= FLUSHES, rounds  # the flushes really came between the sections
    assert gaps
    assert max(gaps) < 2.0, f"longest gaps with no holder: {sorted(gaps)[-5:]} in {sections} sections"
    assert sections >= SECTIONS, sections
    empty: list[list[bytes]] = [[]] * len(cluster)
    assert await eventually(lambda: keys_everywhere(cluster) == empty, PROMPT), keys_everywhere(cluster)


def test_a_late_leave_only_takes_away_what_is_its_own(cluster: Cluster) -> None:
    """What makes a leave safe to send again whenever it runs: QUEUE_LEAVE of a token removes that token's
    entry, and hands on the key only where the key holds that token; everyone else's entry and key stay."""
    r = redis.Redis.from_url(cluster.urls[0])
    keys = queue_keys(b"redlock:late")

    r.script_load(QUEUE_ENTER.source)
    r.script_load(QUEUE_LEAVE.source)

    def leave(token: str) -> None:
        r.evalsha(QUEUE_LEAVE.sha.decode(), 3, *keys, token)

    def line() -> list[object]:
        members: list[object] = r.zrange(keys[1], 0, -1)  # type: ignore[assignment]
        return members

    r.set(keys[0], "h", px=10_000)
    for score, token in enumerate(("w1", "w2", "w3")):
        entered: list[object] = r.evalsha(QUEUE_ENTER.sha.decode(), 3, *keys, token, 10_000, score, 5_000)
        assert entered[0] == 0  # in line: the key is h's
    leave("w9")  # never in line, holds nothing: nothing changes
    assert (r.get(keys[0]), line()) == (b"h", [b"w1", b"w2", b"w3"])
    leave("w2")  # its own entry only
    assert (r.get(keys[0]), line()) == (b"h", [b"w1", b"w3"])
    leave("h")  # the holder's release: the key goes to the first in line
    assert (r.get(keys[0]), line()) == (b"w1", [b"w3"])
    leave("w1")  # a departed waiter the key was granted to: handed on to the next
    assert (r.get(keys[0]), line()) == (b"w3", [])
    leave("w1")  # the same leave again (late): the key is w3's, left alone
    leave("w2")
    assert (r.get(keys[0]), line()) == (b"w3", [])
    r.close()


@pytest.mark.serial  # bounds on gaps and waits: load skews them
@pytest.mark.timeout(CHILDREN_TIMEOUT)
async def test_under_a_script_flush_every_few_ms_processes_exclude_and_all_progress(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """The same flush every 3 ms, with another OS process in the line: two Redlocks of this process
    (queue=True, ttl 10 s) and two tasks of the other take one name for 3 s. No overlap, no acquire
    timed out (10 s: a grant to a departed waiter costs a whole ttl), every wait far below the ttl,
    and nothing left on the nodes once every client closed."""
    redlocks = [await make_redlock(queue=True) for _ in range(2)]
    stop = asyncio.Event()
    flusher = asyncio.create_task(_flush_scripts(cluster.urls, 0.003, stop))
    try:
        run = await contend(cluster, [("a", redlocks[0], 2), ("b", redlocks[1], 2)], "processes", 3.0, child=(2, True))
    finally:
        stop.set()
        rounds = await flusher
    for redlock in redlocks:
        await redlock.aclose()
    assert rounds > 100, rounds
    run.history.check()
    assert run.timeouts == 0, (run.timeouts, run.grants)
    assert max(run.longest.values()) < 5.0, run.longest
    assert len(run.grants) == 6, run.grants  # every task of both processes held it
    empty: list[list[bytes]] = [[]] * len(cluster)
    assert await eventually(lambda: keys_everywhere(cluster) == empty, PROMPT), keys_everywhere(cluster)
