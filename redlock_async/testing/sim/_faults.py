"""The faults of a simulated run, from its seeded schedule: a node or a client paused, a partition between
clients and nodes, a lost reply (a reset connection) or a slow link, a node restarted with or without its
data (a new run_id either way), a node's clock stepped or sped, SCRIPT FLUSH, a client killed mid-section.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING

from redlock_async.testing.sim._config import FAULTS
from redlock_async.testing.sim._timeline import Timeline

if TYPE_CHECKING:
    from redlock_async.testing.sim._config import Config
    from redlock_async.testing.sim._loop import SimLoop
    from redlock_async.testing.sim._net import Network
    from redlock_async.testing.sim._workloads import Board


class Nemesis:
    """Draws faults from *rng* while the workload runs, and ends each after its time."""

    def __init__(self, loop: SimLoop, network: Network, board: Board, config: Config, rng: random.Random) -> None:
        self.loop = loop
        self.network = network
        self.board = board
        self.config = config
        self.rng = rng
        self.kinds = [kind for kind in FAULTS if kind in config.faults]
        self.coverage: dict[str, int] = {}
        self._timers: list[asyncio.TimerHandle] = []
        self.timeline = Timeline(len(network.hosts))
        settings = dict(config.settings)
        quarantine = settings.get("restart_quarantine")
        ttl = float(settings.get("ttl", config.ttl))
        self.quarantine = float(quarantine) if quarantine is not None else ttl * 1.01 + 0.002

    def _record(
        self, kind: str, span: float, *, nodes: Iterable[int] | None = None, clients: Iterable[str] | None = None
    ) -> None:
        """Note a fault in the timeline the liveness oracles read (None: every node, every client)."""
        now = self.loop.now
        self.timeline.add(
            kind,
            now,
            now + span,
            nodes=None if nodes is None else frozenset(nodes),
            clients=None if clients is None else frozenset(clients),
        )

    def _later(self, delay: float, action: object, *args: object) -> None:
        self._timers.append(self.loop.call_at_exactly(self.loop.now + delay, action, *args))

    def _did(self, kind: str, text: str) -> None:
        self.coverage[f"fault.{kind}"] = self.coverage.get(f"fault.{kind}", 0) + 1
        self.loop.log(f"fault {text}")

    async def run(self, until: float) -> None:
        if not self.kinds:
            return
        ttl = self.config.ttl
        while True:
            await asyncio.sleep(self.rng.expovariate(self.config.fault_rate / ttl))
            if self.loop.now >= until or self.board.stopping:
                return
            getattr(self, "_" + self.rng.choice(self.kinds))()

    def _span(self) -> float:
        """How long a fault lasts: mostly short, sometimes several ttls."""
        ttl = self.config.ttl
        return self.rng.expovariate(1.0 / ttl) if self.rng.random() < 0.8 else self.rng.uniform(ttl, 4 * ttl)

    def _host(self) -> int:
        return self.rng.randrange(len(self.network.hosts))

    def _pause(self) -> None:
        span = self._span()
        if self.rng.random() < 0.5 and self.board.clients:
            client = self.rng.choice(self.board.clients)
            if client.dead:
                return
            self._did("pause", f"pause client {client.name} {span:.3f}s")
            client.pause()
            self._record("pause", span, clients=[client.name])
            self._later(span, client.resume)
            return
        host = self.network.by_index(self._host())
        self._did("pause", f"pause node {host.node.name} {span:.3f}s")
        host.paused = True
        self._record("pause", span, nodes=[host.index])
        self._later(span, self._resume_node, host.index)

    def _resume_node(self, index: int) -> None:
        host = self.network.by_index(index)
        host.paused = False
        for connection in list(host.connections):
            connection.flush()

    def _partition(self) -> None:
        span = self._span()
        nodes = self.rng.sample(range(len(self.network.hosts)), self.rng.randint(1, len(self.network.hosts)))
        clients = [c.name for c in self.board.clients if self.rng.random() < 0.6] or [self.board.clients[0].name]
        pairs = {(client, node) for client in clients for node in nodes}
        self._did("partition", f"partition {sorted(clients)} from nodes {sorted(nodes)} {span:.3f}s")
        self.network.blocked |= pairs
        self._record("partition", span, nodes=nodes, clients=clients)
        self._later(span, self._heal, pairs)

    def _heal(self, pairs: set[tuple[str, int]]) -> None:
        self.network.blocked -= pairs
        for host in self.network.hosts.values():
            for connection in list(host.connections):
                connection.flush()

    def _loss(self) -> None:
        host = self.network.by_index(self._host())
        if self.rng.random() < 0.5 and host.connections:
            connection = self.rng.choice(host.connections)
            self._did("loss", f"reset {connection.client_name}->{host.node.name} (replies on the way lost)")
            connection.reset()
            self._record("reset", 0.0, nodes=[host.index], clients=[connection.client_name])
            return
        client = self.rng.choice(self.board.clients).name
        span, extra = self._span(), self.rng.uniform(0.005, self.config.ttl / 2)
        self._did("loss", f"slow {client}->{host.node.name} +{extra:.3f}s for {span:.3f}s")
        self.network.slow[(client, host.index)] = extra
        self._record("slow", span + extra, nodes=[host.index], clients=[client])
        self._later(span, self.network.slow.pop, (client, host.index), None)

    def _restart(self) -> None:
        host = self.network.by_index(self._host())
        if not host.up:
            return
        keep = self.rng.random() < 0.5
        down = self.rng.uniform(0.0, 2 * self.config.ttl)
        self._did(
            "restart", f"restart node {host.node.name} {'with' if keep else 'without'} its data, down {down:.3f}s"
        )
        for connection in list(host.connections):
            connection.reset()
        host.node.restart(keep_data=keep)
        self._record("restart", down + self.quarantine, nodes=[host.index])
        host.up = False
        host.paused = False
        self._later(down, setattr, host, "up", True)

    def _clock(self) -> None:
        index = self._host()
        node = self.network.by_index(index).node
        if self.rng.random() < 0.6:
            jump = self.rng.choice([-1, 1]) * self.rng.uniform(0.05, 3 * self.config.ttl)
            self._did("clock", f"step clock of {node.name} {jump:+.3f}s")
            node.step_clock(jump)
            self._record("clock", math.inf, nodes=[index])
        else:
            rate, span = self.rng.choice([0.5, 0.9, 1.1, 1.5, 2.0]), self._span()
            self._did("clock", f"clock of {node.name} at x{rate} for {span:.3f}s")
            node.set_clock_rate(rate)
            self._record("clock", math.inf, nodes=[index])
            self._later(span, node.set_clock_rate, 1.0)

    def _flush(self) -> None:
        index = self._host()
        node = self.network.by_index(index).node
        self._did("flush", f"SCRIPT FLUSH on {node.name}")
        node.command([b"SCRIPT", b"FLUSH"])
        self._record("flush", 0.0, nodes=[index])

    def _kill(self) -> None:
        alive = [client for client in self.board.clients if not client.dead]
        if len(alive) <= 1:
            return
        client = self.rng.choice(alive)
        self._did("kill", f"kill client {client.name} ({len(self.board.open.get(client.name, []))} sections open)")
        client.kill()
        self._record("kill", math.inf, clients=[client.name])
        self.board.killed(client)

    def heal_all(self) -> None:
        """The end of the faults: every node and client runs, every link is whole (clock steps stay)."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self.timeline.heal(self.loop.now)
        self.network.slow.clear()
        self.network.heal()
        for host in self.network.hosts.values():
            host.up = True
            host.node.set_clock_rate(1.0)
            if host.paused:
                self._resume_node(host.index)
        for client in self.board.clients:
            client.resume()
