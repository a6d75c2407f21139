"""The clock guard and the eviction watch of a Cluster voter, per shard primary.

A ``redis+cluster://`` voter's commands go to several servers, whose clocks are not one clock and whose
``evicted_keys`` are counted apart: so each shard primary has a :class:`_clock_guard.ClockGuard` and an
:class:`_evictions.EvictionWatch` of its own, exactly as a standalone node has (made when the primary is
first met). Each vote that carries a ``TIME`` on a standalone node carries one on the primary that votes
(``ClusterVoter.shard_clock``: right before the vote, in the same write), and a primary whose policy can evict
sends ``INFO stats`` ahead of its votes (its sending methods, as a standalone node's). A primary whose clock
jumped ahead, or whose ``evicted_keys`` grew (or that a client meets with evictions), sits out a quarantine
period: its ``clock_held_until`` and ``quarantined_until``, which the voter reads as its own for the votes that
primary answers. Only that shard sits out: names on the other shards keep voting. Every held lock whose name
it serves drops the voter at once (``Cluster.shard_clock_fault``, ``Cluster.shard_evicted``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from redlock_async._core import ClockFault
from redlock_async._health._clock_guard import ClockGuard
from redlock_async._health._evictions import EvictionWatch
from redlock_async._nodes import ClusterVoter, Node, Receiver, Reply

OnShardClock = Callable[[int, Node, ClockFault, float, str], None]
"""Told of a shard's new clock episode: (voter index, shard, fault, size in seconds, words)."""

OnShardEvicted = Callable[[int, Node, str, bool], None]
"""Told of a shard's evictions: (voter index, shard, words, whether a new episode)."""


class _OneNode:
    """A shard's ``TIME`` receiver: its reply is delivered under the vote's index, and read as its guard's only node."""

    __slots__ = ("_reading",)

    def __init__(self, reading: Receiver) -> None:
        self._reading = reading

    def deliver(self, index: int, reply: Reply, /) -> None:
        self._reading.deliver(0, reply)


class ShardHealth:
    """Per Redlock: the clock guard and eviction watch of every shard primary of its Cluster voters."""

    def __init__(
        self,
        voters: Sequence[tuple[int, ClusterVoter]],
        *,
        drift_factor: float,
        period: Callable[[], float],
        longest_lease: Callable[[], float],
        clock_guard: bool,
        on_clock: OnShardClock,
        on_evicted: OnShardEvicted,
    ) -> None:
        self._drift, self._period, self._longest = drift_factor, period, longest_lease
        self._on_clock, self._on_evicted = on_clock, on_evicted
        self._guards: dict[Node, ClockGuard] = {}
        self._watches: dict[Node, EvictionWatch] = {}
        for i, voter in voters:
            voter.shard_identified = partial(self.identified, i)
            if clock_guard:
                voter.shard_clock = partial(self.reading, i)

    def identified(self, i: int, shard: Node) -> None:
        """A handshake of *shard* (of voter *i*) is done: watch it before its votes if its policy can evict,
        and read its ``evicted_keys``."""
        watch = self._watches.get(shard)
        if watch is None:
            watch = self._watches[shard] = EvictionWatch((shard,), self._period, partial(self._evicted, i, shard))
        watch.identified(0)

    def reading(self, i: int, shard: Node) -> Receiver:
        """The receiver of a ``TIME`` about to be sent to *shard* (of voter *i*) right before a vote."""
        guard = self._guards.get(shard)
        if guard is None:
            guard = self._guards[shard] = ClockGuard(
                (shard,), self._drift, self._longest, partial(self._clock_fault, i, shard)
            )
        return _OneNode(guard.reading())

    def _clock_fault(self, i: int, shard: Node, _: int, fault: ClockFault, size: float, words: str) -> None:
        self._on_clock(i, shard, fault, size, f"shard {shard.name}: {words}")

    def _evicted(self, i: int, shard: Node, _: int, words: str, new: bool) -> None:
        self._on_evicted(i, shard, f"shard {shard.name} {words}", new)
