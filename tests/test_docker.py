"""The container path: the same lock on 5 containers, where a Docker engine answers.

The whole suite runs on containers with REDLOCK_TEST_BACKEND=docker; this
module checks the path itself whenever an engine is there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from redlock_async import Redlock
from redlock_async.testing._docker import DockerNodes, docker_unavailable

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def containers() -> Iterator[DockerNodes]:
    if reason := docker_unavailable():
        pytest.skip(reason)
    with DockerNodes(5) as nodes:
        yield nodes


async def test_mutual_exclusion_on_containers(containers: DockerNodes) -> None:
    async with Redlock(containers.urls) as a, Redlock(containers.urls) as b:
        first = a.lock("docker")
        assert await first.acquire(blocking=False)
        assert not await b.lock("docker").acquire(blocking=False)
        await first.release()


async def test_two_paused_containers_still_acquire(containers: DockerNodes) -> None:
    async with Redlock(containers.urls) as redlock:
        containers[0].pause()
        containers[1].pause()
        try:
            lock = redlock.lock("docker-minority")
            assert await lock.acquire(blocking=False)
            await lock.release()
        finally:
            containers[0].resume()
            containers[1].resume()
