"""One Redis master, reached through one auto-pipelined connection.

Why not redis-py's pool: it checks a connection out per command and drops it
whenever a caller is cancelled, so a per-node timeout would kill connections
under load. Here each node has one connection of its own, opened by us from
the first byte: ``loop.create_connection`` (or ``create_unix_connection``)
with :class:`_Wire`, our asyncio protocol, as its protocol from the start;
TLS through the endpoint's :class:`ssl.SSLContext`; then our handshake
(AUTH with an ACL user or a password, SELECT, CLIENT SETNAME, INFO server for
the server's identity), pipelined in one write. It runs on any asyncio loop
(uvloop's transports included) and needs nothing of redis-py but its URL
parsing (``_endpoint.py``):

* a command to an idle connection is written at once by ``send()``; while
  replies are awaited, the commands queued in one loop turn go out in one
  ``transport.write`` from a ``call_soon`` callback; a *writer* task only
  connects, reconnects and waits for a full socket buffer to drain;
* replies are parsed by ``hiredis.Reader`` right in ``data_received`` and
  resolve the oldest outstanding future, in order: no reader task, no
  ``StreamReader``. Per reply that saves a task switch and redis-py's read
  layers, which the profile put at about a third of the client's time
  (``benchmarks/profile_core.py``).

``send()`` is synchronous: it packs and queues a command and returns a future.
Because queueing needs no ``await``, a caller that is cancelled right after
``send()`` has still sent its command, and a command queued later on the same
node runs after it (one connection, FIFO). That is what makes release safe:
a compare-and-delete queued after a SET always runs after that SET.

A caller that stops waiting (timeout, cancellation) just abandons its future;
the reader still consumes the reply, so the connection stays in step.
Futures resolve to the reply or to a :class:`Failure` value, never to an
exception, so an abandoned future never logs "exception never retrieved".
Raw redis errors stop here: they become a :class:`Failure` with a vote.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import hiredis

from redlock_async import _clock
from redlock_async._algorithm import Vote, smoothed_rtt
from redlock_async._endpoint import Endpoint
from redlock_async._scripts import Script

log = logging.getLogger(__name__)

Reply: TypeAlias = Any  # bytes | int | None | list, as hiredis parses RESP2
Fallback: TypeAlias = "tuple[Script, tuple[bytes, ...], tuple[bytes | int, ...]] | None"
"""What an EVALSHA needs to be sent again as EVAL: script, keys, arguments."""


class Receiver(Protocol):
    """Where replies go: ``deliver(index, reply)`` is called the moment the reply is parsed, in reply order.

    A ballot is one (its index: the node's place), so a reply is counted with no
    future and no callback scheduled; a future of ``send()`` is wrapped in one.
    """

    def deliver(self, index: int, reply: Reply, /) -> None: ...


class _Ignored:
    """The receiver of a command whose reply no one awaits (a give-back nobody waits for)."""

    __slots__ = ()

    def deliver(self, index: int, reply: Reply, /) -> None:
        pass


IGNORED: Receiver = _Ignored()


class Reaction:
    """A receiver that hands the reply to a function at once, in reply order (a future's callback would
    run a loop turn later, after the ballots counted the replies that followed it)."""

    __slots__ = ("_react",)

    def __init__(self, react: Callable[[Reply], None]) -> None:
        self._react = react

    def deliver(self, index: int, reply: Reply, /) -> None:
        self._react(reply)


class _Resolve:
    """The receiver of ``send()``: resolves its future (unless the caller cancelled it)."""

    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[Reply]) -> None:
        self._future = future

    def deliver(self, index: int, reply: Reply, /) -> None:
        if not self._future.done():
            self._future.set_result(reply)


@dataclass(frozen=True, slots=True)
class Failure:
    """A request that produced no reply to count: the vote it is worth, and why."""

    vote: Vote
    detail: str
    noscript: bool = False
    answered: bool = False
    """The server answered with an error (the connection is fine)."""


CLOSED = Failure(Vote.SKIPPED, "the Redlock is closed")

FLUSH_BUFFER_LIMIT = 64 * 1024
"""Bytes already waiting in the socket's buffer above which new commands wait for the writer task's drain."""


class ConnectError(Exception):
    """The connection or the handshake failed; its text is safe to show (no password, no token)."""


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
    ) -> None:
        self.endpoint = endpoint
        self.name = endpoint.name
        # Votes of this node do not count before this (monotonic) time: it
        # restarted or lost its data recently. Set by the Redlock's Quarantine,
        # whose on_ready hook queues its probe first on every new connection.
        self.quarantined_until = 0.0
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
        self._max_queued = max_queued
        self._stall_after = stall_after
        self._progress = 0.0  # last reply, or first write after an idle spell (monotonic)
        self._connect_timeout = connect_timeout
        self._reconnect_delay = reconnect_delay
        # Round trips, measured from a write to an idle connection to its first reply
        # (RFC 6298's estimator): how long this node takes on this network.
        self.max_rto = max_rto
        self.rto = 0.0
        """Retransmission-style timeout: smoothed RTT + 4 x its variation, at most max_rto; 0 until measured."""
        self.srtt = 0.0
        self._rttvar = 0.0
        self._rtt_since = 0.0  # monotonic time of a write to an idle connection whose reply is awaited
        # (packed command, future, EVAL fallback of an EVALSHA or None): not yet
        # written; then written, awaiting replies in order.
        self._outbox: list[tuple[bytes, Receiver, int, Fallback]] = []
        self._front = 0  # entries at the outbox's head that go before what callers queued (resent EVALs)
        self._inflight: deque[tuple[bytes, Receiver, int, Fallback]] = deque()  # the outbox's entries, as they were
        self._idle: asyncio.Future[None] | None = None  # aclose() waits for the last reply on it
        self._wakeup = asyncio.Event()
        self._flush_pending = False
        self._gathering = False  # the last write carried several commands: gather the next ones too
        self._task: asyncio.Task[None] | None = None  # connects, reconnects, drains full buffers
        self._wire: _Wire | None = None  # the protocol of the live connection
        self._transport: asyncio.Transport | None = None
        self._parser = hiredis.Reader()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connected = False
        self._ever_connected = False  # a server that once answered in plain text is not a TLS-only port
        self._down_until = 0.0
        self._down_reason = ""
        self._closed = False
        self.sent = 0
        """Commands queued on this node (for statistics)."""

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
        self.send_packed(_Resolve(fut), 0, pack(args), limited=limited, fallback=fallback)
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
        if limited and len(outbox) + len(self._inflight) >= self._max_queued and self._stalled():
            receiver.deliver(index, Failure(Vote.SKIPPED, f"stalled: {self.queued} commands unanswered"))
            return
        outbox.append((packed, receiver, index, fallback))
        self.sent += 1
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
            _Resolve(fut), 0, pack_script(script, keys, args), limited=limited, fallback=(script, keys, args)
        )
        return fut

    def send_first(self, *requests: tuple[Receiver, tuple[bytes | str | int, ...]]) -> None:
        """Queue (receiver, command) pairs ahead of everything waiting (for on_ready: the first thing a
        new connection says)."""
        self._outbox[:0] = [(pack(command), receiver, 0, None) for receiver, command in requests]
        self._front += len(requests)
        if not self._wakeup.is_set():
            self._wakeup.set()

    def _stalled(self) -> bool:
        return _clock.now() - self._progress > self._stall_after

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
        if not self._inflight:
            self._progress = self._rtt_since = _clock.now()  # waiting starts now, not at the last reply
        self._gathering = len(batch) > 1
        self._inflight.extend(batch)
        if len(batch) == 1:
            return batch[0][0]
        return b"".join([entry[0] for entry in batch])

    # -- the task and the wire --------------------------------------------
    #
    # Only the task connects and disconnects; the wire only parses and,
    # when the connection breaks, says so (_broken). Each connection has its
    # own _Wire, and only the current one is listened to, so the last words
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
        return Failure(Vote.ERROR, f"internal error in redlock_async: {_describe(self.fault or RuntimeError())}")

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
            reason = "connect timed out" if isinstance(exc, TimeoutError) else _describe_connect(exc)
            if not self._ever_connected:  # else a restart or a network fault, not a TLS mismatch
                reason += _tls_hint(self.endpoint, exc)
            # Once per outage: a node that stays down is retried often.
            (log.debug if self._down_reason else log.warning)("redlock node %s: cannot connect: %s", self.name, reason)
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
        endpoint = self.endpoint
        wire = _Wire(self)
        if endpoint.path is not None:
            transport, _ = await loop.create_unix_connection(lambda: wire, endpoint.path)
        else:
            transport, _ = await loop.create_connection(
                lambda: wire,
                endpoint.host or "localhost",
                endpoint.port,
                ssl=endpoint.tls,
                server_hostname=endpoint.server_hostname,
            )
        # No isinstance check: uvloop's transports are not asyncio.Transport subclasses.
        self._parser = hiredis.Reader()
        self._wire, self._transport = wire, transport

    async def _handshake(self) -> None:
        """AUTH, SELECT, CLIENT SETNAME and INFO server in one write; raise ConnectError if the server refuses."""
        endpoint = self.endpoint
        username, password = await endpoint.credentials()
        commands: list[tuple[bytes | str | int, ...]] = []
        if password is not None:
            commands.append((b"AUTH", username, password) if username else (b"AUTH", password))
        if endpoint.db:
            commands.append((b"SELECT", endpoint.db))
        commands.append((b"CLIENT", b"SETNAME", endpoint.client_name))
        commands.append((b"INFO", b"server"))
        loop, transport = self._loop, self._transport
        assert loop is not None
        assert transport is not None
        futures: list[asyncio.Future[Reply]] = [loop.create_future() for _ in commands]
        self._inflight.extend((b"", _Resolve(fut), 0, None) for fut in futures)
        self._rtt_since = _clock.now()
        transport.write(b"".join(pack(command) for command in commands))
        replies = [await fut for fut in futures]
        for command, reply in zip(commands, replies, strict=True):
            if not isinstance(reply, Failure):
                continue
            if command[0] == b"AUTH":
                raise ConnectError(f"AUTH refused: {reply.detail}")
            if command[0] == b"SELECT":
                raise ConnectError(f"SELECT {endpoint.db} refused: {reply.detail}")
            if not reply.answered:
                raise ConnectError(reply.detail.removeprefix("connection lost: "))
            if "NOAUTH" in reply.detail or "Authentication required" in reply.detail:
                raise ConnectError(f"the server wants a password: put it in the URL ({reply.detail})")
            # CLIENT SETNAME or INFO refused (an ACL user without them): we can do without.
        info = replies[-1]
        self.server_id = _run_id(info) if isinstance(info, bytes) else None
        if self._on_identified is not None and (refusal := self._on_identified(self)):
            raise ConnectError(refusal)

    def _received(self, wire: _Wire, data: bytes) -> None:
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
                reply = _error_reply(str(reply))
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
        now = self._progress = _clock.now()
        if self._rtt_since:
            self._sample_rtt(now - self._rtt_since)
        if self._idle is not None and not inflight and not self._outbox:
            self._answered()

    def _answered(self) -> None:
        """Every command queued was answered (or failed): aclose() may close now."""
        idle, self._idle = self._idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    def _sample_rtt(self, sample: float) -> None:
        self._rtt_since = 0.0
        self.srtt, self._rttvar = smoothed_rtt(self.srtt, self._rttvar, sample)
        self.rto = min(self.srtt + 4 * self._rttvar, self.max_rto)

    def _lost(self, wire: _Wire, exc: BaseException | None) -> None:
        if wire is self._wire:
            self._broken(exc or ConnectionError("Connection closed by server."))

    def _broken(self, exc: BaseException) -> None:
        """The connection broke: fail what is on the wire; the task reconnects on next use."""
        self._wire = None  # nothing more is read from it
        reason = _describe(exc)
        if self._connected:
            log.warning("redlock node %s: connection lost: %s", self.name, reason)
            self._connected = False
        # (Mid-handshake too: the handshake awaits these and says why it failed.)
        self._fail_inflight(Failure(Vote.ERROR, f"connection lost: {reason}"))
        if self._outbox or self._on_connect is not None:
            self._wakeup.set()

    def _script_missing(
        self, fallback: tuple[Script, tuple[bytes, ...], tuple[bytes | int, ...]], receiver: Receiver, index: int
    ) -> None:
        """The server lost a script (SCRIPT FLUSH, a restart): send it again as EVAL, in order where order matters.

        The EVAL goes ahead of every command not yet written, but after those
        already on the wire, which ran first. For a script that can create a
        lock key, that could put an acquire after its own release (a key
        left with no holder): such a script is not sent again when a command
        on the wire names one of its keys, and fails instead (nothing ran).
        """
        script, keys, args = fallback
        if script.creates:
            touched = set(keys)
            if any(later is not None and touched.intersection(later[1]) for _, _, _, later in self._inflight):
                receiver.deliver(
                    index,
                    Failure(
                        Vote.ERROR,
                        "the server had lost the script; not sent again, as a later command on its key already ran",
                        answered=True,
                    ),
                )
                return
        # Not limited: a release must go out even to a busy node.
        self._outbox.insert(
            self._front, (pack((b"EVAL", script.source, len(keys), *keys, *args)), receiver, index, None)
        )
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
        for _, receiver, index, _ in outbox:
            receiver.deliver(index, failure)
        self._fail_inflight(failure)


class _Wire(asyncio.Protocol):
    """The protocol of one connection once redis-py has set it up: bytes in, replies out, flow control."""

    __slots__ = ("_drain", "_node")

    def __init__(self, node: Node) -> None:
        self._node = node
        self._drain: asyncio.Future[None] | None = None  # set while the socket's buffer is too full

    def data_received(self, data: bytes) -> None:
        self._node._received(self, data)

    def eof_received(self) -> bool:
        return False  # the server hung up: close, and connection_lost says so

    def connection_lost(self, exc: Exception | None) -> None:
        self._release_drain()
        self._node._lost(self, exc)

    def pause_writing(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._release_drain()

    def _release_drain(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drained(self) -> None:
        """Return once the socket's write buffer is below its high-water mark (or the connection ended)."""
        if self._drain is not None:
            await asyncio.shield(self._drain)


def _error_reply(text: str) -> Failure:
    """A server's error reply as a failed vote, worded as redis-py words it (the error code dropped)."""
    code, _, rest = text.partition(" ")
    detail = _server_error(rest if rest and code.isupper() else text)
    return Failure(Vote.ERROR, detail, noscript=code == "NOSCRIPT", answered=True)


def _describe_connect(exc: BaseException) -> str:
    """A failed connect in words: the socket or TLS error, never a password."""
    if isinstance(exc, ConnectError):
        return str(exc)
    if isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError) and exc.errno:
        return os.strerror(exc.errno)  # asyncio's text repeats the address and the errno
    return _describe(exc)


