"""One Redis master, reached through one auto-pipelined connection.

Why not redis-py's pool: it checks a connection out per command and drops it
whenever a caller is cancelled, so a per-node timeout would kill connections
under load. Here each node has one connection of its own, opened by us from
the first byte (``_handshake.py``; :class:`_wire.Wire` is its protocol), on any
asyncio loop, uvloop's included. A command to an idle connection is written at
once by ``send()``; while replies are awaited, the commands queued in one loop
turn go out in one ``transport.write`` from a ``call_soon`` callback; a
*writer* task only connects, reconnects and waits for a full buffer to drain.
Replies are parsed by ``hiredis.Reader`` right in ``data_received`` and go to
the oldest receiver waiting, in order (no reader task: a task switch and
redis-py's read layers saved per reply, about a third of the client's time).

``send()`` is synchronous: a caller cancelled right after ``send()`` has still
sent its command, and a command queued later on the same node runs after it
(one connection, FIFO). That is what makes release safe: a compare-and-delete
queued after a SET always runs after that SET. A caller that stops waiting
abandons its future; the reply is still consumed, so the connection stays in
step (futures resolve to a reply or a :class:`_wire.Failure`, never raise).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

import hiredis

from redlock_async import _clock
from redlock_async._algorithm import Vote
from redlock_async._endpoint import Endpoint
from redlock_async._handshake import (
    ConnectError,
    describe_connect,
    handshake_commands,
    judge_handshake,
    open_transport,
    tls_hint,
)
from redlock_async._load import NodeLoad
from redlock_async._scripts import Script
from redlock_async._wire import (
    CLOSED,
    IGNORED,
    Failure,
    Fallback,
    Receiver,
    Reply,
    Resolve,
    Wire,
    describe,
    error_reply,
    eval_again,
    pack,
    pack_script,
)

log = logging.getLogger(__name__)

TIME = pack((b"TIME",))
"""The node's clock, read right before a vote by :meth:`Node.send_timed` (the clock guard's reading)."""

FLUSH_BUFFER_LIMIT = 64 * 1024
"""Bytes already waiting in the socket's buffer above which new commands wait for the writer task's drain."""


class Node:
    """A Redis master: queue commands, get futures of their replies.

    *limited* commands (acquire, extend) are refused with a SKIPPED failure
    when *max_queued* commands already wait on a node that has answered
    nothing for *stall_after* seconds: a stalled node must not collect an
    unbounded backlog, while a busy one that keeps answering is never refused.
    Releases are never refused: each follows a command that was sent, so
    they are bounded by the same cap.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        max_queued: int,
        stall_after: float,
        connect_timeout: float,
        reconnect_delay: float,
        on_message: Callable[[list[bytes]], None] | None = None,
        on_connect: Callable[[Node], None] | None = None,
        on_ready: Callable[[Node], None] | None = None,
        on_identified: Callable[[Node], str | None] | None = None,
        on_fault: Callable[[Node, BaseException], None] | None = None,
        scripts: tuple[Script, ...] = (),
        max_rto: float = 0.0,
        warn: bool = True,
    ) -> None:
        self.endpoint = endpoint
        # Connection trouble (cannot connect, connection lost) at WARNING; a node's second connection
        # (its subscriber) says it at DEBUG: one warning per node, from the connection that carries votes.
        self._trouble = logging.WARNING if warn else logging.DEBUG
        self.name = endpoint.name
        # Votes of this node do not count before this (monotonic) time: it
        # restarted or lost its data recently. Set by the Redlock's Quarantine,
        # whose on_ready hook queues its probe first on every new connection.
        self.quarantined_until = 0.0
        self.quarantine_reason = ""  # why it sits out, in words (set by the Quarantine with quarantined_until)
        self.clock_held_until = 0.0  # monotonic end of its clock's quarantine (the clock guard's), 0 when none
        self.connect_started = 0.0  # monotonic time the current connection was begun
        self.server_id: bytes | None = None
        """The run_id of the server behind the current connection (INFO server), None until known."""
        self._on_ready = on_ready
        # Told the server's identity on each connect; a reason back refuses the connection
        # (the same server as another node of the Redlock).
        self._on_identified = on_identified
        self._on_fault = on_fault
        self.fault: BaseException | None = None
        """An unexpected exception of this node's task: the node is out of service for good."""
        # A subscriber connection: pub/sub messages go to on_message (they answer
        # no command); on_connect re-subscribes after every (re)connect.
        self._on_message = on_message
        self._on_connect = on_connect
        self._scripts = scripts
        self.load = NodeLoad(max_queued=max_queued, stall_after=stall_after, max_rto=max_rto)
        """Commands sent, round trips, stalls (``_load.py``)."""
        self._connect_timeout = connect_timeout
        self._reconnect_delay = reconnect_delay
        # (packed command, future, EVAL fallback of an EVALSHA or None): not yet
        # written; then written, awaiting replies in order.
        self._outbox: list[tuple[bytes, Receiver, int, Fallback]] = []
        self._front = 0  # entries at the outbox's head that go before what callers queued (resent EVALs)
        self._inflight: deque[tuple[bytes, Receiver, int, Fallback]] = deque()  # the outbox's entries, as they were
        self._idle: asyncio.Future[None] | None = None  # aclose() waits for the last reply on it
        self._wakeup = asyncio.Event()
        self._flush_pending = False
        self._timed = False  # a TIME waits in the outbox (send_timed): the next timed votes of this write share it
        self._gathering = False  # the last write carried several commands: gather the next ones too
        self._task: asyncio.Task[None] | None = None  # connects, reconnects, drains full buffers
        self._wire: Wire | None = None  # the protocol of the live connection
        self._transport: asyncio.Transport | None = None
        self._parser = hiredis.Reader()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connected = False
        self._ever_connected = False  # a server that once answered in plain text is not a TLS-only port
        self._down_until = 0.0
        self._down_reason = ""
        self._closed = False

    def __repr__(self) -> str:
        return f"<Node {self.name} queued={self.queued}>"

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def buffered(self) -> int:
        """Bytes written but still in the transport's buffer (the socket's are full), 0 when none."""
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    @property
    def queued(self) -> int:
        """Commands sent or waiting to be sent that have not been answered."""
        return len(self._outbox) + len(self._inflight)

    # -- sending ----------------------------------------------------------

    def send(self, *args: bytes | str | int, limited: bool = False, fallback: Fallback = None) -> asyncio.Future[Reply]:
        """Queue one command; the future resolves to its reply or a :class:`Failure`."""
        fut: asyncio.Future[Reply] = self._ensure_running().create_future()
        self.send_packed(Resolve(fut), 0, pack(args), limited=limited, fallback=fallback)
        return fut

    def send_packed(
        self, receiver: Receiver, index: int, packed: bytes, *, limited: bool = False, fallback: Fallback = None
    ) -> None:
        """Queue one command, packed already (one packing serves every node); its reply or
        :class:`Failure` goes to ``receiver.deliver(index, ...)``: at once when the command cannot be
        sent, else from ``data_received`` (no future, no callback to schedule)."""
        loop = self._loop
        if loop is None or self._task is None:
            loop = self._ensure_running()  # (the Redlock checked the caller's loop is this one)
        if self._closed:
            receiver.deliver(index, CLOSED if self.fault is None else self._fault_failure())
            return
        if self._down_until and _clock.now() < self._down_until:
            receiver.deliver(index, Failure(Vote.SKIPPED, f"node down ({self._down_reason})"))
            return
        outbox = self._outbox
        load = self.load
        if limited and len(outbox) + len(self._inflight) >= load.max_queued and load.stalled():
            receiver.deliver(index, Failure(Vote.SKIPPED, f"stalled: {self.queued} commands unanswered"))
            return
        outbox.append((packed, receiver, index, fallback))
        load.sent += 1
        if not self._flush_pending:
            if not self._inflight and len(outbox) == 1 and not self._gathering:
                # An idle connection, and the last write carried one command: nothing to gather
                # this one with that is known yet, so it goes out now, one loop turn sooner.
                self._flush()
            else:
                # Busy (or the last write gathered several: callers send together): whatever
                # else is sent during this loop turn goes in the same write. A write is a
                # system call that runs the loopback's TCP path: under load it is most of the
                # client's CPU, so one per node per loop turn, not two.
                self._flush_pending = True
                loop.call_soon(self._flush)

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
        loop = self._loop
        if loop is None or self._task is None:
            loop = self._ensure_running()
        if self._closed or (self._down_until and _clock.now() < self._down_until):
            self.send_packed(receiver, index, packed, limited=limited, fallback=fallback)  # refused there
            return
        outbox = self._outbox
        load = self.load
        if limited and len(outbox) + len(self._inflight) >= load.max_queued and load.stalled():
            receiver.deliver(index, Failure(Vote.SKIPPED, f"stalled: {self.queued} commands unanswered"))
            return
        if self._timed:
            # A TIME already goes out in this write, ahead of this command: the server runs them back to
            # back, so that one reading covers this vote too (under load, one TIME per write, not per vote).
            outbox.append((packed, receiver, index, fallback))
            load.sent += 1
        else:
            # The pair goes out as one entry's bytes (the TIME's) and an empty one (the command's reply).
            self._timed = True
            outbox.append((TIME + packed, clock, index, None))
            outbox.append((b"", receiver, index, fallback))
            load.sent += 2
        if not self._flush_pending:
            if not self._inflight and len(outbox) == 2 and not self._gathering:
                self._flush()
            else:
                self._flush_pending = True
                loop.call_soon(self._flush)

    def cork(self) -> None:
        """Hold what is sent next for one write (see :meth:`uncork`), even on an idle connection."""
        self._gathering = True

    def uncork(self) -> None:
        """Write what was held since :meth:`cork` now, in one write."""
        if self._outbox:
            self._flush()

    def send_script(
        self, script: Script, keys: tuple[bytes, ...], args: tuple[bytes | int, ...], *, limited: bool = False
    ) -> asyncio.Future[Reply]:
        """EVALSHA; if the server lost the script, the reader sends it again as EVAL (which caches it).

        Scripts are loaded on every new connection, so the fallback only runs
        after a SCRIPT FLUSH; it is packed then, not now.
        """
        fut: asyncio.Future[Reply] = self._ensure_running().create_future()
        self.send_packed(
            Resolve(fut), 0, pack_script(script, keys, args), limited=limited, fallback=(script, keys, args)
        )
        return fut

    def send_first(self, *requests: tuple[Receiver, tuple[bytes | str | int, ...]]) -> None:
        """Queue (receiver, command) pairs ahead of everything waiting (for on_ready: the first thing a
        new connection says)."""
        self._outbox[:0] = [(pack(command), receiver, 0, None) for receiver, command in requests]
        self._front += len(requests)
        if not self._wakeup.is_set():
            self._wakeup.set()

    # -- lifecycle --------------------------------------------------------

    def _ensure_running(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                raise RuntimeError(
                    f"redlock node {self.name} is bound to another event loop: "
                    "make the Redlock inside the loop that uses it"
                )
            self._loop = loop
        if self._task is None and not self._closed:
            self._task = loop.create_task(self._run(), name=f"redlock-connection {self.name}")
        return loop

    async def connect(self) -> Failure | None:
        """Make sure the connection is up; None when it is, else why not.

        Bounded: a node that accepts the connection and then says nothing (paused)
        is reported after the connect timeout, not waited for.
        """
        fut = self.send(b"PING")
        done, _ = await asyncio.wait([fut], timeout=self._connect_timeout * 2)
        if not done:
            return Failure(Vote.TIMEOUT, f"connected, but no answer within {self._connect_timeout * 2:g} s")
        reply = fut.result()
        return reply if isinstance(reply, Failure) else None

    async def aclose(self, grace: float) -> None:
        """Let queued commands go out and be answered (up to *grace* seconds), then close."""
        if self._closed:
            return
        try:
            if (self._outbox or self._inflight) and grace > 0 and self._loop is not None:
                self._idle = idle = self._loop.create_future()
                await asyncio.wait([idle], timeout=grace)
        finally:
            # Whatever happened to the wait (cancelled again, as anyio does): close all the same.
            self.close_now()
        await asyncio.sleep(0)  # the transport closes its socket on the next loop turn

    def close_now(self) -> None:
        """Close at once, with no await: fail what waits, drop the connection, stop the task."""
        if self._closed:
            return
        self._closed = True
        self._wire = None
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
        self._fail_all(CLOSED if self.fault is None else self._fault_failure())
        self._drop_transport()

    def _drop_transport(self) -> None:
        transport, self._transport = self._transport, None
        self._wire = None
        self._connected = False
        if transport is not None:
            # abort, not close: a closed TLS transport still waits for the server's close_notify,
            # and so outlives a loop that ends right after aclose (ResourceWarning).
            transport.abort()

    def _flush(self) -> None:
        """Write what was queued during this loop turn, in one write, without waking the task.

        Called by ``send()`` on an idle connection, else once per loop turn
        (``call_soon``): a callback costs far less than a task switch, and it
        still gathers every command sent in the same turn. Connecting, a full
        socket buffer and a broken connection are the task's (which awaits drain).
        """
        self._flush_pending = False
        if not self._outbox or self._closed:
            return
        transport = self._transport
        if (
            not self._connected
            or transport is None
            or transport.is_closing()
            or transport.get_write_buffer_size() > FLUSH_BUFFER_LIMIT
        ):
            if not self._wakeup.is_set():
                self._wakeup.set()
            return
        data = self._take_outbox()
        try:
            transport.write(data)
        except (OSError, RuntimeError) as exc:
            self._broken(exc)

    def _take_outbox(self) -> bytes:
        """Move the outbox in line for replies (before the write: no reply can come for a command
        not waiting); the bytes to write."""
        batch, self._outbox, self._front = self._outbox, [], 0
        self._timed = False
        if not self._inflight:
            self.load.writing(_clock.now())
        # Several commands (a timed pair counts as one: its second entry carries no bytes).
        self._gathering = len(batch) > 2 or (len(batch) == 2 and batch[1][0] != b"")
        self._inflight.extend(batch)
        if len(batch) == 1:
            return batch[0][0]
        return b"".join([entry[0] for entry in batch])

    # -- the task and the wire --------------------------------------------
    #
    # Only the task connects and disconnects; the wire only parses and,
    # when the connection breaks, says so (_broken). Each connection has its
    # own Wire, and only the current one is listened to, so the last words
    # of a dead connection can never touch a new one.

    async def _run(self) -> None:
        """The node's task; an exception it did not expect puts the node out of service, loudly."""
        try:
            await self._write_loop()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._crash(exc)
            if not isinstance(exc, Exception):
                raise

    def _crash(self, exc: BaseException) -> None:
        """A bug (ours, or a loop's): say it once, with its traceback, and fail every call on this node."""
        log.error("redlock node %s: internal error, the node is out of service", self.name, exc_info=exc)
        self.fault = exc
        self._task = None  # it is ending: close_now must not cancel it
        self.close_now()
        if self._on_fault is not None:
            self._on_fault(self, exc)

    def _fault_failure(self) -> Failure:
        return Failure(Vote.ERROR, f"internal error in redlock_async: {describe(self.fault or RuntimeError())}")

    async def _write_loop(self) -> None:
        backoff = self._reconnect_delay
        while True:
            # A subscriber reconnects by itself (its on_connect re-subscribes); others on next use.
            if not self._outbox and (self._connected or self._on_connect is None):
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if not self._connected:
                if not await self._connect():
                    if self._on_connect is not None:
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, 5.0)
                    continue
                backoff = self._reconnect_delay
                if not self._outbox:
                    continue
            wire, transport = self._wire, self._transport
            if wire is None or transport is None:
                continue  # broke while this task was waking up: reconnect
            data = self._take_outbox()
            try:
                transport.write(data)
                await wire.drained()
            except (OSError, RuntimeError) as exc:
                self._broken(exc)

    async def _connect(self) -> bool:
        """(Re)connect, with our protocol from the first byte, and shake hands; on failure fail what waits."""
        self.connect_started = _clock.now()
        # Leftovers of a broken connection: its commands will never be answered.
        self._fail_inflight(Failure(Vote.ERROR, "connection lost"))
        self._drop_transport()
        self.server_id = None
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._open()
                await self._handshake()
        except (OSError, TimeoutError, ConnectError) as exc:
            self._drop_transport()
            self._fail_inflight(Failure(Vote.ERROR, "connection lost"))
            reason = "connect timed out" if isinstance(exc, TimeoutError) else describe_connect(exc)
            if not self._ever_connected:  # else a restart or a network fault, not a TLS mismatch
                reason += tls_hint(self.endpoint, exc)
            # Once per outage: a node that stays down is retried often.
            level = logging.DEBUG if self._down_reason else self._trouble
            log.log(level, "redlock node %s: cannot connect: %s", self.name, reason)
            self._down_until = _clock.now() + self._reconnect_delay
            self._down_reason = reason
            self._fail_all(Failure(Vote.ERROR, reason))
            return False
        except BaseException:
            self._drop_transport()
            raise
        self._connected = True
        self._ever_connected = True
        self._down_until = 0.0
        if self._down_reason:
            log.info("redlock node %s: connected again", self.name)
            self._down_reason = ""
        if self._on_ready is not None:
            self._on_ready(self)
        self._preload_scripts()
        if self._on_connect is not None:
            self._on_connect(self)
        return True

    async def _open(self) -> None:
        loop = self._loop
        assert loop is not None
        wire = Wire(self)
        transport = await open_transport(loop, self.endpoint, wire)
        self._parser = hiredis.Reader()
        self._wire, self._transport = wire, transport

    async def _handshake(self) -> None:
        """The handshake's commands in one write, answered before anything else; raise ConnectError if the
        server refuses (``_handshake.judge_handshake``) or is the same server as another node."""
        commands = await handshake_commands(self.endpoint)
        loop, transport = self._loop, self._transport
        assert loop is not None
        assert transport is not None
        futures: list[asyncio.Future[Reply]] = [loop.create_future() for _ in commands]
        self._inflight.extend((b"", Resolve(fut), 0, None) for fut in futures)
        self.load.waiting_since = _clock.now()
        transport.write(b"".join(pack(command) for command in commands))
        replies = [await fut for fut in futures]
        self.server_id = judge_handshake(self.endpoint, commands, replies)
        if self._on_identified is not None and (refusal := self._on_identified(self)):
            raise ConnectError(refusal)

    def received(self, wire: Wire, data: bytes, /) -> None:
        """Bytes from the server: parse every complete reply and resolve its future, oldest first."""
        if wire is not self._wire:
            return  # a connection given up on
        parser = self._parser
        parser.feed(data)
        inflight = self._inflight
        on_message = self._on_message
        while True:
            try:
                reply: Reply = parser.gets()
            except hiredis.ProtocolError as exc:
                self._broken(exc)
                return
            if reply is False:
                break
            if type(reply) is hiredis.ReplyError:
                reply = error_reply(str(reply))
            elif on_message is not None and type(reply) is list and reply and reply[0] == b"message":
                on_message(reply)
                continue
            if not inflight:
                self._broken(ConnectionError("a reply came with no command waiting for it"))
                return
            _, receiver, index, fallback = inflight.popleft()
            if fallback is not None and type(reply) is Failure and reply.noscript:
                self._script_missing(fallback, receiver, index)
                continue
            receiver.deliver(index, reply)
        self.load.answered(_clock.now())
        if self._idle is not None and not inflight and not self._outbox:
            self._answered()

    def _answered(self) -> None:
        """Every command queued was answered (or failed): aclose() may close now."""
        idle, self._idle = self._idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    def lost(self, wire: Wire, exc: BaseException | None, /) -> None:
        """The connection of *wire* ended (for :class:`_wire.Wire`)."""
        if wire is self._wire:
            self._broken(exc or ConnectionError("Connection closed by server."))

    def _broken(self, exc: BaseException) -> None:
        """The connection broke: fail what is on the wire; the task reconnects on next use."""
        self._wire = None  # nothing more is read from it
        reason = describe(exc)
        if self._connected:
            log.log(self._trouble, "redlock node %s: connection lost: %s", self.name, reason)
            self._connected = False
        # (Mid-handshake too: the handshake awaits these and says why it failed.)
        self._fail_inflight(Failure(Vote.ERROR, f"connection lost: {reason}"))
        if self._outbox or self._on_connect is not None:
            self._wakeup.set()

    def _script_missing(
        self, fallback: tuple[Script, tuple[bytes, ...], tuple[bytes | int, ...]], receiver: Receiver, index: int
    ) -> None:
        """The server lost a script (SCRIPT FLUSH, a restart): send it again as EVAL ahead of every command
        not yet written (after those on the wire, which ran first), unless ``_wire.eval_again`` says no."""
        again = eval_again(fallback, (entry[3] for entry in self._inflight))
        if isinstance(again, Failure):
            receiver.deliver(index, again)
            return
        # Not limited: a release must go out even to a busy node.
        self._outbox.insert(self._front, (again, receiver, index, None))
        self._front += 1
        if not self._wakeup.is_set():
            self._wakeup.set()

    def _preload_scripts(self) -> None:
        """Load our scripts first thing on a new connection, so EVALSHA finds them.

        Without it, a burst of EVALSHAs to a fresh or restarted server all miss
        and all fall back to EVAL with the full source.
        """
        if not self._scripts:
            return
        preload: list[tuple[bytes, Receiver, int, Fallback]] = [
            (pack((b"SCRIPT", b"LOAD", script.source)), IGNORED, 0, None) for script in self._scripts
        ]
        self._outbox[:0] = preload
        self._front += len(preload)

    def _fail_inflight(self, failure: Failure) -> None:
        while self._inflight:
            _, receiver, index, _ = self._inflight.popleft()
            receiver.deliver(index, failure)
        if self._idle is not None and not self._outbox:
            self._answered()

    def _fail_all(self, failure: Failure) -> None:
        outbox, self._outbox, self._front = self._outbox, [], 0
        self._timed = False
        for _, receiver, index, _ in outbox:
            receiver.deliver(index, failure)
        self._fail_inflight(failure)
