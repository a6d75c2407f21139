"""The lock libraries that ``compare.py`` measures, behind one small interface.

Every peer is used the way its documentation shows, with its defaults; the one
setting made explicit everywhere is the lease, 10 s (each library's default
already, except redis-py's ``Lock``, which has no lease unless given a timeout).

A peer that is not installed, or that fails to import, is still listed: its
``unavailable`` says why, and every cell of the report says so.

The peers are untyped (aioredlock) or optional (all but redis-py), so they are
imported with ``importlib`` and handled as ``Any``: mypy sees no import that
could fail on a machine without the ``bench`` extra.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import importlib
import importlib.metadata
import importlib.util
import random
import secrets
import socket
import urllib.parse
import warnings
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Protocol

import hiredis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from redlock_async import Lock, LockNotAcquired, Redlock

LEASE_S = 10.0
LEASE_MS = 10_000
TOKEN_BYTES = 20
RELEASE_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
INSTALL_HINT = "not installed: pip install '.[bench]'"


def pack(args: tuple[bytes | str | int, ...]) -> bytes:
    """RESP-encode a command (bytes, str and int arguments) with hiredis's packer.

    The same encoding as redis-py's: ``*N`` then ``$len`` + bytes per argument, str as
    UTF-8 and int in decimal; hiredis's stub types its argument as a 1-tuple, hence the ignore.
    """
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]
    return packed


class Handle(Protocol):
    """One lock object of one library, on one resource (one per task that uses it)."""

    async def try_acquire(self) -> bool:
        """The library's acquire call, one attempt where it has that option."""
        ...

    async def release(self) -> None: ...

    def hold(self) -> AbstractAsyncContextManager[None]:
        """Blocking acquire with the library's default retries, release on exit (its ``async with``)."""
        ...

    def diagnose(self) -> str:
        """Why the last acquire was refused, where the library tells (else "")."""
        ...


class Peer(abc.ABC):
    """One library, opened on a list of node URLs."""

    name: ClassVar[str]
    distribution: ClassVar[str | None] = None  # the PyPI package; None for code in this repo
    modules: ClassVar[tuple[str, ...]] = ()  # imported by unavailable()
    single_node: ClassVar[bool] = False  # uses urls[0] only
    nodes_only: ClassVar[bool] = False  # a reference measured in scenario 5 only

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls[:1] if self.single_node else urls)
        self.gave_up = 0  # blocking acquires that raised "not acquired" in hold() (then tried again)

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this peer cannot run here (not installed, import error), or None."""
        for module in cls.modules:
            if importlib.util.find_spec(module.split(".")[0]) is None:
                return INSTALL_HINT
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    importlib.import_module(module)
            except Exception as exc:  # any import failure of an installed peer is a finding
                return f"errors on import: {type(exc).__name__}: {exc}"
        return None

    @classmethod
    def version(cls) -> str:
        if cls.distribution is None:
            return ""
        try:
            return importlib.metadata.version(cls.distribution)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect (or whatever the library does before its first lock)."""

    @abc.abstractmethod
    def handle(self, resource: str) -> Handle: ...

    @abc.abstractmethod
    async def aclose(self) -> None: ...

    @abc.abstractmethod
    def defaults(self) -> str:
        """The defaults this peer runs with, in one line of markdown."""


