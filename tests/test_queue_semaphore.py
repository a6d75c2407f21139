"""Semaphores through the grant queue (the default): one line per semaphore name, a permit's release hands
its slot to the first waiter, in any process (``redlock_async/_queue/_lines.py``), against real servers.

Checked: that a waiter of another Redlock is handed a released permit by the release alone (no retry
of its own) and holds it on every node; that tasks of two Redlocks and of another OS process never
exceed the limit, are all served and leave nothing behind; that a waiter that gives up (every way a
caller gives up) leaves no slot and no line entry behind; that a client of another limit gets the
ValueError while it waits in line; that a holder or a waiter of another process SIGKILLed delays the
others by about a ttl (plus an entry's life) at most; and the same on uvloop.

``python -m tests.test_queue_semaphore URLS NAME TTL`` is the other OS process of these tests: it takes
a permit of *NAME* (limit 1, no watchdog), waiting up to 60 s, and prints JSON lines.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
import time

import pytest
import uvloop

from redlock_async import LockNotAcquired, Redlock, Semaphore
from redlock_async._core._names import semaphore_keys
from redlock_async.testing import History

from .conftest import Cluster, MakeRedlock, eventually, keys_everywhere, kill_child, next_event, start_module
from .test_queue import GIVE_UPS, PROMPT, SLOW, cancel_first_around_release, give_up

BOUND = 10.0
"""The acquire timeout in the contention tests: a task starved for this long fails loudly."""


def base(name: str) -> bytes:
    return semaphore_keys("redlock:", name).channel


def left(cluster: Cluster, name: str) -> list[list[bytes]]:
    """Each node's keys of semaphore *name* but its widest-limit key (which outlives the permits by a lease)."""
    widest = semaphore_keys("redlock:", name).widest
    return [[key for key in keys if key != widest] for keys in keys_everywhere(cluster)]


def line_lengths(cluster: Cluster, name: str) -> list[int]:
    return [int(cluster[i].command("ZCARD", semaphore_keys("redlock:", name).line)) for i in range(len(cluster))]  # type: ignore[call-overload]


async def in_line(cluster: Cluster, name: str, waiters: int, within: float = 10.0) -> None:
    assert await eventually(lambda: min(line_lengths(cluster, name)) >= waiters, within), line_lengths(cluster, name)


