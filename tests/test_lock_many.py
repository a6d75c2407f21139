"""lock_many: several names held all at once (every one on a majority, or none), on real nodes."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterator

import pytest

from redlock_async import Lock, LockLost, Redlock
from redlock_async._core._algorithm import Vote
from redlock_async._core._names import MAX_NAMES
from redlock_async.testing import History, LocalNodes
from redlock_async.testing._history import Section

from .conftest import Cluster, MakeRedlock, assert_empty, eventually, keys_everywhere, lock_keys

KEY = "redlock:{}"
SLOW_POLL = 2.0  # a retry delay so long that a grant within a fraction of it can only be a notification


# -- names -------------------------------------------------------------------------------------------


async def test_names_are_deduplicated_and_sorted_by_their_bytes(cluster: Cluster, redlock: Redlock) -> None:
    assert redlock.lock_many(["b", "a", "b", "a"]).names == ("a", "b")
    assert redlock.lock_many(("b", "a")).name == ("a", "b")
    assert redlock.lock_many(name for name in ["c", "b"]).names == ("b", "c")  # any iterable
    # str and bytes mix; the order is the encoded bytes' (b"\xff" is no UTF-8, and sorts last).
    assert redlock.lock_many([b"\xff", "\u00e9", "z", b"A"]).names == (b"A", "z", "\u00e9", b"\xff")
    # Equal spellings are one name (the same key): the first spelling given stays.
    assert redlock.lock_many(["a", b"a", "b", b"b"]).names == ("a", "b")
    assert redlock.lock_many([b"b", "a", "b"]).names == ("a", b"b")
    assert redlock.lock_many(["\u00e9", "\u00e9".encode()]).names == ("\u00e9",)
    # One name left: a lock on it, the same as lock().
    single = redlock.lock_many(["a", b"a"])
    assert single.names == ("a",)
    assert single.name == "a"

    # The keys are the single locks' keys, whatever the spelling.
    lock = redlock.lock_many([b"b", "a", "a"])
    async with lock:
        both = [[b"redlock:a", b"redlock:b"]] * len(cluster)
        assert await eventually(lambda: keys_everywhere(cluster) == both, 1.0), keys_everywhere(cluster)
    await assert_empty(cluster)


async def test_bad_names_are_refused_with_a_message_that_says_what_to_do(redlock: Redlock) -> None:
    with pytest.raises(TypeError, match=r"list of names.*got str.*use lock\(\)"):
        redlock.lock_many("ab")
    with pytest.raises(TypeError, match=r"list of names.*got bytes.*use lock\(\)"):
        redlock.lock_many(b"ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"list of names.*got int"):
        redlock.lock_many(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"list of names.*got NoneType"):
        redlock.lock_many(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one name"):
        redlock.lock_many([])
    with pytest.raises(ValueError, match="at least one name"):
        redlock.lock_many(iter(()))
    with pytest.raises(TypeError, match="must be str or bytes, got int"):
        redlock.lock_many(["a", 1])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="must be str or bytes, got NoneType"):
        redlock.lock_many(["a", None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="must be str or bytes, got tuple"):
        redlock.lock_many([("a", "b")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="empty"):
        redlock.lock_many(["a", ""])
    with pytest.raises(ValueError, match=f"more than {MAX_NAMES}"):
        redlock.lock_many([f"n{i}" for i in range(MAX_NAMES + 1)])
    # The other way round: a list given to lock() points to lock_many().
    with pytest.raises(TypeError, match=r"use lock_many\(\)"):
        redlock.lock(["a", "b"])  # type: ignore[call-overload]


# -- mutual exclusion with single locks --------------------------------------------------------------


async def test_lock_many_and_single_locks_on_shared_names_exclude_each_other(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    one, other = await make_redlock(), await make_redlock()

    # lock_many holds a and b: neither can be had alone, nor in another lock_many; c can.
    many = one.lock_many(["a", "b"])
    assert await many.acquire(blocking=False)
    for name in ("a", "b"):
        lock = other.lock(name)
        assert not await lock.acquire(blocking=False), f"lock({name!r}) granted while lock_many held it"
        assert [o.vote for o in lock.outcomes].count(Vote.NO) >= 3
    assert not await other.lock_many(["b", "c"]).acquire(blocking=False)
    c = other.lock("c")
    assert await c.acquire(blocking=False)
    await c.release()
    assert not await other.lock("b").acquire(timeout=0.3)
    await many.release()
    # The release waits for the nodes that granted; a node that answered late gets it a moment later.
    assert await eventually(lambda: keys_everywhere(cluster) == [[]] * len(cluster), 1.0), keys_everywhere(cluster)
    b = other.lock("b")
    assert await b.acquire(blocking=False)

    # The other way round: lock("b") held, so lock_many of a and b cannot be had, and takes nothing.
    only_b = [[b"redlock:b"]] * len(cluster)
    for names in (["a", "b"], ["b", "a"], ["b", "z"], ["a", "b", "c"]):
        many = one.lock_many(names)
        assert not await many.acquire(blocking=False), f"lock_many({names}) granted while lock('b') held"
        assert await eventually(lambda: keys_everywhere(cluster) == only_b, 1.0), keys_everywhere(cluster)
    assert not await one.lock_many(["a", "b"]).acquire(timeout=0.3)
    await asyncio.sleep(0.05)  # the last attempt's scripts ran everywhere
    assert keys_everywhere(cluster) == only_b
    ac = one.lock_many(["a", "c"])
    assert await ac.acquire(blocking=False)
    await ac.release()
    await b.release()
    many = one.lock_many(["b", "a"])
    assert await many.acquire(blocking=False)
    await many.release()
    await assert_empty(cluster)


async def test_a_node_sets_every_name_or_none(cluster: Cluster, redlock: Redlock) -> None:
    """b is someone else's on nodes 0 and 1 only: lock_many of a, b, c wins on 2-4, and sets nothing on 0 and 1."""
    for i in (0, 1):
        cluster[i].command("SET", KEY.format("b"), "someone else", "PX", 60_000)
    lock = redlock.lock_many(["a", "b", "c"])
    assert await lock.acquire(blocking=False)
    votes = [o.vote for o in lock.outcomes]
    assert votes[2:] == [Vote.YES] * 3  # the grant was nodes 2-4's: nodes 0 and 1 cannot say yes
    assert set(votes[:2]) <= {Vote.NO, Vote.PENDING}  # a node whose answer was not needed may be undecided
    ours = [[b"redlock:a", b"redlock:b", b"redlock:c"]] * 3
    assert await eventually(lambda: keys_everywhere(cluster)[2:] == ours, 1.0), keys_everywhere(cluster)
    await asyncio.sleep(0.1)  # nodes 0 and 1 ran the script too by now
    assert keys_everywhere(cluster)[:2] == [[b"redlock:b"]] * 2  # no a, no c there: all or none
    assert [cluster[i].command("GET", KEY.format("b")) for i in (0, 1)] == [b"someone else"] * 2
    await lock.release()
    # The release leaves the other holder's keys alone.
    expected: list[list[bytes]] = [[b"redlock:b"]] * 2 + [[]] * 3
    assert await eventually(lambda: keys_everywhere(cluster) == expected, 1.0), keys_everywhere(cluster)
    assert [cluster[i].command("GET", KEY.format("b")) for i in (0, 1)] == [b"someone else"] * 2

    # b held on every node: nothing of a or c is set anywhere, whichever name comes first.
    for i in range(len(cluster)):
        cluster[i].command("SET", KEY.format("b"), "someone else", "PX", 60_000)
    for names in (["a", "b", "c"], ["b", "c"], ["a", "b"]):
        lock = redlock.lock_many(names)
        assert not await lock.acquire(blocking=False)
        assert [o.vote for o in lock.outcomes].count(Vote.NO) >= 3  # the rest may be undecided: no majority left
        await asyncio.sleep(0.05)  # the undecided nodes ran the script too
        assert keys_everywhere(cluster) == [[b"redlock:b"]] * len(cluster)


