"""Pushed hand-off: waiters are woken by a release instead of polling blindly.

The release script publishes on the lock key's channel on each node after it deleted the key. A Redlock has one
:class:`Listener` with one subscriber connection per node, shared by all its waiters and multiplexed by channel.
Subscriber connections are :class:`Node`\\ s like the others (bounded connects, reconnects, non-blocking sends):
``SUBSCRIBE`` answers with one confirmation, and pub/sub messages are handed to the listener. After a reconnect, the
node re-subscribes to every channel still wanted.

Waiters of a channel wait in order, in a :class:`~redlock_async._core._lot.ParkingLot`. A release heard from a
majority wakes only the oldest waiter, and further messages for that channel (the same release, published by the
other nodes) are ignored until it has tried: no stampede, and no split votes between waiters of the same Redlock.
Notifications can be lost (a node restarts, a connection drops, a lease expires instead of being released), so every
wait also ends after a bounded, jittered delay.

A release publishes its word only where someone may hear it (``QUEUE_LEAVE``): a subscriber first sets the channel's
listening mark on every node (:class:`Marks`) on the command connection, ahead of its next look at the key: a
release after that look publishes, and one before it is seen by the look. (On a Cluster voter, the words go by
sharded pub/sub: ``_nodes/_pubsub.py``.)"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from redlock_async._core import ParkingLot, Vote, Waits, quorum
from redlock_async._nodes import IGNORED, Failure, Node, Reply, pack, tell_refused
from redlock_async._queue import Grants, is_grant, mark_key
from redlock_async._rounds import Ballot, Sent


class Taker(NamedTuple):
    """A waiting lock that a release of its own Redlock can hand the lock over to."""

    presend: Callable[[], Sent]
    """Send the lock's next round now (synchronous)."""
    give_back: Callable[[Sent], None]
    """Give back a round sent for it that its waiter will never count."""


YIELD_ROUND_TRIPS, YIELD_MIN, YIELD_MAX = 4, 0.005, 0.02
"""The grace a chain's last release gives other processes' waiters: a few round trips, 5-20 ms."""

LINGER = 1.0
"""Seconds a subscription no one uses any more is kept: contention comes in bursts, and a waiter
that finds it kept needs no SUBSCRIBE round trip (and the last one out sends no UNSUBSCRIBE)."""

MARK_TTL, MARK_EVERY = 3.0, 1.0
"""Seconds a listening mark lives on a node unless set again, and between its settings while wanted."""

MAX_CHAIN = 8
"""Hand-overs in a row on one key before a release goes to the waiters of every process again: the
round a release sends for the next waiter of its own Redlock reaches each node right behind the
release, ahead of any other client's, so without this bound a busy process would keep the lock."""


@dataclass
class _Channel:
    """The waiters of one key, shared by every Redlock of this event loop on the same nodes."""

    line: ParkingLot = field(default_factory=ParkingLot)  # in ticket order; a release wakes the oldest
    users: int = 0  # waiters between enter() and leave(), across Redlocks
    # Releases already heard from a majority (by any Redlock's listener): the late
    # words of those are stale, and must not wake anyone again.
    heard: deque[bytes] = field(default_factory=lambda: deque(maxlen=8))
    # ticket -> (its waiter's Listener, the waiter's lock): who may be handed the lock by a release.
    takers: dict[int, tuple[Listener, Taker]] = field(default_factory=dict)
    # ticket -> the round a release sent for it (handed over), until the waiter counts it or departs.
    handed: dict[int, tuple[Sent, Taker]] = field(default_factory=dict)
    chain: int = 0  # hand-overs in a row: after MAX_CHAIN, one release wakes everyone's waiters instead
    unsure: list[bytes] = field(default_factory=list)  # words heard while the woken one tried (see _settle)
    yielding: bool = False  # a release was left to other processes' waiters (_yield): ours wait the grace


# One _Channel per (event loop, nodes, key): two Redlocks of one process on the same nodes share their waiters'
# order, so a release wakes one waiter, not one per Redlock racing each other (the same one would win every time).
_Key = tuple[asyncio.AbstractEventLoop, tuple[str, ...], bytes]
_channels: dict[_Key, _Channel] = {}


def vote_of_subscribe(reply: Reply) -> Vote:
    if isinstance(reply, Failure):
        return reply.vote
    return Vote.YES if isinstance(reply, list) and reply and reply[0] == b"subscribe" else Vote.NO


