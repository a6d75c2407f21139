"""Fixtures: real servers for the integration tests.

* ``cluster``: 5 nodes shared by the session, flushed before each test that
  uses it. With ``REDLOCK_TEST_URLS=redis://...,redis://...`` the tests run
  against existing servers instead (tests that inject faults then skip);
  with ``REDLOCK_TEST_BACKEND=docker``, against 5 containers (testcontainers).
* ``faulty``: 5 nodes of the test's own, free to pause, kill and restart.
* ``redlock`` / ``make_redlock``: Redlock clients on ``cluster``, closed after
  the test, which also checks that none of the library's tasks outlived them.
* ``redlock_nodes`` / ``redlock_history``: from the fault kit's pytest plugin
  (redlock_async.testing.pytest_plugin): 5 nodes of the test's own behind
  fault-injecting proxies, and a History checked after the test.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

import pytest

from redlock_async import Lock, Redlock
from redlock_async._nodes._endpoint import endpoint_for
from redlock_async._nodes._node import Node as LibraryNode
from redlock_async._queue import LISTENING
from redlock_async.testing import LocalNode, LocalNodes, faketime_library
from redlock_async.testing._docker import DockerNodes, docker_unavailable
from redlock_async.testing._inside import cluster_of

NODES = 5

LOOP = os.environ.get("REDLOCK_TEST_LOOP", "asyncio")
"""The event loop the async tests run on: asyncio (the default), uvloop, or eager (asyncio's eager task factory)."""

if LOOP not in ("asyncio", "uvloop", "eager"):
    raise pytest.UsageError(f"REDLOCK_TEST_LOOP={LOOP!r}: use asyncio, uvloop or eager")


def eager_loop() -> asyncio.AbstractEventLoop:
    """An asyncio loop whose tasks start running at create_task (Python 3.12+)."""
    loop = asyncio.new_event_loop()
    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined,unused-ignore]
    return loop


if LOOP != "asyncio":

    def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
        if LOOP == "uvloop":
            import uvloop

            return {"uvloop": uvloop.new_event_loop}
        if sys.version_info < (3, 12):
            raise pytest.UsageError("REDLOCK_TEST_LOOP=eager needs Python 3.12+ (asyncio.eager_task_factory)")
        return {"eager": eager_loop}


# The fault kit's fixtures (redlock_nodes, redlock_history), as users enable them; pytester runs pytest in tests.
pytest_plugins = ["redlock_async.testing.pytest_plugin", "pytester"]


needs_faketime = pytest.mark.skipif(
    faketime_library() is None and not os.environ.get("REDLOCK_REQUIRE_FAKETIME"),
    reason="no libfaketime here (apt-get install faketime); .ci/run fetches it and sets REDLOCK_REQUIRE_FAKETIME",
)
"""The clock nemesis's tests: skipped where libfaketime cannot be had, never in CI (it requires them)."""


class Node(Protocol):
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def kill(self) -> None: ...
    def restart(self, *, keep_data: bool = True) -> None: ...
    def command(self, *args: str | bytes | int) -> object: ...


class Cluster(Protocol):
    @property
    def urls(self) -> list[str]: ...
    def __getitem__(self, index: int) -> Node: ...
    def __len__(self) -> int: ...
    def flush(self) -> None: ...