def _tls_hint(endpoint: Endpoint, exc: BaseException) -> str:
    """A hint when the failure looks like TLS on one side only (the errors alone say nothing of it)."""
    text = str(exc).lower()
    if endpoint.tls is not None:
        if isinstance(exc, TimeoutError) or "wrong version number" in text or "record layer" in text:
            return " (a rediss:// URL: if the server does not speak TLS on this port, write redis://)"
    elif isinstance(exc, ConnectError) and any(word in text for word in ("reset by peer", "closed by", "broken pipe")):
        # The server hung up on the handshake: a TLS server does that to a plain client.
        return " (if the server speaks TLS on this port, write rediss://)"
    return ""


def _run_id(info: bytes) -> bytes | None:
    """The run_id line of an INFO server reply."""
    for line in info.splitlines():
        if line.startswith(b"run_id:"):
            return line[7:].strip() or None
    return None


_BULK_HEADS = tuple(b"$%d\r\n" % size for size in range(256))
"""RESP bulk-string headers, by length, for the lengths keys and tokens have."""

_script_heads: dict[tuple[bytes, int, int], bytes] = {}
"""(sha, keys, arguments) -> an EVALSHA's packed head: its length, EVALSHA, the sha, the key count."""


def pack_script(script: Script, keys: tuple[bytes, ...], args: tuple[bytes | int, ...]) -> bytes:
    """EVALSHA of *script*, packed once for every node (with the fallback ``(script, keys, args)``).

    The head is packed once per script and shape, then only keys and arguments are: hiredis's
    packer formats each argument's length with sprintf, ~10k machine instructions for a release's
    five; this takes half that (callgrind). The bytes are the same as ``pack()``'s.
    """
    shape = (script.sha, len(keys), len(args))
    head = _script_heads.get(shape)
    if head is None:
        # pack()'s own bytes after its "*3\r\n", under the whole command's argument count.
        head = _script_heads[shape] = b"*%d\r\n" % (3 + len(keys) + len(args)) + pack(
            (b"EVALSHA", script.sha, len(keys))
        ).removeprefix(b"*3\r\n")
    parts = [head]
    for arg in keys + args:
        if isinstance(arg, int):
            arg = b"%d" % arg
        size = len(arg)
        parts += (_BULK_HEADS[size] if size < 256 else b"$%d\r\n" % size, arg, b"\r\n")
    return b"".join(parts)


def pack(args: tuple[bytes | str | int, ...]) -> bytes:
    """RESP-encode a command with hiredis's packer: ~10x faster than redis-py's Python one
    (hiredis comes with redis[hiredis]); our arguments are only bytes, str and int."""
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # its stub types a 1-tuple
    return packed


def _server_error(message: str) -> str:
    """A server's error reply in words, without the command's arguments it may quote (a lock's token)."""
    text, _, _ = message.partition(", with args beginning with")
    return text if len(text) <= 200 else text[:197] + "..."


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
