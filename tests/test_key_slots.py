"""One cluster slot per name (issue 39 item 2): every key a primitive keeps for one name hashes to one slot,
for ordinary names and names with braces, as a cluster-mode server computes it (``CLUSTER KEYSLOT``); and
the scripts run on a cluster-mode node holding every slot, where keys of two slots are refused
(``CROSSSLOT``): the layout before this one was refused there.

A lock key is the prefix and the name, as it always was; its line and waits are its companions
(``_names.companion``). A semaphore's keys all live in the slot of its widest-limit key (whose name is
unchanged: the layout before reads it first).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from redlock_async._core._names import (
    companion,
    fence_key,
    rw_keys,
    rw_writer_key,
    semaphore_keys,
    slot_of,
    slot_tag,
)
from redlock_async._queue import mark_key, queue_keys
from redlock_async._scripts import (
    ACQUIRE_FENCED,
    ACQUIRE_PERMIT,
    EXTEND,
    FENCE,
    FENCED_BY,
    KEEP_LIMIT,
    PERMIT_ENTER,
    PERMIT_LEAVE,
    PERMIT_STAY,
    QUEUE_ENTER,
    QUEUE_FENCE,
    QUEUE_LEAVE,
    RW_DOWNGRADE,
    RW_ENTER,
    RW_LEAVE,
    RW_QUEUE_DOWNGRADE,
    RW_QUEUE_LEAVE,
    RW_READ,
    RW_READ_EXTEND,
    RW_READ_RELEASE,
    RW_WRITE,
    Script,
)
from redlock_async.testing import LocalNode
from redlock_async.testing._shapes import cluster_port

NAMES = [
    "orders:42",
    "{user7}:cart",  # a hash tag of its own
    "a{b",  # an open brace: no tag
    "a{}b",  # an empty tag: the whole key is hashed
    "{}",
    "}{",
    "x}y{z}",
    "{{a}}",
    "{",
    "}",
    "ключ{",
]
PREFIXES = ["redlock:", "{app}:", "odd{prefix:"]


def lock_group(prefix: str, name: str) -> list[bytes]:
    key = (prefix + name).encode()
    return [*queue_keys(key), mark_key(key)]  # its line, waits and listening mark


def semaphore_group(prefix: str, name: str) -> list[bytes]:
    keys = semaphore_keys(prefix, name)
    return [keys.channel, keys.line, keys.waits, keys.widest, *(keys.slot_key(j) for j in range(12))]


GROUPS = {"lock": lock_group, "semaphore": semaphore_group}


def test_a_tag_for_every_slot() -> None:
    for slot in range(16384):
        tag = slot_tag(slot)
        assert len(tag) == 4
        assert not set(tag) & set(b"{}\x000123456789"), tag
        assert slot_of(b"{" + tag + b"}") == slot
        assert slot_of(b"x{" + tag + b"}y{z}") == slot


def test_every_companion_is_in_its_keys_slot_or_the_one_asked() -> None:
    rng = random.Random(7)
    keys = [(prefix + name).encode() for prefix in PREFIXES for name in NAMES]
    keys += [bytes(rng.choice(b"ab{}:") for _ in range(rng.randrange(1, 9))) for _ in range(4000)]
    for key in keys:
        for kind in (b"\x00queue", b"\x00waits", b"\x00slot\x007"):
            made = companion(key, kind)
            assert made.startswith(key + kind)  # under the key's prefix (the ACL's patterns), named by kind
            assert slot_of(made) == slot_of(key), (key, made)
            start = key.find(b"{")
            if start < 0 or key.find(b"}", start + 1) <= start + 1:  # no tag of its own: any slot may be asked
                assert slot_of(companion(key, kind, 1234)) == 1234
    with pytest.raises(ValueError, match="same hash tag"):
        companion(b"redlock:{user7}", b"\x00fence", slot_of(b"other") ^ 1)


def test_companions_never_alias() -> None:
    made: dict[bytes, tuple[str, str, int]] = {}
    for prefix in PREFIXES:
        for name in [*NAMES, "pool", "pool\x01", "p"]:
            for kind, group in GROUPS.items():
                for i, key in enumerate(group(prefix, name)):
                    assert made.setdefault(key, (prefix + name, kind, i)) == (prefix + name, kind, i), key


@pytest.fixture(scope="module")
def shard() -> Iterator[redis.Redis]:
    """A cluster-mode node that serves every slot (``CLUSTER ADDSLOTS``: Redis 6.2 has no ADDSLOTSRANGE)."""
    args = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
    with LocalNode(port=cluster_port(), server_args=args) as node:
        client = redis.Redis(port=node.port)
        try:
            for start in range(0, 16384, 4096):
                client.execute_command("CLUSTER", "ADDSLOTS", *range(start, start + 4096))  # type: ignore[no-untyped-call]
            deadline = time.monotonic() + 30
            while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):  # type: ignore[no-untyped-call]
                assert time.monotonic() < deadline, "the one-node cluster did not come up"
                time.sleep(0.05)
            yield client
        finally:
            client.close()


@pytest.mark.parametrize("kind", sorted(GROUPS))
@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_key_of_a_name_hashes_to_one_slot_on_a_cluster_node(shard: redis.Redis, kind: str, prefix: str) -> None:
    for name in NAMES:
        keys = GROUPS[kind](prefix, name)
        slots = {keyslot(shard, key) for key in keys}
        assert slots == {slot_of(keys[0])}, (name, keys)


def keyslot(shard: redis.Redis, key: bytes) -> int:
    return int(shard.execute_command("CLUSTER", "KEYSLOT", key))  # type: ignore[no-untyped-call]


def run(shard: redis.Redis, script: Script, keys: list[bytes], *args: object) -> Any:
    source = script.source
    return shard.execute_command("EVAL", source, len(keys), *keys, *args)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("name", NAMES)
def test_the_scripts_run_on_a_cluster_node(shard: redis.Redis, name: str) -> None:
    """Each semaphore script and a lock's entry in line, on a node that refuses keys of two slots."""
    keys = semaphore_keys("redlock:", name)
    slots = [keys.slot_key(j) for j in range(2)]
    permit = [keys.channel, keys.line, keys.waits, keys.widest, *slots]
    assert run(shard, ACQUIRE_PERMIT, [keys.widest, *slots], b"2:a", 5000, 2, 0) == 1
    assert run(shard, KEEP_LIMIT, [slots[0], keys.widest], b"2:a", 5000) == 1
    assert run(shard, PERMIT_ENTER, permit, b"2:b", 5000, 1, 5000, 2, -1)[0] == 1
    assert run(shard, PERMIT_ENTER, permit, b"2:c", 5000, 2, 5000, 2, -1)[0] == 0
    assert run(shard, PERMIT_STAY, permit, b"2:c", 2, 5000, 5000, 2, -1)[0] == 0
    assert run(shard, PERMIT_LEAVE, permit, b"2:a") == 1  # slot 0 to 2:c
    assert shard.get(slots[0]) == b"2:c"
    lock = queue_keys(("redlock:" + name).encode())
    assert run(shard, QUEUE_ENTER, list(lock), b"t", 5000, 1, 5000)[0] == 1
    shard.set(lock[0], b"t")
    assert run(shard, QUEUE_LEAVE, [*lock, mark_key(lock[0])], b"t") is not None  # the line and the mark
    shard.flushall()


