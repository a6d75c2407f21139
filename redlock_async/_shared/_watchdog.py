"""Keeps held locks extended, in batches; reports a lost lock.

One watchdog serves every lock of a Redlock: a heap of due times and one
task that sleeps until the earliest. Locks due within :data:`BATCH_WINDOW`
of each other are extended in one *round*: per node, one EXTEND_MANY script
call carries up to :data:`CHUNK` locks, so 10,000 held locks cost a few
commands per node per round instead of 10,000 timers and 50,000 replies.

Each lock of a round is decided exactly as an explicit ``extend()`` is:
``_algorithm.extended`` over its per-node votes, with the time its verdict
became certain. Rounds are driven by reply callbacks; the task never waits
for a round, so a slow node never delays the next one.

The task runs only while locks are watched: it ends when the last one is
forgotten, so none outlives the locks it serves.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable
from functools import partial

from redlock_async._core import Vote
from redlock_async._core import algorithm as _algorithm
from redlock_async._core import clock as _clock
from redlock_async._nodes import Failure, Fallback, Node, Receiver, Reply, Resolve
from redlock_async._rounds import Deadline, Lease, pack_extend, sitting_out
from redlock_async._rounds import requests as _requests

log = logging.getLogger("redlock_async._watchdog")  # its name before the wings: users' log settings name it


BATCH_WINDOW = 0.02
"""Seconds: locks due this close together are extended in the same round (a little early)."""
CHUNK = 500
"""Locks per EXTEND_MANY call: bounds the time one script holds a node (well under a millisecond)."""


class Watchdog:
    """Extends the watched locks of one Redlock before their leases run out."""

    def __init__(
        self,
        nodes: tuple[Node, ...],
        node_timeout: float,
        on_fault: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._nodes = nodes
        self._node_timeout = node_timeout
        self._on_fault = on_fault
        self._heap: list[tuple[float, int, Lease]] = []
        self._entries: dict[Lease, int] = {}  # lock -> its live heap entry's sequence number
        self._seq = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._waiter_due = float("inf")
        self._closed = False
        self.rounds = 0
        """Rounds started (each is one call per node per chunk): for statistics."""
        self.retries = 0
        """Extensions tried again after a round neither confirmed nor refused: for statistics."""
        self.reading: Callable[[], Receiver | None] = _no_reading
        """The clock guard's reading for one round's ``TIME`` (set by the Cluster), None without guard."""

    def schedule(self, lock: Lease, due: float) -> None:
        """Extend *lock* at monotonic time *due* (replacing any earlier schedule)."""
        if self._closed:
            return  # the Redlock is closed: its locks were given up, no task may start again
        seq = next(self._seq)
        self._entries[lock] = seq
        heapq.heappush(self._heap, (due, seq, lock))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="redlock-watchdog")
        elif due < self._waiter_due and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)  # wake up earlier than planned

    def discard(self, lock: Lease) -> None:
        """Stop watching *lock* (synchronous: safe before any await)."""
        if self._entries.pop(lock, None) is not None and len(self._heap) > 2 * len(self._entries) + 64:
            self._compact()  # (its test, inlined: once per exit)

    async def forget(self, lock: Lease) -> None:
        """Stop watching *lock*; the task ends once no lock is watched."""
        if (task := self.let_go(lock)) is not None:
            await asyncio.wait([task])  # (as _stop: without its coroutine, once per exit)

    def let_go(self, lock: Lease) -> asyncio.Task[None] | None:
        """:meth:`forget` up to its wait (synchronous): the watchdog's task, cancelled, when *lock* was the last
        one watched, for the caller to wait for; else None (nearly always, with other locks held: no
        coroutine per exit)."""
        self.discard(lock)
        return self._stopped() if not self._entries else None

    def _compact(self) -> None:
        """Drop stale heap entries once they outnumber the live ones: a released lock must not stay
        referenced (and alive) until its old due time while other locks are watched."""
        if len(self._heap) > 2 * len(self._entries) + 64:
            entries = self._entries
            self._heap = [entry for entry in self._heap if entries.get(entry[2]) == entry[1]]
            heapq.heapify(self._heap)

    async def aclose(self) -> None:
        """For good (the Redlock closes): stop, and never start again."""
        self._closed = True
        await self._stop()

    async def _stop(self) -> None:
        task = self._stopped()
        if task is not None:
            # wait() does not raise the task's CancelledError: only our own caller's, if any.
            await asyncio.wait([task])

    def _stopped(self) -> asyncio.Task[None] | None:
        """:meth:`_stop` up to its wait: nothing watched, the task cancelled; that task, if it was running."""
        self._heap.clear()
        self._entries.clear()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            return task
        return None

    async def _run(self) -> None:
        try:
            await self._extend_while_watched()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug (ours, or a loop's): the locks would run out unextended with no one told.
            # Say it once, stop for good, and let the Redlock declare its watched locks lost.
            log.error("redlock watchdog: internal error, its locks are given up", exc_info=exc)
            self._closed = True
            self._heap.clear()
            self._entries.clear()
            self._task = None
            if self._on_fault is not None:
                self._on_fault(exc)

    async def _extend_while_watched(self) -> None:
        loop = asyncio.get_running_loop()
        while self._entries:
            heap = self._heap  # (compaction replaces the list)
            now = _clock.now()
            batch: list[Lease] = []
            while heap and heap[0][0] <= now + BATCH_WINDOW:
                _, seq, lock = heapq.heappop(heap)
                if self._entries.get(lock) == seq:  # else a stale entry: rescheduled or forgotten
                    del self._entries[lock]
                    batch.append(lock)
            if batch:
                self._start_round(batch, now)
                heap = self._heap  # a lock released meanwhile may have compacted it
            while heap and self._entries.get(heap[0][2]) != heap[0][1]:
                heapq.heappop(heap)  # drop stale entries so the sleep below is for a live one
            self._waiter_due = heap[0][0] if heap else float("inf")
            if not self._entries:
                break
            self._waiter = loop.create_future()
            timer = loop.call_later(max(0.0, self._waiter_due - _clock.now()), _wake, self._waiter)
            try:
                await self._waiter
            finally:
                timer.cancel()
                self._waiter = None

    def _start_round(self, locks: list[Lease], now: float) -> None:
        """Hand over the locks that are past a limit; send EXTEND_MANY for the rest."""
        extend: list[Lease] = []
        for lock in locks:
            if not lock.due(lock, now):
                continue  # lost or released meanwhile, or at its hold limit (the lock handled it)
            extend.append(lock)
        if extend:
            self.rounds += 1
            _Round(self, extend, now)


def _no_reading() -> Receiver | None:
    return None


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Round:
    """One batched extension of many locks on all nodes; each lock decided on its own.

    Per lock it keeps the votes and running yes/failed counts, so each reply
    costs O(1) per lock; per-node details exist only for locks that met a failure.
    """

    __slots__ = (
        "_decided",
        "_details",
        "_failed",
        "_locks",
        "_loop",
        "_need",
        "_node_timeout",
        "_nodes",
        "_open",
        "_started",
        "_timer",
        "_votes",
        "_yes",
    )

    def __init__(self, watchdog: Watchdog, locks: list[Lease], started: float) -> None:
        loop = asyncio.get_running_loop()
        nodes = self._nodes = watchdog._nodes
        n = len(nodes)
        # A lease extended by a script of its own (a reader's) goes alone, after the EXTEND_MANY chunks.
        own = [lock for lock in locks if lock.keeps is not None and lock.keeps.instead]
        if own:
            locks = [lock for lock in locks if lock.keeps is None or not lock.keeps.instead] + own
        batched = len(locks) - len(own)
        self._locks = locks
        self._started = started
        self._need = _algorithm.quorum(n)
        self._votes: list[list[Vote]] = [[Vote.PENDING] * n for _ in locks]
        self._yes = [0] * len(locks)
        self._failed = [0] * len(locks)
        self._details: dict[int, list[str]] = {}
        self._decided = [False] * len(locks)
        self._open = len(locks)
        self._timer: Deadline | None = None
        for start in range(0, batched, CHUNK):
            chunk = locks[start : min(start + CHUNK, batched)]
            # One EXTEND_MANY per node: each lease also takes the nodes where its keys are free (not its holders).
            packed, fallback = pack_extend(chunk, n)
            self._send(watchdog, packed, fallback, start, len(chunk))
            for lock in chunk:
                if lock.keeps is not None:  # a permit's limit key: lives on with it
                    assert lock.token is not None
                    _requests.send_keep(nodes, lock.keys[0], lock.keeps, lock.token, lock.ttl_ms)
        for start in range(batched, len(locks)):
            packed, fallback = _requests.pack_own(locks[start], n)
            self._send(watchdog, packed, fallback, start, 1)
        self._loop = loop
        self._node_timeout = watchdog._node_timeout
        self._arm(first=True)

    def _send(self, watchdog: Watchdog, packed: list[bytes], fallback: Fallback, start: int, count: int) -> None:
        """The extension of ``_locks[start : start + count]`` to every node (its replies: one array each)."""
        loop, clock = asyncio.get_running_loop(), watchdog.reading()
        for i, node in enumerate(self._nodes):
            fut = loop.create_future()
            if clock is None:
                node.send_packed(Resolve(fut), i, packed[i], limited=True, fallback=fallback)
            else:  # the node's TIME first: a clock that jumped ahead is judged before its votes count
                node.send_timed(clock, Resolve(fut), i, packed[i], limited=True, fallback=fallback)
            fut.add_done_callback(partial(self._on_reply, i, start, count))

    def _arm(self, *, first: bool = False) -> None:
        """Time out the undecided lock whose lease ends first, at that moment.

        Votes count until the lease being extended runs out (extended() rejects
        later ones), so each lock waits that long, not one node timeout: under
        load, replies queue behind other commands, and a retry would only add
        to the queue. A dead minority costs nothing: the majority decides early.
        """
        ends = [lock.expires for j, lock in enumerate(self._locks) if not self._decided[j]]
        if not ends:
            return
        wait = min(ends) - _clock.now()
        if first:
            wait = max(wait, self._node_timeout)
        self._timer = Deadline(self._loop, max(wait, 0.0), self._on_timeout, rearm=0.0)

    def _on_reply(self, node: int, start: int, count: int, fut: asyncio.Future[Reply]) -> None:
        reply = fut.result()
        now = _clock.now()
        failure = reply if isinstance(reply, Failure) else None
        decided, votes, yes, failed, need = self._decided, self._votes, self._yes, self._failed, self._need
        n = len(votes[0]) if votes else 0
        quarantined = failure is None and self._nodes[node].quarantined_until and sitting_out(self._nodes[node])
        for j in range(start, start + count):
            if decided[j]:
                if failure is not None or reply[j - start] != 1:
                    self._locks[j].regain.append(node)  # a late no: the next extension takes it where free
                continue
            if failure is not None:
                vote = failure.vote
                self._details.setdefault(j, [""] * n)[node] = failure.detail
            else:
                vote = Vote.YES if reply[j - start] == 1 else Vote.NO
                if quarantined and vote is Vote.YES:
                    vote = Vote.QUARANTINED
                    self._details.setdefault(j, [""] * n)[node] = quarantined
            votes[j][node] = vote
            if vote is Vote.YES:
                yes[j] += 1
                if yes[j] >= need:
                    self._decide(j, now)
            else:
                failed[j] += 1
                if n - failed[j] < need:
                    self._decide(j, now)

    def _on_timeout(self) -> None:
        self._timer = None
        now = _clock.now()
        for j, votes in enumerate(self._votes):
            if not self._decided[j] and self._locks[j].expires <= now + self._node_timeout / 10:
                timed_out = votes.count(Vote.PENDING)
                votes[:] = [Vote.TIMEOUT if v is Vote.PENDING else v for v in votes]
                self._failed[j] += timed_out
                self._decide(j, now)
        if self._open:
            self._arm()

    def _decide(self, j: int, decided_at: float) -> None:
        self._decided[j] = True
        self._open -= 1
        lease = self._locks[j]
        # The nodes its next extension takes where the key is free (whatever the verdict: taking them
        # may bring a majority back); late noes join them in _on_reply. None when every node said yes
        # or is still pending: the common case costs no scan of the votes.
        lease.regain = _algorithm.to_regain(self._votes[j]) if self._failed[j] else []
        lease.late = None
        lease.result(lease, self._started, decided_at, self._votes[j], self._details.get(j))
        if not self._open and self._timer is not None:
            self._timer.cancel()
            self._timer = None
