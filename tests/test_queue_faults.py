"""The grant queue (``Redlock(queue=True)``), second round of attacks: what tests/test_queue.py leaves out.

* a slow network (50-100 ms round trips through proxies, command and subscriber connections alike):
  exclusion across two Redlocks and another process, and hand-offs by the grant, not by the retry timer;
  a give-up crossing its grant on the wire; a waiter whose connections are cut (or black-holed) just as
  its grant is published;
* nodes restarted behind the same address (empty, or with their data) while waiters are in line:
  exclusion against the holder the restart stripped (the quarantine), and the line recovers;
* waiters with different ttls in one line: a grant carries the waiter's own ttl, and a lock taken by a
  grant is kept by the watchdog and by extend();
* a wait longer than an entry's life: the entry stays, the place in line stays, the validity is sane;
* lock_many, semaphores and elections on a queue=True Redlock, on the names of queued locks;
* SIGTERM of a process holding or waiting, handled (asyncio cancellation) or not; a Redlock closed
  while one of its waiters is in line;
* many waiters: 3 processes x 4 tasks + this process, every task served, nothing left.

The other OS process is ``tests/_queue_faults_child.py``. Timing bounds are generous on purpose: the
box has 2 noisy cores running 5 servers, proxies and several Python processes; each bound says what
the mechanism needs and why the slack is there.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import signal
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from redlock_async import LockNotAcquired, Redlock
from redlock_async._core._algorithm import Vote
from redlock_async._queue import queue_keys
from redlock_async.testing import History, LocalNodes
from redlock_async.testing._history import Section

from .conftest import Cluster, MakeRedlock, eventually, keys_everywhere, kill_child, next_event, rest_of, start_module

ROOT = Path(__file__).resolve().parent.parent

SLOW = 5.0
"""A retry delay so long (the earliest fallback try 2.5 s after a failed one) that a waiter served
sooner than that was served by a grant (or a poke), never by its retry timer."""

PROMPT = 1.0
"""How soon a waiter must hold the lock once it is handed on: one script run and one published word
(~1 ms on loopback, ~2 one-way delays on a slow network); 1 s for a loaded box, far below SLOW / 2."""


# -- helpers -------------------------------------------------------------------------------------------


def key_of(name: str) -> bytes:
    return b"redlock:" + name.encode()


def queue_keys_of(name: str) -> list[bytes]:
    key = key_of(name)
    return list(queue_keys(key))


def line_lengths(nodes: Any, name: str) -> list[int]:
    """How many waiters each node keeps in *name*'s line (ZCARD of ``<key>\\x00queue``)."""
    return [int(nodes[i].command("ZCARD", queue_keys(key_of(name))[1])) for i in range(len(nodes))]


def line_order(nodes: Any, name: str, i: int) -> list[bytes]:
    """Node *i*'s line of *name*, first in line first."""
    members: list[bytes] = nodes[i].command("ZRANGE", queue_keys(key_of(name))[1], 0, -1)
    return members


def values_on(nodes: Any, name: str) -> list[object]:
    return [nodes[i].command("GET", key_of(name)) for i in range(len(nodes))]


def pttls_on(nodes: Any, name: str) -> list[int]:
    return [int(nodes[i].command("PTTL", key_of(name))) for i in range(len(nodes))]


def queue_keys_left(nodes: Any, names: list[str]) -> list[list[bytes]]:
    """Per node, which of the lock keys and queue keys of *names* exist."""
    wanted = [k for name in names for k in queue_keys_of(name)]
    return [[k for k in wanted if nodes[i].command("EXISTS", k) == 1] for i in range(len(nodes))]


async def in_line(nodes: Any, name: str, waiters: int, within: float = 10.0) -> None:
    """Wait until every node keeps at least *waiters* waiters in *name*'s line."""
    assert await eventually(lambda: min(line_lengths(nodes, name)) >= waiters, within), line_lengths(nodes, name)


async def nothing_left(nodes: Any, within: float) -> None:
    """No lock key and no queue key on any node (restart markers aside), within *within* seconds."""
    empty: list[list[bytes]] = [[] for _ in range(len(nodes))]
    assert await eventually(lambda: keys_everywhere(nodes) == empty, within), keys_everywhere(nodes)


def majority(values: list[object], value: object) -> bool:
    return sum(v == value for v in values) >= len(values) // 2 + 1


# -- other OS processes ----------------------------------------------------------------------------------


async def start_child(urls: list[str], mode: str, *args: str) -> asyncio.subprocess.Process:
    return await start_module("tests._queue_faults_child", mode, ",".join(urls), *args)


@contextlib.asynccontextmanager
async def children(urls: list[str], count: int, *args: str) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """*count* contend children (``args``: NAME SECONDS TASKS RETRY_DELAY BOUND), each connected
    (its "ready" printed) on entry; killed on the way out if still running."""
    processes = [await start_child(urls, "contend", *args) for _ in range(count)]
    try:
        for process in processes:
            assert "ready" in await next_event(process, 20)
        yield processes
    finally:
        for process in processes:
            await kill_child(process)


