"""One Redis master, reached through one auto-pipelined connection.

Why not redis-py's pool: it checks a connection out per command and drops it
whenever a caller is cancelled, so a per-node timeout would kill connections
under load. Here each node has one connection of its own, opened by us from
the first byte (``_handshake.py``; :class:`_wire.Wire` is its protocol), on any
asyncio loop, uvloop's included. What waits to be written and answered is the
node's :class:`_outbox.Outbox` (batching per loop turn, limits): a command to
an idle connection is written at once; while replies are awaited, the commands
queued in one loop turn go out in one write; a *writer* task only connects,
reconnects and waits for a full buffer to drain. Replies are parsed by
``hiredis.Reader`` right in ``data_received`` and go to the oldest receiver
waiting, in order (no reader task: a task switch and redis-py's read layers
saved per reply, about a third of the client's time).

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
from collections.abc import Callable
from typing import cast

import hiredis

from redlock_async._core import Vote
from redlock_async._core import clock as _clock
from redlock_async._nodes._endpoint import Endpoint
from redlock_async._nodes._handshake import (
    ConnectError,
    describe_connect,
    handshake_commands,
    judge_handshake,
    open_transport,
    tls_hint,
    warn_of_setup,
)
from redlock_async._nodes._load import NodeLoad
from redlock_async._nodes._outbox import Entry, Outbox
from redlock_async._nodes._wire import CLOSED, IGNORED, Failure, Reply, Resolve, Wire, describe, error_reply, pack
from redlock_async._scripts import QUEUE_LEAVE_NATIVE, Script

log = logging.getLogger("redlock_async._node")  # its name before the wings: users' log settings name it

_ReplyError = hiredis.ReplyError  # (read once per reply)


class Node:
    """A Redis master: queue commands (its :class:`_outbox.Outbox`, whose sending methods it offers as its
    own), get their replies; its connection, opened, kept and closed by its own task.

    *limited* commands (acquire, extend) are refused when *max_unanswered* commands already wait on a
    node that has answered nothing for *stall_after* seconds (``_outbox.py``).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        max_unanswered: int,
        stall_after: float,
        connect_timeout: float,
        reconnect_delay: float,
        on_message: Callable[[list[bytes]], bool] | None = None,
        on_connect: Callable[[Node], None] | None = None,
        on_ready: Callable[[Node], None] | None = None,
        on_identified: Callable[[Node], str | None] | None = None,
        on_unreachable: Callable[[Node], None] | None = None,
        on_fault: Callable[[Node, BaseException], None] | None = None,
        scripts: tuple[Script, ...] = (),
        max_rto: float = 0.0,
        warn: bool = True,
        outbox_type: Callable[..., Outbox] = Outbox,
    ) -> None:
        self.endpoint = endpoint
        # Connection trouble (cannot connect, connection lost) at WARNING; a node's second connection
        # (its subscriber) says it at DEBUG: one warning per node, from the connection that carries votes.
        self._trouble = logging.WARNING if warn else logging.DEBUG
        self._warned: set[str] = set()  # the kinds of setup warning given for this node (_warn_of_setup)
        self.name = endpoint.name
        # Votes of this node do not count before this (monotonic) time: it restarted or lost its data recently.
        # Set by the Redlock's Quarantine, whose on_ready hook queues its probe first on every new connection.
        self.quarantined_until = 0.0
        self.quarantine_reason = ""  # why it sits out, in words (set by the Quarantine with quarantined_until)
        self.clock_held_until = 0.0  # monotonic end of its clock's quarantine (the clock guard's), 0 when none
        self.vouching: list[Callable[[], None]] | None = None
        """Set while this node is a suspect whose first recheck may yet find it vouched for (another
        client marking it in service in the same moment): what to call once that recheck has decided.
        A ballot holds a yes of this node until then (``_fanout.Ballot``), instead of refusing it."""
        self.vouch_until = 0.0  # the latest (monotonic) time a ballot holds a yes for :attr:`vouching`
        self.connect_started = 0.0  # monotonic time the current connection was begun
        self.server_id: bytes | None = None
        """The run_id of the server behind the current connection (INFO server), None until known."""
        # promoted: its server was a replica since it started (``_handshake.promoted``); _evictions, _requests
        self.promoted, self.eviction, self.evicted_keys, self.delifeq = False, "", cast("int | None", None), False
        self._on_ready = on_ready
        self._on_identified = on_identified  # told of each connect's server: a reason back refuses it (the same server)
        self._on_unreachable = on_unreachable  # told of each failed connection attempt (the restart quarantine)
        self._on_fault = on_fault
        self.fault: BaseException | None = None
        """An unexpected exception of this node's task: the node is out of service for good."""
        # A subscriber: each list read goes to on_message, True when a message (no reply); on_connect re-subscribes.
        self._on_message, self._on_connect = on_message, on_connect
        self._scripts = scripts
        self.load = NodeLoad(max_unanswered=max_unanswered, stall_after=stall_after, max_rto=max_rto)
        """Commands sent, round trips, stalls (``_load.py``)."""
        self._connect_timeout = connect_timeout
        self._reconnect_delay = reconnect_delay
        self.outbox = outbox = outbox_type(self.load, self._ensure_running, self._broken)
        """What waits to be written and answered (``_outbox.py``; ``_replicas.py``'s with wait_replicas)."""
        # Sending is the outbox's; bound here once, so a send costs no extra call on the hot path.
        self.send = outbox.send
        self.send_packed = outbox.send_packed
        self.send_timed = outbox.send_timed
        self.send_script = outbox.send_script
        self.send_first = outbox.send_first
        self.cork = outbox.cork
        self.uncork = outbox.uncork
        self._task: asyncio.Task[None] | None = None  # connects, reconnects, drains full buffers
        self._wire: Wire | None = None  # the protocol of the live connection
        self._transport: asyncio.Transport | None = None
        self._parser = hiredis.Reader()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ever_connected = False  # a server that once answered in plain text is not a TLS-only port

    def __repr__(self) -> str:
        return f"<Node {self.name} unanswered={self.unanswered}>"

    @property
    def connected(self) -> bool:
        return self.outbox.transport is not None

    @property
    def buffered(self) -> int:
        """Bytes written but still in the transport's buffer (the socket's are full), 0 when none."""
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    @property
    def unanswered(self) -> int:
        """Commands sent or waiting to be sent that have not been answered."""
        return self.outbox.unanswered

    # -- lifecycle --------------------------------------------------------

    def _ensure_running(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                raise RuntimeError(
                    f"redlock node {self.name} is bound to another event loop: "
                    "make the Redlock inside the loop that uses it"
                )
            self._loop = self.outbox.loop = loop
        if self._task is None and self.outbox.closed is None:
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
        if self.outbox.closed is not None:
            return
        try:
            if self.outbox.unanswered and grace > 0 and self._loop is not None:
                self.outbox.idle = idle = self._loop.create_future()
                await asyncio.wait([idle], timeout=grace)
        finally:
            # Whatever happened to the wait (cancelled again, as anyio does): close all the same.
            self.close_now()
        await asyncio.sleep(0)  # the transport closes its socket on the next loop turn

    def close_now(self) -> None:
        """Close at once, with no await: fail what waits, drop the connection, stop the task."""
        outbox = self.outbox
        if outbox.closed is not None:
            return
        outbox.closed = CLOSED if self.fault is None else self._fault_failure()
        self._wire = None
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
        outbox.fail_all(outbox.closed)
        self._drop_transport()

    def _drop_transport(self) -> None:
        transport, self._transport = self._transport, None
        self._wire = None
        self.outbox.transport = None
        if transport is not None:
            # abort, not close: a closed TLS transport still waits for the server's close_notify,
            # and so outlives a loop that ends right after aclose (ResourceWarning).
            transport.abort()

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
        outbox = self.outbox
        while True:
            # A subscriber reconnects by itself (its on_connect re-subscribes); others on next use.
            if not outbox.pending and (outbox.transport is not None or self._on_connect is None):
                outbox.wakeup.clear()
                await outbox.wakeup.wait()
                continue
            if outbox.transport is None:
                if not await self._connect():
                    if self._on_connect is not None:
                        await asyncio.sleep(backoff)
                        backoff = min(backoff * 2, 5.0)
                    continue
                backoff = self._reconnect_delay
                if not outbox.pending:
                    continue
            wire, transport = self._wire, self._transport
            if wire is None or transport is None:
                continue  # broke while this task was waking up: reconnect
            data = outbox.take()
            try:
                transport.write(data)
                await wire.drained()
            except (OSError, RuntimeError) as exc:
                self._broken(exc)

    async def _connect(self) -> bool:
        """(Re)connect, with our protocol from the first byte, and shake hands; on failure fail what waits."""
        self.connect_started = _clock.now()
        outbox = self.outbox
        # Leftovers of a broken connection: its commands will never be answered.
        outbox.fail_inflight(Failure(Vote.ERROR, "connection lost"))
        self._drop_transport()
        self.server_id = None
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._open()
                await self._handshake()
        except (OSError, TimeoutError, ConnectError) as exc:
            self._drop_transport()
            outbox.fail_inflight(Failure(Vote.ERROR, "connection lost"))
            reason = "connect timed out" if isinstance(exc, TimeoutError) else describe_connect(exc)
            if not self._ever_connected:  # else a restart or a network fault, not a TLS mismatch
                reason += tls_hint(self.endpoint, exc)
            # Once per outage: a node that stays down is retried often.
            level = logging.DEBUG if outbox.down_reason else self._trouble
            log.log(level, "redlock node %s: cannot connect: %s", self.name, reason)
            outbox.down_until = _clock.now() + self._reconnect_delay
            outbox.down_reason = reason
            outbox.fail_all(Failure(Vote.ERROR, reason))
            if self._on_unreachable is not None:
                self._on_unreachable(self)
            return False
        except BaseException:
            self._drop_transport()
            raise
        outbox.transport = self._transport
        self._ever_connected = True
        outbox.down_until = 0.0
        if outbox.down_reason:
            log.info("redlock node %s: connected again", self.name)
            outbox.down_reason = ""
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
        self.outbox.inflight.extend((b"", Resolve(fut), 0, None) for fut in futures)
        self.load.waiting_since = _clock.now()
        transport.write(b"".join(pack(command) for command in commands))
        replies = [await fut for fut in futures]
        identity = judge_handshake(self.endpoint, commands, replies)
        self.server_id, self.promoted, self.delifeq = identity.run_id, identity.promoted, identity.delifeq
        self.eviction, self.evicted_keys = identity.eviction, identity.evicted
        warn_of_setup(self.name, identity, self._warned, self._trouble, self.outbox)
        if self._on_identified is not None and (refusal := self._on_identified(self)):
            raise ConnectError(refusal)

    def received(self, wire: Wire, data: bytes, /) -> None:
        """Bytes from the server: parse every complete reply and resolve its future, oldest first."""
        if wire is not self._wire:
            return  # a connection given up on
        parser, outbox, on_message, inflight = self._parser, self.outbox, self._on_message, self.outbox.inflight
        parser.feed(data)
        while True:
            try:
                reply: Reply = parser.gets()
            except hiredis.ProtocolError as exc:
                self._broken(exc)
                return
            if reply is False:
                break
            if type(reply) is _ReplyError:
                reply = error_reply(str(reply))
            elif on_message is not None and type(reply) is list and reply and on_message(reply):
                continue  # a message (it answers no command)
            if not inflight:
                self._broken(ConnectionError("a reply came with no command waiting for it"))
                return
            _, receiver, index, fallback = inflight.popleft()
            if type(reply) is not Failure:  # (most replies: one test of the reply's type)
                receiver.deliver(index, reply)
                continue
            if fallback is not None and reply.noscript:
                outbox.resend(fallback, receiver, index)
                continue
            receiver.deliver(index, reply)
            if "READONLY" in reply.detail:  # made a replica: the handshake says so
                self._broken(ConnectionError(f"the server became a replica ({reply.detail})"))
                return
        outbox.load.answered(_clock.now())
        if outbox.idle is not None and not inflight and not outbox.pending:
            outbox.answered()  # aclose() may close now

    def lost(self, wire: Wire, exc: BaseException | None, /) -> None:
        """The connection of *wire* ended (for :class:`_wire.Wire`)."""
        if wire is self._wire:
            self._broken(exc or ConnectionError("Connection closed by server."))

    def _broken(self, exc: BaseException) -> None:
        """The connection broke: fail what is on the wire; the task reconnects on next use."""
        self._wire = None  # nothing more is read from it
        reason = describe(exc)
        outbox = self.outbox
        if outbox.transport is not None:
            log.log(self._trouble, "redlock node %s: connection lost: %s", self.name, reason)
            outbox.transport = None
        # (Mid-handshake too: the handshake awaits these and says why it failed.)
        outbox.fail_inflight(Failure(Vote.ERROR, f"connection lost: {reason}"))
        if outbox.pending or self._on_connect is not None:
            outbox.wakeup.set()

    def _preload_scripts(self) -> None:
        """Load our scripts first thing on a new connection, so EVALSHA finds them (without it, a burst of
        EVALSHAs to a fresh or restarted server all miss and all fall back to EVAL with the full source)."""
        if not self._scripts:
            return
        # And the native release where this connection may run it: its EVALSHA must run on a node whose replies
        # are lost (a NOSCRIPT unheard is an EVAL never sent, and the key left a ttl).
        scripts = (*self._scripts, QUEUE_LEAVE_NATIVE) if self.delifeq else self._scripts
        preload: list[Entry] = [(pack((b"SCRIPT", b"LOAD", script.source)), IGNORED, 0, None) for script in scripts]
        self.outbox.put_first(preload)
