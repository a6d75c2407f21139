"""The wire of one node connection: what a command and a reply are, how commands are packed, and
the asyncio protocol that carries the bytes.

* :class:`Receiver`: where a reply goes, the moment it is parsed (a ballot, a future's
  :class:`Resolve`, a :class:`Reaction`, or :data:`IGNORED`).
* :class:`Failure`: a request that produced no reply to count (never an exception: an abandoned
  future must never log "exception never retrieved"); raw server errors become one here
  (:func:`error_reply`).
* :func:`pack` and :func:`pack_script`: RESP encoding with hiredis's packer, an EVALSHA's head
  packed once per script and shape.
* :class:`Wire`: the ``asyncio.Protocol`` of one connection, from its first byte; it hands the
  bytes to its owner (the node parses them with ``hiredis.Reader``) and keeps flow control.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeAlias

import hiredis

from redlock_async._core import Vote
from redlock_async._scripts import Script

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


class Resolve:
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


class WireOwner(Protocol):
    """What a :class:`Wire` tells: the bytes that came, and the end of its connection."""

    def received(self, wire: Wire, data: bytes, /) -> None: ...

    def lost(self, wire: Wire, exc: BaseException | None, /) -> None: ...


class Wire(asyncio.Protocol):
    """The protocol of one connection, ours from the first byte: bytes in (to its owner, which parses
    them), the end of the connection, and flow control."""

    __slots__ = ("_drain", "_owner", "data_received")

    data_received: Callable[[bytes], None]  # type: ignore[assignment]  # an attribute in place of the method
    """Bytes from the server: straight to ``owner.received(wire, data)``, a partial (no frame of ours between
    the transport and the parser: one per reply saved)."""

    def __init__(self, owner: WireOwner) -> None:
        self._owner = owner
        self.data_received = partial(owner.received, self)
        self._drain: asyncio.Future[None] | None = None  # set while the socket's buffer is too full

    def eof_received(self) -> bool:
        return False  # the server hung up: close, and connection_lost says so

    def connection_lost(self, exc: Exception | None) -> None:
        self._release_drain()
        self._owner.lost(self, exc)

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


def error_reply(text: str) -> Failure:
    """A server's error reply as a failed vote: its text, with its code word but for the generic ``ERR``
    (``MOVED``, ``CROSSSLOT``, ``NOPERM``, ``OOM``, ``READONLY``... say what happened; ``ERR`` says nothing)."""
    code, _, rest = text.partition(" ")
    detail = server_error(rest if rest and code == "ERR" else text)
    return Failure(Vote.ERROR, detail, noscript=code == "NOSCRIPT", answered=True)


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


def script_head(script: Script, keys: tuple[bytes, ...], nargs: int) -> bytes:
    """EVALSHA of *script* with *keys*, packed up to its *nargs* arguments: what :func:`pack_script`'s
    bytes start with, for a command sent many times with the same keys (a lock's release: only its
    token changes, added with :func:`bulk`)."""
    shape = (script.sha, len(keys), nargs)
    head = _script_heads.get(shape)
    if head is None:  # (as in pack_script)
        head = _script_heads[shape] = b"*%d\r\n" % (3 + len(keys) + nargs) + pack(
            (b"EVALSHA", script.sha, len(keys))
        ).removeprefix(b"*3\r\n")
    parts = [head]
    for key in keys:
        size = len(key)
        parts += (_BULK_HEADS[size] if size < 256 else b"$%d\r\n" % size, key, b"\r\n")
    return b"".join(parts)


def bulk(arg: bytes) -> bytes:
    """*arg* as one RESP bulk string (an argument after a :func:`script_head`)."""
    size = len(arg)
    return (_BULK_HEADS[size] if size < 256 else b"$%d\r\n" % size) + arg + b"\r\n"


def pack(args: tuple[bytes | str | int, ...]) -> bytes:
    """RESP-encode a command with hiredis's packer: ~10x faster than redis-py's Python one
    (hiredis comes with redis[hiredis]); our arguments are only bytes, str and int."""
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # its stub types a 1-tuple
    return packed


def eval_again(
    fallback: tuple[Script, tuple[bytes, ...], tuple[bytes | int, ...]], on_the_wire: Iterable[Fallback]
) -> bytes | Failure:
    """An EVALSHA the server did not know, packed again as EVAL (which caches the script); or why not.

    It will run after the commands already on the wire (*on_the_wire*: their fallbacks). For a
    script that gives its token something (``Script.creates``: a lock key, a place in line), that
    could put an acquire after its own release (a key left with no holder): such a script is not
    sent again when a command on the wire names one of its keys, and fails instead (nothing ran).
    Every other script (a release, a leave, an extension) only takes away what is its token's, and
    is always sent again: not running is what would harm (a leave that never ran keeps a departed
    waiter in line, and the next release hands it the key).
    """
    script, keys, args = fallback
    if script.creates:
        touched = set(keys)
        if any(later is not None and touched.intersection(later[1]) for later in on_the_wire):
            return Failure(
                Vote.ERROR,
                "the server had lost the script; not sent again, as a later command on its key already ran",
                answered=True,
            )
    return pack((b"EVAL", script.source, len(keys), *keys, *args))


def server_error(message: str) -> str:
    """A server's error reply in words, without the command's arguments it may quote (a lock's token)."""
    text, _, _ = message.partition(", with args beginning with")
    return text if len(text) <= 200 else text[:197] + "..."


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


async def read_replies(reader: asyncio.StreamReader, count: int) -> list[object] | None:
    """The next *count* replies read from *reader* (a one-shot connection of our own: a seed's, a
    Sentinel's), or None when the other side closed the connection first."""
    parser = hiredis.Reader()
    replies: list[object] = []
    while len(replies) < count:
        data = await reader.read(65536)
        if not data:
            return None
        parser.feed(data)
        while (reply := parser.gets()) is not False:
            replies.append(reply)
    return replies
