"""Deadlines of the ballots: a timer that tells a blocked loop from slow nodes, on one loop timer for all.

:class:`Deadline` calls back once the nodes had a node timeout of a *running* loop to answer (a
timer that fires late gives them a fresh window); every deadline of one loop shares one loop
timer (:class:`_Timers`), since nearly every ballot is decided long before its deadline.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import weakref
from collections import deque
from collections.abc import Callable

from redlock_async._core import clock as _clock

LATE = 0.001
"""A timer firing this many seconds late means the loop was blocked, not that the nodes were slow."""


class _Timers:
    """The deadlines of one event loop: ``(when, seq)`` in time order, the live deadlines by seq, one loop timer.

    Each ballot has a deadline, and nearly every ballot is decided long before it:
    a loop timer per ballot (a ``TimerHandle``, pushed on the loop's heap and
    compared there by a Python ``__lt__``) cost more than the rest of the
    ballot's bookkeeping. Here arming appends a tuple and cancelling drops the
    deadline from ``pending``: a decided ballot is freed at once, not kept (with
    its votes, replies and future) until the timer comes by, which under load kept
    a node timeout's worth of ballots alive for the garbage collector to walk. The
    one loop timer is armed for the earliest deadline, and on firing drops the
    cancelled ones. So it fires about once per node timeout while ballots come and
    go, not once per ballot.

    Ballots nearly all wait one node timeout from now, so their deadlines come in time
    order: those go to the end of a queue (no heap to sift through, in or out); one
    earlier than the queue's last (a shorter wait) goes to a heap. Both are read in
    ``(when, seq)`` order. The queue is two deques, of *when* and of *seq*: a float and an
    int are no objects for the garbage collector, where a ``(when, seq)`` tuple per ballot,
    alive for a node timeout (far longer than the ballot), made it run more often.
    """

    __slots__ = ("__weakref__", "_handle", "armed_at", "heap", "loop", "pending", "queue", "seq", "seqs", "tail")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: deque[float] = deque()  # the queued deadlines' *when*, in time order, by construction
        self.seqs: deque[int] = deque()  # and their *seq*, in the same order
        self.tail = -math.inf  # the queue's latest *when* so far
        self.heap: list[tuple[float, int]] = []  # the others
        self.pending: dict[int, Deadline] = {}
        """The deadlines armed and not cancelled, by their seq."""
        self._handle: asyncio.TimerHandle | None = None
        self.armed_at = math.inf
        """When the loop timer fires (inf: not armed, and this loop's timers are forgotten)."""
        self.seq = itertools.count()

    def add(self, when: float, deadline: Deadline) -> int:
        """Call ``deadline.expire`` at *when*, unless ``pending.pop(seq)`` (seq: what this returns) comes first."""
        seq = next(self.seq)
        if when >= self.tail:
            self.queue.append(when)
            self.seqs.append(seq)
            self.tail = when
        else:
            heapq.heappush(self.heap, (when, seq))
        self.pending[seq] = deadline
        if when < self.armed_at:
            self.arm_at(when)
        return seq

    def arm_at(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self.armed_at = when
        self._handle = self.loop.call_later(max(when - _clock.now(), 0.0), self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = _clock.now()
        # Due: everything up to now, and up to the time this timer was for (a loop's timer
        # may fire a hair early by our clock, or the clock may be a test's, standing still).
        due = max(now, self.armed_at)
        self.armed_at = math.inf
        queue, seqs, heap, pending = self.queue, self.seqs, self.heap, self.pending
        while True:
            if queue and queue[0] <= due and not (heap and heap[0] < (queue[0], seqs[0])):
                when, seq = queue.popleft(), seqs.popleft()
            elif heap and heap[0][0] <= due:
                when, seq = heapq.heappop(heap)
            else:
                break
            deadline = pending.pop(seq, None)
            if deadline is not None:
                deadline.expire(now - when)
        while seqs and seqs[0] not in pending:
            queue.popleft()
            seqs.popleft()
        while heap and heap[0][1] not in pending:
            heapq.heappop(heap)
        if queue or heap:
            first = min(queue[0] if queue else math.inf, heap[0][0] if heap else math.inf)
            if first < self.armed_at:
                self.arm_at(first)
        else:
            _timers.pop(self.loop, None)


_timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Timers] = weakref.WeakKeyDictionary()


_last: _Timers | None = None  # the last one asked for: nearly always the one asked for next


def _timers_of(loop: asyncio.AbstractEventLoop) -> _Timers:
    global _last
    timers = _last
    if timers is not None and timers.loop is loop and timers.armed_at != math.inf:
        return timers
    timers = _timers.get(loop)
    if timers is None:
        timers = _timers[loop] = _Timers(loop)
    _last = timers
    return timers


class Deadline:
    """Calls back once the nodes had *timeout* seconds of a running event loop to answer.

    Timeline of the case it exists for::

        send() ── loop blocked 60 ms (GC, a blocking call, a burst) ──► timer fires
                  replies sat unread in the sockets all along; none was parsed yet

    Deciding there would count answered nodes as timed out. So a timer that
    fires late gives the nodes one fresh window, and any timer, late or not,
    waits three loop turns before it calls back: a reply already in a socket
    needs one turn for the socket event (``data_received`` parses it and
    counts it) and the others are spare. Waiting longer never makes a lock
    unsafe: validity is counted from the start of the attempt.

    Armed on the loop's shared :class:`_Timers`; ``cancel()`` takes it off the pending ones. A subclass
    (``_fanout.Ballot``: one object per request) arms it later with :meth:`arm`, after setting
    :attr:`live` to False, and overrides :meth:`on_deadline`.
    """

    __slots__ = ("_callback", "_loop", "_rearm", "_rearmed", "_seq", "_timers", "_turns", "live")

    TURNS = 3

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        callback: Callable[[], None],
        *,
        rearm: float | None = None,
    ) -> None:
        self._callback = callback
        self.arm(loop, timeout, rearm)

    def arm(self, loop: asyncio.AbstractEventLoop, timeout: float, rearm: float | None) -> None:
        """Start the wait: *timeout* seconds from now, then a fresh window of *rearm* (default: *timeout*)
        if the timer fired late."""
        self._loop = loop
        # The fresh window (one node timeout); 0 when waiting longer cannot help,
        # as at a lease's end: votes after it are rejected anyway.
        self._rearm = timeout if rearm is None else rearm
        self._rearmed = False
        self._turns = self.TURNS
        self.live = True
        """Armed, and neither called back nor cancelled."""
        timers = _last  # (_timers_of's first look, inlined: once per ballot)
        if timers is None or timers.loop is not loop or timers.armed_at == math.inf:
            timers = _timers_of(loop)
        self._timers = timers
        # timers.add(when, self), inlined (once per ballot): nearly every deadline goes to the queue's end.
        when = _clock.now() + timeout
        seq = self._seq = next(timers.seq)
        if when >= timers.tail:
            timers.queue.append(when)
            timers.seqs.append(seq)
            timers.tail = when
        else:
            heapq.heappush(timers.heap, (when, seq))
        timers.pending[seq] = self
        if when < timers.armed_at:
            timers.arm_at(when)

    def expire(self, late: float) -> None:
        """Its time came, *late* seconds after it was due."""
        if not self._rearmed and self._rearm and late > LATE:
            self._rearmed = True
            timers = self._timers = _timers_of(self._loop)
            self._seq = timers.add(_clock.now() + self._rearm, self)
            return
        self._turn()

    def _turn(self) -> None:
        if not self.live:
            return
        if self._turns:
            self._turns -= 1
            self._loop.call_soon(self._turn)  # (cancelled: it finds live False and returns)
            return
        self.live = False
        self.on_deadline()

    def on_deadline(self) -> None:
        """The time is up (called once, unless cancelled first)."""
        self._callback()

    def cancel(self) -> None:
        """Stop the timer (a ballot's requests are already sent, and stay sent)."""
        if self.live:
            self.live = False
            self._timers.pending.pop(self._seq, None)  # (not there once it expired)
