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
import math
import socket
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

from redlock_async.testing._pipes import ProxyState, Switchboard

__all__ = ["Fault", "Proxy", "ProxyState", "ProxyStats"]

Direction = Literal["both", "request", "reply"]

_T = TypeVar("_T")

_CONTROL_TIMEOUT = 5.0  # seconds a fault switch may wait for the proxy's thread
_JOIN_TIMEOUT = 5.0


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
        return self._proxy._call(lambda: self in self._proxy._board.owners.values())

    def end(self) -> None:
        """Undo what this fault still sets. Idempotent, and a no-op once the proxy is closed."""
        if not self._proxy.closed:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                self._proxy._call(lambda: self._proxy._board.end(self))

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
        timeout = _check_seconds("connect_timeout", connect_timeout, zero_ok=False)
        self._closed = False
        self._close_lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        """The port the proxy listens on (127.0.0.1)."""
        self._runner = _Runner.attach()
        self._loop = self._runner.loop
        # Its state on the proxies' loop: touched only there (control calls go through _call).
        self._board = Switchboard(self._loop, upstream_host, self._upstream, timeout)
        try:
            self._runner.run(self._board.start(self._listener))
        except BaseException:
            self._closed = True
            self._listener.close()
            self._runner.detach()
            raise

    def __repr__(self) -> str:
        state = "closed" if self._closed else repr(self._board.state)
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
        return self._board.state

    def stats(self) -> ProxyStats:
        """Connection and byte counters."""
        board = self._board
        return self._call(
            lambda: ProxyStats(
                open_connections=len(board.pipes),
                accepted=board.accepted,
                request_bytes=board.request_bytes,
                reply_bytes=board.reply_bytes,
                dropped_bytes=board.dropped,
                resets=board.resets,
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
        self._call(self._board.heal)

    def reset(self) -> int:
        """Cut every open connection now, with a reset to both sides; returns how many were cut."""
        return self._call(self._board.reset_all)

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
            self._runner.run(self._board.shutdown())
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
        self._call(lambda: self._board.apply(fault, changes, limit))
        return fault

    def _upstream(self) -> int:
        port = self._upstream_port
        return port() if callable(port) else port
