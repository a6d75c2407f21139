"""Fencing tokens across a quorum, on real nodes."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio

from redlock_async import Redlock
from redlock_async.fencing import StaleFencingToken, fenced_set
from redlock_async.testing import LocalNodes

from .conftest import Cluster, MakeRedlock

COUNTER = "redlock-fence:{}"
KEY = "redlock:{}"


def counters(cluster: Cluster | LocalNodes, resource: str, count: int) -> list[int]:
    return [int(cluster[i].command("GET", COUNTER.format(resource)) or 0) for i in range(count)]  # type: ignore[call-overload]


async def test_tokens_strictly_increase_while_minorities_are_stopped(faulty: Cluster) -> None:
    async with Redlock(faulty.urls, fencing=True) as a, Redlock(faulty.urls, fencing=True) as b:
        tokens: list[int] = []
        minorities = list(itertools.combinations(range(5), 2))  # all 10 pairs of nodes
        for n, down in enumerate(minorities * 2):
            for i in down:
                faulty[i].pause()
            lock = (a if n % 2 else b).lock("ledger")
            assert await lock.acquire(timeout=2.0)
            assert lock.fencing_token is not None
            tokens.append(lock.fencing_token)
            await lock.release()
            for i in down:
                faulty[i].resume()
        assert tokens == sorted(set(tokens)), tokens  # strictly increasing
        assert len(tokens) == 20


async def test_largest_counter_alone_is_not_enough() -> None:
    """The sequence from docs/fencing.md: counters 10, 1, 1; A wins nodes 1-2, B later wins nodes 2-3.

    Taking max + 1 of the granting nodes' counters would give A 11 and B 2.
    A's second step raises node 2's counter to 11 while A holds the key there,
    so B, which must win node 2 or node 1, reads at least 11.
    """
    with LocalNodes(3) as nodes:
        for i, value in enumerate((10, 1, 1)):
            nodes[i].command("SET", COUNTER.format("r"), value)
        async with Redlock(nodes.urls, fencing=True) as a, Redlock(nodes.urls, fencing=True) as b:
            nodes[2].command("SET", KEY.format("r"), "someone-else")  # A can only win nodes 0 and 1
            first = a.lock("r", ttl=5.0)
            assert await first.acquire(blocking=False)
            first_token = first.fencing_token
            assert first_token == 11
            assert counters(nodes, "r", 3) == [11, 11, 1]
            await first.release()

            nodes[2].command("DEL", KEY.format("r"))
            nodes[0].command("SET", KEY.format("r"), "someone-else")  # B can only win nodes 1 and 2
            naive = 1 + 1  # max + 1 over nodes 1 and 2 as they were before A's second step
            second = b.lock("r", ttl=5.0)
            assert await second.acquire(blocking=False)
            assert second.fencing_token is not None
            assert second.fencing_token > first_token > naive
            assert second.fencing_token == 12
            await second.release()


async def test_paused_holders_late_write_is_refused(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """The scenario from the Redlock analysis, end to end, against a fenced Redis resource."""
    a = await make_redlock(node_timeout=0.01, fencing=True)
    b = await make_redlock(fencing=True)
    resource = redis.asyncio.Redis.from_url(cluster.urls[0])
    try:
        paused = a.lock("account:7", ttl=0.3, auto_extend=False)
        assert await paused.acquire()
        old = paused.fencing_token
        assert old is not None
        await fenced_set(resource, "account:7", "A-early", old)
        await asyncio.sleep(0.35)  # A is "paused" past its validity; the lease runs out
        async with b.lock("account:7") as fresh:
            new = fresh.fencing_token
            assert new is not None
            assert new > old
            await fenced_set(resource, "account:7", "B", new)
        with pytest.raises(StaleFencingToken) as refused:
            await fenced_set(resource, "account:7", "A-late", old)  # A wakes up and writes
        assert refused.value.token == old
        assert refused.value.seen == new
        assert await resource.get("account:7") == b"B"
        await paused.release()
    finally:
        await resource.aclose()


async def test_plain_acquire_keeps_its_single_round_trip(cluster: Cluster, redlock: Redlock) -> None:
    def calls(command: str) -> int:
        stats = cluster[0].command("INFO", "commandstats")
        assert isinstance(stats, dict)
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    before = calls("set"), calls("evalsha"), calls("eval")
    lock = redlock.lock("plain")
    assert await lock.acquire(blocking=False)
    assert lock.fencing_token is None
    assert (calls("set"), calls("evalsha"), calls("eval")) == (before[0] + 1, before[1], before[2])
    await lock.release()


async def test_counters_never_expire(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(fencing=True)
    async with redlock.lock("forever") as lock:
        assert lock.fencing_token == 1
    assert [cluster[i].command("PTTL", COUNTER.format("forever")) for i in range(5)] == [-1] * 5


async def test_fenced_set_checks_its_token(cluster: Cluster) -> None:
    resource = redis.asyncio.Redis.from_url(cluster.urls[0])
    try:
        for bad in (True, -1, 1.5, "3"):
            with pytest.raises(TypeError, match="fencing token"):
                await fenced_set(resource, "k", "v", bad)  # type: ignore[arg-type]
        await fenced_set(resource, b"k", "v1", 5)
        await fenced_set(resource, b"k", "v2", 5)  # the same holder may write again
        assert await resource.get("k") == b"v2"
        assert await resource.get("k:fence") == b"5"
    finally:
        await resource.aclose()


def test_sqlite_example_refuses_the_late_write() -> None:
    example = Path(__file__).parent.parent / "examples" / "fencing_sqlite.py"
    result = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=60, check=True)
    assert "balance 150 applied=True" in result.stdout
    assert "balance 50 applied=False" in result.stdout
    assert "final balance 150" in result.stdout
