"""A rolling upgrade from the layout before one-slot keys (issue 39 item 2): clients of both versions on the
same nodes never hold beside each other.

- A lock, its line and waits: the lock key's name is unchanged, so both versions set the same key (only
  the line moved: a waiter of one version is served by the other's releases through the release word).
- A semaphore: its slots moved, and its widest-limit key kept its name. This version writes
  ``"<limit> layout-2"`` there, which a client of the layout before cannot read as a number: its every
  script fails before it writes anything. A bare number there (written by a client of the layout before,
  whose permits may be held in slots this version does not read) makes this version refuse with a
  RedlockError that says what to do. The scripts of the layout before run here verbatim
  (``tests/_scripts_v1.py``).
"""

from __future__ import annotations

import hashlib

import pytest
import redis

from redlock_async import RedlockError

from . import _scripts_rw_v1 as rw1
from . import _scripts_v1 as v1
from .conftest import Cluster, MakeRedlock, keys_everywhere
from .test_cli_break import redlock_break

V1_BASE = b"redlock:\x00semaphore\x00pool"
V1_LIMIT = V1_BASE + b"\x00limit"


def v1_acquire(node: object, token: bytes, slot: int, limit: int) -> object:
    """The layout before's ACQUIRE_PERMIT of *slot* (a semaphore's first try, and every try without the queue)."""
    keys = (V1_BASE + b"\x00%d" % slot, V1_LIMIT)
    return node.command("EVAL", v1.ACQUIRE_PERMIT, 2, *keys, token, 10_000, limit, V1_BASE + b"\x00")  # type: ignore[attr-defined]


def v1_enter(node: object, token: bytes, limit: int) -> object:
    """The layout before's PERMIT_ENTER (a semaphore's wait in line)."""
    keys = (V1_BASE, V1_BASE + b"\x00queue", V1_BASE + b"\x00waits", V1_LIMIT)
    return node.command("EVAL", v1.PERMIT_ENTER, 4, *keys, token, 10_000, 1, 5_000, limit, V1_BASE + b"\x00", -1)  # type: ignore[attr-defined]


@pytest.mark.parametrize("queue", [True, False])
async def test_a_semaphore_in_use_by_the_layout_before_is_refused_in_words(
    cluster: Cluster, make_redlock: MakeRedlock, queue: bool
) -> None:
    for i in range(len(cluster)):
        assert v1_acquire(cluster[i], b"1:old", 0, 1) == 1  # an old client holds the only permit
    before = keys_everywhere(cluster)
    redlock = await make_redlock(queue=queue, retry_delay=0.05)
    sem = redlock.semaphore("pool", limit=1)
    for timeout in (None, 2.0):
        with pytest.raises(RedlockError, match=r"'pool' is in use by clients of redlock-async before the one-slot"):
            await (sem.acquire(blocking=False) if timeout is None else sem.acquire(timeout=timeout))
        assert not sem.held
    assert keys_everywhere(cluster) == before  # nothing written beside the old permit
    async with redlock.lock("pool"):  # a lock of the same name is another thing (as it was)
        pass


@pytest.mark.parametrize("queue", [True, False])
async def test_a_client_of_the_layout_before_cannot_take_a_permit_beside_ours(
    cluster: Cluster, make_redlock: MakeRedlock, queue: bool
) -> None:
    redlock = await make_redlock(queue=queue)
    async with redlock.semaphore("pool", limit=1):
        written = keys_everywhere(cluster)
        for i in range(len(cluster)):
            assert cluster[i].command("GET", V1_LIMIT) == b"1 layout-2"
            with pytest.raises(redis.ResponseError, match=r"attempt to compare"):
                v1_acquire(cluster[i], b"1:old", 0, 1)
            with pytest.raises(redis.ResponseError, match=r"bad argument"):
                v1_enter(cluster[i], b"1:old", 1)
        assert keys_everywhere(cluster) == written  # the old scripts failed before writing anything


# -- the read/write lock: from a key per reader (and a set of their digests) to one readers' hash -------------
# The layout before kept a key per reader (``W\x00r\x00<sha1>``) and a set of their digests, the readers' index,
# at ``W\x00readers``; this version keeps every reader as an entry of one hash under that same name. A script of
# the layout before fails on the hash (WRONGTYPE) before it writes anything there; a script of this version
# meets the set and answers OLD_READERS (nothing written), which the client raises as a RedlockError saying
# what to do. (A hash under a new name, beside the old set, would let each version's writer in beside the
# other's readers: test_readers_of_the_layout_before_are_refused_in_words fails then.) The writer key W and the
# waiting writers are unchanged: old and new writers exclude each other on W as they always did.

