"""Declared keys (issue 38 item 6), checked on a real server without a Dragonfly (none is installable here):
every primitive runs under ``MONITOR``, which shows each command a script calls (``[0 lua]``) beside the
script's own ``EVALSHA``/``EVAL`` line with its ``KEYS``; ``COMMAND GETKEYS`` names the keys of each such
command. A script may touch a key outside its ``KEYS`` only if it is marked ``undeclared`` (its source then
starts with Dragonfly's ``--!df flags=allow-undeclared-keys``, a comment to every other server): the
semaphore's slot scans and the read/write lock's readers, whose keys the node's state names. Every other
script runs under Dragonfly's default rules as far as this can tell.

Run it on every server of ``.ci/fetch-servers`` (``REDLOCK_SERVER_BIN``): MONITOR shows a script's commands
after its line on Redis 6.2 and before it on 7.0 and later; both are read."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import redlock_async._scripts as scripts
from redlock_async import ReadWriteLock, Redlock
from redlock_async._scripts import Script
from redlock_async.testing import LocalNode

BY_SHA = {value.sha.decode(): name for name, value in vars(scripts).items() if isinstance(value, Script)}
BUILT_KEY = re.compile(rb"(ARGV\[\d+\]|prefix) \.\. ")


def test_no_script_builds_a_key_from_its_arguments_or_is_marked_undeclared() -> None:
    """The static half: no key is built from ARGV (or a prefix) inside Lua, and no script carries the flag."""
    for name, value in vars(scripts).items():
        if isinstance(value, Script):
            assert not BUILT_KEY.search(value.source), name
            assert b"allow-undeclared-keys" not in value.source, name


@pytest.fixture
def node() -> Iterator[LocalNode]:
    with LocalNode() as node:
        yield node


class Monitor:
    """MONITOR of *node* on a socket of its own, read by a thread: each line as (client kind, words)."""

    def __init__(self, node: LocalNode) -> None:
        self.port = node.port
        self.lines: list[tuple[str, list[str]]] = []
        self._socket = socket.create_connection(("127.0.0.1", node.port))
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        buffer = b""
        while True:
            data = self._socket.recv(1 << 16)
            if not data:
                return
            buffer += data
            *complete, buffer = buffer.split(b"\r\n")
            for raw in complete:
                line = raw.decode("latin-1")
                if not line.startswith("+") or "[" not in line:
                    continue
                client, _, rest = line.partition("[")[2].partition("]")
                words = QUOTED.findall(rest)
                if "redlock-monitor-stop" in rest:
                    return
                self.lines.append(("lua" if client.endswith("lua") else "client", [_unescape(w) for w in words]))

    def __enter__(self) -> Monitor:
        self._socket.sendall(b"MONITOR\r\n")
        assert self._socket.recv(5) == b"+OK\r\n"
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        redis.Redis(port=self.port).get("redlock-monitor-stop")
        self._thread.join(10)
        self._socket.close()


QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _unescape(word: str) -> str:
    return re.sub(
        r"\\(x[0-9a-f]{2}|.)", lambda m: chr(int(m.group(1)[1:], 16)) if len(m.group(1)) == 3 else m.group(1), word
    )


async def exercise(url: str) -> None:
    """Every primitive, as users run them, with and without the grant queue."""
    for queue in (True, False):
        async with Redlock([url], ttl=2.0, queue=queue) as redlock:
            lock = redlock.lock("dk:lock", fencing=True)
            async with lock:
                await asyncio.sleep(1.5)  # a watchdog extension
            other = redlock.lock("dk:lock")
            assert await other.acquire(blocking=False)
            await other.extend()
            await other.release()
            async with redlock.lock_many(["dk:a", "dk:b"], fencing=True):
                pass
            semaphore = redlock.semaphore("dk:sem", limit=3)
            async with semaphore:
                await asyncio.sleep(1.5)
            rw = redlock.rw_lock("dk:rw")
            async with rw.read():
                await asyncio.sleep(1.5)
            writer = rw.write()
            assert await writer.acquire()
            async with writer.downgrade():
                pass
            # Readers granted from the line (queue=True) or woken (queue=False) behind a writer, and a writer
            # behind readers: every script of the line grants others than its sender.
            writer = rw.write()
            assert await writer.acquire()

            async def read(rw: ReadWriteLock) -> None:
                reader = rw.read()
                assert await reader.acquire(timeout=3.0)
                await asyncio.sleep(0.3)
                await reader.release()

            readers = [asyncio.create_task(read(rw)) for _ in range(2)]
            await asyncio.sleep(0.2)
            await writer.release()
            await asyncio.sleep(0.1)
            late = rw.write()
            assert await late.acquire(timeout=3.0)
            await late.release()
            await asyncio.gather(*readers)
            async with redlock.election("dk:leader").campaign():
                pass
            # A waiter behind a holder: the line, its stay and its leave.
            held = redlock.lock("dk:line")
            assert await held.acquire()

            async def wait() -> None:
                async with redlock.lock("dk:line", acquire_timeout=3.0):
                    pass

            waiter = asyncio.create_task(wait())
            await asyncio.sleep(0.2)
            await held.release()
            await waiter
            await redlock.inspect("dk:lock")


def undeclared(lines: list[tuple[str, list[str]]], keys_of: Any) -> dict[str, set[str]]:
    """Per script (its name), the keys its commands touched outside its KEYS. A script's commands are the
    ``lua`` lines next to its own line: after it on Redis 6.2, before it on 7.0 and later (told by the
    first script line: whether ``lua`` lines came before any)."""
    first = next((i for i, (kind, words) in enumerate(lines) if kind == "client" and _is_script(words)), None)
    if first is None:
        return {}
    before = any(kind == "lua" for kind, _ in lines[:first])
    calls: list[tuple[str, list[str], list[list[str]]]] = []
    loose: list[list[str]] = []
    for kind, words in lines:
        if kind == "lua":
            if before:
                loose.append(words)
            elif calls:
                calls[-1][2].append(words)
        elif _is_script(words):
            script = BY_SHA.get(words[1], "EVAL") if words[0].upper() == "EVALSHA" else "EVAL"
            calls.append((script, words[3 : 3 + int(words[2])], loose if before else []))
            loose = []
        elif before:
            loose = []  # (another client's command between: the lua lines are the next script's)
    found: dict[str, set[str]] = {}
    for script, declared, commands in calls:
        for command in commands:
            for key in keys_of(command):
                if key not in declared:
                    found.setdefault(script, set()).add(key)
    return found


def _is_script(words: list[str]) -> bool:
    return len(words) >= 3 and words[0].upper() in ("EVALSHA", "EVAL")


async def test_no_script_touches_a_key_outside_its_keys_unless_marked(node: LocalNode) -> None:
    with Monitor(node) as monitor:
        await exercise(node.url)
    client = redis.Redis(port=node.port, decode_responses=True, encoding="latin-1")
    try:
        connection = client.connection_pool.get_connection()
    except TypeError:  # redis-py before 5.3 wants a command name
        connection = client.connection_pool.get_connection("COMMAND")
    cache: dict[tuple[str, ...], list[str]] = {}

    def keys_of(command: list[str]) -> list[str]:
        if tuple(command) not in cache:
            connection.send_command("COMMAND", "GETKEYS", *command)  # type: ignore[no-untyped-call]
            try:
                cache[tuple(command)] = list(connection.read_response())
            except redis.ResponseError:
                cache[tuple(command)] = []  # a command with no key (TIME, PUBLISH: a channel is no key)
        return cache[tuple(command)]

    scripted = sum(kind == "lua" for kind, _ in monitor.lines)
    assert scripted > 100, monitor.lines[:20]  # the scripts' commands were seen
    found = undeclared(monitor.lines, keys_of)
    ran = {BY_SHA.get(words[1], "EVAL") for kind, words in monitor.lines if kind == "client" and _is_script(words)}
    assert not found, found
    # (They ran: the semaphore was taken and given back; the read/write lock's readers and writers took,
    # extended, released, downgraded and waited in line, granted by others' scripts.)
    assert {"ACQUIRE_PERMIT", "PERMIT_LEAVE"} <= ran, ran
    rw = {
        "RW_READ",
        "RW_WRITE",
        "RW_READ_RELEASE",
        "RW_READ_EXTEND",
        "RW_DOWNGRADE",
        "RW_ENTER",
        "RW_QUEUE_LEAVE",
        "RW_QUEUE_DOWNGRADE",
    }
    assert rw <= ran, rw - ran
