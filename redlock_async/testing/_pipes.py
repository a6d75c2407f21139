"""A proxy's side on its thread: the faults in force, the connections it forwards, the counters.

:class:`Switchboard` is one :class:`_proxy.Proxy`'s state on the proxies' loop: every method
here runs on that loop (the proxy hands control calls over from any thread). Each proxied
connection is a :class:`Pipe`: the client's socket and the server's (two :class:`Side`
protocols) and a :class:`Flow` each way, forwarded by callbacks only (no task per
connection): bytes go straight through while the proxy is healthy, and wait in their flow's
queue while a latency or blackhole holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HELD_LIMIT = 4 * 1024 * 1024  # bytes held per direction (latency, blackhole) before reading from the sender pauses
_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST instead of FIN


@dataclass(frozen=True, slots=True)
class ProxyState:
    """The faults in force on a proxy."""

    request_delay: float = 0.0
    """Seconds each chunk from client to server is held."""
    reply_delay: float = 0.0
    """Seconds each chunk from server to client is held."""
    dropping_replies: bool = False
    blackholed: bool = False

    @property
    def healthy(self) -> bool:
        return self == HEALTHY


HEALTHY = ProxyState()


class Switchboard:
    """One proxy's state on the proxies' loop: faults (and which fault set each part), pipes, counters."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        upstream_host: str,
        upstream_port: Callable[[], int],
        connect_timeout: float,
    ) -> None:
        self.loop = loop
        self._upstream_host = upstream_host
        self._upstream_port = upstream_port
        self._connect_timeout = connect_timeout
        self.state = HEALTHY
        """The faults in force now."""
        self.owners: dict[str, object] = {}
        """ProxyState field -> the fault that set it."""
        self.pipes: set[Pipe] = set()
        """The connections open now."""
        self._connecting: set[asyncio.Task[None]] = set()
        self.accepted = self.request_bytes = self.reply_bytes = self.dropped = self.resets = 0
        self._timers: set[asyncio.TimerHandle] = set()
        self._server: asyncio.Server | None = None

    # -- faults -----------------------------------------------------------

    def apply(self, fault: object, changes: dict[str, Any], duration: float | None) -> None:
        """Set *changes* (ProxyState field -> value) for *fault*, for *duration* seconds (None: until ended)."""
        for field in changes:
            self.owners[field] = fault
        self._set_state(dataclasses.replace(self.state, **changes))
        if duration is not None:
            handle: asyncio.TimerHandle

            def expire() -> None:
                self._timers.discard(handle)
                self.end(fault)

            handle = self.loop.call_later(duration, expire)
            self._timers.add(handle)

    def end(self, fault: object) -> None:
        """Undo what *fault* still sets."""
        ended = [field for field, owner in self.owners.items() if owner is fault]
        for field in ended:
            del self.owners[field]
        if ended:
            self._set_state(dataclasses.replace(self.state, **{field: getattr(HEALTHY, field) for field in ended}))

    def heal(self) -> None:
        self.owners.clear()
        self._set_state(HEALTHY)

    def _set_state(self, state: ProxyState) -> None:
        """Switch to *state*: held bytes due now go out, connections that lost replies are cut."""
        old, self.state = self.state, state
        for pipe in list(self.pipes):
            if old.dropping_replies and not state.dropping_replies and pipe.tainted:
                self.resets += 1
                pipe.abort()
            else:
                pipe.pump(pipe.request)
                pipe.pump(pipe.reply)

    def reset_all(self) -> int:
        """Cut every open connection with a reset; how many were cut."""
        pipes = list(self.pipes)
        for pipe in pipes:
            pipe.abort()
        self.resets += len(pipes)
        return len(pipes)

    # -- connections ------------------------------------------------------

    async def start(self, listener: socket.socket) -> None:
        self._server = await self.loop.create_server(lambda: Pipe(self).client, sock=listener)

    async def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        for pipe in list(self.pipes):
            pipe.abort()
        await asyncio.gather(*self._connecting, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        await asyncio.sleep(0)  # the aborted transports' connection_lost callbacks

    def accept(self, pipe: Pipe) -> None:
        """A client connected through *pipe*: connect it to the server."""
        self.accepted += 1
        self.pipes.add(pipe)
        task = self.loop.create_task(self._connect(pipe))
        pipe.connecting = task
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, pipe: Pipe) -> None:
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self.loop.create_connection(lambda: pipe.server, self._upstream_host, self._upstream_port())
        except (OSError, TimeoutError):
            # The server is down: the client's connection is refused, as it would be directly.
            pipe.connecting = None
            self.resets += 1
            pipe.abort()
        else:
            pipe.connected()


class Side(asyncio.Protocol):
    """One socket of a proxied connection: the client's, or the server's."""

    __slots__ = ("is_server", "pipe", "transport")

    def __init__(self, pipe: Pipe, *, is_server: bool) -> None:
        self.pipe = pipe
        self.is_server = is_server
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.pipe.made(self)

    def data_received(self, data: bytes) -> None:
        self.pipe.received(self, data)

    def eof_received(self) -> bool:
        self.pipe.received(self, None)
        return True  # keep the other direction open: a half-close is passed on as one

    def connection_lost(self, exc: Exception | None) -> None:
        self.pipe.lost(self, exc)

    def pause_writing(self) -> None:
        self.pipe.throttle(self, paused=True)

    def resume_writing(self) -> None:
        self.pipe.throttle(self, paused=False)


