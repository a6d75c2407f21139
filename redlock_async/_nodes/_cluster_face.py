"""What a Cluster voter (``_cluster_voter.py``) shows the ballot and the health checks: the quarantine, the
clock's or the evictions' hold, and the eviction policy of the shard primary whose reply is being delivered
(a ballot counts a vote as it is delivered), else of the one that sits out longest."""

from __future__ import annotations

from redlock_async._nodes._cluster_routing import judging
from redlock_async._nodes._node import Node
from redlock_async._nodes._slots import Address, key_slot


class ShardJudged(Node):
    """A :class:`_node.Node` whose quarantine, clock hold and eviction policy are its shards' (the voter's own
    are set by the checks that hold the whole voter out)."""

    answering: Node | None
    shards: dict[Address, Node]
    owners: list[Node | None]
    _serving: set[Node]
    _held_until: float
    _held_reason: str
    _clock_until: float
    _eviction: str

    @property
    def quarantined_until(self) -> float:
        shard = self.answering  # (read by the ballot at every vote: judging() only when no reply is delivered)
        if shard is None:
            shard = judging(None, self._serving)
        own = self._held_until
        if shard is None:
            return own
        theirs = shard.quarantined_until
        return theirs if theirs > own else own

    @quarantined_until.setter
    def quarantined_until(self, until: float) -> None:
        self._held_until = until  # the voter's own (the clock guard's, an eviction's)

    @property
    def quarantine_reason(self) -> str:
        shard = judging(self.answering, self._serving)
        if shard is not None and shard.quarantined_until > self._held_until:
            return f"shard {shard.name}: {shard.quarantine_reason}"
        return self._held_reason

    @quarantine_reason.setter
    def quarantine_reason(self, reason: str) -> None:
        self._held_reason = reason

    @property
    def clock_held_until(self) -> float:
        """The clock's or the evictions' hold of the shard whose quarantine is the voter's now (``_shard_health``)."""
        shard = judging(self.answering, self._serving)
        theirs = 0.0 if shard is None else shard.clock_held_until
        return theirs if theirs > self._clock_until else self._clock_until

    @clock_held_until.setter
    def clock_held_until(self, until: float) -> None:
        self._clock_until = until

    @property
    def eviction(self) -> str:
        """The ``maxmemory-policy`` of a shard primary that can evict, "" when none can: fencing counters read on
        this voter are floored then, as on a standalone node that can evict (``_health/_evictions.floored``)."""
        return next((shard.eviction for shard in self.shards.values() if shard.eviction), self._eviction)

    @eviction.setter
    def eviction(self, policy: str) -> None:
        self._eviction = policy

    def serving(self, key: bytes) -> Node | None:
        """The primary that serves *key*'s slot as the map says (None before the map was read)."""
        return self.owners[key_slot(key)]

    def judged_by(self, key: bytes) -> None:
        """Read :attr:`quarantined_until` as the quarantine of the primary serving *key* (until the next reply
        is delivered: inspection, which reads one name's keys)."""
        self.answering = self.serving(key) or self.answering

    def hold_for(self, key: bytes) -> tuple[float, str]:
        """Until when the clock's or the evictions' hold keeps out the primary serving *key* (the voter's own
        hold when that is longer), and why: what an inspection of a name on this voter reads of the locking
        connections, without changing what the ballot reads (no :attr:`answering`). Before the map was read,
        the longest hold of any primary."""
        shard = self.serving(key)
        if shard is None:
            shard = max(self.shards.values(), key=_clock_hold, default=None)
        if shard is not None and shard.clock_held_until > self._clock_until:
            return shard.clock_held_until, shard.quarantine_reason
        return self._clock_until, self._held_reason


def _clock_hold(shard: Node) -> float:
    return shard.clock_held_until
