"""The lock on 5 containers started through testcontainers, with the engine's own faults.

Run by ``.ci/docker-tests`` (``pytest -m docker``), which gets an engine and the images
(``$REDLOCK_DOCKER_IMAGES``, comma-separated: Valkey and Redis 7). The main test run leaves
these out (``-m "not docker"``): without an engine they would only skip.
"""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import time
from collections.abc import Iterator

import pytest

from redlock_async import LockNotAcquired, Redlock, Vote
from redlock_async.testing import History
from redlock_async.testing._docker import DEFAULT_IMAGE, DockerNodes, docker_unavailable

from .conftest import acquire_on_first_three

pytestmark = pytest.mark.docker

IMAGES = [image.strip() for image in os.environ.get("REDLOCK_DOCKER_IMAGES", DEFAULT_IMAGE).split(",") if image]
# The images that run under libfaketime (.ci/docker-tests says which): clock faults there, a clear error elsewhere.
CLOCK_IMAGES = [image.strip() for image in os.environ.get("REDLOCK_DOCKER_CLOCK_IMAGES", "").split(",") if image]


@pytest.fixture(scope="module", params=IMAGES)
def containers(request: pytest.FixtureRequest) -> Iterator[DockerNodes]:
    if reason := docker_unavailable():
        pytest.skip(reason)
    with DockerNodes(5, image=request.param) as nodes:
        yield nodes


@pytest.fixture
def nodes(containers: DockerNodes) -> Iterator[DockerNodes]:
    containers.heal()
    containers.flush()
    yield containers
    containers.heal()


async def test_mutual_exclusion_under_contention(nodes: DockerNodes) -> None:
    history = History()
    async with Redlock(nodes.urls, retry_delay=0.02) as a, Redlock(nodes.urls, retry_delay=0.02) as b:

        async def worker(name: str, redlock: Redlock) -> None:
            for _ in range(10):
                async with redlock.lock("docker:contended", acquire_timeout=20) as lock:
                    with history.section(name, lock):
                        await asyncio.sleep(0.002)

        await asyncio.gather(*(worker(f"{side}{n}", r) for side, r in (("a", a), ("b", b)) for n in range(3)))
    assert len(history.sections) == 60
    history.check()
    assert all(node.command("EXISTS", "redlock:docker:contended") == 0 for node in nodes)


async def test_a_paused_minority_is_tolerated_and_a_paused_majority_grants_nothing(nodes: DockerNodes) -> None:
    async with Redlock(nodes.urls, acquire_timeout=0.5) as redlock:
        nodes[0].pause()
        nodes[1].pause()
        lock = redlock.lock("docker:paused")
        assert await lock.acquire(blocking=False)
        await lock.release()
        nodes[2].pause()
        with pytest.raises(LockNotAcquired):
            async with redlock.lock("docker:paused"):
                pass
    nodes.heal()
    await asyncio.sleep(0.2)
    assert all(node.command("EXISTS", "redlock:docker:paused") == 0 for node in nodes)


async def test_a_partitioned_minority_is_tolerated_and_a_partitioned_majority_grants_nothing(
    nodes: DockerNodes,
) -> None:
    async with Redlock(nodes.urls, acquire_timeout=0.5) as redlock:
        nodes[3].partition()  # docker network disconnect: a real partition, not a proxy
        nodes[4].partition()
        lock = redlock.lock("docker:partition")
        for _ in range(3):  # the first try may meet the connections the partition cut
            if await lock.acquire(blocking=False):
                break
        assert lock.held
        await lock.release()
        nodes[2].partition()
        with pytest.raises(LockNotAcquired):
            async with redlock.lock("docker:partition"):
                pass
        nodes.heal()
        lock = redlock.lock("docker:partition", acquire_timeout=5)
        async with lock:
            assert lock.held


async def test_a_container_restarted_empty_cannot_give_a_second_holder(nodes: DockerNodes) -> None:
    """The analysis sequence on containers: A holds 0, 1, 2; node 2 restarts without its data."""
    async with Redlock(nodes.urls, ttl=5.0) as a:
        held = a.lock("docker:restart", ttl=5.0, auto_extend=False)
        await acquire_on_first_three(nodes, held, "redlock:docker:restart")
        await asyncio.to_thread(nodes[2].restart, keep_data=False)
        async with Redlock(nodes.urls, ttl=5.0) as b:
            lock = b.lock("docker:restart", ttl=5.0)
            # Never granted; and node 2's vote, once an attempt read it (an early verdict from the
            # other nodes can leave it pending), is that it sits out.
            for _ in range(10):
                assert not await lock.acquire(blocking=False)
                if lock.outcomes[2].vote is not Vote.PENDING:
                    break
            assert lock.outcomes[2].vote is Vote.QUARANTINED, lock.outcomes
        assert held.held
        await held.release()