class Marks:
    """The listening marks of one Redlock's channels (see the module's docstring)."""

    def __init__(self, wanted: Callable[[bytes], bool]) -> None:
        self.nodes: Sequence[Node] = ()
        """The command connections, one per node as the listener's: where the marks are set."""
        self._wanted = wanted  # True while anyone of this Redlock listens to the channel
        self._timers: dict[bytes, asyncio.TimerHandle] = {}  # channel -> the timer that sets it again

    def set(self, channel: bytes, node: Node | None = None) -> None:
        """Set *channel*'s mark on every node (or on *node*), and again every MARK_EVERY s while wanted; not
        waited for: it goes ahead of the next look at the key. A node that misses it (down, a timeout) may
        free the key without a word: its waiters look after their fallback delay, as after a word lost."""
        packed = pack((b"SET", mark_key(channel), b"1", b"PX", int(MARK_TTL * 1000)))
        for each in self.nodes if node is None else (node,):
            each.send_packed(IGNORED, 0, packed)
        if node is None:
            self.drop(channel)
            self._timers[channel] = asyncio.get_running_loop().call_later(MARK_EVERY, self._again, channel)

    def _again(self, channel: bytes) -> None:
        del self._timers[channel]
        if self._wanted(channel):
            self.set(channel)

    def again(self, i: int) -> None:
        """Node *i*'s subscriber connection (re)connected: set every wanted mark on it again (a restart?)."""
        for channel in tuple(self._timers) if self.nodes else ():
            self.set(channel, self.nodes[i])

    def drop(self, channel: bytes) -> None:
        """No one here listens to *channel* any more: its mark runs out (others may still listen)."""
        if (timer := self._timers.pop(channel, None)) is not None:
            timer.cancel()

    def close(self) -> None:
        for channel in tuple(self._timers):
            self.drop(channel)


