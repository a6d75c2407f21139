"""What one simulated schedule runs: its workload, its kinds of fault, its sizes and the clients' settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAULTS = ("pause", "partition", "loss", "restart", "clock", "flush", "kill")
"""Every kind of fault, as ``--faults`` names them."""

PACES = ("normal", "short", "long")
"""How long sections last, as ``--pace`` names them (``Board.pace``)."""

WORKLOAD_NAMES = ("lock", "fenced", "many", "semaphore", "rw", "election")
"""Every workload, as ``--workload`` names them."""


@dataclass(frozen=True)
class Config:
    """What one schedule runs (the same for every seed of a campaign)."""

    workload: str = "lock"
    faults: frozenset[str] = frozenset()
    nodes: int = 5
    clients: int = 3
    tasks: int = 2
    duration: float = 6.0
    """Virtual seconds the workload runs (faults stop a ttl before its end, then every client closes)."""
    ttl: float = 1.0
    fault_rate: float = 1.0
    """Faults per ttl, on average."""
    jitter: float = 0.02
    """The share of messages that take ten times the mean delay (a network's tail)."""
    lag: float = 0.0
    """Seconds more each way on each client's links to two nodes (client *i*: nodes *i* and *i* + 1), far
    nodes as in another zone: a waiter's ``SET`` s overtake the last holder's release on the nodes far from it
    and near the waiter, and grants often land on a bare majority (0.005: ten times the mean delay)."""
    pace: str = ""
    """Every run's pace (``normal``, ``short`` or ``long``: ``Board.pace``); empty: drawn per run."""
    settings: tuple[tuple[str, Any], ...] = ()
    """Redlock settings for every client (``--set NAME=VALUE``)."""

    def __post_init__(self) -> None:
        if self.workload not in WORKLOAD_NAMES:
            raise ValueError(f"workload {self.workload!r}: choose one of {', '.join(WORKLOAD_NAMES)}")
        if self.pace not in ("", *PACES):
            raise ValueError(f"pace {self.pace!r}: choose one of {', '.join(PACES)}")
        if self.lag < 0:
            raise ValueError(f"lag {self.lag}: seconds, 0 or more")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter {self.jitter}: a share of the messages, from 0 to 1")
        unknown = sorted(set(self.faults) - set(FAULTS))
        if unknown:
            raise ValueError(f"faults {', '.join(unknown)}: choose among {', '.join(FAULTS)}")
