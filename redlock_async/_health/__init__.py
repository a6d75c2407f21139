"""Whether a node's word can be trusted: the restart quarantine (markers written on every node, the
fence counters raised again after a restart), the clock guard, and evictions noticed live. Imports
``_core`` and ``_nodes``.

This file is the wing's door: other modules of redlock_async import from here only."""

from __future__ import annotations

from redlock_async._health._clock_guard import ClockGuard
from redlock_async._health._evictions import EVICTED, EvictionWatch, evicted_keys, floored
from redlock_async._health._fence_repair import CounterRepair
from redlock_async._health._quarantine import Quarantine
from redlock_async._health._shard_health import ShardHealth
from redlock_async._health._shards import ShardQuarantine

__all__ = [
    "EVICTED",
    "ClockGuard",
    "CounterRepair",
    "EvictionWatch",
    "Quarantine",
    "ShardHealth",
    "ShardQuarantine",
    "evicted_keys",
    "floored",
]