def test_the_layout_before_was_refused_on_a_cluster_node(shard: redis.Redis) -> None:
    """What this file guards against: the lock's line as it was (the lock key followed by ``\\x00queue``)."""
    with pytest.raises(redis.ResponseError, match=r"CROSSSLOT|same slot"):
        run(shard, QUEUE_ENTER, [b"redlock:orders:42", b"redlock:orders:42\x00queue", b"redlock:orders:42\x00waits"])


# -- fencing counters and read/write locks: one slot with a cluster voter -------------------------
# A Redlock whose voters are all standalone names them as every version before did; one with a
# redis+cluster:// voter (Cluster.one_slot, from _names.one_slot_voters) puts a fencing counter in the
# slot of the key it serves, and a read/write lock's companions in its writer key's.

FENCE_PREFIXES = {"redlock:": "redlock-fence:", "{app}:": "{app}-fence:", "odd{prefix:": "odd-fence{"}


def fenced_group(prefix: str, name: str) -> list[bytes]:
    lock = (prefix + name).encode()
    fence = fence_key(FENCE_PREFIXES[prefix], name, lock)
    return [*queue_keys(lock, fence), fence + FENCED_BY]


def rw_group(prefix: str, name: str) -> list[bytes]:
    writer = rw_writer_key(prefix, name)
    rw = rw_keys(writer, one_slot=True)
    fence = fence_key(FENCE_PREFIXES[prefix], name, writer)
    return [writer, *rw, rw.reader(b"t1"), rw.reader(b"t2"), fence, fence + FENCED_BY]


@pytest.mark.parametrize("group", [fenced_group, rw_group])
@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_fenced_locks_and_a_rw_locks_keys_hash_to_one_slot_on_a_cluster_node(
    shard: redis.Redis, group: Any, prefix: str
) -> None:
    for name in NAMES:
        keys = group(prefix, name)
        assert {keyslot(shard, key) for key in keys} == {slot_of(keys[0])}, (name, keys)


