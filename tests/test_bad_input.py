"""Bad input at every public entry point: a clear error, and nothing left behind.

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
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.exceptions import DataError

from redlock_async import LockLost, LockNotAcquired, Redlock, RedlockError
from redlock_async._algorithm import Vote
from redlock_async._node import Failure
from redlock_async._scripts import RELEASE
from redlock_async.cli import EXIT_NOT_ACQUIRED, main
from redlock_async.fencing import fenced_set
from redlock_async.testing import LocalNode

from .conftest import (
    Cluster,
    MakeRedlock,
    Node,
    assert_no_library_tasks,
    client_connections,
    eventually,
    lock_keys,
    one_node,
)

PY = sys.executable
NOWHERE = "redis://127.0.0.1:1"  # never connected to: these cases fail before any I/O


# -- helpers ---------------------------------------------------------------------------------


async def assert_connections(nodes: list[Node], expected: list[int]) -> None:
    """The servers see *expected* connections again (closing is asynchronous: wait, bounded)."""
    deadline = time.monotonic() + 3.0
    while (seen := [client_connections(node) for node in nodes]) != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert seen == expected, f"connections left open: {seen}, expected {expected}"


async def assert_empty(cluster: Cluster, *keep: bytes) -> None:
    """No key on any node of *cluster* but *keep*, within a moment.

    release() returns once the nodes known to hold the key answered; a node
    whose yes came after the grant was decided has its release queued, and
    deletes its copy a moment later.
    """

    def held() -> list[list[bytes]]:
        return [lock_keys(cluster[i]) for i in range(len(cluster))]

    assert await eventually(lambda: held() == [sorted(keep)] * len(cluster), 1.0), f"keys per node: {held()}"


@contextlib.contextmanager
def own_server(*config: str, password: str | None = None) -> Iterator[LocalNode]:
    """A server of this test's own, with configuration LocalNodes has no option for."""
    with LocalNode(password=password, server_args=config) as server:
        yield server


class FakeNode:
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
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        await self._server.wait_closed()


@contextlib.asynccontextmanager
async def fake_nodes(how: str, count: int) -> AsyncIterator[list[FakeNode]]:
    fakes = [FakeNode(how) for _ in range(count)]
    try:
        for fake in fakes:
            await fake.start()
        yield fakes
    finally:
        for fake in fakes:
            if fake._server is not None:
                await fake.aclose()


async def assert_hung_up(fakes: list[FakeNode]) -> None:
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


DURATIONS = {  # setting: (zero accepted, infinity accepted)
    "ttl": (False, False),
    "node_timeout": (False, False),
    "retry_delay": (True, False),
    "acquire_timeout": (True, True),
    "connect_timeout": (False, False),
    "reconnect_delay": (True, False),
    "max_hold": (False, True),
}


def _bad_settings() -> list[tuple[str, Any, type[Exception]]]:
    cases: list[tuple[str, Any, type[Exception]]] = []
    for name, (zero_ok, inf_ok) in DURATIONS.items():
        cases += [(name, bad, TypeError) for bad in ("1", b"1", None, True, False, [1], 1j)]
        cases += [(name, bad, ValueError) for bad in (math.nan, -1, -0.5, -math.inf, 10**400)]
        if not zero_ok:
            cases += [(name, 0, ValueError), (name, 0.0, ValueError)]
        if not inf_ok:
            cases.append((name, math.inf, ValueError))
    cases += [("ttl", 1e16, ValueError), ("ttl", 0.001, ValueError), ("node_timeout", 5.0, ValueError)]
    for name in ("drift_factor", "extend_threshold"):
        cases += [(name, bad, TypeError) for bad in ("0.1", None, True)]
        cases += [(name, bad, ValueError) for bad in (math.nan, math.inf, -0.1, 0.95)]
    cases += [("max_queued", bad, TypeError) for bad in (1.0, True, "10", None)]
    cases += [("max_queued", bad, ValueError) for bad in (0, -1)]
    cases += [("max_extensions", bad, TypeError) for bad in (1.5, True, "3")]
    cases += [("max_extensions", -1, ValueError)]
    for name in ("wait_for_release", "fencing", "auto_extend"):
        cases += [(name, bad, TypeError) for bad in (1, 0, "yes", None)]
    for name in ("key_prefix", "fence_prefix"):
        cases += [(name, bad, TypeError) for bad in (b"x:", None, 1)]
        cases.append((name, "\udcff:", ValueError))
    return cases


