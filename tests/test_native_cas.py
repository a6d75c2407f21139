"""Native compare-and-delete (issue 38 item 7): a hand-over's release (a bare compare-and-delete, the next
holder's round right behind it) is ``DELIFEQ`` on a server that has it (Valkey 9 and later), the same 1 or
0 as the HANDED_RELEASE script at well under half its node CPU (benchmarks/bench_server_cpu.py --scripts:
4.0 against 8.75 us per SET NX PX and release, A/A of RELEASE 10.25 and 10.25); the script elsewhere
(run this file with REDLOCK_SERVER_BIN naming a redis-server 6.2, 7.0 or 8.2)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from redlock_async import Redlock
from redlock_async.testing import LocalNode, LocalNodes

from .conftest import assert_no_library_tasks


def calls(node: LocalNode, command: str) -> int:
    stats = node.command("INFO", "commandstats")
    assert isinstance(stats, dict), stats
    found = stats.get(f"cmdstat_{command}")
    return int(found["calls"]) if isinstance(found, dict) else 0


def has_delifeq(node: LocalNode) -> bool:
    server = node.command("INFO", "server")
    assert isinstance(server, dict), server
    return int(str(server.get("valkey_version", "0")).partition(".")[0]) >= 9


@pytest.fixture(scope="module")
def nodes() -> Iterator[LocalNodes]:
    with LocalNodes(3) as nodes:
        yield nodes


async def hand_over_once(redlock: Redlock, nodes: LocalNodes) -> None:
    """A holder of a name, and a waiter of the same Redlock already in line when the holder releases."""
    order: list[str] = []
    waiting = redlock.lock("native:handover", acquire_timeout=5.0)

    async def holder() -> None:
        async with redlock.lock("native:handover"):
            order.append("first")
            while waiting.statistics().attempts < 1:  # the waiter tried: it waits in line
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)

    async def waiter() -> None:
        while not order:
            await asyncio.sleep(0.01)
        async with waiting:
            order.append("second")
            assert all(node.command("GET", "redlock:native:handover") for node in nodes)

    await asyncio.gather(holder(), waiter())
    assert order == ["first", "second"]
    # Whatever it used, nothing is left once the waiter released (no one behind it: RELEASE).
    assert [node.command("EXISTS", "redlock:native:handover") for node in nodes] == [0, 0, 0]


async def test_a_hand_over_releases_with_delifeq_where_the_server_has_it(nodes: LocalNodes) -> None:
    native = has_delifeq(nodes[0])
    async with Redlock(nodes.urls, queue=False, ttl=5.0) as redlock:
        for node in nodes:
            node.command("CONFIG", "RESETSTAT")
        delifeq = [0, 0, 0]
        for _ in range(10):  # until a release found its waiter in line (a hand-over), under any load
            await hand_over_once(redlock, nodes)
            delifeq = [calls(node, "delifeq") for node in nodes]
            if not native:
                assert delifeq == [0, 0, 0], delifeq  # the script, never the command it lacks
            elif delifeq != [0, 0, 0]:
                break
        # The hand-over's release on every node: DELIFEQ where the server has it.
        if native:
            assert delifeq[0] >= 1, "no hand-over in 10 tries"
            assert delifeq == [delifeq[0]] * 3, delifeq
    assert_no_library_tasks()


async def test_delifeq_keeps_another_holders_key(nodes: LocalNodes) -> None:
    """The native release compares as the script does: a key holding another token is left alone."""
    if not has_delifeq(nodes[0]):
        pytest.skip("the server has no DELIFEQ: the script runs, tested everywhere else")
    node = nodes[0]
    node.command("SET", "redlock:native:other", "someone-else")
    assert node.command("DELIFEQ", "redlock:native:other", "our-token") == 0
    assert node.command("GET", "redlock:native:other") == b"someone-else"
    assert node.command("DELIFEQ", "redlock:native:other", "someone-else") == 1
