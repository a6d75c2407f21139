"""A shard's failover is a restart of that shard (issue 39 item 3), on real cluster-mode servers.

The hazard: a lock key written on a shard's primary misses its replica (the replica stopped, its link
cut), the replica is promoted (``CLUSTER FAILOVER TAKEOVER``) without the key, and a second client
meets a majority without the holder: the promoted primary and a voter the holder did not have. The
shard quarantine keeps the promoted primary out of every quorum for a period (it was a replica since it
started: its replication ids say so), and only that shard: names on the other shard keep voting.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from redlock_async import Redlock
from redlock_async.testing import LocalCluster, LocalNodes
from redlock_async.testing._inside import cluster_of
from tests.conftest import eventually, mark_in_service
from tests.test_cluster_voter import IN_SERVICE, mark_shards

pytestmark = pytest.mark.slow


@pytest.fixture
def shards() -> Iterator[LocalCluster]:
    with LocalCluster(2, 1) as cluster:
        mark_shards(cluster)  # a deployment in service: every voter marked
        yield cluster


@pytest.fixture
def plain() -> Iterator[LocalNodes]:
    with LocalNodes(2) as nodes:
        for node in nodes.nodes:
            mark_in_service(node, period=IN_SERVICE)
        yield nodes


def name_on(shards: LocalCluster, shard: int, avoid: str = "") -> str:
    """A lock name whose key's slot shard *shard* was given at the start."""
    for i in range(1000):
        name = f"res{i}"
        if name == avoid:
            continue
        slot = int(shards.nodes[0].command("CLUSTER", "KEYSLOT", f"redlock:{name}"))  # type: ignore[call-overload]
        if shards.shard_of_slot(slot) == shard:
            return name
    raise AssertionError(f"no name on shard {shard}")


async def test_a_failed_over_shard_sits_out_and_no_second_holder_gets_in(
    shards: LocalCluster, plain: LocalNodes
) -> None:
    await _failover_case(shards, plain, quarantine=True)


async def test_without_the_quarantine_the_same_failover_lets_a_second_holder_in(
    shards: LocalCluster, plain: LocalNodes
) -> None:
    # The test above, with the quarantine switched off: the hazard is real, and the test sees it.
    await _failover_case(shards, plain, quarantine=False)


async def _failover_case(shards: LocalCluster, plain: LocalNodes, *, quarantine: bool) -> None:
    urls = [shards.url, *plain.urls]
    name = name_on(shards, 0)
    other = name_on(shards, 1)
    key = f"redlock:{name}"
    settings: dict[str, Any] = {} if quarantine else {"restart_quarantine": 0}
    async with Redlock(urls, queue=False, **settings) as holder_client:
        await holder_client.connect()
        lock = holder_client.lock(name, ttl=30.0)
        plain.nodes[1].pause()  # the holder sits on a bare majority: the cluster voter and plain[0]

        acquired: list[bool] = []
        master = shards.master_of(0)
        replica = shards.replicas_of(0)[0]
        replica.pause()
        master.command("CLIENT", "KILL", "TYPE", "replica")
        acquired.append(await lock.acquire(blocking=False))
        assert acquired == [True], lock.outcomes
        assert master.command("GET", key) is not None
        master.pause()
        replica.resume()
        new = shards.failover(0, replica=replica)
        assert new.command("GET", key) is None  # promoted without the holder's key
        plain.nodes[1].resume()
        # The holder's request to plain[1] was queued while it was stopped: it lands now. Taken out again,
        # as if it had never reached the node (the holder did not count it).
        assert await eventually(lambda: plain.nodes[1].command("GET", key) is not None, within=20.0)
        plain.nodes[1].command("DEL", key)

        async with Redlock(urls, queue=False, **settings) as second_client:
            theirs = second_client.lock(name, ttl=30.0)
            got = await theirs.acquire(blocking=False)
            if not quarantine:
                # The promoted primary and plain[1] make a majority beside the holder: two holders.
                assert got, theirs.outcomes
                assert lock.held
                return
            assert not got, "a second holder: the promoted shard was counted"
            votes = {outcome.node: outcome for outcome in theirs.outcomes}
            cluster_vote = votes[cluster_of(second_client).nodes[0].name]
            assert cluster_vote.vote.value == "quarantined", theirs.outcomes
            assert "promoted" in cluster_vote.detail or "replica" in cluster_vote.detail
            # Inspection (redlock status) does not call the name free: the promoted shard may have lost its key.
            info = await second_client.inspect(name)
            assert info.state != "free", info
            assert info.nodes[0].state == "quarantined", info.nodes[0]
            # Read at any other time than a vote's delivery (a grant queue's claim deciding later, statistics),
            # the voter sits out while any of its shards does: nothing counted later counts that shard's yes.
            assert second_client.statistics().nodes[0].quarantined
            # Only that shard sits out: a name on the other shard wins with the cluster voter's yes.
            plain.nodes[0].pause()
            elsewhere = second_client.lock(other, ttl=30.0)
            assert await elsewhere.acquire(blocking=False), elsewhere.outcomes
            plain.nodes[0].resume()
            await elsewhere.release()

        # The holder meets the promoted primary (the old one comes back as a replica): it drops the lock
        # at once, without waiting for its next extension.
        master.resume()
        voter = cluster_of(holder_client).nodes[0]
        await voter.connect()
        assert await eventually(lambda: not lock.held, within=10.0)


