"""The clock guard: a node whose clock jumps ahead or races sits out every quorum, as one that restarted empty.

Redis and Valkey expire keys by the wall clock. A node whose clock steps ahead
(an NTP step, a VM resumed with a stale clock corrected at once, an operator's
``date -s``) or runs fast expires every lease early: a contender can then take
the lock on it while the holder still counts it. Each request that can grant
(acquire, a semaphore's permit, an extension) carries a ``TIME`` right before
it, in the same write (``Node.send_timed``): no extra round trip; the grant queue's
scripts reply with the node's time as they ran, which is the reading (``_queue/_claim.py``). Between two
of our exchanges with a node, the real time passed lies between the first
reply and the second send, and between the first send and the second reply
(our monotonic clock); :func:`_algorithm.judge_clock` says whether the node's
clock kept inside that window, with the drift factor.

A node found **ahead** counts toward no quorum for the longest ttl plus drift
(``Node.clock_held_until``, through the restart quarantine's
``quarantined_until``: a yes from it is counted as QUARANTINED): the reading
comes right before the vote on the same connection, so the vote that follows a
jump is never counted. Held locks that counted the node lose it at once
(:meth:`Cluster.node_lost`). One WARNING and one ``clock`` event per episode.

A node found **behind** (stepped back, runs slow) or **frozen** is reported
(a WARNING and an event) but keeps voting: its keys live too long there, which
never lets two clients hold a lock (a yes from it is at least as good as
from a sound node), only makes others wait longer. Quarantining it would cost
availability and buy no safety.

Limits (docs/algorithm.md, "Clock faults"): a client sees a jump only across
two of its own exchanges with the node; a fresh client, or one whose last
exchange with the node is older than the jump by more than the drift factor
allows over that gap, cannot tell a jump from drift. Fencing covers those.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

from redlock_async._core import ClockFault, judge_clock
from redlock_async._core import clock as _clock
from redlock_async._nodes import Node, Reply

log = logging.getLogger("redlock_async")

SETTLED = 0.01
"""Seconds a reading's window must span for a sound reading to end a fault's episode (a frozen clock
looks sound over a window of microseconds): the next fault then warns again."""

OnClockFault = Callable[[int, ClockFault, float, str], None]
"""Told of each new episode: (node index, fault, size in seconds, what happened in words)."""


class _Reading:
    """The receiver of one request's ``TIME`` on every node: ``deliver(index, reply)`` goes straight to the
    guard with the time the request was sent (a partial: no frame of its own per reply)."""

    __slots__ = ("deliver",)

    def __init__(self, guard: ClockGuard, sent: float) -> None:
        self.deliver: Callable[[int, Reply], None] = partial(guard.read, sent)


class ClockGuard:
    """Per Redlock: each node's last reading of its clock, and what to do when one jumps."""

    __slots__ = ("_drift", "_faulty", "_nodes", "_on_fault", "_period", "_received", "_sent", "_times")

    def __init__(
        self, nodes: Sequence[Node], drift_factor: float, period: Callable[[], float], on_fault: OnClockFault
    ) -> None:
        self._nodes = tuple(nodes)
        n = len(self._nodes)
        self._drift = drift_factor
        self._period = period  # read at each fault: the largest ttl in use may grow
        self._on_fault = on_fault
        self._times: list[float | None] = [None] * n  # the node's time at our last reading, None before one
        self._sent = [0.0] * n
        self._received = [0.0] * n
        self._faulty: list[ClockFault | None] = [None] * n  # the episode under way (one warning each)

    def reading(self) -> _Reading:
        """The receiver of the ``TIME`` of one request about to be sent (to every node)."""
        return _Reading(self, _clock.now())

    def observe(self, i: int, reply: Reply, sent: float, received: float) -> None:
        """Node *i* read its clock (*reply*, ``TIME``) between *sent* and *received* (ours)."""
        self.read(sent, i, reply, received)

    def read(self, sent: float, i: int, reply: Reply, received: float | None = None) -> None:
        """:meth:`observe`; *received* None: now (a reading's receiver, as the reply is parsed)."""
        if type(reply) is not list:
            return  # the request failed (or TIME was refused): nothing read
        if received is None:
            received = _clock.now()
        try:
            now = int(reply[0]) + int(reply[1]) * 1e-6
        except (ValueError, TypeError, IndexError):
            return
        times, sents, receiveds = self._times, self._sent, self._received
        before = times[i]
        shortest = sent - receiveds[i]
        longest = received - sents[i]
        times[i], sents[i], receiveds[i] = now, sent, received
        if before is None:
            return
        judged = judge_clock(before, now, shortest, longest, self._drift)
        if judged is None:
            if self._faulty[i] is not None and shortest >= SETTLED:
                self._faulty[i] = None
            return
        self._fault(i, judged[0], judged[1], received)

    def heard(self, i: int, node_time: float, received: float) -> bool:
        """Node *i* read its clock (*node_time*, seconds) at some moment before *received* (ours): a time
        carried by a message (a grant word of the queue), not a reply. Judged for a jump ahead only (when
        it was read is not known, nor its order with our replies' readings), and never kept as a reading.
        True when it shows the node's clock ahead: the node sits out, as after a ``TIME``."""
        before = self._times[i]
        if before is None:
            return False
        judged = judge_clock(before, node_time, 0.0, received - self._sent[i], self._drift)
        if judged is None or judged[0] is not ClockFault.AHEAD:
            return False
        self._fault(i, judged[0], judged[1], received)
        return True

    def _fault(self, i: int, fault: ClockFault, size: float, now: float) -> None:
        node = self._nodes[i]
        new = self._faulty[i] is not fault
        self._faulty[i] = fault
        if fault is ClockFault.AHEAD:
            period = self._period()
            words = f"its clock jumped {size:.3f} s ahead (or runs fast): its keys expired early"
            held = now + period
            if held > node.clock_held_until:
                node.clock_held_until = held
            if held >= node.quarantined_until:
                node.quarantined_until = held
                node.quarantine_reason = words
            if not new:
                return
            log.warning("redlock node %s: %s; it counts toward no quorum for %.1f s", node.name, words, period)
        else:
            if not new:
                return
            if fault is ClockFault.FROZEN:
                words = f"its clock stopped (frozen for at least {-size:.3f} s): its keys do not expire"
            else:
                words = f"its clock stepped back {-size:.3f} s (or runs slow): its keys live too long"
            log.warning("redlock node %s: %s (it keeps voting: safe, but others may wait longer)", node.name, words)
        self._on_fault(i, fault, size, words)
