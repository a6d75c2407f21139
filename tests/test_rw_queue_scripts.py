"""The read/write lock's line in the grant queue (redlock_async/_scripts/_rw_line.py), run directly on a
real node: arrival order, readers at the head granted together, a writer granted when the last reader
leaves, grant words published, and the rule on one node (W and a live reader's entry never together)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import redis

from redlock_async._core._names import rw_keys
from redlock_async._scripts import RW_ENTER, RW_QUEUE_DOWNGRADE, RW_QUEUE_LEAVE, RW_QUEUE_STAY, RW_READ, Script

from ._rw_layout import entry, live_readers, reader_left
from .conftest import Cluster

W = b"redlock:\x00rw\x00doc"
INDEX, WAITING = rw_keys(W)[1:3]
LINE, WAITS = W + b"\x00queue", W + b"\x00waits"
KEYS = (W, INDEX, WAITING, LINE, WAITS)
COUNTER = b"redlock-fence:doc"


def run(node: Any, script: Script, keys: tuple[bytes, ...], *args: bytes | int) -> Any:
    return node.command("EVAL", script.source, len(keys), *keys, *args)


def enter(node: Any, token: bytes, kind: bytes, score: int, *, ttl: int = 10_000, life: int = 5_000) -> int:
    reply = run(node, RW_ENTER, KEYS, token, ttl, score, life, kind)
    return int(reply[0])


def leave(node: Any, token: bytes, kind: bytes) -> int:
    return int(run(node, RW_QUEUE_LEAVE, KEYS, token, kind))


def holds(node: Any, token: bytes, kind: bytes) -> bool:
    if kind == b"w":
        return bool(node.command("GET", W) == token)
    return reader_left(node, INDEX, token) is not None


def one_node_rule(node: Any) -> None:
    """W and a live reader's entry never together on one node."""
    readers = live_readers(node, INDEX)
    assert not (node.command("EXISTS", W) == 1 and readers), readers


def test_a_free_name_goes_at_once_to_whoever_enters(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"r1", b"r", 1) == 1
    assert enter(node, b"r2", b"r", 2) == 1  # readers share
    assert node.command("ZCARD", LINE) == 0
    assert enter(node, b"w1", b"w", 3) == 0  # a writer waits for the readers
    one_node_rule(node)


def test_a_waiting_writer_keeps_later_readers_out_and_is_granted_when_the_last_reader_leaves(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"r1", b"r", 1) == 1
    assert enter(node, b"w1", b"w", 2) == 0
    assert enter(node, b"r2", b"r", 3) == 0  # behind the writer
    assert int(run(node, RW_READ, (W, INDEX, WAITING), b"r3", 10_000)) == -2
    assert entry(node, INDEX, b"r3") is None
    pubsub = redis.Redis.from_url(node.url).pubsub()  # type: ignore[no-untyped-call,attr-defined]
    pubsub.subscribe(W)
    pubsub.get_message(timeout=0.5)  # the subscription's confirmation
    assert leave(node, b"r1", b"r") == 1  # the last reader: the writer is granted
    assert holds(node, b"w1", b"w")
    assert not holds(node, b"r2", b"r")
    words = [m["data"] for m in iter(lambda: pubsub.get_message(timeout=0.5), None) if m["type"] == "message"]
    digest = hashlib.sha1(b"w1").hexdigest().encode()
    assert any(word.startswith(b"g" + digest + b":") for word in words), words
    one_node_rule(node)
    assert leave(node, b"w1", b"w") == 1  # the writer leaves: the readers behind it are granted
    assert holds(node, b"r2", b"r")
    one_node_rule(node)


def test_readers_at_the_head_go_together_up_to_the_next_writer(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"w0", b"w", 1) == 1
    for i, (token, kind) in enumerate([(b"r1", b"r"), (b"r2", b"r"), (b"w2", b"w"), (b"r3", b"r")]):
        assert enter(node, token, kind, 10 + i) == 0
    assert leave(node, b"w0", b"w") == 1
    assert holds(node, b"r1", b"r")
    assert holds(node, b"r2", b"r")
    assert not holds(node, b"w2", b"w")
    assert not holds(node, b"r3", b"r")  # behind the writer in line
    leave(node, b"r1", b"r")
    assert not holds(node, b"w2", b"w")  # r2 still reads
    leave(node, b"r2", b"r")
    assert holds(node, b"w2", b"w")
    leave(node, b"w2", b"w")
    assert holds(node, b"r3", b"r")


def test_the_line_is_in_score_order_not_entry_order(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"w0", b"w", 1) == 1
    assert enter(node, b"r-late", b"r", 50) == 0
    assert enter(node, b"w-early", b"w", 20) == 0  # entered later, but its score is lower: first
    leave(node, b"w0", b"w")
    assert holds(node, b"w-early", b"w")
    assert not holds(node, b"r-late", b"r")


def test_an_expired_entry_is_skipped(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"w0", b"w", 1) == 1
    assert enter(node, b"w-dead", b"w", 2, life=100) == 0
    assert enter(node, b"r1", b"r", 3) == 0
    time.sleep(0.15)  # the waiting writer died: its entry was not entered again
    leave(node, b"w0", b"w")
    assert holds(node, b"r1", b"r")
    assert not holds(node, b"w-dead", b"w")


