"""The parts behind the public objects, for tests of redlock_async itself (not part of the API).

Tests that reach below a lock or a Redlock (its nodes' connections, its listener, how a lock is
taken, the blocking API's loop) ask these functions, rather than reading the objects' private
attributes: each owning module answers for its own objects.
"""

from __future__ import annotations

import asyncio

from redlock_async import client, lock, sync
from redlock_async._lock import Strategy
from redlock_async._shared import Cluster
from redlock_async.sync import _client as sync_client


def cluster_of(what: lock.Lock | client.Redlock) -> Cluster:
    """What the locks of a Redlock share (its nodes, listener, watchdog, held locks), of *what* or its Redlock."""
    return lock.cluster_of(what) if isinstance(what, lock.Lock) else client.cluster_of(what)


def strategy_of(what: lock.Lock) -> Strategy:
    """How *what* is taken (``Words``, ``Many``, ``Queued``, ``Permit``, ...)."""
    return lock.strategy_of(what)


def loop_of(redlock: sync.Redlock) -> asyncio.AbstractEventLoop:
    """The event loop a blocking Redlock's locks run on, in its background thread."""
    return sync_client.loop_of(redlock)
