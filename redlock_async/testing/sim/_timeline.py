"""Every fault of a run as an interval with its reach (which nodes, which clients), so that the liveness
oracles can ask whether the cluster was healthy for a client over a stretch of time.

A fault's *reach* is the set of (client, node) links it spoils: a node's pause or restart spoils every
link to that node; a client's pause or death every link of that client; a partition, a slow link or a
reset connection the links it names. Its *span* is from its start to when its effects are over: a
pause, partition or slow link until it heals; a restart until the node is up again and has sat out the
restart quarantine; a clock step or rate for the rest of the run (a stepped clock stays stepped, and the
clock guard may hold the node out); a reset connection only its instant (the client reconnects); a
killed client for the rest of the run (and the oracles that judge the whole cluster judge nothing after a
kill: the dead one's keys and line entries outlive it). ``SCRIPT FLUSH`` is recorded but spoils
nothing: a lost script costs a round trip, never a vote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALL = None
"""Every node, or every client."""


@dataclass(frozen=True)
class Fault:
    kind: str
    start: float
    end: float
    nodes: frozenset[int] | None
    """The nodes it reaches (None: every node)."""
    clients: frozenset[str] | None
    """The clients it reaches (None: every client)."""


class Timeline:
    """The faults of one run, and questions about them."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.faults: list[Fault] = []

    def add(
        self,
        kind: str,
        start: float,
        end: float,
        *,
        nodes: frozenset[int] | None = ALL,
        clients: frozenset[str] | None = ALL,
    ) -> None:
        self.faults.append(Fault(kind, start, end, nodes, clients))

    def heal(self, now: float) -> None:
        """Every pause, partition and slow link ends *now* (the run's faults stop)."""
        self.faults = [
            Fault(f.kind, f.start, min(f.end, now), f.nodes, f.clients)
            if f.kind in ("pause", "partition", "slow")
            else f
            for f in self.faults
        ]

    def _overlapping(self, start: float, end: float, margin: float) -> list[Fault]:
        return [f for f in self.faults if f.kind != "flush" and f.start <= end and f.end + margin >= start]

    def quiet(self, start: float, end: float, margin: float) -> bool:
        """No fault (``SCRIPT FLUSH`` aside) was active from *margin* before *start* to *end*, and none of
        the run's clock faults and restarts came before *end* (their effects outlast their spans here:
        a stepped clock and a node that lost its data change who holds what for longer than a margin)."""
        if self._overlapping(start, end, margin):
            return False
        return not any(f.kind in ("clock", "restart", "kill") and f.start <= end for f in self.faults)

    def unhealthy(self, client: str, start: float, end: float, margin: float) -> set[int]:
        """The nodes whose link with *client* some fault spoiled from *margin* before *start* to *end*
        (every node if the client itself was paused or killed then)."""
        every = set(range(self.nodes))
        spoiled: set[int] = set()
        for fault in self._overlapping(start, end, margin):
            reaches_client = fault.clients is ALL or client in fault.clients
            if reaches_client:
                spoiled |= every if fault.nodes is ALL else set(fault.nodes)
        return spoiled

    def first_fault(self, client: str, start: float, margin: float) -> float:
        """When the first fault that reaches a link of *client* and was active from *margin* before *start*
        on began (math.inf: none)."""
        first = math.inf
        for fault in self.faults:
            if fault.kind == "flush" or fault.end + margin < start:
                continue
            if fault.clients is ALL or client in fault.clients:
                first = min(first, fault.start)
        return first

    def others_reached(self, client: str, start: float, end: float, margin: float) -> bool:
        """Whether a fault reaching another client than *client* (its pause, death, partition, slow link or
        reset connection: its keys may stay on some nodes for a ttl) was active from *margin* before
        *start* to *end*."""
        return any(f.clients is not ALL and f.clients - {client} for f in self._overlapping(start, end, margin))
