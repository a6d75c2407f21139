"""What waits to be written to one node's connection, and what waits for its reply.

The node's sending side (``Node.send_packed`` and its kin are this outbox's methods): commands
are queued synchronously (no ``await``: a caller cancelled right after sending has still sent,
and a command queued later on the same node runs after it), refused at once when the node is
closed, down or stalled (:class:`_load.NodeLoad`'s limits), and written in batches:

* a command to an idle connection is written at once, one loop turn sooner;
* while replies are awaited (or the last write carried several commands), every command queued
  in one loop turn goes out in one ``transport.write`` from one ``call_soon`` callback. A write is
  a system call that runs the loopback's TCP path: under load it is most of the client's CPU, so
  one per node per loop turn, not one per command.

Connecting, a full socket buffer and a broken connection are the node's writer task's: the
outbox only wakes it (:attr:`Outbox.wakeup`). Written entries wait in :attr:`Outbox.inflight`,
oldest first, for the node's parser to hand them their replies.
"""

from __future__ import annotations

import asyncio
import operator
from collections import deque
from collections.abc import Callable
from typing import TypeAlias

from redlock_async._core import Vote
from redlock_async._core import clock as _clock
from redlock_async._nodes._load import NodeLoad
from redlock_async._nodes._wire import Failure, Fallback, Receiver, Reply, Resolve, eval_again, pack, pack_script
from redlock_async._scripts import Script

Entry: TypeAlias = "tuple[bytes, Receiver, int, Fallback]"
"""A command: its packed bytes, where its reply goes (and the index it goes with), its EVAL fallback."""

TIME = pack((b"TIME",))
"""The node's clock, read right before a vote by :meth:`Outbox.send_timed` (the clock guard's reading)."""

_bytes_of = operator.itemgetter(0)  # an Entry's bytes (join's map: no Python frame per entry)
FLUSH_BUFFER_LIMIT = 64 * 1024
"""Bytes already waiting in the socket's buffer above which new commands wait for the writer task's drain."""


