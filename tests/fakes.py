"""What the server-free tests share: one fake node, and virtual time.

* :class:`FakeNode` stands where a ``_node.Node`` would, for the callback layer (ballots,
  claims, the watchdog's rounds, the listener, the quarantine's probe). It keeps every request
  as the node would write it (RESP bytes) and as the command's arguments parsed back
  (:attr:`FakeNode.sent`), and either answers at once (*respond*) or keeps the request for the
  test to answer (:meth:`FakeNode.answer`, oldest first), as a real node answers in order.
* :func:`virtual` runs a test coroutine on looptime's event loop, where sleeps and timers take
  no real time, with ``_clock`` reading that loop's time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import hiredis
import looptime

from redlock_async._core import _clock
from redlock_async._nodes._load import NodeLoad
from redlock_async._nodes._node import Node
from redlock_async._nodes._wire import Receiver, Reply, Resolve, pack, pack_script
from redlock_async._scripts import Script

NO_ANSWER: Any = object()
"""What *respond* returns to keep a request unanswered (the test answers it later)."""


@dataclass(frozen=True)
class Request:
    """One request to a fake node: where its reply goes, and what was sent."""

    receiver: Receiver
    index: int
    packed: bytes
    args: tuple[bytes, ...]


def parse(packed: bytes) -> tuple[bytes, ...]:
    """A packed command's arguments, as the server reads them (numbers come back as bytes)."""
    reader = hiredis.Reader()
    reader.feed(packed)
    return tuple(reader.gets())


def _fresh_load() -> NodeLoad:
    return NodeLoad(max_unanswered=1 << 20, stall_after=5.0, max_rto=1.0)


@dataclass(eq=False)
class FakeNode:
    """A node without a server: the attributes the callback layer reads, and its requests."""

    name: str
    quarantined_until: float = 0.0
    quarantine_reason: str = ""
    clock_held_until: float = 0.0
    connect_started: float = 0.0
    vouching: list[Callable[[], None]] | None = None
    vouch_until: float = 0.0
    eviction: str = ""  # the maxmemory-policy that can evict ("" when none: ``_health/_evictions``)
    load: NodeLoad = field(default_factory=_fresh_load)
    respond: Callable[[Request], Reply] | None = None
    """Answers each request at once (or returns NO_ANSWER to keep it waiting); None: keep them all."""
    requests: list[Request] = field(default_factory=list)
    """Every request, oldest first."""
    waiting: list[Request] = field(default_factory=list)
    """Requests not answered yet, oldest first."""

    @property
    def sent(self) -> list[tuple[bytes, ...]]:
        """The arguments of every request, oldest first."""
        return [request.args for request in self.requests]

    def send_packed(self, receiver: Receiver, index: int, packed: bytes, **_: Any) -> None:
        request = Request(receiver, index, packed, parse(packed))
        self.requests.append(request)
        reply = NO_ANSWER if self.respond is None else self.respond(request)
        if reply is NO_ANSWER:
            self.waiting.append(request)
        else:
            receiver.deliver(index, reply)

    def send_timed(self, clock: Receiver, receiver: Receiver, index: int, packed: bytes, **options: Any) -> None:
        """A TIME, then the command (as ``Node.send_timed``): two requests here."""
        self.send_packed(clock, index, pack((b"TIME",)))
        self.send_packed(receiver, index, packed, **options)

    def send(self, *args: bytes | str | int, **options: Any) -> asyncio.Future[Reply]:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.send_packed(Resolve(future), 0, pack(args), **options)
        return future

    def send_script(
        self, script: Script, keys: tuple[bytes, ...], args: tuple[bytes | int, ...], **options: Any
    ) -> asyncio.Future[Reply]:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.send_packed(Resolve(future), 0, pack_script(script, keys, args), **options)
        return future

    def send_first(self, *requests: tuple[Receiver, tuple[bytes | str | int, ...]]) -> None:
        for receiver, command in requests:
            self.send_packed(receiver, 0, pack(command))

    def answer(self, reply: Reply, *, latest: bool = False) -> Request:
        """Answer the oldest request still waiting (or, with *latest*, the newest); returns it."""
        request = self.waiting.pop(-1 if latest else 0)
        request.receiver.deliver(request.index, reply)
        return request


def fake_nodes(n: int = 5, **attributes: Any) -> list[FakeNode]:
    """*n* fake nodes named ``fake:0`` ... ``fake:n-1``."""
    return [FakeNode(f"fake:{i}", **attributes) for i in range(n)]


def as_nodes(fakes: Sequence[FakeNode]) -> list[Node]:
    """The fakes typed as what the library takes."""
    return cast(list[Node], list(fakes))


def virtual(test: Callable[[], Awaitable[None]], *, start: float = 100.0) -> None:
    """Run *test* on a virtual-time event loop (looptime): a sleep of an hour takes no time."""
    loop = looptime.new_event_loop(start=start, _enabled=True)
    try:
        with _clock.use(loop.time):
            loop.run_until_complete(test())
    finally:
        loop.close()
