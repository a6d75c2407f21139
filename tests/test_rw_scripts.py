"""The read/write lock's per-node scripts (redlock_async/_scripts/_rw.py), run directly on a real node.

Each test states one clause of a script's contract: the rule on one node (W and a live reader's entry
never together), readers' own leases (entries of one hash, judged by the node's clock), waiting writers
keeping new readers out, the hash's pruning, and the downgrade in one step.
"""

from __future__ import annotations

import time
from typing import Any

from redlock_async._core._names import rw_keys
from redlock_async._scripts import (
    FENCE,
    FENCED_BY,
    READERS_HOLD,
    RELEASE,
    RW_DOWNGRADE,
    RW_LEAVE,
    RW_READ,
    RW_READ_EXTEND,
    RW_READ_RELEASE,
    RW_WRITE,
    WRITER_HOLDS,
    WRITER_WAITS,
    Script,
)

from ._rw_layout import entries, entry, live_readers, reader_left
from .conftest import Cluster, Node

W = b"redlock:\x00rw\x00doc"
INDEX, WAITING = rw_keys(W)[1:3]
COUNTER = b"redlock-fence:doc"


def run(node: Node, script: Script, keys: tuple[bytes, ...], *args: bytes | int) -> Any:
    return node.command("EVAL", script.source, len(keys), *keys, *args)


def read(node: Node, token: bytes, ttl: int = 10_000, *, fenced: bool = False) -> Any:
    keys = (W, INDEX, WAITING) + ((COUNTER,) if fenced else ())
    return run(node, RW_READ, keys, token, ttl)


def write(node: Node, token: bytes, ttl: int = 10_000, *, waiter: bytes = b"w1", life: int = 0) -> Any:
    return run(node, RW_WRITE, (W, INDEX, WAITING), token, ttl, waiter, life)


def release(node: Node, token: bytes) -> Any:
    return run(node, RW_READ_RELEASE, (INDEX, W), token)


def test_readers_share_and_each_has_a_lease_of_its_own(cluster: Cluster) -> None:
    node = cluster[0]
    assert read(node, b"r1", 10_000) == 0
    assert read(node, b"r2", 300) == 0
    assert reader_left(node, INDEX, b"r1") is not None
    assert 0 < (reader_left(node, INDEX, b"r2") or 0) <= 300
    assert entries(node, INDEX) == 2
    pttl = int(node.command("PTTL", INDEX))  # type: ignore[call-overload]
    assert pttl >= (reader_left(node, INDEX, b"r1") or 0) > 9_000  # the hash outlives its longest entry
    time.sleep(0.35)  # r2 crashed: its share is gone with its own entry's expiry, r1's is not
    assert reader_left(node, INDEX, b"r1") is not None
    assert reader_left(node, INDEX, b"r2") is None
    assert live_readers(node, INDEX) == [b"r1"]


def test_a_writer_is_refused_while_a_reader_lives_and_granted_once_its_entry_expired(cluster: Cluster) -> None:
    node = cluster[0]
    assert read(node, b"r1", 200) == 0
    assert write(node, b"w") == READERS_HOLD
    assert node.command("EXISTS", W) == 0
    node.command("PEXPIRE", INDEX, 60_000)  # (the hash outlives the entry: the entry's own expiry decides)
    time.sleep(0.25)  # the reader died: its entry is past its expiry, still in the hash
    assert entries(node, INDEX) == 1
    assert write(node, b"w") == 0
    assert node.command("GET", W) == b"w"
    assert node.command("EXISTS", INDEX) == 0  # the writer dropped the dead reader's entry


def test_a_reader_is_refused_while_a_writer_holds(cluster: Cluster) -> None:
    node = cluster[0]
    assert write(node, b"w") == 0
    assert read(node, b"r1") == WRITER_HOLDS
    assert node.command("EXISTS", INDEX) == 0


def test_a_second_writer_is_refused_as_by_a_mutex(cluster: Cluster) -> None:
    node = cluster[0]
    assert write(node, b"w1") == 0
    assert write(node, b"w2", waiter=b"x") == WRITER_HOLDS
    assert node.command("GET", W) == b"w1"


def test_a_waiting_writer_keeps_new_readers_out_until_it_leaves(cluster: Cluster) -> None:
    node = cluster[0]
    assert read(node, b"r1") == 0
    assert write(node, b"w", waiter=b"me", life=5_000) == READERS_HOLD
    assert read(node, b"r2") == WRITER_WAITS  # a new reader waits behind the writer
    assert entry(node, INDEX, b"r2") is None
    assert run(node, RW_LEAVE, (WAITING, W), b"me") == 1  # the writer gave up
    assert run(node, RW_LEAVE, (WAITING, W), b"me") == 0
    assert read(node, b"r2") == 0


def test_a_non_blocking_writer_does_not_enter(cluster: Cluster) -> None:
    node = cluster[0]
    assert read(node, b"r1") == 0
    assert write(node, b"w", life=0) == READERS_HOLD
    assert node.command("EXISTS", WAITING) == 0
    assert read(node, b"r2") == 0


def test_a_waiting_writer_that_died_is_forgotten_when_its_entry_expires(cluster: Cluster) -> None:
    node = cluster[0]
    assert read(node, b"r1") == 0
    assert write(node, b"w", life=200) == READERS_HOLD
    assert read(node, b"r2") == WRITER_WAITS
    time.sleep(0.25)
    assert read(node, b"r2") == 0


