"""What reading the nodes says of a lock: who holds it, for how long, and whether that is certain.

Made by :meth:`Redlock.inspect` and ``redlock status``, which read only: no write, no script,
no PUBLISH, nothing at connect either (no restart-quarantine marker). A token never appears:
holders are told apart by a digest of it, and named by the owner label stored with the lease.
"""

from __future__ import annotations

from dataclasses import dataclass

from redlock_async._algorithm import quorum


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node's answer for the lock's key."""

    address: str
    """host:port or unix path, as ``Redlock.nodes`` names it."""
    state: str
    """``"held"``, ``"free"`` or ``"unreachable"``."""
    owner: str | None = None
    """The holder's owner label (``redlock.lock(name, owner=)``), when held and labelled."""
    ttl: float | None = None
    """Seconds the key has left, when held."""
    error: str = ""
    """Why the node could not be read, when unreachable."""
    holder: str | None = None
    """A digest of the holder's token: tells holders apart, useless to extend or release a lease."""
    fencing_counter: int | None = None
    """The resource's fencing counter on this node, None when there is none."""


@dataclass(frozen=True, slots=True)
class LockInfo:
    """The verdict over every node, by the majority rule."""

    state: str
    """``"held"`` when one holder's key is on a majority; ``"free"`` when a majority answered and no
    holder could have a majority even with every unanswered node; ``"unknown"`` otherwise."""
    owner: str | None
    """The holder's owner label when held, else None."""
    ttl: float | None
    """Seconds the majority holder's keys have left (the shortest of them) when held, else None."""
    fencing_counter: int | None
    """When held: the fencing counter a majority of the nodes reach (for a fenced lock, the holder's
    fencing token; for an election, the leader's term: a node can be ahead of it, never a majority).
    Otherwise the largest that answered. None when none exists."""
    nodes: tuple[NodeInfo, ...]
    holder: str | None = None
    """The digest of the majority holder's token when held, else None."""

    @property
    def quorum(self) -> int:
        """How many nodes a holder needs."""
        return quorum(len(self.nodes))