@pytest.mark.parametrize(
    ("name", "value", "error"), [pytest.param(*case, id=f"{case[0]}={case[1]!r:.12}") for case in _bad_settings()]
)
def test_every_setting_refuses_bad_values_naming_the_setting(name: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        Redlock([NOWHERE], **{name: value})
    assert type(caught.value) is error
    assert re.search(rf"\b{name}\b", str(caught.value)), str(caught.value)


def test_the_largest_ttl_is_the_servers_limit() -> None:
    with pytest.raises(ValueError, match=r"^ttl must be at most 9007199254740 s \(2\*\*53 ms, for the servers\)"):
        Redlock([NOWHERE], ttl=1e16)
    assert Redlock([NOWHERE], ttl=9007199254740.0).settings.ttl == 9007199254740.0


@pytest.mark.parametrize(
    ("overrides", "error", "pattern"),
    [
        ({"ttl": 0}, ValueError, r"^ttl must be > 0 seconds"),
        ({"ttl": True}, TypeError, r"^ttl must be a number of seconds"),
        ({"ttl": math.inf}, ValueError, r"^ttl must be finite"),
        ({"ttl": 1e16}, ValueError, r"^ttl must be at most"),
        ({"acquire_timeout": math.nan}, ValueError, r"^acquire_timeout must be a number of seconds, got NaN"),
        ({"acquire_timeout": "2"}, TypeError, r"^acquire_timeout must be a number of seconds"),
        ({"fencing": 1}, TypeError, r"^fencing must be True or False, got int"),
        ({"auto_extend": "no"}, TypeError, r"^auto_extend must be True or False, got str"),
        ({"max_hold": -1}, ValueError, r"^max_hold must be > 0 seconds"),
        ({"max_extensions": 2.0}, TypeError, r"^max_extensions must be an int or None, got float"),
        ({"on_lost": 42}, TypeError, r"^on_lost must be a function taking the LockLost \(or None\), got int"),
        ({"on_lost": "print"}, TypeError, r"^on_lost must be a function"),
    ],
)
def test_lock_overrides_refuse_bad_values(overrides: dict[str, Any], error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        Redlock([NOWHERE]).lock("resource", **overrides)


@pytest.mark.parametrize(
    ("name", "error", "pattern"),
    [
        ("", ValueError, r"^resource name is empty: name the thing the lock protects"),
        (b"", ValueError, r"^resource name is empty"),
        ("x" * (1 << 20), ValueError, r"^resource name is 1048576 bytes, more than 4096: hash long names"),
        (b"\xff" * (1 << 20), ValueError, r"^resource name is 1048576 bytes, more than 4096: hash long names"),
        ("\udcff\udcfe", ValueError, r"^resource name '\\udcff\\udcfe' is not valid UTF-8 .*: pass bytes"),
        (bytearray(b"x"), TypeError, r"^resource name must be str or bytes, got bytearray"),
        (memoryview(b"x"), TypeError, r"^resource name must be str or bytes, got memoryview"),
        (42, TypeError, r"^resource name must be str or bytes, got int"),
        (None, TypeError, r"^resource name must be str or bytes, got NoneType"),
    ],
)
def test_bad_names_are_refused_by_lock(name: Any, error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        Redlock([NOWHERE]).lock(name)


# -- names on real nodes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [b"\xff\xfe", b"\x00\x01\x00", b"a\r\n*1\r\n$4\r\nPING\r\n", "caf\u00e9 \U0001f512", b"x" * 4096],
    ids=["latin1", "nul", "resp-injection", "unicode", "longest"],
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
    await assert_empty(cluster, b"redlock-fence:" + raw)


async def test_a_rejected_name_sends_nothing(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    for name in ("x" * (1 << 20), b"y" * 4097, ""):
        with pytest.raises(ValueError, match="resource name"):
            redlock.lock(name)
    await assert_empty(cluster)


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


@pytest.mark.parametrize("how", list(FAKES))
async def test_a_node_that_is_not_redis_is_a_failed_vote_with_its_reason(
    how: str, cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    real = [cluster[i] for i in range(3)]
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
    assert "verdict: unknown: only 2 of 5 nodes answered" in text


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


REFUSING = {
    "acl-without-scripting": ((), "User locker has no permissions to run the 'evalsha' command"),
    "evalsha-renamed": (("--rename-command", "EVALSHA", ""), "unknown command 'EVALSHA'"),
}


@contextlib.contextmanager
def refusing_server(how: str) -> Iterator[tuple[LocalNode, str]]:
    """A server whose lock user cannot run EVALSHA, and the URL of that user."""
    config, _ = REFUSING[how]
    with own_server(*config) as server:
        if how == "acl-without-scripting":
            server.command("ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all", "-@scripting")
            yield server, f"redis://locker:pw@127.0.0.1:{server.port}"
        else:
            yield server, server.url


@pytest.mark.parametrize("how", list(REFUSING))
async def test_nodes_that_refuse_scripts_are_refused_at_connect(how: str) -> None:
    with refusing_server(how) as (server, url):
        for fencing in (False, True):
            redlock = Redlock([url], fencing=fencing)
            with pytest.raises(RedlockError) as caught:
                async with redlock:
                    raise AssertionError("connected to a node that cannot release locks")
            message = str(caught.value)
            assert "1 of 1 nodes answer the Lua scripts with an error" in message
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
        assert f"redlock node 127.0.0.1:{server.port} answers the lock scripts with an error" in caplog.text
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


async def test_lazy_use_of_a_node_that_refuses_scripts_is_logged(
    make_redlock: MakeRedlock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="redlock_async")
    with refusing_server("acl-without-scripting") as (server, url):
        redlock = Redlock([url])  # never connect(): the first acquire connects
        try:
            lock = redlock.lock("lazy", ttl=1.0)
            assert await lock.acquire(blocking=False)
            await lock.release()
        finally:
            await redlock.aclose()
        assert "redlock 'lazy' not released on" in caplog.text
        assert "no permissions to run the 'evalsha' command" in caplog.text
        assert 0 < int(server.command("PTTL", "redlock:lazy")) <= 1000  # type: ignore[call-overload]
        assert await _eventually_no_connections(server)
    assert_no_library_tasks()


# -- fenced_set --------------------------------------------------------------------------------------------


async def test_fenced_set_refuses_bad_arguments_and_writes_nothing(cluster: Cluster) -> None:
    resource = redis.asyncio.Redis.from_url(cluster.urls[0])
    sync = redis.Redis.from_url(cluster.urls[0])
    try:
        cases: list[tuple[tuple[Any, ...], dict[str, Any], type[Exception], str]] = [
            (("redis://x", "k", "v", 1), {}, TypeError, r"^client must be a redis\.asyncio\.Redis .*builtins\.str"),
            ((None, "k", "v", 1), {}, TypeError, r"^client must be a redis\.asyncio\.Redis"),
            ((sync, "k", "v", 1), {}, TypeError, r"got redis\.client\.Redis"),
            ((resource, 5, "v", 1), {}, TypeError, r"^key must be str or bytes, got int"),
            ((resource, None, "v", 1), {}, TypeError, r"^key must be str or bytes, got NoneType"),
            ((resource, "", "v", 1), {}, ValueError, r"^key is empty"),
            ((resource, b"", "v", 1), {}, ValueError, r"^key is empty"),
            ((resource, "k", "v", 1), {"fence_key": 5}, TypeError, r"^fence_key must be str or bytes, got int"),
            ((resource, "k", "v", 1), {"fence_key": ""}, ValueError, r"^fence_key is empty"),
            ((resource, "k", "v", 1), {"fence_key": "k"}, ValueError, r"^fence_key 'k' is the key written"),
            ((resource, "k", "v", 1), {"fence_key": b"k"}, ValueError, r"^fence_key b'k' is the key written"),
            ((resource, "k", "v", True), {}, TypeError, r"^token must be a fencing token"),
            ((resource, "k", "v", -1), {}, TypeError, r"^token must be a fencing token"),
            ((resource, "k", "v", 1.0), {}, TypeError, r"^token must be a fencing token"),
            ((resource, "k", "v", "1"), {}, TypeError, r"^token must be a fencing token"),
            ((resource, "k", "v", None), {}, TypeError, r"^token must be a fencing token"),
            ((resource, "k", "v", 2**53 + 1), {}, ValueError, r"^token 9007199254740993 is larger than 2\*\*53"),
            ((resource, "k", None, 1), {}, DataError, r"Invalid input of type: 'NoneType'"),
            ((resource, "k", True, 1), {}, DataError, r"Invalid input of type: 'bool'"),
            ((resource, "k", {"a": 1}, 1), {}, DataError, r"Invalid input of type: 'dict'"),
        ]
        for args, kwargs, error, pattern in cases:
            with pytest.raises(error, match=pattern):
                await fenced_set(*args, **kwargs)
        await assert_empty(cluster)

        await resource.set("taken:fence", "not a token")
        with pytest.raises(ValueError, match=r"^fence_key 'taken:fence' holds something other than a fencing token"):
            await fenced_set(resource, "taken", "v", 1)
        await resource.hset("hashed:fence", "a", "1")
        with pytest.raises(ValueError, match=r"^fence_key 'hashed:fence' holds something other than a fencing"):
            await fenced_set(resource, "hashed", "v", 1)
        assert await resource.exists("taken", "hashed") == 0

        # Bytes that are not UTF-8 are fine, as keys and values; the largest exact token too.
        await fenced_set(resource, b"\xff\xfe", b"\x00\xff", 2**53)
        assert await resource.get(b"\xff\xfe") == b"\x00\xff"
        assert await resource.get(b"\xff\xfe:fence") == str(2**53).encode()
    finally:
        await resource.aclose()
        sync.close()


# -- the CLI -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--ttl", "abc"], r"argument --ttl: invalid float value: 'abc'"),
        (["--ttl", "nan"], r"redlock run: error: --ttl must be a number of seconds, got NaN"),
        (["--ttl", "inf"], r"redlock run: error: --ttl must be finite"),
        (["--ttl", "1e400"], r"redlock run: error: --ttl must be finite"),
        (["--ttl", "-1"], r"redlock run: error: --ttl must be > 0 seconds"),
        (["--ttl", "0"], r"redlock run: error: --ttl must be > 0 seconds"),
        (["--ttl", "0.1"], r"redlock run: error: --ttl must be at least 0\.5 seconds, got 0\.1"),
        (["--ttl", "1e16"], r"redlock run: error: ttl must be at most"),
        (["--wait", "-1"], r"redlock run: error: --wait must be >= 0 seconds, got -1\.0"),
        (["--wait", "nan"], r"redlock run: error: --wait must be a number of seconds, got NaN"),
        (["--grace", "nan"], r"redlock run: error: --grace must be a number of seconds, got NaN"),
        (["--grace", "-1"], r"redlock run: error: --grace must be >= 0 seconds"),
        (["--grace", "inf"], r"redlock run: error: --grace must be finite"),
        (["--nodes", "garbage"], r"redlock run: error: nodes\[0\] is not a usable Redis URL"),
        (["--nodes", "redis://h:port"], r"redlock run: error: nodes\[0\] is not a usable Redis URL"),
        (["--nodes", " , ,"], r"redlock run: error: --nodes is empty: give URL,URL"),
        (
            ["--nodes", f"{NOWHERE},{NOWHERE}"],
            r"redlock run: error: nodes\[1\] \(127\.0\.0\.1:1\) is the same server as nodes\[0\]",
        ),
    ],
)
def test_cli_run_options_say_what_to_change(args: list[str], pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "job", "--nodes", NOWHERE, *args, "--", "true"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert re.search(pattern, capsys.readouterr().err)


@pytest.mark.parametrize("command", ["run", "status"])
@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("", r"resource name is empty: name the thing the lock protects"),
        ("x" * (1 << 20), r"resource name is 1048576 bytes, more than 4096: hash long names"),
    ],
    ids=["empty", "1MB"],
)
def test_cli_bad_names(
    command: str, name: str, pattern: str, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, name, "--nodes", ",".join(cluster.urls)] + (["--", "true"] if command == "run" else [])
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert re.search(rf"redlock {command}: error: {pattern}", capsys.readouterr().err)
    assert [lock_keys(cluster[i]) for i in range(len(cluster))] == [[]] * len(cluster)  # nothing was sent


async def _cli(*args: str | bytes) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def test_cli_locks_a_name_that_is_not_utf8_as_its_bytes(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    nodes = ",".join(cluster.urls)
    redlock = await make_redlock()
    async with redlock.lock(b"\xff\xfe", ttl=10.0) as lock:
        code, _, err = await _cli("run", b"\xff\xfe", "--nodes", nodes, "--", PY, "-c", "print('ran')")
        assert code == EXIT_NOT_ACQUIRED, err
        assert "redlock: \\xff\\xfe is held elsewhere" in err
        code, out, err = await _cli("status", b"\xff\xfe", "--nodes", nodes)
        assert code == 1, err  # held
        assert out.startswith("\\xff\\xfe on 5 nodes")
        assert lock.token is not None
        assert out.count("held by ") == 5 + 1  # each node, and the verdict
    code, out, err = await _cli("run", b"\xff\xfe", "--nodes", nodes, "--", PY, "-c", "print('ran')")
    assert (code, out.strip()) == (0, "ran"), err
    await assert_empty(cluster)


async def test_cli_with_a_node_that_refuses_scripts(cluster: Cluster) -> None:
    with refusing_server("acl-without-scripting") as (server, url):
        code, out, err = await _cli("run", "job", "--nodes", url, "--", PY, "-c", "print('ran')")
        assert code == 1
        assert "ran" not in out
        assert "redlock: 1 of 1 nodes answer the Lua scripts with an error" in err
        assert "Traceback" not in err
        assert lock_keys(server) == []
