"""A semaphore's permit: the strategies of ``semaphore.py``, by release words (:class:`Permit`) and through
the grant queue (:class:`QueuedPermit`, the default).

The grant queue's first try is the permit strategy's own (``ACQUIRE_PERMIT``: a slot of its choosing, then one a
majority says is free): uncontended, nothing more. A try that finds every permit held waits in the
semaphore's line on every node with one claim (``_queue``'s ``PermitLine``): a release hands its slot to the
first waiter, in any process, and the waiter holds a permit once a majority of the nodes hold one
and the same slot for its token (docs/algorithm.md, "Semaphores in the grant queue").
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from redlock_async._core import Name, Settings, Vote, default_owner, semaphore_keys
from redlock_async._core import algorithm as _algorithm
from redlock_async._lock._in_line import wait_in_line
from redlock_async._lock._strategies import Words
from redlock_async._queue import PermitLine, Permits, release_permit
from redlock_async._queue import claim as _queue
from redlock_async._queue import wait as _queue_wait
from redlock_async._rounds import Ballot, Keep, Lease
from redlock_async._rounds import requests as _requests
from redlock_async._scripts import KEEP_LIMIT, OLD_LAYOUT, WIDER
from redlock_async._shared import Cluster
from redlock_async.errors import RedlockError

_random = random.SystemRandom()

MAX_LIMIT = 1024
"""Most permits one semaphore has (each acquire's script looks at every slot once)."""


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int (how many may hold the semaphore at once), got {type(limit).__name__}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    return limit


class Permit(Words):
    """A semaphore's permit: slot i of the name held as a lock is held (SET NX PX of the slot's key on
    a majority), so no more than *limit* holders exist whenever single locks are safe (see
    ``semaphore.py``). Permits are not handed over: a release wakes the next waiter, who picks a slot."""

    __slots__ = ("limit", "permit_keys", "permits", "slot_keys", "widest")

    takes_hand_over = False
    marks = False

    def __init__(self, cluster: Cluster, settings: Settings, name: Name, limit: object, owner: bytes | None) -> None:
        super().__init__(cluster, settings, (name,), owner, name)
        self.limit = check_limit(limit)
        # A task holding some permits may ask for another (a permit held elsewhere may come free); one
        # holding all of them would wait for itself: only its own release could free one.
        self.permits = self.limit
        # The permits' channel (their releases wake this semaphore's waiters), the slots, the widest limit.
        self.permit_keys = Permits(semaphore_keys(settings.key_prefix, name), self.limit)
        self.widest = self.permit_keys.widest
        self.slot_keys = self.permit_keys.slots()
        self.keys = (self.permit_keys.base,)
        self.blocked = self.permit_keys.base

    def held_words(self, name: Name) -> str:
        return f"every permit ({self.limit} of limit {self.limit}) of semaphore {name!r}"

    async def take(self, sent: _requests.Sent | None = None) -> _requests.Attempt:
        """One pass: a slot of our own choosing (random), then, while it was held, a slot that a majority
        of the nodes said is free (random among the most agreed on), until one is granted or none is left."""
        nodes = self.cluster.nodes
        need = _algorithm.quorum(len(nodes))
        tried: set[int] = set()
        slot = _random.randrange(self.limit)
        while True:
            tried.add(slot)
            result = await _requests.attempt_permit(
                nodes,
                self.slot_keys,
                slot,
                self.widest,
                self.limit,
                self.keys[0],
                self.settings,
                self.owner or default_owner(),
                self.cluster.reading(),
            )
            if result.validity is not None:
                return result
            self.refuse_old_layout(result.codes.count(OLD_LAYOUT))
            wider = max((WIDER - code for code in result.codes if code < OLD_LAYOUT), default=0)
            if wider > len(self.slot_keys):  # a node's widest limit is wider: name its slots too, and try again
                self.slot_keys = self.permit_keys.slots(wider)
                continue
            other = [-code for code in result.codes if OLD_LAYOUT < code < 0]
            if len(other) > len(nodes) - _algorithm.quorum(len(nodes)):
                # Enough nodes hold a permit under another limit that no majority could grant one.
                raise ValueError(
                    f"semaphore {self.name!r} is held under limit {max(set(other), key=other.count)}, not "
                    f"{self.limit}: every client of one semaphore must use the same limit (a new limit may be "
                    "used once no permit is held)"
                )
            if not any(vote is Vote.NO for vote in result.votes):
                return result  # nodes silent or in quarantine, not slots held: another slot would fare no better
            free = {other: count for other, count in (result.free or {}).items() if other not in tried}
            best = max(free.values(), default=0)
            if best < need:
                return result  # no slot is free on a majority: every permit is held
            slot = _random.choice([other for other, count in free.items() if count == best])

    def refuse_old_layout(self, count: int) -> None:
        """Raise when *count* nodes (enough that no majority could grant a permit) said the semaphore's keys
        are of the layout before 2: its clients may hold permits there, in keys this version does not read."""
        n = len(self.cluster.nodes)
        if count > n - _algorithm.quorum(n):
            raise RedlockError(
                f"semaphore {self.name!r} is in use by clients of redlock-async before the one-slot key layout "
                "(its widest-limit key holds a bare number): upgrade every client of it, or let their permits "
                "end (their widest-limit key then expires), and try again",
                name=self.name if isinstance(self.name, str) else repr(self.name),
            )

    def next_is_ours(self, token: bytes) -> bool:
        return False

    def send_release(
        self, lease: Lease, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        _requests.send_release(self.cluster.nodes, lease.keys, token, skip, channel=self.keys[0], into=into)


class QueuedPermit(Permit):
    """:class:`Permit`'s first try and keys, waiting in line (:func:`~._in_line.wait_in_line`): one claim in
    the semaphore's line."""

    __slots__ = ()

    acquire = wait_in_line
    regains = True

    @property
    def keeps(self) -> Keep | None:
        return Keep(KEEP_LIMIT, self.widest)  # the widest-limit key lives as long as the permits

    @property
    def channels(self) -> tuple[bytes, ...]:
        return self.keys

    @property
    def spec(self) -> Permits:
        return self.permit_keys

    def new_token(self) -> bytes:
        # Every permit's token starts with its limit: holders of another limit see it (ACQUIRE_PERMIT's rule).
        return b"%d:" % self.limit + _requests.new_token(self.owner or default_owner())

    def new_claims(self, token: bytes) -> list[_queue.Claim]:
        cluster = self.cluster
        line = PermitLine(self.spec, len(cluster.nodes))
        return [_queue.Claim(cluster.nodes, self.keys[0], self.settings, token, guard=cluster.clock, line=line)]

    def check_refused(self, claims: Sequence[_queue.Claim]) -> None:
        lines = [claim.line for claim in claims]  # (PermitLines: the claims are new_claims')
        permits = [line for line in lines if isinstance(line, PermitLine)]
        self.refuse_old_layout(sum(old for line in permits for old in line.old_layout))
        for claim in claims:
            if claim.keys != (keys := claim.line.keys):  # a node's widest limit is wider: name its slots, enter now
                claim.keys = keys
                claim.poked = True
        limits = [limit for line in permits for limit in line.refusals if limit]
        n = len(self.cluster.nodes)
        if len(limits) > n - _algorithm.quorum(n):  # no majority could grant a permit of our limit
            raise ValueError(
                f"semaphore {self.name!r} is held under limit {max(set(limits), key=limits.count)}, not "
                f"{self.limit}: every client of one semaphore must use the same limit (a new limit may be used "
                "once no permit is held)"
            )

    def lease_keys(self, won: _queue_wait.Won) -> tuple[bytes, ...]:
        assert won.slot is not None, "a permit claim wins a slot"
        return (self.spec.slot_key(won.slot),)

    def next_is_ours(self, token: bytes) -> bool:
        return False  # the nodes hand the slot on

    def send_release(
        self, lease: Lease, token: bytes, skip: Sequence[int], into: Ballot | None = None, *, handed: bool = False
    ) -> None:
        release_permit(self.cluster.nodes, self.spec, token, into, skip)  # every slot of ours, to the first in line
