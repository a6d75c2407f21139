"""``Semaphore``: at most *limit* holders of one name, each permit a Redlock mutex.

A semaphore of limit L is L permit slots, and a permit is slot i held as a
lock is held: ``SET NX PX`` of the slot's key on a majority of the nodes,
with the same validity, watchdog, give-back, restart quarantine and pushed
hand-off. So no more than L holders can exist whenever single locks are
safe: two holders of one slot would be two holders of one lock. Counting
holders on each node and taking a majority (the known Redlock semaphores)
can admit more, because different majorities can count different holders;
see docs/algorithm.md for the argument.

An acquire tries a slot of its own choosing (random), and when that one is
held, a slot that a majority of the nodes said is free (each node answers
with its free slots), so L acquirers of L free permits all get one at once
instead of all trying slot 0 first, and a full semaphore is known after one
fan-out, whatever its limit. Every token starts
with the limit it was taken under, and the permit script refuses a slot
while any slot of the name is held under another limit: a client with a
different limit gets a ValueError, never a larger bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from redlock_async._core import Settings, check_owner
from redlock_async._lock import MAX_LIMIT, Permit, QueuedPermit, check_limit
from redlock_async.errors import LockLost
from redlock_async.lock import Lock

if TYPE_CHECKING:
    from redlock_async._shared import Cluster

__all__ = ["MAX_LIMIT", "Semaphore", "check_limit"]


class Semaphore(Lock):
    """At most *limit* holders of one name at a time, across every client of the same nodes.

    The same API as :class:`Lock` (``async with``, ``acquire``, ``extend``,
    ``release``, ``held``, ``validity``, the watchdog and ``LockLost``): each
    acquisition holds one permit. Made by :meth:`Redlock.semaphore`.

    A Lock front given the permit strategy (``_lock/_semaphore.py``'s ``QueuedPermit`` in the grant queue, the
    default; ``_strategies.Permit`` with ``queue=False``): it adds only its ``limit`` and its repr, and
    overrides nothing of Lock.
    """

    __slots__ = ("_limit",)

    def __init__(
        self,
        cluster: Cluster,
        name: str | bytes,
        limit: int,
        settings: Settings,
        *,
        on_lost: Callable[[LockLost], object] | None = None,
        owner: str | None = None,
    ) -> None:
        kind = QueuedPermit if settings.queue else Permit  # the grant queue (the default), or release words
        permit = kind(cluster, settings, name, limit, check_owner(owner))
        self._limit = permit.limit
        super().__init__(cluster, name, settings, on_lost=on_lost, strategy=permit)

    def __repr__(self) -> str:
        return f"<redlock_async.Semaphore {self.name!r} limit={self._limit} {self.statistics().phase}>"

    @property
    def limit(self) -> int:
        """How many may hold a permit at once."""
        return self._limit
