"""A Sentinel-managed primary as one voter (``redis+sentinel://HOST:PORT/SERVICE``): where it is now.

A Sentinel voter is a node (``_node.Node``) like any other, with one connection; only the address
it connects to is asked, at every (re)connect, of the Sentinels (``SENTINEL
get-master-addr-by-name``, all of them at once, the first answer taken). The handshake then
checks that the server is a master (a Sentinel behind the times names a demoted one: refused,
and asked again at the next use). So the voter follows a failover the way a node follows a
restart: the old master's connection breaks (it died) or its first write is refused
(``READONLY``: it was demoted, ``_node.py`` drops the connection), the next connect asks the
Sentinels, and the promoted replica, a new server, is judged by the restart quarantine, which
keeps a promoted replica out a whole period (``_algorithm.sit_out``): a failover is a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Sequence
from typing import Protocol

import hiredis

from redlock_async._nodes._endpoint import Endpoint
from redlock_async._nodes._outbox import Outbox
from redlock_async._nodes._wire import pack, read_replies

log = logging.getLogger("redlock_async._node")  # said of a node, as its connection's other words

_ASK = b"get-master-addr-by-name"


class SentinelError(ConnectionError):
    """No Sentinel named the master; the text says what each one answered (no password in it)."""


async def master_address(endpoint: Endpoint) -> tuple[str, int]:
    """(host, port) of the master the Sentinels of *endpoint* name for its service now (the first answer)."""
    assert endpoint.service is not None
    asks = [asyncio.ensure_future(_ask(sentinel, endpoint.service)) for sentinel in endpoint.sentinels]
    said: list[str] = []
    try:
        for next_answer in asyncio.as_completed(asks):
            try:
                return await next_answer
            except (OSError, SentinelError, ssl.SSLError, ValueError) as exc:
                said.append(str(exc))
    finally:
        for ask in asks:
            ask.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*asks, return_exceptions=True)
    raise SentinelError(f"no Sentinel named the master of {endpoint.service!r}: {'; '.join(said)}")


async def _ask(sentinel: Endpoint, service: str) -> tuple[str, int]:
    """Ask one Sentinel for the master of *service*."""
    name = sentinel.name
    try:
        reader, writer = await asyncio.open_connection(
            sentinel.host, sentinel.port, ssl=sentinel.tls, server_hostname=sentinel.server_hostname
        )
    except OSError as exc:
        raise SentinelError(f"Sentinel {name}: cannot connect ({exc.strerror or exc})") from None
    try:
        commands: list[tuple[bytes | str | int, ...]] = []
        username, password = await sentinel.credentials()
        if password is not None:
            commands.append((b"AUTH", username, password) if username else (b"AUTH", password))
        commands.append((b"SENTINEL", _ASK, service))
        writer.write(b"".join(pack(command) for command in commands))
        replies = await _replies(reader, len(commands), name)
    finally:
        writer.close()
    for reply in replies[:-1]:
        if isinstance(reply, hiredis.ReplyError):
            raise SentinelError(f"Sentinel {name}: AUTH refused ({reply}); set sentinel_password= in the URL")
    answer = replies[-1]
    if isinstance(answer, hiredis.ReplyError):
        text = str(answer)
        hint = " (put the Sentinels' password in the URL as sentinel_password=)" if "NOAUTH" in text else ""
        if "unknown command" in text.lower() or "unknown subcommand" in text.lower():
            hint = " (is it a Sentinel? redis+sentinel:// names Sentinels, not the data nodes)"
        raise SentinelError(f"Sentinel {name}: {text}{hint}")
    if answer is None:
        raise SentinelError(f"Sentinel {name} monitors no master named {service!r} (check the URL's /SERVICE)")
    if not isinstance(answer, list) or len(answer) != 2:
        raise SentinelError(f"Sentinel {name}: unexpected answer {answer!r}")
    host, port = answer
    return bytes(host).decode(), int(port)


async def _replies(reader: asyncio.StreamReader, count: int, name: str) -> list[object]:
    replies = await read_replies(reader, count)
    if replies is None:
        raise SentinelError(f"Sentinel {name} closed the connection")
    return replies


class _Connected(Protocol):
    name: str
    outbox: Outbox


class SwitchWatch:
    """Hears ``+switch-master`` from the Sentinels of one voter (one at a time, the next when one fails) and,
    when its service switched, drops the connections of *nodes* (its command and pub/sub connections): each
    reconnects to the new master the Sentinels name, at its next use, without waiting for a command to fail
    there first (a demoted master answers ``READONLY``; one cut off from the Sentinels would answer on)."""

    RETRY = 1.0
    """Seconds before the next Sentinel is tried when one cannot be reached or hangs up."""

    def __init__(self, endpoint: Endpoint, nodes: Sequence[_Connected]) -> None:
        assert endpoint.service is not None
        self._endpoint = endpoint
        self._service = endpoint.service.encode()
        self._nodes = tuple(nodes)
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.switches = 0
        """How many switches of its service it heard."""

    def start(self) -> None:
        """Listen from now on (idempotent; on the running loop)."""
        if self._task is None and not self._closed:
            name = f"redlock-sentinel-watch {self._endpoint.name}"
            self._task = asyncio.get_running_loop().create_task(self._run(), name=name)

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _run(self) -> None:
        while True:
            for sentinel in self._endpoint.sentinels:
                with contextlib.suppress(OSError, SentinelError, ssl.SSLError, ValueError, hiredis.ProtocolError):
                    await self._listen(sentinel)
                await asyncio.sleep(self.RETRY)

    async def _listen(self, sentinel: Endpoint) -> None:
        reader, writer = await asyncio.open_connection(
            sentinel.host, sentinel.port, ssl=sentinel.tls, server_hostname=sentinel.server_hostname
        )
        try:
            commands: list[tuple[bytes | str | int, ...]] = []
            username, password = await sentinel.credentials()
            if password is not None:
                commands.append((b"AUTH", username, password) if username else (b"AUTH", password))
            commands.append((b"SUBSCRIBE", b"+switch-master"))
            writer.write(b"".join(pack(command) for command in commands))
            parser = hiredis.Reader()
            while data := await reader.read(65536):
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    if isinstance(reply, hiredis.ReplyError):
                        raise SentinelError(f"Sentinel {sentinel.name}: {reply}")
                    if isinstance(reply, list) and len(reply) == 3 and reply[0] == b"message":
                        self._heard(reply[2])
        finally:
            writer.close()

    def _heard(self, message: object) -> None:
        """``SERVICE OLD-IP OLD-PORT NEW-IP NEW-PORT``: for ours, drop the connections to the old master."""
        if not isinstance(message, bytes) or message.split(b" ", 1)[0] != self._service:
            return
        self.switches += 1
        log.info("redlock node %s: the Sentinels switched its master (%s)", self._endpoint.name, message.decode())
        for node in self._nodes:
            transport = node.outbox.transport
            if transport is not None:
                transport.abort()  # the connection's end is heard as any other (Node.lost): it reconnects
