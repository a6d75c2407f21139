"""Bad input to Redlock and its locks, and nodes unfit to lock on: a clear error, and nothing left behind.

(Bad settings values are in test_settings.py, fenced_set's arguments in test_fencing.py and
the command line's in test_cli.py, beside the rest of each module's tests.)

Each case expects an error whose type and message name the problem and what
to change, no key left on any node, no task left running (``make_redlock``
checks) and no connection left open (counted on the servers after aclose).
The servers are real: the shared cluster, servers of the test's own where the
configuration must differ (a password, an ACL user without scripts, a renamed
EVALSHA), and small asyncio TCP servers that are not Redis at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis

from redlock_async import LockLost, LockNotAcquired, Redlock, RedlockError
from redlock_async._core._algorithm import Vote
from redlock_async._nodes._wire import Failure
from redlock_async._scripts import RELEASE
from redlock_async.testing import LocalNode

from .conftest import (
    REFUSING,
    Cluster,
    MakeRedlock,
    Node,
    assert_empty,
    assert_no_library_tasks,
    client_connections,
    lock_keys,
    mark_in_service,
    one_node,
    own_server,
    refusing_server,
)

PY = sys.executable


# -- helpers ---------------------------------------------------------------------------------


async def assert_connections(nodes: list[Node], expected: list[int]) -> None:
    """The servers see *expected* connections again (closing is asynchronous: wait, bounded)."""
    deadline = time.monotonic() + 3.0
    while (seen := [client_connections(node) for node in nodes]) != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert seen == expected, f"connections left open: {seen}, expected {expected}"


class NotRedisServer:
    """A TCP server that is not Redis; *how* it answers whatever comes:

    ``http``: an HTTP 400 reply, keeping the connection open; ``garbage``: bytes that are no
    RESP; ``closes``: hangs up at once; ``silent``: reads and never answers.
    """

    def __init__(self, how: str) -> None:
        self.how = how
        self.port = 0
        self.accepted = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._writers)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.accepted += 1
        try:
            while self.how != "closes" and (data := await reader.read(65536)):
                if self.how == "http":
                    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                elif self.how == "garbage":
                    writer.write(b"\x00\xff\xfe garbage " + data[:8] + b"\r\n")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            self._tasks.discard(task)

    async def aclose(self) -> None:
        """Stop listening and hang up; nothing to do if it never started."""
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        await self._server.wait_closed()


@contextlib.asynccontextmanager
async def fake_nodes(how: str, count: int) -> AsyncIterator[list[NotRedisServer]]:
    fakes = [NotRedisServer(how) for _ in range(count)]
    try:
        for fake in fakes:
            await fake.start()
        yield fakes
    finally:
        for fake in fakes:
            await fake.aclose()


async def assert_hung_up(fakes: list[NotRedisServer]) -> None:
    deadline = time.monotonic() + 3.0
    while any(f.open_connections for f in fakes) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert [f.open_connections for f in fakes] == [0] * len(fakes), "connections to the fake nodes left open"


# -- Redlock(nodes, ...) --------------------------------------------------------------------------


@pytest.mark.parametrize(("nodes", "kind"), [(None, "NoneType"), (42, "int"), (3.5, "float"), (object(), "object")])
def test_nodes_that_are_not_a_list(nodes: Any, kind: str) -> None:
    with pytest.raises(TypeError, match=rf"^nodes must be a list of URLs or clients, got {kind}$"):
        Redlock(nodes)


def test_a_synchronous_client_is_named_as_such() -> None:
    client = redis.Redis(port=1)
    try:
        with pytest.raises(TypeError, match=r"^nodes\[0\] must be .* got Redis \(a synchronous client: pass a redis"):
            Redlock([client])  # type: ignore[list-item]
    finally:
        client.close()


# -- names on real nodes -----------------------------------------------------------------------------


@pytest.mark.serial
@pytest.mark.parametrize(
    "name",
    [b"\xff\xfe", b"\x01\x02\x7f", b"a\r\n*1\r\n$4\r\nPING\r\n", "caf\u00e9 \U0001f512", b"x" * 4096],
    ids=["latin1", "control", "resp-injection", "unicode", "longest"],
)
async def test_any_bytes_name_locks_exactly_those_bytes(
    name: str | bytes, cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    raw = name.encode() if isinstance(name, str) else name
    holder = await make_redlock(fencing=True)
    waiter = await make_redlock(fencing=True, retry_delay=5.0)  # a quick turn can only come from the release
    async with holder.lock(name, ttl=5.0) as lock:
        assert lock.token is not None
        assert [cluster[i].command("GET", b"redlock:" + raw) for i in range(5)] == [lock.token.encode()] * 5
        assert [cluster[i].command("GET", b"redlock-fence:" + raw) for i in range(5)] == [b"1"] * 5
        other = waiter.lock(name, ttl=5.0)
        assert not await other.acquire(blocking=False)
        wanted = asyncio.ensure_future(other.acquire(timeout=4.0))
        await asyncio.sleep(0.1)
    started = time.monotonic()
    assert await wanted
    assert time.monotonic() - started < 1.0  # woken by the release on the name's own channel
    assert other.fencing_token == 2
    await other.release()
    await assert_empty(cluster, b"redlock-fence:" + raw, b"redlock-fence:" + raw + b"\x00by")


async def test_a_rejected_name_sends_nothing(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    for name in ("x" * (1 << 20), b"y" * 4097, ""):
        with pytest.raises(ValueError, match="resource name"):
            redlock.lock(name)
    await assert_empty(cluster)


@pytest.mark.parametrize(
    "name",
    [b"a\x00queue", "a\x00waits", "\x00semaphore\x00pool\x000", b"\x00rw\x00doc", "\x00", b"doc\x00"],
    ids=["queue-line", "queue-waits", "semaphore-slot", "rw-writer", "nul", "trailing"],
)
async def test_a_name_with_a_nul_byte_is_refused_by_every_primitive(
    name: str | bytes, cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """Issue 35: the library's keys use NUL as a separator, so a name holding one could stand for another
    primitive's key: a lock on semaphore "pool"'s slot 0, or on read/write lock "doc"'s writer key (granted
    beside a reader: its SET NX found the writer key free). Every maker refuses it, saying what to change,
    and nothing is sent."""
    redlock = await make_redlock()
    makers: list[Callable[[], object]] = [
        lambda: redlock.lock(name),
        lambda: redlock.lock_many(["b", name]),
        lambda: redlock.semaphore(name, limit=2),
        lambda: redlock.rw_lock(name),
        lambda: redlock.election(name),
    ]
    for make in makers:
        with pytest.raises(ValueError, match=r"contains a NUL byte \(\\x00\).*Leave it out"):
            make()
    await assert_empty(cluster)


async def test_a_lock_can_no_longer_be_granted_beside_a_reader(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    reader = redlock.rw_lock("doc").read()
    assert await reader.acquire(blocking=False)
    with pytest.raises(ValueError, match="NUL byte"):
        redlock.lock(b"\x00rw\x00doc")  # (before: granted, beside the reader)
    assert not await redlock.rw_lock("doc").write().acquire(blocking=False)
    await reader.release()


# -- acquire / extend / release arguments --------------------------------------------------------------


async def test_acquire_extend_release_arguments(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    lock = redlock.lock("arguments", ttl=2.0)
    bad_timeouts: list[tuple[Any, type[Exception]]] = [
        ("1", TypeError),
        (True, TypeError),
        (math.nan, ValueError),
        (-1, ValueError),
        (-math.inf, ValueError),
    ]
    for timeout, error in bad_timeouts:
        with pytest.raises(error, match=r"^timeout must be"):
            await lock.acquire(timeout=timeout)
    blocking: Any
    for blocking in ("yes", 1, None, 2.0):
        with pytest.raises(
            TypeError, match=r"^blocking must be True or False, got .*: for a time limit, pass timeout="
        ):
            await lock.acquire(blocking=blocking)
    with pytest.raises(TypeError, match="positional"):
        await lock.acquire(2.0)  # type: ignore[call-arg, arg-type]
    with pytest.raises(RuntimeError, match=r"^extend\(\) of lock 'arguments', which is not held: acquire it first"):
        await lock.extend()
    with pytest.raises(RuntimeError, match=r"^release\(\) of lock 'arguments', which is not held"):
        await lock.release()
    assert not lock.held
    await assert_empty(cluster)  # nothing was sent

    assert await lock.acquire(blocking=False)
    bad_ttls: list[tuple[Any, type[Exception], str]] = [
        (0, ValueError, r"^ttl must be > 0"),
        (-1.0, ValueError, r"^ttl must be > 0"),
        (math.nan, ValueError, r"^ttl must be a number of seconds, got NaN"),
        (math.inf, ValueError, r"^ttl must be finite"),
        (1e16, ValueError, r"^ttl must be at most"),
        (True, TypeError, r"^ttl must be a number of seconds"),
        ("3", TypeError, r"^ttl must be a number of seconds"),
        (0.1, ValueError, r"^node_timeout \(0\.05 s\) must be at most ttl/10 .*raise the ttl"),
    ]
    for ttl, error, pattern in bad_ttls:
        with pytest.raises(error, match=pattern):
            await lock.extend(ttl)
        assert lock.held  # a refused argument changes nothing
    pttls = [int(cluster[i].command("PTTL", "redlock:arguments")) for i in range(5)]  # type: ignore[call-overload]
    assert all(0 < pttl <= 2000 for pttl in pttls), pttls
    with pytest.raises(RuntimeError, match="already held: a Lock is not reentrant"):
        await lock.acquire()
    await lock.extend(30)  # still usable
    assert int(cluster[0].command("PTTL", "redlock:arguments")) > 2000  # type: ignore[call-overload]
    await lock.release()
    await assert_empty(cluster)


async def test_the_largest_ttl_works_on_real_nodes(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    cluster.flush()  # a new cluster (no marker), as the longest period trusts no marker of a shorter one
    redlock = await make_redlock(ttl=9007199254740.0)
    lock = redlock.lock("for-ages")
    assert await lock.acquire(blocking=False), lock.outcomes
    assert int(cluster[0].command("PTTL", "redlock:for-ages")) > 9 * 10**15  # type: ignore[call-overload]
    await lock.extend()
    await lock.release()
    await assert_empty(cluster)


async def test_an_on_lost_callback_that_raises_still_stops_the_body(
    cluster: Cluster, make_redlock: MakeRedlock, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(lost: LockLost) -> None:
        raise KeyError("bug in the callback")

    redlock = await make_redlock()
    lock = redlock.lock("broken-callback", ttl=0.5, on_lost=broken)
    reached = False
    with pytest.raises(LockLost, match="gone from a majority"):
        async with lock:
            for i in range(3):
                cluster[i].command("SET", "redlock:broken-callback", "intruder")
            await asyncio.sleep(3)
            reached = True
    assert not reached  # not told, so cancelled: never running on without the lock
    assert "on_lost callback failed: cancelling the body" in caplog.text
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


# -- nodes that are not Redis --------------------------------------------------------------------------


FAKES = {
    "http": r"Protocol error",
    "garbage": r"Protocol error",
    "closes": r"Connection closed by server|Connection reset by peer",
    "silent": r"timeout|timed out",
}


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("how", list(FAKES))
async def test_a_node_that_is_not_redis_is_a_failed_vote_with_its_reason(
    how: str, cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    real = [cluster[i] for i in range(3)]
    for node in real:
        mark_in_service(node)  # in service: a cluster met with nodes that never answer is not known to be new
    before = [client_connections(node) for node in real]
    async with fake_nodes(how, 3) as fakes:
        # A minority of such nodes: the lock works on the others.
        mixed = await make_redlock([*cluster.urls[:3], fakes[0].url, fakes[1].url], connect_timeout=0.3)
        lock = mixed.lock("not-redis", ttl=2.0)
        assert await lock.acquire(timeout=2.0), lock.outcomes
        await lock.release()
        await assert_empty(cluster)

        # Only such nodes: a clear LockNotAcquired, within its acquire timeout.
        alone = await make_redlock([f.url for f in fakes], connect_timeout=0.3, reconnect_delay=0.05)
        started = time.monotonic()
        with pytest.raises(LockNotAcquired) as caught:
            async with alone.lock("not-redis", ttl=2.0, acquire_timeout=0.5):
                raise AssertionError("acquired on nodes that are not Redis")
        assert time.monotonic() - started < 2.0
        assert re.search(FAKES[how], str(caught.value)), str(caught.value)
        assert all(o.vote is not Vote.YES for o in caught.value.outcomes)
        assert all(f.accepted for f in fakes)

        await mixed.aclose()
        await alone.aclose()
        await assert_hung_up(fakes)
    await assert_connections(real, before)
    assert_no_library_tasks()


async def test_status_names_nodes_that_are_not_redis(cluster: Cluster) -> None:
    cluster.flush()  # no marker: beside nodes that never answer, a cluster not known to be new
    async with fake_nodes("http", 3) as fakes:
        nodes = ",".join([*cluster.urls[:2], *(f.url for f in fakes)])
        process = await asyncio.create_subprocess_exec(
            PY, "-m", "redlock_async", "status", "job", "--nodes", nodes,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(30):
            out, _ = await process.communicate()
        await assert_hung_up(fakes)
    assert process.returncode == 3  # no majority answered: unknown
    text = out.decode()
    assert text.count("unreachable (Protocol error") == 3, text
    # The two real nodes have no marker, and too few nodes answered to show a new cluster: both may
    # have lost their keys (a fresh locking client sits them out too).
    assert "verdict: unknown: only 0 of 5 nodes answered in service (2 more in restart quarantine" in text


# -- a node that refuses AUTH ------------------------------------------------------------------------------


async def test_a_node_that_refuses_auth(make_redlock: MakeRedlock) -> None:
    with own_server(password="s3cret") as server:
        cases = [
            (server.url, r"Authentication required"),
            (f"redis://:wrong-pass@127.0.0.1:{server.port}", r"invalid username-password pair"),
            (f"redis://nobody:wrong-pass@127.0.0.1:{server.port}", r"invalid username-password pair"),
        ]
        for url, reason in cases:
            redlock = await make_redlock([url], acquire_timeout=0.3)
            with pytest.raises(LockNotAcquired, match=reason) as caught:
                async with redlock.lock("guarded"):
                    raise AssertionError("acquired without the password")
            assert "wrong-pass" not in str(caught.value)
            await redlock.aclose()
        redlock = await make_redlock([f"redis://:s3cret@127.0.0.1:{server.port}"])
        async with redlock.lock("guarded") as lock:
            assert lock.held
        await redlock.aclose()
        assert lock_keys(server) == []
        assert await _eventually_no_connections(server)


# -- a server that refuses scripts ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", list(REFUSING))
async def test_nodes_that_refuse_scripts_are_refused_at_connect(how: str) -> None:
    with refusing_server(how) as (server, url):
        for fencing in (False, True):
            redlock = Redlock([url], fencing=fencing)
            with pytest.raises(RedlockError) as caught:
                async with redlock:
                    raise AssertionError("connected to a node that cannot release locks")
            message = str(caught.value)
            assert "1 of 1 nodes refuse commands the lock scripts run" in message
            assert "ACL +@scripting" in message
            assert REFUSING[how][1] in message
            assert [o.node for o in caught.value.outcomes] == [f"127.0.0.1:{server.port}"]
            assert lock_keys(server) == []
            deadline = time.monotonic() + 3
            while client_connections(server) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert client_connections(server) == 0
            assert_no_library_tasks()


@pytest.mark.parametrize("how", list(REFUSING))
async def test_a_minority_refusing_scripts_is_told_and_its_keys_expire(
    how: str, cluster: Cluster, make_redlock: MakeRedlock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="redlock_async")
    with refusing_server(how) as (server, url):
        redlock = await make_redlock([*cluster.urls[:2], url])  # connects: a minority refusing is only logged
        assert f"redlock node 127.0.0.1:{server.port} refuses what the lock scripts run" in caplog.text
        lock = redlock.lock("half-refused", ttl=1.0)
        assert await lock.acquire(blocking=False)
        await lock.release()
        # A server's error may quote the command's first arguments: a lock's token must not reach messages.
        async with one_node(url) as node:
            reply = await node.send_script(RELEASE, (b"redlock:x",), (b"the-secret-token",))
        assert isinstance(reply, Failure)
        assert reply.vote is Vote.ERROR
        assert "the-secret-token" not in reply.detail
        await assert_empty(cluster)
        # There the SET ran but the release could not: the key stays, only until it expires.
        assert 0 < int(server.command("PTTL", "redlock:half-refused")) <= 1000  # type: ignore[call-overload]
        await redlock.aclose()
        assert client_connections(server) == 0 or await _eventually_no_connections(server)


async def _eventually_no_connections(server: LocalNode) -> bool:
    deadline = time.monotonic() + 3
    while client_connections(server) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return client_connections(server) == 0


@pytest.mark.parametrize("how", list(REFUSING))
async def test_lazy_use_of_a_node_that_refuses_scripts_is_refused_before_the_body(how: str) -> None:
    """Never connect(): the first acquire runs connect's permissions probe first (before: it took the key
    with SET, the body ran, and the release failed on the node, logged only; the key stayed its ttl)."""
    with refusing_server(how) as (server, url):
        redlock = Redlock([url])  # never connect(): the first acquire connects
        try:
            for _ in range(2):  # refused at each use while the node refuses (not only the first)
                with pytest.raises(RedlockError) as caught:
                    async with redlock.lock("lazy", ttl=1.0):
                        pytest.fail("the body ran on a node that cannot release the lock")
                assert "refuse commands the lock scripts run" in str(caught.value)
                assert REFUSING[how][1] in str(caught.value)
                assert lock_keys(server) == []
        finally:
            await redlock.aclose()
        assert await _eventually_no_connections(server)
    assert_no_library_tasks()
