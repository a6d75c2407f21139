"""The semaphore's grant-queue scripts (redlock_async/_scripts/_permit_line.py), run directly on a real node.

Each test states one clause of a script's contract: a free slot is taken at once while no one is in
line; a full semaphore puts the waiter in line; a release hands its slot to the first live waiter
(set to its token, published on the semaphore's channel with the slot); a leave takes its token out
of the line and off every slot; a give-back puts the waiter back at its score and re-grants to the
first in line; a slot held under another limit refuses the entry and writes nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import redis

from redlock_async._core._names import semaphore_keys
from redlock_async._scripts import ACQUIRE_PERMIT, OLD_LAYOUT, PERMIT_ENTER, PERMIT_LEAVE, PERMIT_STAY, WIDER, Script

from .conftest import Cluster, Node

NAMES = semaphore_keys("redlock:", "pool")
BASE, LINE, WAITS, WIDEST = NAMES.channel, NAMES.line, NAMES.waits, NAMES.widest
SLOTS = tuple(NAMES.slot_key(j) for j in range(3))  # every limit below is 3 or less
KEYS = (BASE, LINE, WAITS, WIDEST, *SLOTS)
LIFE = 5_000


def run(node: Node, script: Script, *args: bytes | int) -> Any:
    return node.command("EVAL", script.source, len(KEYS), *KEYS, *args)


def enter(node: Node, token: bytes, score: int, *, limit: int = 2, ttl: int = 10_000, want: int = -1) -> Any:
    return run(node, PERMIT_ENTER, token, ttl, score, LIFE, limit, want)


def leave(node: Node, token: bytes) -> Any:
    return run(node, PERMIT_LEAVE, token)


def stay(node: Node, token: bytes, score: int, *, limit: int = 2, ttl: int = 10_000, want: int = -1) -> Any:
    return run(node, PERMIT_STAY, token, score, LIFE, ttl, limit, want)


def slot(node: Node, j: int) -> Any:
    return node.command("GET", SLOTS[j])


@contextlib.contextmanager
def listening(node: Any) -> Iterator[Any]:
    client = redis.Redis.from_url(node.url)
    pubsub = client.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(BASE)
    assert pubsub.get_message(timeout=1)["type"] == "subscribe"
    try:
        yield pubsub
    finally:
        pubsub.close()
        client.close()


def heard(pubsub: Any) -> list[bytes]:
    words = []
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.05)
        if message is not None and message["type"] == "message":
            words.append(message["data"])
        elif words:
            break
    return words


def test_free_slots_are_taken_at_once_then_the_waiter_queues(cluster: Cluster) -> None:
    node = cluster[0]
    first = enter(node, b"2:a", 1)
    assert first[0] == 1
    assert first[3] == 0
    assert int(first[2]) == 10_000
    assert enter(node, b"2:b", 2)[0:1] == [1]
    assert slot(node, 1) == b"2:b"
    full = enter(node, b"2:c", 3)
    assert full[0] == 0
    assert full[3] == -1
    assert node.command("ZRANGE", LINE, 0, -1) == [b"2:c"]
    # Entering again while holding says which slot it holds, with its pttl.
    again = enter(node, b"2:a", 1)
    assert again[0] == 1
    assert again[3] == 0
    assert 0 < int(again[2]) <= 10_000
    assert int(node.command("PTTL", WIDEST)) > 10_000  # type: ignore[call-overload]  # outlives the permits


def test_a_release_hands_its_slot_to_the_first_live_waiter(cluster: Cluster) -> None:
    node = cluster[0]
    enter(node, b"2:a", 1)
    enter(node, b"2:b", 2)
    enter(node, b"2:late", 9)
    enter(node, b"2:early", 3)
    with listening(node) as pubsub:
        assert leave(node, b"2:a") == 1
        words = heard(pubsub)
    assert slot(node, 0) == b"2:early"  # by score, not by arrival
    assert len(words) == 1
    digest, node_us, granted = words[0][1:].split(b":")
    assert words[0][:1] == b"g"
    assert len(digest) == 40
    assert int(node_us) > 0
    assert granted == b"0"
    assert node.command("ZRANGE", LINE, 0, -1) == [b"2:late"]
    # A waiter's entry that expired is skipped: its slot goes on, or is freed with the release word.
    node.command("HSET", WAITS, b"2:late", b"1 10000")
    with listening(node) as pubsub:
        assert leave(node, b"2:b") == 1
        words = heard(pubsub)
    assert slot(node, 1) is None
    assert len(words) == 1
    assert words[0][:1] != b"g"


def test_a_leave_takes_the_token_out_of_the_line_and_off_every_slot(cluster: Cluster) -> None:
    node = cluster[0]
    enter(node, b"2:a", 1)
    enter(node, b"2:b", 2)
    enter(node, b"2:c", 3)
    assert leave(node, b"2:c") == 0  # only in line
    assert node.command("EXISTS", LINE) == 0
    # A token that holds two slots on this node (granted one, regained another) frees both.
    node.command("SET", SLOTS[1], b"2:a", "PX", 10_000)
    assert leave(node, b"2:a") == 1
    assert slot(node, 0) is None
    assert slot(node, 1) is None
    assert leave(node, b"2:a") == 0  # run late: nothing of it is left, nothing else is touched


def test_a_give_back_hands_on_what_it_does_not_want_and_keeps_what_it_does(cluster: Cluster) -> None:
    node = cluster[0]
    enter(node, b"2:a", 1)
    enter(node, b"2:b", 2)
    enter(node, b"2:w", 5)
    # Wanting any slot: its slot goes to the first other waiter, and it is back in line at its score.
    back = stay(node, b"2:a", 1)
    assert back[0] == 1
    assert back[3] == -1
    assert slot(node, 0) == b"2:w"
    assert node.command("ZRANGE", LINE, 0, -1) == [b"2:a"]
    # Wanting the slot it holds: it keeps it, out of line.
    kept = stay(node, b"2:b", 2, want=1)
    assert kept[0] == 1
    assert kept[3] == 1
    assert slot(node, 1) == b"2:b"


def test_a_waiter_that_wants_a_slot_is_passed_over_for_others_and_served_that_one(cluster: Cluster) -> None:
    """A split waiter waits for the slot most nodes gave it: a release of another slot goes to the next
    waiter in line, and a release of its slot to it (its holdings converge on one slot)."""
    node = cluster[0]
    enter(node, b"2:a", 1)
    enter(node, b"2:b", 2)
    assert enter(node, b"2:first", 3, want=1)[0] == 0
    assert enter(node, b"2:second", 4)[0] == 0
    leave(node, b"2:a")  # slot 0: not wanted by the first in line, so the second gets it
    assert slot(node, 0) == b"2:second"
    leave(node, b"2:b")  # slot 1: the first's
    assert slot(node, 1) == b"2:first"
    assert node.command("EXISTS", LINE) == 0


def test_another_limit_refuses_the_entry_and_writes_nothing(cluster: Cluster) -> None:
    node = cluster[0]
    enter(node, b"2:a", 1)
    before = sorted(node.command("KEYS", "*"))  # type: ignore[call-overload]
    refused = enter(node, b"3:x", 2, limit=3)
    assert refused[0] == -2
    assert sorted(node.command("KEYS", "*")) == before  # type: ignore[call-overload]


def acquire_permit(node: Node, token: bytes, j: int, *, limit: int) -> Any:
    """ACQUIRE_PERMIT of slot *j* (the first try of every permit, and every permit of ``queue=False``)."""
    return node.command("EVAL", ACQUIRE_PERMIT.source, 1 + len(SLOTS), WIDEST, *SLOTS, token, 10_000, limit, j)


def waiting_while_slots_expire(node: Node) -> None:
    """A limit-2 waiter in line whose slots 0 and 1 then come free without a grant (their holders'
    leases ran out, or a ``queue=False`` holder released them), and three limit-3 permits taken with
    ACQUIRE_PERMIT, which passes the line by (slots 0, 1, 2): the line holds a waiter of another limit."""
    enter(node, b"2:a", 1)
    enter(node, b"2:b", 2)
    assert enter(node, b"2:w", 3)[0] == 0
    node.command("DEL", SLOTS[0], SLOTS[1])  # (their ttl ran out)
    for j in range(3):
        assert acquire_permit(node, b"3:%d" % j, j, limit=3) == 1
    assert node.command("ZRANGE", LINE, 0, -1) == [b"2:w"]


def test_a_slot_goes_to_no_waiter_beyond_its_limit_nor_beside_another_limit(cluster: Cluster) -> None:
    """Issue 35: a limit-3 permit's release handed slot 2 to a limit-2 waiter; two more limit-2 clients
    then took slots 0 and 1: three holders of a limit-2 semaphore. A slot goes only to a waiter it is
    below the limit of, and only while no other slot of the node is held under another limit."""
    node = cluster[0]
    waiting_while_slots_expire(node)
    assert leave(node, b"3:2") == 1
    assert slot(node, 2) is None  # beyond the waiter's limit
    assert leave(node, b"3:0") == 1
    assert slot(node, 0) is None  # below it, but slot 1 is held under limit 3
    assert node.command("ZRANGE", LINE, 0, -1) == [b"2:w"]
    assert leave(node, b"3:1") == 1
    assert slot(node, 1) == b"2:w"  # the last limit-3 permit gone: its slot is the waiter's
    assert acquire_permit(node, b"2:d", 0, limit=2) == 1
    assert acquire_permit(node, b"2:e", 1, limit=2) == []  # held, and no slot below limit 2 is free
    assert [slot(node, j) for j in range(3)] == [b"2:d", b"2:w", None]


def test_an_entry_hands_free_slots_to_no_waiter_of_another_limit(cluster: Cluster) -> None:
    """Free slots that an entry finds go to the first in line that takes them, never beside a permit of
    another limit: a limit-3 client entering behind a limit-2 waiter is not granted slot 1 once the
    waiter holds slot 0 (it stays in line, and its next entry is refused)."""
    node = cluster[0]
    waiting_while_slots_expire(node)
    for j in range(3):
        leave(node, b"3:%d" % j)
    node.command("ZADD", LINE, 3, b"2:w")  # (its entry is still live: put back as it was)
    node.command("HSET", WAITS, b"2:w", b"%d 10000 -1" % (time.time() * 1000 + LIFE))
    for j in range(3):
        node.command("DEL", SLOTS[j])
    entered = enter(node, b"3:n", 4, limit=3)
    assert entered[0] == 0
    assert [slot(node, j) for j in range(3)] == [b"2:w", None, None]
    assert enter(node, b"3:n", 4, limit=3)[0] == -2  # its next entry: refused


def test_a_give_back_hands_no_slot_beside_another_limit(cluster: Cluster) -> None:
    """PERMIT_STAY hands on what the waiter does not want under the same rule."""
    node = cluster[0]
    enter(node, b"2:a", 1)
    enter(node, b"2:b", 2)
    assert enter(node, b"2:w", 3)[0] == 0
    node.command("DEL", SLOTS[0], SLOTS[1])
    assert acquire_permit(node, b"3:x", 0, limit=3) == 1
    node.command("SET", SLOTS[2], b"3:y", "PX", 10_000)  # 3:y, split, was granted slot 2 here
    back = stay(node, b"3:y", 5, limit=3, want=1)
    assert back[0] == 1  # it took slot 1, the one it wants, where it was free
    assert back[3] == 1
    assert slot(node, 2) is None  # not to 2:w: beyond its limit
    assert node.command("ZRANGE", LINE, 0, -1) == [b"2:w"]


# -- the slots named, and the layout before ------------------------------------------------------------


def named(node: Node, script: Script, width: int, *args: bytes | int) -> Any:
    """*script* with only slots 0..width-1 named in its KEYS (a client of a narrower limit names its own)."""
    keys = (BASE, LINE, WAITS, WIDEST, *SLOTS[:width])
    return node.command("EVAL", script.source, len(keys), *keys, *args)


def test_a_node_whose_widest_limit_is_wider_than_the_slots_named_asks_for_them(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"3:wide", 1, limit=3)[0] == 1  # the widest limit here is 3 now
    before = sorted(node.command("KEYS", "*"))  # type: ignore[call-overload]
    assert named(node, PERMIT_ENTER, 2, b"2:n", 10_000, 2, LIFE, 2, -1)[0] == WIDER - 3
    reply = node.command("EVAL", ACQUIRE_PERMIT.source, 3, WIDEST, *SLOTS[:2], b"2:n", 10_000, 2, 1)
    assert reply == WIDER - 3
    assert sorted(node.command("KEYS", "*")) == before  # type: ignore[call-overload]  # nothing written
    # Named as wide as the node's widest limit, it is answered as before: a slot held under limit 3.
    assert enter(node, b"2:n", 2, limit=2)[0] == -3


def test_a_leave_that_cannot_see_every_slot_frees_its_own_and_hands_nothing_on(cluster: Cluster) -> None:
    node = cluster[0]
    assert enter(node, b"3:wide", 1, limit=3)[0] == 1
    assert leave(node, b"3:wide") == 1
    for j, holder in enumerate((b"2:a", b"2:b")):  # (limit-2 permits while the widest key says 3)
        node.command("SET", SLOTS[j], holder, "PX", 10_000)
    assert enter(node, b"2:w", 2, limit=2)[0] == 0  # in line
    with listening(node) as pubsub:
        assert named(node, PERMIT_LEAVE, 2, b"2:a") == 1
        words = heard(pubsub)
    assert slot(node, 0) is None  # freed, not granted: slot 2 might hold a permit of another limit
    assert node.command("ZRANGE", LINE, 0, -1) == [b"2:w"]
    assert len(words) == 1
    assert words[0][:1] != b"g"  # the release word: the waiter enters again, naming every slot


def test_a_widest_limit_key_of_the_layout_before_refuses_every_entry(cluster: Cluster) -> None:
    node = cluster[0]
    node.command("SET", WIDEST, b"2", "PX", 20_000)  # a client of the layout before holds a permit
    before = sorted(node.command("KEYS", "*"))  # type: ignore[call-overload]
    assert enter(node, b"2:n", 1)[0] == OLD_LAYOUT
    assert acquire_permit(node, b"2:n", 0, limit=2) == OLD_LAYOUT
    assert sorted(node.command("KEYS", "*")) == before  # type: ignore[call-overload]
    assert leave(node, b"2:n") == 0  # a leave still runs (it only takes away what is its token's)