RW = b"redlock:\x00rw\x00doc"
RW_READERS = RW + b"\x00readers"
RW_WAITING = RW + b"\x00writers"
RW_PREFIX = RW + b"\x00r\x00"
RW_LINE = (RW, RW_READERS, RW_WAITING, RW + b"\x00queue", RW + b"\x00waits")


def v1_read(node: object, token: bytes) -> object:
    """The layout before's RW_READ (a reader's first try, and every try without the queue)."""
    keys = (RW, RW_PREFIX + hashlib.sha1(token).hexdigest().encode(), RW_READERS, RW_WAITING)
    return node.command("EVAL", rw1.RW_READ, 4, *keys, token, 10_000, RW_PREFIX)  # type: ignore[attr-defined]


def v1_write(node: object, token: bytes, life: int = 0) -> object:
    """The layout before's RW_WRITE (*life* > 0: a blocking writer, which enters the waiting writers)."""
    keys = (RW, RW_READERS, RW_WAITING)
    return node.command("EVAL", rw1.RW_WRITE, 3, *keys, token, 10_000, RW_PREFIX, b"waiter", life)  # type: ignore[attr-defined]


def v1_rw_enter(node: object, token: bytes, kind: bytes) -> object:
    """The layout before's RW_ENTER (a reader or writer waiting in the grant queue's line)."""
    return node.command("EVAL", rw1.RW_ENTER, 5, *RW_LINE, token, 10_000, 1, 5_000, RW_PREFIX, kind)  # type: ignore[attr-defined]


def readers_everywhere(cluster: Cluster) -> list[object]:
    return [cluster[i].command("HGETALL", RW_READERS) for i in range(len(cluster))]


@pytest.mark.parametrize("queue", [True, False])
async def test_readers_of_the_layout_before_are_refused_in_words(
    cluster: Cluster, make_redlock: MakeRedlock, queue: bool
) -> None:
    for i in range(len(cluster)):
        assert v1_read(cluster[i], b"old-reader") == 0  # an old client reads, on every node
    before = keys_everywhere(cluster)
    redlock = await make_redlock(queue=queue, retry_delay=0.05)
    rw = redlock.rw_lock("doc")
    for lock in (rw.write(), rw.read()):
        for timeout in (None, 2.0):
            with pytest.raises(RedlockError, match=r"'doc' is in use by clients of redlock-async before the readers'"):
                await (lock.acquire(blocking=False) if timeout is None else lock.acquire(timeout=timeout))
            assert not lock.held
    assert keys_everywhere(cluster) == before  # nothing written beside the old reader: no writer, no entry
    info = await redlock.inspect("doc")  # inspect still sees the old reader (a verdict without it: "free")
    assert info.state == "held"
    assert [reader.holder for reader in info.readers] == [hashlib.sha1(b"old-reader").hexdigest()[:8]]


@pytest.mark.parametrize("queue", [True, False])
async def test_a_client_of_the_layout_before_cannot_take_a_rw_lock_beside_ours(
    cluster: Cluster, make_redlock: MakeRedlock, queue: bool
) -> None:
    redlock = await make_redlock(queue=queue)
    rw = redlock.rw_lock("doc")
    async with rw.read():
        readers = readers_everywhere(cluster)
        for i in range(len(cluster)):
            with pytest.raises(redis.ResponseError, match=r"WRONGTYPE"):
                v1_write(cluster[i], b"old-writer", 5_000)
            with pytest.raises(redis.ResponseError, match=r"WRONGTYPE"):
                v1_read(cluster[i], b"old-reader")
            with pytest.raises(redis.ResponseError, match=r"WRONGTYPE"):
                v1_rw_enter(cluster[i], b"old-writer", b"w")  # it enters its line, and fails before any grant
            assert cluster[i].command("EXISTS", RW) == 0  # no old writer beside our reader
            cluster[i].command("DEL", *RW_LINE[3:], RW_WAITING)  # (its entries: it would be granted W after us)
        assert readers_everywhere(cluster) == readers  # the old scripts failed before writing to the readers
    async with rw.write():  # W is the same key for both: an old reader or writer is refused by it
        for i in range(len(cluster)):
            assert v1_read(cluster[i], b"old-reader") == -1
            assert v1_write(cluster[i], b"old-writer") == -1


async def test_break_clears_readers_of_the_layout_before(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    for i in range(len(cluster)):
        assert v1_read(cluster[i], b"old-reader~stuck") == 0
    code, out, err = await redlock_break(cluster.urls, "doc", "--yes")
    assert code == 0, out + err
    assert "(stuck)" in out
    for i in range(len(cluster)):
        assert (
            cluster[i].command("EXISTS", RW_READERS, RW_PREFIX + hashlib.sha1(b"old-reader~stuck").hexdigest().encode())
            == 0
        )
    redlock = await make_redlock()
    assert await redlock.rw_lock("doc").write().acquire(blocking=False)  # the name is this version's now
