"""What each node says of a read/write lock's readers, for the inspector (``_inspect.Inspector``) and
``redlock break``: per node, every reader that lives there, as ``digest -> (token, ms left)``.

This version keeps a name's readers in ONE hash, the readers' hash ``R`` (``_names.rw_keys``): the SHA1 of a
reader's token -> ``"<token> <expiry, node ms>"``, an entry past its expiry by the node's clock being absent
(``_scripts/_rw.py``). It is read with ``HGETALL`` right behind the node's ``TIME`` on the same connection:
an entry counts as live when its expiry is after that reading. The layout before (a set of digests under the
same name, and a key per reader, ``prefix + digest``) is still read where a node has it (its ``HGETALL``
answers ``WRONGTYPE``): its readers may hold while clients of both versions run, and a verdict that left them
out would say "free" of a held lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeAlias

from redlock_async._core import RwKeys, Vote
from redlock_async._nodes import Failure, Node, Reply

Live: TypeAlias = "dict[bytes, tuple[bytes, int]]"
"""One node's live readers: digest -> (token, ms left)."""
Ask: TypeAlias = "Callable[[list[list[asyncio.Future[Reply]]]], Awaitable[list[list[Reply]]]]"


def node_ms(clock: Reply) -> int | None:
    """A ``TIME`` reply in milliseconds; None when it is not one."""
    if not isinstance(clock, list) or len(clock) != 2:
        return None
    try:
        return int(clock[0]) * 1000 + int(clock[1]) // 1000
    except (TypeError, ValueError):
        return None


def of_hash(reply: Reply, clock: Reply) -> Live | Failure | None:
    """The live readers in a node's ``HGETALL`` of the readers' hash (*reply*), judged by its ``TIME`` read just
    before (*clock*); None when the node keeps the layout before there (a set: ``WRONGTYPE``)."""
    if isinstance(reply, Failure):
        return None if "WRONGTYPE" in reply.detail else reply
    now = node_ms(clock)
    if now is None:
        return clock if isinstance(clock, Failure) else Failure(Vote.ERROR, f"unexpected TIME reply {clock!r:.60}")
    if isinstance(reply, dict):
        pairs = list(reply.items())
    elif isinstance(reply, list) and len(reply) % 2 == 0:
        pairs = list(zip(reply[::2], reply[1::2], strict=True))
    else:
        return Failure(Vote.ERROR, f"unexpected HGETALL reply {reply!r:.60}")
    found: Live = {}
    for field, value in pairs:
        if isinstance(field, bytes) and isinstance(value, bytes):
            token, _, expiry = value.rpartition(b" ")
            if expiry.isdigit() and int(expiry) > now:
                found[field] = (token, int(expiry) - now)
    return found


async def of_nodes(
    ask: Ask, nodes: Sequence[Node], rw: RwKeys, hashes: Sequence[Reply], clocks: Sequence[Reply]
) -> list[Live | Failure]:
    """Per node, its live readers: from its ``HGETALL`` of the readers' hash (*hashes*) and ``TIME`` before it
    (*clocks*); a node of the layout before is asked for its set and its readers' keys (two more round trips,
    only for such a node)."""
    found: list[Live | Failure | None] = [of_hash(reply, clock) for reply, clock in zip(hashes, clocks, strict=True)]
    old = [i for i, one in enumerate(found) if one is None]
    if old:
        members = await ask([[nodes[i].send(b"SMEMBERS", rw.readers)] for i in old])
        asks: list[list[asyncio.Future[Reply]]] = []
        ids: list[list[bytes]] = []
        for i, (reply,) in zip(old, members, strict=True):
            mine = sorted(one for one in reply if isinstance(one, bytes)) if isinstance(reply, list) else []
            ids.append(mine)
            keys = [rw.prefix + one for one in mine]
            reads = [nodes[i].send(b"MGET", *keys), *(nodes[i].send(b"PTTL", key) for key in keys)] if keys else []
            asks.append(reads)
            if isinstance(reply, Failure):
                found[i] = reply
        replies = await ask(asks)
        for i, mine, reads in zip(old, ids, replies, strict=True):
            if found[i] is not None:
                continue
            found[i] = _of_keys(mine, reads)
    return [one if one is not None else {} for one in found]


def _of_keys(ids: list[bytes], reads: list[Reply]) -> Live | Failure:
    """A node's live readers of the layout before: the MGET of their keys, then each key's PTTL."""
    if not ids:
        return {}
    for reply in reads:
        if isinstance(reply, Failure):
            return reply
    values = reads[0]
    if not isinstance(values, list) or len(values) != len(ids):
        return Failure(Vote.ERROR, f"unexpected MGET reply {values!r:.60}")
    live: Live = {}
    for one, value, pttl in zip(ids, values, reads[1:], strict=True):
        if isinstance(value, bytes):
            live[one] = (value, pttl if isinstance(pttl, int) and pttl >= 0 else -1)
    return live


def per_reader(found: Sequence[Live | Failure]) -> dict[bytes, list[tuple[bytes | None, int] | Failure]]:
    """Per reader seen on any node (by digest), what each node says of it: (its token, ms left), (None, -2)
    where it is not, or the node's Failure."""
    ids = sorted({one for live in found if isinstance(live, dict) for one in live})
    return {one: [live if isinstance(live, Failure) else live.get(one, (None, -2)) for live in found] for one in ids}
