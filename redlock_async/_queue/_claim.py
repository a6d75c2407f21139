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

**Each primitive's line** (``_lines.Line``): which scripts a claim enters, stays and leaves with,
how a reply's and a word's last field are read, what "held" means. A lock's is :class:`LockLine` (a
node holds the key); a read/write lock's ``_lines.RwLine`` (a reader's key or the writer key); a
semaphore's ``_lines.PermitLine`` (a slot, held once a majority holds the same one).

**Scripts the server lost**: a leave is always sent again after NOSCRIPT, an entry or a give-back
not behind a later command on its key (``Script.creates``).

The queue keys of a lock key are the lock key followed by ``\\x00queue`` and ``\\x00waits`` and what keeps
them in its cluster slot (:func:`queue_keys`); they expire once no waiter entered them for an entry's life.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import time
from collections.abc import Callable, Sequence

from redlock_async._core import Settings, companion
from redlock_async._core import algorithm as _algorithm
from redlock_async._core import clock as _clock
from redlock_async._health import ClockGuard, floored
from redlock_async._nodes import ClusterVoter, Failure, Node, Reply, pack_script
from redlock_async._queue._fence import Counters
from redlock_async._queue._lines import KeyLine, Line, Packed
from redlock_async._rounds import sitting_out
from redlock_async._scripts import QUEUE_ENTER, QUEUE_LEAVE, QUEUE_STAY, Script

ENTRY_LIFE_MIN_MS = 1000
"""Shortest life of a waiter's entry on a node (it is entered again every retry delay)."""

ENTRY_LIFE_DELAYS = 5
"""An entry lives this many retry delays (at least ENTRY_LIFE_MIN_MS): a waiter re-enters it every
delay (at most 1.5 of them), so only a waiter that died or was cut off lets it expire."""


SUFFIXES = (b"\x00queue", b"\x00waits")
"""The kinds of a lock key's line and waits (``_names.companion``: the key, the kind, and what keeps them
in the key's cluster slot); no resource name holds their NUL (``_names.resource_key``)."""


def queue_keys(key: bytes, fence_key: bytes | None = None) -> tuple[bytes, ...]:
    """The lock key, its line and its waits (see the module's docstring), and the name's fencing counter
    when given: the grant scripts read it for a fenced waiter they grant the key to."""
    keys = _lines(key)
    return keys if fence_key is None else (*keys, fence_key)


@functools.lru_cache(maxsize=4096)
def _lines(key: bytes) -> tuple[bytes, bytes, bytes]:
    return key, companion(key, SUFFIXES[0]), companion(key, SUFFIXES[1])  # (a CRC16 each: kept for names in use)


LISTENING = b"\x00listening"
"""The kind of a channel's listening mark (a companion of the channel, a lock key: in its cluster slot): a key
that exists while someone subscribes to the channel (the listener sets it, with a ttl it refreshes). A
release that frees the key with no one in line publishes its word only where the mark exists
(``QUEUE_LEAVE``)."""


@functools.lru_cache(maxsize=4096)
def mark_key(channel: bytes) -> bytes:
    """The listening mark of *channel* (:data:`LISTENING`; a CRC16 each: kept for names in use)."""
    return companion(channel, LISTENING)


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


