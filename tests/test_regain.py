"""Holders on a bare majority regain the free nodes (issue 26 item 4).

A lock granted on 3 of 5 nodes (the other two held another holder's key at the grant: a
waiter's SETs that overtook a release, say) used to stay on those 3 for its whole lease: an
extension only PEXPIREd the nodes that held its key. One of the 3 stopping then cost the
lease, with 4 of 5 nodes healthy. Now each extension (the watchdog's and ``extend()``) also
takes the nodes where the key is free, so five nodes tolerate two down for a holder too.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from redlock_async import LockLost, Redlock
from redlock_async._core import _clock
from redlock_async._core._algorithm import Vote, to_regain
from redlock_async._core._names import semaphore_keys
from redlock_async._nodes._wire import Failure
from redlock_async._rounds._fanout import vote_of_set
from redlock_async._rounds._lease import Lease
from redlock_async._rounds._requests import pack_extend
from redlock_async._shared._watchdog import Watchdog
from redlock_async.lock import Lock
from tests.conftest import Cluster, eventually, finish_child, start_module
from tests.fakes import as_nodes, fake_nodes, virtual
from tests.test_watchdog_round import NODE_TIMEOUT, Decision, answer, watched

KEY = "redlock:{}"
FENCE = "redlock-fence:{}"
TTL = 1.0
"""Seconds: the watchdog extends 2/3 in (about 0.67 s), after the other holder's 0.4 s are over."""


def carry(nodes: Cluster, key: str, which: tuple[int, ...] = (3, 4), ms: int = 400) -> None:
    """Nodes *which* hold *key* for another holder, for *ms* milliseconds."""
    for i in which:
        nodes[i].command("SET", key, "another holder", "PX", ms)


def on(nodes: Cluster, key: str, token: bytes, among: tuple[int, ...] = (0, 1, 2, 3, 4)) -> list[int]:
    """The nodes (of *among*) whose *key* holds *token*."""
    return [i for i in among if nodes[i].command("GET", key) == token]


def token_of(lock: Lock) -> bytes:
    assert lock.token is not None
    return lock.token.encode()


def counters(nodes: Cluster, name: str) -> list[int]:
    return [int(nodes[i].command("GET", FENCE.format(name)) or 0) for i in range(len(nodes))]  # type: ignore[call-overload]


@pytest.mark.parametrize("kind", ["plain", "fenced", "fenced-ttl", "queue", "queue-fenced"])
async def test_a_holder_on_three_nodes_takes_the_other_two_and_survives_two_down(faulty: Cluster, kind: str) -> None:
    """The issue's test: held on 3, on 5 after the next extension round, then two of the first three
    stop and the holder keeps the lock (the watchdog extends it on the three left)."""
    options: dict[str, Any] = {"fencing": "fenced" in kind, "queue": kind.startswith("queue")}
    if kind == "fenced-ttl":
        options["fence_ttl"] = 3600.0
    async with Redlock(faulty.urls, **options) as redlock:
        lock = redlock.lock("bare", ttl=TTL)
        carry(faulty, KEY.format("bare"))
        async with lock:
            token = token_of(lock)
            assert on(faulty, KEY.format("bare"), token) == [0, 1, 2]  # held on a bare majority
            fenced = counters(faulty, "bare")
            assert await eventually(lambda: lock.statistics().extensions >= 1, 2 * TTL)
            assert on(faulty, KEY.format("bare"), token) == [0, 1, 2, 3, 4]
            if "fenced" in kind:
                # Where it took the key, the fencing counter was raised to its token (never lowered),
                # and names this acquisition as its fencer (as the grant's fence did on 0-2).
                assert fenced[3:] == [0, 0]
                assert counters(faulty, "bare") == [lock.fencing_token] * 5
                fencer = hashlib.sha1(token).hexdigest().encode()
                assert [faulty[i].command("GET", FENCE.format("bare") + "\x00by") for i in range(5)] == [fencer] * 5
                lives = [int(faulty[i].command("PTTL", FENCE.format("bare"))) for i in range(5)]  # type: ignore[call-overload]
                if kind == "fenced-ttl":
                    assert all(3_500_000 < life <= 3_600_000 for life in lives), lives
                else:
                    assert lives == [-1] * 5
            faulty[0].kill()
            faulty[1].kill()
            extensions = lock.statistics().extensions
            await asyncio.sleep(3 * TTL)  # a lease lost here would cancel this body with LockLost
            assert lock.held
            assert lock.statistics().extensions >= extensions + 3
            assert on(faulty, KEY.format("bare"), token, among=(2, 3, 4)) == [2, 3, 4]