@dataclasses.dataclass
class Contention:
    history: History
    longest: dict[str, float]
    """Each task's longest acquire."""
    grants: collections.Counter[str]
    """Each task's critical sections."""
    timeouts: int


async def contend(
    local: list[tuple[str, Redlock, int]],
    name: str,
    seconds: float,
    bound: float,
    processes: Sequence[asyncio.subprocess.Process] = (),
) -> Contention:
    """Tasks of the Redlocks of *local* (``(label, redlock, tasks)``) take *name* (acquire timeout
    *bound*) for *seconds*, alongside the contend children *processes* (already running); the merged
    record."""
    history = History()
    longest: dict[str, float] = collections.defaultdict(float)
    timeouts = [0]
    stop = time.monotonic() + seconds

    async def worker(client: str, redlock: Redlock) -> None:
        lock = redlock.lock(name, acquire_timeout=bound)
        for _ in range(100_000):  # bounded: the clock ends it long before
            if time.monotonic() >= stop:
                break
            wanted = time.monotonic()
            try:
                async with lock:
                    longest[client] = max(longest[client], time.monotonic() - wanted)
                    with history.section(client, lock):
                        await asyncio.sleep(0.0005)
            except LockNotAcquired:
                timeouts[0] += 1
            await asyncio.sleep(0.001)

    workers = [
        asyncio.create_task(worker(f"{label}.{n}", redlock)) for label, redlock, tasks in local for n in range(tasks)
    ]
    try:
        async with asyncio.timeout(seconds + bound + 15):
            await asyncio.gather(*workers)
        for process in processes:
            rows, err = await rest_of(process, bound + 15)
            assert process.returncode == 0, err
            timeouts[0] += rows.pop()["timeouts"]
            for client, token, start, end, waited in rows:
                history.sections.append(Section(client, token, None, start, end))
                longest[client] = max(longest[client], waited)
    finally:
        for task in workers:
            task.cancel()
    grants = collections.Counter(section.client for section in history.sections)
    return Contention(history, dict(longest), grants, timeouts[0])


