"""``wait_replicas=N``: a yes counts only once N replicas acknowledged the write that made it.

Redisson's approach, offered as an availability knob: a node's yes (an acquire, an extension, a permit, a
reader's or writer's key: every command sent ``limited``, which is what a vote is) is followed on the same
connection by ``WAIT N timeout``; the yes is handed to its ballot only when the WAIT says at least N
replicas have the write, and becomes a failed vote otherwise (the failed acquire's cleanup then removes
the key, as for any node that did not answer in time). On a Cluster voter each shard primary's connection
has its own outbox, so the WAIT goes to the primary that took the write, the importing one for a vote
redirected by ``ASK`` (``ClusterVoter.redirected`` sends it behind ``ASKING`` with
:meth:`ReplicatedOutbox.send_waited`).

It is not what makes a failover safe: the quarantine is (docs/algorithm.md). A replica may still be
promoted without the write (an asynchronous replica acknowledged and then was not the one promoted, or
``WAIT`` met a replica that lost it later), and a node that fails over sits out all the same. What it buys
is that a lock's key usually survives a failover, so a holder keeps a majority where it would otherwise
lose one, at the cost of a replica's round trip on every vote, and of every vote of a node while its
replicas are down or lagging (the node's connection waits up to *timeout* on each WAIT, one per write:
every vote queued in one loop turn shares it, as ``WAIT`` covers all the connection's earlier writes; the
server checks a WAIT's timeout every ``1/hz`` s, 100 ms by default, so it may hold the connection that
long: the ballot's own deadline still decides the vote in time). A reply that is not a failure is held
whatever it says: a no (a key held by another) with too few acknowledgements is a failed vote too.

Nothing of this runs unless the setting is given: the node then has a :class:`ReplicatedOutbox` in place
of the plain :class:`_outbox.Outbox` (``replicated_outbox``), and every node without it sends exactly as
before.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from redlock_async._core import Vote
from redlock_async._nodes._load import NodeLoad
from redlock_async._nodes._outbox import Entry, Outbox
from redlock_async._nodes._wire import IGNORED, Failure, Fallback, Receiver, Reply, pack

OutboxMaker = Callable[[NodeLoad, Callable[[], asyncio.AbstractEventLoop], Callable[[BaseException], None]], Outbox]
"""What ``Node`` makes its outbox with: the plain :class:`Outbox`, or :func:`replicated_outbox`'s."""


def wait_ms(node_timeout: float) -> int:
    """The timeout of each ``WAIT`` in milliseconds: the node timeout, at least 1 (``WAIT``'s 0 waits forever)."""
    return max(1, math.ceil(node_timeout * 1000))


def replicated_outbox(replicas: int, timeout_ms: int) -> OutboxMaker:
    """What makes a node's outbox when every vote of it waits for *replicas* replicas (up to *timeout_ms*)."""

    def make(
        load: NodeLoad, start: Callable[[], asyncio.AbstractEventLoop], broken: Callable[[BaseException], None]
    ) -> Outbox:
        return ReplicatedOutbox(load, start, broken, replicas=replicas, timeout_ms=timeout_ms)

    return make


class _Wait:
    """The receiver of one ``WAIT``: tells each vote it covers whether enough replicas acknowledged."""

    __slots__ = ("entry", "held", "outbox")

    def __init__(self, outbox: ReplicatedOutbox) -> None:
        self.outbox = outbox
        self.held: list[_Held] = []
        self.entry: Entry = (outbox.wait_command, self, 0, None)

    def deliver(self, index: int, reply: Reply, /) -> None:
        outbox = self.outbox
        if type(reply) is Failure:
            failure = Failure(reply.vote, f"WAIT for {outbox.replicas} replicas failed ({reply.detail})")
        elif isinstance(reply, int) and reply >= outbox.replicas:
            failure = None
        else:
            failure = Failure(
                Vote.TIMEOUT,
                f"{reply} of {outbox.replicas} replicas acknowledged the write within {outbox.timeout_ms} ms "
                f"(wait_replicas={outbox.replicas}): its yes does not count",
            )
        for held in self.held:
            held.waited(failure)


