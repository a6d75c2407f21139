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

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from redlock_async import _algorithm, _requests
from redlock_async._algorithm import Vote
from redlock_async._names import default_owner, semaphore_keys
from redlock_async._settings import Settings
from redlock_async.errors import LockLost
from redlock_async.lock import Lock

if TYPE_CHECKING:
    from redlock_async._cluster import Cluster
    from redlock_async._fanout import Ballot

MAX_LIMIT = 1024
"""Most permits one semaphore has (each acquire's script looks at every slot once)."""


_random = random.SystemRandom()


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int (how many may hold the semaphore at once), got {type(limit).__name__}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    return limit


class Semaphore(Lock):
    """At most *limit* holders of one name at a time, across every client of the same nodes.

    The same API as :class:`Lock` (``async with``, ``acquire``, ``extend``,
    ``release``, ``held``, ``validity``, the watchdog and ``LockLost``): each
    acquisition holds one permit. Made by :meth:`Redlock.semaphore`.
    """

    __slots__ = ("_limit", "_slot_prefix", "_widest")

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
        super().__init__(cluster, name, settings, on_lost=on_lost, owner=owner)
        self._limit = check_limit(limit)
        # The permits' channel (their releases wake this semaphore's waiters), the slots, the widest limit.
        base, self._slot_prefix, self._widest = semaphore_keys(settings.key_prefix, name)
        self._keys = (base,)
        self._blocked = base

    def __repr__(self) -> str:
        return f"<redlock_async.Semaphore {self.name!r} limit={self._limit} {self.statistics().phase}>"

    @property
    def limit(self) -> int:
        """How many may hold a permit at once."""
        return self._limit

    def _permits(self) -> int:
        # A task holding some permits may ask for another (a permit held elsewhere may come free); one
        # holding all of them would wait for itself: only its own release could free one.
        return self._limit

    def _held_words(self, name: str | bytes) -> str:
        return f"every permit ({self._limit} of limit {self._limit}) of semaphore {name!r}"

    _queues = False  # nor do they wait in the nodes' grant queue
    _takes_hand_over = False  # permits are not handed over: a release wakes the next waiter, who picks a slot

    def _next_is_ours(self, token: bytes) -> bool:
        return False

    async def _take(self, sent: _requests.Sent | None = None) -> _requests.Attempt:
        """One pass: a slot of our own choosing (random), then, while it was held, a slot that a majority
        of the nodes said is free (random among the most agreed on), until one is granted or none is left."""
        nodes = self._cluster.nodes
        need = _algorithm.quorum(len(nodes))
        tried: set[int] = set()
        slot = _random.randrange(self._limit)
        while True:
            tried.add(slot)
            result = await _requests.attempt_permit(
                nodes,
                self._slot_prefix + b"%d" % slot,
                self._widest,
                self._slot_prefix,
                self._limit,
                self._keys[0],
                self._settings,
                self._owner or default_owner(),
                self._cluster.reading(),
            )
            if result.validity is not None:
                return result
            other = [-code for code in result.codes]
            if len(other) > len(nodes) - _algorithm.quorum(len(nodes)):
                # Enough nodes hold a permit under another limit that no majority could grant one.
                raise ValueError(
                    f"semaphore {self.name!r} is held under limit {max(set(other), key=other.count)}, not "
                    f"{self._limit}: every client of one semaphore must use the same limit (a new limit may be "
                    "used once no permit is held)"
                )
            if not any(vote is Vote.NO for vote in result.votes):
                return result  # nodes silent or in quarantine, not slots held: another slot would fare no better
            free = {other: count for other, count in (result.free or {}).items() if other not in tried}
            best = max(free.values(), default=0)
            if best < need:
                return result  # no slot is free on a majority: every permit is held
            slot = _random.choice([other for other, count in free.items() if count == best])

    def _send_release(
        self, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        _requests.send_release(self._cluster.nodes, self._lease.keys, token, skip, channel=self._keys[0], into=into)
