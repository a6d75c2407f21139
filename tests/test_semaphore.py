"""Semaphores: at most *limit* holders at once, on real nodes; and History's check of a bound other than 1."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time

import pytest

from redlock_async import LockLost, LockNotAcquired, Redlock
from redlock_async._core._names import semaphore_keys
from redlock_async.semaphore import MAX_LIMIT, Semaphore
from redlock_async.testing import History, LocalNodes
from redlock_async.testing._history import Section

from .conftest import Cluster, MakeRedlock, eventually, keys_everywhere, lock_keys

SLOW_POLL = 2.0  # a retry delay so long that a grant within a fraction of it can only be a notification


def widest(name: str) -> bytes:
    return semaphore_keys("redlock:", name).widest


def slots(node: object, name: str) -> list[bytes]:
    """The permit slots of semaphore *name* held on *node*."""
    keys = semaphore_keys("redlock:", name)
    every = {keys.slot_key(j) for j in range(MAX_LIMIT)}
    return [key for key in lock_keys(node) if key in every]


# -- History's bound -------------------------------------------------------------------------------


def test_history_checks_a_bound_other_than_one() -> None:
    history = History()
    assert history.most_inside() == 0
    history.check(limit=3)
    history.sections += [
        Section("a", "t1", None, 0.0, 2.0),
        Section("b", "t2", None, 0.5, 1.5),
        Section("c", "t3", None, 1.0, 3.0),  # a, b and c inside from 1.0 to 1.5
        Section("a", "t1", None, 1.2, 1.8),  # a second section of t1: the same acquisition, counted once
        Section("d", "t4", None, 3.0, 4.0),  # touches c's end: not inside with it
        Section("e", "t5", None, 3.5, 3.6),
    ]
    assert history.most_inside() == 3
    history.check(limit=3)
    history.check(limit=4)
    with pytest.raises(AssertionError, match=r"1 safety violations in 6 sections:\n3 inside at once \(limit 2\)"):
        history.check(limit=2)
    with pytest.raises(AssertionError, match=r"c from 1\.000000"):
        history.check(limit=2)
    # limit=1 is the lock check, unchanged: pairs of overlapping acquisitions.
    with pytest.raises(AssertionError, match=r"overlap: a held it 0\.000000-2\.000000 while b entered at 0\.500000"):
        history.check(limit=1)
    with pytest.raises(AssertionError) as caught:
        history.check()
    assert str(caught.value).startswith(f"{len(history.overlaps())} safety violations")

    # A fourth acquisition entering while three are inside is found wherever it lies in the list.
    history.sections.append(Section("f", "t6", None, 1.4, 1.45))
    assert history.most_inside() == 4
    with pytest.raises(AssertionError, match=r"4 inside at once \(limit 3\)"):
        history.check(limit=3)

    for bad in (0, -1):
        with pytest.raises(ValueError, match="at least 1"):
            history.check(limit=bad)
    for wrong in (True, 2.0, "2"):
        with pytest.raises(TypeError, match="must be an int"):
            history.check(limit=wrong)  # type: ignore[arg-type]


def test_history_counts_an_empty_section_at_its_instant() -> None:
    """Issue 35: a section entered and left at one clock reading made most_inside() and check(limit>1)
    raise KeyError. It is open at its instant, with the sections open across it; it touches those that
    end or start then (touching is fine, as for every section)."""
    history = History()
    history.sections += [
        Section("a", "t1", None, 1.0, 1.0),
        Section("b", "t2", None, 0.0, 2.0),  # open across 1.0: inside with a
        Section("c", "t3", None, 1.0, 3.0),  # starts at 1.0: touches a, inside with b
        Section("d", "t4", None, 0.5, 1.0),  # ends at 1.0: touches a and c, inside with b
        Section("e", "t5", None, 1.0, 1.0),  # empty at the same instant as a: they touch
    ]
    assert history.most_inside() == 2
    history.check(limit=2)
    assert sorted((a.client, b.client) for a, b in history.overlaps()) == [("b", x) for x in "acde"]
    history.sections.append(Section("f", "t6", None, 0.9, 1.1))  # open across 1.0 too: a is the third
    assert history.most_inside() == 3
    with pytest.raises(AssertionError, match=r"3 inside at once \(limit 2\) at 1\.000000: .*a from 1\.000000"):
        history.check(limit=2)


def test_history_default_check_is_the_lock_check() -> None:
    """check() with no limit still finds overlaps and fencing tokens that went backwards."""
    history = History()
    history.sections += [
        Section("a", "t1", 1, 0.0, 1.0),
        Section("b", "t2", 2, 1.0, 2.0),  # touching is fine
        Section("c", "t3", 1, 3.0, 4.0),  # token went back
    ]
    assert history.overlaps() == []
    assert history.most_inside() == 1
    with pytest.raises(AssertionError, match=r"^1 safety violations.*\nfencing token went backwards: b had 2, then c"):
        history.check()
    history.sections.append(Section("d", "t4", 5, 3.5, 5.0))  # overlaps c
    with pytest.raises(AssertionError, match=r"^2 safety violations.*\noverlap: c held it 3\.000000-4\.000000 while d"):
        history.check()
    history.check(limit=2)  # a semaphore's bound: fencing is not part of it


# -- limits --------------------------------------------------------------------------------------------


async def test_limits_are_checked_with_a_message_that_says_what_to_do(redlock: Redlock) -> None:
    for bad in (0, -1, MAX_LIMIT + 1, 10**6):
        with pytest.raises(ValueError, match=f"limit must be between 1 and {MAX_LIMIT}, got {bad}"):
            redlock.semaphore("s", limit=bad)
    for wrong, kind in ((2.5, "float"), (True, "bool"), (None, "NoneType"), ("3", "str"), (3.0, "float")):
        with pytest.raises(TypeError, match=f"limit must be an int .*got {kind}"):
            redlock.semaphore("s", limit=wrong)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit"):
        redlock.semaphore("s")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="name must be str or bytes, got list"):
        redlock.semaphore(["s"], limit=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        redlock.semaphore("", limit=2)
    for good in (1, 2, MAX_LIMIT):
        sem = redlock.semaphore("s", limit=good)
        assert isinstance(sem, Semaphore)
        assert sem.limit == good
    # The widest limit works: a permit of 1024 slots.
    sem = redlock.semaphore("wide", limit=MAX_LIMIT)
    async with sem:
        assert sem.held


# -- the bound -----------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_never_more_than_limit_holders_under_contention(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """3 Redlocks x 8 tasks take permits of a semaphore of 3 for 3 s: never 4 inside, often 3."""
    limit = 3
    redlocks = [await make_redlock(retry_delay=0.05) for _ in range(3)]
    history = History()
    rng = random.Random(5)
    stop = time.monotonic() + 3.0
    grants = [0] * 24

    async def task(n: int) -> None:
        sem = redlocks[n % 3].semaphore("vendor-api", limit=limit, acquire_timeout=20.0)
        while time.monotonic() < stop:
            async with sem:
                with history.section(f"task{n}", sem):
                    await asyncio.sleep(rng.uniform(0.002, 0.02))
            grants[n] += 1

    async with asyncio.timeout(40):
        await asyncio.gather(*(task(n) for n in range(24)))
    history.check(limit=limit)
    assert history.most_inside() == limit
    assert len(history.sections) > 100
    assert all(grants), f"tasks that never got a permit: {[n for n, g in enumerate(grants) if not g]}"
    # Only the widest-limit key is left: every permit was given back.
    expected = [[widest("vendor-api")]] * len(cluster)
    assert await eventually(lambda: keys_everywhere(cluster) == expected, 1.0), keys_everywhere(cluster)


@pytest.mark.parametrize("limit", [3, 8])
async def test_free_permits_are_all_granted_at_once(cluster: Cluster, redlock: Redlock, limit: int) -> None:
    """*limit* acquirers of *limit* free permits, all at once: each gets one in its first attempt (no
    stampede on one slot), and the next one finds none."""
    sems = [redlock.semaphore("burst", limit=limit) for _ in range(limit)]
    for _ in range(10):
        assert await asyncio.gather(*(sem.acquire(blocking=False) for sem in sems)) == [True] * limit, limit
        assert [sem.statistics().attempts for sem in sems] == [1] * limit
        assert await eventually(lambda: all(len(slots(cluster[i], "burst")) == limit for i in range(5)), 1.0)
        assert len({sem.token for sem in sems}) == limit
        one_more = redlock.semaphore("burst", limit=limit)
        assert not await one_more.acquire(blocking=False)
        await asyncio.gather(*(sem.release() for sem in sems))
    for _ in range(5):
        # Blocking acquires: none needs a second attempt (a retry would mean two chose the same slot and
        # one gave up on the others).
        assert await asyncio.gather(*(sem.acquire(timeout=5.0) for sem in sems)) == [True] * limit
        assert [sem.statistics().attempts for sem in sems] == [1] * limit
        await asyncio.gather(*(sem.release() for sem in sems))
    expected = [[widest("burst")]] * len(cluster)
    assert await eventually(lambda: keys_everywhere(cluster) == expected, 1.0), keys_everywhere(cluster)


@pytest.mark.serial
async def test_another_limit_while_held_is_a_value_error(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    one, other = await make_redlock(), await make_redlock(retry_delay=0.05)
    three = one.semaphore("pool", limit=3)
    assert await three.acquire(blocking=False)
    for limit in (4, 2, 1, MAX_LIMIT):
        sem = other.semaphore("pool", limit=limit)
        with pytest.raises(ValueError, match=rf"'pool' is held under limit 3, not {limit}: every client"):
            await sem.acquire(blocking=False)
        assert not sem.held
        started = time.monotonic()
        with pytest.raises(ValueError, match=rf"limit 3, not {limit}"):
            await sem.acquire(timeout=5.0)  # at once: waiting would not help
        assert time.monotonic() - started < 1.0
        with pytest.raises(ValueError, match=rf"limit 3, not {limit}"):
            async with sem:
                pytest.fail("entered under another limit")
    # The same limit still works, and nothing of the refused attempts was left (the widest limit is kept).
    more = other.semaphore("pool", limit=3)
    assert await more.acquire(blocking=False)
    assert await eventually(lambda: all(len(slots(cluster[i], "pool")) == 2 for i in range(len(cluster))), 1.0)
    await more.release()
    await three.release()
    expected = [[widest("pool")]] * len(cluster)
    assert await eventually(lambda: keys_everywhere(cluster) == expected, 1.0), keys_everywhere(cluster)

    # Every permit given back: another limit is fine now, and then holds the others off in turn.
    for limit, before in ((4, 3), (2, 4), (5, 2)):
        sems = [other.semaphore("pool", limit=limit) for _ in range(limit)]
        # Each may retry (a round whose votes were late on a loaded box: seen for 1 of 4 with
        # blocking=False), but all must get in: a permit short, the last would wait out its timeout.
        assert await asyncio.gather(*(sem.acquire(timeout=10.0) for sem in sems)) == [True] * limit, limit
        assert not await other.semaphore("pool", limit=limit).acquire(blocking=False)  # all taken
        with pytest.raises(ValueError, match=rf"limit {limit}, not {before}"):
            await one.semaphore("pool", limit=before).acquire(blocking=False)
        await asyncio.gather(*(sem.release() for sem in sems))


# -- hand-off, loss, leftovers ---------------------------------------------------------------------------


async def test_a_release_wakes_a_waiter(make_redlock: MakeRedlock) -> None:
    holder, waiter = await make_redlock(), await make_redlock(retry_delay=SLOW_POLL)
    held = [holder.semaphore("slots", limit=2) for _ in range(2)]
    for sem in held:
        assert await sem.acquire(blocking=False)
    for _ in range(2):
        sem = waiter.semaphore("slots", limit=2)
        task = asyncio.create_task(sem.acquire(timeout=10.0))
        await asyncio.sleep(0.3)  # tried, found both taken, listens
        assert not task.done()
        released = time.monotonic()
        await held[0].release()
        assert await task
        waited = time.monotonic() - released
        # Its retry timer would fire SLOW_POLL / 2 after its last try at the earliest: this was the release.
        assert waited < 0.5, f"woken {waited:.2f} s after the release"
        held[0] = sem
    assert waiter.statistics().wakeups >= 2
    for sem in held:
        await sem.release()


async def test_permits_released_at_once_wake_as_many_waiters(make_redlock: MakeRedlock) -> None:
    """3 permits released at once, 3 waiters: all three are granted at once, not after their retry delay.

    Three rounds: with the bug, a round passes only when a woken waiter's whole attempt fits between two
    release words (rare), so all three passing by luck is unlikely."""
    limit = 3
    holder, waiter = await make_redlock(), await make_redlock(retry_delay=5.0)
    for _ in range(3):
        held = [holder.semaphore("trio", limit=limit) for _ in range(limit)]
        for sem in held:
            assert await sem.acquire(blocking=False)
        waiting = [waiter.semaphore("trio", limit=limit) for _ in range(limit)]
        tasks = [asyncio.create_task(sem.acquire(timeout=10.0)) for sem in waiting]
        await asyncio.sleep(0.3)  # each tried, found every permit taken, listens
        assert not any(task.done() for task in tasks)
        await asyncio.gather(*(sem.release() for sem in held))
        # A waiter's retry timer fires 2.5 s after its last try at the earliest: within 1 s, only words woke it.
        done, pending = await asyncio.wait(tasks, timeout=1.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        granted = [sem for sem in waiting if sem.held]
        for sem in granted:
            await sem.release()
        assert not pending, f"{len(pending)} of {limit} waiters still waiting 1 s after {limit} permits were released"
        assert all(task.result() for task in done)


@pytest.mark.serial
async def test_a_lost_permit_cancels_the_body_with_lock_lost(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock, other = await make_redlock(), await make_redlock()
    neighbour = other.semaphore("lossy", limit=2)
    assert await neighbour.acquire(blocking=False)
    assert await eventually(lambda: all(len(slots(cluster[i], "lossy")) == 1 for i in range(len(cluster))), 1.0)
    (theirs,) = slots(cluster[0], "lossy")
    sem = redlock.semaphore("lossy", limit=2, ttl=0.6)
    reached_the_end = False
    started = time.monotonic()
    with pytest.raises(LockLost, match="gone from a majority"):
        async with sem:
            assert await eventually(lambda: all(len(slots(cluster[i], "lossy")) == 2 for i in range(5)), 1.0)
            (ours,) = [key for key in slots(cluster[0], "lossy") if key != theirs]
            for i in range(len(cluster)):
                assert cluster[i].command("DEL", ours) == 1
            await asyncio.sleep(6.0)
            reached_the_end = True
    assert not reached_the_end
    assert time.monotonic() - started < 0.6 + 1.0
    assert not sem.held
    # The other permit is untouched, and the free slot can be had again.
    assert neighbour.held
    assert [slots(cluster[i], "lossy") for i in range(len(cluster))] == [[theirs]] * len(cluster)
    async with sem:
        assert sem.held
    await neighbour.release()


async def test_nothing_is_left_after_failed_or_cancelled_acquires(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    holder, other = await make_redlock(), await make_redlock(retry_delay=0.02)
    held = [holder.semaphore("full", limit=2) for _ in range(2)]
    for sem in held:
        assert await sem.acquire(blocking=False)
    assert await eventually(lambda: all(len(slots(cluster[i], "full")) == 2 for i in range(len(cluster))), 1.0)
    taken = slots(cluster[0], "full")
    expected = [sorted([*taken, widest("full")])] * len(cluster)
    sem = other.semaphore("full", limit=2)
    assert not await sem.acquire(blocking=False)
    await asyncio.sleep(0.05)  # the attempt's scripts ran everywhere
    assert keys_everywhere(cluster) == expected
    assert not await sem.acquire(timeout=0.3)
    assert sem.statistics().attempts > 1
    with pytest.raises(LockNotAcquired):
        async with other.semaphore("full", limit=2, acquire_timeout=0.2):
            pytest.fail("entered a full semaphore")
    with pytest.raises(asyncio.TimeoutError):
        async with asyncio.timeout(0.2):
            await sem.acquire(timeout=10.0)  # cancelled while waiting
    assert await eventually(lambda: keys_everywhere(cluster) == expected, 1.0), keys_everywhere(cluster)
    for sem in held:
        await sem.release()
    expected = [[widest("full")]] * len(cluster)
    assert await eventually(lambda: keys_everywhere(cluster) == expected, 1.0), keys_everywhere(cluster)


@pytest.mark.slow
@pytest.mark.serial
async def test_nothing_is_left_after_an_acquire_cancelled_mid_vote() -> None:
    """Nodes 0 and 1 answer 0.3 s late and node 4's only slot is taken, so the vote waits for a slow node:
    cancelled then, the late scripts still reach nodes 0 and 1, and are given back there."""
    with LocalNodes(5, proxied=True) as nodes:
        slot = semaphore_keys("redlock:", "one").slot_key(0)
        nodes[4].command("SET", slot, "1:someone else", "PX", 60_000)
        async with Redlock(nodes.urls, ttl=20.0, node_timeout=1.0) as redlock:
            for i in (0, 1):
                nodes[i].proxy.latency(0.3)
            sem = redlock.semaphore("one", limit=1)
            started = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                async with asyncio.timeout(0.15):
                    await sem.acquire(blocking=False)
            assert time.monotonic() - started < 0.15 + 0.5
            assert not sem.held
            expected = [[widest("one")]] * 4 + [sorted([slot, widest("one")])]
            assert await eventually(lambda: keys_everywhere(nodes) == expected, 2.0), keys_everywhere(nodes)
            assert nodes[4].command("GET", slot) == b"1:someone else"
            nodes.heal()
            nodes[4].command("DEL", slot)
            assert await sem.acquire(timeout=2.0)
            await sem.release()
        assert await eventually(lambda: keys_everywhere(nodes) == [[widest("one")]] * 5, 1.0)


@pytest.mark.serial
async def test_a_full_semaphore_of_the_largest_limit_keeps_the_acquire_timeout(
    cluster: Cluster, redlock: Redlock
) -> None:
    limit = MAX_LIMIT
    keys = semaphore_keys("redlock:", "big")
    for i in range(len(cluster)):
        cluster[i].command("SET", widest("big"), b"%d layout-2" % limit)
        taken = [part for j in range(limit) for part in (keys.slot_key(j), b"%d:someone else" % limit)]
        cluster[i].command("MSET", *taken)
    sem = redlock.semaphore("big", limit=limit)
    started = time.monotonic()
    # One fan-out finds the semaphore full (each node names its free slots: none), whatever the limit.
    async with asyncio.timeout(0.1 + 1.0):
        assert not await sem.acquire(timeout=0.1)
    assert time.monotonic() - started < 0.1 + 1.0


# -- the bound under faults ----------------------------------------------------------------------------


@pytest.mark.slow
async def test_never_more_than_limit_holders_while_minorities_fail(faulty: Cluster) -> None:
    """3 Redlocks x 5 tasks contend for a semaphore of 2 for 4 s, and on until 100 sections (a loaded box is
    slower; at most 30 s more), while minorities of nodes are paused, restarted, or restarted without their
    data (the restart quarantine keeps those out of quorums)."""
    limit = 2
    history = History()
    rng = random.Random(13)
    stop = time.monotonic() + 4.0

    def running() -> bool:
        now = time.monotonic()
        return now < stop or (len(history.sections) <= 100 and now < stop + 30)

    faults: list[str] = []
    quarantine = 1.0
    restarted = [-math.inf] * 5
    kinds = itertools.chain(["wipe", "pause"], iter(lambda: rng.choice(["pause", "restart", "wipe"]), None))

    async def chaos() -> None:
        while running():
            down = rng.sample(range(5), 2)
            kind = next(kinds)
            if kind != "pause" and time.monotonic() - max(restarted) < quarantine:
                kind = "pause"  # one node in quarantine at a time: a minority out at most
            faults.append(f"{kind} {sorted(down)}")
            if kind == "pause":
                for i in down:
                    faulty[i].pause()
                await asyncio.sleep(0.3)
                for i in down:
                    faulty[i].resume()
            else:
                await asyncio.to_thread(faulty[down[0]].restart, keep_data=kind == "restart")
                restarted[down[0]] = time.monotonic()
            await asyncio.sleep(0.2)

    async def task(n: int, redlock: Redlock) -> None:
        sem = redlock.semaphore("faulty-pool", limit=limit, ttl=2.0, acquire_timeout=5.0)
        while running():
            async with sem:
                with history.section(f"task{n}", sem):
                    await asyncio.sleep(rng.uniform(0.0, 0.01))

    redlocks = [Redlock(faulty.urls, retry_delay=0.02, restart_quarantine=quarantine) for _ in range(3)]
    try:
        async with asyncio.timeout(70):
            await asyncio.gather(chaos(), *(task(n, redlocks[n % 3]) for n in range(15)))
    finally:
        for redlock in redlocks:
            await redlock.aclose()
    history.check(limit=limit)
    assert history.most_inside() == limit
    assert len(faults) >= 4, faults
    assert any(f.startswith("wipe") for f in faults), faults
    assert len(history.sections) > 100, faults


@pytest.mark.slow
async def test_never_more_than_limit_holders_while_a_minority_is_slow_or_silent() -> None:
    """3 Redlocks x 4 tasks contend for a semaphore of 3 for 3 s while a changing pair of nodes is slow
    (past the node timeout) or black-holed; on a loaded box, for as long as 6 faults and 100 sections
    take (in 3 s under load the chaos made 4 faults and the tasks 90 sections: the run was too short to
    prove much, not unsafe)."""
    limit = 3
    history = History()
    rng = random.Random(17)
    faults: list[str] = []
    with LocalNodes(5, proxied=True) as nodes:
        stop = time.monotonic() + 3.0
        chaos_over = asyncio.Event()

        async def chaos() -> None:
            while time.monotonic() < stop - 0.3 or len(faults) < 6:
                down = sorted(rng.sample(range(5), 2))
                kind = rng.choice(["slow", "blackhole"])
                faults.append(f"{kind} {down}")
                for i in down:
                    if kind == "slow":
                        nodes[i].proxy.latency(rng.uniform(0.02, 0.15))
                    else:
                        nodes[i].proxy.blackhole()
                await asyncio.sleep(0.3)
                nodes.heal()
            nodes.heal()
            chaos_over.set()

        lost: list[str] = []

        async def task(n: int, redlock: Redlock) -> None:
            sem = redlock.semaphore("slow-pool", limit=limit, ttl=1.0, acquire_timeout=5.0)
            while time.monotonic() < stop or not chaos_over.is_set() or len(history.sections) <= 100:
                # A section of 10 ms is rarely extended; on a loaded box one was, and its three yes came after
                # the 1 s lease ran out (CI: LockLost). A loss under these faults is the algorithm at work
                # (the body is cancelled): safety is what is checked, with few losses.
                try:
                    async with sem:
                        with history.section(f"task{n}", sem):
                            await asyncio.sleep(rng.uniform(0.0, 0.01))
                except LockLost as exc:
                    lost.append(str(exc))

        redlocks = [Redlock(nodes.urls, retry_delay=0.02) for _ in range(3)]
        try:
            for redlock in redlocks:
                await redlock.connect()
            async with asyncio.timeout(40):
                await asyncio.gather(chaos(), *(task(n, redlocks[n % 3]) for n in range(12)))
        finally:
            for redlock in redlocks:
                await redlock.aclose()
        history.check(limit=limit)
        assert history.most_inside() == limit
        assert len(faults) >= 6, faults
        assert len(history.sections) > 100, faults
        assert len(lost) <= len(history.sections) // 20, lost
        # Every permit was given back (blackholed bytes flowed once healed): only the widest limit is left.
        expected = [[widest("slow-pool")]] * 5
        assert await eventually(lambda: keys_everywhere(nodes) == expected, 2.0), keys_everywhere(nodes)


# -- several OS processes, and anyio's cancel scopes ---------------------------------------------------------


@pytest.mark.slow
async def test_several_processes_never_exceed_the_limit_under_minority_faults() -> None:
    """OS processes, each its own Redlock and event loop, contend for permits of one semaphore while
    nodes are paused, wiped and slowed one at a time: one history, never more than the limit inside."""
    from redlock_async.testing._soak import soak

    result = await soak(processes=3, seconds=5.0, limit=2)
    assert result.sections > 30, result.faults
    assert len({s.client.split(".")[0] for s in result.history.sections}) == 3  # every process got a permit
    assert {fault.split()[0] for fault in result.faults} == {"pause", "wipe", "slow"}
    assert result.overlaps == 0
    result.history.check(limit=2)
    assert result.history.most_inside() == 2  # the bound is reached, not only kept
    assert result.leftover == 0


async def test_anyio_scopes_around_a_permit_leave_nothing_behind(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """A scope that times out while waiting for a permit, and one cancelled while holding it (anyio
    cancels again at every await): no permit is left taken, and the next acquirer gets it at once."""
    import anyio

    holder, other = await make_redlock(), await make_redlock()
    full = holder.semaphore("scoped", limit=1)
    assert await full.acquire(blocking=False)
    with anyio.move_on_after(0.3) as waiting:
        async with other.semaphore("scoped", limit=1):
            pytest.fail("a permit of a full semaphore")
    assert waiting.cancelled_caught
    await full.release()
    sem = other.semaphore("scoped", limit=1)
    with anyio.move_on_after(0.2) as holding:
        async with sem:
            await anyio.sleep(5)
    assert holding.cancelled_caught
    assert not sem.held
    assert await eventually(
        lambda: (
            not any(
                semaphore_keys("redlock:", "scoped").slot_key(0) in lock_keys(cluster[i]) for i in range(len(cluster))
            )
        ),
        2.0,
    )
    again = holder.semaphore("scoped", limit=1)
    assert await again.acquire(blocking=False)
    await again.release()
