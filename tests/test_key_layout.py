"""The key layout of a Redlock (issue 39 item 2, option A): with voters that are all standalone, a fencing
counter and a read/write lock's companions keep the names of every version before (pinned here, byte for
byte); with a ``redis+cluster://`` voter (``Cluster.one_slot``), they move into the slot of the key they
serve (``_names.fence_key``, ``_names.rw_keys``), and a Redlock's locks, read/write locks and inspection
use those names. tests/test_key_slots.py runs the scripts with them on a cluster-mode node."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from redlock_async import Redlock
from redlock_async._core import Settings
from redlock_async._core._names import (
    fence_key,
    one_slot_voters,
    reader_key,
    rw_keys,
    rw_writer_key,
    slot_base,
    slot_of,
)
from redlock_async._queue import queue_keys
from redlock_async._scripts import FENCED_BY
from redlock_async._shared import keys_of
from redlock_async.client import cluster_of

from .conftest import Cluster, MakeRedlock, eventually, lock_keys

W = b"redlock:\x00rw\x00orders:42"


def test_todays_names_with_standalone_voters() -> None:
    """The names every version before used, byte for byte: nothing moves for an existing deployment."""
    assert fence_key("redlock-fence:", "orders:42") == b"redlock-fence:orders:42"
    assert fence_key("redlock-fence:", "{user7}:cart") == b"redlock-fence:{user7}:cart"
    assert rw_writer_key("redlock:", "orders:42") == W
    assert tuple(rw_keys(W)) == (
        W + b"\x00r\x00",
        W + b"\x00readers",
        W + b"\x00writers",
        W + b"\x00queue",
        W + b"\x00waits",
    )
    assert reader_key(W, b"t") == W + b"\x00r\x00" + hashlib.sha1(b"t").hexdigest().encode()
    keys = keys_of(Settings(), "orders:42")
    assert (keys.lock, keys.fence, keys.writer, keys.rw_fence) == (
        b"redlock:orders:42",
        b"redlock-fence:orders:42",
        W,
        b"redlock-fence:orders:42",
    )
    assert keys.rw == rw_keys(W)


def test_the_one_slot_names() -> None:
    lock = b"redlock:orders:42"
    fence = fence_key("redlock-fence:", "orders:42", lock)
    assert fence.startswith(b"redlock-fence:{")  # under fence_prefix
    assert fence.endswith(b"}\x00orders:42")
    assert slot_of(fence) == slot_of(fence + FENCED_BY) == slot_of(lock)
    rw = rw_keys(W, one_slot=True)
    assert rw.readers.startswith(b"redlock:\x00rw{")
    assert rw.readers.endswith(b"}\x00readers\x00orders:42")
    assert {slot_of(key) for key in (*rw, rw.reader(b"t"), fence_key("redlock-fence:", "orders:42", W))} == {slot_of(W)}
    assert len({*rw, W, lock, fence}) == 8  # no two alike
    # The prefix's own tag decides (and must agree); an empty one first cannot carry a slot.
    assert fence_key("{app}-fence:", "x", b"{app}:x") == b"{app}-fence:\x00x"
    with pytest.raises(ValueError, match=r"fence_prefix.*same hash tag"):
        fence_key("{other}:", "x", b"{app}:x")
    with pytest.raises(ValueError, match=r"key_prefix b'x\{\}:\\x00rw' has '\{\}' at its first brace"):
        rw_keys(rw_writer_key("x{}:", "doc"), one_slot=True)
    with pytest.raises(ValueError, match="fence_prefix"):
        slot_base(b"f{}:", 7, "fence_prefix")


def test_the_switch_is_on_with_a_cluster_voter_only() -> None:
    assert not one_slot_voters(["redis://a:1", "rediss://b:2", "unix:///tmp/s", "redis+sentinel://c:3/m"])
    assert one_slot_voters(["redis://a:1", "redis+cluster://c:3"])
    assert one_slot_voters(["REDISS+CLUSTER://c:3"])
    assert not one_slot_voters([object(), "redis+clusters://x"])
    # On standalone voters, a Redlock keeps today's names (reads no node).
    assert cluster_of(Redlock(["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"])).one_slot is False


@pytest.mark.parametrize("one_slot", [False, True])
@pytest.mark.parametrize("name", ["orders:42", "a{}b", "{user7}:cart"])
async def test_a_redlocks_locks_use_its_layout(
    make_redlock: MakeRedlock, cluster: Cluster, one_slot: bool, name: str
) -> None:
    """A fenced lock with a waiter in line and a read/write lock with readers and a waiting writer, through a
    Redlock: every key they leave on a node is one the layout names (and with *one_slot*, in the slot of
    the key it serves)."""
    redlock = await make_redlock(fencing=True, retry_delay=0.05)
    cluster_of(redlock).one_slot = one_slot
    lock = b"redlock:" + name.encode()
    fence = fence_key("redlock-fence:", name, lock if one_slot else None)
    writer = rw_writer_key("redlock:", name)
    rw_fence = fence_key("redlock-fence:", name, writer if one_slot else None)
    rw = rw_keys(writer, one_slot)
    locks = {*queue_keys(lock), fence, fence + FENCED_BY}
    rws = {writer, *rw[1:], rw_fence, rw_fence + FENCED_BY}
    seen: set[bytes] = set()

    def look() -> set[bytes]:
        keys = set(lock_keys(cluster[0]))
        seen.update(keys)
        return keys

    async with redlock.lock(name):
        second = redlock.lock(name)
        waiter = asyncio.create_task(second.acquire())
        in_line = await eventually(lambda: queue_keys(lock)[1] in look(), 5)
    assert await waiter
    assert in_line
    look()
    await second.release()
    rw_lock = redlock.rw_lock(name)
    first, second_reader = rw_lock.read(), rw_lock.read()
    assert await first.acquire()
    assert await second_reader.acquire()
    write = rw_lock.write()
    writing = asyncio.create_task(write.acquire())
    in_line = await eventually(lambda: rw.line in look(), 5)  # behind the readers
    await first.release()
    await second_reader.release()
    assert await writing
    assert in_line
    look()
    await write.release()
    # No key per reader (the layout before): the readers are entries of the readers' hash.
    assert not {key for key in seen if key.startswith(rw.prefix)}, sorted(seen)
    assert seen <= locks | rws, sorted(seen - locks - rws)
    assert {fence, fence + FENCED_BY, rw.line, rw.readers} <= seen  # counters raised, a line, the readers' hash
    if one_slot:
        assert {slot_of(key) for key in locks} == {slot_of(lock)}
        assert {slot_of(key) for key in rws} == {slot_of(writer)}