async def test_an_explicit_extend_takes_the_free_nodes_too(faulty: Cluster) -> None:
    async with Redlock(faulty.urls) as redlock:
        lock = redlock.lock("explicit", ttl=TTL)
        carry(faulty, KEY.format("explicit"))
        assert await lock.acquire(blocking=False)
        token = token_of(lock)
        assert on(faulty, KEY.format("explicit"), token) == [0, 1, 2]
        await asyncio.sleep(0.45)
        await lock.extend()
        assert on(faulty, KEY.format("explicit"), token) == [0, 1, 2, 3, 4]
        faulty[0].kill()
        faulty[1].kill()
        for _ in range(4):
            await asyncio.sleep(TTL / 2)
            await lock.extend()  # raises LockLost if 2, 3 and 4 do not carry it
        assert lock.held
        await lock.release()
        assert on(faulty, KEY.format("explicit"), token, among=(2, 3, 4)) == []


async def test_a_key_held_by_another_is_never_touched(cluster: Cluster, redlock: Redlock) -> None:
    lock = redlock.lock("theirs", ttl=TTL)
    carry(cluster, KEY.format("theirs"), (3,), 400)  # goes: taken at the next extension
    carry(cluster, KEY.format("theirs"), (4,), 60_000)  # stays another holder's
    async with lock:
        assert await eventually(lambda: lock.statistics().extensions >= 1, 2 * TTL)
        assert on(cluster, KEY.format("theirs"), token_of(lock)) == [0, 1, 2, 3]
        assert cluster[4].command("GET", KEY.format("theirs")) == b"another holder"
        assert int(cluster[4].command("PTTL", KEY.format("theirs"))) > 50_000  # type: ignore[call-overload]
    assert cluster[4].command("GET", KEY.format("theirs")) == b"another holder"
    assert on(cluster, KEY.format("theirs"), b"another holder") == [4]


async def test_a_key_gone_from_a_node_that_held_it_is_not_taken_at_once(cluster: Cluster, redlock: Redlock) -> None:
    """A node the validity counts on (it said yes at the grant or the last extension) lost the key before it
    could expire: a deletion or lost data, not a free node. That extension says no there (a majority of
    such noes still loses the lock); the node is taken at the extension after, as any other free node."""
    lock = redlock.lock("vanished", ttl=TTL)
    async with lock:
        token = token_of(lock)
        assert await eventually(lambda: len(on(cluster, KEY.format("vanished"), token)) == 5, 0.5)
        assert await eventually(lambda: lock.statistics().extensions >= 1, 2 * TTL)  # held on all 5 since
        assert cluster[0].command("DEL", KEY.format("vanished")) == 1
        assert await eventually(lambda: lock.statistics().extensions >= 2, 2 * TTL)
        assert lock.outcomes[0].vote in (Vote.NO, Vote.PENDING)  # (the round may be decided without it)
        assert on(cluster, KEY.format("vanished"), token) == [1, 2, 3, 4]
        assert await eventually(lambda: lock.statistics().extensions >= 3, 2 * TTL)
        assert await eventually(lambda: on(cluster, KEY.format("vanished"), token) == [0, 1, 2, 3, 4], 0.5)


@pytest.mark.parametrize("fencing", [False, True], ids=["plain", "fenced"])
async def test_lock_many_takes_a_node_only_when_every_name_is_free_there(
    cluster: Cluster, redlock: Redlock, fencing: bool
) -> None:
    lock = redlock.lock_many(["a", "b"], ttl=TTL, fencing=fencing)
    carry(cluster, KEY.format("a"), (3,))  # 400 ms
    carry(cluster, KEY.format("b"), (4,))  # 400 ms ...
    async with lock:
        token = token_of(lock)
        assert on(cluster, KEY.format("a"), token) == on(cluster, KEY.format("b"), token) == [0, 1, 2]
        carry(cluster, KEY.format("b"), (4,), 60_000)  # ... then for good: a is free on node 4, b is not
        assert await eventually(lambda: lock.statistics().extensions >= 1, 2 * TTL)
        assert on(cluster, KEY.format("a"), token) == on(cluster, KEY.format("b"), token) == [0, 1, 2, 3]
        assert cluster[4].command("EXISTS", KEY.format("a")) == 0  # not taken: b is held there
        if fencing:
            tokens = lock.fencing_tokens
            assert tokens is not None
            assert [counters(cluster, name)[:4] for name in ("a", "b")] == [[tokens["a"]] * 4, [tokens["b"]] * 4]
            assert counters(cluster, "a")[4] == counters(cluster, "b")[4] == 0
    assert on(cluster, KEY.format("a"), token) == on(cluster, KEY.format("b"), token) == []