# -- 1. a slow network ------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_on_a_slow_network_hand_offs_go_by_the_grant_and_exclude() -> None:
    """Every node 50-100 ms away (a round trip; each proxy holds each chunk 25-50 ms each way, on the
    command and the subscriber connections of every client). Two queue=True Redlocks of this process
    (2 + 1 tasks) and another process (2 tasks), retry delay SLOW, take one key for 4 s: no two hold it
    at once (one History across processes); every task is served; and the lock moves by the grant: no
    acquire waits as long as the earliest retry timer (2.5 s), and dozens of hand-offs happen, where
    retry timers alone would manage a handful."""
    one_way = [0.025, 0.05, 0.035, 0.045, 0.03]
    with LocalNodes(5, proxied=True) as nodes:
        for node, delay in zip(nodes, one_way, strict=True):
            node.proxy.latency(delay)
        async with (
            Redlock(nodes.urls, queue=True, retry_delay=SLOW) as first,
            Redlock(nodes.urls, queue=True, retry_delay=SLOW) as second,
            children(nodes.urls, 1, "slow", "4", "2", str(SLOW), "10") as processes,
        ):
            result = await contend([("r0", first, 2), ("r1", second, 1)], "slow", 4.0, 10.0, processes)
            rtts = [node.round_trip or 0.0 for node in first.statistics().nodes]
        result.history.check()
        print(f"grants {dict(result.grants)}, longest waits {result.longest}, round trips {rtts}")
        assert all(0.04 < rtt < 1.0 for rtt in rtts), rtts  # the delay is really there
        assert result.timeouts == 0
        assert len(result.grants) == 5, result.grants  # every task of both Redlocks and of the child
        # A hand-off costs ~2 one-way delays to the third-nearest node (~70-90 ms): ~40 in 4 s. Retry
        # timers alone (5 tasks, one try per 2.5-7.5 s each) would give well under 10.
        assert sum(result.grants.values()) >= 15, result.grants
        # 5 tasks in line, ~0.1 s per hand-off: ~0.5 s; the earliest retry timer fires at 2.5 s.
        assert max(result.longest.values()) < 2.4, result.longest
        nodes.heal()
        await nothing_left(nodes, 3.0)


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("offset", [-0.05, 0.0])  # just before W1 gives up, and at the moment
async def test_on_a_slow_network_a_give_up_crossing_its_grant_hands_the_key_on(offset: float) -> None:
    """Nodes 100 ms away (a round trip). H holds; W1 (acquire timeout 0.8 s) is first in line, W2 (20 s)
    second, both with retry delay SLOW. H releases around W1's give-up (*offset* seconds from it), so the
    grant to W1 and W1's leave cross on the wire (a one-way trip is 50 ms). Whether W1 got the lock or
    left, W2 holds it within PROMPT + 0.5 s of the later of H's release and W1's end (the leave hands on
    a key granted meanwhile; a SLOW retry timer would take 2.5 s), no one overlaps, nothing is left."""
    with LocalNodes(5, proxied=True) as nodes:
        for node in nodes:
            node.proxy.latency(0.05)
        async with (
            Redlock(nodes.urls, queue=True, retry_delay=SLOW) as h_redlock,
            Redlock(nodes.urls, queue=True, retry_delay=SLOW) as w1_redlock,
            Redlock(nodes.urls, queue=True, retry_delay=SLOW) as w2_redlock,
        ):
            history = History()
            holder = h_redlock.lock("crossing", ttl=30)
            assert await holder.acquire(blocking=False)
            held_at = time.monotonic()
            w1 = w1_redlock.lock("crossing", ttl=30)
            w2 = w2_redlock.lock("crossing", ttl=30)
            w1_start = time.monotonic()
            t1 = asyncio.create_task(w1.acquire(timeout=0.8))
            await in_line(nodes, "crossing", 1, within=0.5)
            t2 = asyncio.create_task(w2.acquire(timeout=20))
            try:
                await in_line(nodes, "crossing", 2, within=0.5)
                await asyncio.sleep(max(0.0, w1_start + 0.8 + offset - time.monotonic()))
                await holder.release()
                released = time.monotonic()
                history.sections.append(Section("H", "h", None, held_at, released))
                async with asyncio.timeout(PROMPT + 0.5):
                    w1_held = await t1
                w1_end = time.monotonic()
                if w1_held:
                    with history.section("W1", w1):
                        pass
                    await w1.release()
                    w1_end = time.monotonic()
                done, _ = await asyncio.wait({t2}, timeout=PROMPT + 0.5)
                assert done, (
                    f"offset {offset}: W2 not served within {PROMPT + 0.5} s (W1 held: {w1_held}); "
                    f"values {values_on(nodes, 'crossing')}"
                )
                assert t2.result()
                served = time.monotonic() - max(released, w1_end)
                with history.section("W2", w2):
                    pass
                await w2.release()
            finally:
                t1.cancel()
                t2.cancel()
        history.check()
        print(f"offset {offset}: W1 held {w1_held}, W2 served {served:.3f} s after")
        assert served < PROMPT + 0.5, served
        nodes.heal()
        await nothing_left(nodes, 2.0)


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("fault", ["reset", "blackhole"])
async def test_a_waiter_whose_connections_are_cut_as_its_grant_goes_out_still_gets_it(fault: str) -> None:
    """H (straight to the servers) holds; W (through proxies, retry delay SLOW) waits in line. All of W's
    connections (command and subscriber) are cut (RST: the grant words published meanwhile are lost for
    good), or black-holed for 0.3 s (held, then delivered), and H releases at that moment. W must hold the
    lock within PROMPT of the heal (the re-subscription's confirmation makes it enter again and read
    that the key is its own), not at its retry timer 2.5-7.5 s later while the key sits held for it."""
    with LocalNodes(5, proxied=True) as nodes:
        async with (
            Redlock(nodes.direct_urls, queue=True) as h_redlock,
            Redlock(nodes.urls, queue=True, retry_delay=SLOW) as w_redlock,
        ):
            holder = h_redlock.lock("cut", ttl=30)
            assert await holder.acquire(blocking=False)
            waiter = w_redlock.lock("cut", ttl=30)
            waiting = asyncio.create_task(waiter.acquire(timeout=20))
            try:
                await in_line(nodes, "cut", 1)
                await asyncio.sleep(0.3)  # entered again once listening: it waits for a grant
                if fault == "reset":
                    for node in nodes:
                        node.proxy.reset()
                    await holder.release()
                else:
                    faults = [node.proxy.blackhole() for node in nodes]
                    await holder.release()
                    await asyncio.sleep(0.3)
                    for f in faults:
                        f.end()
                healed = time.monotonic()
                token = values_on(nodes, "cut")[0]
                assert isinstance(token, bytes)  # granted to W on the nodes
                done, _ = await asyncio.wait({waiting}, timeout=PROMPT)
                assert done, f"{fault}: W not served within {PROMPT} s; values {values_on(nodes, 'cut')}"
                assert waiting.result()
                served = time.monotonic() - healed
                assert waiter.token == token.decode()
                await waiter.release()
            finally:
                waiting.cancel()
        print(f"{fault}: served {served:.3f} s after the heal")
        assert served < PROMPT, served
        await nothing_left(nodes, 2.0)


