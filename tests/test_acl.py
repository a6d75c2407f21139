"""The ACL user of docs/deployment.md, on real servers: every primitive, the watchdog, the hand-off, the
CLI's status and break run as that user, with the line read from the page itself (the page cannot drift
from what works); a user short of one command the scripts call is refused at connect, naming it.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from redlock_async import Redlock, RedlockError
from redlock_async.testing import LocalNode, LocalNodes

from .conftest import assert_no_library_tasks

PASSWORD = "acl-line-pw"
PAGE = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"


def documented_rules() -> str:
    """The ACL SETUSER line of docs/deployment.md, its password filled in, without ``ACL SETUSER``."""
    found = re.search(r"^ACL SETUSER (redlock on >CHANGE-ME .*)$", PAGE.read_text(), re.MULTILINE)
    assert found, "docs/deployment.md has no 'ACL SETUSER redlock on >CHANGE-ME ...' line"
    return found.group(1).replace("CHANGE-ME", PASSWORD)


def without(rules: str, command: str) -> str:
    return rules.replace(f" +{command} ", " ").replace("redlock on", "short on", 1)


@pytest.fixture(scope="module")
def _servers() -> Iterator[LocalNodes]:
    rules = documented_rules()
    blind = without(rules, "info").replace("short on", "blind on", 1)
    noscan = without(rules, "scan").replace("short on", "noscan on", 1)
    deaf = without(rules, "subscribe").replace("short on", "deaf on", 1)
    acl = [rules, without(rules, "pexpire"), blind, noscan, deaf]
    with LocalNodes(3, password="default-pw", acl=acl) as nodes:
        yield nodes


@pytest.fixture
def nodes(_servers: LocalNodes) -> LocalNodes:
    _servers.flush()
    return _servers


def urls_of(nodes: LocalNodes, user: str = "redlock") -> list[str]:
    return [url.replace("redis://", f"redis://{user}:{PASSWORD}@") for url in nodes.urls]


async def cli(nodes: LocalNodes, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "redlock_async",
        *args[:1],
        "--nodes",
        ",".join(urls_of(nodes)),
        *args[1:],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(60):
        out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_the_documented_user_runs_every_primitive(nodes: LocalNodes, caplog: pytest.LogCaptureFixture) -> None:
    async with Redlock(urls_of(nodes)) as redlock:
        # A lock held across several watchdog extensions, with its fencing token.
        lock = redlock.lock("acl:lock", ttl=0.6, fencing=True)
        async with lock:
            await asyncio.sleep(1.5)
            assert lock.held
            assert lock.fencing_token is not None

        # The pushed hand-off: a waiter woken by the holder's release.
        order: list[str] = []

        async def holder() -> None:
            async with redlock.lock("acl:handoff", ttl=5.0):
                order.append("first")
                await asyncio.sleep(0.3)

        async def waiter() -> None:
            await asyncio.sleep(0.1)
            async with redlock.lock("acl:handoff", ttl=5.0, acquire_timeout=5.0):
                order.append("second")

        await asyncio.gather(holder(), waiter())
        assert order == ["first", "second"]

        async with redlock.lock_many(["acl:a", "acl:b"], ttl=5.0, fencing=True):
            pass
        semaphore = redlock.semaphore("acl:sem", limit=2, ttl=5.0)
        async with semaphore, redlock.semaphore("acl:sem", limit=2, ttl=5.0):
            third = redlock.semaphore("acl:sem", limit=2, ttl=5.0)
            assert not await asyncio.create_task(third.acquire(blocking=False))  # another task: both taken
        rw = redlock.rw_lock("acl:rw", ttl=5.0)
        async with rw.read():
            other = redlock.rw_lock("acl:rw", ttl=5.0).read()
            assert await asyncio.create_task(other.acquire(blocking=False))
            await other.release()
        writer = rw.write()
        await writer.acquire()
        async with writer.downgrade() as reader:
            assert reader.held
            assert not writer.held
        async with redlock.election("acl:leader", ttl=5.0).campaign() as term:
            assert term >= 1

        # redlock status and redlock break, as the same user.
        held = redlock.lock("acl:status", ttl=30.0)
        assert await held.acquire(blocking=False)
        code, out = await cli(nodes, "status", "acl:status")
        assert code == 1, out  # held
        code, out = await cli(nodes, "break", "acl:status", "--yes")
        assert code == 0, out
        code, out = await cli(nodes, "status", "acl:status")
        assert code == 0, out  # free
    refusals = [r.getMessage() for r in caplog.records if "refuse" in r.getMessage() or "NOPERM" in r.getMessage()]
    assert refusals == []
    for node in nodes:
        assert node.command("KEYS", "redlock:\x00probe*") == []
    assert_no_library_tasks()


async def test_a_user_short_of_a_command_the_scripts_call_is_refused_at_connect(nodes: LocalNodes) -> None:
    """Without PEXPIRE a lock would be taken and lost a ttl later: connect says so first, naming it."""
    with pytest.raises(RedlockError, match="pexpire") as caught:
        async with Redlock(urls_of(nodes, "short")):
            pytest.fail("connected as a user who cannot extend a lock")
    assert len(caught.value.outcomes) == 3
    assert all("pexpire" in outcome.detail for outcome in caught.value.outcomes)
    for node in nodes:
        assert node.command("KEYS", "*probe*") == []  # the probe left nothing
    assert_no_library_tasks()


async def test_a_user_short_of_a_command_who_never_connects_is_refused_before_any_body(nodes: LocalNodes) -> None:
    """No connect(): the first acquire of every primitive runs the probe first (before: the body ran, and
    the lock was lost a ttl later, 'no permissions to run the pexpire command')."""
    redlock = Redlock(urls_of(nodes, "short"))
    try:
        makers: list[Callable[[], AbstractAsyncContextManager[object]]] = [
            lambda: redlock.lock("acl:lazy", ttl=5.0),
            lambda: redlock.semaphore("acl:lazy-sem", limit=2, ttl=5.0),
            lambda: redlock.rw_lock("acl:lazy-rw", ttl=5.0).read(),
            lambda: redlock.election("acl:lazy-leader", ttl=5.0).campaign(),
        ]
        for make in makers:
            with pytest.raises(RedlockError, match="pexpire"):
                async with make():
                    pytest.fail("the body ran as a user who cannot extend a lock")
        for node in nodes:
            assert node.command("KEYS", "redlock:acl:*") == []
    finally:
        await redlock.aclose()
    assert_no_library_tasks()


def test_the_blocking_api_without_connect_is_refused_before_the_body(nodes: LocalNodes) -> None:
    from redlock_async import sync

    blocking = sync.Redlock(urls_of(nodes, "short"))  # no `with`, no connect(): first use
    try:
        with pytest.raises(RedlockError, match="pexpire"), blocking.lock("acl:lazy-sync", ttl=5.0):
            pytest.fail("the body ran as a user who cannot extend a lock")
    finally:
        blocking.close()
    for node in nodes:
        assert node.command("KEYS", "redlock:acl:*") == []


async def test_a_user_without_info_is_told_what_goes_unchecked(
    nodes: LocalNodes, caplog: pytest.LogCaptureFixture
) -> None:
    """Without INFO nothing sees a replica, a cluster-mode node, one server listed twice or a restart: before,
    it was used without a word."""
    async with Redlock(urls_of(nodes, "blind")) as redlock:
        lock = redlock.lock("acl:blind", ttl=5.0)
        assert await lock.acquire(blocking=False)
        await lock.release()
    told = [r.getMessage() for r in caplog.records if "may not run INFO" in r.getMessage()]
    assert len(told) == 3, told  # once per node
    for node in nodes:
        assert sum(f"redlock node 127.0.0.1:{node.port}:" in t for t in told) == 1, told
    assert all("allow +info" in t for t in told)
    assert_no_library_tasks()


async def test_a_replica_seen_by_a_user_without_info_is_called_a_replica(
    nodes: LocalNodes, caplog: pytest.LogCaptureFixture
) -> None:
    """The handshake cannot see the role without INFO; the probe's writes are refused READONLY: that is a
    replica, not a missing right (before: 'not allowed: set, pexpire, del, ...')."""
    first = nodes.nodes[0]
    rules = [without(documented_rules(), "info").replace("short on", "blind on", 1)]
    args = ("--replicaof", "127.0.0.1", str(first.port), "--masterauth", "default-pw")
    with LocalNode(password="default-pw", acl=rules, server_args=args) as replica:
        urls = [url.replace("redis://", f"redis://blind:{PASSWORD}@") for url in [replica.url, *nodes.urls[1:]]]
        async with Redlock(urls):
            pass  # connected, and probed, on entry
        texts = [r.getMessage() for r in caplog.records if "refuses what the lock scripts run" in r.getMessage()]
        assert len(texts) == 1, texts
        assert f"127.0.0.1:{replica.port}" in texts[0]
        assert "a replica, not a master" in texts[0], texts
        assert "not allowed" not in texts[0], texts
    assert_no_library_tasks()


async def test_a_user_without_scan_is_refused_at_connect(nodes: LocalNodes) -> None:
    """The fence repair SCANs the other nodes for a restarted node's counters: without SCAN that node sat out
    for ever, and nothing said so at connect (before: connected without a word)."""
    with pytest.raises(RedlockError, match="scan") as caught:
        async with Redlock(urls_of(nodes, "noscan")):
            pytest.fail("connected as a user who cannot SCAN")
    assert all("not allowed: scan" in outcome.detail for outcome in caught.value.outcomes), caught.value.outcomes


async def test_a_user_without_subscribe_is_told_its_waiters_only_poll(
    nodes: LocalNodes, caplog: pytest.LogCaptureFixture
) -> None:
    """SUBSCRIBE runs outside scripts (the probe cannot try it): a waiter still gets the lock, at its next
    poll; each node says once why (before: nothing said)."""
    async with Redlock(urls_of(nodes, "deaf")) as redlock:
        held = redlock.lock("acl:deaf", ttl=5.0)
        assert await held.acquire(blocking=False)
        waiter = asyncio.create_task(redlock.lock("acl:deaf", ttl=5.0).acquire(timeout=30.0))
        await asyncio.sleep(0.2)
        await held.release()
        assert await waiter
    told = [r.getMessage() for r in caplog.records if "refuses SUBSCRIBE" in r.getMessage()]
    for node in nodes:
        assert sum(f"redlock node 127.0.0.1:{node.port} " in t for t in told) == 1, told
    assert all("allow +subscribe" in t for t in told)
    assert_no_library_tasks()