class LockLine(KeyLine):
    """A lock's line (``_lines.Line``): the lock key's own; a node holds the key for the waiter."""

    __slots__ = ("fenced", "keys")

    reads = False

    def __init__(self, key: bytes, fence_key: bytes | None) -> None:
        self.keys = queue_keys(key, fence_key)
        self.fenced = fence_key is not None

    def join(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        return QUEUE_ENTER, (token, ttl_ms, score, life_ms)

    def stay(self, token: bytes, ttl_ms: int, score: bytes, life_ms: int) -> Packed:
        return QUEUE_STAY, (token, score, life_ms, ttl_ms)

    def quit(self, token: bytes) -> Packed:
        return QUEUE_LEAVE, (token,)


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
    once a fence round raised the counters of a majority (:meth:`fence`; docs/fencing.md). *line*: the
    primitive's line (``_lines.Line``; by default a lock's, :class:`LockLine`): a semaphore
    waiter's holds a slot, a read/write lock waiter's its readers' hash entry or the writer key.
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
        guard: ClockGuard | None = None,
        line: Line | None = None,
    ) -> None:
        self.nodes = nodes
        self._guard = guard  # the clock guard: each reply's node time read, and grant words judged
        # Every script of a line replies with the node's time, read as it ran: the guard's reading of that node
        # before its vote counts, as a TIME sent right before it would be, and no TIME sent. (Not a Cluster
        # voter's: its scripts run on several servers, whose clocks are not one clock; it sends no TIME either.)
        self._clocked = [guard is not None and not isinstance(node, ClusterVoter) for node in nodes]
        self.token = token
        self.line = LockLine(key, fence_key) if line is None else line
        self.keys = self.line.keys
        self.fenced = settings.fencing and self.line.fenced
        self.reads = settings.fencing and self.line.reads  # a reader: counters read, none raised
        self._counts = self.fenced or self.reads  # a reply's or word's last field is a fencing counter
        # A fenced claim's counters are floored by the node's clock with fence_ttl, or where a node can evict them.
        floor = self.fenced and (settings.fence_ttl_ms is not None or floored(nodes))
        self.fencing = Counters(len(nodes), fence_key or b"", settings.fence_ttl_ms, floor=floor)
        """The fencing counters read and raised (a fenced claim's, a reader's; ``_queue_fence``)."""
        self._ttl = settings.ttl_ms / 1000
        self._drift = settings.drift_factor
        # Every entry's and give-back's: token, ttl, our place in line (the same on every node), entry's life.
        self._entry = (token, settings.ttl_ms, new_score() if score is None else score, entry_life_ms(settings))
        self.bell = Bell() if bell is None else bell
        """Rung at every reply and grant word: the claims of one acquire share one."""
        n = len(nodes)
        self._quorum = _algorithm.quorum(n)
        self.ends = [-math.inf] * n
        """Per node: until when its key holds our token for sure (our clock); -inf: not ours."""
        self.since = [math.inf] * n
        """Per node: when we learnt it holds our token (for the split grace); inf: it does not."""
        self._ref: list[tuple[float, int] | None] = [None] * n  # (our send time, node us when it ran)
        self._floor = [math.inf] * n  # words of grants at node times <= this are stale
        self.busy = [0] * n
        """Per node: our scripts on the wire there (grant words heard meanwhile wait for the reply)."""
        self._stash: list[tuple[int, int | None] | None] = [None] * n  # latest grant word heard while busy
        self.failed: list[Failure | None] = [None] * n
        """Per node: how its latest script failed (None: it did not; for outcomes)."""
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

    @property
    def counters(self) -> list[int | None]:
        """Per node: the largest fencing counter read there while the key held our token (``Counters.read``)."""
        return self.fencing.read

    @property
    def fenced_to(self) -> list[int]:
        """Per node: the fencing token our fence round raised its counter to (``Counters.fenced_to``)."""
        return self.fencing.fenced_to

    # -- sending ------------------------------------------------------------------

    def join(self) -> None:
        """Join (or stay in) every node's line; a node whose key is free grants it to its first waiter."""
        self._send(range(len(self.nodes)), *self.line.join(*self._entry))

    def give_back(self, nodes: Sequence[int]) -> None:
        """Give back what *nodes* granted us, and stay in their lines (a split: no majority came)."""
        for i in nodes:
            self._drop(i)
        self._send(nodes, *self.line.stay(*self._entry))

    def split(self, now: float) -> None:
        """What we hold at *now* short of a win goes back, and we stay in line (the nodes serve the first in
        line); what the line keeps (a permit: the slot most nodes gave us) starts its grace again."""
        keep, back = self.line.split(self.held(now), len(self.nodes))
        for i in keep:
            self.since[i] = now
        if back:
            self.give_back(back)

    def quit(self) -> None:
        """Leave every node's line; a key granted to us goes to the next waiter (synchronous: survives
        cancellation). Nothing of ours stays on the nodes once these ran, and nothing counts any more."""
        self.left = True
        self.ends = [-math.inf] * len(self.nodes)
        self.fencing.forget()
        self._send(range(len(self.nodes)), *self.line.quit(self.token))

    def fence(self, held: Sequence[int]) -> int:
        """Choose the fencing token (one more than the largest counter read on *held*, a majority that
        holds the key for us) and send QUEUE_FENCE on every node: it raises the counter to it where the
        key still holds our token (:attr:`fenced_to`), and its reply says where things stand, as an
        entry's does. Returns the token; the claim counts once a majority raised it (:meth:`fenced_on`)."""
        chosen, script, args, keys = self.fencing.round(self.keys[0], self.token, held)
        self._send(range(len(self.nodes)), script, args, keys, functools.partial(self._fence_answered, chosen))
        return chosen

    def fenced_on(self, now: float, chosen: int) -> list[int]:
        """The nodes that hold the key for us at *now* (and count) and raised their counter to *chosen*."""
        return [i for i in self.held(now) if self.fenced_to[i] >= chosen]

    def _send(
        self,
        nodes: Sequence[int],
        script: Script,
        args: tuple[bytes | int, ...],
        keys: tuple[bytes, ...] | None = None,
        answer: Callable[[int, float, Reply], None] | None = None,
    ) -> None:
        keys = self.keys if keys is None else keys
        packed = pack_script(script, keys, args)
        fallback = (script, keys, args)
        receiver = _Request(self._answered if answer is None else answer, _clock.now())
        # No TIME before a script that can grant us the key: its reply carries the node's time (_answered).
        for i in nodes:
            self.busy[i] += 1
            self.pending += 1
            self.nodes[i].send_packed(receiver, i, packed, fallback=fallback)

    # -- hearing --------------------------------------------------------------------

    def _answered(self, i: int, sent: float, reply: Reply) -> None:
        self.busy[i] -= 1
        self.pending -= 1
        self.failed[i] = reply if isinstance(reply, Failure) else None
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
            if self._clocked[i]:
                # The clock guard reads the node's time first: a node whose clock jumped ahead sits out
                # before this vote is counted, as with a TIME right before the script.
                assert self._guard is not None
                self._guard.read(sent, i, [node_us // 1_000_000, node_us % 1_000_000])
            self.line.replied(i, reply[0])
            self._ref[i] = (sent, node_us)
            self._floor[i] = node_us
            if self.busy[i]:
                pass  # a later script of ours is on the wire (a give-back?): its reply says where things stand
            elif isinstance(pttl, int) and pttl > 0:
                extra = reply[3] if len(reply) > 3 else None
                self.line.took(i, extra)  # (a permit's slot)
                if self._counts:
                    # Read while the key held our token: every grant before ours there had ended.
                    self.fencing.count(i, extra, node_us)
                new = self._holds(i, _algorithm.held_until(sent, pttl / 1000, self._drift), None)
            else:
                self._drop(i)
        if not self.busy[i] and (stashed := self._stash[i]) is not None:
            self._stash[i] = None
            new = self._granted(i, *stashed) or new
        if new or not self.pending:
            self._wake_for_grant()

    def _fence_answered(self, chosen: int, i: int, sent: float, reply: Reply) -> None:
        """A reply to our fence round: as an entry's, and where it raised the counter, say so."""
        self._answered(i, sent, reply)
        raised = isinstance(reply, list) and len(reply) > 3 and reply[0] == 1
        if raised and not self.busy[i] and not self.left and self.ends[i] > -math.inf:
            self.fencing.raised(i, chosen)
            self.bell.ring()
        elif not self.pending:
            self.bell.ring()

    def heard(self, i: int, grant_us: int, counter: int | None = None) -> None:
        """Node *i* published a grant of the key to us, at its time *grant_us*, with the last field of its
        word (a lock's: the fencing counter it read in the same step, a permit's: the slot; None: the word
        carries none, from a client before fenced grants)."""
        if self.busy[i]:
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
        if self._counts and counter is None:
            return False  # no counter with it: the next entry's reply says where things stand
        if not self.line.took(i, counter):
            return False
        if self._counts:
            self.fencing.count(i, counter, grant_us)
        sent, node_us = ref
        # The grant's time on the node, mapped to ours through the latest reply, and capped at a ttl from
        # now (the grant came before we heard it): a clock that stepped ahead since that reply and went
        # unseen (no guard, or no reading yet) stretches the mapping by the step, the cap by the word's trip.
        end = min(
            _algorithm.held_until(sent, (grant_us - node_us) / 1e6 + self._ttl, self._drift),
            _algorithm.held_until(now, self._ttl, self._drift),
        )
        return self._holds(i, end, now)

    def _holds(self, i: int, end: float, now: float | None) -> bool:
        """Node *i* holds the key for us until *end*, if later than we knew; True when it newly does (since
        *now*, or the clock's now)."""
        if end <= self.ends[i]:
            return False
        new = self.ends[i] == -math.inf
        if new:
            self.since[i] = _clock.now() if now is None else now
        self.ends[i] = end
        return new

    def _drop(self, i: int) -> None:
        """Node *i* no longer holds the key for us (or we cannot tell): what we knew of it goes."""
        self.ends[i], self.since[i] = -math.inf, math.inf
        self.fencing.drop(i)
        self.line.drop(i)

    def _wake_for_grant(self) -> None:
        """Wake the waiter if what changed may decide: every script answered, a majority holds, or (eager)
        any new grant."""
        if self.eager or not self.pending or len(self.ends) - self.ends.count(-math.inf) >= self._quorum:
            self.bell.ring()

    async def raised(self, chosen: int, timeout: float) -> None:
        """Wait until a majority raised its counter to *chosen* for us, every script of ours was answered,
        or *timeout* seconds passed (a dead minority does not hold the grant up)."""
        ends = _clock.now() + timeout
        while self.pending and (left := ends - _clock.now()) > 0:
            if self.fencing.raised_on(chosen) >= self._quorum:
                return
            await self.bell.wait(left)

    def poke(self) -> None:
        self.poked = True
        self.bell.ring()

    # -- deciding ---------------------------------------------------------------------

    def held(self, now: float) -> list[int]:
        """The nodes whose key holds our token for sure at *now*, and count (not sitting out). A node that
        sits out only until its first recheck (``Node.vouching``) rings the bell once that has decided: a
        node another client marked in service meanwhile counts at once, not at the next reply or retry."""
        held = []
        for i, end in enumerate(self.ends):
            if end > now:
                node = self.nodes[i]
                if sitting_out(node) is None:
                    held.append(i)
                elif (vouching := node.vouching) is not None and self.bell.ring not in vouching:
                    vouching.append(self.bell.ring)
        return held

    def holding(self, now: float) -> list[int]:
        """The nodes of :meth:`held` a win is counted on (a permit: those of the slot most of them hold for
        us; two holders of one slot would be two of one lock)."""
        return self.line.holding(self.held(now))

    def until(self, now: float, holders: Sequence[int] | None = None) -> float:
        """Until when a majority of the nodes that count (or of *holders*) hold the key for us (-inf: no
        majority)."""
        nodes = self.held(now) if holders is None else holders
        return _algorithm.majority_until((self.ends[i] for i in nodes), len(self.nodes))
