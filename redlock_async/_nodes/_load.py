"""How one node is doing: commands sent, its round trips, and whether it has stalled.

Round trips are measured from a write to an idle connection to its first reply, with RFC 6298's
estimator (``_algorithm.smoothed_rtt``): how long this node takes on this network, which the
adaptive node timeout and the hand-off's patience read. A node *stalls* when it has answered
nothing for ``stall_after`` seconds while commands wait: then limited commands (acquire, extend)
are refused once ``max_unanswered`` are unanswered, so a stopped node collects no unbounded backlog.
"""

from __future__ import annotations

from redlock_async._core import clock as _clock
from redlock_async._core import smoothed_rtt


class NodeLoad:
    """One node's figures (``Node.load``), kept by the node as it writes and reads."""

    __slots__ = (
        "_rttvar",
        "max_rto",
        "max_unanswered",
        "progress",
        "rto",
        "sent",
        "srtt",
        "stall_after",
        "waiting_since",
    )

    def __init__(self, *, max_unanswered: int, stall_after: float, max_rto: float) -> None:
        self.max_unanswered = max_unanswered
        self.stall_after = stall_after
        self.max_rto = max_rto
        self.sent = 0
        """Commands sent to this node (for statistics)."""
        self.progress = 0.0
        """Monotonic time of the last reply, or of the first write after an idle spell."""
        self.waiting_since = 0.0
        """Monotonic time of a write to an idle connection whose reply is awaited (0: none). The outbox sets
        it, and :attr:`progress`, on such a write (``Outbox.take``): waiting starts then, not at the last reply."""
        self.srtt = 0.0
        """Smoothed round trip (seconds); 0 until measured."""
        self._rttvar = 0.0
        self.rto = 0.0
        """Retransmission-style timeout: smoothed RTT + 4 x its variation, at most max_rto; 0 until measured."""

    def stalled(self) -> bool:
        """Nothing answered for ``stall_after`` seconds."""
        return _clock.now() - self.progress > self.stall_after

    def answered(self, now: float) -> None:
        """Replies came: progress, and a round-trip sample when a write to an idle connection was awaited."""
        self.progress = now
        since = self.waiting_since
        if since:
            self.waiting_since = 0.0
            srtt, rttvar = self.srtt, self._rttvar = smoothed_rtt(self.srtt, self._rttvar, now - since)
            rto = srtt + 4 * rttvar
            self.rto = rto if rto < self.max_rto else self.max_rto  # (min(), without its call: once per reply)
