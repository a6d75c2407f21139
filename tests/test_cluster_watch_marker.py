"""The watch of a Cluster voter's shard (issue 39 item 3): a shard that failed over sits out a period from
the FIRST client's sight, for every client, fresh processes included, on real cluster-mode servers.

Before, each client sat a failed-over shard out a period from its own first sight: a client started
later (a fresh ``redlock run``) waited longer than the first, and one started every few seconds found
the shard out for as long as runs came. Now the first client to judge the shard replaced writes on its
marker key since when it is watched (``run_id.master_replid/since/µs``, the shard's own time), and every
client that reads it ends the quarantine a period after then. A shard is its run id *and* replication
id: a primary demoted and promoted back is not vouched for by the watch it kept from before.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from redlock_async import Redlock
from redlock_async._nodes import Node, tag_for
from redlock_async.testing import LocalCluster, LocalNode
from redlock_async.testing._inside import cluster_of
from tests.conftest import eventually
from tests.test_cluster_failover import name_on
from tests.test_cluster_voter import mark_shards

pytestmark = pytest.mark.slow

TTL = 8.0
"""The leases' ttl: the shard's quarantine lasts about this long (plus drift)."""

PROCESS_TTL = 15.0
"""The ttl of the ``redlock run`` processes: a loaded 2-core box takes seconds to start one, and the second
must still find the shard out (its promise is what is compared)."""

GAP = 3.5
"""How long after the first client's sight the second meets the shard: before, its quarantine ended that much
later than the first client's."""

MARGIN = 1.2
"""How far apart two clients' ends of the same watch may be: reply delays, a process's exit, on a loaded box."""

PROMISE = re.compile(r"a majority can vote again in ([0-9.]+) s")


@pytest.fixture
def shards() -> Iterator[LocalCluster]:
    with LocalCluster(2, 1) as cluster:
        mark_shards(cluster)  # a deployment in service: every shard marked
        yield cluster


def identity(node: LocalNode) -> bytes:
    """What a shard primary is to the quarantine: its run id and its replication id."""
    server: Any = node.command("INFO", "server")
    replication: Any = node.command("INFO", "replication")
    return f"{server['run_id']}.{replication['master_replid']}".encode()


def marker_of(shards: LocalCluster, node: LocalNode) -> bytes | None:
    """The marker key of shard 0 (it hashes to the lowest slot the shard serves), as *node* holds it."""
    value: Any = node.command("GET", b"redlock:" + tag_for(shards.slot_ranges(0)[0]))
    return value if value is None else bytes(value)


def _shard(client: Redlock, node: LocalNode) -> Node | None:
    voter: Any = cluster_of(client).nodes[0]
    return next((shard for shard in voter.primaries() if shard.endpoint.port == node.port), None)


async def judged(client: Redlock, node: LocalNode) -> float:
    """Read *client*'s slot map, connect to its primaries, and wait until it judged *node* (a shard primary):
    when its quarantine ends."""
    voter: Any = cluster_of(client).nodes[0]
    await voter.connect()

    def out() -> bool:
        shard = _shard(client, node)
        return shard is not None and time.monotonic() < shard.quarantined_until < math.inf

    assert await eventually(out, within=20.0), _shard(client, node)
    await asyncio.sleep(0.2)  # its watch's answer is in
    shard = _shard(client, node)
    assert shard is not None
    return shard.quarantined_until


async def test_a_client_met_later_ends_a_failed_over_shards_quarantine_with_the_first(shards: LocalCluster) -> None:
    name = name_on(shards, 0)
    async with Redlock([shards.url], queue=False, ttl=TTL) as first:
        await first.connect()
        new = shards.failover(0)  # its replica promoted: it may lack keys its old primary granted
        first_end = await judged(first, new)
        watch = marker_of(shards, new)
        period = cluster_of(first).quarantine_period()
        await asyncio.sleep(GAP)
        async with Redlock([shards.url], queue=False, ttl=TTL) as second:
            sight = time.monotonic()
            await second.connect()
            second_end = await judged(second, new)
            # Before: a period from its own sight, GAP later than the first's end.
            assert abs(second_end - first_end) < MARGIN, (second_end - first_end, second_end - sight, period)
            assert second_end - sight < period - GAP + MARGIN, (second_end - sight, period)
            assert watch is not None
            assert watch.startswith(identity(new) + b"/since/"), watch
            assert marker_of(shards, new) == watch  # the first client's watch stands
            theirs = second.lock(name)
            assert not await theirs.acquire(blocking=False), "counted before the watch's end"
            assert theirs.outcomes[0].vote.value == "quarantined", theirs.outcomes
            await asyncio.sleep(max(first_end, second_end) - time.monotonic() + 0.3)
            # Both ended it then: each takes the name on that shard with the shard's vote alone.
            assert await theirs.acquire(blocking=False), theirs.outcomes
            await theirs.release()
            mine = first.lock(name)
            assert await mine.acquire(blocking=False), mine.outcomes
            await mine.release()
        # Served, it is marked in service under this very shard.
        marked = identity(new) + b"/%d" % math.ceil(period * 1000)
        assert await eventually(lambda: marker_of(shards, new) == marked, 5.0)


