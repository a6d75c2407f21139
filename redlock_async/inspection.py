"""What reading the nodes says of a lock: who holds it, for how long, and whether that is certain.

Made by :meth:`Redlock.inspect` and ``redlock status``, which read only: no write, no script,
no PUBLISH, nothing at connect either (no restart-quarantine marker). A token never appears:
holders are told apart by a digest of it, and named by the owner label stored with the lease.

One name is looked at as every primitive uses it: the lock (``redlock.lock``, ``lock_many``, whose
holder holds each of its names, an election), the semaphore of that name (its permits) and the
read/write lock of that name (its writer and its readers).
A node that may have lost keys (in restart quarantine: it came back without its keys, or no one
vouched for it yet; or its clock jumped ahead, which expires keys early) rules no holder out: for
"free" it counts as a node that did not answer. A key it shows still counts toward its holder's
majority (a node can lose a key, never invent one). So a verdict is never wrong, at worst unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from redlock_async._core import quorum

__all__ = ["LockInfo", "LockState", "NodeInfo", "NodeState"]

LockState: TypeAlias = Literal["held", "free", "unknown"]
"""The verdict over every node (:attr:`LockInfo.state`)."""
NodeState: TypeAlias = Literal["held", "free", "unreachable", "quarantined"]
"""One node's answer (:attr:`NodeInfo.state`)."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node's answer for the lock's key."""

    address: str
    """host:port or unix path, as ``Redlock.nodes`` names it."""
    state: NodeState
    """``"held"``, ``"free"``, ``"unreachable"``, or ``"quarantined"`` (it may have lost keys: in restart
    quarantine, or its clock jumped ahead; *error* says which). A quarantined node's *holder*, *owner*
    and *ttl* are what it shows, which counts toward that holder's majority; it rules no holder out, and
    its fencing counter is not shown."""
    owner: str | None = None
    """The holder's owner label (``redlock.lock(name, owner=)``), when held and labelled."""
    ttl: float | None = None
    """Seconds the key has left, when held."""
    error: str = ""
    """Why the node could not be read (unreachable), or why it may have lost keys (quarantined)."""
    holder: str | None = None
    """A digest of the holder's token: tells holders apart, useless to extend or release a lease."""
    fencing_counter: int | None = None
    """The lock's fencing counter on this node, None when there is none."""
    fenced_by: str | None = None
    """The digest (as *holder*) of the acquisition whose fence last wrote this node's counter: when it
    is the holder's, the counter was raised by the holder."""


@dataclass(frozen=True, slots=True)
class LockInfo:
    """The verdict over every node, by the majority rule."""

    state: LockState
    """``"held"`` when one holder's key is on a majority (quarantined nodes included: the lock's, a
    permit's of the semaphore of the same name, or the writer's or a reader's of the read/write lock
    of the same name); ``"free"`` when a majority answered (quarantined nodes excluded) and no holder
    could have a majority even with every unanswered or quarantined node; ``"unknown"`` otherwise."""
    owner: str | None
    """The lock holder's owner label when the lock is held, else None (a semaphore's: *permits*)."""
    ttl: float | None
    """Seconds the lock holder's keys have left (the shortest of them) when held, else None."""
    fencing_counter: int | None
    """When the lock is held: its fencing token (for an election, the leader's term), once the
    holder's fence is written on a majority; None before that (a moment after the grant: the nodes
    still show an earlier holder's token), for an unfenced holder, or for a holder fenced by a client
    older than 0.2.0. Otherwise the largest counter that answered, None when none exists."""
    nodes: tuple[NodeInfo, ...]
    """Each node's answer for the lock's key."""
    holder: str | None = None
    """The digest of the lock holder's token when held, else None."""
    limit: int | None = None
    """The limit of the semaphore of this name, when one was used (the limit its permits are held
    under, else the widest ever used); None when there is no semaphore of this name."""
    permits: tuple[LockInfo, ...] = ()
    """The semaphore's permits that are held or may be (``"held"`` or ``"unknown"``), each judged as a
    lock (owner, ttl, holder, nodes); free permits are not listed."""
    writer: LockInfo | None = None
    """The writer of the read/write lock of this name (``redlock.rw_lock``), judged as a lock, when one
    holds it or may (``"held"`` or ``"unknown"``); None otherwise."""
    readers: tuple[LockInfo, ...] = ()
    """The readers of that read/write lock that hold it or may, each judged as a lock (every reader has
    a lease of its own); readers whose lease is gone are not listed."""

    @property
    def quorum(self) -> int:
        """How many nodes a holder needs."""
        return quorum(len(self.nodes))
