"""Pushed hand-off: waiters are woken by a release instead of polling blindly.

The release script publishes on the lock key's channel on each node after
it deleted the key. A Redlock has one :class:`Listener` with one subscriber
connection per node, shared by all its waiters and multiplexed by channel.
Subscriber connections are :class:`Node`\\ s like the others (bounded
connects, reconnects, non-blocking sends): ``SUBSCRIBE`` answers with one
confirmation, and pub/sub messages are handed to the listener. After a
reconnect, the node re-subscribes to every channel still wanted.

Waiters of a channel queue in order. A release wakes only the oldest
waiter, and further messages for that channel (the same release, published
by the other nodes) are ignored until it has tried: no stampede, and no
split votes between waiters of the same Redlock. Notifications can be lost
(a node restarts, a connection drops, a lease expires instead of being
released), so every wait also ends after a bounded, jittered delay.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from redlock_async._algorithm import Vote
from redlock_async._fanout import Ballot
from redlock_async._node import Failure, Node, Reply


@dataclass
class _Queue:
    """The waiters of one key, shared by every Redlock of this event loop on the same nodes."""

    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    woken: bool = False  # a waiter was woken and is trying; the others wait their turn
    released: bool = False  # a release came while no one was queued: the next waiter goes at once
    users: int = 0  # waiters between enter() and leave(), across Redlocks
    # Releases already heard from a majority (by any Redlock's listener): the late
    # words of those are stale, and must not wake anyone again.
    heard: deque[bytes] = field(default_factory=lambda: deque(maxlen=8))


# One queue per (event loop, nodes, key): two Redlocks of one process on the
# same nodes share their waiters' order, so a release wakes one waiter, not one
# per Redlock racing each other (the same one would win every time).
_queues: dict[tuple[asyncio.AbstractEventLoop, tuple[str, ...], bytes], _Queue] = {}


def vote_of_subscribe(reply: Reply) -> Vote:
    if isinstance(reply, Failure):
        return reply.vote
    return Vote.YES if isinstance(reply, list) and reply and reply[0] == b"subscribe" else Vote.NO


class Listener:
    """Release notifications for the waiters of one Redlock."""

    def __init__(self, node_timeout: float, scope: tuple[str, ...]) -> None:
        self._node_timeout = node_timeout
        self._scope = scope  # the nodes, sorted: Redlocks on the same nodes share queues
        self.nodes: Sequence[Node] = ()
        self._subscribed: dict[bytes, int] = {}  # channel -> this Redlock's waiters on it
        # channel -> released token -> nodes that announced it: a waiter is woken
        # once a majority did, so its attempt finds a majority free.
        self._heard: dict[bytes, dict[bytes, int]] = {}
        self.wakeups = 0
        """Waiters woken by a notification (for tests and benchmarks)."""

    def _queue(self, channel: bytes) -> _Queue | None:
        return _queues.get((asyncio.get_running_loop(), self._scope, channel))

    # -- waiters' side ----------------------------------------------------------------

    def waiting(self, channel: bytes) -> bool:
        """True when waiters already queue for *channel*: a newcomer joins them, it does not jump ahead."""
        queue = self._queue(channel)
        return queue is not None and (bool(queue.waiters) or queue.woken)

    async def enter(self, channel: bytes) -> bool:
        """Listen for releases on *channel*; True when this subscribed anew (then look again once).

        Returns once the nodes confirmed, or after the node timeout.
        """
        key = (asyncio.get_running_loop(), self._scope, channel)
        _queues.setdefault(key, _Queue()).users += 1
        count = self._subscribed.get(channel, 0)
        self._subscribed[channel] = count + 1
        if count:
            return False  # already subscribed (or being subscribed) for another waiter
        futures = [node.send(b"SUBSCRIBE", channel) for node in self.nodes]
        await Ballot(self.nodes, futures, vote_of_subscribe, self._node_timeout, majority=False).wait()
        return True

    def leave(self, channel: bytes) -> None:
        """Stop listening (synchronous, safe in cleanup)."""
        key = (asyncio.get_running_loop(), self._scope, channel)
        queue = _queues.get(key)
        if queue is not None:
            queue.users -= 1
            if queue.users <= 0:
                del _queues[key]
        count = self._subscribed.get(channel, 0) - 1
        if count > 0:
            self._subscribed[channel] = count
            return
        self._subscribed.pop(channel, None)
        self._heard.pop(channel, None)
        for node in self.nodes:
            node.send(b"UNSUBSCRIBE", channel)

    async def wait(self, channel: bytes, timeout: float, *, again: bool = False) -> bool:
        """Wait for this waiter's turn after a release, at most *timeout* seconds; True when woken.

        *again*: this waiter was woken last time and lost the race (to a client
        elsewhere): its turn is over, and it keeps its place at the front.
        """
        queue = self._queue(channel)
        assert queue is not None, "wait() between enter() and leave()"
        if again:
            queue.woken = False
        if queue.released and not queue.woken:
            # A release came between our last attempt and now (nobody was queued to hear it).
            queue.released = False
            queue.woken = True
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if again:
            queue.waiters.appendleft(fut)
        else:
            queue.waiters.append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            pass  # the fallback: no word came (or it came in the same loop turn: see below)
        finally:
            # The timer (or a cancellation) cancels the future being awaited: then it
            # is still queued, and must leave; a woken one was taken off the queue.
            if fut in queue.waiters:
                queue.waiters.remove(fut)
        # Woken even if the timer fired too (same loop turn): then it is our turn, and done() must follow.
        return fut.done() and not fut.cancelled()

    def done(self, channel: bytes) -> None:
        """The woken waiter finished trying (acquired or gave up): the next release wakes the next one."""
        queue = self._queue(channel)
        if queue is not None:
            queue.woken = False

    # -- the nodes' side ---------------------------------------------------------------

    def on_message(self, message: list[bytes]) -> None:
        """A node released a key: once a majority did, wake the oldest waiter, unless one is trying.

        Waking on the first node's word would send the waiter's SETs ahead of
        the release on slower nodes: it would lose, and the rest of the words,
        arriving while it tried, would be ignored.
        """
        channel, token = message[1], message[2]
        queue = self._queue(channel)
        if queue is not None and token in queue.heard:
            # A late word of a release that another Redlock's listener of this process
            # already counted to a majority: it woke a waiter then, not again now.
            return
        heard = self._heard.setdefault(channel, {})
        count = heard.get(token, 0) + 1
        if count < len(self.nodes) // 2 + 1:
            heard[token] = count
            if len(heard) > 64:  # words of partial give-backs that never reach a majority
                heard.clear()
            return
        del self._heard[channel]  # older partial counts are moot after a majority release
        if queue is None:
            return
        queue.heard.append(token)
        if queue.woken:
            return
        while queue.waiters:
            fut = queue.waiters.popleft()
            if not fut.done():
                queue.woken = True
                fut.set_result(None)
                self.wakeups += 1
                return
        queue.released = True  # heard by no one yet: the next waiter must not wait for the next one

    def on_connect(self, node: Node) -> None:
        """A subscriber connection (re)connected: subscribe it to every channel still wanted."""
        for channel in self._subscribed:
            node.send(b"SUBSCRIBE", channel)
