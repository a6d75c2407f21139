"""Another Redlock client on the same names (as Redsync or node-redlock behave) and redlock_async
exclude each other both ways, against real nodes (docs/interop.md).

The other client is written here the way those libraries work: on every node at once
``SET key value NX PX ttl`` with its own random value, held on a majority within its validity,
else undone; released by a compare-and-delete script; it knows nothing of the grant queue, the
release channel or fencing counters.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable

import pytest
import redis.asyncio

from redlock_async import Redlock

from .conftest import Cluster, MakeRedlock, eventually, holders

COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class PlainRedlock:
    """A Redlock client as Redsync and node-redlock are: SET NX PX, majority, compare-and-delete."""

    def __init__(self, urls: list[str], *, key_prefix: str = "redlock:") -> None:
        self.clients = [redis.asyncio.Redis.from_url(url, socket_timeout=0.2) for url in urls]
        self.prefix = key_prefix

    @staticmethod
    async def _each(calls: list[Awaitable[object]]) -> list[object]:
        async def one(call: Awaitable[object]) -> object:
            try:
                return await call
            except (redis.RedisError, OSError) as exc:
                return exc

        return list(await asyncio.gather(*(one(call) for call in calls)))

    async def acquire(self, name: str, ttl_ms: int = 2000) -> str | None:
        """The value it holds *name* with on a majority, or None (then nothing of it is left)."""
        value = secrets.token_hex(20)
        key = self.prefix + name
        started = time.monotonic()
        replies = await self._each([client.set(key, value, nx=True, px=ttl_ms) for client in self.clients])
        elapsed_ms = (time.monotonic() - started) * 1000
        drift_ms = ttl_ms * 0.01 + 2
        if sum(reply is True for reply in replies) >= len(self.clients) // 2 + 1 and elapsed_ms < ttl_ms - drift_ms:
            return value
        await self.release(name, value)
        return None

    async def release(self, name: str, value: str) -> None:
        key = self.prefix + name
        await self._each([client.eval(COMPARE_AND_DELETE, 1, key, value) for client in self.clients])

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


@pytest.fixture
async def plain(cluster: Cluster) -> AsyncIterator[PlainRedlock]:
    client = PlainRedlock(cluster.urls)
    yield client
    await client.aclose()


# The default hand-off is the grant queue; queue=False waits on release words only.
SETTINGS = [pytest.param({}, id="grant-queue"), pytest.param({"queue": False}, id="release-words")]


@pytest.mark.parametrize("settings", SETTINGS)
async def test_a_plain_client_cannot_take_a_name_redlock_async_holds(
    cluster: Cluster, make_redlock: MakeRedlock, plain: PlainRedlock, settings: dict[str, object]
) -> None:
    lock = (await make_redlock(**settings)).lock("shared:held", ttl=10.0)
    assert await lock.acquire(blocking=False)
    assert await plain.acquire("shared:held") is None
    token = lock.token
    assert token is not None
    # Its own value is on every node (the last yeses may still be on their way), the plain client's on none.
    assert await eventually(
        lambda: (
            [cluster[i].command("GET", "redlock:shared:held") for i in range(len(cluster))]
            == [token.encode()] * len(cluster)
        ),
        1.0,
    )
    await lock.release()
    value = await plain.acquire("shared:held")
    assert value is not None
    await plain.release("shared:held", value)
    assert holders(cluster, "shared:held") == []


@pytest.mark.parametrize("settings", SETTINGS)
async def test_redlock_async_cannot_take_a_name_a_plain_client_holds_and_takes_it_after(
    cluster: Cluster, make_redlock: MakeRedlock, plain: PlainRedlock, settings: dict[str, object]
) -> None:
    redlock = await make_redlock(retry_delay=0.1, **settings)
    value = await plain.acquire("shared:foreign", ttl_ms=30_000)
    assert value is not None
    lock = redlock.lock("shared:foreign")
    assert not await lock.acquire(blocking=False)
    info = await redlock.inspect("shared:foreign")
    assert info.state == "held"
    assert info.owner is None  # a value without redlock_async's owner label: shown as a digest alone
    assert holders(cluster, "shared:foreign") == list(range(len(cluster)))  # its value, untouched

    waiting = asyncio.create_task(lock.acquire(timeout=10.0))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    # The plain release publishes nothing and hands nothing on: a waiter finds the key free at its next
    # try (default: every retry_delay; with the grant queue: its entry, renewed every retry_delay).
    await plain.release("shared:foreign", value)
    async with asyncio.timeout(2.0):
        assert await waiting
    await lock.release()


async def test_a_release_into_the_grant_queue_leaves_no_gap_for_a_plain_client(
    cluster: Cluster, make_redlock: MakeRedlock, plain: PlainRedlock
) -> None:
    """With waiters in line (the default grant queue), a release sets the key to the next waiter in the same
    script: a plain client trying all along never finds it free, until the line is empty."""
    first = (await make_redlock()).lock("shared:line", ttl=10.0)
    second = (await make_redlock()).lock("shared:line", ttl=10.0, acquire_timeout=10.0)
    assert await first.acquire(blocking=False)
    waiting = asyncio.create_task(second.acquire())
    await asyncio.sleep(0.3)  # in line on every node
    assert not waiting.done()
    taken: list[str] = []
    stop = asyncio.Event()

    async def keep_trying() -> None:
        while not stop.is_set():
            value = await plain.acquire("shared:line")
            if value is not None:
                taken.append(value)
                await plain.release("shared:line", value)
            await asyncio.sleep(0)

    trying = asyncio.create_task(keep_trying())
    await asyncio.sleep(0.1)
    await first.release()
    async with asyncio.timeout(3):
        assert await waiting
    await asyncio.sleep(0.2)
    stop.set()
    await trying
    assert taken == []
    await second.release()
    assert await plain.acquire("shared:line") is not None  # the line is empty: it is an ordinary key again


@pytest.mark.slow
@pytest.mark.parametrize("settings", SETTINGS)
async def test_both_kinds_of_client_contending_never_overlap(
    cluster: Cluster, plain: PlainRedlock, settings: dict[str, object]
) -> None:
    """Three redlock_async tasks (each its own Redlock) and three plain clients on one name for two
    seconds: never two holders at once. With release words only (queue=False) both kinds get turns; with
    the grant queue (the default), redlock_async's waiters keep the line full and each release hands the
    key straight on, so the plain clients may get none (docs/interop.md says so)."""
    inside: list[str] = []
    overlaps = 0
    turns = {"redlock_async": 0, "plain": 0}
    deadline = time.monotonic() + 2.0

    async def section(kind: str) -> None:
        nonlocal overlaps
        inside.append(kind)
        if len(inside) > 1:
            overlaps += 1
        turns[kind] += 1
        await asyncio.sleep(0.005)
        inside.remove(kind)

    async def ours() -> None:
        async with Redlock(cluster.urls, retry_delay=0.02, **settings) as redlock:  # type: ignore[arg-type]
            while time.monotonic() < deadline:
                lock = redlock.lock("shared:contended", ttl=2.0)
                if await lock.acquire(timeout=0.5):
                    try:
                        await section("redlock_async")
                    finally:
                        await lock.release()
                await asyncio.sleep(0.002)

    async def theirs() -> None:
        client = PlainRedlock(cluster.urls)
        try:
            while time.monotonic() < deadline:
                value = await client.acquire("shared:contended")
                if value is not None:
                    try:
                        await section("plain")
                    finally:
                        await client.release("shared:contended", value)
                await asyncio.sleep(0.01)
        finally:
            await client.aclose()

    await asyncio.gather(*(ours() for _ in range(3)), *(theirs() for _ in range(3)))
    assert overlaps == 0
    assert turns["redlock_async"] > 0
    if settings.get("queue") is False:
        assert turns["plain"] > 0
    assert await eventually(lambda: holders(cluster, "shared:contended") == [], 2.0)