def _module(name: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(name)


# -- the raw floor -----------------------------------------------------------------


class _FloorHandle:
    def __init__(self, peer: Floor, resource: str) -> None:
        self._peer = peer
        self._key = f"floor:{resource}"
        self._token = ""

    async def _attempt(self) -> bool:
        peer = self._peer
        token = secrets.token_urlsafe(TOKEN_BYTES)
        replies = await asyncio.gather(*(c.set(self._key, token, nx=True, px=LEASE_MS) for c in peer.clients))
        if sum(1 for r in replies if r) >= peer.quorum:
            self._token = token
            return True
        if any(replies):  # a failed attempt gives back what it got
            await asyncio.gather(*(s(keys=[self._key], args=[token]) for s in peer.scripts))
        return False

    async def try_acquire(self) -> bool:
        return await self._attempt()

    async def release(self) -> None:
        token, self._token = self._token, ""
        await asyncio.gather(*(s(keys=[self._key], args=[token]) for s in self._peer.scripts))

    def diagnose(self) -> str:
        return ""

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        while True:
            if await self._attempt():
                break
            await asyncio.sleep(random.uniform(0.1, 0.3))
        try:
            yield
        finally:
            await self.release()


class Floor(Peer):
    """No library: what a hand-written Redlock with redis-py (hiredis parser) costs."""

    name = "floor"

    def __init__(self, urls: Sequence[str]) -> None:
        super().__init__(urls)
        self.quorum = len(self.urls) // 2 + 1
        self.clients: list[aioredis.Redis] = []
        self.scripts: list[AsyncScript] = []

    async def open(self) -> None:
        self.clients = [aioredis.Redis.from_url(url) for url in self.urls]
        self.scripts = [client.register_script(RELEASE_LUA) for client in self.clients]
        await asyncio.gather(*(client.ping() for client in self.clients))

    def handle(self, resource: str) -> _FloorHandle:
        return _FloorHandle(self, resource)

    async def aclose(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self.clients))

    def defaults(self) -> str:
        return (
            "redis-py `redis.asyncio.Redis.from_url` per node (hiredis parser, pool, no socket timeout); "
            "`gather` of `SET key token NX PX 10000` on all nodes, granted on a majority of OKs; release = "
            "`gather` of a compare-and-delete script; token `secrets.token_urlsafe(20)`. Contended: a failed "
            "attempt deletes what it got, sleeps `uniform(0.1, 0.3)` s (redlock_async's jitter) and tries "
            "again, forever. No per-node timeout: it waits for every node."
        )


# -- redlock_async -----------------------------------------------------------------


class _RedlockHandle:
    def __init__(self, peer: RedlockAsync, lock: Lock) -> None:
        self._peer = peer
        self._lock = lock

    async def try_acquire(self) -> bool:
        return await self._lock.acquire(blocking=False)

    async def release(self) -> None:
        await self._lock.release()

    def diagnose(self) -> str:
        return "; ".join(str(o) for o in self._lock.outcomes)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        while True:
            try:
                async with self._lock:
                    yield
                return
            except LockNotAcquired:  # acquire_timeout (10 s) ran out: count it, try again
                self._peer.gave_up += 1


class RedlockAsync(Peer):
    name = "redlock_async"
    distribution = "redlock_async"

    def __init__(self, urls: Sequence[str]) -> None:
        super().__init__(urls)
        self.redlock: Redlock | None = None

    async def open(self) -> None:
        self.redlock = Redlock(self.urls)
        await self.redlock.connect()

    def handle(self, resource: str) -> _RedlockHandle:
        assert self.redlock is not None
        return _RedlockHandle(self, self.redlock.lock(f"cmp:{resource}"))

    async def aclose(self) -> None:
        if self.redlock is not None:
            await self.redlock.aclose()

    def defaults(self) -> str:
        s = Redlock(["redis://127.0.0.1:1"]).settings  # never connects: just the defaults
        return (
            f"`Redlock(urls)`: ttl {s.ttl:g} s, node_timeout {s.node_timeout:g} s (early decision on a majority), "
            f"retry_delay {s.retry_delay:g} s jittered to uniform({s.retry_delay / 2:g}, {s.retry_delay * 1.5:g}) s, "
            f"acquire_timeout {s.acquire_timeout:g} s, drift {s.drift_factor:g}, max_unanswered {s.max_unanswered}; "
            "one pipelined connection per node. `acquire(blocking=False)` / `release()` for one attempt; "
            "`async with lock` (blocking, watchdog extends) when contended."
        )


# -- aioredlock ------------------------------------------------------------------


class _AioredlockHandle:
    def __init__(self, peer: Aioredlock, resource: str) -> None:
        self._peer = peer
        self._resource = f"aioredlock:{resource}"
        self._lock: Any = None

    async def try_acquire(self) -> bool:
        try:
            self._lock = await self._peer.manager.lock(self._resource)
        except self._peer.lock_error:
            return False
        return True

    async def release(self) -> None:
        lock, self._lock = self._lock, None
        await self._peer.manager.unlock(lock)

    def diagnose(self) -> str:
        return ""

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        while not await self.try_acquire():  # lock() tried retry_count (3) times, then raised LockError
            self._peer.gave_up += 1
        try:
            yield
        finally:
            await self.release()