def _run(url: str, name: str) -> tuple[float, int, str]:
    """``redlock run NAME -- true`` in a fresh process: (when it ended, its exit status, its stderr)."""
    ttl = str(PROCESS_TTL)
    argv = [sys.executable, "-m", "redlock_async", "run", "--ttl", ttl, "--nodes", url, name, "--", "true"]
    done = subprocess.run(argv, capture_output=True, text=True, env=os.environ, timeout=120, check=False)
    return time.monotonic(), done.returncode, done.stderr


def _promised(ended: float, err: str) -> float:
    """When the process said the shard counts again (its promise, from when it ended: the latest it can mean)."""
    found = PROMISE.search(err)
    assert found, err
    return ended + float(found[1])


def test_a_fresh_process_after_a_failover_is_promised_the_first_ones_end(shards: LocalCluster) -> None:
    name = name_on(shards, 0)
    new = shards.failover(0)
    ended, code, err = _run(shards.url, name)
    assert code == 69, err  # the failed-over shard sits out: its voter is this name's only one
    first = _promised(ended, err)
    watch = marker_of(shards, new)
    time.sleep(GAP)
    ended, code, err = _run(shards.url, name)
    assert code == 69, err
    # Before: a ttl from its own start, GAP and more after the first's promise.
    assert abs(_promised(ended, err) - first) < MARGIN, (_promised(ended, err) - first, err)
    assert watch is not None
    assert watch.startswith(identity(new) + b"/since/"), watch  # the first process wrote it
    time.sleep(max(0.0, first + 0.5 - time.monotonic()))
    ended, code, err = _run(shards.url, name)
    assert code == 0, err


async def test_a_primary_demoted_and_promoted_back_is_not_vouched_for_by_its_old_watch(shards: LocalCluster) -> None:
    old = shards.master_of(0)
    async with Redlock([shards.url], queue=False, ttl=TTL) as client:
        await client.connect()
        new = shards.failover(0)
        await judged(client, new)
        watch = marker_of(shards, new)
        assert watch is not None
        assert b"/since/" in watch, watch
    # No client meets the shard meanwhile: the old primary takes over (the watch replicated to it), then the
    # promoted one again, its data now the other's: it holds its own old watch, under its run id, again.
    assert shards.failover(0, replica=old) is old
    assert await eventually(lambda: marker_of(shards, old) == watch, 10.0)
    assert shards.failover(0, replica=new) is new
    assert await eventually(lambda: marker_of(shards, new) == watch, 10.0)
    server: Any = new.command("INFO", "server")
    assert watch.startswith(server["run_id"].encode()), watch  # the same process, with the same old watch,
    assert not watch.startswith(identity(new) + b"/"), watch  # but another replication id
    await asyncio.sleep(2.0)  # the old watch ends well before a period from now
    async with Redlock([shards.url], queue=False, ttl=TTL) as later:
        sight = time.monotonic()
        await later.connect()
        end = await judged(later, new)
        period = cluster_of(later).quarantine_period()
        assert end - sight > period - 0.5, (end - sight, period)  # a whole period: the old watch vouched for nothing
        rewatched = marker_of(shards, new)
        assert rewatched is not None
        assert rewatched.startswith(identity(new) + b"/since/"), rewatched


async def test_a_shard_that_lost_its_watch_while_it_sat_out_sits_out_a_new_period(shards: LocalCluster) -> None:
    name = name_on(shards, 0)
    async with Redlock([shards.url], queue=False, ttl=TTL) as client:
        await client.connect()
        new = shards.failover(0)
        end = await judged(client, new)
        watch = marker_of(shards, new)
        assert watch is not None
        assert watch.startswith(identity(new) + b"/since/"), watch
        new.command("FLUSHALL")  # the shard lost its data again while it sat out: its watch with the rest
        await asyncio.sleep(end - time.monotonic() + 0.5)
        # Read again when the watch ends: gone, so a new period from then, under a new watch.
        lock = client.lock(name)
        assert not await lock.acquire(blocking=False), "counted: the watch's loss went unseen"
        assert lock.outcomes[0].vote.value == "quarantined", lock.outcomes
        rewatched = marker_of(shards, new)
        assert rewatched is not None
        assert rewatched.startswith(identity(new) + b"/since/"), rewatched
        assert rewatched != watch