async def test_a_waiter_is_handed_a_released_permit(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Both permits of a limit-2 semaphore held; a waiter of another Redlock (retry delay SLOW) waits in
    the semaphore's line; one holder's release hands its slot to it at once, on every node."""
    holders = await make_redlock()
    waiter_redlock = await make_redlock(retry_delay=SLOW)
    first, second = holders.semaphore("qs", limit=2), holders.semaphore("qs", limit=2)
    assert await first.acquire(blocking=False)
    assert await second.acquire(blocking=False)
    waiter = waiter_redlock.semaphore("qs", limit=2)
    task = asyncio.create_task(waiter.acquire(timeout=30))
    await in_line(cluster, "qs", 1)
    released = time.monotonic()
    await first.release()
    async with asyncio.timeout(PROMPT):
        assert await task
    assert time.monotonic() - released < PROMPT  # the grant, not its timer (SLOW / 2 at the earliest)
    token = waiter.token
    assert token is not None
    slots = [
        [cluster[i].command("GET", semaphore_keys("redlock:", "qs").slot_key(j)) for j in range(2)]
        for i in range(len(cluster))
    ]
    assert all(token.encode() in held for held in slots), slots
    await waiter.release()
    await second.release()
    assert await eventually(lambda: left(cluster, "qs") == [[]] * len(cluster), PROMPT), left(cluster, "qs")


@pytest.mark.serial
@pytest.mark.parametrize("how", GIVE_UPS)
async def test_a_waiter_that_gives_up_leaves_nothing_behind(
    cluster: Cluster, make_redlock: MakeRedlock, how: str
) -> None:
    """The permit (limit 1) held for 30 s; a waiter gives up after 0.35 s: its entry leaves the line at
    once, and the holder's release frees the slot (not granted to the departed waiter)."""
    holder = await make_redlock()
    other = await make_redlock(retry_delay=0.1)
    held = holder.semaphore("qs-gone", limit=1, ttl=30)
    assert await held.acquire(blocking=False)
    waiter = other.semaphore("qs-gone", limit=1, ttl=30)
    waiting = asyncio.create_task(give_up(how, waiter, 0.35))
    await in_line(cluster, "qs-gone", 1, within=0.3)
    async with asyncio.timeout(5):
        assert await waiting in ("timed out", "moved on", "cancelled")
    assert not waiter.held
    slot = semaphore_keys("redlock:", "qs-gone").slot_key(0)
    assert await eventually(lambda: left(cluster, "qs-gone") == [[slot]] * len(cluster), PROMPT), left(
        cluster, "qs-gone"
    )
    await held.release()
    assert await eventually(lambda: left(cluster, "qs-gone") == [[]] * len(cluster), PROMPT), left(cluster, "qs-gone")


async def test_another_limit_is_a_value_error_for_a_waiter_in_line(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    holder, other = await make_redlock(), await make_redlock()
    held = holder.semaphore("qs-limits", limit=1)
    assert await held.acquire(blocking=False)
    with pytest.raises(ValueError, match=r"held under limit 1, not 2"):
        await other.semaphore("qs-limits", limit=2).acquire(timeout=2)
    await held.release()


async def test_a_rolling_change_of_limit_never_admits_more_than_the_smaller(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """Issue 35: a limit-2 waiter in line whose holders' leases ran out (crashed); three limit-3 permits
    taken meanwhile (their first try passes the line by); the limit-3 permit on slot 2 released: it was
    handed to the limit-2 waiter, and after the other two, two more limit-2 clients took slots 0 and 1:
    three holders of a limit-2 semaphore. Now the slot is freed, its release word sends the waiter in
    again, and that entry is refused (limit-3 permits are held): the waiter's ValueError; later limit-2
    clients take at most 2 permits, and no limit-2 token ever holds slot 2."""
    name = "qs-rolling"
    old = await make_redlock()
    crashed = [old.semaphore(name, limit=2, ttl=0.5, auto_extend=False) for _ in range(2)]
    for permit in crashed:
        assert await permit.acquire(blocking=False)
    waiter = (await make_redlock(retry_delay=60.0)).semaphore(name, limit=2)  # no try of its own meanwhile
    waiting = asyncio.create_task(waiter.acquire(timeout=30))
    await in_line(cluster, name, 1)
    slots = [semaphore_keys("redlock:", name).slot_key(j) for j in range(3)]
    assert await eventually(lambda: not any(cluster[i].command("EXISTS", *slots) for i in range(len(cluster))), 5)
    new = await make_redlock()
    wider = [new.semaphore(name, limit=3) for _ in range(3)]
    for permit in wider:
        assert await permit.acquire(blocking=False)

    def slot_of(permit: Semaphore) -> int:
        assert permit.token is not None
        return [cluster[0].command("GET", key) for key in slots].index(permit.token.encode())

    wider.sort(key=slot_of, reverse=True)  # slot 2 first
    assert slot_of(wider[0]) == 2
    await wider[0].release()
    async with asyncio.timeout(10):
        outcome = await asyncio.gather(waiting, return_exceptions=True)  # (before: handed slot 2, held)
    for permit in wider[1:]:
        await permit.release()
    later = [(await make_redlock()).semaphore(name, limit=2) for _ in range(3)]
    taken = [await permit.acquire(blocking=False) for permit in later]
    beyond = [cluster[i].command("GET", slots[2]) for i in range(len(cluster))]
    holders = [permit for permit in (waiter, *later) if permit.held]
    assert len(holders) == 2, (outcome, taken, beyond)
    assert beyond == [None] * len(cluster), beyond
    assert isinstance(outcome[0], ValueError), outcome
    assert "held under limit 3, not 2" in str(outcome[0])
    assert taken == [True, True, False]
    for permit in holders:
        await permit.release()


async def contend(
    redlocks: list[Redlock], name: str, limit: int, seconds: float
) -> tuple[History, dict[str, int], int]:
    history = History()
    grants: collections.Counter[str] = collections.Counter()
    timeouts = [0]
    stop = time.monotonic() + seconds

    async def worker(client: str, redlock: Redlock) -> None:
        permit = redlock.semaphore(name, limit=limit, acquire_timeout=BOUND)
        while time.monotonic() < stop:
            try:
                async with permit:
                    with history.section(client, permit):
                        await asyncio.sleep(0.002)
                    grants[client] += 1
            except LockNotAcquired:
                timeouts[0] += 1
            await asyncio.sleep(0.001)

    workers = [
        asyncio.create_task(worker(f"r{r}.{n}", redlock)) for r, redlock in enumerate(redlocks) for n in range(3)
    ]
    try:
        async with asyncio.timeout(seconds + BOUND + 15):
            await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
    return history, dict(grants), timeouts[0]


@pytest.mark.slow
@pytest.mark.serial
async def test_never_more_than_limit_holders_and_all_served(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Two Redlocks x 3 tasks on a limit-2 semaphore, retry delay SLOW (permits move by grants only), 2 s:
    never more than 2 inside, every task served many times, nothing left."""
    redlocks = [await make_redlock(retry_delay=SLOW) for _ in range(2)]
    history, grants, timeouts = await contend(redlocks, "qs-busy", 2, 2.0)
    history.check(limit=2)
    print(f"grants {grants}")
    assert timeouts == 0
    assert len(grants) == 6, grants
    assert min(grants.values()) >= 5, grants
    assert sum(grants.values()) >= 100, grants  # with SLOW, a lost grant costs 2.5 s
    assert await eventually(lambda: left(cluster, "qs-busy") == [[]] * len(cluster), PROMPT), left(cluster, "qs-busy")


@pytest.mark.slow
@pytest.mark.serial
def test_semaphore_contention_on_uvloop(cluster: Cluster) -> None:
    async def main() -> None:
        async with Redlock(cluster.urls, retry_delay=SLOW) as first, Redlock(cluster.urls, retry_delay=SLOW) as second:
            history, grants, timeouts = await contend([first, second], "qs-uv", 2, 1.5)
        history.check(limit=2)
        assert timeouts == 0
        assert len(grants) == 6, grants
        assert min(grants.values()) >= 3, grants

    uvloop.run(main())


@pytest.mark.slow
@pytest.mark.serial
async def test_a_waiter_cancelled_around_its_grant_never_leaves_the_permit_to_no_one(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """A sweep over the moment of cancellation (as tests/test_queue.py's for a lock): holder H of a
    limit-1 semaphore (ttl 30 s), first waiter W1 (in ``async with``, then holding for 30 s), second
    waiter W2 (retry delay SLOW). H releases: the nodes grant W1 the slot, and W1 is cancelled k loop
    turns later. Whatever W1 ended with, W2 holds the permit promptly, and nothing is left after."""
    holders = await make_redlock(retry_delay=SLOW)
    firsts = await make_redlock(retry_delay=SLOW)
    seconds = await make_redlock(retry_delay=SLOW)
    for k in range(-1, 10):
        holder = holders.semaphore("qs-turns", limit=1, ttl=30)
        assert await holder.acquire(blocking=False), k
        first = firsts.semaphore("qs-turns", limit=1, ttl=30, acquire_timeout=20)
        second = seconds.semaphore("qs-turns", limit=1, ttl=30)
        await cancel_first_around_release(
            k,
            holder,
            first,
            second,
            lambda n: in_line(cluster, "qs-turns", n),
            lambda: f"keys {left(cluster, 'qs-turns')}",
        )
        assert await eventually(lambda: left(cluster, "qs-turns") == [[]] * len(cluster), PROMPT), (
            k,
            left(cluster, "qs-turns"),
        )


# -- SIGKILLed holders and waiters ---------------------------------------------------------------------------


async def child_take(urls: list[str], name: str, ttl: float) -> None:
    async with Redlock(urls, retry_delay=0.2) as redlock:
        print(json.dumps({"started": True}), flush=True)
        permit = redlock.semaphore(name, limit=1, ttl=ttl)
        ok = await permit.acquire(timeout=60)
        print(json.dumps({"ok": ok, "valid_until": time.monotonic() + permit.validity}), flush=True)
        await asyncio.sleep(60)


async def start_taker(urls: list[str], name: str, ttl: float) -> asyncio.subprocess.Process:
    return await start_module("tests.test_queue_semaphore", ",".join(urls), name, str(ttl))


@pytest.mark.slow
async def test_a_permit_holder_killed_without_releasing_is_followed_after_its_ttl(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """Another process holds the one permit (ttl 1 s, no watchdog) and is SIGKILLed; our waiter in line
    (retry delay 0.3 s) gets it once the slot ran out, by entering again: not before the dead holder's
    validity ended, and within ttl + 1.5 retry delays + 1 s of the kill."""
    ttl = 1.0
    child = await start_taker(cluster.urls, "qs-killed-holder", ttl)
    try:
        assert "started" in await next_event(child, 15)
        held = await next_event(child, 5)
        assert held["ok"], held
        redlock = await make_redlock(retry_delay=0.3)
        waiter = redlock.semaphore("qs-killed-holder", limit=1, ttl=ttl)
        waiting = asyncio.create_task(waiter.acquire(timeout=10))
        await in_line(cluster, "qs-killed-holder", 1)
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
    assert await eventually(lambda: left(cluster, "qs-killed-holder") == [[]] * len(cluster), PROMPT)


@pytest.mark.slow
async def test_a_permit_waiter_killed_in_line_delays_the_others_by_a_ttl_at_most(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """We hold the one permit; another process waits first in line (ttl 1 s, retry delay 0.2 s: its
    entry lives 1 s), our waiter W behind it; the process is SIGKILLed and we release at once: the slot
    may go to the dead waiter's live entry and run out after its ttl. W holds a permit within ttl + an
    entry's life + 1 s, and nothing is left after (the dead waiter's entries expire)."""
    redlock = await make_redlock(retry_delay=0.2)
    holder = redlock.semaphore("qs-killed-waiter", limit=1, ttl=30)
    assert await holder.acquire(blocking=False)
    child = await start_taker(cluster.urls, "qs-killed-waiter", 1.0)
    try:
        assert "started" in await next_event(child, 15)
        await in_line(cluster, "qs-killed-waiter", 1)
        waiter = redlock.semaphore("qs-killed-waiter", limit=1, ttl=30)
        waiting = asyncio.create_task(waiter.acquire(timeout=15))
        await in_line(cluster, "qs-killed-waiter", 2)
        os.kill(child.pid, signal.SIGKILL)
        await child.wait()
        released = time.monotonic()
        await holder.release()
        async with asyncio.timeout(5):
            assert await waiting
        waited = time.monotonic() - released
    finally:
        await kill_child(child)
    assert waited < 1.0 + 1.0 + 1.0, waited
    await waiter.release()
    assert await eventually(lambda: left(cluster, "qs-killed-waiter") == [[]] * len(cluster), 2.5)


if __name__ == "__main__":
    urls, name, ttl = sys.argv[1:]
    asyncio.run(child_take(urls.split(","), name, float(ttl)))