def test_the_last_reader_to_leave_tells_the_channel_once(cluster: Cluster) -> None:
    node = cluster[0]
    assert read(node, b"r1") == 0
    assert read(node, b"r2") == 0
    channel = W
    counts = []
    for token in (b"r1", b"r2"):
        before = _published(node)
        assert run(node, RW_READ_RELEASE, (INDEX, channel), token) == 1
        counts.append(_published(node) - before)
    assert counts == [0, 1]
    assert run(node, RW_READ_RELEASE, (INDEX, channel), b"r1") == 0
    assert node.command("EXISTS", INDEX) == 0


def test_a_writers_leave_tells_the_readers_only_when_it_was_the_last_and_no_writer_holds(cluster: Cluster) -> None:
    node = cluster[0]
    assert read(node, b"r1") == 0
    assert write(node, b"w", waiter=b"a", life=5_000) == READERS_HOLD
    assert write(node, b"w", waiter=b"b", life=5_000) == READERS_HOLD
    before = _published(node)
    assert run(node, RW_LEAVE, (WAITING, W), b"a") == 1  # b still waits: readers still kept out
    assert _published(node) == before
    release(node, b"r1")
    assert write(node, b"w", waiter=b"b", life=5_000) == 0  # granted: it leaves the waiting writers next
    before = _published(node)
    assert run(node, RW_LEAVE, (WAITING, W), b"b") == 1
    assert _published(node) == before  # a writer holds: no reader could come in
    assert run(node, RELEASE, (W,), b"w") == 1
    assert read(node, b"r2") == 0
    assert write(node, b"w2", waiter=b"c", life=5_000) == READERS_HOLD
    release(node, b"r2")
    before = _published(node)
    assert run(node, RW_LEAVE, (WAITING, W), b"c") == 1  # gave up: the last, and the key free: told
    assert _published(node) == before + 1


def _published(node: Node) -> int:
    info = node.command("INFO", "commandstats")
    assert isinstance(info, dict)
    return int(info.get("cmdstat_publish", {}).get("calls", 0))


def test_a_readers_lease_is_extended_and_released_by_its_own_scripts(cluster: Cluster) -> None:
    node = cluster[0]
    assert read(node, b"r1", 1_000) == 0
    assert read(node, b"r2", 1_000) == 0
    assert run(node, RW_READ_EXTEND, (INDEX,), b"r1", 60_000) == [1]
    assert (reader_left(node, INDEX, b"r1") or 0) > 1_000
    assert int(node.command("PTTL", INDEX)) > 59_000  # type: ignore[call-overload]  # the hash outlives it
    assert (reader_left(node, INDEX, b"r2") or 0) <= 1_000  # the other reader's lease is its own
    assert run(node, RW_READ_EXTEND, (INDEX,), b"other", 60_000) == [0]
    assert entry(node, INDEX, b"other") is None
    assert release(node, b"r1") == 1
    assert release(node, b"r2") == 1
    assert write(node, b"w") == 0


def test_a_dead_readers_entry_is_neither_extended_nor_released(cluster: Cluster) -> None:
    node = cluster[0]
    assert read(node, b"r1", 100) == 0
    assert read(node, b"r2", 100) == 0
    node.command("PEXPIRE", INDEX, 60_000)
    time.sleep(0.15)  # past its expiry by the node's clock: absent, though still in the hash
    assert entries(node, INDEX) == 2
    assert run(node, RW_READ_EXTEND, (INDEX,), b"r1", 60_000) == [0]
    assert release(node, b"r2") == 0
    assert node.command("EXISTS", INDEX) == 0  # both dropped on the way


def test_the_downgrade_swaps_the_writer_for_a_reader_in_one_step(cluster: Cluster) -> None:
    node = cluster[0]
    assert write(node, b"w") == 0
    assert run(node, RW_DOWNGRADE, (W, INDEX), b"w", b"r", 10_000) == 0
    assert node.command("EXISTS", W) == 0
    assert reader_left(node, INDEX, b"r") is not None
    assert read(node, b"r2") == 0  # readers share with it
    assert write(node, b"w2") == READERS_HOLD  # writers wait for it
    assert run(node, RW_DOWNGRADE, (W, INDEX), b"w", b"x", 10_000) == WRITER_HOLDS
    assert entry(node, INDEX, b"x") is None


def test_fenced_readers_read_the_last_writers_token(cluster: Cluster) -> None:
    node = cluster[0]
    keys = (W, INDEX, WAITING, COUNTER)
    assert run(node, RW_WRITE, keys, b"w", 10_000, b"x", 0) == 0  # the counter, before the fence
    assert run(node, FENCE, (W, COUNTER, COUNTER + FENCED_BY), b"w", 7) == 1
    assert run(node, RELEASE, (W,), b"w") == 1
    assert read(node, b"r1", fenced=True) == 7
    assert release(node, b"r1") == 1
    assert run(node, RW_WRITE, keys, b"w2", 10_000, b"y", 0) == 7
    assert run(node, RW_DOWNGRADE, (W, INDEX, COUNTER), b"w2", b"r2", 10_000) == 7


def test_fenced_writer_with_a_floor_reads_at_least_the_nodes_clock(cluster: Cluster) -> None:
    node = cluster[0]
    keys = (W, INDEX, WAITING, COUNTER)
    value = run(node, RW_WRITE, keys, b"w", 10_000, b"x", 0, b"floor")
    assert value > time.time() * 1e6 - 60e6


def test_the_readers_hash_stays_small_without_writers(cluster: Cluster) -> None:
    node = cluster[0]
    assert read(node, b"alive", 60_000) == 0  # (the hash lives on: only the entries' expiry drops them)
    for i in range(40):  # readers that each die at once (1 ms leases), never a writer, never a release
        assert read(node, b"dead%d" % i, 1) == 0
        time.sleep(0.002)
    assert entries(node, INDEX) < 10
    assert b"alive" in live_readers(node, INDEX)
