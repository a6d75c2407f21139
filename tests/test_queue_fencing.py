"""Fenced locks through the grant queue (``Redlock(queue=True, fencing=True)``; docs/fencing.md, "Fenced
grants from the queue"): a grant from the queue carries the fencing counter the node read in the same step
(in the grant's word, or in the reply to the waiter's own script), and a fenced waiter that holds a majority
raises the counters of a majority to its token (``QUEUE_FENCE``) before its grant counts.

Checked against real servers: fencing tokens strictly grow in the order the bodies ran, across 4 OS
processes and with clients with and without the queue (fenced and not) on one name; the two sequences that
break a token chosen without the counters in the words, or without the fence round; a waiter cancelled in
any loop turn around its grant (fence round included) leaves no key for no one and no token out of order;
a node restarted empty (its quarantine keeps its empty counter out of the choice); a slow network; uvloop;
elections campaigning through the queue; and fence_ttl's counters with their ttl and clock floor.

The other OS processes run tests/test_queue.py's child (``python -m tests.test_queue contend ... fenced``).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import time
from typing import Any

import pytest
import uvloop

from redlock_async import LockNotAcquired, Redlock
from redlock_async._core._algorithm import Vote
from redlock_async._queue import queue_keys
from redlock_async.lock import Lock
from redlock_async.testing import History, LocalNodes
from redlock_async.testing._history import Section

from .conftest import (
    CHILDREN_TIMEOUT,
    ROUNDS,
    TURNS_WITHOUT,
    Cluster,
    MakeRedlock,
    eventually,
    finish_child,
    keys_everywhere,
    kill_child,
    passed_over,
    start_module,
    start_together,
)

SLOW = 5.0
"""A retry delay so long that within these tests only a grant can explain a waiter's prompt lock."""

PROMPT = 1.0
"""How soon a waiter must hold the lock once it is handed on (~1 ms on loopback; 1 s for a noisy box)."""

BOUND = 10.0
"""The acquire timeout in the contention tests: a client starved for this long fails loudly."""

NAME = "fq"


def key_of(name: str) -> bytes:
    return b"redlock:" + name.encode()


def counter_of(name: str) -> bytes:
    return b"redlock-fence:" + name.encode()


def counters_on(cluster: Any, name: str) -> list[int]:
    return [int(cluster[i].command("GET", counter_of(name)) or 0) for i in range(len(cluster))]


def pttls_of(cluster: Any, key: bytes) -> list[int]:
    return [int(cluster[i].command("PTTL", key)) for i in range(len(cluster))]


def line_lengths(cluster: Any, name: str) -> list[int]:
    queue = queue_keys(key_of(name))[1]
    return [int(cluster[i].command("ZCARD", queue)) for i in range(len(cluster))]


async def in_line(cluster: Any, name: str, waiters: int, within: float = 10.0) -> None:
    assert await eventually(lambda: min(line_lengths(cluster, name)) >= waiters, within), line_lengths(cluster, name)


def no_lock_keys(cluster: Any) -> bool:
    """No lock key and no line is left on any node (fencing counters stay: they never expire)."""
    return all(not any(k.startswith(b"redlock:") for k in keys) for keys in keys_everywhere(cluster))


# -- contention with other OS processes ------------------------------------------------------------------


async def contend(
    urls: list[str],
    clients: list[tuple[str, Redlock, int]],
    seconds: float,
    children: list[tuple[int, bool, bool]] = (),  # type: ignore[assignment]
    rounds: int | None = None,
) -> tuple[History, collections.Counter[str], int]:
    """Tasks of Redlocks of this process and of other OS processes (``(tasks, queue, fencing)`` each), started
    together, take NAME for *seconds* (with *rounds*: each task until it held it that many times, within
    *seconds*): the merged history, the grants per client and the acquires that timed out."""
    history = History()
    timeouts = [0]
    processes = [
        await start_module(
            # The child of tests/test_queue.py, which records each section's fencing token too.
            *("tests.test_queue", "contend", ",".join(urls), NAME, str(tasks)),
            *(str(SLOW if queue else 0.2), "queue" if queue else "plain", "fenced" if fencing else "unfenced"),
            stdin=True,
        )
        for tasks, queue, fencing in children
    ]
    try:
        stop = await start_together(processes, seconds, rounds=rounds)
    except BaseException:
        for process in processes:
            await kill_child(process)
        raise

    async def worker(client: str, redlock: Redlock) -> None:
        lock = redlock.lock(NAME, acquire_timeout=BOUND)
        done = 0
        while time.monotonic() < stop and (rounds is None or done < rounds):
            try:
                async with lock:
                    with history.section(client, lock):
                        await asyncio.sleep(0.0005)
                    done += 1
            except LockNotAcquired:
                timeouts[0] += 1
            await asyncio.sleep(0.001)

    workers = [asyncio.create_task(worker(f"{label}.{n}", r)) for label, r, tasks in clients for n in range(tasks)]
    try:
        async with asyncio.timeout(seconds + BOUND + 20):
            await asyncio.gather(*workers)
            for process in processes:
                rows = await finish_child(process, BOUND + 20)
                timeouts[0] += rows.pop()["timeouts"]
                for client, token, fencing_token, start, end, _ in rows:
                    history.sections.append(Section(client, token, fencing_token, start, end))
    finally:
        for task in workers:
            task.cancel()
        for process in processes:
            await kill_child(process)
    grants = collections.Counter(section.client.split(".")[0] for section in history.sections)
    return history, grants, timeouts[0]


