"""In-memory nodes for users' own tests: the simulator's nodes and network, run on its virtual loop, so code
that holds locks runs with no server, on virtual time (a ttl of a minute passes in microseconds).

    from redlock_async import Redlock
    from redlock_async.testing.sim import MemoryNodes

    def test_my_worker_gives_up_a_lost_lock() -> None:
        with MemoryNodes(5) as nodes:
            async def main() -> None:
                async with Redlock(nodes.urls, ttl=30.0) as redlock:
                    ...
                    nodes[0].pause(); nodes[1].pause(); nodes[2].pause()
                    await asyncio.sleep(60.0)  # virtual: returns at once
            nodes.run(main())
"""

from __future__ import annotations

import random
from collections.abc import Coroutine
from typing import Any, TypeVar

from redlock_async.testing.sim._loop import SimLoop
from redlock_async.testing.sim._net import Host, Network
from redlock_async.testing.sim._node import SimNode
from redlock_async.testing.sim._run import deterministic

T = TypeVar("T")


class MemoryNode:
    """One in-memory node, with the fault methods of ``LocalNodes``' nodes."""

    def __init__(self, host: Host, url: str) -> None:
        self._host = host
        self.url = url

    @property
    def server(self) -> SimNode:
        """The simulated server (its ``store``, ``run_id``, ``clock()``)."""
        return self._host.node

    def pause(self) -> None:
        """As SIGSTOP: connections stay open, nothing is answered until :meth:`resume`."""
        self._host.paused = True

    def resume(self) -> None:
        self._host.paused = False
        for connection in list(self._host.connections):
            connection.flush()

    def kill(self) -> None:
        """Down: its connections reset, new ones refused, until :meth:`restart`."""
        for connection in list(self._host.connections):
            connection.reset()
        self._host.up = False

    def restart(self, *, keep_data: bool = True) -> None:
        """A new server process (a new run_id), its keys kept or lost; its connections reset."""
        for connection in list(self._host.connections):
            connection.reset()
        self._host.node.restart(keep_data=keep_data)
        self._host.up = True
        self._host.paused = False

    def step_clock(self, seconds: float) -> None:
        """Jump the node's clock (its keys expire by it)."""
        self._host.node.step_clock(seconds)

    def set_clock_rate(self, rate: float) -> None:
        self._host.node.set_clock_rate(rate)

    def command(self, *args: str | bytes | int) -> Any:
        """Run a command on the node directly (as ``LocalNodes``' ``command``); errors come back as text."""
        words = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        return self._host.node.command(words)


class MemoryNodes:
    """*n* in-memory nodes whose :attr:`urls` a ``Redlock`` made inside :meth:`run` accepts."""

    def __init__(self, n: int = 5, *, seed: int = 0, delay: float = 0.0005) -> None:
        if n < 1:
            raise ValueError(f"MemoryNodes({n}): give at least one node (3 or 5 for Redlock)")
        self.seed = seed
        rng = random.Random(seed)
        self.loop = SimLoop(random.Random(rng.getrandbits(64)), lateness=0.0, yield_chance=0.0)
        self._network = Network(self.loop, delay=delay)
        self.urls = [f"redis://memory-{i}.sim:{7000 + i}" for i in range(n)]
        self._nodes = []
        for i in range(n):
            host = self._network.add(f"memory-{i}.sim", 7000 + i, SimNode(f"memory-{i}", self.loop.time, rng))
            self._nodes.append(MemoryNode(host, self.urls[i]))
        self._rng = random.Random(rng.getrandbits(64))

    def __getitem__(self, index: int) -> MemoryNode:
        return self._nodes[index]

    def __len__(self) -> int:
        return len(self._nodes)

    def __enter__(self) -> MemoryNodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run *coro* to its end on the nodes' virtual loop (time jumps over every wait), and return its result.
        Everything that uses the nodes must run inside it; call it again for more."""
        with deterministic(self._rng, self.loop):
            return self.loop.run_until_complete(coro)

    def flush(self) -> None:
        for node in self._nodes:
            node.command("FLUSHALL")