class Aioredlock(Peer):
    name = "aioredlock"
    distribution = "aioredlock"
    modules = ("aioredlock",)

    def __init__(self, urls: Sequence[str]) -> None:
        super().__init__(urls)
        self.manager: Any = None
        self.lock_error: type[BaseException] = Exception

    async def open(self) -> None:
        module = _module("aioredlock")
        self.lock_error = module.LockError
        self.manager = module.Aioredlock(list(self.urls))
        # Connect every node now (aioredlock connects lazily, on the first lock).
        await asyncio.gather(*(instance.connect() for instance in self.manager.redis.instances))

    def handle(self, resource: str) -> _AioredlockHandle:
        return _AioredlockHandle(self, resource)

    async def aclose(self) -> None:
        if self.manager is not None:
            await self.manager.destroy()

    def defaults(self) -> str:
        manager = _module("aioredlock").Aioredlock([])
        aioredis_version = importlib.metadata.version("aioredis")
        return (
            f"`Aioredlock(urls)` on aioredis {aioredis_version}: internal_lock_timeout "
            f"{manager.internal_lock_timeout:g} s (the lease; `lock(resource)` with no lock_timeout starts an "
            f"auto-extend task every 6 s), retry_count {manager.retry_count} with a delay of "
            f"uniform({manager.retry_delay_min:g}, {manager.retry_delay_max:g}) s, then `LockError`; a pool of "
            "1-100 connections per node; waits for every node (`gather`, no timeout); acquire is a Lua "
            "GET-then-SET (re-entrant for the same id). Contended: on `LockError` the task calls `lock()` again "
            "(counted as a give-up)."
        )


# -- pottery -----------------------------------------------------------------------


class _PotteryHandle:
    def __init__(self, lock: Any) -> None:
        self._lock = lock

    async def try_acquire(self) -> bool:
        return bool(await self._lock.acquire(blocking=False))

    async def release(self) -> None:
        await self._lock.release()

    def diagnose(self) -> str:
        return ""

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        async with self._lock:
            yield


class Pottery(Peer):
    name = "pottery"
    distribution = "pottery"
    modules = ("pottery",)

    def __init__(self, urls: Sequence[str]) -> None:
        super().__init__(urls)
        self.clients: list[aioredis.Redis] = []
        self._cls: Any = None

    async def open(self) -> None:
        self._cls = _module("pottery").AIORedlock
        self.clients = [aioredis.Redis.from_url(url) for url in self.urls]
        await asyncio.gather(*(client.ping() for client in self.clients))

    def handle(self, resource: str) -> _PotteryHandle:
        return _PotteryHandle(self._cls(key=f"pottery:{resource}", masters=self.clients))

    async def aclose(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self.clients))

    def defaults(self) -> str:
        cls = _module("pottery").AIORedlock
        return (
            f"`AIORedlock(key=..., masters=[redis.asyncio.Redis.from_url(url), ...])`: auto_release_time "
            f"{cls._AUTO_RELEASE_TIME:g} s (the lease), blocking acquire retries forever (timeout -1) after "
            f"uniform(0, {cls._RETRY_DELAY:g}) s, num_extensions {cls._NUM_EXTENSIONS}, drift "
            f"{cls._CLOCK_DRIFT_FACTOR:g}; waits for every master (`as_completed` over all, no timeout; "
            "redis-py's default socket_timeout None); token `uuid4`. `acquire(blocking=False)` / `release()`; "
            "`async with lock` when contended."
        )


# -- redis-py's Lock on one node -----------------------------------------------------


class _RedisLockHandle:
    def __init__(self, lock: Any) -> None:
        self._lock = lock

    async def try_acquire(self) -> bool:
        return bool(await self._lock.acquire(blocking=False))

    async def release(self) -> None:
        await self._lock.release()

    def diagnose(self) -> str:
        return ""

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        async with self._lock:
            yield