def check_fenced(history: History, fenced: set[str] | None = None) -> None:
    """No overlap, fencing tokens strictly growing in the order the bodies ran; every section of a fenced
    client (by label prefix; None: every section) has a token."""
    history.check()
    assert not history.fencing_regressions()
    for section in history.sections:
        if fenced is None or section.client.split(".")[0] in fenced or section.client.startswith("pid"):
            assert section.fencing_token is not None, section


# -- 1. across processes ------------------------------------------------------------------------------------


@pytest.mark.serial  # 4 processes at once: beside the parallel legs they would slow those more than themselves
@pytest.mark.timeout(CHILDREN_TIMEOUT)
async def test_fenced_tokens_grow_in_the_order_bodies_ran_across_four_processes(cluster: Cluster) -> None:
    """This process (2 tasks) and 3 others (2 tasks each), all queue=True and fencing=True, retry delay SLOW
    (only grants move the lock promptly), started together, each task taking the lock ROUNDS times: no
    overlap, every token strictly larger than the one of the body before it (one history across the 4
    processes), every task served all its rounds, and none starved: the queue serves the line, not the
    quickest process, so no process goes more than TURNS_WITHOUT turns of the line without the lock.

    Counted in grants, not in seconds or as a share of changes of process, so a loaded box (which slows
    every process, and used to start the 3 children seconds apart) does not move it: the share of grants
    that changed process fell to 0.386 once in CI (bar 0.4) and to 0.17 to 0.37 here, while the
    processes, started up to 10 s apart, barely overlapped."""
    async with Redlock(cluster.urls, queue=True, fencing=True, retry_delay=SLOW) as redlock:
        history, grants, timeouts = await contend(
            cluster.urls, [("here", redlock, 2)], 60.0, [(2, True, True)] * 3, rounds=ROUNDS
        )
    check_fenced(history)
    owners = [s.client.split(".")[0] for s in sorted(history.sections, key=lambda s: s.start)]
    without = passed_over(owners)
    print(f"grants {dict(grants)}, most grants to others between two of a process {without}, timeouts {timeouts}")
    assert timeouts == 0
    assert len(grants) == 4, grants
    assert set(grants.values()) == {2 * ROUNDS}, grants
    assert max(without.values()) <= TURNS_WITHOUT * 8, without
    assert await eventually(lambda: no_lock_keys(cluster), PROMPT), keys_everywhere(cluster)


