"""What the locks of one Redlock share: the cluster of nodes, the connections it opens, the
listener that hands a released name to the next waiter, the watchdog's extension rounds and the
inspector. Imports the wings below it (``_core`` to ``_queue``).

This file is the wing's door: other modules of redlock_async import from here only."""

from __future__ import annotations

from redlock_async._shared import _handoff as handoff
from redlock_async._shared._cluster import Cluster, require_asyncio
from redlock_async._shared._connections import Connections
from redlock_async._shared._inspect import Keys, digest, inspect, keys_of

__all__ = ["Cluster", "Connections", "Keys", "digest", "handoff", "inspect", "keys_of", "require_asyncio"]
