"""A semaphore's permit through the grant queue (the default): the strategy of ``semaphore.py``.

The first try is the permit strategy's own (``ACQUIRE_PERMIT``: a slot of its choosing, then one a
majority says is free): uncontended, nothing more. A try that finds every permit held waits in the
semaphore's line on every node with one claim (``_queue_permit``): a release hands its slot to the
first waiter, in any process, and the waiter holds a permit once a majority of the nodes hold one
and the same slot for its token (docs/algorithm.md, "Semaphores in the grant queue").
"""

from __future__ import annotations

from collections.abc import Sequence

from redlock_async._core import algorithm as _algorithm
from redlock_async._core import default_owner
from redlock_async._lock._strategies import Permit, Queued
from redlock_async._queue import PermitLine, Permits, release_permit
from redlock_async._queue import claim as _queue
from redlock_async._queue import wait as _queue_wait
from redlock_async._rounds import Ballot, Keep, Lease
from redlock_async._rounds import requests as _requests
from redlock_async._scripts import KEEP_LIMIT


class QueuedPermit(Queued, Permit):
    """:class:`Permit`'s first try and keys, :class:`Queued`'s wait: one claim in the semaphore's line."""

    __slots__ = ()

    @property
    def keeps(self) -> Keep | None:  # type: ignore[override]
        return Keep(KEEP_LIMIT, self.widest)  # the widest-limit key lives as long as the permits

    @property
    def spec(self) -> Permits:
        return Permits(self.keys[0], self.widest, self.slot_prefix, self.limit)

    def new_token(self) -> bytes:
        # Every permit's token starts with its limit: holders of another limit see it (ACQUIRE_PERMIT's rule).
        return b"%d:" % self.limit + _requests.new_token(self.owner or default_owner())

    def new_claims(self, token: bytes) -> list[_queue.Claim]:
        cluster = self.cluster
        line = PermitLine(self.spec, len(cluster.nodes))
        return [_queue.Claim(cluster.nodes, self.keys[0], self.settings, token, guard=cluster.clock, line=line)]

    def check_refused(self, claims: Sequence[_queue.Claim]) -> None:
        lines = [claim.line for claim in claims]  # (PermitLines: the claims are new_claims')
        limits = [limit for line in lines if isinstance(line, PermitLine) for limit in line.refusals if limit]
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
