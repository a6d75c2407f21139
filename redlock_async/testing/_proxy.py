"""A loopback TCP proxy in front of one server, for injecting network faults.

``Proxy(port)`` listens on 127.0.0.1 and forwards every connection to the
server on *port*. The proxies run on a background thread of their own, with
their own event loop, so they keep forwarding while the test's loop is busy
(or blocked), and they serve sync and async clients alike. Faults are
switched at runtime, from any thread:

* ``latency(s)``: hold each chunk *s* seconds before forwarding it, in the
  request direction, the reply direction or both;
* ``drop_replies()``: requests still reach the server (a SET runs) but what
  the server sends back is thrown away: the client sees silence;
* ``blackhole()``: nothing passes either way, and connections stay open, so
  the client sees silence, not a reset. Bytes are held, not lost, as TCP
  holds them through a partition: they arrive, in order, once healed;
* ``reset()``: cut every open connection (RST to both sides);
* ``heal()``: end every fault.

Each fault method returns a :class:`Fault`, which ends the fault when its
``with`` block exits, after its *duration*, or on ``fault.end()``::

    with proxy.blackhole():            # silent until the block exits
        ...
    proxy.latency(0.2, duration=1.0)   # slow for one second, then normal again

A TCP stream cannot lose bytes and stay in step: a client whose replies were
dropped would match later replies to the wrong requests. So when a
drop_replies fault ends, the proxy resets every connection that lost bytes,
as a real network would end it sooner or later, and the client reconnects.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import math
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

__all__ = ["Fault", "Proxy", "ProxyState", "ProxyStats"]

Direction = Literal["both", "request", "reply"]

_T = TypeVar("_T")

_HELD_LIMIT = 4 * 1024 * 1024  # bytes held per direction (latency, blackhole) before reading from the sender pauses
_CONTROL_TIMEOUT = 5.0  # seconds a fault switch may wait for the proxy's thread
_JOIN_TIMEOUT = 5.0
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
        return self == _HEALTHY


_HEALTHY = ProxyState()


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Counters since the proxy started."""

    open_connections: int
    accepted: int
    request_bytes: int
    """Bytes forwarded from clients to the server."""
    reply_bytes: int
    """Bytes forwarded from the server to clients."""
    dropped_bytes: int
    """Reply bytes thrown away by drop_replies."""
    resets: int
    """Connections cut by reset(), by the end of a drop_replies fault, or because the server was down."""


class Fault:
    """One fault set on a :class:`Proxy`.

    It lasts until :meth:`end`, the end of its ``with`` block, its duration,
    or ``proxy.heal()``, whichever comes first. A later fault of the same
    kind takes over; ending the earlier one then changes nothing.
    """

    def __init__(self, proxy: Proxy, description: str, changes: dict[str, Any]) -> None:
        self._proxy = proxy
        self._description = description
        self._changes = changes  # ProxyState field -> value

    def __repr__(self) -> str:
        state = "active" if self.active else "ended"
        return f"<Fault {self._description} on 127.0.0.1:{self._proxy.port} {state}>"

    @property
    def active(self) -> bool:
        """Whether this fault still sets part of the proxy's state."""
        if self._proxy.closed:
            return False
        return self._proxy._call(lambda: self in self._proxy._owners.values())

    def end(self) -> None:
        """Undo what this fault still sets. Idempotent, and a no-op once the proxy is closed."""
        if not self._proxy.closed:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                self._proxy._call(lambda: self._proxy._end(self))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()


