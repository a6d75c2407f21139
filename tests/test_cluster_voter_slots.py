"""The Cluster voter's pure parts (``_nodes/_slots.py``): slots, the key that routes a packed command, the
slot map's replies, redirections. No server."""

from __future__ import annotations

import random

from redis.crc import key_slot as redis_py_key_slot

from redlock_async._nodes._slots import (
    first_key,
    key_slot,
    redirect,
    routing_key,
    shards_ranges,
    slot_of,
    slots_ranges,
    tag_for,
)
from redlock_async._nodes._wire import pack, pack_script
from redlock_async._scripts import SCRIPTS


def test_key_slot_is_the_clusters_own_with_hash_tags() -> None:
    rng = random.Random(39)
    keys = [b"", b"a", b"redlock:orders:42", b"{user1000}.following", b"foo{}{bar}", b"foo{{bar}}zap", b"{}x"]
    keys += [rng.randbytes(rng.randrange(1, 40)) for _ in range(500)]
    for key in keys:
        assert key_slot(key) == redis_py_key_slot(key), key
    assert key_slot(b"123456789") == 12739  # the CRC16 check value in the Cluster specification
    assert key_slot(b"x{tag}y") == key_slot(b"{tag}") == key_slot(b"tag")


def test_the_first_key_routes_a_command_and_keyless_ones_name_none() -> None:
    assert first_key(pack((b"SET", b"redlock:a", b"tok", b"NX", b"PX", 100))) == b"redlock:a"
    assert first_key(pack((b"get", b"k"))) == b"k"
    script = SCRIPTS[0]
    assert first_key(pack_script(script, (b"redlock:b", b"other"), (b"x", 5))) == b"redlock:b"
    assert first_key(pack_script(script, (), (b"x",))) is None
    assert first_key(pack((b"EVAL", b"return 1", 0))) is None
    for keyless in ((b"PING",), (b"TIME",), (b"INFO", b"server"), (b"SCRIPT", b"LOAD", b"x"), (b"PUBLISH", b"c", b"m")):
        assert first_key(pack(keyless)) is None
    assert slot_of(pack((b"PTTL", b"{t}x"))) == key_slot(b"t")
    # Keys with the bytes of RESP in them, a script whose source has them, a command without arguments.
    odd = b"redlock:\r\n$3\r\n*2"
    assert first_key(pack((b"SET", odd, b"\r\n", b"NX"))) == odd
    assert first_key(pack((b"EVAL", b"return 1\r\n$1\r\n", 1, odd, b"x"))) == odd
    assert first_key(pack((b"EVAL", b"return 1", 1))) is None  # (a key count with no key)
    assert first_key(pack((b"GET",))) is None
    assert first_key(b"") is None
    assert first_key(pack((b"SPUBLISH", b"redlock:c", b"m"))) == b"redlock:c"  # routed by its channel


def test_the_routing_key_and_where_an_evalshas_digest_sits() -> None:
    for script in SCRIPTS:
        packed = pack_script(script, (b"redlock:{z}a", b"redlock:{z}b"), (b"token", 7))
        key, digest = routing_key(packed)
        assert key == b"redlock:{z}a"
        assert packed[digest : digest + 40] == script.sha
    assert routing_key(pack_script(SCRIPTS[0], (), (b"x",)))[0] is None
    assert routing_key(pack((b"EVAL", b"return 1", 1, b"k"))) == (b"k", 0)  # (the source: no digest)
    assert routing_key(pack((b"SET", b"k", b"v"))) == (b"k", 0)
    assert routing_key(pack((b"TIME",))) == (None, 0)


def test_tags_hash_to_their_slot() -> None:
    for slot in (0, 1, 5000, 16383):
        assert key_slot(b"redlock:" + tag_for(slot)) == slot


def test_redirections_are_read() -> None:
    assert redirect("MOVED 3999 127.0.0.1:6381") == ("MOVED", 3999, ("127.0.0.1", 6381))
    assert redirect("ASK 12 [::1]:7000") == ("ASK", 12, ("::1", 7000))
    assert redirect("TRYAGAIN Multiple keys request during rehashing of slot") is None
    assert redirect("MOVED x y") is None


def test_the_slot_map_from_cluster_shards_and_cluster_slots() -> None:
    shards = [
        [
            b"slots", [0, 99, 200, 299],
            b"nodes", [
                [b"id", b"a", b"port", 7000, b"ip", b"10.0.0.1", b"endpoint", b"10.0.0.1", b"role", b"master",
                 b"health", b"online"],
                [b"id", b"b", b"port", 7001, b"ip", b"10.0.0.2", b"endpoint", b"10.0.0.2", b"role", b"replica",
                 b"health", b"online"],
            ],
        ],
        [
            b"slots", [100, 199],
            b"nodes", [
                [b"id", b"c", b"port", 7002, b"ip", b"10.0.0.3", b"endpoint", b"?", b"role", b"master",
                 b"health", b"failed"],
            ],
        ],
    ]  # fmt: skip
    assert shards_ranges(shards, "seed") == [(0, 99, ("10.0.0.1", 7000)), (200, 299, ("10.0.0.1", 7000))]
    slots = [[0, 99, [b"10.0.0.1", 7000, b"a"], [b"10.0.0.2", 7001, b"b"]], [100, 199, [b"", 7002, b"c"]]]
    assert slots_ranges(slots, "seed") == [(0, 99, ("10.0.0.1", 7000)), (100, 199, ("seed", 7002))]