class RedisPyLock(Peer):
    """The single-instance reference: no quorum, no fault tolerance."""

    name = "redis-py Lock (1 node)"
    distribution = "redis"
    single_node = True

    def __init__(self, urls: Sequence[str]) -> None:
        super().__init__(urls)
        self.client: aioredis.Redis | None = None

    async def open(self) -> None:
        self.client = aioredis.Redis.from_url(self.urls[0])
        await self.client.ping()

    def handle(self, resource: str) -> _RedisLockHandle:
        assert self.client is not None
        return _RedisLockHandle(self.client.lock(f"redispy:{resource}", timeout=LEASE_S))

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    def defaults(self) -> str:
        lock = aioredis.Redis().lock("x", timeout=LEASE_S)  # never connects
        return (
            f"`redis.asyncio.Redis.from_url(urls[0]).lock(name, timeout={LEASE_S:g})` on node 0 only: "
            f"sleep {lock.sleep:g} s between attempts, blocking_timeout {lock.blocking_timeout} (forever), "
            "token `uuid1`, Lua release; no quorum (one node is a single point of failure)."
        )


# -- the machine's own cost per node (scenario 5 only) ------------------------------


class _WireHandle:
    def __init__(self, peer: Wire, resource: str) -> None:
        self._peer = peer
        self._key = f"wire:{resource}".encode()
        self._token = b""

    async def try_acquire(self) -> bool:
        token = secrets.token_urlsafe(TOKEN_BYTES).encode()
        replies = self._peer.round(pack((b"SET", self._key, token, b"NX", b"PX", LEASE_MS)))
        if sum(1 for r in replies if r == b"OK") >= self._peer.quorum:
            self._token = token
            return True
        if b"OK" in replies:
            self._peer.round(self._peer.release_command(self._key, token))
        return False

    async def release(self) -> None:
        token, self._token = self._token, b""
        self._peer.round(self._peer.release_command(self._key, token))

    def diagnose(self) -> str:
        return ""

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        raise NotImplementedError("the wire reference is measured in scenario 5 only")
        yield  # pragma: no cover


class Wire(Peer):
    """Not a library: the least a client can do, to show what the machine itself costs per node.

    Blocking sockets, no event loop, hiredis to pack and parse: send the
    command to every node, then read each reply. It blocks the event loop,
    so it runs only where nothing else is in flight (the sequential
    scenario 5); it has no timeouts and no error handling.
    """

    name = "wire (blocking sockets)"
    nodes_only = True

    def __init__(self, urls: Sequence[str]) -> None:
        super().__init__(urls)
        self.quorum = len(self.urls) // 2 + 1
        self.sockets: list[socket.socket] = []
        self.readers: list[hiredis.Reader] = []
        self.sha = b""

    async def open(self) -> None:
        for url in self.urls:
            parsed = urllib.parse.urlsplit(url)
            sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=5)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sockets.append(sock)
            self.readers.append(hiredis.Reader())
        shas = self.round(pack((b"SCRIPT", b"LOAD", RELEASE_LUA)))
        self.sha = bytes(shas[0])

    def release_command(self, key: bytes, token: bytes) -> bytes:
        return pack((b"EVALSHA", self.sha, 1, key, token))

    def round(self, command: bytes) -> list[Any]:  # hiredis replies: bytes, int, None, errors
        """*command* to every node, then every reply, in node order."""
        for sock in self.sockets:
            sock.sendall(command)
        replies = []
        for sock, reader in zip(self.sockets, self.readers, strict=True):
            reply = reader.gets()
            while reply is False:
                reader.feed(sock.recv(65536))
                reply = reader.gets()
            replies.append(reply)
        return replies

    def handle(self, resource: str) -> _WireHandle:
        return _WireHandle(self, resource)

    async def aclose(self) -> None:
        for sock in self.sockets:
            sock.close()

    def defaults(self) -> str:
        return (
            "not a library, and not usable as one: blocking sockets with TCP_NODELAY, no event loop, hiredis to "
            "pack and parse, no timeout, no error handling. `SET NX PX` written to every node, then each reply "
            "read; release the same with `EVALSHA`. Only in scenario 5, to show how the machine itself scales "
            "with N (every node costs a send and a receive system call, and a server process waking)."
        )


PEERS: tuple[type[Peer], ...] = (Floor, RedlockAsync, Aioredlock, Pottery, RedisPyLock, Wire)