class _External:
    """Servers named by URL: usable, but not ours to pause or kill."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)

    def __getitem__(self, index: int) -> Node:
        pytest.skip("REDLOCK_TEST_URLS names servers this test cannot pause, kill or inspect")

    def __len__(self) -> int:
        return len(self.urls)

    def flush(self) -> None:
        import redis

        for url in self.urls:
            with redis.Redis.from_url(url, socket_timeout=2) as client:
                client.flushall()


def _nodes() -> contextlib.AbstractContextManager[Cluster]:
    if os.environ.get("REDLOCK_TEST_BACKEND") == "docker":
        if reason := docker_unavailable():
            pytest.skip(f"REDLOCK_TEST_BACKEND=docker, but {reason}")
        return DockerNodes(NODES)
    return LocalNodes(NODES)


@pytest.fixture(scope="session")
def _session_cluster() -> Iterator[Cluster]:
    external = os.environ.get("REDLOCK_TEST_URLS")
    if external:
        yield _External([u.strip() for u in external.split(",") if u.strip()])
        return
    with _nodes() as nodes:
        yield nodes


@pytest.fixture
def cluster(_session_cluster: Cluster) -> Cluster:
    """The session's nodes, flushed, as a cluster in service: each carries a restart-quarantine marker every
    client trusts (a long period). A flushed cluster without markers is a new one, and a client that cannot
    reach one of its nodes in time (a loaded box) cannot tell it from one that lost keys: it holds every
    node out a period, which is not what these tests test (tests of that use nodes of their own)."""
    _session_cluster.flush()
    if isinstance(_session_cluster, LocalNodes):
        for node in _session_cluster.nodes:
            if node.running and not node.paused:
                mark_in_service(node, period=IN_SERVICE_PERIOD)
    return _session_cluster


IN_SERVICE_PERIOD = 3600.0
"""The period the session cluster's markers were judged under: longer than any test's, so all trust them."""


@pytest.fixture
def faulty() -> Iterator[Cluster]:
    if os.environ.get("REDLOCK_TEST_URLS"):
        pytest.skip("fault injection needs local nodes (unset REDLOCK_TEST_URLS)")
    with _nodes() as nodes:
        yield nodes


MakeRedlock = Callable[..., Awaitable[Redlock]]


@pytest.fixture
async def make_redlock(cluster: Cluster) -> AsyncIterator[MakeRedlock]:
    """Make connected Redlocks (on ``cluster`` unless ``urls=`` is given); all are closed after the test."""
    made: list[Redlock] = []

    async def make(urls: Sequence[str] | None = None, **settings: Any) -> Redlock:
        redlock = Redlock(cluster.urls if urls is None else urls, **settings)
        made.append(redlock)
        await redlock.connect()
        return redlock

    yield make
    for redlock in made:
        await redlock.aclose()
    assert_no_library_tasks()


@pytest.fixture
async def redlock(make_redlock: MakeRedlock) -> Redlock:
    return await make_redlock()


def assert_no_library_tasks() -> None:
    """No task of the library is left once its Redlocks are closed."""
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert leftover == [], f"tasks outlived their Redlock: {leftover}"


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def dead_urls(n: int) -> list[str]:
    """*n* node URLs on loopback ports nothing listens on: every connection is refused."""
    return [f"redis://127.0.0.1:{free_port()}" for _ in range(n)]


def client_connections(node: Any) -> int:
    """Client connections on *node* (a LocalNode, or anything with command()), not counting the one asking."""
    listing = node.command("CLIENT", "LIST")
    assert isinstance(listing, bytes)
    return len(listing.splitlines()) - 1


def lock_keys(node: Any) -> list[bytes]:
    """The keys on *node*, but for the restart-quarantine markers (a key per prefix, the prefix itself) and
    the listening marks of the channels waiters subscribed to (``…\\x00listening``: they run out by
    themselves, MARK_TTL after the last listener left; tests/test_key_ttls.py checks that they do)."""
    keys: list[bytes] = node.command("KEYS", "*")
    return sorted(key for key in keys if not key.endswith(b":") and LISTENING not in key)


def keys_everywhere(nodes: Any) -> list[list[bytes]]:
    """:func:`lock_keys` of every node of *nodes* (a Cluster or LocalNodes)."""
    return [lock_keys(nodes[i]) for i in range(len(nodes))]


DEFAULT_PERIOD = 10.0 + 0.01 * 10.0 + 0.002
"""The restart quarantine of a client with the default ttl (10 s, plus drift)."""


def mark_in_service(node: Any, period: float = DEFAULT_PERIOD) -> None:
    """Write the restart-quarantine marker a client leaves on a node it judged in service (a cluster in
    service has them; a cluster with none, and a node down, cannot be told from one that lost keys)."""
    from redlock_async._health._markers import marker_value

    run_id = node.command("INFO", "server")["run_id"]
    node.command("SET", "redlock:", marker_value(run_id.encode(), period))


def keys_on(node: Node, key: str) -> tuple[object, int]:
    """(value, pttl) of *key* on one node; (None, -2) when absent."""
    return node.command("GET", key), int(node.command("PTTL", key))  # type: ignore[call-overload]


def holders(nodes: Cluster | LocalNodes, resource: str, *, among: Sequence[int] | None = None) -> list[int]:
    """The indexes of the nodes (of *among*, else all) that hold the key of *resource* (default prefix ``redlock:``).

    Asked of each server directly (around any proxy) with EXISTS.
    """
    indexes = range(len(nodes)) if among is None else among
    return [i for i in indexes if nodes[i].command("EXISTS", f"redlock:{resource}") == 1]


async def assert_empty(cluster: Cluster, *keep: bytes) -> None:
    """No key on any node of *cluster* but *keep* (restart-quarantine markers aside), within a moment.

    release() returns once the nodes known to hold the key answered; a node
    whose yes came after the grant was decided has its release queued, and
    deletes its copy a moment later.
    """

    def held() -> list[list[bytes]]:
        return [lock_keys(cluster[i]) for i in range(len(cluster))]

    assert await eventually(lambda: held() == [sorted(keep)] * len(cluster), 1.0), f"keys per node: {held()}"


async def eventually(predicate: Callable[[], bool], within: float, *, step: float = 0.01) -> bool:
    """Poll *predicate* until it holds, for at most *within* seconds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= deadline:
            return predicate()
        await asyncio.sleep(step)
    return True


