"""An ACL user on a Cluster voter (docs/deployment.md, "A Redis Cluster as one voter"): the hand-off's words go
by sharded pub/sub there, so a user without ``+ssubscribe`` is told, once per voter, that its waiters only poll,
naming what it lacks for sharded pub/sub (``+ssubscribe`` and the channels), not ``+subscribe``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest

from redlock_async import Redlock
from redlock_async.testing import LocalCluster
from tests.test_acl import PAGE, PASSWORD, documented_rules
from tests.test_cluster_voter import mark_shards

pytestmark = pytest.mark.slow


def sharded_rules() -> str:
    """What docs/deployment.md says a Cluster voter's user needs besides the ACL line (read from the page)."""
    found = re.search(r"ACL user on a Cluster voter needs `([^`]+)`", PAGE.read_text())
    assert found, "docs/deployment.md does not say what an ACL user on a Cluster voter needs"
    return found.group(1)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, 0) as cluster:
        rules, sharded = documented_rules(), sharded_rules()
        full = rules + " " + sharded
        deaf = (rules + " " + sharded.replace("+ssubscribe", "")).replace("redlock on", "deaf on", 1)
        for node in cluster.nodes:
            node.command("ACL", "SETUSER", *full.split())
            node.command("ACL", "SETUSER", *deaf.split())
        yield cluster


def url_of(cluster: LocalCluster, user: str) -> str:
    return cluster.url.replace("redis+cluster://", f"redis+cluster://{user}:{PASSWORD}@")


async def test_the_documented_user_hands_off_on_a_cluster_voter(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.flush()
    mark_shards(cluster)
    async with Redlock([url_of(cluster, "redlock")], retry_delay=60.0) as redlock:
        held = redlock.lock("acl:heard", ttl=5.0)
        assert await held.acquire(blocking=False), held.outcomes
        # The waiter retries only after 60 s, past its acquire timeout: it wins only if it hears the release.
        waiter = asyncio.create_task(redlock.lock("acl:heard", ttl=5.0).acquire(timeout=20.0))
        await asyncio.sleep(0.2)
        await held.release()
        assert await waiter
    assert not [r.getMessage() for r in caplog.records if "refuses" in r.getMessage()]


async def test_a_user_without_ssubscribe_is_told_what_sharded_pub_sub_needs(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.flush()
    mark_shards(cluster)
    async with Redlock([url_of(cluster, "deaf")]) as redlock:
        held = redlock.lock("acl:deaf", ttl=5.0)
        assert await held.acquire(blocking=False), held.outcomes
        waiter = asyncio.create_task(redlock.lock("acl:deaf", ttl=5.0).acquire(timeout=30.0))
        await asyncio.sleep(0.2)
        await held.release()
        assert await waiter  # at its next poll
    told = [r.getMessage() for r in caplog.records if "refuses" in r.getMessage()]
    assert len(told) == 1, told  # once for the voter
    (words,) = told
    assert "refuses SSUBSCRIBE" in words, words
    assert "allow +ssubscribe" in words, words
    assert "+subscribe" not in words.replace("+ssubscribe", ""), words
    assert "&redlock:*" in words, words  # the channel pattern of the default key_prefix
