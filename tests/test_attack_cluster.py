"""Attacks on a Cluster voter as production meets it (issue 39): slots moving under a vote, scripts lost on the
importing primary, cancellation beside a redirection. Real cluster-mode servers (LocalCluster)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from redlock_async import Redlock
from redlock_async.testing import LocalCluster, LocalNodes
from tests.conftest import eventually, mark_in_service
from tests.test_cluster_voter import IN_SERVICE, mark_shards, voter_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(2, 1) as shards:
        yield shards


@pytest.fixture
def shards(cluster: LocalCluster) -> LocalCluster:
    cluster.flush()
    mark_shards(cluster)
    return cluster


def slot_of(cluster: LocalCluster, key: str) -> int:
    reply: Any = cluster.nodes[0].command("CLUSTER", "KEYSLOT", key)
    return int(reply)


def name_on(cluster: LocalCluster, shard: int, prefix: str) -> tuple[str, int]:
    """A name whose lock key's slot is shard *shard*'s, and that slot."""
    for i in range(1000):
        slot = slot_of(cluster, f"redlock:{prefix}{i}")
        if cluster.shard_of_slot(slot) == shard:
            return f"{prefix}{i}", slot
    raise AssertionError("no name found")


def keys_in(node: Any, slot: int) -> list[bytes]:
    """The keys *node* holds in *slot* (a read of a key there would be redirected while the slot migrates)."""
    reply: Any = node.command("CLUSTER", "GETKEYSINSLOT", slot, 100)
    return list(reply)


@pytest.mark.parametrize("settings", [{"queue": False}, {"wait_replicas": 1}], ids=["plain", "wait"])
async def test_a_script_lost_on_the_importing_primary_is_run_there_behind_asking(
    shards: LocalCluster, settings: dict[str, Any]
) -> None:
    # A slot migrating from shard 0 to shard 1, and SCRIPT FLUSH on the importing primary (a restart of its
    # script cache, an operator): the EVAL sent again after NOSCRIPT must carry ASKING too, else it is answered
    # MOVED (back to the source), which answers ASK, and the vote is lost to the hop limit. (Not with the grant
    # queue: its release names the line's key too, and an importing primary answers a command of several keys
    # TRYAGAIN while one is missing: a timeout, by design, until the slot has moved.)
    name, slot = name_on(shards, 0, "flushed")
    key = f"redlock:{name}".encode()
    source, target = shards.master_of(0), shards.master_of(1)
    async with Redlock([shards.url], ttl=5.0, **settings) as redlock:
        await redlock.connect()
        target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", shards.node_id(source))
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", shards.node_id(target))
        try:
            for round_ in range(3):
                target.command("SCRIPT", "FLUSH")
                lock = redlock.lock(name)
                assert await lock.acquire(blocking=False), (round_, lock.outcomes)
                assert key in keys_in(target, slot)
                target.command("SCRIPT", "FLUSH")
                await lock.extend()
                target.command("SCRIPT", "FLUSH")
                await lock.release()
                assert key not in keys_in(target, slot), "the release did not run"
        finally:
            for node in (source, target):
                node.command("CLUSTER", "SETSLOT", slot, "NODE", shards.node_id(source))
            shards.wait_ready()


async def test_a_waiter_hears_the_release_on_this_server_s_cluster(shards: LocalCluster) -> None:
    # Whatever server runs the cluster ($REDLOCK_SERVER_BIN: the servers leg runs Redis 6.2 and 7.0 too): before
    # 7.0 the map comes from CLUSTER SLOTS and the words go by plain PUBLISH/SUBSCRIBE, from 7.0 by sharded pub/sub;
    # either way the waiter, whose retry comes only after its acquire timeout, is woken by the release word.
    server: Any = shards.nodes[0].command("INFO", "server")
    major = int(str(server["redis_version"]).split(".")[0])
    async with (
        Redlock([shards.url], ttl=30.0) as first,
        Redlock([shards.url], ttl=30.0, retry_delay=60.0) as second,
    ):
        await first.connect()
        assert voter_of(first).sharded is (major >= 7)
        for shard in (0, 1):
            name, _ = name_on(shards, shard, "handed")
            mine = first.lock(name)
            assert await mine.acquire(blocking=False), mine.outcomes
            waiter = asyncio.ensure_future(second.lock(name, acquire_timeout=20.0).acquire())
            await asyncio.sleep(0.5)
            assert not waiter.done()
            await mine.release()
            assert await asyncio.wait_for(waiter, 15.0), "the waiter did not hear the release"
        semaphore = first.semaphore("permits", limit=2)
        assert await semaphore.acquire(blocking=False)
        await semaphore.release()


async def test_a_shard_primary_restarted_empty_behind_its_address_lets_no_second_holder_in() -> None:
    # The node swapped behind the same address: shard 0's primary killed and started again at once on its port,
    # empty (no persistence), its nodes.conf kept: it comes back as the primary of its slots, before its replica
    # could take over, without the holder's key. Held on a bare majority (the cluster voter and plain[0]).
    with LocalCluster(2, 1) as cluster, LocalNodes(2) as plain:
        mark_shards(cluster)
        for node in plain.nodes:
            mark_in_service(node, period=IN_SERVICE)
        urls = [cluster.url, *plain.urls]
        name, _ = name_on(cluster, 0, "swapped")
        key = f"redlock:{name}"
        async with Redlock(urls, queue=False) as holder:
            await holder.connect()
            lock = holder.lock(name, ttl=30.0)
            plain.nodes[1].pause()
            assert await lock.acquire(blocking=False), lock.outcomes
            master = cluster.master_of(0)
            master.restart(keep_data=False)
            cluster.wait_ready()
            assert cluster.master_of(0) is master
            assert master.command("GET", key) is None
            plain.nodes[1].resume()
            assert await eventually(lambda: plain.nodes[1].command("GET", key) is not None, within=20.0)
            plain.nodes[1].command("DEL", key)  # as if the holder's request had never reached it
            async with Redlock(urls, queue=False) as second:  # a client that meets the restarted primary first
                theirs = second.lock(name, ttl=30.0)
                assert not await theirs.acquire(blocking=False), "a second holder on the restarted shard"
            theirs = holder.lock(name, ttl=30.0)  # the holder's own client, which knew the old run
            assert not await theirs.acquire(blocking=False), theirs.outcomes
            assert await eventually(lambda: not lock.held, within=10.0), "the holder kept a lock its shard lost"


async def test_a_shard_down_at_start_is_not_said_to_stop_every_lock(caplog: pytest.LogCaptureFixture) -> None:
    # One shard's primary down when a client starts: the names of the other shard keep their votes, so the client
    # must not say that no lock can be granted (it did: the voter counted as down), but which shard it lacks.
    with LocalCluster(2, 0, node_timeout=60.0) as cluster:  # (the Cluster itself stays up meanwhile)
        mark_shards(cluster)
        down = cluster.master_of(0)
        name, _ = name_on(cluster, 1, "elsewhere")
        down.pause()
        try:
            async with Redlock([cluster.url], ttl=5.0) as redlock:
                await redlock.connect()
                lock = redlock.lock(name)
                assert await lock.acquire(blocking=False), lock.outcomes
                await lock.release()
        finally:
            down.resume()
    said = [record.getMessage() for record in caplog.records]
    assert not [line for line in said if "no lock can be granted" in line], said
    assert [line for line in said if f"127.0.0.1:{down.port}" in line and "other shards vote" in line], said