def _check_seconds(name: str, value: float, *, zero_ok: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    number = float(value)
    if math.isnan(number) or math.isinf(number) or number < 0 or (number == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")
    return number


class _Runner:
    """The thread and event loop that every open proxy of the process shares.

    One thread for all proxies: a request fanned out to five proxied nodes
    wakes one thread, not five. It starts with the first proxy and ends
    with the last one's close().
    """

    _guard = threading.Lock()
    _current: _Runner | None = None

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.users = 0
        self.thread = threading.Thread(target=self._run, name="redlock-proxies")
        self.thread.daemon = True  # never keeps an interrupted test run alive; the last close() joins it
        self.thread.start()

    @classmethod
    def attach(cls) -> _Runner:
        with cls._guard:
            runner = cls._current
            if runner is None:
                runner = cls._current = _Runner()
            runner.users += 1
            return runner

    def detach(self) -> None:
        with self._guard:
            self.users -= 1
            if self.users:
                return
            if _Runner._current is self:
                _Runner._current = None
        if threading.get_ident() == self.thread.ident:
            raise RuntimeError("the last proxy cannot be closed from the proxies' own thread")
        with contextlib.suppress(RuntimeError):  # the loop already ended
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(_JOIN_TIMEOUT)
        if self.thread.is_alive():
            raise RuntimeError(f"thread {self.thread.name} did not stop within {_JOIN_TIMEOUT} s")

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run *coro* on the loop, from another thread, and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=_CONTROL_TIMEOUT)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                leftovers = asyncio.all_tasks(self.loop)
                for task in leftovers:
                    task.cancel()
                self.loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                self.loop.close()


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of one server, with switchable faults.

    *upstream_port* is the server's port, or a function giving it (asked at
    every new connection, for servers whose port is chosen later). The proxy
    listens on *port* (default: a free one) from construction until
    :meth:`close`; use it as a context manager to close it.
    """

    def __init__(
        self,
        upstream_port: int | Callable[[], int],
        *,
        upstream_host: str = "127.0.0.1",
        port: int = 0,
        connect_timeout: float = 2.0,
    ) -> None:
        self._upstream_port = upstream_port
        self._upstream_host = upstream_host
        self._connect_timeout = _check_seconds("connect_timeout", connect_timeout, zero_ok=False)
        self._state = _HEALTHY
        self._owners: dict[str, Fault] = {}  # ProxyState field -> the fault that set it
        self._pipes: set[_Pipe] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._accepted = self._request_bytes = self._reply_bytes = self._dropped = self._resets = 0
        self._timers: set[asyncio.TimerHandle] = set()
        self._closed = False
        self._close_lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        """The port the proxy listens on (127.0.0.1)."""
        self._runner = _Runner.attach()
        self._loop = self._runner.loop
        try:
            self._server = self._runner.run(self._start())
        except BaseException:
            self._closed = True
            self._listener.close()
            self._runner.detach()
            raise

    def __repr__(self) -> str:
        state = "closed" if self._closed else repr(self._state)
        return f"<Proxy 127.0.0.1:{self.port} -> {self._upstream_host}:{self._upstream()} {state}>"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>``: give it to clients instead of the server's URL."""
        return f"redis://127.0.0.1:{self.port}"

    @property
    def upstream(self) -> tuple[str, int]:
        """The server's (host, port)."""
        return self._upstream_host, self._upstream()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def state(self) -> ProxyState:
        """The faults in force now."""
        return self._state

    def stats(self) -> ProxyStats:
        """Connection and byte counters."""
        return self._call(
            lambda: ProxyStats(
                open_connections=len(self._pipes),
                accepted=self._accepted,
                request_bytes=self._request_bytes,
                reply_bytes=self._reply_bytes,
                dropped_bytes=self._dropped,
                resets=self._resets,
            )
        )

    # -- faults -----------------------------------------------------------------

    def latency(self, seconds: float, *, direction: Direction = "both", duration: float | None = None) -> Fault:
        """Hold every chunk *seconds* before forwarding it, in *direction* ("both", "request" or "reply").

        With "both", a request and its reply are each delayed: a round trip
        takes 2 x *seconds* longer. Order is kept. Applies to bytes already
        waiting too, so lowering it or healing takes effect at once.
        """
        delay = _check_seconds("latency", seconds, zero_ok=True)
        changes: dict[str, Any] = {}
        if direction in ("both", "request"):
            changes["request_delay"] = delay
        if direction in ("both", "reply"):
            changes["reply_delay"] = delay
        if not changes:
            raise ValueError(f'direction must be "both", "request" or "reply", got {direction!r}')
        return self._start_fault(f"latency {delay:g} s ({direction})", changes, duration)

    def drop_replies(self, *, duration: float | None = None) -> Fault:
        """Throw away what the server sends: requests still run there, their replies are lost.

        When it ends, connections that lost bytes are reset (they are out of step).
        """
        return self._start_fault("drop_replies", {"dropping_replies": True}, duration)

    def blackhole(self, *, duration: float | None = None) -> Fault:
        """Let nothing through, either way; connections stay open, bytes are held until healed."""
        return self._start_fault("blackhole", {"blackholed": True}, duration)

    def heal(self) -> None:
        """End every fault (held bytes flow again; connections that lost bytes are reset)."""
        self._call(self._heal)

    def reset(self) -> int:
        """Cut every open connection now, with a reset to both sides; returns how many were cut."""
        return self._call(self._reset_all)

    # -- lifecycle ----------------------------------------------------------------

    def close(self) -> None:
        """Cut every connection, stop listening and end the thread. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            if threading.get_ident() == self._runner.thread.ident:
                raise RuntimeError("a proxy cannot be closed from the proxies' own thread")
            self._runner.run(self._shutdown())
        finally:
            self._listener.close()
            self._runner.detach()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- control (any thread) -------------------------------------------------------

    def _call(self, fn: Callable[[], _T]) -> _T:
        """Run *fn* on the proxy's loop and return its result."""
        if threading.get_ident() == self._runner.thread.ident:
            return fn()
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        result: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(fn())
            except BaseException as exc:
                result.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return result.result(timeout=_CONTROL_TIMEOUT)

    def _start_fault(self, description: str, changes: dict[str, Any], duration: float | None) -> Fault:
        limit = None if duration is None else _check_seconds("duration", duration, zero_ok=False)
        fault = Fault(self, description + (f" for {limit:g} s" if limit is not None else ""), changes)
        self._call(lambda: self._apply(fault, limit))
        return fault

    # -- fault state (proxy loop only) ------------------------------------------------

    def _apply(self, fault: Fault, duration: float | None) -> None:
        for field in fault._changes:
            self._owners[field] = fault
        self._set_state(dataclasses.replace(self._state, **fault._changes))
        if duration is not None:
            handle: asyncio.TimerHandle

            def expire() -> None:
                self._timers.discard(handle)
                self._end(fault)

            handle = self._loop.call_later(duration, expire)
            self._timers.add(handle)

    def _end(self, fault: Fault) -> None:
        ended = [field for field, owner in self._owners.items() if owner is fault]
        for field in ended:
            del self._owners[field]
        if ended:
            self._set_state(dataclasses.replace(self._state, **{field: getattr(_HEALTHY, field) for field in ended}))

    def _heal(self) -> None:
        self._owners.clear()
        self._set_state(_HEALTHY)

    def _set_state(self, state: ProxyState) -> None:
        """Switch to *state*: held bytes due now go out, connections that lost replies are cut."""
        old, self._state = self._state, state
        for pipe in list(self._pipes):
            if old.dropping_replies and not state.dropping_replies and pipe.tainted:
                self._resets += 1
                pipe.abort()
            else:
                pipe.pump(pipe.request)
                pipe.pump(pipe.reply)

    def _reset_all(self) -> int:
        pipes = list(self._pipes)
        for pipe in pipes:
            pipe.abort()
        self._resets += len(pipes)
        return len(pipes)

    # -- the proxy's thread ----------------------------------------------------------

    def _upstream(self) -> int:
        port = self._upstream_port
        return port() if callable(port) else port

    async def _start(self) -> asyncio.Server:
        return await self._loop.create_server(lambda: _Pipe(self).client, sock=self._listener)

    async def _shutdown(self) -> None:
        self._server.close()
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        for pipe in list(self._pipes):
            pipe.abort()
        await asyncio.gather(*self._connecting, return_exceptions=True)
        await self._server.wait_closed()
        await asyncio.sleep(0)  # the aborted transports' connection_lost callbacks

    def _accept(self, pipe: _Pipe) -> None:
        self._accepted += 1
        self._pipes.add(pipe)
        task = self._loop.create_task(self._connect(pipe))
        pipe.connecting = task
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, pipe: _Pipe) -> None:
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._loop.create_connection(lambda: pipe.server, self._upstream_host, self._upstream())
        except (OSError, TimeoutError):
            # The server is down: the client's connection is refused, as it would be directly.
            pipe.connecting = None
            self._resets += 1
            pipe.abort()
        else:
            pipe.connected()


