"""ACL users a Cluster voter meets in production (issue 39's attacks): one allowed ``CLUSTER SLOTS`` but not
``CLUSTER SHARDS`` (told once that its words go by plain pub/sub, and what to allow), one allowed neither (told
what to allow, not only what the server refused)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from redlock_async import Redlock, RedlockError
from redlock_async.testing import LocalCluster
from tests.test_acl import PASSWORD, documented_rules
from tests.test_cluster_acl import sharded_rules
from tests.test_cluster_voter import mark_shards, voter_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, 0) as cluster:
        rules = documented_rules() + " " + sharded_rules()
        users = {
            "slotsonly": rules.replace("+cluster|shards", "+cluster|slots"),
            "nomap": rules.replace("+cluster|shards", ""),
        }
        for user, line in users.items():
            for node in cluster.nodes:
                node.command("ACL", "SETUSER", *line.replace("redlock on", f"{user} on", 1).split())
        yield cluster


def url_of(cluster: LocalCluster, user: str) -> str:
    return cluster.url.replace("redis+cluster://", f"redis+cluster://{user}:{PASSWORD}@")


async def test_a_user_without_cluster_shards_is_told_its_words_go_by_plain_pub_sub(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.flush()
    mark_shards(cluster)
    async with Redlock([url_of(cluster, "slotsonly")], retry_delay=60.0) as redlock:
        await redlock.connect()
        voter = voter_of(redlock)
        assert not voter.sharded  # the map from CLUSTER SLOTS: plain PUBLISH, which every node carries
        held = redlock.lock("acl:plain", ttl=5.0)
        assert await held.acquire(blocking=False), held.outcomes
        waiter = asyncio.create_task(redlock.lock("acl:plain", ttl=5.0).acquire(timeout=20.0))
        await asyncio.sleep(0.2)
        await held.release()
        assert await waiter  # woken by the word all the same (the retry comes after 60 s)
        await voter.refresh()
    told = [r.getMessage() for r in caplog.records if "cluster|shards" in r.getMessage()]
    assert len(told) == 1, told  # once for the voter, not at every reading of the map
    assert "plain PUBLISH" in told[0], told
    assert "allow +cluster|shards" in told[0], told


async def test_a_user_that_may_not_read_the_slot_map_is_told_what_to_allow(cluster: LocalCluster) -> None:
    # An error that says what to change, as for a user who may not run the scripts: not a lock that another
    # client seems to hold (acquire() False, as before).
    for connect in (True, False):
        redlock = Redlock([url_of(cluster, "nomap")])
        with pytest.raises(RedlockError) as caught:
            if connect:
                async with redlock:
                    raise AssertionError("connected with a user who may not read the slot map")
            else:
                try:  # never connected: the first acquire connects
                    await redlock.lock("acl:nomap", ttl=5.0).acquire(blocking=False)
                finally:
                    await redlock.aclose()
        message = str(caught.value)
        assert "1 of 1 nodes refuse the user what connecting to them needs" in message, message
        assert "allow +cluster|shards" in message, message
        (outcome,) = caught.value.outcomes
        assert "allow +cluster|shards" in outcome.detail, outcome
