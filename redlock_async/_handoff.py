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
class _Channel:
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    woken: bool = False  # a waiter was woken and is trying; the others wait their turn
    users: int = 0  # waiters between enter() and leave()


def vote_of_subscribe(reply: Reply) -> Vote:
    if isinstance(reply, Failure):
        return reply.vote
    return Vote.YES if isinstance(reply, list) and reply and reply[0] == b"subscribe" else Vote.NO


class Listener:
    """Release notifications for the waiters of one Redlock."""

    def __init__(self, node_timeout: float) -> None:
        self._node_timeout = node_timeout
        self.nodes: Sequence[Node] = ()
        self._channels: dict[bytes, _Channel] = {}
        self.wakeups = 0
        """Waiters woken by a notification (for tests and benchmarks)."""

    # -- waiters' side ----------------------------------------------------------------

    async def enter(self, channel: bytes) -> None:
        """Listen for releases on *channel*; returns once the nodes confirmed, or after the node timeout."""
        state = self._channels.setdefault(channel, _Channel())
        state.users += 1
        if state.users > 1:
            return  # already subscribed (or being subscribed) for another waiter
        futures = [node.send(b"SUBSCRIBE", channel) for node in self.nodes]
        await Ballot(self.nodes, futures, vote_of_subscribe, self._node_timeout, majority=False).wait()

    def leave(self, channel: bytes) -> None:
        """Stop listening (synchronous, safe in cleanup)."""
        state = self._channels.get(channel)
        if state is None:
            return
        state.users -= 1
        if state.users <= 0:
            del self._channels[channel]
            for node in self.nodes:
                node.send(b"UNSUBSCRIBE", channel)

    async def wait(self, channel: bytes, timeout: float, *, again: bool = False) -> bool:
        """Wait for this waiter's turn after a release, at most *timeout* seconds; True when woken.

        *again*: this waiter was woken last time and lost the race (to a client
        of another Redlock): its turn is over, and it keeps its place at the front.
        """
        state = self._channels[channel]
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if again:
            state.woken = False
            state.waiters.appendleft(fut)
        else:
            state.waiters.append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            if not fut.done():
                state.waiters.remove(fut)

    def done(self, channel: bytes) -> None:
        """The woken waiter finished trying (acquired or gave up): the next release wakes the next one."""
        state = self._channels.get(channel)
        if state is not None:
            state.woken = False

    # -- the nodes' side ---------------------------------------------------------------

    def on_message(self, message: list[bytes]) -> None:
        """A release was published: wake the oldest waiter of that channel, unless one is trying."""
        state = self._channels.get(message[1])
        if state is None or state.woken:
            return
        while state.waiters:
            fut = state.waiters.popleft()
            if not fut.done():
                state.woken = True
                fut.set_result(None)
                self.wakeups += 1
                return

    def on_connect(self, node: Node) -> None:
        """A subscriber connection (re)connected: subscribe it to every channel still wanted."""
        for channel in self._channels:
            node.send(b"SUBSCRIBE", channel)