@pytest.mark.parametrize("name", NAMES)
def test_the_fenced_scripts_run_on_a_cluster_node(shard: redis.Redis, name: str) -> None:
    """A fenced acquire, its fence, a waiter in line granted on the release and fenced: one slot each."""
    lock = ("redlock:" + name).encode()
    fence = fence_key("redlock-fence:", name, lock)
    line = list(queue_keys(lock, fence))
    assert run(shard, ACQUIRE_FENCED, [lock, fence], b"t1", 5000) == 0
    assert run(shard, FENCE, [lock, fence, fence + FENCED_BY], b"t1", 1) == 1
    assert run(shard, QUEUE_ENTER, line, b"t2", 5000, 1, 5000)[0] == 0  # held: t2 waits in line
    assert run(shard, QUEUE_LEAVE, line, b"t1") == 1  # released: granted to t2
    assert shard.get(lock) == b"t2"
    assert run(shard, QUEUE_FENCE, [lock, fence, fence + FENCED_BY], b"t2", 2)[0] == 1
    assert shard.get(fence) == b"2"
    assert run(shard, EXTEND, [lock], b"t2", 5000, 0) == 1
    shard.flushall()


@pytest.mark.parametrize("name", NAMES)
def test_the_rw_scripts_run_on_a_cluster_node(shard: redis.Redis, name: str) -> None:
    """Every read/write script (readers granted by others' scripts, readers a writer looks for: all in the
    readers' hash, declared), on a node that refuses a key of another slot, declared or not."""
    writer = rw_writer_key("redlock:", name)
    rw = rw_keys(writer, one_slot=True)
    fence = fence_key("redlock-fence:", name, writer)
    line = [writer, rw.readers, rw.writers, rw.line, rw.waits, fence]
    assert run(shard, RW_READ, [writer, rw.readers, rw.writers, fence], b"r1", 5000) == 0
    assert run(shard, RW_READ_EXTEND, [rw.readers], b"r1", 5000) == [1]
    assert run(shard, RW_ENTER, line, b"r2", 5000, 1, 5000, b"r")[0] == 1  # readers share
    assert run(shard, RW_ENTER, line, b"w1", 5000, 2, 5000, b"w")[0] == 0  # the writer waits
    assert run(shard, RW_ENTER, line, b"r3", 5000, 3, 5000, b"r")[0] == 0  # behind the writer
    # A writer of the default path looks for live readers (the readers' hash).
    waiting = [writer, rw.readers, rw.writers, fence]
    assert run(shard, RW_WRITE, waiting, b"w9", 5000, b"x9", 5000) < 0
    assert run(shard, RW_LEAVE, [rw.writers, writer], b"x9") == 1
    assert run(shard, RW_READ_RELEASE, [rw.readers, writer], b"r1") == 1
    assert run(shard, RW_QUEUE_LEAVE, line, b"r2", b"r") == 1  # the last reader: w1 granted
    assert shard.get(writer) == b"w1"
    assert run(shard, FENCE, [writer, fence, fence + FENCED_BY], b"w1", 7) == 1
    # The downgrade grants r3 too: both in the readers' hash.
    assert run(shard, RW_QUEUE_DOWNGRADE, line, b"w1", b"r4", 5000) == 7
    assert shard.hlen(rw.readers) == 2
    for token in (b"r3", b"r4"):
        assert run(shard, RW_QUEUE_LEAVE, line, token, b"r") == 1
    assert run(shard, RW_WRITE, waiting, b"w2", 5000, b"x2", 0) == 7
    assert run(shard, RW_DOWNGRADE, [writer, rw.readers, fence], b"w2", b"r5", 5000) == 7
    assert run(shard, RW_READ_RELEASE, [rw.readers, writer], b"r5") == 1
    shard.flushall()


def test_a_rw_lock_of_todays_names_is_refused_on_a_cluster_node(shard: redis.Redis) -> None:
    """What the one-slot names guard against: the standalone voters' names (the writer key followed by
    each kind), in other slots than the writer key."""
    writer = rw_writer_key("redlock:", "orders:42")
    rw = rw_keys(writer)
    with pytest.raises(redis.ResponseError, match=r"CROSSSLOT|same slot"):
        run(shard, RW_READ, [writer, rw.readers, rw.writers], b"r1", 5000)
    lock = b"redlock:orders:42"
    with pytest.raises(redis.ResponseError, match=r"CROSSSLOT|same slot"):
        run(shard, ACQUIRE_FENCED, [lock, fence_key("redlock-fence:", "orders:42")], b"t1", 5000)