async def test_a_permit_takes_its_slot_on_the_free_nodes(cluster: Cluster, redlock: Redlock) -> None:
    sem = redlock.semaphore("permits", limit=1, ttl=TTL)
    slot = semaphore_keys("redlock:", "permits").slot_key(0)
    for i in (3, 4):
        cluster[i].command("SET", slot, "1:another holder", "PX", 400)
    async with sem:
        token = token_of(sem)
        assert [i for i in range(5) if cluster[i].command("GET", slot) == token] == [0, 1, 2]
        assert await eventually(lambda: sem.statistics().extensions >= 1, 2 * TTL)
        assert [i for i in range(5) if cluster[i].command("GET", slot) == token] == [0, 1, 2, 3, 4]
    assert all(cluster[i].command("EXISTS", slot) == 0 for i in range(5))


async def test_a_node_in_restart_quarantine_is_taken_but_does_not_count(faulty: Cluster) -> None:
    """Node 4 restarts empty: an extension after that takes it (not the first one, for which it was a holder
    that lost the key), and its yes counts for nothing until the quarantine is over."""
    reached_the_end = False
    async with Redlock(faulty.urls, restart_quarantine=30.0, reconnect_delay=0.0) as redlock:
        lock = redlock.lock("quarantined", ttl=TTL)
        with pytest.raises(LockLost) as caught:
            async with lock:
                token = token_of(lock)
                assert await eventually(lambda: len(on(faulty, KEY.format("quarantined"), token)) == 5, 0.5)
                faulty[4].restart(keep_data=False)
                assert await eventually(lambda: faulty[4].command("GET", KEY.format("quarantined")) == token, 4 * TTL)
                # It counts toward no quorum: with 0 and 1 down, 2 and 3 are not a majority.
                faulty[0].kill()
                faulty[1].kill()
                await asyncio.sleep(3 * TTL)
                reached_the_end = True
        assert caught.value.outcomes[4].vote is Vote.QUARANTINED
        assert "quarantine" in caught.value.outcomes[4].detail
    assert not reached_the_end


async def test_an_extension_the_server_lost_runs_again_without_taking(cluster: Cluster, redlock: Redlock) -> None:
    """After SCRIPT FLUSH the extension is sent again as EVAL, behind what was sent since: here the
    lease's own release (whose script the nodes still know). Run there, a take would leave keys held
    for no one on the nodes it regains; the EVAL sent again takes nothing."""
    from redlock_async._scripts import RELEASE

    lock = redlock.lock("flushed", ttl=TTL)
    carry(cluster, KEY.format("flushed"), ms=100)
    assert await lock.acquire(blocking=False)
    token = token_of(lock)
    assert on(cluster, KEY.format("flushed"), token) == [0, 1, 2]
    await asyncio.sleep(0.15)  # 3 and 4 are free: the next extension takes them
    for i in range(len(cluster)):
        cluster[i].command("SCRIPT", "FLUSH")
        cluster[i].command("SCRIPT", "LOAD", RELEASE.source)
    extending = asyncio.create_task(lock.extend())
    await asyncio.sleep(0)  # its EVALSHA is on the wire (and answered NOSCRIPT)
    await lock.release()  # runs before the EVAL sent again
    with pytest.raises(LockLost):
        await extending
    await asyncio.sleep(0.1)
    assert [cluster[i].command("EXISTS", KEY.format("flushed")) for i in range(5)] == [0] * 5


