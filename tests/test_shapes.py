"""The local Cluster and Sentinel harness (redlock_async.testing.LocalCluster / LocalSentinels), on real processes."""

from __future__ import annotations

import os

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from redlock_async.testing import LocalCluster, LocalSentinels

pytestmark = pytest.mark.slow


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_cluster_serves_every_slot_with_a_replica_per_shard_and_closes_clean() -> None:
    cluster = LocalCluster(3, 1)
    with cluster:
        assert all(node.port + 10000 <= 65535 for node in cluster)
        # A client of its own (redis-py's cluster client) finds every shard and writes through them.
        client = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.nodes[0].port)])  # type: ignore[no-untyped-call]
        try:
            shards = client.execute_command("CLUSTER SHARDS", target_nodes=RedisCluster.RANDOM)  # type: ignore[no-untyped-call]
            assert len(shards) == 3
            for key in ("a", "b", "c", "d", "e", "f"):
                client.set(key, key)
            assert [client.get(k) for k in ("a", "b", "c", "d", "e", "f")] == [b"a", b"b", b"c", b"d", b"e", b"f"]
            slots = {client.keyslot(k) for k in ("a", "b", "c", "d", "e", "f")}  # type: ignore[no-untyped-call]
            assert len({cluster.shard_of_slot(slot) for slot in slots}) > 1
        finally:
            client.close()
        for shard in range(3):
            assert cluster.master_of(shard) is cluster.shards[shard][0]
            assert cluster.replicas_of(shard) == [cluster.shards[shard][1]]
        assert cluster.url.startswith(f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}?seed=127.0.0.1:")
        assert cluster.url.count("seed=") == 5
        pids = [node.pid for node in cluster]
    assert all(pid is not None and _gone(pid) for pid in pids)
    assert all(node.dir is None for node in cluster)


def test_cluster_failover_promotes_the_replica_and_keeps_the_data_it_had() -> None:
    with LocalCluster(2, 1) as cluster:
        slot = int(cluster.nodes[0].command("CLUSTER", "KEYSLOT", "k0"))  # type: ignore[call-overload]
        shard = cluster.shard_of_slot(slot)
        master = cluster.master_of(shard)
        master.command("SET", "k0", "v")
        master.command("WAIT", 1, 2000)
        new = cluster.failover(shard)
        assert new is not master
        assert cluster.master_of(shard) is new
        assert new.command("GET", "k0") == b"v"
        assert cluster.replicas_of(shard) == [master]


def test_sentinel_group_names_its_master_and_fails_over() -> None:
    with LocalSentinels(1, 3) as group:
        first = group.master()
        assert first is group.servers[0]
        assert group.url.startswith(f"redis+sentinel://127.0.0.1:{group.sentinels[0].port}/voter?sentinel=")
        sentinel = Sentinel([("127.0.0.1", node.port) for node in group.sentinels], socket_timeout=2.0)  # type: ignore[no-untyped-call]
        assert sentinel.discover_master("voter") == ("127.0.0.1", first.port)  # type: ignore[no-untyped-call]
        first.command("SET", "k", "v")
        first.command("WAIT", 1, 2000)
        second = group.failover()
        assert second is group.servers[1]
        assert sentinel.discover_master("voter") == ("127.0.0.1", second.port)  # type: ignore[no-untyped-call]
        assert second.command("GET", "k") == b"v"
        with pytest.raises(redis.ReadOnlyError):
            first.command("SET", "k", "w")
        pids = [node.pid for node in group]
    assert len(pids) == 5
    assert all(pid is not None and _gone(pid) for pid in pids)


def test_shapes_refuse_bad_settings() -> None:
    with pytest.raises(ValueError, match="shards must be 1 to 64"):
        LocalCluster(0)
    with pytest.raises(ValueError, match="sentinels must be 1 or more"):
        LocalSentinels(1, 0)
    with pytest.raises(ValueError, match="service 'a b'"):
        LocalSentinels(service="a b")


def test_the_plugin_fixtures_give_started_shapes(
    redlock_cluster: LocalCluster, redlock_sentinels: LocalSentinels
) -> None:
    assert len(redlock_cluster.shards) == 3
    assert all(len(shard) == 2 for shard in redlock_cluster.shards)
    assert b"cluster_state:ok" in redlock_cluster.nodes[0].command("CLUSTER", "INFO")  # type: ignore[operator]
    assert redlock_sentinels.master() is redlock_sentinels.servers[0]
    assert len(redlock_sentinels.sentinels) == 3