class Flow:
    """One direction of a connection: bytes received and not yet forwarded, with their arrival times."""

    __slots__ = ("ended", "held", "held_bytes", "is_reply", "target_full", "timer")

    def __init__(self, *, is_reply: bool) -> None:
        self.is_reply = is_reply
        self.held: deque[tuple[float, bytes | None]] = deque()  # None: end of stream
        self.held_bytes = 0
        self.timer: asyncio.TimerHandle | None = None
        self.target_full = False  # the receiving socket's buffer is full
        self.ended = False  # end of stream passed on


class Pipe:
    """A client connection and its connection to the server, forwarding between them."""

    __slots__ = ("board", "client", "closed", "connecting", "reply", "request", "server", "tainted")

    def __init__(self, board: Switchboard) -> None:
        self.board = board
        self.client = Side(self, is_server=False)
        self.server = Side(self, is_server=True)
        self.request = Flow(is_reply=False)
        self.reply = Flow(is_reply=True)
        self.connecting: asyncio.Task[None] | None = None
        self.tainted = False  # reply bytes were dropped: the client is out of step
        self.closed = False

    def made(self, side: Side) -> None:
        if side is self.client:
            assert side.transport is not None
            side.transport.pause_reading()  # until the server is connected
            self.board.accept(self)
        elif self.closed:
            _abort(side.transport)

    def connected(self) -> None:
        """The server accepted: start reading from both sides."""
        self.connecting = None
        if not self.closed:
            self._update_reading(self.request)
            self._update_reading(self.reply)

    def received(self, side: Side, data: bytes | None) -> None:
        if self.closed:
            return
        flow = self.reply if side.is_server else self.request
        board = self.board
        if data is not None and flow.is_reply and board.state.dropping_replies:
            self.tainted = True
            board.dropped += len(data)
            return
        flow.held.append((board.loop.time(), data))
        if data is not None:
            flow.held_bytes += len(data)
        self.pump(flow)

    def pump(self, flow: Flow) -> None:
        """Forward what *flow* holds that is due; set a timer for the rest."""
        if flow.timer is not None:
            flow.timer.cancel()
            flow.timer = None
        if self.closed:
            return
        board = self.board
        state = board.state
        target = (self.client if flow.is_reply else self.server).transport
        delay = state.reply_delay if flow.is_reply else state.request_delay
        now = board.loop.time()
        while flow.held and not state.blackholed and target is not None:
            arrived, data = flow.held[0]
            if arrived + delay > now:
                flow.timer = board.loop.call_at(arrived + delay, self.pump, flow)
                break
            flow.held.popleft()
            if data is None:
                flow.ended = True
                if self._other(flow).ended:
                    self._finish()  # both sides said all they had to say
                    return
                target.write_eof()  # a half-close, passed on as one
                break
            flow.held_bytes -= len(data)
            if target.is_closing():
                continue  # the receiver is gone: so are its bytes
            target.write(data)
            if flow.is_reply:
                board.reply_bytes += len(data)
            else:
                board.request_bytes += len(data)
        self._update_reading(flow)

    def throttle(self, side: Side, *, paused: bool) -> None:
        flow = self.request if side.is_server else self.reply  # the flow writing into *side*
        flow.target_full = paused
        self._update_reading(flow)

    def _update_reading(self, flow: Flow) -> None:
        """Read from a flow's sender only while the receiver keeps up and not too much is held."""
        source = (self.server if flow.is_reply else self.client).transport
        if source is None or source.is_closing() or self.connecting is not None:
            return
        if flow.target_full or flow.held_bytes > HELD_LIMIT:
            source.pause_reading()
        else:
            source.resume_reading()

    def _other(self, flow: Flow) -> Flow:
        return self.request if flow.is_reply else self.reply

    def lost(self, side: Side, exc: Exception | None) -> None:
        # Clean ends go through eof_received, and we close only once both flows ended:
        # a loss while open is a reset or an error, passed on as a reset.
        if not self.closed:
            self.abort()

    def abort(self) -> None:
        """Cut both sides at once with a reset; held bytes are lost with the connection."""
        if self.closed:
            return
        self.closed = True
        for flow in (self.request, self.reply):
            if flow.timer is not None:
                flow.timer.cancel()
            flow.held.clear()
        if self.connecting is not None:
            self.connecting.cancel()
        for side in (self.client, self.server):
            if side.transport is not None:
                _abort(side.transport)
        self.board.pipes.discard(self)

    def _finish(self) -> None:
        """Close both sides gracefully (what was written still goes out)."""
        self.closed = True
        for flow in (self.request, self.reply):
            if flow.timer is not None:
                flow.timer.cancel()
        for side in (self.client, self.server):
            if side.transport is not None:
                side.transport.close()
        self.board.pipes.discard(self)


def _abort(transport: asyncio.Transport | None) -> None:
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
    transport.abort()
