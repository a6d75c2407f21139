"""Fencing tokens across a quorum, on real nodes."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.exceptions import DataError

from redlock_async import Redlock
from redlock_async.fencing import StaleFencingToken, fenced_set
from redlock_async.testing import LocalNodes

from .conftest import Cluster, MakeRedlock, assert_empty

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


async def test_fenced_set_refuses_bad_arguments_and_writes_nothing(cluster: Cluster) -> None:
    resource = redis.asyncio.Redis.from_url(cluster.urls[0])
    sync = redis.Redis.from_url(cluster.urls[0])
    try:
        cases: list[tuple[tuple[Any, ...], dict[str, Any], type[Exception], str]] = [
            (("redis://x", "k", "v", 1), {}, TypeError, r"^client must be a redis\.asyncio\.Redis .*builtins\.str"),
            ((None, "k", "v", 1), {}, TypeError, r"^client must be a redis\.asyncio\.Redis"),
            ((sync, "k", "v", 1), {}, TypeError, r"got redis\.client\.Redis"),
            ((resource, 5, "v", 1), {}, TypeError, r"^key must be str or bytes, got int"),
            ((resource, None, "v", 1), {}, TypeError, r"^key must be str or bytes, got NoneType"),
            ((resource, "", "v", 1), {}, ValueError, r"^key is empty"),
            ((resource, b"", "v", 1), {}, ValueError, r"^key is empty"),
            ((resource, "k", "v", 1), {"fence_key": 5}, TypeError, r"^fence_key must be str or bytes, got int"),
            ((resource, "k", "v", 1), {"fence_key": ""}, ValueError, r"^fence_key is empty"),
            ((resource, "k", "v", 1), {"fence_key": "k"}, ValueError, r"^fence_key 'k' is the key written"),
            ((resource, "k", "v", 1), {"fence_key": b"k"}, ValueError, r"^fence_key b'k' is the key written"),
            ((resource, "k", "v", True), {}, TypeError, r"^token must be a fencing token"),
            ((resource, "k", "v", -1), {}, TypeError, r"^token must be a fencing token"),
            ((resource, "k", "v", 1.0), {}, TypeError, r"^token must be a fencing token"),
            ((resource, "k", "v", "1"), {}, TypeError, r"^token must be a fencing token"),
            ((resource, "k", "v", None), {}, TypeError, r"^token must be a fencing token"),
            ((resource, "k", "v", 2**53 + 1), {}, ValueError, r"^token 9007199254740993 is larger than 2\*\*53"),
            ((resource, "k", None, 1), {}, DataError, r"Invalid input of type: 'NoneType'"),
            ((resource, "k", True, 1), {}, DataError, r"Invalid input of type: 'bool'"),
            ((resource, "k", {"a": 1}, 1), {}, DataError, r"Invalid input of type: 'dict'"),
        ]
        for args, kwargs, error, pattern in cases:
            with pytest.raises(error, match=pattern):
                await fenced_set(*args, **kwargs)
        await assert_empty(cluster)

        await resource.set("taken:fence", "not a token")
        with pytest.raises(ValueError, match=r"^fence_key 'taken:fence' holds something other than a fencing token"):
            await fenced_set(resource, "taken", "v", 1)
        await resource.hset("hashed:fence", "a", "1")
        with pytest.raises(ValueError, match=r"^fence_key 'hashed:fence' holds something other than a fencing"):
            await fenced_set(resource, "hashed", "v", 1)
        assert await resource.exists("taken", "hashed") == 0

        # Bytes that are not UTF-8 are fine, as keys and values; the largest exact token too.
        await fenced_set(resource, b"\xff\xfe", b"\x00\xff", 2**53)
        assert await resource.get(b"\xff\xfe") == b"\x00\xff"
        assert await resource.get(b"\xff\xfe:fence") == str(2**53).encode()
    finally:
        await resource.aclose()
        sync.close()


def test_sqlite_example_refuses_the_late_write() -> None:
    example = Path(__file__).parent.parent / "examples" / "fencing_sqlite.py"
    result = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=60, check=True)
    assert "balance 150 applied=True" in result.stdout
    assert "balance 50 applied=False" in result.stdout
    assert "final balance 150" in result.stdout
