"""A deterministic simulator: the unmodified library on a virtual event loop and virtual time, against
simulated nodes that run the shipped Lua scripts, under seeded faults; one seed, one run.

``python -m redlock_async.testing.sim --help`` runs campaigns; :func:`run` runs one schedule. Needs
``lupa`` (the ``test`` extra). docs/testing.md says more.
"""

from __future__ import annotations

from redlock_async.testing.sim._config import FAULTS, Config
from redlock_async.testing.sim._memory import MemoryNode, MemoryNodes
from redlock_async.testing.sim._run import Result, run
from redlock_async.testing.sim._workloads import WORKLOADS

__all__ = ["FAULTS", "WORKLOADS", "Config", "MemoryNode", "MemoryNodes", "Result", "run"]
