"""No key lives forever without saying so: a semaphore's limit key and the fencing counters, on real nodes.

A semaphore keeps, besides its permits' slots, the widest limit in use (``…\\x00limit``), so that an
acquire looks at every slot that may be held. It expires a lease after the last permit granted or
extended on its node, and never while a permit is held: the watchdog's and ``extend()``'s rounds keep
it. Fencing counters never expire by default (docs/fencing.md says what that costs); with
``fence_ttl`` they expire that long after their last grant, and tokens are floored by the node's
clock, so they never go backwards across an expiry. Checked with PTTL on every node.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from redlock_async import Redlock
from redlock_async._core._names import semaphore_keys
from redlock_async.semaphore import Semaphore
from redlock_async.testing import LocalNodes

from .conftest import Cluster, MakeRedlock, eventually, keys_everywhere, needs_faketime

# -- semaphores ---------------------------------------------------------------------------------------


def limit_key(name: str) -> bytes:
    return semaphore_keys("redlock:", name).widest


def pttls(cluster: Cluster, key: bytes) -> list[int]:
    return [int(cluster[i].command("PTTL", key)) for i in range(len(cluster))]  # type: ignore[call-overload]


def slot_of(cluster: Cluster, name: str, sem: Semaphore) -> int:
    """The slot *sem*'s permit holds (the key whose value is its token, on a majority of the nodes)."""
    keys = semaphore_keys("redlock:", name)
    assert sem.token is not None
    token = sem.token.encode()
    for j in range(sem.limit):
        values = [cluster[i].command("GET", keys.slot_key(j)) for i in range(len(cluster))]
        if values.count(token) > len(cluster) // 2:
            return j
    raise AssertionError(f"no slot of {name!r} holds {token!r}")