class Outbox:
    """One node's commands: those not written yet (:attr:`pending`), those awaiting replies (:attr:`inflight`).

    *limited* commands (acquire, extend) are refused with a SKIPPED failure when
    ``load.max_unanswered`` commands already wait on a node that has answered nothing for
    ``load.stall_after`` seconds: a stalled node must not collect an unbounded backlog, while a
    busy one that keeps answering is never refused. Releases are never refused: each follows a
    command that was sent, so they are bounded by the same cap.
    """

    __slots__ = (
        "_broken",
        "_start",
        "closed",
        "down_reason",
        "down_until",
        "front",
        "gathering",
        "idle",
        "inflight",
        "load",
        "loop",
        "pending",
        "scheduled",
        "timed",
        "transport",
        "wakeup",
    )

    def __init__(
        self,
        load: NodeLoad,
        start: Callable[[], asyncio.AbstractEventLoop],
        broken: Callable[[BaseException], None],
    ) -> None:
        self.load = load
        self._start = start  # binds the node to the running loop and starts its task; returns the loop
        self._broken = broken  # a write failed: the node's connection is broken
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop of the node's task, once it runs."""
        self.pending: list[Entry] = []
        """Commands not written yet, in the order they go out."""
        self.front = 0
        """Entries at the head of :attr:`pending` that go before what callers queued (preloads, resent EVALs)."""
        self.inflight: deque[Entry] = deque()
        """Commands written, awaiting their replies in order."""
        self.transport: asyncio.Transport | None = None
        """The connection's transport once its handshake is done; None while there is no connection to write to."""
        self.wakeup = asyncio.Event()
        """Set when the writer task has work: connect, write what the outbox could not, drain."""
        self.closed: Failure | None = None
        """What every command gets once the node is closed; None while it is open."""
        self.down_until = 0.0  # monotonic end of a failed connect's back-off: commands are refused till then
        self.down_reason = ""  # why the last connect failed ("" once connected again)
        self.idle: asyncio.Future[None] | None = None
        """Resolved once nothing waits to be written or answered (``Node.aclose`` waits on it)."""
        self.scheduled = False  # a flush waits for this loop turn's end (call_soon)
        self.timed = False  # a TIME waits in the outbox (send_timed): the next timed votes of this write share it
        self.gathering = False  # the last write carried several commands: gather the next ones too

    @property
    def unanswered(self) -> int:
        """Commands sent or waiting to be sent that have not been answered."""
        return len(self.pending) + len(self.inflight)

    # -- queueing ---------------------------------------------------------

    def send(self, *args: bytes | str | int, limited: bool = False, fallback: Fallback = None) -> asyncio.Future[Reply]:
        """Queue one command; the future resolves to its reply or a :class:`Failure`."""
        fut: asyncio.Future[Reply] = self._start().create_future()
        self.send_packed(Resolve(fut), 0, pack(args), limited=limited, fallback=fallback)
        return fut

    def send_script(
        self, script: Script, keys: tuple[bytes, ...], args: tuple[bytes | int, ...], *, limited: bool = False
    ) -> asyncio.Future[Reply]:
        """EVALSHA; if the server lost the script, it is sent again as EVAL (which caches it).

        Scripts are loaded on every new connection, so the fallback only runs
        after a SCRIPT FLUSH; it is packed then, not now.
        """
        fut: asyncio.Future[Reply] = self._start().create_future()
        self.send_packed(
            Resolve(fut), 0, pack_script(script, keys, args), limited=limited, fallback=(script, keys, args)
        )
        return fut

    def send_packed(
        self, receiver: Receiver, index: int, packed: bytes, *, limited: bool = False, fallback: Fallback = None
    ) -> None:
        """Queue one command, packed already (one packing serves every node); its reply or
        :class:`Failure` goes to ``receiver.deliver(index, ...)``: at once when the command cannot be
        sent, else from the node's parser (no future, no callback to schedule)."""
        loop = self.loop
        if loop is None:
            loop = self._start()  # (the Redlock checked the caller's loop is this one)
        if self.closed is not None:
            receiver.deliver(index, self.closed)
            return
        if self.down_until and _clock.now() < self.down_until:
            receiver.deliver(index, Failure(Vote.SKIPPED, f"node down ({self.down_reason})"))
            return
        pending = self.pending
        load = self.load
        if limited and len(pending) + len(self.inflight) >= load.max_unanswered and load.stalled():
            receiver.deliver(index, Failure(Vote.SKIPPED, f"stalled: {self.unanswered} commands unanswered"))
            return
        entry = (packed, receiver, index, fallback)
        pending.append(entry)
        load.sent += 1
        if self.scheduled:
            return
        inflight = self.inflight
        if inflight or len(pending) != 1 or self.gathering:
            # Busy (or the last write gathered several: callers send together): whatever
            # else is sent during this loop turn goes in the same write.
            self.scheduled = True
            loop.call_soon(self.flush)
            return
        # An idle connection, and the last write carried one command: nothing to gather this one
        # with that is known yet, so it goes out now, one loop turn sooner.
        transport = self.transport
        if transport is None or transport.is_closing() or transport.get_write_buffer_size() > FLUSH_BUFFER_LIMIT:
            self.flush()  # (the task's: it wakes it)
            return
        # flush() and take() for this one command, inlined (most writes of an uncontended lock): it
        # waits in line for its reply before the write, and waiting starts now.
        pending.clear()
        inflight.append(entry)
        load.progress = load.waiting_since = _clock.now()
        try:
            transport.write(packed)
        except (OSError, RuntimeError) as exc:
            self._broken(exc)

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
        """:meth:`send_packed`, with a ``TIME`` right before the command in the same write: its reply goes to
        ``clock.deliver(index, ...)`` just before the command's (the clock guard judges the node's time
        before its vote is counted). No extra write, no extra round trip."""
        loop = self.loop
        if loop is None:
            loop = self._start()
        if self.closed is not None or (self.down_until and _clock.now() < self.down_until):
            self.send_packed(receiver, index, packed, limited=limited, fallback=fallback)  # refused there
            return
        pending = self.pending
        load = self.load
        inflight = self.inflight
        if limited and len(pending) + len(inflight) >= load.max_unanswered and load.stalled():
            receiver.deliver(index, Failure(Vote.SKIPPED, f"stalled: {self.unanswered} commands unanswered"))
            return
        if self.timed:
            # A TIME already goes out in this write, ahead of this command: the server runs them back to
            # back, so that one reading covers this vote too (under load, one TIME per write, not per vote).
            pending.append((packed, receiver, index, fallback))
            load.sent += 1
            if not self.scheduled:
                self.scheduled = True
                loop.call_soon(self.flush)
            return
        # The pair goes out as one entry's bytes (the TIME's) and an empty one (the command's reply).
        self.timed = True
        first, second = (TIME + packed, clock, index, None), (b"", receiver, index, fallback)
        pending.append(first)
        pending.append(second)
        load.sent += 2
        if self.scheduled:
            return
        if inflight or len(pending) != 2 or self.gathering:
            self.scheduled = True
            loop.call_soon(self.flush)
            return
        transport = self.transport
        if transport is None or transport.is_closing() or transport.get_write_buffer_size() > FLUSH_BUFFER_LIMIT:
            self.flush()
            return
        # As in send_packed: flush() and take() for this one pair, inlined.
        pending.clear()
        self.timed = False
        inflight.append(first)
        inflight.append(second)
        load.progress = load.waiting_since = _clock.now()
        try:
            transport.write(first[0])
        except (OSError, RuntimeError) as exc:
            self._broken(exc)

    def send_first(self, *requests: tuple[Receiver, tuple[bytes | str | int, ...]]) -> None:
        """Queue (receiver, command) pairs ahead of everything waiting (for on_ready: the first thing a
        new connection says)."""
        self.put_first([(pack(command), receiver, 0, None) for receiver, command in requests])
        if not self.wakeup.is_set():
            self.wakeup.set()

    def put_first(self, entries: list[Entry]) -> None:
        """Put *entries* ahead of everything waiting to be written (the writer task writes them)."""
        self.pending[:0] = entries
        self.front += len(entries)

    def cork(self) -> None:
        """Hold what is sent next for one write (see :meth:`uncork`), even on an idle connection."""
        self.gathering = True

    def uncork(self) -> None:
        """Write what was held since :meth:`cork` now, in one write."""
        if self.pending:
            self.flush()

    def resend(
        self, fallback: tuple[Script, tuple[bytes, ...], tuple[bytes | int, ...]], receiver: Receiver, index: int
    ) -> None:
        """The server lost a script (SCRIPT FLUSH, a restart): send it again as EVAL ahead of every command
        not yet written (after those on the wire, which ran first), unless ``_wire.eval_again`` says no."""
        again = eval_again(fallback, (entry[3] for entry in self.inflight))
        if isinstance(again, Failure):
            receiver.deliver(index, again)
            return
        # Not limited: a release must go out even to a busy node.
        self.pending.insert(self.front, (again, receiver, index, None))
        self.front += 1
        if not self.wakeup.is_set():
            self.wakeup.set()

    # -- writing ----------------------------------------------------------

    def flush(self) -> None:
        """Write what was queued during this loop turn, in one write, without waking the task.

        Called by a send on an idle connection, else once per loop turn
        (``call_soon``): a callback costs far less than a task switch, and it
        still gathers every command sent in the same turn. Connecting, a full
        socket buffer and a broken connection are the task's (which awaits drain).
        """
        self.scheduled = False
        if not self.pending or self.closed is not None:
            return
        transport = self.transport
        if transport is None or transport.is_closing() or transport.get_write_buffer_size() > FLUSH_BUFFER_LIMIT:
            if not self.wakeup.is_set():
                self.wakeup.set()
            return
        data = self.take()
        try:
            transport.write(data)
        except (OSError, RuntimeError) as exc:
            self._broken(exc)

    def take(self) -> bytes:
        """Move what waits in line for replies (before the write: no reply can come for a command
        not waiting); the bytes to write."""
        batch, self.pending, self.front, self.timed = self.pending, [], 0, False
        inflight = self.inflight
        if not inflight:
            load = self.load
            # Waiting (and the round trip) starts now, not at the last reply (NodeLoad's fields, set here:
            # once per write).
            load.progress = load.waiting_since = _clock.now()
        inflight.extend(batch)
        size = len(batch)
        # One command, or one timed pair (a TIME and its command: the second entry carries no bytes).
        if size == 1 or (size == 2 and not batch[1][0]):
            self.gathering = False
            return batch[0][0]
        self.gathering = True
        return b"".join(map(_bytes_of, batch))

    # -- answers and failures ---------------------------------------------

    def answered(self) -> None:
        """Every command queued was answered (or failed): resolve :attr:`idle`."""
        idle, self.idle = self.idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    def fail_inflight(self, failure: Failure) -> None:
        """Fail every command on the wire (its connection is gone: they will never be answered)."""
        inflight = self.inflight
        while inflight:
            _, receiver, index, _ = inflight.popleft()
            receiver.deliver(index, failure)
        if self.idle is not None and not self.pending:
            self.answered()

    def fail_all(self, failure: Failure) -> None:
        """Fail every command, written or not."""
        pending, self.pending, self.front = self.pending, [], 0
        self.timed = False
        for _, receiver, index, _ in pending:
            receiver.deliver(index, failure)
        self.fail_inflight(failure)