# -- 2. nodes restarted behind the same address while waiters are in line ------------------------------------


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("keep_data", [False, True], ids=["empty", "with-data"])
async def test_a_majority_restarted_under_a_line_keeps_exclusion_and_the_line_recovers(
    faulty: Cluster, keep_data: bool
) -> None:
    """H holds (ttl 3 s, all five nodes, no watchdog); 4 waiters of two other Redlocks (same ttl, so
    the same restart quarantine) wait in line. Nodes 0, 1 and 2 restart on their addresses (empty: H's
    key and every entry gone there; or with their data) and H releases 0.5 s later. Empty, the waiters'
    next entries find the key free on 0, 1 and 2 and are granted there at once, a majority: only the
    quarantine keeps them from holding while H still does. Checked: no overlap with H (whose section
    runs to its release), no waiter holds a restarted node's vote during its quarantine, and every
    waiter is served within the quarantine + a few seconds of the restart (the line recovers), with
    nothing left after."""
    ttl = 3.0
    restarted = (0, 1, 2)
    history = History()
    votes: list[tuple[float, list[Vote]]] = []
    served: dict[str, float] = {}
    async with (
        Redlock(faulty.urls, queue=True, ttl=ttl) as a,
        Redlock(faulty.urls, queue=True, ttl=ttl, retry_delay=0.2) as b,
        Redlock(faulty.urls, queue=True, ttl=ttl, retry_delay=0.2) as c,
    ):
        holder = a.lock("restarts", auto_extend=False)
        assert await holder.acquire(blocking=False)
        held_at = time.monotonic()
        assert holder.token is not None

        async def waiter(label: str, redlock: Redlock) -> None:
            lock = redlock.lock("restarts", acquire_timeout=20)
            async with lock:
                served[label] = time.monotonic()
                votes.append((time.monotonic(), [o.vote for o in lock.outcomes]))
                with history.section(label, lock):
                    await asyncio.sleep(0.02)

        tasks = []
        for n in range(4):
            tasks.append(asyncio.create_task(waiter(f"w{n}", (b, c)[n % 2])))
            await in_line(faulty, "restarts", n + 1, within=5.0)
        await asyncio.sleep(0.3)  # each entered again once listening
        await asyncio.gather(*(asyncio.to_thread(faulty[i].restart, keep_data=keep_data) for i in restarted))
        restart_done = time.monotonic()
        assert not served, f"served while H holds a majority: {served}"
        await asyncio.sleep(0.5)
        assert not served, f"served while H holds a majority: {served}"
        await holder.release()
        released = time.monotonic()
        history.sections.append(Section("H", str(holder.token), None, held_at, released))
        try:
            # The quarantine (ttl + drift, ~3 s, from when a client saw the node back), then a hand-off
            # per waiter (ms) and perhaps a split given back (a grace) or a stray grant run out (ttl):
            # 2 ttls of slack for the loaded box.
            async with asyncio.timeout(ttl + 2 * ttl + 2):
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        last = max(served.values())
    history.check()
    print(f"served {sorted((t - restart_done, w) for w, t in served.items())}")
    assert len(served) == 4, served
    for t, vote in votes:
        if t < restart_done + ttl * 0.9:  # a quarantine starts once the client sees the node back
            assert all(vote[i] is not Vote.YES for i in restarted), (t - restart_done, vote)
    assert last - restart_done < 3 * ttl + 2, last - restart_done
    await nothing_left(faulty, 2 * ttl)


# -- 3. different ttls in one line ------------------------------------------------------------------------------