class _Held:
    """A vote's receiver in between: its reply is handed on once the ``WAIT`` behind it answered (a failure of
    the command itself at once: nothing was written, and a redirection must be followed)."""

    __slots__ = ("answered", "index", "outbox", "receiver", "reply", "waited_on")

    def __init__(self, outbox: ReplicatedOutbox, receiver: Receiver) -> None:
        self.outbox, self.receiver = outbox, receiver
        self.index = 0
        self.reply: Reply = None
        self.answered = False  # the command's reply came (and waits for its WAIT)
        self.waited_on = False  # the WAIT it was queued with answered (before the reply: a resent EVAL)

    def deliver(self, index: int, reply: Reply, /) -> None:
        if type(reply) is Failure:
            self.answered = self.waited_on = True  # done: nothing to wait for
            self.receiver.deliver(index, reply)
            return
        self.index, self.reply, self.answered = index, reply, True
        if self.waited_on:
            # Its WAIT ran before it (the server had lost the script: the EVAL sent again went behind it).
            self.waited_on = False
            self.outbox.wait_again(self)

    def waited(self, failure: Failure | None) -> None:
        if not self.answered:
            self.waited_on = True
            return
        if self.waited_on:
            return  # delivered already (a failure of its own)
        self.waited_on = True
        self.receiver.deliver(self.index, self.reply if failure is None else failure)


class ReplicatedOutbox(Outbox):
    """An :class:`Outbox` whose votes (commands sent ``limited``) each go with a ``WAIT`` behind them, one per
    write: a vote queued while the last ``WAIT`` still waits to be written moves it behind itself."""

    __slots__ = ("_open_wait", "replicas", "timeout_ms", "wait_command")

    def __init__(
        self,
        load: NodeLoad,
        start: Callable[[], asyncio.AbstractEventLoop],
        broken: Callable[[BaseException], None],
        *,
        replicas: int,
        timeout_ms: int,
    ) -> None:
        super().__init__(load, start, broken)
        self.replicas, self.timeout_ms = replicas, timeout_ms
        self.wait_command = pack((b"WAIT", replicas, timeout_ms))
        self._open_wait: _Wait | None = None  # the WAIT not written yet, last in pending

    def _take_open(self) -> _Wait | None:
        """The WAIT still last in line to be written, taken out of the line (put back behind the next vote)."""
        wait = self._open_wait
        pending = self.pending
        if wait is not None and pending and pending[-1] is wait.entry:
            pending.pop()
            return wait
        self._open_wait = None
        return None

    def wait_again(self, held: _Held) -> None:
        """A ``WAIT`` for *held* alone (its reply came after the WAIT it was queued with: see :class:`_Held`)."""
        wait = _Wait(self)
        wait.held.append(held)
        Outbox.send_packed(self, wait, 0, self.wait_command)

    def send_packed(
        self, receiver: Receiver, index: int, packed: bytes, *, limited: bool = False, fallback: Fallback = None
    ) -> None:
        if not limited or receiver is IGNORED:
            Outbox.send_packed(self, receiver, index, packed, limited=limited, fallback=fallback)
            return
        held = _Held(self, receiver)
        wait = self._take_open()
        self.gathering = True  # the vote and its WAIT in one write
        Outbox.send_packed(self, held, index, packed, limited=limited, fallback=fallback)
        self._behind(wait, held)

    def send_waited(self, receiver: Receiver, index: int, packed: bytes, *, fallback: Fallback = None) -> None:
        """A vote sent as an unlimited command (never refused for a stall: the one that follows ``ASKING``, both
        or neither), with its ``WAIT`` behind it all the same (a Cluster voter's vote redirected by ``ASK``)."""
        held = _Held(self, receiver)
        wait = self._take_open()
        self.gathering = True
        Outbox.send_packed(self, held, index, packed, fallback=fallback)
        self._behind(wait, held)

    def send_timed(
        self,
        clock: Receiver,
        receiver: Receiver,
        index: int,
        packed: bytes,
        *,
        limited: bool = False,
        fallback: Fallback = None,
    ) -> None:
        if not limited or receiver is IGNORED:
            Outbox.send_timed(self, clock, receiver, index, packed, limited=limited, fallback=fallback)
            return
        held = _Held(self, receiver)
        wait = self._take_open()
        self.gathering = True
        Outbox.send_timed(self, clock, held, index, packed, limited=limited, fallback=fallback)
        self._behind(wait, held)

    def _behind(self, wait: _Wait | None, held: _Held) -> None:
        """After a vote was queued (or refused at once): a WAIT behind it, the one taken out of line (with the
        votes it covers already) or a new one. Appended straight to the line: the vote has a flush on its way
        (``gathering`` made sure it was not written alone)."""
        if held.answered:  # refused (closed, down, stalled): nothing to wait for; the WAIT goes back in line
            if wait is not None:
                self.pending.append(wait.entry)
                self._open_wait = wait
            return
        if wait is None:
            wait = _Wait(self)
            self.load.sent += 1
        wait.held.append(held)
        self.pending.append(wait.entry)
        self._open_wait = wait