@pytest.mark.timeout(CHILDREN_TIMEOUT)
async def test_fenced_clients_with_and_without_the_queue_share_one_order_of_tokens(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """On one name for 3 s: a queue=True fenced Redlock, a queue=False fenced one, a queue=True unfenced one
    (its releases grant fenced waiters: their words must carry the counter) of this process, and another
    process with queue=False and fencing: no overlap, tokens strictly growing over every fenced body, and
    every client served (none starved)."""
    queued = await make_redlock(queue=True, fencing=True)
    plain = await make_redlock(fencing=True)
    unfenced = await make_redlock(queue=True)
    history, grants, timeouts = await contend(
        cluster.urls, [("q", queued, 2), ("p", plain, 2), ("u", unfenced, 1)], 3.0, [(2, False, True)]
    )
    check_fenced(history, fenced={"q", "p"})
    print(f"grants {dict(grants)}, timeouts {timeouts}")
    assert len(grants) == 4, grants  # q, p, u and the other process
    assert timeouts == 0, (timeouts, grants)
    assert await eventually(lambda: no_lock_keys(cluster), PROMPT), keys_everywhere(cluster)


# -- 2. the sequences a token choice must survive --------------------------------------------------------------


async def test_the_fence_round_makes_a_later_queued_grant_read_the_token(cluster: Cluster) -> None:
    """docs/fencing.md's sequence on 5 nodes, through the queue. Counters 10, 10, 1, 1, 1; nodes 3 and 4 held
    by someone else: A takes nodes 0, 1, 2 and gets 11. A releases; now nodes 0 and 1 are held by someone
    else, and B takes 2, 3, 4. Without A's fence round B would read 1, 1, 1 and get 2; it must get 12."""
    for i, counter in enumerate((10, 10, 1, 1, 1)):
        cluster[i].command("SET", counter_of("seq"), counter)
    async with (
        Redlock(cluster.urls, queue=True, fencing=True) as a,
        Redlock(cluster.urls, queue=True, fencing=True) as b,
    ):
        for i in (3, 4):
            cluster[i].command("SET", key_of("seq"), "someone else", "PX", 60_000)
        first = a.lock("seq")
        assert await first.acquire(blocking=False)
        assert first.fencing_token == 11
        await first.release()
        for i in (3, 4):
            cluster[i].command("DEL", key_of("seq"))
        for i in (0, 1):
            cluster[i].command("SET", key_of("seq"), "someone else", "PX", 60_000)
        second = b.lock("seq")
        assert await second.acquire(blocking=False)
        assert second.fencing_token == 12, second.fencing_token
        await second.release()
    assert counters_on(cluster, "seq") == [11, 11, 12, 12, 12]


async def test_a_grant_heard_as_words_carries_the_counters(cluster: Cluster) -> None:
    """Counters 10, 10, 10, 1, 1. A holds every node (token 11, raised everywhere by its fence round); B waits
    in line (retry delay SLOW). A's release grants B on every node by the word alone: B holds the lock
    promptly (no retry), with token 12, and B's own fence round raised the counters to 12."""
    for i, counter in enumerate((10, 10, 10, 1, 1)):
        cluster[i].command("SET", counter_of("words"), counter)
    async with (
        Redlock(cluster.urls, queue=True, fencing=True) as a,
        Redlock(cluster.urls, queue=True, fencing=True, retry_delay=SLOW) as b,
    ):
        holder = a.lock("words", ttl=30)
        assert await holder.acquire(blocking=False)
        assert holder.fencing_token == 11
        waiter = b.lock("words", ttl=30)
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        await in_line(cluster, "words", 1)
        await asyncio.sleep(0.1)
        released = time.monotonic()
        await holder.release()
        async with asyncio.timeout(PROMPT):
            assert await waiting
        assert time.monotonic() - released < PROMPT
        assert waiter.statistics().attempts == 2, waiter.statistics()  # the first try and one entry: no retry
        assert waiter.fencing_token == 12
        assert counters_on(cluster, "words") == [12] * 5
        # The fence named the holder beside the counter (what inspection reads): sha1 of its token.
        assert waiter.token is not None
        named = hashlib.sha1(waiter.token.encode()).hexdigest().encode()
        assert [cluster[i].command("GET", counter_of("words") + b"\x00by") for i in range(5)] == [named] * 5
        await waiter.release()


# -- 3. cancellation around a grant ----------------------------------------------------------------------------

TURNS = range(-1, 12)


@pytest.mark.parametrize("waiter_in", ["the-holders-redlock", "another-redlock"])
async def test_a_fenced_waiter_cancelled_around_its_grant_leaves_no_key_and_no_token_out_of_order(
    cluster: Cluster, make_redlock: MakeRedlock, waiter_in: str
) -> None:
    """A sweep over the moment of cancellation (the loop turn before the release, then k turns after it:
    before the grant, between the grant and the fence round, during it, after it): holder H, first waiter
    W1 (cancelled), second waiter W2 (retry delay SLOW). W2 must hold the lock promptly, with a token larger
    than H's and than any W1 may have had; nothing but the counters is left."""
    redlock = await make_redlock(queue=True, fencing=True, retry_delay=SLOW)
    other = redlock
    if waiter_in == "another-redlock":
        other = await make_redlock(queue=True, fencing=True, retry_delay=SLOW)
    third = await make_redlock(queue=True, fencing=True, retry_delay=SLOW)
    loop = asyncio.get_running_loop()
    ended: collections.Counter[str] = collections.Counter()
    for k in TURNS:
        holder = redlock.lock("turns", ttl=30)
        assert await holder.acquire(blocking=False), k
        tokens = [holder.fencing_token]
        first = other.lock("turns", ttl=30, acquire_timeout=20)

        async def take(first: Lock = first, tokens: list[int | None] = tokens) -> None:
            async with first:
                tokens.append(first.fencing_token)
                await asyncio.sleep(30)

        w1 = asyncio.create_task(take())
        await in_line(cluster, "turns", 1)
        second = third.lock("turns", ttl=30)
        w2 = asyncio.create_task(second.acquire(timeout=20))
        await in_line(cluster, "turns", 2)
        await asyncio.sleep(0.1)
        if k < 0:
            loop.call_soon(w1.cancel)
        releasing = asyncio.ensure_future(holder.release())
        for _ in range(max(k, 0)):
            await asyncio.sleep(0)
        if k >= 0:
            w1.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w1
        ended["held it" if len(tokens) > 1 else "cancelled waiting"] += 1
        done, _ = await asyncio.wait({w2}, timeout=PROMPT)
        if not done:
            w2.cancel()
            raise AssertionError(f"k={k}: W2 not served within {PROMPT} s; counters {counters_on(cluster, 'turns')}")
        assert w2.result(), k
        assert second.fencing_token is not None
        assert all(t is not None and second.fencing_token > t for t in tokens), (k, tokens, second.fencing_token)
        await releasing
        await second.release()
        assert await eventually(lambda: no_lock_keys(cluster), PROMPT), (k, keys_everywhere(cluster))
    print(f"{waiter_in}: {dict(ended)}")


# -- 4. faults -------------------------------------------------------------------------------------------------------


async def test_a_node_restarted_empty_keeps_tokens_growing(faulty: Cluster) -> None:
    """Two queue=True fenced Redlocks (3 + 2 tasks, ttl 1 s) contend while node 2, then node 3, restart
    without their data (counters gone too): no overlap, tokens strictly growing (a restarted node sits out
    its quarantine, so its empty counter never decides a token), grants going on, none with the restarted
    node's vote inside its quarantine."""
    ttl = 1.0
    restarts: list[tuple[int, float]] = []
    votes: list[tuple[float, list[Vote]]] = []
    history = History()
    timeouts = [0]
    stop = time.monotonic() + 4.0

    async def chaos() -> None:
        await asyncio.sleep(0.4)
        await asyncio.to_thread(faulty[2].restart, keep_data=False)
        restarts.append((2, time.monotonic()))
        await asyncio.sleep(ttl + 0.5)
        await asyncio.to_thread(faulty[3].restart, keep_data=False)
        restarts.append((3, time.monotonic()))

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

    redlocks = [Redlock(faulty.urls, queue=True, fencing=True, ttl=ttl, retry_delay=0.2) for _ in range(2)]
    try:
        for redlock in redlocks:
            await redlock.connect()
        async with asyncio.timeout(30):
            await asyncio.gather(chaos(), *(client(f"r{n % 2}.{n}", redlocks[n % 2]) for n in range(5)))
    finally:
        for redlock in redlocks:
            await redlock.aclose()
    check_fenced(history)
    print(f"grants {len(history.sections)}, timeouts {timeouts[0]}")
    assert timeouts[0] == 0
    assert len(history.sections) >= 50, len(history.sections)
    for node, restarted in restarts:
        quarantined = [v for t, v in votes if restarted <= t < restarted + ttl * 0.9]
        assert quarantined, (node, "no grant during the quarantine")
        assert all(v[node] is not Vote.YES for v in quarantined), (node, quarantined[:5])


async def test_on_a_slow_network_fenced_hand_offs_go_by_the_grant() -> None:
    """Every node 50-100 ms away (round trip). Two queue=True fenced Redlocks (2 + 1 tasks, retry delay
    SLOW) for 4 s: no overlap, tokens strictly growing, every task served, and the lock moves by grants
    (with the fence round, ~2 round trips per hand-off), not by retry timers (first at 2.5 s)."""
    one_way = [0.025, 0.05, 0.035, 0.045, 0.03]
    with LocalNodes(5, proxied=True) as nodes:
        for node, delay in zip(nodes, one_way, strict=True):
            node.proxy.latency(delay)
        async with (
            Redlock(nodes.urls, queue=True, fencing=True, retry_delay=SLOW) as first,
            Redlock(nodes.urls, queue=True, fencing=True, retry_delay=SLOW) as second,
        ):
            history, grants, timeouts = await contend(nodes.urls, [("r0", first, 2), ("r1", second, 1)], 4.0)
        check_fenced(history)
        print(f"grants {dict(grants)}, sections {len(history.sections)}, timeouts {timeouts}")
        assert timeouts == 0
        assert len({s.client for s in history.sections}) == 3, grants
        assert len(history.sections) >= 10, len(history.sections)
        nodes.heal()


def test_fenced_contention_on_uvloop(cluster: Cluster) -> None:
    """On uvloop: two queue=True fenced Redlocks (3 + 2 tasks, retry delay SLOW) for 1.5 s: no overlap,
    tokens strictly growing, every task served many times (only grants move the lock that fast)."""

    async def main() -> None:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        async with (
            Redlock(cluster.urls, queue=True, fencing=True, retry_delay=SLOW) as first,
            Redlock(cluster.urls, queue=True, fencing=True, retry_delay=SLOW) as second,
        ):
            history, grants, timeouts = await contend(cluster.urls, [("a", first, 3), ("b", second, 2)], 1.5)
        check_fenced(history)
        assert timeouts == 0
        assert len({s.client for s in history.sections}) == 5, grants
        assert len(history.sections) >= 50, len(history.sections)

    uvloop.run(main())


# -- 5. elections and fence_ttl ------------------------------------------------------------------------------------


async def test_elections_campaign_through_the_queue(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Three candidates of two queue=True Redlocks (retry delay SLOW) lead in turn: each resignation hands
    leadership on by the grant (promptly: no retry timer), candidates wait in the nodes' line, and the terms
    strictly grow."""
    first = await make_redlock(queue=True, retry_delay=SLOW)
    second = await make_redlock(queue=True, retry_delay=SLOW)
    terms: list[int] = []
    handed: list[float] = []
    resigned: list[float] = []

    async def candidate(election: Any) -> None:
        for _ in range(3):
            async with election.campaign(timeout=20) as term:
                if resigned:
                    handed.append(time.monotonic() - resigned[-1])
                terms.append(term)
                await asyncio.sleep(0.05)
                resigned.append(time.monotonic())

    async with asyncio.timeout(20):
        await asyncio.gather(
            candidate(first.election("chair")), candidate(second.election("chair")), candidate(first.election("chair"))
        )
    print(f"terms {terms}, hand-offs {[round(h, 4) for h in handed]}")
    assert len(terms) == 9
    assert terms == sorted(terms), terms
    assert len(set(terms)) == 9, terms
    assert max(handed) < PROMPT, handed


async def test_fence_ttl_counters_of_queued_grants_expire_and_never_go_back(cluster: Cluster) -> None:
    """fence_ttl=300 with the queue: a grant handed on by the queue writes the counter with its ttl on every
    node, and its token is at least the nodes' clock in microseconds (the floor), larger than the token
    before it; with every counter deleted (expired), the next token is still larger."""
    async with (
        Redlock(cluster.urls, queue=True, fencing=True, fence_ttl=300) as a,
        Redlock(cluster.urls, queue=True, fencing=True, fence_ttl=300, retry_delay=SLOW) as b,
    ):
        holder = a.lock("ttl", ttl=30)
        assert await holder.acquire(blocking=False)
        first = holder.fencing_token
        assert first is not None
        assert first > 1e15
        waiter = b.lock("ttl", ttl=30)
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        await in_line(cluster, "ttl", 1)
        await asyncio.sleep(0.1)
        await holder.release()
        async with asyncio.timeout(PROMPT):
            assert await waiting
        second = waiter.fencing_token
        assert second is not None
        assert second > first
        pttls = pttls_of(cluster, counter_of("ttl"))
        assert all(295_000 < p <= 300_000 for p in pttls), pttls
        await waiter.release()
        for i in range(len(cluster)):
            cluster[i].command("DEL", counter_of("ttl"))
        third = a.lock("ttl")
        assert await third.acquire(blocking=False)
        assert third.fencing_token is not None
        assert third.fencing_token > second
        await third.release()
