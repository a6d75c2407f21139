"""The read/write lock's requests to every node: a reader's and a writer's acquire round, a reader's
release, a writer's leave, a downgrade (their Lua: ``_scripts/_rw.py``).

One node's view of a read/write lock named N (``_names.rw_keys``: below, the names of a Redlock whose
voters are all standalone; with a cluster voter, each companion also carries a hash tag that keeps it in
W's cluster slot):

- the **writer key** W, a string holding the writer's token with ``PX ttl``, exactly a mutex's key
  (the writer's extension and release are the mutex's ``EXTEND`` and ``RELEASE``, and its fence the
  mutex's ``FENCE``); its name is also the channel every release of the lock is told on;
- one **reader key** per reader, ``W\\x00r\\x00<sha1 of the reader's token>``, a string holding that
  token with ``PX ttl``: every reader has a lease of its own, extended and released by the mutex's
  scripts, so a reader that crashed frees its share when its own key expires, and no one else's;
- the **readers' index**, a set of those digests (``W\\x00readers``), so that a writer finds the
  readers; an entry whose key is gone is a reader that left or died, dropped when a script meets
  it (a writer drops them all; a reader's acquire looks at two random entries). The index has no
  expiry: a reader's extension (the mutex's ``EXTEND``) does not touch it, and an index that
  expired under a live reader would hide that reader from writers;
- the **waiting writers**, a sorted set (``W\\x00writers``) of writers that asked and were refused,
  scored by their entry's expiry in node milliseconds: while one lives, no new reader is granted,
  so a stream of readers cannot starve a writer. A blocking writer enters at each attempt (an
  entry lives ``max(ttl, 2 * retry_delay)``, longer than any wait between two attempts) and
  leaves (``RW_LEAVE``) when its acquire ends, granted or not; one that died is forgotten when its
  entry expires.

**The rule on one node.** A writer is granted only when W is free and no reader key lives; a reader
only when W is free and no writer waits. The scripts run one at a time on a node, and a key lives
by the node's clock: so on one node, at any instant, W and a reader key never both hold a valid
grant's token (a downgrade swaps one for the other in one step). Everything else, majorities and
validity, is the mutex's (docs/algorithm.md, "Read/write locks").

Every acquire answers like ``ACQUIRE_FENCED``: the fencing counter (>= 0; 0 unfenced) when granted,
a negative code when not. A reader's fencing token is the largest counter its majority read (the
last writer's token); a writer's is chosen and fenced as a mutex's is.

Each acquire is counted, fenced and given back by ``_requests.count``, as every acquire is; only the
script sent differs. None of these functions touches a ``Lock``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from redlock_async._core import SKIPPED, YES, RwKeys, Settings
from redlock_async._core import clock as _clock
from redlock_async._health import floored
from redlock_async._nodes import IGNORED, Failure, Node, Receiver, pack, pack_script
from redlock_async._queue import READER, RwLine
from redlock_async._rounds import Ballot, Keep, vote_of_fenced
from redlock_async._rounds import requests as _requests
from redlock_async._scripts import (
    KEEP_READERS,
    RW_DOWNGRADE,
    RW_LEAVE,
    RW_QUEUE_DOWNGRADE,
    RW_READ,
    RW_READ_RELEASE,
    RW_WRITE,
)


def wait_life_ms(settings: Settings) -> int:
    """How long a waiting writer's entry lives unless entered again: longer than any wait between two
    attempts (at most 1.5 retry delays), and at least a ttl (a writer that died keeps readers out no
    longer than a holder that died keeps them)."""
    return max(settings.ttl_ms, math.ceil(2000 * settings.retry_delay))


def keep_index(rw: RwKeys) -> Keep:
    """What a reader's extensions keep alive beside its key: the readers' index (KEEP_READERS), which names
    it and outlives it by two leases, so that a writer sees it, and which ends two leases after the last
    reader."""
    return Keep(KEEP_READERS, rw.readers)


async def attempt_read(
    nodes: Sequence[Node],
    writer_key: bytes,
    rw: RwKeys,
    fence_key: bytes | None,
    settings: Settings,
    owner: bytes,
    clock: Receiver | None = None,
) -> _requests.Attempt:
    """One reader's round (RW_READ) on every node; granted, its fencing token (*fence_key*: fenced) is the
    largest counter its majority read, the last fenced writer's. A failed round is given back."""
    token = _requests.new_token(owner)
    prefix, index, waiting = rw.prefix, rw.readers, rw.writers
    key = rw.reader(token)
    keys = (writer_key, key, index, waiting) if fence_key is None else (writer_key, key, index, waiting, fence_key)
    ballot = Ballot(nodes, vote_of_fenced, settings.node_timeout)
    started = _clock.now()
    ballot.script(RW_READ, keys, (token, settings.ttl_ms, prefix), limited=True, clock=clock)
    result = await _counted(nodes, key, index, token, started, ballot, settings, writer_key)
    if result.validity is not None and fence_key is not None:
        counters = [reply for reply, vote in zip(ballot.replies, ballot.votes, strict=True) if vote is YES]
        result.fencing_tokens = (max(counters),)
    result.takes = False  # a read/write lease regains no node (docs/algorithm.md, "Read/write locks")
    result.keeps = keep_index(rw)
    return result


