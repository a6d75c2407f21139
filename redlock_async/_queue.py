"""The grant queue (the default hand-off): the nodes hand a released key to the next waiter.

Each node keeps the key's waiters in line (``QUEUE_ENTER``), and the release script (``QUEUE_LEAVE``)
sets the key to the first live waiter's token right where it deletes the old one, then publishes a
grant word naming that waiter (by digest) with the node's time of the grant. The waiter holds the key
on that node without sending anything: once a majority granted it, it holds the lock (one round trip
from the release, in any process; release words and the waiter's own SETs take two).

**Validity of a grant heard as a word**: counted from the node's clock, which every reply carries
(:func:`_algorithm.held_until`; docs/algorithm.md, "The grant queue").

**Stale words.** A word may arrive after the grant it tells of was given back: words of grants older
than the latest reply's node time are ignored, words heard while our own script is on the wire wait
for its reply, and after a failed request no word from that node counts until a reply says where
things stand.

**Order and splits.** Every node orders waiters by a score the waiter chose once (its wall-clock
start), so every node serves the same waiter first. A waiter that holds some nodes but no majority
for a grace of a few round trips gives those back and stays in line (``QUEUE_STAY``). A waiter that
quits leaves every node's line at once, handing on any key a node granted it meanwhile; one that
dies leaves entries that expire unless entered again (every retry delay).

**Fenced claims**: every grant reads the fencing counter in the same step; a majority's counters are
raised (``QUEUE_FENCE``) before the claim counts (docs/fencing.md, "Fenced grants from the queue").

**Permits** (``_queue_permit``): a semaphore's line; a node grants a slot, held once a majority holds
the same one.

**Scripts the server lost**: a leave is always sent again after NOSCRIPT, an entry or a give-back
not behind a later command on its key (``Script.creates``).

The queue keys of a lock key are the lock key followed by ``\\x00queue`` and ``\\x00waits``; they
expire once no waiter entered them for an entry's life.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import time
from collections.abc import Callable, Sequence

from redlock_async import _algorithm, _clock, _queue_rw
from redlock_async._clock_guard import ClockGuard
from redlock_async._fanout import sitting_out, timed_out
from redlock_async._node import Node
from redlock_async._queue_permit import Permits
from redlock_async._scripts import (
    FENCED_BY,
    PERMIT_ENTER,
    PERMIT_LEAVE,
    PERMIT_STAY,
    QUEUE_ENTER,
    QUEUE_FENCE,
    QUEUE_LEAVE,
    QUEUE_STAY,
)
from redlock_async._settings import Settings
from redlock_async._wire import Failure, Reply, pack_script

ENTRY_LIFE_MIN_MS = 1000
"""Shortest life of a waiter's entry on a node (it is entered again every retry delay)."""

ENTRY_LIFE_DELAYS = 5
"""An entry lives this many retry delays (at least ENTRY_LIFE_MIN_MS): a waiter re-enters it every
delay (at most 1.5 of them), so only a waiter that died or was cut off lets it expire."""


SUFFIXES = (b"\x00queue", b"\x00waits")
"""What a lock key's line and waits add to it: no resource name may end so (``_names.resource_key``)."""


def queue_keys(key: bytes, fence_key: bytes | None = None) -> tuple[bytes, ...]:
    """The lock key, its line and its waits (see the module's docstring), and the name's fencing counter
    when given: the grant scripts read it for a fenced waiter they grant the key to."""
    keys = (key, key + SUFFIXES[0], key + SUFFIXES[1])
    return keys if fence_key is None else (*keys, fence_key)


def entry_life_ms(settings: Settings) -> int:
    return max(ENTRY_LIFE_MIN_MS, math.ceil(ENTRY_LIFE_DELAYS * settings.retry_delay * 1000))


