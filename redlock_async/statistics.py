"""What a ``Redlock`` and a ``Lock`` can tell about themselves, as frozen snapshots.

``redlock.statistics()`` and ``lock.statistics()`` return these; they read no node
(nothing is sent) and cost a few attribute reads. For monitoring, tests and
benchmarks: nothing outside the library needs to read its private state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from redlock_async._core import renamed

__all__ = ["LockPhase", "LockStatistics", "NodeStatistics", "RedlockStatistics"]

LockPhase: TypeAlias = Literal["idle", "acquiring", "held", "lost"]
"""The phase of a Lock (:attr:`LockStatistics.phase`): never acquired or released, an acquire under
way, granted, or its lease could not be kept (until the next acquire). See docs/algorithm.md."""


@dataclass(frozen=True, slots=True)
class NodeStatistics:
    """One node of a Redlock, as its connection sees it now."""

    address: str
    """``host:port`` or ``unix:/path`` (never a password)."""
    connected: bool
    """A connection is open and its handshake done."""
    server_id: str | None
    """The server's ``run_id`` on the current connection, None until known."""
    quarantined: bool
    """In restart quarantine now: its yes votes count toward no quorum."""
    round_trip: float | None
    """Smoothed round-trip time in seconds (RFC 6298's estimator), None before the first reply."""
    timeout: float
    """The round-trip timeout learned from it (0 until measured, or with adaptive_timeout off)."""
    unanswered: int
    """Commands sent or waiting to be sent, not yet answered (``max_unanswered`` bounds them on a stalled node)."""
    sent: int
    """Commands sent to it since the Redlock was made."""
    fault: str | None
    """An internal error that took the node out of service, or None."""

    @property
    def queued(self) -> int:
        """Deprecated spelling of :attr:`unanswered`."""
        renamed("NodeStatistics.queued", ".unanswered")
        return self.unanswered


@dataclass(frozen=True, slots=True)
class RedlockStatistics:
    """A Redlock now: its nodes, its locks, its watchdog and its waiters."""

    nodes: tuple[NodeStatistics, ...]
    closed: bool
    held_locks: int
    """Locks of this Redlock held now."""
    watched_locks: int
    """Locks whose leases the watchdog keeps (inside ``async with``)."""
    watchdog_rounds: int
    """Batched extension rounds the watchdog has started (one call per node per 500 locks)."""
    watchdog_retries: int
    """Extensions the watchdog tried again because a round was neither confirmed nor refused."""
    wakeups: int
    """Waiters woken by a release (the pushed hand-off) rather than by their fallback timer."""


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """A Lock now, and its current (or last) acquisition."""

    name: str | bytes | tuple[str | bytes, ...]
    """The lock's name (lock_many: its names)."""
    phase: LockPhase
    """``idle``, ``acquiring``, ``held`` or ``lost`` (see docs/algorithm.md)."""
    held: bool
    validity: float
    """Seconds the lease can still be trusted; 0 when not held."""
    attempts: int
    """Rounds of SET sent by the current (or last) acquire."""
    extensions: int
    """Extensions of the current (or last) acquisition: the watchdog's and extend()'s."""
    held_for: float | None
    """Seconds since the grant, while held."""
    fencing_token: int | None
    watched: bool
    """The watchdog keeps its lease now."""

    @property
    def resource(self) -> str | bytes | tuple[str | bytes, ...]:
        """Deprecated spelling of :attr:`name`."""
        renamed("LockStatistics.resource", ".name")
        return self.name
