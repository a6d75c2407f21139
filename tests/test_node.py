"""One node's connection, below the lock: order of replies and a full socket buffer."""

from __future__ import annotations

import asyncio

from redlock_async._nodes._outbox import FLUSH_BUFFER_LIMIT
from redlock_async._nodes._wire import Failure
from redlock_async.testing import LocalNodes

from .conftest import one_node

VALUE = b"v" * 8192
ROUNDS = 2000  # x (8 KiB SET + INCR): 16 MiB, far more than the sockets' buffers hold


async def test_a_paused_node_fills_the_buffers_and_every_reply_then_comes_in_order() -> None:
    with LocalNodes(1) as nodes:
        async with one_node(nodes.urls[0]) as node:
            nodes[0].pause()
            try:
                sets, counts = [], []
                for i in range(ROUNDS):
                    sets.append(node.send(b"SET", b"wire:value", VALUE))
                    counts.append(node.send(b"INCR", b"wire:counter"))
                    if i % 50 == 0:
                        await asyncio.sleep(0)  # let the turn's write go out
                await asyncio.sleep(0.2)
                # The kernel took what it could; the rest waits in the transport, for the writer task.
                assert node.buffered > FLUSH_BUFFER_LIMIT
                assert not any(fut.done() for fut in counts)
            finally:
                nodes[0].resume()
            replies = await asyncio.wait_for(asyncio.gather(*sets, *counts), timeout=30)
            assert not [reply for reply in replies if isinstance(reply, Failure)]
            assert [fut.result() for fut in sets] == [b"OK"] * ROUNDS
            assert [fut.result() for fut in counts] == list(range(1, ROUNDS + 1))  # one connection, in order
            assert await node.send(b"GET", b"wire:counter") == str(ROUNDS).encode()
            await node.send(b"DEL", b"wire:value", b"wire:counter")
