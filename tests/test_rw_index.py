"""A read/write lock's readers' hash (``W\\x00readers``) on real nodes: it holds every live reader's entry for
as long as the reader holds (a writer reads it to find them), and ends about a lease after the last reader,
one that crashed included. Issue 35: the index of a name never used again lived for ever after a reader
crashed (no ttl); every way a reader is added raises the hash's ttl (RW_READ, a downgrade, a grant from the
line), and so does every extension (RW_READ_EXTEND), never below the entry's own expiry.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from .conftest import Cluster, MakeRedlock, assert_empty, eventually, kill_child, next_event, start_module

W = b"redlock:\x00rw\x00doc"
INDEX = W + b"\x00readers"
BOTH = "return {redis.call('TIME'), redis.call('PTTL', KEYS[1]), redis.call('HGET', KEYS[1], ARGV[1])}"


def index_ttls(cluster: Cluster) -> list[int]:
    return [int(cluster[i].command("PTTL", INDEX)) for i in range(len(cluster))]  # type: ignore[call-overload]


async def test_the_hash_of_a_crashed_reader_ends_about_a_lease_after_it(cluster: Cluster) -> None:
    ttl = 1.0
    child = await start_module("tests._rw_child", "hold", "doc", str(ttl), *cluster.urls)
    try:
        assert (await next_event(child, 20.0))["held"]
        ttls = index_ttls(cluster)
        assert all(0 < left <= 2000 for left in ttls), ttls  # (before issue 35: -1, no ttl)
    finally:
        await kill_child(child)  # SIGKILL: nothing is released
    # Its entry expires within its ttl, the hash a second after: nothing of the name is left.
    assert await eventually(lambda: not any(cluster[i].command("EXISTS", INDEX) for i in range(len(cluster))), 10.0)
    await assert_empty(cluster)


@pytest.mark.parametrize("queue", [True, False])
async def test_a_downgrade_and_a_grant_from_the_line_give_the_hash_a_ttl(
    make_redlock: MakeRedlock, cluster: Cluster, queue: bool
) -> None:
    redlock = await make_redlock(queue=queue, retry_delay=0.05)
    rw = redlock.rw_lock("doc", ttl=2.0)
    writer = rw.write()
    assert await writer.acquire(blocking=False)
    reader = writer.downgrade()
    assert await reader.acquire()
    ttls = index_ttls(cluster)
    assert all(0 < left <= 3000 for left in ttls), ttls
    await reader.release()  # (the last reader: out of the hash, which is then gone)
    assert await eventually(lambda: not any(cluster[i].command("EXISTS", INDEX) for i in range(len(cluster))), 1.0)

    # A reader waiting behind a writer: granted by the writer's release (queue: from the line, by the nodes).
    assert await writer.acquire(blocking=False)
    waiting = asyncio.create_task(rw.read().acquire(timeout=10))
    await asyncio.sleep(0.2)
    await writer.release()
    assert await waiting
    ttls = index_ttls(cluster)
    assert all(0 < left <= 3000 for left in ttls), ttls


@pytest.mark.parametrize("queue", [True, False])
async def test_the_hash_holds_a_reader_for_as_long_as_it_holds(
    make_redlock: MakeRedlock, cluster: Cluster, queue: bool
) -> None:
    """The hash must never end before a live reader's entry (a writer would be granted beside it): each
    extension (RW_READ_EXTEND) keeps it at least as long. A reader of ttl 0.5 s held for 4 ttls."""
    redlock, other = await make_redlock(queue=queue), await make_redlock(queue=queue)
    rw = redlock.rw_lock("doc", ttl=0.5)
    async with rw.read() as reader:
        assert reader.token is not None
        token = reader.token.encode()
        member = hashlib.sha1(token).hexdigest().encode()
        seen = 0
        for _ in range(8):
            await asyncio.sleep(0.25)
            for i in range(len(cluster)):
                reply: Any = cluster[i].command("EVAL", BOTH, 1, INDEX, member)
                (seconds, micros), index_left, value = reply
                if value is None:
                    continue  # (not on this node: its extension failed, as a key's may)
                held, _, expiry = bytes(value).rpartition(b" ")
                assert held == token
                entry_left = int(expiry) - (int(seconds) * 1000 + int(micros) // 1000)
                if entry_left > 0:  # a live entry, by the node's clock: the hash outlives it
                    assert index_left >= entry_left, (i, entry_left, index_left)
                    seen += 1
        assert seen > 0
        assert not await other.rw_lock("doc", ttl=0.5).write().acquire(blocking=False)