class _Side(asyncio.Protocol):
    """One socket of a proxied connection: the client's, or the server's."""

    __slots__ = ("is_server", "pipe", "transport")

    def __init__(self, pipe: _Pipe, *, is_server: bool) -> None:
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


class _Flow:
    """One direction of a connection: bytes received and not yet forwarded, with their arrival times."""

    __slots__ = ("ended", "held", "held_bytes", "is_reply", "target_full", "timer")

    def __init__(self, *, is_reply: bool) -> None:
        self.is_reply = is_reply
        self.held: deque[tuple[float, bytes | None]] = deque()  # None: end of stream
        self.held_bytes = 0
        self.timer: asyncio.TimerHandle | None = None
        self.target_full = False  # the receiving socket's buffer is full
        self.ended = False  # end of stream passed on


class _Pipe:
    """A client connection and its connection to the server, forwarding between them.

    Callbacks only (no task per connection): bytes go straight through while the
    proxy is healthy, and wait in their flow's queue while a latency or blackhole holds them.
    """

    __slots__ = ("client", "closed", "connecting", "proxy", "reply", "request", "server", "tainted")

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.client = _Side(self, is_server=False)
        self.server = _Side(self, is_server=True)
        self.request = _Flow(is_reply=False)
        self.reply = _Flow(is_reply=True)
        self.connecting: asyncio.Task[None] | None = None
        self.tainted = False  # reply bytes were dropped: the client is out of step
        self.closed = False

    def made(self, side: _Side) -> None:
        if side is self.client:
            assert side.transport is not None
            side.transport.pause_reading()  # until the server is connected
            self.proxy._accept(self)
        elif self.closed:
            _abort(side.transport)

    def connected(self) -> None:
        """The server accepted: start reading from both sides."""
        self.connecting = None
        if not self.closed:
            self._update_reading(self.request)
            self._update_reading(self.reply)

    def received(self, side: _Side, data: bytes | None) -> None:
        if self.closed:
            return
        flow = self.reply if side.is_server else self.request
        if data is not None and flow.is_reply and self.proxy._state.dropping_replies:
            self.tainted = True
            self.proxy._dropped += len(data)
            return
        flow.held.append((self.proxy._loop.time(), data))
        if data is not None:
            flow.held_bytes += len(data)
        self.pump(flow)

    def pump(self, flow: _Flow) -> None:
        """Forward what *flow* holds that is due; set a timer for the rest."""
        if flow.timer is not None:
            flow.timer.cancel()
            flow.timer = None
        if self.closed:
            return
        proxy = self.proxy
        state = proxy._state
        target = (self.client if flow.is_reply else self.server).transport
        delay = state.reply_delay if flow.is_reply else state.request_delay
        now = proxy._loop.time()
        while flow.held and not state.blackholed and target is not None:
            arrived, data = flow.held[0]
            if arrived + delay > now:
                flow.timer = proxy._loop.call_at(arrived + delay, self.pump, flow)
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
                proxy._reply_bytes += len(data)
            else:
                proxy._request_bytes += len(data)
        self._update_reading(flow)

    def throttle(self, side: _Side, *, paused: bool) -> None:
        flow = self.request if side.is_server else self.reply  # the flow writing into *side*
        flow.target_full = paused
        self._update_reading(flow)

    def _update_reading(self, flow: _Flow) -> None:
        """Read from a flow's sender only while the receiver keeps up and not too much is held."""
        source = (self.server if flow.is_reply else self.client).transport
        if source is None or source.is_closing() or self.connecting is not None:
            return
        if flow.target_full or flow.held_bytes > _HELD_LIMIT:
            source.pause_reading()
        else:
            source.resume_reading()

    def _other(self, flow: _Flow) -> _Flow:
        return self.request if flow.is_reply else self.reply

    def lost(self, side: _Side, exc: Exception | None) -> None:
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
        self.proxy._pipes.discard(self)

    def _finish(self) -> None:
        """Close both sides gracefully (what was written still goes out)."""
        self.closed = True
        for flow in (self.request, self.reply):
            if flow.timer is not None:
                flow.timer.cancel()
        for side in (self.client, self.server):
            if side.transport is not None:
                side.transport.close()
        self.proxy._pipes.discard(self)


def _abort(transport: asyncio.Transport | None) -> None:
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
    transport.abort()