async def acquire_on_first_three(nodes: Any, lock: Lock, key: str) -> None:
    """Acquire *lock* (key *key*) with its key on nodes 0, 1 and 2 only: 3 and 4 hold another value
    meanwhile, then let go of it, as if A's SETs had reached only the first three."""
    for i in (3, 4):
        nodes[i].command("SET", key, "someone else", "PX", 60_000)
    assert await lock.acquire(blocking=False)
    # An early majority (0, 1, 2) leaves 3 and 4 unanswered: their SET NX must be refused before the DEL,
    # or it sets the key after (CI, uvloop: the key was on 0, 1, 2 and 3).
    async with asyncio.timeout(10):
        while any(node.unanswered for node in cluster_of(lock).nodes):
            await asyncio.sleep(0.005)
    for i in (3, 4):
        nodes[i].command("DEL", key)


@contextlib.asynccontextmanager
async def one_node(url: str) -> AsyncIterator[LibraryNode]:
    """A connection of the library's own to *url*, below any lock: for tests of the wire itself."""
    node = LibraryNode(
        endpoint_for(url, 0), max_unanswered=1 << 20, stall_after=5.0, connect_timeout=2.0, reconnect_delay=0.1
    )
    try:
        assert await node.connect() is None
        yield node
    finally:
        await node.aclose(grace=0.1)


# -- servers with a configuration of their own ------------------------------------------------------------


@contextlib.contextmanager
def own_server(*config: str, password: str | None = None) -> Iterator[LocalNode]:
    """A server of this test's own, with configuration LocalNodes has no option for."""
    with LocalNode(password=password, server_args=config) as server:
        yield server


REFUSING = {
    "acl-without-scripting": ((), "User locker has no permissions to run the 'evalsha' command"),
    "evalsha-renamed": (("--rename-command", "EVALSHA", ""), "unknown command 'EVALSHA'"),
}
"""Ways a server refuses the lock scripts: (server arguments, the error it answers EVALSHA with)."""


@contextlib.contextmanager
def refusing_server(how: str) -> Iterator[tuple[LocalNode, str]]:
    """A server whose lock user cannot run EVALSHA (*how*: a key of REFUSING), and the URL of that user."""
    config, _ = REFUSING[how]
    with own_server(*config) as server:
        if how == "acl-without-scripting":
            server.command("ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all", "-@scripting")
            yield server, f"redis://locker:pw@127.0.0.1:{server.port}"
        else:
            yield server, server.url


