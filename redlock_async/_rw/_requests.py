"""The read/write lock's requests to every node: a reader's and a writer's acquire round, a reader's
extension and release, a writer's leave, a downgrade (their Lua: ``_scripts/_rw.py``).

One node's view of a read/write lock named N (``_names.rw_keys``: below, the names of a Redlock whose
voters are all standalone; with a cluster voter, each companion also carries a hash tag that keeps it in
W's cluster slot). Every key a script touches is one of its ``KEYS``:

- the **writer key** W, a string holding the writer's token with ``PX ttl``, exactly a mutex's key
  (the writer's extension and release are the mutex's ``EXTEND`` and ``RELEASE``, and its fence the
  mutex's ``FENCE``); its name is also the channel every release of the lock is told on;
- the **readers' hash** R (``W\\x00readers``): the SHA1 of a reader's token -> ``"<token> <expiry, node
  ms>"``. Every reader has a lease of its own, its entry, extended (``RW_READ_EXTEND``, in place of
  ``EXTEND``: ``Keep.instead``) and released (``RW_READ_RELEASE``) on its own; an entry past its expiry
  by the node's clock counts as absent and goes when a script meets it, so a reader that crashed frees
  its share when its own entry expires, and no one else's. R's own expiry is raised (never lowered) to
  a ttl whenever an entry is set to one: R outlives its longest live entry. R has the name of the
  readers' index of the layout before (a set, beside a key per reader): the scripts of each layout
  refuse the other's (``OLD_READERS``; an old script fails on a hash before it writes);
- the **waiting writers**, a sorted set (``W\\x00writers``) of writers that asked and were refused,
  scored by their entry's expiry in node milliseconds: while one lives, no new reader is granted,
  so a stream of readers cannot starve a writer. A blocking writer enters at each attempt (an
  entry lives ``max(ttl, 2 * retry_delay)``, longer than any wait between two attempts) and
  leaves (``RW_LEAVE``) when its acquire ends, granted or not; one that died is forgotten when its
  entry expires.

**The rule on one node.** A writer is granted only when W is free and no reader's entry lives; a reader
only when W is free and no writer waits. The scripts run one at a time on a node, and W and the entries
live by the node's clock: so on one node, at any instant, W and a live reader's entry never both hold a
valid grant's token (a downgrade swaps one for the other in one step). Everything else, majorities and
validity, is the mutex's (docs/algorithm.md, "Read/write locks").

Every acquire answers like ``ACQUIRE_FENCED``: the fencing counter (>= 0; 0 unfenced) when granted,
a negative code when not. A reader's fencing token is the largest counter its majority read (the
last writer's token); a writer's is chosen and fenced as a mutex's is.

Each acquire is counted, fenced and given back by ``_requests.count``, as every acquire is; only the
scripts sent differ. None of these functions touches a ``Lock``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from redlock_async._core import SKIPPED, YES, Name, RwKeys, Settings
from redlock_async._core import algorithm as _algorithm
from redlock_async._core import clock as _clock
from redlock_async._health import floored
from redlock_async._nodes import IGNORED, Failure, Node, Receiver, pack_script
from redlock_async._queue import READER, RwLine
from redlock_async._rounds import Ballot, Keep, vote_of_fenced
from redlock_async._rounds import requests as _requests
from redlock_async._scripts import (
    OLD_READERS,
    RW_DOWNGRADE,
    RW_LEAVE,
    RW_QUEUE_DOWNGRADE,
    RW_READ,
    RW_READ_EXTEND,
    RW_READ_RELEASE,
    RW_WRITE,
)
from redlock_async.errors import RedlockError


def wait_life_ms(settings: Settings) -> int:
    """How long a waiting writer's entry lives unless entered again: longer than any wait between two
    attempts (at most 1.5 retry delays), and at least a ttl (a writer that died keeps readers out no
    longer than a holder that died keeps them)."""
    return max(settings.ttl_ms, math.ceil(2000 * settings.retry_delay))


def reader_keep(rw: RwKeys) -> Keep:
    """How a reader's lease is extended: by RW_READ_EXTEND of its entry in the readers' hash, in place of
    EXTEND (``Keep.instead``)."""
    return Keep(RW_READ_EXTEND, rw.readers, instead=True)


def refuse_old_layout(name: Name, codes: Sequence[int], n: int) -> None:
    """Raise when so many nodes (of *n*) answered OLD_READERS that no majority could grant: readers of the
    layout before the readers' hash may hold there, in keys this version does not read."""
    if codes.count(OLD_READERS) > n - _algorithm.quorum(n):
        raise RedlockError(
            f"read/write lock {name!r} is in use by clients of redlock-async before the readers' hash (its "
            "readers' key is a set): upgrade every client of it, or let their readers end (the set then "
            "expires), and try again",
            name=name if isinstance(name, str) else repr(name),
        )


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
    readers, waiting = rw.readers, rw.writers
    keys = (writer_key, readers, waiting) if fence_key is None else (writer_key, readers, waiting, fence_key)
    ballot = Ballot(nodes, vote_of_fenced, settings.node_timeout)
    started = _clock.now()
    ballot.script(RW_READ, keys, (token, settings.ttl_ms), limited=True, clock=clock)
    result = await _counted(nodes, writer_key, rw, token, started, ballot, settings)
    if result.validity is not None and fence_key is not None:
        counters = [reply for reply, vote in zip(ballot.replies, ballot.votes, strict=True) if vote is YES]
        result.fencing_tokens = (max(counters),)
    result.takes = False  # a read/write lease regains no node (docs/algorithm.md, "Read/write locks")
    result.keeps = reader_keep(rw)
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
    readers, waiting = rw.readers, rw.writers
    keys = (writer_key, readers, waiting) if fence_key is None else (writer_key, readers, waiting, fence_key)
    args: tuple[bytes | int, ...] = (token, settings.ttl_ms, waiter, life_ms)
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
    writer_key: bytes,
    rw: RwKeys,
    token: bytes,
    started: float,
    ballot: Ballot,
    settings: Settings,
) -> _requests.Attempt:
    """Count a reader's round (its lease: its entry in the readers' hash); a failed or cancelled one is given
    back by the reader's release."""

    def give_back(skip: Sequence[int], into: Ballot | None) -> None:
        send_read_release(nodes, writer_key, rw, token, skip, into)

    keys = (rw.readers,)
    return await _requests.count(nodes, keys, None, token, started, ballot, settings, give_back=give_back)


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
    keys = (rw.readers, writer_key)
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
    script = RW_QUEUE_DOWNGRADE if queued else RW_DOWNGRADE
    if queued:
        keys = RwLine(writer_key, rw, fence_key, READER).keys
    else:
        keys = (writer_key, rw.readers) if fence_key is None else (writer_key, rw.readers, fence_key)
    ballot = Ballot(nodes, vote_of_fenced, settings.node_timeout)
    started = _clock.now()
    ballot.script(script, keys, (writer_token, token, settings.ttl_ms), limited=True, clock=clock)
    result = await _counted(nodes, writer_key, rw, token, started, ballot, settings)
    if result.validity is not None and fence_key is not None:
        counters = [reply for reply, vote in zip(ballot.replies, ballot.votes, strict=True) if vote is YES]
        result.fencing_tokens = (max(counters),)
    result.takes = False
    result.keeps = reader_keep(rw)
    return result
