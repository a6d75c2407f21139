"""The clock guard and the eviction watch of a Cluster voter, per shard primary, on real cluster-mode servers
(LocalCluster, its primaries under libfaketime): a primary whose clock jumps ahead, or that evicts a held
lock's key, sits out as a standalone node would, and only that shard: a second client is refused the lock
(before, the voter's yes from the primary whose key was gone made a second holder), and names on the other
shards keep voting.

One cluster voter (3 shards, no replica) beside 2 standalone voters. The holder takes the lock on the cluster
voter and the first standalone voter (the second paused); then the first is paused and the second resumed:
a contender can win only if the cluster voter's yes counts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from redlock_async import EventKind, LockEvent, Redlock, Vote
from redlock_async._nodes import tag_for
from redlock_async.testing import LocalCluster, LocalNode, LocalNodes, faketime_library
from tests.conftest import needs_faketime
from tests.test_cluster_voter import owner_of_key, ready_voters

pytestmark = pytest.mark.slow


class ClockedCluster(LocalCluster):
    """A LocalCluster whose nodes run under libfaketime (``node.clock``) where it can be had (else the clock test
    skips, and the eviction test runs on plain nodes)."""

    def __init__(self) -> None:
        super().__init__(3, 0)
        clock = faketime_library() is not None
        self.shards = [
            [LocalNode(node.binary, port=node.port, server_args=node.server_args, clock=clock) for node in shard]
            for shard in self.shards
        ]
        self.nodes = [node for shard in self.shards for node in shard]


@pytest.fixture(scope="module")
def shards() -> Iterator[LocalCluster]:
    with ClockedCluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def plain() -> Iterator[LocalNodes]:
    with LocalNodes(2) as nodes:
        yield nodes


@pytest.fixture
def voters(shards: LocalCluster, plain: LocalNodes) -> Iterator[list[str]]:
    yield ready_voters(shards, plain)
    for node in plain.nodes:
        node.resume()
    for node in shards.nodes:
        if faketime_library() is not None:
            node.clock.reset()
        node.command("CONFIG", "SET", "maxmemory", "0")
        node.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
        node.command("CONFIG", "RESETSTAT")
    shards.flush()


def other_shards_name(shards: LocalCluster, owner: Any) -> str:
    """A name whose key another primary serves."""
    for n in range(100):
        if owner_of_key(shards, f"redlock:elsewhere-{n}") is not owner:
            return f"elsewhere-{n}"
    raise AssertionError("every name on one shard")


def info(node: Any, section: str, field: str) -> int:
    reply = node.command("INFO", section)
    assert isinstance(reply, dict), reply
    return int(reply[field])


async def hold(first: Redlock, name: str, plain: LocalNodes) -> None:
    """*first* holds *name* on the cluster voter and the first standalone voter: the second is paused while it
    acquires, and its copy of the key (written when it resumes) is deleted, as if the SET never reached it."""
    await first.connect()  # the paused node's SET waits on an open connection, and lands on resume
    key = f"redlock:{name}"
    plain.nodes[1].pause()
    try:
        holder = first.lock(name, ttl=30.0)
        assert await holder.acquire(blocking=False), holder.outcomes
    finally:
        plain.nodes[1].resume()
    for _ in range(600):
        if plain.nodes[1].command("EXISTS", key):
            break
        await asyncio.sleep(0.05)
    assert plain.nodes[1].command("DEL", key) == 1


@needs_faketime
async def test_a_shard_whose_clock_jumps_ahead_sits_out_alone(
    voters: list[str], shards: LocalCluster, plain: LocalNodes
) -> None:
    events: list[LockEvent] = []
    name, key = "clocked", "redlock:clocked"
    owner = owner_of_key(shards, key)
    elsewhere = other_shards_name(shards, owner)
    async with Redlock(voters, queue=False) as first, Redlock(voters, queue=False, on_event=events.append) as second:
        await hold(first, name, plain)
        # The contender reads the owner's clock once (its vote carries a TIME), before the jump.
        assert not await second.lock(name).acquire(blocking=False)
        await asyncio.to_thread(owner.clock.step, 60.0)  # the lock key expires there, a lease early
        assert owner.command("GET", key) is None
        plain.nodes[0].pause()  # the holder's standalone yes: the cluster voter's decides
        contender = second.lock(name, ttl=30.0)
        assert not await contender.acquire(blocking=False), "a second holder: the jumped shard's yes counted"
        assert contender.outcomes[2].vote is Vote.YES, contender.outcomes  # the cluster voter's yes decided
        assert "clock" in contender.outcomes[0].detail, contender.outcomes
        told = [event for event in events if event.kind is EventKind.CLOCK]
        assert [event.clock_fault for event in told] == ["ahead"], told
        # Only that shard sits out: a name another primary serves is granted through the same voter.
        other = second.lock(elsewhere, ttl=5.0)
        assert await other.acquire(blocking=False), other.outcomes
        await other.release()


async def test_a_shard_that_evicts_a_held_key_sits_out_alone(
    voters: list[str], shards: LocalCluster, plain: LocalNodes
) -> None:
    events: list[LockEvent] = []
    name, key = "evicting", "redlock:evicting"
    owner = owner_of_key(shards, key)
    elsewhere = other_shards_name(shards, owner)
    owner.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    owner.command("CONFIG", "SET", "maxmemory", str(info(owner, "memory", "used_memory") + 2 * 1024 * 1024))
    async with Redlock(voters, queue=False) as first, Redlock(voters, queue=False, on_event=events.append) as second:
        await hold(first, name, plain)
        await second.connect()  # it met the owner before its evictions (evicted_keys 0)
        slot = int(owner.command("CLUSTER", "KEYSLOT", key))
        junk, tag = b"x" * 20_000, tag_for(slot)
        for i in range(5000):  # in the owner's slots: a hash tag of the name's slot
            owner.command("SET", tag + b"junk:%d" % i, junk)
            if i % 20 == 19 and not owner.command("EXISTS", key):
                break
        assert not owner.command("EXISTS", key)
        assert info(owner, "stats", "evicted_keys") > 0
        plain.nodes[0].pause()  # the holder's standalone yes: the cluster voter's decides
        contender = second.lock(name, ttl=30.0)
        assert not await contender.acquire(blocking=False), "a second holder: the evicting shard's yes counted"
        assert contender.outcomes[2].vote is Vote.YES, contender.outcomes  # the cluster voter's yes decided
        assert "evicted keys" in contender.outcomes[0].detail, contender.outcomes
        told = [event for event in events if event.kind is EventKind.EVICTED]
        assert len(told) == 1, told
        # A client meeting that primary now (evictions, no one can say when) keeps it out too.
        async with Redlock(voters, queue=False) as third:
            assert not await third.lock(name).acquire(blocking=False)
        # Only that shard sits out.
        other = second.lock(elsewhere, ttl=5.0)
        assert await other.acquire(blocking=False), other.outcomes
        await other.release()