@pytest.mark.serial
@pytest.mark.slow
async def test_each_waiter_is_granted_its_own_ttl_and_keeps_the_lock_it_was_granted(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """H holds (ttl 30 s); in line behind it: A (ttl 0.6 s, inside ``async with``: the watchdog), then
    B (ttl 3 s, acquired by hand: extend()), of two other Redlocks whose default ttl is 10 s. H's
    release grants A: the nodes' key lives 0.6 s, not 30 or 10, and A's validity is at most 0.6 s.
    A keeps it 3 x its ttl (the watchdog extends a lock taken by a grant): it is never lost, a majority
    keeps A's token all along, and B does not get in. A's exit grants B: the key lives 3 s, B's
    validity is over 0.6 s (its own ttl, not A's) and at most 3 s; extend() of B's lock resets both."""
    h_redlock = await make_redlock(queue=True)
    a_redlock = await make_redlock(queue=True, retry_delay=SLOW)
    b_redlock = await make_redlock(queue=True, retry_delay=SLOW)
    holder = h_redlock.lock("ttls", ttl=30)
    assert await holder.acquire(blocking=False)
    history = History()
    seen: dict[str, Any] = {}

    a_lock = a_redlock.lock("ttls", ttl=0.6, acquire_timeout=20)
    b_lock = b_redlock.lock("ttls", ttl=3.0, acquire_timeout=20, auto_extend=False)

    async def run_a() -> None:
        async with a_lock:
            seen["a_validity"] = a_lock.validity
            seen["a_pttls"] = pttls_on(cluster, "ttls")
            token = (a_lock.token or "?").encode()
            ours = []
            with history.section("A", a_lock):
                for _ in range(36):  # 1.8 s = 3 ttls, looking every 50 ms
                    await asyncio.sleep(0.05)
                    ours.append(majority(values_on(cluster, "ttls"), token) and a_lock.held)
            seen["a_ours"] = ours
            seen["a_extensions"] = a_lock.statistics().extensions

    a_task = asyncio.create_task(run_a())
    await in_line(cluster, "ttls", 1)
    b_task = asyncio.create_task(b_lock.acquire())
    await in_line(cluster, "ttls", 2)
    await asyncio.sleep(0.2)  # both entered again once listening
    await holder.release()
    try:
        async with asyncio.timeout(PROMPT + 1.8 + 2):  # served at once, 1.8 s of holding, slack
            await a_task  # raises LockLost if the watchdog lost A's lock
        async with asyncio.timeout(PROMPT):
            assert await b_task
    finally:
        a_task.cancel()
        b_task.cancel()
    seen["b_validity"] = b_lock.validity
    seen["b_pttls"] = pttls_on(cluster, "ttls")
    with history.section("B", b_lock):
        await asyncio.sleep(0.5)
        await b_lock.extend()
        seen["b_extended_validity"] = b_lock.validity
        seen["b_extended_pttls"] = pttls_on(cluster, "ttls")
    await b_lock.release()
    history.check()
    print(seen)
    # A: its own ttl on the nodes (at most 600 ms, and some left: granted a moment ago) ...
    assert sum(0 < p <= 600 for p in seen["a_pttls"]) >= 3, seen["a_pttls"]
    assert 0 < seen["a_validity"] <= 0.6, seen["a_validity"]
    # ... kept throughout by the watchdog: extended every ~0.4 s (a third of the ttl left).
    assert all(seen["a_ours"]), seen["a_ours"]
    assert seen["a_extensions"] >= 2, seen["a_extensions"]
    # B: its own ttl (3 s), not A's (0.6 s) nor the Redlock's (10 s).
    assert sum(1500 < p <= 3000 for p in seen["b_pttls"]) >= 3, seen["b_pttls"]
    assert 1.5 < seen["b_validity"] <= 3.0, seen["b_validity"]
    assert sum(2000 < p <= 3000 for p in seen["b_extended_pttls"]) >= 3, seen["b_extended_pttls"]
    assert 2.0 < seen["b_extended_validity"] <= 3.0, seen["b_extended_validity"]
    await nothing_left(cluster, PROMPT)


# -- 4. long waits -----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.serial
async def test_a_wait_longer_than_an_entry_life_keeps_its_place_and_gets_a_sane_lease(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """H holds (ttl 30 s) for 3.5 s. W1 (retry delay 0.3 s: its entry lives 1.5 s, re-entered every
    0.15-0.45 s) queues first, W2 (retry delay 0.05 s: entry life 1 s, re-entered ~20 times a second)
    second. Throughout, every node keeps both entries, W1's first (re-entering keeps the score). H's
    release grants W1 at once; W1's validity is positive and at most its ttl; W1's release grants W2;
    no overlap."""
    holder = (await make_redlock(queue=True)).lock("long-wait", ttl=30)
    w1 = (await make_redlock(queue=True, retry_delay=0.3)).lock("long-wait", ttl=5, acquire_timeout=20)
    w2 = (await make_redlock(queue=True, retry_delay=0.05)).lock("long-wait", ttl=5, acquire_timeout=20)
    assert await holder.acquire(blocking=False)
    held_at = time.monotonic()
    t1 = asyncio.create_task(w1.acquire())
    await in_line(cluster, "long-wait", 1)
    t2 = asyncio.create_task(w2.acquire())
    await in_line(cluster, "long-wait", 2)
    try:
        orders = []
        for _ in range(35):  # 3.5 s, a look every 0.1 s: both entries outlive several entry lives
            await asyncio.sleep(0.1)
            orders.append([line_order(cluster, "long-wait", i) for i in range(len(cluster))])
        assert not t1.done()
        assert not t2.done()
        firsts = {tuple(order) for node_orders in orders for order in node_orders}
        assert len(firsts) == 1, firsts  # the same order on every node at every look ...
        assert len(next(iter(firsts))) == 2, firsts  # ... of both waiters
        released = time.monotonic()
        await holder.release()
        history = History()
        history.sections.append(Section("H", "h", None, held_at, released))
        async with asyncio.timeout(PROMPT):
            assert await t1
        granted = time.monotonic() - released
        validity = w1.validity
        w1_token = (w1.token or "?").encode()
        pttls = pttls_on(cluster, "long-wait")
        with history.section("W1", w1):
            await asyncio.sleep(0.01)
        await w1.release()
        async with asyncio.timeout(PROMPT):
            assert await t2
        with history.section("W2", w2):
            await asyncio.sleep(0.01)
        await w2.release()
    finally:
        t1.cancel()
        t2.cancel()
    history.check()
    print(f"granted after {granted:.3f} s, validity {validity:.3f}, pttls {pttls}")
    # W1 (whose acquire won first) was first in line on every node at every look.
    assert all(order[0] == w1_token for node_orders in orders for order in node_orders), (w1_token, orders[-1])
    assert granted < PROMPT, granted
    assert 4.0 < validity <= 5.0, validity  # granted a moment ago, ttl 5: at least 4 s of it left
    assert sum(4000 < p <= 5000 for p in pttls) >= 3, pttls
    await nothing_left(cluster, PROMPT)


# -- 5. lock_many, semaphores and elections on a queue=True Redlock ----------------------------------------------


@pytest.mark.slow
@pytest.mark.serial
async def test_lock_many_and_semaphores_share_names_with_queued_locks(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """On two queue=True Redlocks, for 3 s: 2 tasks of lock_many(["a", "b"]) (no queue: SET NX on both
    keys), 2 tasks of a queued lock("a"), 1 of a queued lock("b") (each pausing 20 ms between turns,
    so the keys are free now and then: a client without the queue only gets in when no one is in line),
    and 3 tasks of semaphore("a", limit=2) (keys of its own). Per name, no two holders at once (lock_many
    counts on both); at most 2 semaphore holders at once; every task served; no acquire timed out; and
    neither lock_many nor the semaphore left a line behind."""
    r1 = await make_redlock(queue=True, retry_delay=0.05)
    r2 = await make_redlock(queue=True, retry_delay=0.05)
    histories = {"a": History(), "b": History(), "sem": History()}
    grants: collections.Counter[str] = collections.Counter()
    timeouts = [0]
    stop = time.monotonic() + 3.0

    async def worker(label: str, lock: Any, names: list[str], pause: float) -> None:
        for _ in range(100_000):  # bounded: the clock ends it long before
            if time.monotonic() >= stop:
                break
            try:
                async with lock:
                    grants[label] += 1
                    with contextlib.ExitStack() as stack:
                        for name in names:
                            stack.enter_context(histories[name].section(label, lock))
                        await asyncio.sleep(0.001)
            except LockNotAcquired:
                timeouts[0] += 1
            await asyncio.sleep(pause)

    jobs = [
        worker("many0", r1.lock_many(["a", "b"], acquire_timeout=10), ["a", "b"], 0.005),
        worker("many1", r2.lock_many(["a", "b"], acquire_timeout=10), ["a", "b"], 0.005),
        worker("a0", r1.lock("a", acquire_timeout=10), ["a"], 0.02),
        worker("a1", r2.lock("a", acquire_timeout=10), ["a"], 0.02),
        worker("b0", r2.lock("b", acquire_timeout=10), ["b"], 0.02),
        *(
            worker(f"sem{n}", (r1, r2)[n % 2].semaphore("a", limit=2, acquire_timeout=10), ["sem"], 0.005)
            for n in range(3)
        ),
    ]
    async with asyncio.timeout(3.0 + 10 + 5):
        await asyncio.gather(*jobs)
    histories["a"].check()
    histories["b"].check()
    histories["sem"].check(limit=2)
    print(f"grants {dict(grants)}, timeouts {timeouts[0]}, most semaphore holders {histories['sem'].most_inside()}")
    assert len(grants) == 8, grants
    assert timeouts[0] == 0, (timeouts, grants)
    assert histories["sem"].most_inside() == 2  # the limit, not 1: the semaphore is not the queued lock "a"
    # All keys of the queued names and their lines are gone (the semaphore's widest-limit key stays).
    assert await eventually(lambda: queue_keys_left(cluster, ["a", "b"]) == [[]] * len(cluster), PROMPT), (
        queue_keys_left(cluster, ["a", "b"])
    )


async def test_an_election_runs_on_a_queue_redlock(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """``redlock.election(name)`` on a queue=True Redlock: candidates campaign through the grant queue
    (fenced: tests/test_queue_fencing.py), so two candidates take turns leading, with growing terms,
    and a queued lock of another name works alongside."""
    redlocks = [await make_redlock(queue=True, retry_delay=0.05) for _ in range(2)]
    elections = [r.election("leader", owner=f"c{n}") for n, r in enumerate(redlocks)]
    terms: list[int] = []

    async def candidate(election: Any) -> None:
        for _ in range(3):
            async with election.campaign(timeout=5) as term:
                terms.append(term)
                await asyncio.sleep(0.01)

    async with asyncio.timeout(15):
        await asyncio.gather(*(candidate(e) for e in elections))
        async with redlocks[0].lock("beside-the-leader"):
            pass
    assert len(terms) == 6, terms
    assert terms == sorted(terms), terms
    assert len(set(terms)) == 6, terms


# -- 6. SIGTERM ------------------------------------------------------------------------------------------------------


async def start_term_child(
    urls: list[str], name: str, mode: str, handle: bool, ttl: float
) -> asyncio.subprocess.Process:
    child = await start_child(urls, "term", name, mode, "1" if handle else "0", str(ttl))
    assert "started" in await next_event(child, 20)
    return child


@pytest.mark.serial
async def test_a_holder_terminated_with_sigterm_handled_hands_the_lock_on_at_once(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """Another process holds (ttl 30 s, inside ``async with``) and turns SIGTERM into cancellation; our
    waiter (retry delay SLOW) waits in line. SIGTERM: the child's ``async with`` releases on the way
    out, the release grants our waiter, which holds the lock within PROMPT (not after 30 s), after the
    child stopped believing it held it."""
    redlock = await make_redlock(queue=True, retry_delay=SLOW)
    child = await start_term_child(cluster.urls, "sigterm-holder", "hold", True, 30.0)
    try:
        held = await next_event(child, 10)
        assert "held" in held, held
        waiter = redlock.lock("sigterm-holder", ttl=30)
        waiting = asyncio.create_task(waiter.acquire(timeout=20))
        await in_line(cluster, "sigterm-holder", 1)
        await asyncio.sleep(0.2)  # entered again once listening
        termed = time.monotonic()
        child.send_signal(signal.SIGTERM)
        async with asyncio.timeout(PROMPT):
            assert await waiting
        acquired = time.monotonic()
        rows, err = await rest_of(child, 10)
        assert child.returncode == 0, err
        assert rows, err
        assert "cancelled" in rows[-1], rows
        assert rows[-1]["cancelled"] <= acquired + 0.05, (rows, acquired)  # (the clock is the machine's)
    finally:
        await kill_child(child)
    assert acquired - termed < PROMPT, acquired - termed
    await waiter.release()
    await nothing_left(cluster, PROMPT)


async def test_a_waiter_terminated_with_sigterm_handled_leaves_its_line_at_once(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """We hold (ttl 30 s); another process waits in line (its entries live 1 s) and turns SIGTERM into
    cancellation. SIGTERM: its entries leave every node's line well before they could expire, and our
    release then frees the key (not granted to the departed: it would sit for its ttl): a non-blocking
    acquire takes it, and nothing is left."""
    redlock = await make_redlock(queue=True)
    holder = redlock.lock("sigterm-waiter", ttl=30)
    assert await holder.acquire(blocking=False)
    child = await start_term_child(cluster.urls, "sigterm-waiter", "wait", True, 30.0)
    try:
        assert "waiting" in await next_event(child, 10)
        await in_line(cluster, "sigterm-waiter", 1)
        child.send_signal(signal.SIGTERM)
        rows, err = await rest_of(child, 10)
        assert child.returncode == 0, err
        assert rows, err
        assert "cancelled" in rows[-1], rows
        left = time.monotonic()
    finally:
        await kill_child(child)
    # The leave went out before the child's Redlock closed: the line is empty now, not 1 s later.
    assert line_lengths(cluster, "sigterm-waiter") == [0] * len(cluster), (
        line_lengths(cluster, "sigterm-waiter"),
        time.monotonic() - left,
    )
    await holder.release()
    await nothing_left(cluster, PROMPT)
    late = redlock.lock("sigterm-waiter", ttl=30)
    assert await late.acquire(blocking=False), late.outcomes
    await late.release()
    await nothing_left(cluster, PROMPT)


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hold", "wait"])
async def test_a_process_killed_by_an_unhandled_sigterm_blocks_for_a_ttl_at_most(
    cluster: Cluster, make_redlock: MakeRedlock, mode: str
) -> None:
    """Another process holds (ttl 1.5 s, the watchdog extending) or waits in line (ttl 1.5 s, entries
    living 1 s) and dies of SIGTERM (no handler: nothing runs on the way out). Holding, our waiter
    (retry delay 0.2 s) gets the lock no sooner than the child's key could run out (the watchdog kept at
    least a third of the ttl) and within ttl + 1.5 retry delays + 1 s of the kill. Waiting, our release
    may grant the key to the dead entry, which then sits for its ttl: our waiter gets it within ttl +
    an entry's life + 1 s. Nothing is left after either."""
    ttl = 1.5
    redlock = await make_redlock(queue=True, retry_delay=0.2)
    holder = None
    if mode == "wait":
        holder = redlock.lock("sigterm-killed", ttl=30)
        assert await holder.acquire(blocking=False)
    child = await start_term_child(cluster.urls, "sigterm-killed", mode, False, ttl)
    waiter = redlock.lock("sigterm-killed", ttl=30)
    try:
        event = await next_event(child, 10)
        assert ("held" if mode == "hold" else "waiting") in event, event
        if mode == "wait":
            await in_line(cluster, "sigterm-killed", 1)  # the child, behind our holder
        waiting = asyncio.create_task(waiter.acquire(timeout=15))
        await in_line(cluster, "sigterm-killed", 2 if mode == "wait" else 1)
        if mode == "hold":
            await asyncio.sleep(1.0)  # the watchdog extended the child's lease at least once
        killed = time.monotonic()
        child.send_signal(signal.SIGTERM)
        await child.wait()
        assert child.returncode == -signal.SIGTERM, child.returncode
        if holder is not None:
            await holder.release()
        async with asyncio.timeout(ttl + 1.0 + 3):
            assert await waiting
        acquired = time.monotonic()
    finally:
        await kill_child(child)
    waited = acquired - killed
    print(f"{mode}: served {waited:.3f} s after the kill")
    if mode == "hold":
        assert waited > ttl / 3 - 0.2, waited  # no release on the way out: the key ran out
        assert waited < ttl + 1.5 * 0.2 + 1.0, waited
    else:
        assert waited < ttl + 1.0 + 1.0, waited
    await waiter.release()
    await nothing_left(cluster, 2.0)  # a dead entry expires within its life (1 s)


async def test_closing_a_redlock_takes_its_queued_waiters_out_of_line(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """H holds (ttl 30 s); W, of another Redlock (retry delay SLOW: its entries live 25 s), waits in line;
    W's Redlock is closed (a service shutting down with tasks still waiting). As for a lock it holds
    (aclose releases it: "leaving it to expire would block every other client for up to a ttl"), W must
    go: its acquire ends at once (not at its next retry timer, 2.5-7.5 s away), its entries leave every
    line before the connections close, and H's release then frees the key instead of granting it to the
    departed W, where it would sit for W's ttl with no one doing the work."""
    h_redlock = await make_redlock(queue=True)
    holder = h_redlock.lock("closing", ttl=30)
    assert await holder.acquire(blocking=False)
    w_redlock = await make_redlock(queue=True, retry_delay=SLOW)
    waiter = w_redlock.lock("closing", ttl=30)
    waiting = asyncio.create_task(waiter.acquire(timeout=20))
    problems = []
    try:
        await in_line(cluster, "closing", 1)
        await asyncio.sleep(0.2)  # entered again once listening: it waits for a grant
        ends: list[float] = []
        waiting.add_done_callback(lambda _: ends.append(time.monotonic()))
        closed = time.monotonic()
        await w_redlock.aclose()
        if not await eventually(lambda: line_lengths(cluster, "closing") == [0] * len(cluster), PROMPT):
            problems.append(f"its entries are still in line after aclose: {line_lengths(cluster, 'closing')}")
        await holder.release()
        if not await eventually(lambda: values_on(cluster, "closing") == [None] * len(cluster), PROMPT):
            problems.append(
                f"H's release granted the key to the closed W: pttls {pttls_on(cluster, 'closing')} (ms, W's ttl)"
            )
    finally:
        async with asyncio.timeout(2 * SLOW):  # its retry timer at the latest: it sees the Redlock closed
            with contextlib.suppress(Exception):
                await waiting
    # The waiter's end is not a hand-off: aclose runs in this loop turn; a second is for the loaded box.
    ended = ends[0] - closed
    print(f"W's acquire ended {ended:.3f} s after aclose: {waiting.exception() or waiting.result()!r}")
    if ended > PROMPT:
        problems.append(f"W's acquire went on waiting {ended:.3f} s after its Redlock closed (its retry timer)")
    if waiting.exception() is None and waiting.result():
        problems.append("W's acquire returned True from a closed Redlock")
    assert not problems, problems
    late = h_redlock.lock("closing", ttl=30)
    assert await late.acquire(blocking=False), late.outcomes
    await late.release()
    await nothing_left(cluster, PROMPT)


# -- 7. many waiters ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_many_waiters_in_four_processes_are_all_served(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """3 other processes x 4 tasks and 2 Redlocks x 2 tasks of this one (16 tasks, all queue=True, retry
    delay 0.2 s) take one key for 3.5 s: no overlap across the four processes, every task served, no
    acquire timed out (15 s), and no lock key, line or waits left at the end."""
    first = await make_redlock(queue=True)
    second = await make_redlock(queue=True)
    async with children(cluster.urls, 3, "crowd", "5", "4", "0.2", "15") as processes:
        result = await contend([("r0", first, 2), ("r1", second, 2)], "crowd", 3.5, 15.0, processes)
    result.history.check()
    print(f"grants {sorted(result.grants.values())}, longest wait {max(result.longest.values()):.3f}")
    assert len(result.grants) == 16, result.grants
    assert result.timeouts == 0
    # Served in line: each waits behind at most 15 others (~1-2 ms each on loopback); hundreds in all.
    assert sum(result.grants.values()) >= 100, result.grants
    assert min(result.grants.values()) >= 3, result.grants
    await nothing_left(cluster, PROMPT)
    assert queue_keys_left(cluster, ["crowd"]) == [[]] * len(cluster)
