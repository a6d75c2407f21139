"""A Redis Cluster's slots: which slot a key hashes to, which key of a packed command routes it, and the
slot map read from ``CLUSTER SHARDS`` (or ``CLUSTER SLOTS`` on servers before 7.0).

Pure work on bytes, no I/O: :mod:`_cluster_voter` asks and routes with it.
"""

from __future__ import annotations

import binascii
import re

SLOTS = 16384
"""Slots of every Redis/Valkey Cluster."""

_KEYLESS = frozenset(
    {
        b"PING",
        b"TIME",
        b"INFO",
        b"SCRIPT",
        b"CLIENT",
        b"CLUSTER",
        b"ASKING",
        b"PUBLISH",
        b"SUBSCRIBE",
        b"UNSUBSCRIBE",
        b"SSUBSCRIBE",
        b"SUNSUBSCRIBE",
        b"AUTH",
        b"SELECT",
        b"WAIT",
        b"DBSIZE",
        b"SCAN",
        b"ECHO",
        b"HELLO",
        b"READONLY",
        b"READWRITE",
    }
)
"""Commands that name no key: sent to any primary of the voter."""

_SCRIPTED = frozenset({b"EVALSHA", b"EVAL", b"EVALSHA_RO", b"EVAL_RO", b"FCALL", b"FCALL_RO"})
"""Commands whose first key follows the script and the key count."""


def key_slot(key: bytes) -> int:
    """The cluster slot of *key*: CRC16 (XMODEM) of the key, or of its hash tag (the part between the first
    ``{`` and the next ``}`` when that part is not empty), modulo 16384."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key, 0) & (SLOTS - 1)


def first_key(packed: bytes) -> bytes | None:
    """The first key of the packed command *packed* (what routes it), None for a command that names none."""
    return routing_key(packed)[0]


def slot_of(packed: bytes) -> int | None:
    """The slot of the first key of *packed*, None when it names no key."""
    key = routing_key(packed)[0]
    return None if key is None else key_slot(key)


_HEAD = re.compile(rb"\*\d+\r\n\$\d+\r\n([^\r]*)\r\n(?:\$(\d+)\r\n)?")
"""A packed command's head: its name, and the length of its first argument (when it has one)."""
_COUNT = re.compile(rb"\r\n\$\d+\r\n(\d+)\r\n(?:\$(\d+)\r\n)?")
"""What follows a script (or its digest): the key count, and the length of the first key (when there is one)."""


def routing_key(packed: bytes) -> tuple[bytes | None, int]:
    """The first key of one packed RESP command (``*N``, then ``$len`` and the bytes of each; None when it names
    none) and where an ``EVALSHA``'s digest begins in it (0: not an ``EVALSHA``): what a Cluster voter routes
    by. Read by two regular expressions and a slice, no more of the bytes than the key (on the hot path: every
    command a Cluster voter sends)."""
    head = _HEAD.match(packed)
    if head is None:
        return None, 0
    command = head[1].upper()
    size = head[2]
    if size is None or command in _KEYLESS:
        return None, 0
    at = head.end()
    if command not in _SCRIPTED:
        return packed[at : at + int(size)], 0
    digest = at if command == b"EVALSHA" else 0
    tail = _COUNT.match(packed, at + int(size))  # past the script or its digest
    if tail is None or tail[2] is None or tail[1] == b"0":
        return None, digest
    at = tail.end()
    return packed[at : at + int(tail[2])], digest


_tags: dict[int, bytes] = {}


def tag_for(slot: int) -> bytes:
    """A short hash tag (``{...}``) whose keys hash to *slot* (found once per slot, then remembered)."""
    tag = _tags.get(slot)
    if tag is None:
        n = 0
        while binascii.crc_hqx(b"%d" % n, 0) & (SLOTS - 1) != slot:
            n += 1
        tag = _tags[slot] = b"{%d}" % n
    return tag


Address = tuple[str, int]
Ranges = list[tuple[int, int, Address]]
"""(first slot, last slot, the primary serving them) of each range a cluster serves."""


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def shards_ranges(reply: object, seed_host: str) -> Ranges:
    """The ranges of a ``CLUSTER SHARDS`` reply: each shard's ``slots`` (pairs of first and last) and its
    node whose ``role`` is ``master`` and ``health`` ``online`` (a shard without one serves nothing now)."""
    ranges: Ranges = []
    for shard in reply if isinstance(reply, list) else []:
        fields = _pairs(shard)
        primary = None
        nodes = fields.get("nodes")
        for node in nodes if isinstance(nodes, list) else []:
            info = _pairs(node)
            if _text(info.get("role")) == "master" and _text(info.get("health", b"online")) == "online":
                host = _text(info.get("endpoint") or info.get("ip") or b"")
                if host in ("", "?"):
                    host = seed_host  # the node would not say its address: the one we reached
                port = info.get("port") or info.get("tls-port") or 0
                primary = (host, int(port) if isinstance(port, int | bytes | str) else 0)
        slots = fields.get("slots")
        if primary is None or not primary[1] or not isinstance(slots, list):
            continue
        for first, last in zip(slots[::2], slots[1::2], strict=False):
            ranges.append((int(first), int(last), primary))
    return ranges


def slots_ranges(reply: object, seed_host: str) -> Ranges:
    """The ranges of a ``CLUSTER SLOTS`` reply: ``[first, last, [host, port, id, ...], replicas...]``."""
    ranges: Ranges = []
    for entry in reply if isinstance(reply, list) else []:
        if not isinstance(entry, list) or len(entry) < 3 or not isinstance(entry[2], list):
            continue
        host = _text(entry[2][0])
        if host in ("", "?"):
            host = seed_host
        ranges.append((int(entry[0]), int(entry[1]), (host, int(entry[2][1]))))
    return ranges


def _pairs(value: object) -> dict[str, object]:
    """A RESP2 flat ``name value ...`` list as a dict (names as text)."""
    if isinstance(value, dict):
        return {_text(k): v for k, v in value.items()}
    if not isinstance(value, list):
        return {}
    return {_text(k): v for k, v in zip(value[::2], value[1::2], strict=False)}


def redirect(detail: str) -> tuple[str, int, Address] | None:
    """``MOVED``/``ASK`` of a server's error *detail* (``MOVED 3999 127.0.0.1:6381``): (kind, slot, address)."""
    words = detail.split(" ")
    if len(words) < 3 or words[0] not in ("MOVED", "ASK") or not words[1].isdigit():
        return None
    host, _, port = words[2].rpartition(":")
    if not port.isdigit():
        return None
    return words[0], int(words[1]), (host.strip("[]"), int(port))