class Listener:
    """Release notifications for the waiters of one Redlock."""

    def __init__(self, node_timeout: float, scope: tuple[str, ...]) -> None:
        self._node_timeout = node_timeout
        self._subscribed: dict[bytes, int] = {}  # channel -> this Redlock's waiters on it
        self._scope = scope  # the nodes, sorted: Redlocks on the same nodes share their waiters' lines
        self.nodes: Sequence[Node] = ()
        self.marks = Marks(self._subscribed.__contains__)
        # channel -> released token -> nodes that announced it: a waiter is woken
        # once a majority did, so its attempt finds a majority free.
        self._heard: dict[bytes, dict[bytes, int]] = {}
        # This Redlock's waits: interrupt() ends them at once; they count the waiters woken.
        self._waits = Waits()
        # channel -> the timer that unsubscribes it: no one uses it, but it is kept a while (LINGER).
        self._lingering: dict[bytes, asyncio.TimerHandle] = {}
        # channel -> callbacks told of every message on it (election observers); no waiter state.
        self._watchers: dict[bytes, list[Callable[[], None]]] = {}
        self.grants = Grants()
        """The claims of this Redlock's waiters in the nodes' grant queue, which grant words go to."""
        # Its failed tries' words (SHA1 of their tokens): a try a majority said yes to but that failed (nodes in
        # quarantine) gives its keys back on a majority; those words woke its waiter again, every round trip.
        self._own: deque[bytes] = deque(maxlen=16)

    @property
    def wakeups(self) -> int:
        """Waiters woken by a notification, or handed the lock by a grant of the queue (for tests and
        benchmarks)."""
        return self._waits.wakeups

    def gives_back(self, token: bytes) -> None:
        """A try of this Redlock's with *token* failed (or may give its keys back): the release words of that
        token are not a release to wake a waiter of this Redlock on."""
        self._own.append(hashlib.sha1(token).hexdigest().encode())

    def granted(self) -> None:
        """A waiter in the grant queue was handed the lock by grants while it waited (a wake-up)."""
        self._waits.wakeups += 1

    def _state(self, channel: bytes) -> _Channel | None:
        return _channels.get((asyncio.get_running_loop(), self._scope, channel))

    # -- waiters' side ----------------------------------------------------------------

    def waiting(self, channel: bytes) -> bool:
        """True when waiters already state for *channel* (one of them may be trying now)."""
        state = self._state(channel)
        return state is not None and state.line.waiting

    def taking(self, channel: bytes) -> bool:
        """True when the line for *channel* is taking the key now: a release woke (or handed the lock to)
        a waiter that is trying, or was left to other processes' waiters for a grace (:func:`_yield`).
        A newcomer then joins the line without trying: the release is theirs. Otherwise it tries at
        once: waiters that only wait for their timer (the key expired, or its release went unheard)
        may be waiting for a word that never comes."""
        state = self._state(channel)
        return state is not None and (state.line.taking or state.yielding)

    async def subscribe(self, channel: bytes, *, mark: bool = False) -> bool:
        """Listen for releases on *channel*; True when this subscribed anew (then look again once).
        *mark*: *channel* is a lock key, whose releases speak only where it is marked (:class:`Marks`).

        Returns once the nodes confirmed, or after the node timeout.
        """
        key = (asyncio.get_running_loop(), self._scope, channel)
        _channels.setdefault(key, _Channel()).users += 1
        count = self._subscribed.get(channel, 0)
        self._subscribed[channel] = count + 1
        if count:
            return False  # already subscribed (or being subscribed) for another waiter
        if mark:
            self.marks.set(channel)  # before the look again that follows: a release after it publishes
        if (kept := self._lingering.pop(channel, None)) is not None:
            # Still subscribed on the nodes, since before this waiter's try. Its words were
            # ignored meanwhile (no one listened), so look again once, as after a new subscription.
            kept.cancel()
            return True
        futures = [self._subscribe(node, channel) for node in self.nodes]
        await Ballot.of(self.nodes, futures, vote_of_subscribe, self._node_timeout, majority=False).wait()
        return True

    def _subscribe(self, node: Node, channel: bytes) -> asyncio.Future[Reply]:
        """SUBSCRIBE *channel* on *node*; when it has run (or failed), the claims waiting on the channel
        enter again (:meth:`_subscribed`)."""
        fut = node.send(b"SUBSCRIBE", channel)
        fut.add_done_callback(functools.partial(self._subscribed_on, channel))
        fut.add_done_callback(functools.partial(tell_refused, node))
        return fut

    def _subscribed_on(self, channel: bytes, _: asyncio.Future[Reply]) -> None:
        """A node ran (or failed) our SUBSCRIBE to *channel*: a grant it published before then went
        unheard, so the claims waiting on the channel enter again, and the replies say where the key
        is theirs; its watchers are called as for a word. (A claim that entered after the subscription
        was in place needs nothing: no confirmation comes after its entry.)"""
        self.grants.poke(channel)
        for callback in tuple(self._watchers.get(channel, ())):
            callback()  # an observer looks again: a word said before the subscription went unheard

    def unsubscribe(self, channel: bytes) -> None:
        """Stop listening (synchronous, safe in cleanup)."""
        key = (asyncio.get_running_loop(), self._scope, channel)
        state = _channels.get(key)
        if state is not None:
            state.users -= 1
            if state.users <= 0:
                del _channels[key]
        self._release(channel)

    async def wait(
        self, channel: bytes, timeout: float, place: int, *, again: bool = False, taker: Taker | None = None
    ) -> bool:
        """Wait for this waiter's turn after a release, at most *timeout* seconds; True when woken.

        *place* is the waiter's ticket: it waits in line by it, so a waiter
        whose fallback timer fired comes back to its place, not to the tail.
        *again*: this waiter was woken last time and lost the race (to a client
        elsewhere): its turn is over. *taker*: the waiting lock, which a release of this
        Redlock may hand the lock over to (then :meth:`handed` has the round it sent).
        """
        state = self._state(channel)
        assert state is not None, "wait() between enter() and leave()"
        if taker is not None:
            state.takers[place] = (self, taker)
        if again:
            _settle(state, self._own, self._waits)
            self._waits.wakeups += state.line.done()
        return await state.line.wait(place, timeout, self._waits)

    def interrupt(self) -> None:
        """End every wait of this Redlock's waiters now, as not woken (its Redlock stopped on a fault):
        they look at their Redlock at once instead of after their fallback delay."""
        self._waits.interrupt()
        self.grants.poke_all()  # waiters in the grant queue too: their wait ends, and they look

    def depart(self, channel: bytes, place: int) -> None:
        """The waiter with ticket *place* stops waiting (acquired, gave up, cancelled): it leaves the line.

        If it was woken between two waits and never tried, the turn passes on.
        """
        state = self._state(channel)
        if state is None:
            return
        state.takers.pop(place, None)
        handed = state.handed.pop(place, None)
        if handed is not None:
            sent, taker = handed
            taker.give_back(sent)  # sent for us, never counted: nothing may stay behind
        if state.line.turn == place:
            _settle(state, self._own, self._waits)  # it was trying: the releases heard meanwhile still count
        self._waits.wakeups += state.line.depart(place)

    def handed(self, channel: bytes, place: int) -> Sent | None:
        """The round a release sent for the waiter with ticket *place* when it handed it the lock, if one did."""
        state = self._state(channel)
        if state is None:
            return None
        handed = state.handed.pop(place, None)
        return None if handed is None else handed[0]

    def may_hand_over(self, channel: bytes, word: bytes) -> bool:
        """True when a release of *channel*, now, hands the lock over (:meth:`hand_over`): the next in
        line waits in this Redlock, and fewer than MAX_CHAIN hand-overs came in a row.

        At MAX_CHAIN the count starts again, and this release (whose *word* it publishes) goes to the
        waiters of other processes first: its words wake no waiter of this process, whose oldest
        waiter is woken a grace later (:func:`_yield`). Otherwise this busy process, awake when the
        release's replies come, would hear its words first and win that race too."""
        state = self._state(channel)
        if state is None or state.line.taking or (place := state.line.first()) is None:
            return False
        if not state.line.parked(place):
            return False  # between two waits (its fallback timer fired): it is trying, the release is its turn
        owner = state.takers.get(place)
        if owner is None or owner[0] is not self:
            return False  # the next in line waits in another Redlock: it hears the release
        if state.chain >= MAX_CHAIN:
            state.chain = 0
            _yield((asyncio.get_running_loop(), self._scope, channel), state, self.nodes, self._waits, word)
            return False
        return True

    def hand_over(self, channel: bytes, word: bytes) -> None:
        """Right after a release of *channel* that :meth:`may_hand_over` allowed was queued (it tells no
        one): send the next waiter's round now, behind the release on every connection, and wake that
        waiter to count it (:meth:`handed`).

        One round trip, the release's, instead of two (the release, its words, then the woken
        waiter's round): the waiter's SET reaches each node right after the key was deleted there,
        ahead of any other client's. It is that waiter's own acquire, only sent sooner, so it is
        exactly as safe; a round it loses is given back as any other, and then the release's *word*
        (what it would have published) is published on every node, so waiters elsewhere hear of it.
        """
        state = self._state(channel)
        assert state is not None, "hand_over() only right after may_hand_over()"
        place = state.line.first()
        assert place is not None, "hand_over() only right after may_hand_over()"
        taker = state.takers[place][1]
        sent = taker.presend()
        sent.announce = (channel, word)
        state.handed[place] = (sent, taker)
        state.chain += 1
        self._waits.wakeups += state.line.wake()

    def done(self, channel: bytes) -> None:
        """The woken waiter finished trying (acquired or gave up): the next release wakes the next one."""
        state = self._state(channel)
        if state is not None:
            _settle(state, self._own, self._waits)
            self._waits.wakeups += state.line.done()

    def share(self, channel: bytes) -> None:
        """A waiter that shares what it took (a reader of a read/write lock) got in: the next waiter of
        *channel* may get in too, so it is woken now instead of at the next release (the readers waiting
        in this process go together, one after the other, each woken by the one before)."""
        state = self._state(channel)
        if state is not None and state.line.waiters and not state.line.taking:
            self._waits.wakeups += state.line.wake()

    def _release(self, channel: bytes) -> None:
        """One user of *channel* less (a waiter, or the watchers): the last one unsubscribes."""
        count = self._subscribed.get(channel, 0) - 1
        if count > 0:
            self._subscribed[channel] = count
            return
        self._subscribed.pop(channel, None)
        self._heard.pop(channel, None)
        self.marks.drop(channel)
        # Kept a while: the next waiter (often the same task, wanting the lock again) needs no new
        # subscription, and the one leaving sends nothing on its way out.
        loop = asyncio.get_running_loop()
        self._lingering[channel] = loop.call_later(LINGER, self._unsubscribe, channel)

    def _unsubscribe(self, channel: bytes) -> None:
        """No one used *channel* for LINGER seconds: unsubscribe."""
        del self._lingering[channel]
        for node in self.nodes:
            node.send(b"UNSUBSCRIBE", channel)

    def close(self) -> None:
        """The Redlock closes: its claims leave the nodes' lines (queued before the connections close; a key
        granted meanwhile goes on) and are poked, so their waiters look at their Redlock now; the kept
        subscriptions are forgotten (their connections close too)."""
        self.grants.quit_all()
        for timer in self._lingering.values():
            timer.cancel()
        self._lingering.clear()
        self.marks.close()

    # -- observers' side -----------------------------------------------------------------

    def watch(self, channel: bytes, callback: Callable[[], None], *, mark: bool = False) -> None:
        """Call *callback* (synchronous, cheap) on every message on *channel*, from any node (*mark*: as
        for :meth:`subscribe`)."""
        callbacks = self._watchers.setdefault(channel, [])
        callbacks.append(callback)
        if len(callbacks) == 1:
            count = self._subscribed.get(channel, 0)
            self._subscribed[channel] = count + 1
            if count:
                return
            if mark:
                self.marks.set(channel)  # before the observer's next look
            if (kept := self._lingering.pop(channel, None)) is not None:
                kept.cancel()  # still subscribed: keep it, for as long as someone watches
                return
            for node in self.nodes:
                self._subscribe(node, channel)

    def unwatch(self, channel: bytes, callback: Callable[[], None]) -> None:
        """Stop calling *callback* (synchronous, safe in cleanup)."""
        callbacks = self._watchers.get(channel)
        if not callbacks or callback not in callbacks:
            return
        callbacks.remove(callback)
        if callbacks:
            return
        del self._watchers[channel]
        self._release(channel)

    # -- the nodes' side ---------------------------------------------------------------

    def on_message(self, message: list[bytes], node: int | None = None) -> None:
        """A node released a key: once a majority did, wake the oldest waiter, unless one is trying.

        Waking on the first node's word would send the waiter's SETs ahead of
        the release on slower nodes: it would lose, and the rest of the words,
        arriving while it tried, would be ignored. A grant word (``g<digest>:<node time>:<counter>``,
        from a node's grant queue) goes to the claim it names, with the index of the *node*
        whose subscriber connection heard it.
        """
        channel, token = message[1], message[2]
        grant = is_grant(token)
        if grant and node is not None:
            self.grants.route(channel, token, node)
        if channel not in self._subscribed or (self._own and token in self._own):
            return  # a late word for a channel no waiter of ours wants any more, or our own give-back's
        watchers = self._watchers.get(channel)
        if watchers:
            for callback in list(watchers):
                callback()
        if grant:
            return  # a grant (to us or to another waiter): the key is not free
        state = self._state(channel)
        if watchers and state is None:
            return  # only observed: no waiter to wake, nothing to count
        if state is not None and token in state.heard:
            # A late word of a release that another Redlock's listener of this process
            # already counted to a majority: it woke a waiter then, not again now.
            return
        heard = self._heard.setdefault(channel, {})
        count = heard.get(token, 0) + 1
        if count < quorum(len(self.nodes)):
            heard[token] = count
            if len(heard) > 64:  # words of partial give-backs that never reach a majority
                heard.clear()
            return
        heard.pop(token, None)  # counted; other releases on the channel (a semaphore's) still count on
        if not heard:
            del self._heard[channel]
        self.grants.poke(channel)  # freed by a client without the queue: the nodes hand it on when entered again
        if state is None:
            return
        state.heard.append(token)
        state.chain = 0
        if state.line.woken:
            return state.unsure.append(token)  # told apart when the try is over (_settle)
        self._waits.wakeups += state.line.release()

    def on_connect(self, node: Node) -> None:
        """A subscriber connection (re)connected: subscribe it to every channel still wanted (and set their
        marks on the node again: it may have restarted)."""
        self.marks.again(self.nodes.index(node))
        for channel in (*self._subscribed, *self._lingering):
            self._subscribe(node, channel)  # the claims on it enter again once it ran: words were lost meanwhile

    def remembered(self) -> int:
        """How many channels have release words counted short of a majority (for tests): only those a waiter of
        this Redlock listens on, each forgotten when its last waiter leaves (no growth with every name)."""
        return len(self._heard)

    def parked(self, channel: bytes) -> bool:
        """True when the oldest waiter of *channel* awaits a word now, not between two looks (for tests)."""
        state = self._state(channel)
        return state is not None and (first := state.line.first()) is not None and state.line.parked(first)


def _settle(state: _Channel, own: deque[bytes], waits: Waits) -> None:
    """The woken waiter (of the Listener whose failed tries' words are *own*) is done trying: each release heard from
    a majority meanwhile that was not its try's own give-back (its words may come before the try ends) counts now."""
    if state.unsure:
        words, state.unsure = state.unsure, []
        for word in words:
            if word not in own:
                waits.wakeups += state.line.release()


def _yield(key: _Key, state: _Channel, nodes: Sequence[Node], waits: Waits, word: bytes) -> None:
    """Let waiters elsewhere have this release: its words are ignored here, and this process's oldest waiter
    (of channel *key*) is woken after a grace of a few round trips (if no release woke it meanwhile)."""
    state.heard.append(word)
    state.yielding = True  # newcomers of this process do not take it meanwhile either
    rtt = max((node.load.srtt for node in nodes), default=0.0)
    grace = min(max(YIELD_ROUND_TRIPS * rtt, YIELD_MIN), YIELD_MAX)

    def wake() -> None:
        state.yielding = False
        if _channels.get(key) is state and not state.line.taking:
            waits.wakeups += state.line.wake()

    asyncio.get_running_loop().call_later(grace, wake)
