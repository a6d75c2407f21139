"""The simulated network: in-memory connections between clients and :class:`_node.SimNode` s, reached by the
library through the loop's ``create_connection`` (its one place that opens a connection, ``_handshake``).

A connection carries bytes both ways, in order (TCP), each message after a delay drawn from the run's
random source; a message that reaches a paused node or crosses a partition waits there until the node
resumes or the partition heals (TCP retransmits), so nothing is reordered. Faults: a node's pause, its
restart (down for a while: connects refused; every connection reset), a partition between a client and a
node, a slow link, a reset connection (the replies on their way are lost, the commands that reached the
node ran).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import hiredis

from redlock_async.testing.sim._loop import CLIENT, NOBODY, SimClient, SimLoop
from redlock_async.testing.sim._node import Session, SimNode
from redlock_async.testing.sim._store import Error, encode

if TYPE_CHECKING:
    from redlock_async.testing.sim._store import Reply


_AFTER = 1e-7
"""How long after the message before it, at least, a message on one connection arrives (TCP's order)."""


class Host:
    """A node as the network sees it: up or down, paused or running, and its connections."""

    def __init__(self, index: int, node: SimNode) -> None:
        self.index = index
        self.node = node
        self.up = True
        self.paused = False
        self.connections: list[Connection] = []


class Network:
    """The nodes of one run (``host:port`` to :class:`Host`), and the links' faults."""

    def __init__(self, loop: SimLoop, *, delay: float = 0.0005, jitter: float = 0.02, lag: float = 0.0) -> None:
        self.loop = loop
        self.delay = delay
        """Mean one-way delay of a message, seconds (a share *jitter* of them ten times more)."""
        self.jitter = jitter
        self.lag = lag
        """Seconds more on each client's links to its two far nodes (``Config.lag``)."""
        self.hosts: dict[tuple[str, int], Host] = {}
        self.blocked: set[tuple[str, int]] = set()
        """(client name, node index) pairs that a partition separates."""
        self.slow: dict[tuple[str, int], float] = {}
        """(client name, node index) -> extra delay of every message on that link."""
        self.messages = 0
        self.killed: list[Connection] = []  # connections of killed clients (their ends told at the run's end)
        loop.network = self

    def add(self, host: str, port: int, node: SimNode) -> Host:
        entry = self.hosts[(host, port)] = Host(len(self.hosts), node)
        return entry

    def by_index(self, index: int) -> Host:
        return list(self.hosts.values())[index]

    def one_way(self, client: str, host: Host) -> float:
        rng = self.loop.rng
        delay = rng.expovariate(1.0 / self.delay)
        if rng.random() < self.jitter:
            delay *= 10
        if self.lag and client[1:].isdigit() and (host.index - int(client[1:])) % len(self.hosts) < 2:
            delay += self.lag
        return delay + self.slow.get((client, host.index), 0.0)

    def passable(self, client: str, host: Host) -> bool:
        return (client, host.index) not in self.blocked

    def heal(self) -> None:
        """Every partition ends: what waited at either end goes on."""
        self.blocked.clear()
        for host in self.hosts.values():
            for connection in list(host.connections):
                connection.flush()

    async def connect(self, protocol_factory: Callable[[], asyncio.Protocol], host: str, port: int) -> Any:
        name, _, rest = host.partition(".")
        if rest.count(".") == 1 and rest.endswith(".sim"):
            host = f"{name}.sim"  # a client's own name for the node (n0.c1.sim: n0.sim)
        entry = self.hosts.get((host, port))
        client = CLIENT.get()
        name = client.name if client is not None else "-"
        if entry is None or not entry.up:
            await asyncio.sleep(self.one_way(name, entry) if entry is not None else 0.0)
            raise ConnectionRefusedError(111, f"Connect call failed ('{host}', {port})")
        while not self.passable(name, entry):  # noqa: ASYNC110 (SYNs are lost, and resent, until it heals)
            await asyncio.sleep(0.05)  # (the caller's connect timeout ends this)
        await asyncio.sleep(2 * self.one_way(name, entry))
        if not entry.up:
            raise ConnectionRefusedError(111, f"Connect call failed ('{host}', {port})")
        protocol = protocol_factory()
        connection = Connection(self, entry, name, client, protocol, contextvars.copy_context())
        entry.connections.append(connection)
        if client is not None:
            client.on_kill.append(connection.killed)
        protocol.connection_made(connection.transport)
        return connection.transport, protocol


class Connection:
    """One connection: the client's transport, the node's session, and the bytes in flight each way."""

    def __init__(
        self,
        network: Network,
        host: Host,
        client_name: str,
        client: SimClient | None,
        protocol: asyncio.Protocol,
        context: contextvars.Context,
    ) -> None:
        self.network = network
        self.loop = network.loop
        self.host = host
        self.client_name = client_name
        self.client = client
        self.protocol = protocol
        self.context = context
        self.closed = False
        self.reader = hiredis.Reader()
        self.session: Session = host.node.open_session(self.push)
        self.up_at = 0.0  # when the last message toward the node arrives (FIFO)
        self.down_at = 0.0
        self.up_waiting: list[bytes] = []  # arrived at a paused node or across a partition
        self.down_waiting: list[bytes] = []
        self.transport = Transport(self)

    # -- client to node ---------------------------------------------------------

    def send_up(self, data: bytes) -> None:
        if self.closed:
            return
        self.network.messages += 1
        # Strictly after the message before: the loop's timers at one instant run in no promised order.
        self.up_at = max(self.up_at + _AFTER, self.loop.now + self.network.one_way(self.client_name, self.host))
        self.loop.call_at_exactly(self.up_at, self._arrive_up, data, context=NOBODY)

    def _arrive_up(self, data: bytes) -> None:
        if self.closed:
            return
        if self.host.paused or not self.network.passable(self.client_name, self.host) or self.up_waiting:
            self.up_waiting.append(data)
            return
        self._run(data)

    def _run(self, data: bytes) -> None:
        node = self.host.node
        self.reader.feed(data)
        out: list[bytes] = []
        while (command := self.reader.gets()) is not False:
            if not isinstance(command, list) or not command:
                out.append(encode(Error("ERR Protocol error: expected an array of bulk strings")))
                continue
            replies = node.execute(self.session, command)
            if self.loop.verbose and command[0].upper() not in (b"SCRIPT", b"INFO", b"CLIENT"):
                self.loop.log(f"{self.client_name}->{node.name} {_words(command)} => {_words(replies)}", detail=True)
            for reply in replies:
                out.append(encode(reply))
        if out:
            self.send_down(b"".join(out))

    def push(self, reply: Reply) -> None:
        """A message the node pushes to this connection (pub/sub)."""
        self.send_down(encode(reply))

    # -- node to client ---------------------------------------------------------

    def send_down(self, data: bytes) -> None:
        if self.closed:
            return
        self.network.messages += 1
        self.down_at = max(self.down_at + _AFTER, self.loop.now + self.network.one_way(self.client_name, self.host))
        self.loop.call_at_exactly(self.down_at, self._arrive_down, data, context=self.context)

    def _arrive_down(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.network.passable(self.client_name, self.host) or self.down_waiting:
            self.down_waiting.append(data)
            return
        self.protocol.data_received(data)

    def flush(self) -> None:
        """Deliver what waited (a node resumed, a partition healed), in order."""
        if self.closed:
            return
        if not self.host.paused and self.network.passable(self.client_name, self.host):
            up, self.up_waiting = self.up_waiting, []
            for data in up:
                self._run(data)
        if self.network.passable(self.client_name, self.host) and self.down_waiting:
            down, self.down_waiting = self.down_waiting, []
            self.loop.call_soon(self.protocol.data_received, b"".join(down), context=self.context)

    # -- ends -------------------------------------------------------------------

    def reset(self, reason: str = "Connection reset by peer") -> None:
        """The connection breaks: what is on its way is lost; the client hears it a delay later."""
        if self.closed:
            return
        self._close_node_side()
        delay = self.network.one_way(self.client_name, self.host)
        self.loop.call_at_exactly(
            self.loop.now + delay,
            self.protocol.connection_lost,
            ConnectionResetError(104, reason),
            context=self.context,
        )

    def killed(self) -> None:
        """The client's process died: the node sees the connection close, soon."""
        self.network.killed.append(self)
        if not self.closed:
            self.loop.call_at_exactly(
                self.loop.now + self.network.one_way(self.client_name, self.host), self._close_node_side, context=NOBODY
            )
            self.closed = True

    def end_of_run(self) -> None:
        """The run is over and a killed client is revived to be cancelled: its end learns the connection is gone."""
        self.loop.call_soon(self.protocol.connection_lost, ConnectionResetError(104, "killed"), context=self.context)

    def closed_by_client(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.call_at_exactly(
            self.loop.now + self.network.one_way(self.client_name, self.host), self._close_node_side, context=NOBODY
        )
        self.loop.call_soon(self.protocol.connection_lost, None, context=self.context)

    def _close_node_side(self) -> None:
        self.closed = True
        self.host.node.close_session(self.session)
        if self in self.host.connections:
            self.host.connections.remove(self)


class Transport(asyncio.Transport):
    """The client's end of a :class:`Connection`, as ``asyncio`` transports are used by the node's Wire."""

    def __init__(self, connection: Connection) -> None:
        super().__init__()
        self._connection = connection

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._connection.closed:
            return
        self._connection.send_up(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return self._connection.closed

    def close(self) -> None:
        self._connection.closed_by_client()

    def abort(self) -> None:
        self._connection.closed_by_client()

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def can_write_eof(self) -> bool:
        return False


def _words(value: Any) -> str:
    """A command or a reply in a trace line (a script by its sha's head, long values cut)."""
    if isinstance(value, list):
        if value and value[0] in (b"EVALSHA", b"EVAL", b"SCRIPT"):
            return " ".join([value[0].decode(), _words(value[1])[:8], *(_words(v) for v in value[2:])])
        return "[" + " ".join(_words(v) for v in value) + "]"
    if isinstance(value, bytes):
        text = value.decode(errors="replace").replace("\n", " ")
        return text if len(text) <= 24 else text[:21] + "..."
    return repr(value)
