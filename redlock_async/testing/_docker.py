"""The same nodes as containers, through testcontainers, where a Docker engine answers.

Optional: ``pip install 'redlock_async[docker]'``. :func:`docker_unavailable`
says why containers cannot be used here, or None when they can. Faults map
onto the engine: pause/resume freeze the container's processes (the cgroup
freezer, like SIGSTOP), kill stops it hard, restart starts it again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

DEFAULT_IMAGE = "valkey/valkey:8"
_READY_TIMEOUT = 30.0


def docker_unavailable() -> str | None:
    """Why containers cannot run here (no testcontainers, no engine), or None."""
    try:
        import docker
        import testcontainers.core.container  # noqa: F401
    except ImportError as exc:
        return f"testcontainers is not installed (pip install 'redlock_async[docker]'): {exc}"
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        # Checked first: the SDK, failing inside from_env(), leaves its socket unclosed.
        return f"no Docker engine answers: no socket at {host.removeprefix('unix://')} (DOCKER_HOST unset or wrong)"
    try:
        client = docker.from_env()
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # the docker SDK raises many kinds; any means "no engine"
        return f"no Docker engine answers: {exc}"
    return None


class DockerNode:
    """One Redis-protocol server in a container, published on a host port."""

    def __init__(self, image: str = DEFAULT_IMAGE) -> None:
        from testcontainers.core.container import DockerContainer

        self._container: Any = DockerContainer(image).with_exposed_ports(6379)
        self._client: redis.Redis | None = None
        self.paused = False

    @property
    def url(self) -> str:
        host = self._container.get_container_host_ip()
        return f"redis://{host}:{self._container.get_exposed_port(6379)}"

    def start(self) -> None:
        self._container.start()
        self._wait_ready()

    def pause(self) -> None:
        self._container.get_wrapped_container().pause()
        self.paused = True

    def resume(self) -> None:
        self._container.get_wrapped_container().unpause()
        self.paused = False

    def kill(self) -> None:
        self._close_client()
        self._container.get_wrapped_container().kill()

    def restart(self, *, keep_data: bool = True) -> None:
        if self.paused:
            self.resume()
        if keep_data:
            self.command("SAVE")
        else:
            self.command("FLUSHALL")
        self._close_client()
        self._container.get_wrapped_container().restart()
        self._wait_ready()

    def stop(self) -> None:
        if self.paused:
            self.resume()
        self._close_client()
        self._container.stop()

    def command(self, *args: str | bytes | int) -> object:
        if self._client is None:
            self._client = redis.Redis.from_url(self.url, socket_timeout=2.0, retry=Retry(NoBackoff(), 0))
        return self._client.execute_command(*args)  # type: ignore[no-untyped-call]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT
        while True:
            try:
                self._close_client()
                if self.command("PING"):
                    return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class DockerNodes:
    """N containers (default 5): the container twin of :class:`LocalNodes`."""

    def __init__(self, count: int = 5, *, image: str = DEFAULT_IMAGE) -> None:
        self.nodes = [DockerNode(image) for _ in range(count)]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> DockerNode:
        return self.nodes[index]

    def __iter__(self) -> Iterator[DockerNode]:
        return iter(self.nodes)

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for node in self.nodes:
            try:
                node.stop()
            except Exception:  # a container that never started has nothing to stop
                continue

    def flush(self) -> None:
        for node in self.nodes:
            if not node.paused:
                node.command("FLUSHALL")

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