async def next_event(process: asyncio.subprocess.Process, timeout: float) -> dict[str, Any]:
    """The next JSON line a child process prints, within *timeout* seconds (its stderr if it exits first)."""
    assert process.stdout is not None
    assert process.stderr is not None
    async with asyncio.timeout(timeout):
        line = await process.stdout.readline()
        if not line:
            raise AssertionError(f"the child process exited without a word: {(await process.stderr.read()).decode()}")
    event: dict[str, Any] = json.loads(line)
    return event


ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository: where ``python -m tests.<module>`` finds this package."""


async def start_module(module: str, *args: str, stdin: bool = False) -> asyncio.subprocess.Process:
    """``python -m <module> <args>`` from the repository, with pipes: the other OS process of a test
    (*stdin*: a pipe to its standard input too, for a child that waits for the test's word)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        cwd=ROOT_DIR,
        stdin=asyncio.subprocess.PIPE if stdin else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


STARTUP = 150.0
"""How long a child process may take to start and connect (imports included) on a loaded box: 36 s was
seen for one child on a 2-core box at load 16 (0.5 s idle). Tests that wait for it take a pytest
timeout of :data:`CHILDREN_TIMEOUT`."""

CHILDREN_TIMEOUT = 400
"""The pytest timeout (seconds) of a test that starts children with :func:`start_together`: STARTUP, then
its contention, on a loaded box."""


async def start_together(processes: list[asyncio.subprocess.Process], seconds: float, **more: Any) -> float:
    """A start barrier: once every child said ``{"ready": ...}`` (its first line), send each the moment to
    stop, *seconds* from now (``time.monotonic()``, which is system-wide on Linux), with *more* beside it
    in the same JSON line, and return it. Children
    started one after another on a loaded box can be ready seconds apart: without it they would contend
    in turn, not together."""
    for process in processes:
        assert "ready" in await next_event(process, STARTUP)
    stop = time.monotonic() + seconds
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(json.dumps({"stop": stop, **more}).encode() + b"\n")
        await process.stdin.drain()
    return stop


def passed_over(owners: list[str]) -> dict[str, int]:
    """For each owner in *owners* (who held the lock, in the order the bodies ran), the most grants to
    others between two grants of its own: how long, counted in grants, it went without the lock while
    others had it. The grants before its first and after its last are left out (processes start and stop
    a moment apart)."""
    at: dict[str, list[int]] = collections.defaultdict(list)
    for i, owner in enumerate(owners):
        at[owner].append(i)
    return {owner: max((b - a - 1 for a, b in itertools.pairwise(places)), default=0) for owner, places in at.items()}


ROUNDS = 25
"""In the contention tests across processes, how many times each task takes the lock: a count, not a
time, so that a loaded box slows them down but changes nothing they assert."""

TURNS_WITHOUT = 3
"""In the contention tests of the grant queue, how many turns of the whole line (every task once) a process
or a task may go without the lock (:func:`passed_over`).

With the queue the nodes serve the line in order: a waiter has at most every other task ahead of it, so a
process with a waiter in line is served within one turn. It can go longer only while none of its tasks is
in line (between a release and its next entry, descheduled), which load stretches. Measured in
tests/test_queue_fencing.py (8 tasks of 4 processes): at most 6 to 15 grants to others with the queue
alone on a shared 2-core box (load 15 from other work), and up to 19 with two copies of the test at
once beside two CPU hogs (load 20); against 31 to 63 with ``queue=False`` (release notices: the
quickest process wins), which fails it."""


INTERRUPTIBLE = (
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
)
"""Put before the argv of a child that the test sends SIGINT (Ctrl-C): it runs the argv with SIGINT at its default.

A shell without job control (``pytest &`` in a script, CI runners) starts background commands with SIGINT
ignored, their children inherit that, and a Python started so installs no KeyboardInterrupt handler: Ctrl-C
would do nothing. (The disposition is reset before exec, so the child's own Python sees the default.)
"""


async def kill_child(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.kill()
        await process.wait()


async def rest_of(process: asyncio.subprocess.Process, timeout: float) -> tuple[list[Any], str]:
    """What the child still prints (JSON lines) until it exits, within *timeout*; and its stderr."""
    try:
        async with asyncio.timeout(timeout):
            out, err = await process.communicate()
    finally:
        await kill_child(process)
    return [json.loads(line) for line in out.splitlines()], err.decode()


async def finish_child(process: asyncio.subprocess.Process, timeout: float) -> list[Any]:
    """The JSON lines the child still prints; it must exit 0 within *timeout* seconds."""
    rows, err = await rest_of(process, timeout)
    assert process.returncode == 0, err
    return rows


def calls(cluster: Cluster, command: str) -> int:
    """How many times the servers ran *command* (INFO commandstats; those run by scripts count too)."""
    total = 0
    for i in range(len(cluster)):
        stats = cluster[i].command("INFO", "commandstats")
        assert isinstance(stats, dict)
        total += int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
    return total