async def test_a_limit_key_lives_a_lease_longer_than_the_last_permit_then_goes(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """It had no ttl: one key per semaphore name ever used, for ever (with noeviction, memory without bound)."""
    redlock = await make_redlock(ttl=1.0)
    sem = redlock.semaphore("ttl", limit=2)
    assert await sem.acquire(blocking=False)
    slot = semaphore_keys("redlock:", "ttl").slot_key(slot_of(cluster, "ttl", sem))
    assert await eventually(lambda: min(pttls(cluster, slot)) > 0, 1.0)  # the minority's SETs ran too
    for limit_left, slot_left in zip(pttls(cluster, limit_key("ttl")), pttls(cluster, slot), strict=True):
        assert 0 < slot_left <= 1000
        assert slot_left + 900 <= limit_left <= 2000, (limit_left, slot_left)
    await sem.release()
    await asyncio.sleep(0.5)
    assert all(left > 0 for left in pttls(cluster, limit_key("ttl")))  # a lease after the last grant
    empty: list[list[bytes]] = [[]] * len(cluster)
    assert await eventually(lambda: keys_everywhere(cluster) == empty, 3.0), keys_everywhere(cluster)


async def test_a_refused_wider_limit_with_a_shorter_ttl_does_not_cut_the_limit_key_short(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """A limit-3 client with a 0.1 s ttl meets a limit-2 permit of 5 s: it writes its wider limit (then is
    refused), and must leave the key's expiry the permit set, not one of its own two 0.1 s leases."""
    holder, other = await make_redlock(ttl=5.0), await make_redlock(ttl=0.1, node_timeout=0.01)
    sem = holder.semaphore("mixed", limit=2)
    assert await sem.acquire(blocking=False)
    slot = semaphore_keys("redlock:", "mixed").slot_key(slot_of(cluster, "mixed", sem))
    with pytest.raises(ValueError, match=r"held under limit 2, not 3"):
        await other.semaphore("mixed", limit=3).acquire(blocking=False)
    limits = [cluster[i].command("GET", limit_key("mixed")) for i in range(len(cluster))]
    assert limits == [b"3 layout-2"] * len(cluster)
    for limit_left, slot_left in zip(pttls(cluster, limit_key("mixed")), pttls(cluster, slot), strict=True):
        assert limit_left >= slot_left > 4000, (limit_left, slot_left)
    await sem.release()


@pytest.mark.slow
@pytest.mark.parametrize("extended_by", ["watchdog", "extend"])
async def test_a_limit_key_outlives_every_permit_held_by_extensions(
    cluster: Cluster, make_redlock: MakeRedlock, extended_by: str
) -> None:
    """Five permits of limit 5; those in slots 0-2 are released, slots 3 and 4 are held for three ttls by
    extensions alone (no acquire comes meanwhile). A limit-3 client looks at slots 0-2 only, unless the
    limit key says 5: it must still be refused. Had only acquires pushed the limit key's expiry, it would
    have gone after two ttls and the limit-3 client would hold a permit beside two limit-5 holders."""
    ttl = 1.5  # short enough to wait three, long enough for extensions on a loaded machine (0.6 s lost leases)
    redlock, other = await make_redlock(ttl=ttl), await make_redlock(ttl=ttl)
    sems = [redlock.semaphore("kept", limit=5) for _ in range(5)]
    gates = [asyncio.Event() for _ in sems]
    entered = asyncio.Event()
    inside = 0

    async def hold(sem: Semaphore, gate: asyncio.Event) -> None:
        nonlocal inside
        async with sem:
            inside += 1
            if inside == len(sems):
                entered.set()
            await gate.wait()

    tasks: list[asyncio.Task[None]] = []
    if extended_by == "watchdog":
        tasks = [asyncio.create_task(hold(sem, gate)) for sem, gate in zip(sems, gates, strict=True)]
        async with asyncio.timeout(5):
            await entered.wait()
    else:
        assert await asyncio.gather(*(sem.acquire(blocking=False) for sem in sems)) == [True] * 5
    high = []
    for sem, gate in zip(sems, gates, strict=True):
        if slot_of(cluster, "kept", sem) < 3:
            if extended_by == "watchdog":
                gate.set()
            else:
                await sem.release()
        else:
            high.append(sem)
    assert len(high) == 2
    held_until = time.monotonic() + 3 * ttl
    while time.monotonic() < held_until:
        if extended_by == "extend":
            await asyncio.gather(*(sem.extend() for sem in high))
        await asyncio.sleep(ttl / 4)
    assert all(sem.held for sem in high)
    limits = [cluster[i].command("GET", limit_key("kept")) for i in range(len(cluster))]
    assert limits == [b"5 layout-2"] * len(cluster), limits
    with pytest.raises(ValueError, match=r"held under limit 5, not 3"):
        await other.semaphore("kept", limit=3).acquire(blocking=False)
    for sem, gate in zip(sems, gates, strict=True):
        gate.set()
        if extended_by == "extend" and sem in high:
            await sem.release()
    await asyncio.gather(*tasks)
    empty: list[list[bytes]] = [[]] * len(cluster)
    assert await eventually(lambda: keys_everywhere(cluster) == empty, 4 * ttl), keys_everywhere(cluster)


# -- fencing counters -----------------------------------------------------------------------------------


def counter_key(name: str) -> bytes:
    return b"redlock-fence:" + name.encode()


def expire_everywhere(cluster: Cluster, *keys: bytes) -> None:
    """Let *keys* expire on every node now (a 1 ms ttl, run out)."""
    for i in range(len(cluster)):
        for key in keys:
            cluster[i].command("PEXPIRE", key, 1)
    time.sleep(0.005)
    for i in range(len(cluster)):
        for key in keys:
            assert cluster[i].command("EXISTS", key) == 0


async def test_fencing_counters_never_expire_by_default_and_would_restart_at_one(
    cluster: Cluster, redlock: Redlock
) -> None:
    """The default (fence_ttl=None): a counter has no ttl. Expired anyway (by hand here), it restarts at 1:
    the reason counters do not expire without the floor (docs/fencing.md)."""
    lock = redlock.lock("forever", fencing=True)
    for expected in (1, 2, 3):
        assert await lock.acquire(blocking=False)
        assert lock.fencing_token == expected
        await lock.release()
    assert pttls(cluster, counter_key("forever")) == [-1] * len(cluster)
    expire_everywhere(cluster, counter_key("forever"))
    assert await lock.acquire(blocking=False)
    assert lock.fencing_token == 1  # backwards: a paused holder of token 3 would now win over this one
    await lock.release()


async def test_with_fence_ttl_counters_expire_and_tokens_never_go_backwards(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """fence_ttl: every counter a grant raised carries that ttl (PTTL on every node), tokens are at least
    the node's clock in microseconds, and after the counters expired the next token is still larger."""
    redlock = await make_redlock(fencing=True, fence_ttl=3600.0, ttl=1.0)
    lock = redlock.lock("bounded")
    tokens: list[int] = []
    for round_ in range(6):
        before_us = time.time_ns() // 1000
        assert await lock.acquire(blocking=False)
        token = lock.fencing_token
        assert token is not None
        assert token >= before_us - 1_000_000  # the nodes' clock (this machine's; a second of slack)
        assert all(3_590_000 < left <= 3_600_000 for left in pttls(cluster, counter_key("bounded")))
        # Its fencer (which inspection reads) lives as long: nothing of a name outlives fence_ttl.
        assert all(3_590_000 < left <= 3_600_000 for left in pttls(cluster, counter_key("bounded") + b"\x00by"))
        tokens.append(token)
        await lock.release()
        if round_ % 2:
            expire_everywhere(cluster, counter_key("bounded"))
    assert tokens == sorted(set(tokens)), tokens  # strictly growing, across three expiries


async def test_with_fence_ttl_a_counter_ahead_of_the_clock_still_orders_the_grants(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """The floor only ever raises a token: a counter ahead of every clock (a node whose clock ran ahead
    when it was written) is still counted on, and kept (its ttl pushed, not cut)."""
    redlock = await make_redlock(fencing=True, fence_ttl=3600.0)
    ahead = time.time_ns() // 1000 + 10**12  # about 11 days ahead
    for i in range(len(cluster)):
        cluster[i].command("SET", counter_key("ahead"), ahead)
    lock = redlock.lock("ahead")
    assert await lock.acquire(blocking=False)
    assert lock.fencing_token == ahead + 1
    assert all(3_590_000 < left <= 3_600_000 for left in pttls(cluster, counter_key("ahead")))
    await lock.release()


async def test_with_fence_ttl_lock_many_and_elections_bound_their_counters(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    redlock = await make_redlock(fence_ttl=600.0)
    many = redlock.lock_many(["m1", "m2"], fencing=True)
    assert await many.acquire(blocking=False)
    first = many.fencing_tokens
    assert first is not None
    for name in ("m1", "m2"):
        assert all(590_000 < left <= 600_000 for left in pttls(cluster, counter_key(name)))
        assert all(590_000 < left <= 600_000 for left in pttls(cluster, counter_key(name) + b"\x00by"))
    await many.release()
    expire_everywhere(cluster, counter_key("m1"), counter_key("m2"))
    assert await many.acquire(blocking=False)
    again = many.fencing_tokens
    assert again is not None
    assert all(again[name] > first[name] for name in ("m1", "m2")), (first, again)
    await many.release()

    election = redlock.election("leader")
    async with election.campaign() as term:
        assert all(590_000 < left <= 600_000 for left in pttls(cluster, counter_key("leader")))
    expire_everywhere(cluster, counter_key("leader"))
    async with election.campaign() as later:
        assert later > term


def test_fence_ttl_is_checked_with_a_message_that_says_what_to_change() -> None:
    urls = ["redis://127.0.0.1:1"]
    for bad, message in (
        (0, r"fence_ttl must be > 0 seconds"),
        (-5.0, r"fence_ttl must be > 0 seconds"),
        (float("inf"), r"fence_ttl must be finite"),
        (30.0, r"fence_ttl \(30.0 s\) must be at least 100.0 s .*a day \(86400\) suits most"),
        (99.0, r"must be at least 100.0 s"),
    ):
        with pytest.raises(ValueError, match=message):
            Redlock(urls, fencing=True, fence_ttl=bad)
    with pytest.raises(TypeError, match=r"fence_ttl must be a number of seconds"):
        Redlock(urls, fence_ttl="1d")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"at least 60.0 s"):
        Redlock(urls, ttl=1.0, fence_ttl=59.0)
    redlock = Redlock(urls, ttl=1.0, fence_ttl=3600.0)
    redlock.lock("fine", fencing=True, ttl=360.0)  # 10 ttls exactly
    with pytest.raises(ValueError, match=r"fence_ttl \(3600.0 s\) must be at least 4000.0 s .*ttl of 400.0 s"):
        redlock.lock("long", fencing=True, ttl=400.0)


@pytest.mark.serial
@needs_faketime
async def test_with_fence_ttl_counters_expired_by_the_nodes_clocks_still_give_larger_tokens() -> None:
    """Real expiry, by the nodes' own clocks (libfaketime), with one node 30 s ahead of the others (well
    within fence_ttl). Its clock sets the first token; every clock then moves on past fence_ttl, so the
    counters expire by themselves; with the fast node stopped, the two others grant by their clocks, and
    the token is still larger. Stepped back to the real time, every clock is now behind the last token:
    the counter, written a moment ago, orders the next grant."""
    with LocalNodes(3, clock=True) as nodes:
        nodes[0].clock.step(30)
        # clock_guard=False: every clock is stepped on purpose, and the guard would (rightly) sit each stepped
        # node out of the quorum for a ttl; the counters' expiry by the nodes' own clocks is under test.
        async with Redlock(nodes.urls, fencing=True, fence_ttl=3600.0, ttl=1.0, clock_guard=False) as redlock:
            lock = redlock.lock("clocked")
            nodes[1].pause()  # the grant's majority is then 0 and 2: the token comes from the node ahead
            try:
                assert await lock.acquire(blocking=False)
            finally:
                nodes[1].resume()
            first = lock.fencing_token
            assert first is not None
            assert first > (time.time_ns() // 1000) + 25_000_000  # from the node 30 s ahead
            await lock.release()
            for node in nodes:
                node.clock.step(3700)  # fence_ttl and more: the counters expire by themselves
            assert [node.command("EXISTS", counter_key("clocked")) for node in nodes] == [0, 0, 0]
            nodes[0].pause()
            try:
                assert await lock.acquire(blocking=False)
                second = lock.fencing_token
                assert second is not None
                assert second > first
                await lock.release()
            finally:
                nodes[0].resume()
            for node in nodes:
                node.clock.reset()  # back an hour: behind the last token, on every node
            assert await lock.acquire(blocking=False)
            third = lock.fencing_token
            assert third is not None
            assert third > second
            assert third > (time.time_ns() // 1000) + 3_000_000_000  # from the counter: an hour ahead of every clock
            await lock.release()