def test_a_reader_that_dies_holding_frees_the_writer_at_the_next_entry(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"r1", b"r", 1, ttl=100) == 1
    assert enter(node, b"w1", b"w", 2) == 0
    time.sleep(0.15)  # r1's entry expired: no release ran
    assert enter(node, b"w1", b"w", 2) == 1  # the writer's next entry finds the rule allows it


def test_a_leave_of_a_waiter_takes_its_entry_and_lets_the_readers_behind_it_in(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"r1", b"r", 1) == 1
    assert enter(node, b"w1", b"w", 2) == 0
    assert enter(node, b"r2", b"r", 3) == 0
    assert leave(node, b"w1", b"w") == 0  # it held nothing here
    assert holds(node, b"r2", b"r")
    assert node.command("ZCARD", LINE) == 0
    assert node.command("ZCARD", WAITING) == 0


def test_a_give_back_keeps_the_place_and_may_be_granted_again(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"w1", b"w", 5) == 1
    assert enter(node, b"w2", b"w", 9) == 0
    reply = run(node, RW_QUEUE_STAY, KEYS, b"w1", 5, 5_000, 10_000, b"w")
    assert reply[0] == 1
    assert int(reply[2]) > 0  # first in line again: granted again at once
    assert holds(node, b"w1", b"w")
    reply = run(node, RW_QUEUE_STAY, KEYS, b"w1", 20, 5_000, 10_000, b"w")  # now behind w2
    assert holds(node, b"w2", b"w")
    assert not holds(node, b"w1", b"w")


def test_a_downgrade_lets_the_readers_at_the_head_in(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"w1", b"w", 1) == 1
    assert enter(node, b"r1", b"r", 2) == 0
    assert enter(node, b"w2", b"w", 3) == 0
    keys = (*KEYS, COUNTER)
    assert int(run(node, RW_QUEUE_DOWNGRADE, keys, b"w1", b"d1", 10_000)) == 0
    assert holds(node, b"d1", b"r")
    assert holds(node, b"r1", b"r")
    assert not holds(node, b"w2", b"w")
    one_node_rule(node)
    assert int(run(node, RW_QUEUE_DOWNGRADE, keys, b"w1", b"d2", 10_000)) == -1  # W is not its token's


def test_a_writer_outside_the_line_keeps_readers_in_line_out(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"w0", b"w", 1) == 1
    assert enter(node, b"r1", b"r", 2) == 0
    far = int(time.time() * 1000) + 60_000  # (a node ms score: a live RW_WRITE waiter of a client without the queue)
    node.command("ZADD", WAITING, far, b"outsider")
    leave(node, b"w0", b"w")
    assert not holds(node, b"r1", b"r")
    node.command("ZREM", WAITING, b"outsider")
    assert enter(node, b"r1", b"r", 2) == 1


def test_a_granted_key_expires_no_earlier_than_the_grant_time_plus_its_ttl(cluster: Cluster) -> None:
    """The premise of a grant word's validity (docs/algorithm.md, "The grant queue"), for the line's
    grants of a writer and of readers: each key or reader's entry set expires no earlier than G + ttl on the
    node's clock (and the readers' hash no earlier than its entry)."""
    node = cluster[0]
    pubsub = redis.Redis.from_url(node.url).pubsub()  # type: ignore[no-untyped-call,attr-defined]
    pubsub.subscribe(W)
    pubsub.get_message(timeout=0.5)
    assert enter(node, b"r0", b"r", 1) == 1
    assert enter(node, b"w1", b"w", 2, ttl=3_000) == 0
    assert enter(node, b"r1", b"r", 3, ttl=4_000) == 0
    leave(node, b"r0", b"r")  # grants w1
    leave(node, b"w1", b"w")  # grants r1
    words = [m["data"] for m in iter(lambda: pubsub.get_message(timeout=0.5), None) if m["type"] == "message"]
    grants = {word[1:41]: int(word.split(b":")[1]) for word in words if word.startswith(b"g")}
    w1, r1 = (hashlib.sha1(t).hexdigest().encode() for t in (b"w1", b"r1"))
    assert {w1, r1} <= set(grants), words
    found = entry(node, INDEX, b"r1")
    assert found is not None
    assert found[1] >= grants[r1] // 1000 + 4_000
    assert int(node.command("PEXPIRETIME", INDEX)) >= found[1]  # type: ignore[call-overload]
    assert enter(node, b"w2", b"w", 4, ttl=3_000) == 0
    leave(node, b"r1", b"r")  # grants w2
    words = [m["data"] for m in iter(lambda: pubsub.get_message(timeout=0.5), None) if m["type"] == "message"]
    w2 = hashlib.sha1(b"w2").hexdigest().encode()
    granted = [int(word.split(b":")[1]) for word in words if word.startswith(b"g" + w2)]
    assert granted, words
    assert int(node.command("PEXPIRETIME", W)) >= granted[0] // 1000 + 3_000  # type: ignore[call-overload]