async def test_holders_after_hand_offs_between_processes_regain_every_node(cluster: Cluster) -> None:
    """The issue's setting, between OS processes (a waiter's SETs overtake a release on a minority,
    and are given back when it loses): however few nodes a section was granted on, its first
    extension takes those its key is free on (a node whose reply came late, or whose other key is
    given back late, at the second; on a loaded box a late reply may make it the third or fourth:
    _regain_child.MOST). Before the fix, 5 of the 18 sections stayed on 3 or 4 nodes through both
    (14 and 8 of 30 in two longer runs): no extension took a free node."""
    children = [await start_module("tests._regain_child", "handed", "6", *cluster.urls) for _ in range(3)]
    rows = [row for child in children for row in await finish_child(child, 120)]
    assert len(rows) == 18
    assert [row for row in rows if len(row["extended"][-1]) < 5] == []


# -- without servers: what each node is sent ---------------------------------------------------------


def take_flags(packed: bytes, leases: int) -> list[bytes]:
    """The spec of each lease in a packed EXTEND_MANY of single-key unfenced *leases* (ARGV: token, ttl and
    spec per lease; the spec says whether to take the key where it is free: 1, or not: 0)."""
    parts = packed.split(b"\r\n")[2::2]  # the bulk strings: EVALSHA, sha, numkeys, keys..., args...
    args = parts[3 + leases :]
    return [args[3 * i + 2] for i in range(leases)]


def test_every_node_gets_the_same_bytes_until_a_lease_has_nodes_to_regain() -> None:
    leases = [Lease((b"k%d" % i,), b"t%d" % i, ttl_ms=1000, holders=[0, 1, 2]) for i in range(3)]
    packed, fallback = pack_extend(leases, 5)
    assert len(set(packed)) == 1
    assert take_flags(packed[0], 3) == [b"0"] * 3
    leases[1].regain = [0, 3, 4]  # node 0 is a holder: never taken, whatever the votes said
    packed, fallback = pack_extend(leases, 5)
    assert [take_flags(p, 3) for p in packed] == [[b"0", b"0", b"0"]] * 3 + [[b"0", b"1", b"0"]] * 2
    assert fallback[2][2::3] == (0, 0, 0)  # sent again after NOSCRIPT: takes nothing


def test_a_pending_node_is_taken_once_its_late_reply_says_no() -> None:
    unanswered = Failure(Vote.PENDING, "no reply yet")
    replies: list[object] = [b"OK", b"OK", b"OK", unanswered, unanswered]
    votes = [Vote.YES] * 3 + [Vote.PENDING] * 2  # decided at the third yes
    lease = Lease((b"k",), b"t", ttl_ms=1000, holders=[0, 1, 2], late=(votes, replies, vote_of_set))
    assert lease.to_take() == []  # no reply yet: the key there is likely ours
    replies[3] = b"OK"
    assert lease.to_take() == []
    replies[4] = None  # nil: SET NX found the key held
    assert lease.to_take() == [4]
    lease.late = ([Vote.YES, Vote.NO, Vote.YES, Vote.YES, Vote.TIMEOUT], replies, vote_of_set)
    lease.holders = [0, 2, 3]
    assert lease.to_take() == [1, 4]  # answered without a yes at the decision
    lease.holders = [0, 1, 2]
    assert lease.to_take() == [4]  # a node the validity counts on is never taken
    assert to_regain([Vote.YES, Vote.NO, Vote.PENDING, Vote.TIMEOUT, Vote.QUARANTINED]) == [1, 3, 4]


def test_a_late_no_to_a_watchdog_round_is_taken_at_the_next() -> None:
    async def test() -> None:
        nodes = fake_nodes(5)
        watchdog = Watchdog(tuple(as_nodes(nodes)), NODE_TIMEOUT)
        decisions: list[Decision] = []
        start = _clock.now()
        lease = watched(b"k", start + 1.0, decisions)
        watchdog.schedule(lease, start + 0.3)
        await asyncio.sleep(0.31)
        answer(nodes, [0, 1, 2], [1])
        await asyncio.sleep(0)
        assert len(decisions) == 1
        assert lease.regain == []  # every other node pending: nothing to take
        answer(nodes, [3], [0])  # late: the key there is not ours
        answer(nodes, [4], [1])
        await asyncio.sleep(0)
        assert lease.regain == [3]
        watchdog.schedule(lease, start + 0.6)
        await asyncio.sleep(0.3)
        assert [take_flags(node.requests[-1].packed, 1) for node in nodes] == [[b"0"]] * 3 + [[b"1"], [b"0"]]
        await watchdog.aclose()

    virtual(test)