async def attempt_write(
    nodes: Sequence[Node],
    writer_key: bytes,
    rw: RwKeys,
    fence_key: bytes | None,
    settings: Settings,
    owner: bytes,
    waiter: bytes,
    life_ms: int,
    clock: Receiver | None = None,
) -> _requests.Attempt:
    """One writer's round (RW_WRITE) on every node, fenced on *fence_key* as a mutex is; refused, with
    *life_ms* > 0 it enters the waiting writers as *waiter*. A failed round is given back."""
    token = _requests.new_token(owner)
    prefix, index, waiting = rw.prefix, rw.readers, rw.writers
    keys = (writer_key, index, waiting) if fence_key is None else (writer_key, index, waiting, fence_key)
    args: tuple[bytes | int, ...] = (token, settings.ttl_ms, prefix, waiter, life_ms)
    if fence_key is not None and (settings.fence_ttl_ms is not None or floored(nodes)):  # (see send_attempt)
        args += (b"floor",)
    ballot = Ballot(nodes, vote_of_fenced, settings.node_timeout)
    started = _clock.now()
    ballot.script(RW_WRITE, keys, args, limited=True, clock=clock)
    fence = None if fence_key is None else (fence_key,)
    result = await _requests.count(nodes, (writer_key,), fence, token, started, ballot, settings)
    result.takes = False
    return result


async def _counted(
    nodes: Sequence[Node],
    key: bytes,
    index: bytes,
    token: bytes,
    started: float,
    ballot: Ballot,
    settings: Settings,
    channel: bytes,
) -> _requests.Attempt:
    """Count a reader's round; a failed or cancelled one is given back (its key, and its index entry:
    the give-back is the mutex's compare-and-delete, so the entry goes by a SREM queued right behind)."""
    try:
        result = await _requests.count(nodes, (key,), None, token, started, ballot, settings, channel)
    except BaseException:
        _forget_reader(nodes, index, token)
        raise
    if result.validity is None:
        _forget_reader(nodes, index, token)
    return result


def _forget_reader(nodes: Sequence[Node], index: bytes, token: bytes) -> None:
    packed = pack((b"SREM", index, hashlib.sha1(token).hexdigest().encode()))
    for i, node in enumerate(nodes):
        node.send_packed(IGNORED, i, packed)


def send_leave(nodes: Sequence[Node], writer_key: bytes, rw: RwKeys, waiter: bytes) -> None:
    """Queue RW_LEAVE on every node (synchronous: survives cancellation; no one awaits the replies): the
    writer *waiter*'s acquire ended, its entry in the waiting writers goes."""
    keys, args = (rw.writers, writer_key), (waiter,)
    packed = pack_script(RW_LEAVE, keys, args)
    for i, node in enumerate(nodes):
        node.send_packed(IGNORED, i, packed, fallback=(RW_LEAVE, keys, args))


def send_queue_leave(
    nodes: Sequence[Node], line: RwLine, token: bytes, skip: Sequence[int], into: Ballot | None = None
) -> None:
    """Queue the release of a reader or writer of the grant queue (RW_QUEUE_LEAVE) on every node but *skip*
    (synchronous: survives cancellation): what *token* holds goes, and the head of the line is granted
    what the rule allows. Replies as RELEASE's (1: it held there)."""
    script, args = line.quit(token)
    keys = line.keys
    packed = pack_script(script, keys, args)
    receiver: Receiver = IGNORED if into is None else into
    for i, node in enumerate(nodes):
        if i in skip:
            receiver.deliver(i, Failure(SKIPPED, "never sent"))
        else:
            node.send_packed(receiver, i, packed, fallback=(script, keys, args))


def send_read_release(
    nodes: Sequence[Node],
    writer_key: bytes,
    rw: RwKeys,
    token: bytes,
    skip: Sequence[int],
    into: Ballot | None = None,
) -> None:
    """Queue a reader's release (RW_READ_RELEASE) on every node but *skip* (synchronous: survives
    cancellation); the replies go to *into* (a ballot not started yet), or nowhere."""
    keys = (rw.reader(token), rw.readers, writer_key)
    args = (token,)
    packed = pack_script(RW_READ_RELEASE, keys, args)
    receiver: Receiver = IGNORED if into is None else into
    for i, node in enumerate(nodes):
        if i in skip:
            receiver.deliver(i, Failure(SKIPPED, "never sent"))
        else:
            node.send_packed(receiver, i, packed, fallback=(RW_READ_RELEASE, keys, args))


async def downgrade(
    nodes: Sequence[Node],
    writer_key: bytes,
    rw: RwKeys,
    writer_token: bytes,
    fence_key: bytes | None,
    settings: Settings,
    owner: bytes,
    clock: Receiver | None = None,
    *,
    queued: bool = False,
) -> _requests.Attempt:
    """Turn the writer holding *writer_token* into a reader on every node in one step (RW_DOWNGRADE;
    *queued*: RW_QUEUE_DOWNGRADE, which then grants the readers at the head of the name's line);
    counted as a reader's round, and given back (the reader's keys) when no majority did it."""
    token = _requests.new_token(owner)
    prefix, index = rw.prefix, rw.readers
    key = rw.reader(token)
    script = RW_QUEUE_DOWNGRADE if queued else RW_DOWNGRADE
    if queued:
        keys = RwLine(writer_key, rw, fence_key, READER).keys
    else:
        keys = (writer_key, key, index) if fence_key is None else (writer_key, key, index, fence_key)
    ballot = Ballot(nodes, vote_of_fenced, settings.node_timeout)
    started = _clock.now()
    ballot.script(script, keys, (writer_token, token, settings.ttl_ms, prefix), limited=True, clock=clock)
    result = await _counted(nodes, key, index, token, started, ballot, settings, writer_key)
    if result.validity is not None and fence_key is not None:
        counters = [reply for reply, vote in zip(ballot.replies, ballot.votes, strict=True) if vote is YES]
        result.fencing_tokens = (max(counters),)
    result.takes = False
    result.keeps = keep_index(rw)
    return result
