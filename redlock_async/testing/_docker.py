"""The same nodes as containers, through testcontainers, where a Docker engine answers.

Optional: ``pip install 'redlock_async[docker]'``. :func:`docker_unavailable`
says why containers cannot be used here, or None when they can. The image is
``$REDLOCK_DOCKER_IMAGE`` (default ``redis:7``; ``.ci/docker-tests`` builds
local ones where no registry answers). Each container publishes its port on
127.0.0.1 at a fixed host port, so a restarted container keeps its address.
Faults map onto the engine, as real as they come:

* ``pause()`` / ``resume()``: the cgroup freezer (``docker pause``), like SIGSTOP;
* ``kill()``: SIGKILL; ``restart(keep_data=...)``: stop and start again, with its
  data saved first or flushed first;
* ``partition()`` / ``heal()``: the container is disconnected from its network
  (``docker network disconnect``): a real partition, no proxy in the way.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

DEFAULT_IMAGE = os.environ.get("REDLOCK_DOCKER_IMAGE", "redis:7")
"""The image when none is given: ``$REDLOCK_DOCKER_IMAGE``, else ``redis:7`` (from a registry)."""
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
    """One Redis-protocol server in a container, published on 127.0.0.1 at a fixed host port."""

    def __init__(self, image: str = DEFAULT_IMAGE, *, network: Any = None) -> None:
        from testcontainers.core.container import DockerContainer

        self.image = image
        self.port = _free_port()
        container: Any = DockerContainer(image)
        # Published on 127.0.0.1 only, at a fixed port (kept across restarts): the Docker SDK takes
        # (host ip, port), which testcontainers' with_bind_ports does not.
        container.ports["6379/tcp"] = ("127.0.0.1", self.port)
        if network is not None:
            container = container.with_network(network)
        self._container: Any = container
        self._network: Any = network
        self._client: redis.Redis | None = None
        self.paused = False
        self.partitioned = False

    def __repr__(self) -> str:
        return f"<DockerNode {self.image} {self.url}{' paused' if self.paused else ''}>"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

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
        """Stop and start the same container again: with its data (SAVE first), or empty (FLUSHALL first)."""
        if self.paused:
            self.resume()
        self.heal()
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        if wrapped.status == "running":
            self.command("SAVE" if keep_data else "FLUSHALL")
        self._close_client()
        wrapped.restart(timeout=5)
        self._wait_ready()
        if not keep_data:
            self.command("FLUSHALL")  # a killed container may have come back with an older snapshot

    def partition(self) -> None:
        """Cut the container off its network: connections to it fail, nothing it says gets out."""
        if self._network is None:
            raise RuntimeError("partition() needs the nodes' network: make the node through DockerNodes")
        self._close_client()
        self._docker_network().disconnect(self._container.get_wrapped_container(), force=True)
        self.partitioned = True

    def heal(self) -> None:
        """Connect the container to its network again (after :meth:`partition`)."""
        if self.partitioned:
            self._docker_network().connect(self._container.get_wrapped_container())
            self.partitioned = False

    def stop(self) -> None:
        if self.paused:
            self.resume()
        self._close_client()
        self._container.stop()

    def command(self, *args: str | bytes | int) -> object:
        if self._client is None:
            self._client = redis.Redis.from_url(self.url, socket_timeout=2.0, retry=Retry(NoBackoff(), 0))
        return self._client.execute_command(*args)  # type: ignore[no-untyped-call]

    def _docker_network(self) -> Any:
        client = self._container.get_docker_client().client
        return client.networks.get(self._network.id)

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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class DockerNodes:
    """N containers (default 5) on a network of their own: the container twin of :class:`LocalNodes`."""

    def __init__(self, count: int = 5, *, image: str = DEFAULT_IMAGE) -> None:
        from testcontainers.core.network import Network

        self.image = image
        self._network: Any = Network()
        self.nodes = [DockerNode(image, network=self._network) for _ in range(count)]

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
            self._network.create()
            for node in self.nodes:
                node.start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for node in self.nodes:
            try:
                node.heal()
                node.stop()
            except Exception:  # a container that never started has nothing to stop
                continue
        with contextlib.suppress(Exception):  # never created, or already gone
            self._network.remove()

    def flush(self) -> None:
        for node in self.nodes:
            if not node.paused and not node.partitioned:
                node.command("FLUSHALL")

    def heal(self) -> None:
        """Every node running and connected again."""
        for node in self.nodes:
            if node.paused:
                node.resume()
            node.heal()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
