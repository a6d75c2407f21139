"""Inspection beside nodes whose clocks jumped ahead (issue 35, item 5), against the clock nemesis (libfaketime).

A node whose clock jumps ahead expires every key at once: it shows "free" while the holder still has
most of its lease. It may have lost keys, so it must rule no holder out: the verdict is unknown (or held
when a majority shows the holder), never free. The client whose own acquire the clock guard just refused
knows it (its guard holds those nodes out); a fresh ``redlock status`` sees the nodes' ``TIME`` ahead of
its own clock and of the other nodes'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from redlock_async import Redlock
from redlock_async._shared._inspect import clocks_ahead
from redlock_async.cli import EXIT_HELD, EXIT_UNKNOWN
from redlock_async.testing import LocalNodes

from .conftest import needs_faketime
from .test_inspect_verdicts import redlock_status


@pytest.fixture(scope="module")
def clocked() -> Iterator[LocalNodes]:
    with LocalNodes(5, clock=True) as nodes:
        yield nodes


@pytest.fixture
def fresh(clocked: LocalNodes) -> LocalNodes:
    for node in clocked:
        node.clock.reset()
        node.command("FLUSHALL")
    return clocked


async def answered(redlock: Redlock) -> None:
    """Until every node answered all that *redlock* sent (a reply still on its way when a clock steps
    would read the jumped clock as the guard's first reading: see test_clock_guard.py)."""
    while any(node.unanswered for node in redlock.statistics().nodes):
        await asyncio.sleep(0.005)


@needs_faketime
async def test_a_clock_jump_on_three_nodes_beside_a_holder_is_unknown_not_free(fresh: LocalNodes) -> None:
    """A holds `job` on all 5 nodes (ttl 30 s); the clocks of nodes 0, 1 and 2 jump +60 s, which expires
    A's key there. B's acquire is refused for it (its clock guard holds the three out), yet B's inspect()
    and a fresh `redlock status` said free (exit 0) while A had 9 s left."""
    clocked = fresh
    urls = clocked.urls
    async with Redlock(urls, ttl=30.0) as holding, Redlock(urls, ttl=30.0) as contending:  # margins for CI
        lock = holding.lock("job", owner="A")
        assert await lock.acquire(blocking=False)
        # B has read every node's clock before the jump (its guard's first readings), and its inspector
        # has its connections open.
        warm = contending.lock("warm")
        assert await warm.acquire(blocking=False)
        await warm.release()
        await answered(contending)
        assert (await contending.inspect("job")).state == "held"
        for node in list(clocked)[:3]:
            await asyncio.to_thread(node.clock.step, 60.0)
        for node in list(clocked)[:3]:
            assert node.command("EXISTS", "redlock:job") == 0  # the premise: the jump expired A's key there
        assert not await contending.lock("job").acquire(blocking=False)  # refused: the guard holds 0-2 out
        assert sum(node.quarantined for node in contending.statistics().nodes) == 3

        info = await contending.inspect("job")
        assert info.state == "unknown", info  # before: free
        assert [node.state for node in info.nodes] == ["quarantined"] * 3 + ["held"] * 2
        assert all("clock guard" in node.error for node in info.nodes[:3]), info.nodes
        leader = await contending.election("job").leader()
        assert leader.state == "unknown", leader

        code, out = await redlock_status(urls, "job")  # a fresh process: it sees the nodes' TIME ahead
        assert code == EXIT_UNKNOWN, out  # before: 0, "verdict: free"
        assert "s ahead of ours" in out, out
        assert "3 more with a clock ahead" in out, out
        assert lock.held  # A still holds it (a 30 s lease, not extended: no watchdog)

        # A's key back on node 0 (clock ahead, key live): held on 3 of 5, whatever the clocks say.
        value = clocked[3].command("GET", "redlock:job")
        assert isinstance(value, bytes)
        clocked[0].command("SET", "redlock:job", value, "PX", 20_000)
        assert (await contending.inspect("job")).state == "held"
        code, out = await redlock_status(urls, "job")
        assert code == EXIT_HELD, out
        await lock.release()


def test_clocks_ahead_names_only_nodes_ahead_of_ours_and_of_another_nodes() -> None:
    def time_of(seconds: float) -> list[bytes]:
        return [b"%d" % int(seconds), b"%d" % round((seconds % 1) * 1e6)]

    sent, got = 1000.0, 1000.01
    same = [(time_of(1000.005), got)] * 5
    assert clocks_ahead(sent, same, 0.1) == [None] * 5
    # Our clock behind every node alike (5 s): none is suspect.
    assert clocks_ahead(sent, [(time_of(1005.0), got)] * 5, 0.1) == [None] * 5
    # One node 2 s behind the others: the others are ahead of it, but not of us.
    behind = [(time_of(998.0), got)] + [(time_of(1000.005), got)] * 4
    assert clocks_ahead(sent, behind, 0.1) == [None] * 5
    # Three nodes 60 s ahead.
    jumped = [(time_of(1060.0), got)] * 3 + [(time_of(1000.005), got)] * 2
    ahead = clocks_ahead(sent, jumped, 0.1)
    assert [a is not None and 59.9 < a < 60.0 for a in ahead] == [True] * 3 + [False] * 2
    # A node that did not answer, or answered something else, is not judged.
    assert clocks_ahead(sent, [(time_of(1060.0), float("inf")), (b"ERR", got), *jumped[3:]], 0.1) == [None] * 4
