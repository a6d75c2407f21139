"""Fenced grants from the queue (docs/fencing.md): the fencing counters a claim's grants came with, and the
fence round that raises them.

Every grant reads the name's fencing counter in the same step (a reply's or a grant word's last field).
A fenced claim (a lock's, a read/write lock writer's: ``settings.fencing``) chooses its token one more
than the largest counter read on a majority that holds the key for it, and counts once a fence round
(``QUEUE_FENCE``) raised the counters of a majority to it while the key held its token. A reader's claim
raises none: its token is the largest counter its majority read, the last writer's.
"""

from __future__ import annotations

from collections.abc import Sequence

from redlock_async._scripts import FENCED_BY, QUEUE_FENCE, Script


class Counters:
    """One claim's fencing counters, per node; what a node told goes when it stops holding the key for us."""

    __slots__ = ("_floor", "_key", "_ttl_ms", "fenced_to", "read")

    def __init__(self, n_nodes: int, fence_key: bytes, fence_ttl_ms: int | None, *, floor: bool) -> None:
        self._key = fence_key
        self._ttl_ms = fence_ttl_ms
        self._floor = floor  # (fence_ttl, or a node that can evict; a reader's token is the last writer's, not a floor)
        self.read: list[int | None] = [None] * n_nodes
        """Per node: the largest fencing counter read there while the key held our token, since the node
        last stopped holding it for us (with fence_ttl, at least the node's clock then)."""
        self.fenced_to = [0] * n_nodes
        """Per node: the fencing token our fence round raised its counter to, while the key held our token
        (0: none since the node last stopped holding it for us)."""

    def count(self, i: int, counter: object, node_us: int) -> None:
        """Keep a counter node *i* read while its key held our token (with fence_ttl, at least the node's
        clock *node_us* then: counters expire, and a token never goes back; docs/fencing.md)."""
        value = int(counter) if isinstance(counter, (int, bytes)) else 0
        if self._floor:
            value = max(value, node_us)
        self.read[i] = max(self.read[i] or 0, value)

    def drop(self, i: int) -> None:
        self.read[i], self.fenced_to[i] = None, 0

    def forget(self) -> None:
        """The claim left: no counter it raised counts any more."""
        self.fenced_to = [0] * len(self.fenced_to)

    def last(self, held: Sequence[int]) -> int:
        """A reader's token: the largest counter read on *held*."""
        return max(self.read[i] or 0 for i in held)

    def round(
        self, channel: bytes, token: bytes, held: Sequence[int]
    ) -> tuple[int, Script, tuple[bytes | int, ...], tuple[bytes, ...]]:
        """The fence round's token (one more than :meth:`last` on *held*, a majority that holds the key for
        us) and its script, arguments and KEYS (*channel*: the lock key)."""
        chosen = 1 + self.last(held)
        args: tuple[bytes | int, ...] = (token, chosen)
        if self._ttl_ms is not None:
            args += (self._ttl_ms,)
        return chosen, QUEUE_FENCE, args, (channel, self._key, self._key + FENCED_BY)

    def raised(self, i: int, chosen: int) -> None:
        """Node *i* raised its counter to *chosen* while the key held our token."""
        self.fenced_to[i] = max(self.fenced_to[i], chosen)

    def raised_on(self, chosen: int) -> int:
        """How many nodes raised their counter to *chosen* (and still hold the key for us)."""
        return sum(raised >= chosen for raised in self.fenced_to)
