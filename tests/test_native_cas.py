"""Native compare-and-delete (issue 38 item 7): a hand-over's release (a bare compare-and-delete, the next
holder's round right behind it) is ``DELIFEQ`` on a server that has it (Valkey 9 and later), the same 1 or
0 as the HANDED_RELEASE script at well under half its node CPU (benchmarks/bench_server_cpu.py --scripts:
4.0 against 8.75 us per SET NX PX and release, A/A of RELEASE 10.25 and 10.25); the script elsewhere
(run this file with REDLOCK_SERVER_BIN naming a redis-server 6.2, 7.0 or 8.2)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from redlock_async import Redlock
from redlock_async._nodes._endpoint import endpoint_for
from redlock_async._nodes._node import Node as LibraryNode
from redlock_async.testing import LocalNode, LocalNodes

from .conftest import assert_no_library_tasks, mark_in_service


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


async def hand_over_once(redlock: Redlock, nodes: Iterable[LocalNode]) -> None:
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


# -- the handshake's question: the command AND the permission (issue 38 item 7) ------------------------------

DOCUMENTED = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"
PROBE_KEY = b"redlock:{\x00probe}"


def knows_delifeq(node: LocalNode) -> bool:
    """The server knows DELIFEQ, whatever its version (run on a key no test uses)."""
    try:
        node.command("DELIFEQ", "test:native:none", "x")
    except redis.ResponseError as exc:
        if "unknown command" in str(exc):
            return False
        raise
    return True


def documented_rules(user: str) -> str:
    """docs/deployment.md's ACL line for *user* (password "pw"), without ``ACL SETUSER``."""
    found = re.search(r"^ACL SETUSER redlock on >CHANGE-ME (.*)$", DOCUMENTED.read_text(), re.MULTILINE)
    assert found, "docs/deployment.md has no 'ACL SETUSER redlock on >CHANGE-ME ...' line"
    return f"{user} on >pw {found.group(1)}"


@pytest.fixture(scope="module")
def acl_nodes() -> Iterator[LocalNodes]:
    """Three nodes with the documented user ("plain": no +delifeq) and, where the server knows the command,
    one allowed it ("native"; "plain" again elsewhere: an older server's ACL SETUSER refuses +delifeq)."""
    with LocalNodes(1) as probe:
        known = knows_delifeq(probe[0])
    plain = documented_rules("plain")
    native = documented_rules("native") + (" +delifeq" if known else "")
    with LocalNodes(3, acl=[plain, native]) as nodes:
        yield nodes


def as_user(nodes: LocalNodes, user: str) -> list[str]:
    return [url.replace("redis://", f"redis://{user}:pw@") for url in nodes.urls]


@pytest.mark.parametrize("user", ["default", "plain", "native"])
async def test_the_handshake_finds_the_command_and_the_permission(acl_nodes: LocalNodes, user: str) -> None:
    """Node.delifeq: the server knows DELIFEQ and the user may run it on the library's keys (asked of the ACL
    from a script, per connection); the documented user (no +delifeq) keeps the scripts; a connection that
    names no probe key (a subscriber's) does not ask."""
    known = knows_delifeq(acl_nodes[0])
    url = acl_nodes.urls[0] if user == "default" else as_user(acl_nodes, user)[0]
    expected = known and user != "plain"
    for probe_key, said in ((PROBE_KEY, expected), (b"", False)):
        node = LibraryNode(
            replace(endpoint_for(url, 0), probe_key=probe_key),
            max_unanswered=64,
            stall_after=5.0,
            connect_timeout=5.0,
            reconnect_delay=0.1,
        )
        try:
            assert await node.connect() is None
            assert node.delifeq is said, (user, probe_key)
        finally:
            await node.aclose(grace=0.1)
    assert acl_nodes[0].command("ACL", "LOG") == []  # asked of the ACL: nothing refused, nothing logged


@pytest.mark.parametrize("user", ["plain", "native"])
async def test_each_user_releases_and_hands_over_on_its_own_path(acl_nodes: LocalNodes, user: str) -> None:
    """The documented user (no +delifeq) on a server that has DELIFEQ: every release and hand-over runs the
    scripts and works (it sent DELIFEQ to a hand-over's release, refused: NOPERM on every node, a release
    that failed, the key left a whole ttl). The user allowed it: DELIFEQ, and the same outcomes."""
    acl_nodes.flush()
    native = user == "native" and knows_delifeq(acl_nodes[0])
    for node in acl_nodes:
        node.command("CONFIG", "RESETSTAT")
    async with Redlock(as_user(acl_nodes, user), queue=False, ttl=5.0) as redlock:
        for tries in range(10):  # a release finds its waiter in line (a hand-over) in most tries, under any load
            await hand_over_once(redlock, acl_nodes)
            if tries >= 4 and (not native or calls(acl_nodes[0], "delifeq")):
                break
    async with Redlock(as_user(acl_nodes, user), ttl=5.0) as redlock:  # the default path: QUEUE_LEAVE
        lock = redlock.lock("native:default")
        for _ in range(5):
            async with lock:
                pass
    delifeq = [calls(node, "delifeq") for node in acl_nodes]
    if native:
        assert all(count >= 6 for count in delifeq), delifeq  # 5 default releases, and the hand-over's
    else:
        assert delifeq == [0, 0, 0], delifeq
    for node in acl_nodes:
        assert node.command("EXISTS", "redlock:native:handover", "redlock:native:default") == 0  # released
        assert node.command("ACL", "LOG") == []  # nothing was refused
    assert_no_library_tasks()


OTHER_SERVER = "REDLOCK_OTHER_SERVER_BIN"
"""A server binary without DELIFEQ for the mixed cluster (e.g. a redis-server 7.0 from ``.ci/fetch-servers``);
unset: a Valkey 9.1 that does not know the command (``--rename-command DELIFEQ ""``)."""


async def test_a_mixed_cluster_runs_each_nodes_own_path() -> None:
    """Two nodes with DELIFEQ and one without (an older server): each node gets its own release; every lock
    is taken, handed over and released on all three."""
    other = os.environ.get(OTHER_SERVER)
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(LocalNode()) for _ in range(2)]
        if not knows_delifeq(nodes[0]):
            pytest.skip("the server has no DELIFEQ: every node takes the scripts (tested everywhere else)")
        if other:
            nodes.append(stack.enter_context(LocalNode(other)))
        else:
            nodes.append(stack.enter_context(LocalNode(server_args=["--rename-command", "DELIFEQ", ""])))
        assert not knows_delifeq(nodes[2])
        for node in nodes:
            mark_in_service(node)
        async with Redlock([node.url for node in nodes], ttl=5.0) as redlock:  # the default path
            lock = redlock.lock("native:default")
            for _ in range(5):
                async with lock:
                    pass
        async with Redlock([node.url for node in nodes], queue=False, ttl=5.0) as redlock:
            for tries in range(10):
                await hand_over_once(redlock, nodes)
                if tries >= 2 and calls(nodes[0], "delifeq") > 5:
                    break
        assert [calls(node, "delifeq") >= 6 for node in nodes] == [True, True, False]
        assert calls(nodes[2], "evalsha") >= 10  # its releases: the scripts
        for node in nodes:
            assert node.command("EXISTS", "redlock:native:handover", "redlock:native:default") == 0
    assert_no_library_tasks()
