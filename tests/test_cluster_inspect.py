"""``inspect()`` of a name on a Cluster voter judges the shard primary that serves the name, on real cluster-mode
servers (LocalCluster, 2 shards): a shard that evicted keys makes its names' verdicts doubtful (its view
``quarantined``: it may have lost keys), and only its names'. Before, the inspector read the locking
connections' hold of whichever shard sat out longest, for every name (a name on a healthy shard shown
``unknown``), and never a shard's evictions as its own connections met them (a name on an evicting shard shown
``free`` by a client whose locking connections had not met that shard: ``redlock status``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from redlock_async import Redlock
from redlock_async._core import clock as _clock
from redlock_async._nodes import tag_for
from redlock_async.testing import LocalCluster
from redlock_async.testing._inside import cluster_of
from tests.test_cluster_voter import mark_shards, owner_of_key

pytestmark = pytest.mark.slow


def info(node: Any, section: str, field: str) -> int:
    reply = node.command("INFO", section)
    assert isinstance(reply, dict), reply
    return int(reply[field])


def name_on(cluster: LocalCluster, master: Any, stem: str) -> str:
    """A name whose key *master* serves."""
    return next(f"{stem}{n}" for n in range(200) if owner_of_key(cluster, f"redlock:{stem}{n}") is master)


@pytest.fixture(scope="module")
def evicting() -> Iterator[tuple[LocalCluster, str, str]]:
    """A Cluster of 2 shards whose first primary evicted keys (and can evict: ``allkeys-lru``), a name on that
    shard, and a name on the other (healthy) one."""
    with LocalCluster(2, 0) as cluster:
        mark_shards(cluster)
        owner, healthy = cluster.master_of(0), cluster.master_of(1)
        owner.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
        owner.command("CONFIG", "SET", "maxmemory", str(info(owner, "memory", "used_memory") + 2 * 1024 * 1024))
        tag, junk = tag_for(cluster.slot_ranges(0)[0]), b"x" * 20_000
        for i in range(5000):
            owner.command("SET", tag + b"junk:%d" % i, junk)
            if i % 20 == 19 and info(owner, "stats", "evicted_keys") > 0:
                break
        assert info(owner, "stats", "evicted_keys") > 0
        # No more evictions from here (room enough), but the policy still can evict, and the count stands.
        owner.command("CONFIG", "SET", "maxmemory", str(info(owner, "memory", "used_memory") + 200 * 1024 * 1024))
        mark_shards(cluster)  # (its marker may have been evicted)
        yield cluster, name_on(cluster, owner, "evicting-"), name_on(cluster, healthy, "healthy-")


async def test_a_name_on_a_healthy_shard_is_not_judged_by_the_evicting_shard(
    evicting: tuple[LocalCluster, str, str],
) -> None:
    cluster, on_evicting, on_healthy = evicting
    async with Redlock([cluster.url]) as redlock:
        await redlock.connect()  # the locking connections meet the evicting primary: that shard sits out
        voter: Any = cluster_of(redlock).nodes[0]
        held = voter.owners[cluster.slot_ranges(0)[0]]
        assert held.clock_held_until > _clock.now(), "the evicting shard is not held out by the eviction watch"
        healthy = await redlock.inspect(on_healthy)
        # Before: "unknown", its voter's view "quarantined" (its clock jumped ahead: the evicting shard's hold).
        assert healthy.state == "free", healthy
        assert healthy.nodes[0].state == "free", healthy.nodes
        doubtful = await redlock.inspect(on_evicting)
        assert doubtful.state == "unknown", doubtful
        assert doubtful.nodes[0].state == "quarantined", doubtful.nodes
        assert "evicted keys" in (doubtful.nodes[0].error or ""), doubtful.nodes


async def test_a_name_on_an_evicting_shard_is_doubtful_for_an_inspector_alone(
    evicting: tuple[LocalCluster, str, str],
) -> None:
    cluster, on_evicting, on_healthy = evicting
    redlock = Redlock([cluster.url])  # never connected (as ``redlock status``): only the inspector's connections
    try:
        doubtful = await redlock.inspect(on_evicting)
        # Before: "free", sure: the shard's evictions were not read (the voter's own, of no connection, were).
        assert doubtful.state == "unknown", doubtful
        assert doubtful.nodes[0].state == "quarantined", doubtful.nodes
        assert "evicted keys" in (doubtful.nodes[0].error or ""), doubtful.nodes
        healthy = await redlock.inspect(on_healthy)
        assert healthy.state == "free", healthy
    finally:
        await redlock.aclose()