# -- contention ---------------------------------------------------------------------------------------


async def test_opposite_orders_on_two_redlocks_never_deadlock_or_overlap(make_redlock: MakeRedlock) -> None:
    """Tasks on two Redlocks lock [a, b] and [b, a] 50 times each, with single locks on a and b among
    them: all finish in a bounded time, and no two holders of a name were inside at once."""
    redlocks = [await make_redlock(retry_delay=0.05) for _ in range(2)]
    histories = {"a": History(), "b": History()}
    rounds = 50
    done = {"many": 0, "single": 0}

    async def many(n: int, names: list[str]) -> None:
        lock = redlocks[n % 2].lock_many(names, ttl=2.0, acquire_timeout=20.0)
        for _ in range(rounds):
            async with lock:
                assert lock.names == ("a", "b")
                with histories["a"].section(f"many{n}", lock), histories["b"].section(f"many{n}", lock):
                    await asyncio.sleep(0.001)
            done["many"] += 1

    async def single(n: int, name: str) -> None:
        lock = redlocks[n % 2].lock(name, ttl=2.0, acquire_timeout=20.0)
        for _ in range(rounds // 5):
            async with lock:
                with histories[name].section(f"single{n}", lock):
                    await asyncio.sleep(0.001)
            done["single"] += 1

    started = time.monotonic()
    async with asyncio.timeout(60):
        await asyncio.gather(
            many(0, ["a", "b"]),
            many(1, ["b", "a"]),
            many(2, ["a", "b"]),
            many(3, ["b", "a"]),
            single(0, "a"),
            single(1, "b"),
        )
    took = time.monotonic() - started
    assert done == {"many": 4 * rounds, "single": 2 * (rounds // 5)}
    assert took < 30, f"{took:.1f} s for {4 * rounds} lock_many grants"
    for history in histories.values():
        history.check()
    assert len(histories["a"].sections) == 4 * rounds + rounds // 5


@contextlib.contextmanager
def sections(histories: dict[str, History], client: str, lock: Lock) -> Iterator[None]:
    """Record the block in the history of each name *lock* holds, with that name's own fencing token."""
    token, tokens = lock.token or "?", lock.fencing_tokens or {}
    start = time.monotonic()
    try:
        yield
    finally:
        end = time.monotonic()
        for name in lock.names:
            assert isinstance(name, str)
            histories[name].sections.append(Section(client, token, tokens.get(name), start, end))


@pytest.mark.serial
@pytest.mark.slow
async def test_overlapping_lock_manys_and_single_locks_while_minorities_are_slow_or_silent() -> None:
    """Fenced lock_many of [a, b], [b, c], [c, a] and single locks of each, on 3 Redlocks, for 3 s while a
    changing pair of nodes is slow or black-holed: per name, no two holders at once and tokens that grow."""
    rng = random.Random(23)
    names = ["a", "b", "c"]
    histories = {name: History() for name in names}
    faults: list[str] = []
    with LocalNodes(5, proxied=True) as nodes:
        stop = time.monotonic() + 3.0

        async def chaos() -> None:
            while time.monotonic() < stop - 0.3:
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

        async def client(n: int, redlock: Redlock, wanted: list[str]) -> None:
            if len(wanted) > 1:
                lock = redlock.lock_many(wanted, ttl=1.0, acquire_timeout=5.0)
            else:
                lock = redlock.lock(wanted[0], ttl=1.0, acquire_timeout=5.0)
            while time.monotonic() < stop:
                async with lock:
                    if len(wanted) > 1:
                        assert lock.fencing_tokens is not None
                        assert set(lock.fencing_tokens) == set(wanted)
                    with sections(histories, f"client{n}", lock):
                        await asyncio.sleep(rng.uniform(0.0, 0.005))

        wants = [["a", "b"], ["b", "c"], ["c", "a"], ["a"], ["b"], ["c"]] * 2
        redlocks = [Redlock(nodes.urls, fencing=True, retry_delay=0.02) for _ in range(3)]
        try:
            for redlock in redlocks:
                await redlock.connect()
            async with asyncio.timeout(40):
                await asyncio.gather(chaos(), *(client(n, redlocks[n % 3], w) for n, w in enumerate(wants)))
        finally:
            for redlock in redlocks:
                await redlock.aclose()
        for history in histories.values():
            history.check()
            assert len(history.sections) > 30, faults
        assert len(faults) >= 6, faults
        assert await eventually(
            lambda: all(not any(k.startswith(b"redlock:") for k in ks) for ks in keys_everywhere(nodes)), 2.0
        ), keys_everywhere(nodes)


# -- nothing left behind ------------------------------------------------------------------------------


async def test_nothing_is_left_after_a_lock_many_that_failed(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    holder, other = await make_redlock(), await make_redlock(retry_delay=0.02)
    b = holder.lock("b")
    assert await b.acquire()
    lock = other.lock_many(["a", "b", "c"])
    assert not await lock.acquire(blocking=False)
    assert not await lock.acquire(timeout=0.3)
    assert lock.statistics().attempts > 1
    with pytest.raises(asyncio.TimeoutError):
        async with asyncio.timeout(0.2):
            await lock.acquire(timeout=10.0)  # cancelled while waiting
    await assert_empty(cluster, b"redlock:b")
    await b.release()
    await assert_empty(cluster)


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("fencing", [False, True], ids=["plain", "fenced"])
async def test_nothing_is_left_after_a_lock_many_cancelled_mid_vote(fencing: bool) -> None:
    """Nodes 0 and 1 answer 0.3 s late and node 4 holds b, so the vote waits for a slow node:
    cancelled then, the late scripts still reach nodes 0 and 1, and are given back there."""
    with LocalNodes(5, proxied=True) as nodes:
        nodes[4].command("SET", KEY.format("b"), "someone else", "PX", 60_000)
        async with Redlock(nodes.urls, ttl=20.0, node_timeout=1.0, fencing=fencing) as redlock:
            for i in (0, 1):
                nodes[i].proxy.latency(0.3)
            lock = redlock.lock_many(["a", "b", "c"])
            started = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                async with asyncio.timeout(0.15):
                    await lock.acquire(blocking=False)
            assert time.monotonic() - started < 0.15 + 0.5
            assert not lock.held
            # The fast nodes said yes (their keys are given back at once); the slow ones get theirs late.
            assert await eventually(lambda: keys_everywhere(nodes)[2:4] == [[], []], 1.0), keys_everywhere(nodes)
            assert await eventually(lambda: keys_everywhere(nodes) == [[], [], [], [], [b"redlock:b"]], 2.0), (
                keys_everywhere(nodes)
            )
            nodes.heal()
            # Whatever arrived late was given back: the names can be had now (b aside).
            nodes[4].command("DEL", KEY.format("b"))
            assert await lock.acquire(timeout=2.0)
            await lock.release()
        assert await eventually(
            lambda: all(not any(k.startswith(b"redlock:") for k in ks) for ks in keys_everywhere(nodes)), 1.0
        )


# -- fencing -------------------------------------------------------------------------------------------


async def test_fencing_tokens_are_the_single_locks_counters(make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(fencing=True)
    singles: dict[str, list[int]] = {"a": [], "b": []}

    async def take_single(name: str) -> int:
        lock = redlock.lock(name)
        async with lock:
            assert lock.fencing_token is not None
            singles[name].append(lock.fencing_token)
            return lock.fencing_token

    for _ in range(3):
        await take_single("a")
    await take_single("b")
    assert singles["a"] == sorted(set(singles["a"]))

    many = redlock.lock_many(["b", "a", "c"])
    assert many.fencing_tokens is None  # not held yet
    async with many:
        tokens = many.fencing_tokens
        assert tokens is not None
        assert set(tokens) == {"a", "b", "c"}
        assert tokens["a"] > singles["a"][-1]
        assert tokens["b"] > singles["b"][-1]
        assert tokens["c"] >= 1
        assert many.fencing_token == tokens["a"]  # the first name's
    assert many.fencing_tokens is None  # released
    # Later single locks see the counters lock_many raised.
    assert await take_single("a") > tokens["a"]
    assert await take_single("b") > tokens["b"]
    lock_c = redlock.lock("c")
    async with lock_c:
        assert lock_c.fencing_token is not None
        assert lock_c.fencing_token > tokens["c"]
    # And the next lock_many is above those.
    async with many:
        again = many.fencing_tokens
        assert again is not None
        assert again["a"] > singles["a"][-1]
        assert again["b"] > singles["b"][-1]
        assert again["c"] > tokens["c"]

    unfenced = redlock.lock_many(["a", "b"], fencing=False)
    async with unfenced:
        assert unfenced.fencing_tokens is None
        assert unfenced.fencing_token is None


# -- the watchdog and losses ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_the_watchdog_keeps_a_lock_many_held(cluster: Cluster, redlock: Redlock) -> None:
    lock = redlock.lock_many(["a", "b", "c"], ttl=0.5)
    async with lock:
        await asyncio.sleep(2.0)  # four ttls
        assert lock.held
        assert lock.statistics().extensions >= 3
        for name in ("a", "b", "c"):
            assert lock.token is not None
            token = lock.token.encode()
            on = [i for i in range(len(cluster)) if cluster[i].command("GET", KEY.format(name)) == token]
            assert len(on) >= 3, f"{name} held on {on} only"
    await assert_empty(cluster)


@pytest.mark.serial
async def test_losing_one_name_loses_them_all(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """b deleted on a majority while the body runs: the body is cancelled with LockLost, and the keys of
    a and c are released, not left to expire."""
    # The watchdog extends 0.6 s into a 3 s lease: a and c would stay 2.4 s longer if not released.
    redlock = await make_redlock(extend_threshold=0.8)
    ttl = 3.0
    lock = redlock.lock_many(["a", "b", "c"], ttl=ttl)
    reached_the_end = False
    started = time.monotonic()
    with pytest.raises(LockLost, match="gone from a majority") as caught:
        async with lock:
            for i in (0, 1, 2):
                assert cluster[i].command("DEL", KEY.format("b")) == 1
            await asyncio.sleep(10 * ttl)
            reached_the_end = True
    lost_at = time.monotonic()
    assert not reached_the_end
    assert lost_at - started < ttl
    assert not lock.held
    assert caught.value.name == "a+b+c"
    # Released at the loss: gone well before the ttl of the grant could run out.
    await assert_empty(cluster)
    assert time.monotonic() - lost_at < 1.0
    # The names are free for others at once.
    other = await make_redlock()
    for name in ("a", "b", "c"):
        single = other.lock(name)
        assert await single.acquire(blocking=False)
        await single.release()


async def test_a_name_taken_over_on_a_majority_loses_the_lock(cluster: Cluster, redlock: Redlock) -> None:
    """c overwritten with another token on a majority: the extension is refused, the lock lost, and only
    our own keys are released (the new holder's c stays)."""
    lock = redlock.lock_many(["a", "c"], ttl=0.6)
    reached_the_end = False
    with pytest.raises(LockLost):
        async with lock:
            for i in (2, 3, 4):
                cluster[i].command("SET", KEY.format("c"), "thief", "PX", 60_000)
            await asyncio.sleep(6.0)
            reached_the_end = True
    assert not reached_the_end
    expected: list[list[bytes]] = [[]] * 2 + [[b"redlock:c"]] * 3
    assert await eventually(lambda: keys_everywhere(cluster) == expected, 1.0), keys_everywhere(cluster)
    assert [cluster[i].command("GET", KEY.format("c")) for i in (2, 3, 4)] == [b"thief"] * 3


# -- pushed hand-off -------------------------------------------------------------------------------


async def test_a_release_of_the_second_name_wakes_a_lock_many_waiter(make_redlock: MakeRedlock) -> None:
    # The release-word path (queue=False): the grant queue's lock_many is tests/test_queue_many.py's.
    holder, waiter = await make_redlock(queue=False), await make_redlock(queue=False, retry_delay=SLOW_POLL)
    b = holder.lock("b")
    assert await b.acquire()
    many = waiter.lock_many(["a", "b"])
    task = asyncio.create_task(many.acquire(timeout=10.0))
    await asyncio.sleep(0.3)  # tried, failed on b, listens
    assert not task.done()
    released = time.monotonic()
    await b.release()
    assert await task
    waited = time.monotonic() - released
    # Its retry timer would fire SLOW_POLL / 2 after its last try at the earliest: this was the release.
    assert waited < 0.5, f"woken {waited:.2f} s after the release"
    assert waiter.statistics().wakeups >= 1
    await many.release()


@pytest.mark.serial
async def test_a_lock_many_waiter_blocked_on_one_name_then_another_is_woken_by_each_release(
    make_redlock: MakeRedlock,
) -> None:
    """a and b held: the waiter is woken by a's release, finds b held, and is woken again by b's release,
    not by its retry timer."""
    # The release-word path (queue=False): the grant queue's lock_many is tests/test_queue_many.py's.
    holder, waiter = await make_redlock(queue=False), await make_redlock(queue=False, retry_delay=SLOW_POLL)
    a, b = holder.lock("a"), holder.lock("b")
    assert await a.acquire()
    assert await b.acquire()
    many = waiter.lock_many(["a", "b"])
    task = asyncio.create_task(many.acquire(timeout=10.0))
    await asyncio.sleep(0.3)
    assert many.statistics().attempts == 2  # its first try, and one more once it listened
    await a.release()
    # Woken by a's release, it finds b held (attempt 3), listens on b's channel and, subscribed anew,
    # looks once more (attempt 4: the two can follow each other within a millisecond).
    assert await eventually(lambda: many.statistics().attempts >= 3, 0.5)
    await asyncio.sleep(0.05)
    assert many.statistics().attempts == 4
    await asyncio.sleep(0.1)
    assert not task.done()
    assert waiter.statistics().wakeups == 1
    released = time.monotonic()
    await b.release()
    assert await task
    waited = time.monotonic() - released
    assert waited < 0.5, f"woken {waited:.2f} s after b's release (its retry timer, not the release?)"
    await many.release()


async def test_anyio_scopes_around_lock_many_leave_nothing_behind(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """A scope that times out while lock_many waits (one name held), and one cancelled while it holds
    both: no key of it is left, and the names can be had at once afterwards."""
    import anyio

    holder, other = await make_redlock(), await make_redlock()
    single = holder.lock("scoped:b")
    assert await single.acquire(blocking=False)
    with anyio.move_on_after(0.3) as waiting:
        async with other.lock_many(["scoped:a", "scoped:b"]):
            pytest.fail("lock_many while one of its names is held")
    assert waiting.cancelled_caught
    await single.release()
    both = other.lock_many(["scoped:a", "scoped:b"])
    with anyio.move_on_after(0.2) as holding:
        async with both:
            await anyio.sleep(5)
    assert holding.cancelled_caught
    assert not both.held
    assert await eventually(
        lambda: (
            not any(key.startswith(b"redlock:scoped:") for i in range(len(cluster)) for key in lock_keys(cluster[i]))
        ),
        2.0,
    )
    again = holder.lock_many(["scoped:b", "scoped:a"])
    assert await again.acquire(blocking=False)
    await again.release()