async def test_a_primary_demoted_then_promoted_back_is_judged_again(shards: LocalCluster, plain: LocalNodes) -> None:
    urls = [shards.url, *plain.urls]
    name = name_on(shards, 0)
    async with Redlock(urls, queue=False, ttl=5.0) as client:
        plain.nodes[1].pause()  # the cluster voter's word decides
        lock = client.lock(name)
        assert await lock.acquire(blocking=False), lock.outcomes
        await lock.release()
        first = shards.master_of(0)
        second = shards.failover(0)  # the replica takes over; the old primary becomes its replica
        assert not await lock.acquire(blocking=False)
        assert lock.outcomes[0].vote.value == "quarantined", lock.outcomes
        assert shards.failover(0, replica=first) is first  # and back: its data is now the other's
        voter: Any = cluster_of(client).nodes[0]
        await voter.refresh()
        assert voter.owners[shards.slot_ranges(0)[0]].endpoint.port == first.port
        assert not await lock.acquire(blocking=False)
        assert lock.outcomes[0].vote.value == "quarantined", lock.outcomes
        assert "promoted" in lock.outcomes[0].detail
        assert second is not first


async def test_a_standalone_voter_restarted_empty_beside_cluster_voters_is_not_a_new_deployment() -> None:
    # Two Cluster voters and one standalone voter: the standalone one alone is all its quarantine knows of
    # plain nodes. Restarted empty, it must not be judged a new deployment while the Clusters have markers.
    with LocalCluster(1, 0) as one, LocalCluster(1, 0) as two, LocalNodes(1) as plain:
        urls = [one.url, two.url, *plain.urls]
        async with Redlock(urls, queue=False) as holder:
            await holder.connect()  # a new deployment: every voter marked
            lock = holder.lock("kept", ttl=30.0)
            await _eventually_marked(plain)
            two.nodes[0].pause()  # the holder sits on a bare majority: the first Cluster and the standalone
            try:
                assert await lock.acquire(blocking=False), lock.outcomes
            finally:
                two.nodes[0].resume()
            # The holder's request queued on the stopped node lands now: taken out, as if it never came.
            assert await eventually(lambda: two.nodes[0].command("GET", "redlock:kept") is not None, within=20.0)
            two.nodes[0].command("DEL", "redlock:kept")
            plain.nodes[0].restart(keep_data=False)  # the standalone voter lost the holder's key
            async with Redlock(urls, queue=False) as second:
                theirs = second.lock("kept", ttl=30.0)
                assert not await theirs.acquire(blocking=False), "a second holder: the emptied node was judged new"
                assert theirs.outcomes[2].vote.value == "quarantined", theirs.outcomes


async def _eventually_marked(plain: LocalNodes) -> None:
    assert await eventually(lambda: plain.nodes[0].command("GET", "redlock:") is not None, within=10.0)