async def test_the_watchdog_keeps_a_lock_across_container_faults(nodes: DockerNodes) -> None:
    """Faults on two of five containers, each longer than the ttl: the other three extend it."""
    async with Redlock(nodes.urls, fencing=True) as redlock:
        async with redlock.lock("docker:watched", ttl=1.0) as lock:
            first = lock.fencing_token
            # Each fault through the engine in a thread: a docker API call can take longer than the watchdog's
            # margin on a loaded box, and made on the loop it stalled it (CI: "expired before the watchdog could
            # extend it (loop stall?)", with three containers healthy).
            await asyncio.to_thread(nodes[0].pause)
            await asyncio.sleep(1.2)  # beyond the ttl: node 0's copy is gone, the others extended
            await asyncio.to_thread(nodes[0].resume)
            await asyncio.to_thread(nodes[1].partition)
            await asyncio.sleep(1.2)
            await asyncio.to_thread(nodes.heal)
            await asyncio.to_thread(nodes[0].restart, keep_data=False)
            await asyncio.sleep(1.2)
            assert lock.held
            assert lock.fencing_token == first
            assert lock.validity > 0
        tokens: list[int] = []
        for _ in range(3):
            async with redlock.lock("docker:watched", ttl=1.0) as again:
                assert again.fencing_token is not None
                tokens.append(again.fencing_token)
    assert first is not None
    assert first < tokens[0] < tokens[1] < tokens[2]  # fencing tokens only grow


@pytest.fixture(scope="module", params=CLOCK_IMAGES)
def clocked(request: pytest.FixtureRequest) -> Iterator[DockerNodes]:
    """Two containers under the clock nemesis: libfaketime preloaded from the image."""
    if reason := docker_unavailable():
        pytest.skip(reason)
    with DockerNodes(2, image=request.param, clock=True) as nodes:
        yield nodes


@pytest.fixture
def clocks(clocked: DockerNodes) -> Iterator[DockerNodes]:
    for node in clocked:
        node.clock.reset()
        node.command("FLUSHALL")
    yield clocked
    for node in clocked:
        node.clock.reset()


def test_a_container_stepped_forward_expires_a_key_on_that_node_only(clocks: DockerNodes) -> None:
    for node in clocks:
        node.command("SET", "k", "v", "PX", 10_000)
    clocks[0].clock.step(30)
    assert clocks[0].time() - time.time() == pytest.approx(30, abs=0.2)
    assert abs(clocks[1].time() - time.time()) < 0.2  # the other container's clock is real
    assert clocks[0].command("EXISTS", "k") == 0
    assert clocks[1].command("EXISTS", "k") == 1


def test_a_container_clock_running_fast_shortens_a_lease(clocks: DockerNodes) -> None:
    clocks[0].clock.run_at(4.0)
    for node in clocks:
        node.command("SET", "k", "v", "PX", 2_000)
    time.sleep(0.6)  # 2.4 s on node 0's clock: its key is gone; 0.6 s on node 1's
    assert clocks[0].command("EXISTS", "k") == 0
    assert clocks[1].command("EXISTS", "k") == 1
    assert clocks[0].time() - time.time() > 1.5  # 3x the time since run_at, ahead of ours


@pytest.fixture
def no_faketime_image() -> Iterator[str]:
    """An image without libfaketime: one empty file, imported (no registry needed)."""
    if reason := docker_unavailable():
        pytest.skip(reason)
    import docker

    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("nothing"), io.BytesIO(b""))
    client = docker.from_env()
    try:
        client.api.import_image_from_data(archive.getvalue(), repository="local/no-faketime", tag="1")
        yield "local/no-faketime:1"
    finally:
        client.images.remove("local/no-faketime:1", force=True)
        client.close()


def test_clock_control_fails_at_start_on_an_image_without_libfaketime(no_faketime_image: str) -> None:
    nodes = DockerNodes(1, image=no_faketime_image, clock=True)
    with pytest.raises(RuntimeError, match=rf"clock=True needs libfaketime in the image, and {no_faketime_image}"):
        nodes.start()
    with pytest.raises(RuntimeError, match="has not started yet"):
        nodes[0].clock  # noqa: B018
    with pytest.raises(RuntimeError, match="no clock control"):
        DockerNodes(1, image=no_faketime_image).nodes[0].clock  # noqa: B018


@pytest.mark.parametrize("image", [image for image in IMAGES if image not in CLOCK_IMAGES])
def test_clock_control_fails_at_start_where_the_image_does_not_allow_it(image: str) -> None:
    """The other images (a server linked with jemalloc, or no libfaketime): a clear error, no container left."""
    if reason := docker_unavailable():
        pytest.skip(reason)
    with pytest.raises(RuntimeError, match=r"clock=True(: the server in .* cannot run under libfaketime| needs)"):
        DockerNodes(1, image=image, clock=True).start()