def patience(nodes: Sequence[Node], timeout: float) -> float:
    """How long to wait for a majority's answers: *timeout*, or the majority-th slowest node's
    measured retransmission timeout when that is longer (a slow network)."""
    rtos = sorted(node.load.rto for node in nodes)
    return max(timeout, rtos[_algorithm.quorum(len(nodes)) - 1])


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def new_score() -> bytes:
    """A waiter's place in every line it enters: its wall-clock start in microseconds, the same on every
    node (so every node serves the same waiter first), chosen once per acquire (lock_many: for every name)."""
    return b"%d" % (time.time_ns() // 1000)


class Bell:
    """What wakes the waiter of one acquire: any reply or grant word of any of its claims (lock_many waits
    on a claim per name)."""

    __slots__ = ("_changed",)

    def __init__(self) -> None:
        self._changed: asyncio.Future[None] | None = None

    def ring(self) -> None:
        changed = self._changed
        if changed is not None and not changed.done():
            changed.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Return at the next ring, or after *timeout* seconds (a timer resolving the future: lighter than
        ``asyncio.timeout``, on the uncontended acquire's path)."""
        loop = asyncio.get_running_loop()
        changed = self._changed = loop.create_future()
        timer = loop.call_later(max(timeout, 0.0), _resolve, changed)
        try:
            await changed
        finally:
            timer.cancel()
            self._changed = None


class _Request:
    """The receiver of one of our requests on one node: it knows when it was sent, and which of the
    claim's methods reads its replies."""

    __slots__ = ("_answer", "_sent")

    def __init__(self, answer: Callable[[int, float, Reply], None], sent: float) -> None:
        self._answer = answer
        self._sent = sent

    def deliver(self, index: int, reply: Reply, /) -> None:
        self._answer(index, self._sent, reply)


class Claim:
    """One acquire's standing in the grant queues of one key, on every node.

    The waiter's token is fixed for the whole acquire: every grant names it. *fence_key*, the name's
    fencing counter, goes with every script (a grant to a fenced waiter reads it); a fenced claim
    (``settings.fencing``) keeps each node's counter beside the grant it came with, and counts only
    once a fence round raised the counters of a majority (:meth:`fence`; docs/fencing.md). With
    *permits*, the claim is a semaphore waiter's: its line is the semaphore's, and what a node grants
    is a slot (:attr:`slots`; ``_queue_permit``).
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        key: bytes,
        settings: Settings,
        token: bytes,
        fence_key: bytes | None = None,
        *,
        score: bytes | None = None,
        bell: Bell | None = None,
        permits: Permits | None = None,
        guard: ClockGuard | None = None,
        rw: _queue_rw.RwLine | None = None,
    ) -> None:
        self.nodes = nodes
        self._guard = guard  # the clock guard: a TIME before each script that can grant, and grant words judged
        self.token = token
        self.permits = permits
        self.rw = rw  # a read/write lock's claim: its line is the name's, of readers and writers
        self.keys = rw.keys if rw is not None else permits.keys if permits is not None else queue_keys(key, fence_key)
        self.fenced = (
            settings.fencing and fence_key is not None and permits is None and (not rw or rw.kind == _queue_rw.WRITER)
        )
        self.reads = settings.fencing and rw is not None and not self.fenced  # a reader: counters read, none raised
        self._fence_key = fence_key or b""
        self._fence_ttl = settings.fence_ttl_ms
        self._ttl = settings.ttl_ms / 1000
        self._ttl_ms = settings.ttl_ms
        self._life_ms = entry_life_ms(settings)
        self._drift = settings.drift_factor
        self._score = new_score() if score is None else score  # the same on every node: our place in line
        self.bell = Bell() if bell is None else bell
        """Rung at every reply and grant word: the claims of one acquire share one."""
        n = len(nodes)
        self._quorum = _algorithm.quorum(n)
        self.ends = [-math.inf] * n
        """Per node: until when its key holds our token for sure (our clock); -inf: not ours."""
        self.since = [math.inf] * n
        """Per node: when we learnt it holds our token (for the split grace); inf: it does not."""
        self.counters: list[int | None] = [None] * n
        """Per node (a fenced claim): the largest fencing counter read there while the key held our token,
        since the node last stopped holding it for us (with fence_ttl, at least the node's clock then)."""
        self.slots: list[int | None] = [None] * n
        """Per node (a permit claim): the slot it holds for us (None: none, or we cannot tell)."""
        self.want = -1
        """A permit claim split between slots: the slot it waits for on every node (-1: any)."""
        self.refusals = [0] * n
        """Per node (a permit claim): the limit its latest reply said a slot is held under (0: none)."""
        self.fenced_to = [0] * n
        """Per node (a fenced claim): the fencing token our fence round raised its counter to, while the
        key held our token (0: none since the node last stopped holding it for us)."""
        self._ref: list[tuple[float, int] | None] = [None] * n  # (our send time, node us when it ran)
        self._floor = [math.inf] * n  # words of grants at node times <= this are stale
        self._busy = [0] * n  # our scripts on the wire per node: words heard meanwhile wait for the reply
        self._stash: list[tuple[int, int | None] | None] = [None] * n  # latest grant word heard while busy
        self._failed: list[Failure | None] = [None] * n  # how each node's latest script failed (for outcomes)
        self.pending = 0
        """Our scripts not answered yet, on all nodes."""
        self.poked = False
        """A release word came (a client without the queue released): enter again now."""
        self.left = False
        """:meth:`leave` was called: no reply or word counts any more."""
        self.eager = False
        """Wake the waiter at every new grant (waiting in line: a grant short of a majority starts the
        split grace); otherwise only once a majority holds, or every script was answered."""

    @functools.cached_property
    def word(self) -> bytes:
        """What grant words name this claim by (worked out only for a claim that waits)."""
        return hashlib.sha1(self.token).hexdigest().encode()

    # -- sending ------------------------------------------------------------------

    def enter(self) -> None:
        """Join (or stay in) every node's line; a node whose key is free grants it to its first waiter."""
        args = (self.token, self._ttl_ms, self._score, self._life_ms)
        if self.rw is not None:
            self._send(range(len(self.nodes)), *self.rw.enter(*args))
            return
        if (permits := self.permits) is not None:
            self._send(range(len(self.nodes)), PERMIT_ENTER, (*args, permits.limit, permits.prefix, self.want))
            return
        self._send(range(len(self.nodes)), QUEUE_ENTER, args)

    def give_back(self, nodes: Sequence[int]) -> None:
        """Give back what *nodes* granted us, and stay in their lines (a split: no majority came)."""
        for i in nodes:
            self._drop(i)
        args = (self.token, self._score, self._life_ms, self._ttl_ms)
        if self.rw is not None:
            self._send(nodes, *self.rw.stay(*args))
            return
        if (permits := self.permits) is not None:
            self._send(nodes, PERMIT_STAY, (*args, permits.limit, permits.prefix, self.want))
            return
        self._send(nodes, QUEUE_STAY, args)

    def leave(self) -> None:
        """Leave every node's line; a key granted to us goes to the next waiter (synchronous: survives
        cancellation). Nothing of ours stays on the nodes once these ran, and nothing counts any more."""
        self.left = True
        self.ends = [-math.inf] * len(self.nodes)
        self.fenced_to = [0] * len(self.nodes)
        if self.rw is not None:
            self._send(range(len(self.nodes)), *self.rw.leave(self.token))
            return
        if (permits := self.permits) is not None:
            self._send(range(len(self.nodes)), PERMIT_LEAVE, (self.token, permits.prefix))
            return
        self._send(range(len(self.nodes)), QUEUE_LEAVE, (self.token,))

    def fence(self, held: Sequence[int]) -> int:
        """Choose the fencing token (one more than the largest counter read on *held*, a majority that
        holds the key for us) and send QUEUE_FENCE on every node: it raises the counter to it where the
        key still holds our token (:attr:`fenced_to`), and its reply says where things stand, as an
        entry's does. Returns the token; the claim counts once a majority raised it (:meth:`fenced_on`)."""
        chosen = 1 + max(self.counters[i] or 0 for i in held)
        keys = (self.keys[0], self._fence_key, self._fence_key + FENCED_BY)
        args: tuple[bytes | int, ...] = (self.token, chosen)
        if self._fence_ttl is not None:
            args += (self._fence_ttl,)
        self._send(range(len(self.nodes)), QUEUE_FENCE, args, keys, functools.partial(self._fence_answered, chosen))
        return chosen

    def fenced_on(self, now: float, chosen: int) -> list[int]:
        """The nodes that hold the key for us at *now* (and count) and raised their counter to *chosen*."""
        return [i for i in self.held(now) if self.fenced_to[i] >= chosen]

    def _send(
        self,
        nodes: Sequence[int],
        script: object,
        args: tuple[bytes | int, ...],
        keys: tuple[bytes, ...] | None = None,
        answer: Callable[[int, float, Reply], None] | None = None,
    ) -> None:
        known = (QUEUE_ENTER, QUEUE_LEAVE, QUEUE_STAY, QUEUE_FENCE, PERMIT_ENTER, PERMIT_LEAVE, PERMIT_STAY)
        assert script in known or script in _queue_rw.SCRIPTS
        keys = self.keys if keys is None else keys
        packed = pack_script(script, keys, args)
        fallback = (script, keys, args)
        receiver = _Request(self._answered if answer is None else answer, _clock.now())
        # A script that can grant us the key carries the node's TIME right before it (the clock guard:
        # a node whose clock jumped ahead sits out before its grant is counted).
        leave = script in (QUEUE_LEAVE, PERMIT_LEAVE, _queue_rw.LEAVE)
        clock = None if self._guard is None or leave else self._guard.reading()
        for i in nodes:
            self._busy[i] += 1
            self.pending += 1
            if clock is None:
                self.nodes[i].send_packed(receiver, i, packed, fallback=fallback)
            else:
                self.nodes[i].send_timed(clock, receiver, i, packed, fallback=fallback)

    # -- hearing --------------------------------------------------------------------

    def _answered(self, i: int, sent: float, reply: Reply) -> None:
        self._busy[i] -= 1
        self.pending -= 1
        self._failed[i] = reply if isinstance(reply, Failure) else None
        new = False
        if self.left:
            pass  # out of every line: what a node says now grants us nothing
        elif isinstance(reply, Failure) or not isinstance(reply, list) or len(reply) < 3 or reply[1] == b"0":
            # Did it run? A word from this node counts again only after a reply says where things stand.
            self._drop(i)
            self._floor[i] = math.inf
            self._ref[i] = None
        else:
            node_us, pttl = int(reply[1]), reply[2]
            if self.permits is not None:  # PERMIT_ENTER's -L: a slot is held under another limit L
                self.refusals[i] = -reply[0] if isinstance(reply[0], int) and reply[0] < 0 else 0
            self._ref[i] = (sent, node_us)
            self._floor[i] = node_us
            if self._busy[i]:
                pass  # a later script of ours is on the wire (a give-back?): its reply says where things stand
            elif isinstance(pttl, int) and pttl > 0:
                if self.permits is not None:
                    self.slots[i] = int(reply[3])  # the slot it holds for us
                if self.fenced or self.reads:
                    # Read while the key held our token: every grant before ours there had ended.
                    self._count(i, reply[3] if len(reply) > 3 else None, node_us)
                end = _algorithm.held_until(sent, pttl / 1000, self._drift)
                if end > self.ends[i]:
                    if self.ends[i] == -math.inf:
                        self.since[i] = _clock.now()
                        new = True
                    self.ends[i] = end
            else:
                self._drop(i)
        if not self._busy[i] and (stashed := self._stash[i]) is not None:
            self._stash[i] = None
            new = self._granted(i, *stashed) or new
        if new or not self.pending:
            self._wake_for_grant()

    def _fence_answered(self, chosen: int, i: int, sent: float, reply: Reply) -> None:
        """A reply to our fence round: as an entry's, and where it raised the counter, say so."""
        self._answered(i, sent, reply)
        raised = isinstance(reply, list) and len(reply) > 3 and reply[0] == 1
        if raised and not self._busy[i] and not self.left and self.ends[i] > -math.inf:
            self.fenced_to[i] = max(self.fenced_to[i], chosen)
            self._wake()
        elif not self.pending:
            self._wake()

    def heard(self, i: int, grant_us: int, counter: int | None = None) -> None:
        """Node *i* published a grant of the key to us, at its time *grant_us*, with the fencing counter
        it read in the same step (None: the word carries none, from a client before fenced grants)."""
        if self._busy[i]:
            stashed = self._stash[i]
            if stashed is None or grant_us > stashed[0]:
                self._stash[i] = (grant_us, counter)
            return
        if self._granted(i, grant_us, counter):
            self._wake_for_grant()

    def _granted(self, i: int, grant_us: int, counter: int | None = None) -> bool:
        """Count a grant word of node *i*; True when node *i* newly holds the key for us."""
        ref = self._ref[i]
        if ref is None or grant_us <= self._floor[i] or self.left:
            return False  # stale: a grant from before what the node's latest reply told us
        now = _clock.now()
        if self._guard is not None and self._guard.heard(i, grant_us / 1e6, now):
            return False  # its clock jumped ahead since our last reading: it sits out (and keys there die early)
        if self.permits is not None:
            if counter is None:
                return False  # no slot named: the next entry's reply says where things stand
            self.slots[i] = counter  # a permit's grant word names the slot where a lock's names the counter
        elif self.fenced or self.reads:
            if counter is None:
                return False  # no counter with it: the next entry's reply says where things stand
            self._count(i, counter, grant_us)
        sent, node_us = ref
        # The grant's time on the node, mapped to ours through the latest reply, and capped at a ttl from
        # now (the grant came before we heard it): a clock that stepped ahead since that reply and went
        # unseen (no guard, or no reading yet) stretches the mapping by the step, the cap by the word's trip.
        end = min(
            _algorithm.held_until(sent, (grant_us - node_us) / 1e6 + self._ttl, self._drift),
            _algorithm.held_until(now, self._ttl, self._drift),
        )
        if end <= self.ends[i]:
            return False
        new = self.ends[i] == -math.inf
        if new:
            self.since[i] = now
        self.ends[i] = end
        return new

    def _count(self, i: int, counter: object, node_us: int) -> None:
        """Keep a fencing counter node *i* read while its key held our token (with fence_ttl, at least
        the node's clock *node_us* then: counters expire, and a token never goes back; docs/fencing.md)."""
        value = int(counter) if isinstance(counter, (int, bytes)) else 0
        if self._fence_ttl is not None and self.fenced:  # (a reader's token is the last writer's, not a floor)
            value = max(value, node_us)
        self.counters[i] = max(self.counters[i] or 0, value)

    def _drop(self, i: int) -> None:
        """Node *i* no longer holds the key for us (or we cannot tell): what we knew of it goes."""
        self.ends[i], self.since[i] = -math.inf, math.inf
        self.counters[i], self.fenced_to[i], self.slots[i] = None, 0, None

    def _wake_for_grant(self) -> None:
        """Wake the waiter if what changed may decide: every script answered, a majority holds, or (eager)
        any new grant."""
        if self.eager or not self.pending or len(self.ends) - self.ends.count(-math.inf) >= self._quorum:
            self._wake()

    async def raised(self, chosen: int, timeout: float) -> None:
        """Wait until a majority raised its counter to *chosen* for us, every script of ours was answered,
        or *timeout* seconds passed (a dead minority does not hold the grant up)."""
        ends = _clock.now() + timeout
        while self.pending and (left := ends - _clock.now()) > 0:
            if sum(raised >= chosen for raised in self.fenced_to) >= self._quorum:
                return
            await self.changed(left)

    async def settled(self, timeout: float) -> None:
        """Wait until every script of ours was answered, at most *timeout* seconds."""
        ends = _clock.now() + timeout
        while self.pending and (left := ends - _clock.now()) > 0:
            await self.changed(left)

    def poke(self) -> None:
        self.poked = True
        self._wake()

    def _wake(self) -> None:
        self.bell.ring()

    async def changed(self, timeout: float) -> None:
        """Return at the next reply or grant word (of any claim sharing our bell), or after *timeout* s."""
        await self.bell.wait(timeout)

    # -- deciding ---------------------------------------------------------------------

    def held(self, now: float) -> list[int]:
        """The nodes whose key holds our token for sure at *now*, and count (not sitting out)."""
        return [i for i, end in enumerate(self.ends) if end > now and sitting_out(self.nodes[i]) is None]

    def best_slot(self, now: float) -> tuple[int | None, list[int]]:
        """A permit claim: the slot that the most nodes of :meth:`held` hold for us, and those nodes (a
        permit is held once they are a majority: two holders of one slot would be two of one lock)."""
        by_slot: dict[int, list[int]] = {}
        for i in self.held(now):
            if (slot := self.slots[i]) is not None:
                by_slot.setdefault(slot, []).append(i)
        if not by_slot:
            return None, []
        slot = max(by_slot, key=lambda s: len(by_slot[s]))
        return slot, by_slot[slot]

    def votes(self, now: float, waited: float) -> tuple[list[_algorithm.Vote], list[str]]:
        """Each node's standing at *now*, as votes (with details) for ``Lock.outcomes`` and errors: yes
        (holds the key for us), quarantined (holds it, but sits out), no (answered: not ours), its
        failure's vote, or timeout (a script of ours still unanswered after *waited* seconds, the try's
        patience: its detail says which setting to change, as a fan-out's does)."""
        votes, details = [], []
        for i, node in enumerate(self.nodes):
            failed, detail = self._failed[i], ""
            if failed is not None:
                vote, detail = failed.vote, failed.detail
            elif self._busy[i]:
                vote, detail = _algorithm.Vote.TIMEOUT, timed_out(node, waited)
            elif self.ends[i] > now:
                quarantined = sitting_out(node)
                vote = _algorithm.YES if quarantined is None else _algorithm.Vote.QUARANTINED
                detail = quarantined or ""
            else:
                vote = _algorithm.NO
            votes.append(vote)
            details.append(detail)
        return votes, details

    def until(self, now: float, holders: Sequence[int] | None = None) -> float:
        """Until when a majority of the nodes that count (or of *holders*) hold the key for us (-inf: no
        majority)."""
        nodes = self.held(now) if holders is None else holders
        return _algorithm.majority_until((self.ends[i] for i in nodes), len(self.nodes))
