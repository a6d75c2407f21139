"""Names, keys and owner labels: how a lock's name becomes its keys on the nodes, and who it says holds it.

Checked once, when a lock is made, with errors that say what to change: a name is str (UTF-8) or
bytes, not empty, at most MAX_RESOURCE_BYTES, and without a NUL byte; ``lock_many`` takes its
names deduplicated and sorted by their bytes, the order every client takes them in; an owner label
is printable text stored after the token.

**Keys never alias.** Every key the library adds to a name's bytes, or puts between the key prefix
and them, starts with NUL (``\x00``): a semaphore's and a read/write lock's infixes, the grant
queue's line and waits, a semaphore's slots and widest-limit key, a read/write lock's readers and
waiting writers, a fencing counter's fencer, an election's channel. A name holds no NUL, so a
key splits one way only: no name's lock key is another primitive's key (a lock on a semaphore's
slot, or on a read/write lock's writer beside its readers). UTF-8 encodes no character but U+0000
with a zero byte, so NUL is the only byte to refuse.
"""

from __future__ import annotations

import binascii
import functools
import hashlib
import os
import socket
from collections.abc import Iterable
from typing import NamedTuple

MAX_RESOURCE_BYTES = 4096
"""Longest resource name, in bytes once encoded: hash longer identifiers first."""


def released_word(token: bytes) -> bytes:
    """What the release script publishes for *token* (``redis.sha1hex``): the word waiters count."""
    return hashlib.sha1(token).hexdigest().encode()


def resource_key(prefix: str, resource: str | bytes) -> bytes:
    """The Redis key of *resource*, after checking the name."""
    if isinstance(resource, str):
        try:
            raw = resource.encode()
        except UnicodeEncodeError as exc:
            raise ValueError(f"resource name {resource!r} is not valid UTF-8 ({exc.reason}): pass bytes") from None
    elif isinstance(resource, bytes):
        raw = resource
    else:
        raise TypeError(f"resource name must be str or bytes, got {type(resource).__name__}")
    if not raw:
        raise ValueError("resource name is empty: name the thing the lock protects")
    if len(raw) > MAX_RESOURCE_BYTES:
        raise ValueError(
            f"resource name is {len(raw)} bytes, more than {MAX_RESOURCE_BYTES}: hash long names (e.g. sha256)"
        )
    if b"\x00" in raw:
        raise ValueError(
            f"resource name {resource!r} contains a NUL byte (\\x00), which the library's keys use as a separator "
            "(a semaphore's, a read/write lock's, the grant queue's): such a name could stand for their keys. Leave "
            "it out (for a binary identifier such as a digest, pass its .hex())"
        )
    return prefix.encode() + raw


Name = str | bytes


def canonical_names(names: object) -> tuple[Name, ...]:
    """*names* deduplicated and sorted by their encoded bytes: the order every client takes them in."""
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise TypeError(
            f"lock_many takes a list of names (str or bytes), got {type(names).__name__}: for one name, use lock()"
        )
    listed = list(names)
    if not listed:
        raise ValueError("lock_many needs at least one name")
    by_key: dict[bytes, Name] = {}
    for name in listed:
        by_key.setdefault(resource_key("", name), name)
    if len(by_key) > MAX_NAMES:
        raise ValueError(f"lock_many of {len(by_key)} names, more than {MAX_NAMES}: lock fewer, or lock a parent name")
    return tuple(by_key[key] for key in sorted(by_key))


MAX_OWNER_BYTES = 256
"""Longest owner label, in bytes once encoded (it is stored with every key of the lease)."""

_default_owner: bytes | None = None


def default_owner() -> bytes:
    """``<hostname>:<pid>``, made again in a forked child (its pid differs)."""
    global _default_owner
    if _default_owner is None:
        _default_owner = f"{socket.gethostname()}:{os.getpid()}".encode(errors="replace")[:MAX_OWNER_BYTES]
    return _default_owner


def _forget_owner() -> None:
    global _default_owner
    _default_owner = None


os.register_at_fork(after_in_child=_forget_owner)  # a child is another owner (no getpid() per acquire)


def check_owner(owner: object) -> bytes | None:
    """The owner label as stored (None: the default, ``<hostname>:<pid>``), after checking it."""
    if owner is None:
        return None
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str (a label inspection shows, e.g. 'worker-7'), got {type(owner).__name__}")
    if not owner or not owner.isprintable():
        raise ValueError(f"owner must be a non-empty label of printable characters, got {owner!r}")
    try:
        raw = owner.encode()
    except UnicodeEncodeError:
        raise ValueError(f"owner {owner!r} is not valid UTF-8 text: use a plain label") from None
    if len(raw) > MAX_OWNER_BYTES:
        raise ValueError(f"owner is {len(raw)} bytes, more than {MAX_OWNER_BYTES}: use a shorter label")
    return raw


MAX_NAMES = 1000
"""Most names one lock_many takes (every node checks and sets them all in one script call)."""


# -- one cluster slot per name ------------------------------------------------------
# A Redis/Valkey Cluster runs a script only where all its keys live in one slot. A lock key is the key
# prefix and the name, as it always was (the cheapest exclusion between versions: every version sets the
# same key). Every other key of the name is a *companion*: the key it belongs to, a NUL-led kind, and what
# puts it in the slot wanted (:func:`companion`): nothing when the key has a hash tag of its own, else
# ``{T}`` with four characters T whose CRC16 is that slot (:func:`slot_tag`), or, for a key whose braces
# make no tag (``a{b``, ``a{}b``), four characters that make the whole companion hash there. So any name
# works, braces included, and every companion starts with its key, under its prefix (the ACL's patterns).

SLOTS = 16384
"""Hash slots of a Redis/Valkey Cluster."""


def slot_of(key: bytes) -> int:
    """The cluster slot of *key*: CRC16 (XMODEM, as ``binascii.crc_hqx``) of its hash tag (the text between
    its first ``{`` and the first ``}`` after it, when not empty), else of the whole key, mod 16384."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key, 0) % SLOTS


# CRC16 with a zero start is linear over GF(2): crc(a ^ b) == crc(a) ^ crc(b) for strings of one length,
# and leading zero bytes do not change it. A tag is _TAG_BASE with some of its 20 low bits (5 per
# character: '@'..'_', never a brace nor a digit) flipped: for each of the 14 bits of a slot, the flips
# that change only that bit of the CRC (found once, below).
_TAG_BASE = b"@@@@"
_PAD = bytes(len(_TAG_BASE))


def _tag_basis() -> tuple[int, ...]:
    rows: dict[int, tuple[int, int]] = {}  # top bit of a CRC -> (that CRC, the flips that give it)
    for bit in range(8 * len(_TAG_BASE)):
        if bit % 8 >= 5:
            continue
        flips = 1 << bit
        crc = binascii.crc_hqx(flips.to_bytes(len(_TAG_BASE), "little"), 0) % SLOTS
        while crc and crc.bit_length() - 1 in rows:
            value, made = rows[crc.bit_length() - 1]
            crc, flips = crc ^ value, flips ^ made
        if crc:
            rows[crc.bit_length() - 1] = (crc, flips)
    assert len(rows) == 14, "the tag's bits reach every slot"
    basis = [0] * 14
    for top in range(14):  # back-substitute, lowest first: the flips for exactly 1 << top
        value, made = rows[top]
        for lower in range(top):
            if value >> lower & 1:
                made ^= basis[lower]
        basis[top] = made
    return tuple(basis)


_BASIS = _tag_basis()
_BASE_CRC = binascii.crc_hqx(_TAG_BASE, 0) % SLOTS


@functools.lru_cache(maxsize=SLOTS)
def slot_tag(slot: int) -> bytes:
    """Four characters (``@``..``_``: no brace, digit or NUL) whose CRC16 is *slot* (mod 16384)."""
    flips = 0
    want = slot ^ _BASE_CRC
    for bit in range(14):
        if want >> bit & 1:
            flips ^= _BASIS[bit]
    return bytes(a ^ b for a, b in zip(_TAG_BASE, flips.to_bytes(len(_TAG_BASE), "little"), strict=True))


def companion(key: bytes, kind: bytes, slot: int | None = None) -> bytes:
    """*key* followed by *kind* (NUL-led: no name holds it, so no two companions alias) and what puts the
    result in *slot* (default: *key*'s own). A key with a hash tag of its own keeps its slot whatever
    follows: it must be in *slot* already (ValueError: the prefixes' tags disagree)."""
    whole = slot_of(key)
    target = whole if slot is None else slot
    start = key.find(b"{")
    if start < 0:
        return key + kind + b"{" + slot_tag(target) + b"}"
    end = key.find(b"}", start + 1)
    if end > start + 1:  # a tag of its own
        if whole != target:
            raise ValueError(
                f"key {key!r} has a hash tag of its own, which puts it in another cluster slot than the other keys "
                "of its name: give key_prefix and fence_prefix the same hash tag, or none"
            )
        return key + kind
    if end < 0:  # an open brace: ours closes it, and the tag runs from it through the four characters
        head = key[start + 1 :] + kind
        return key + kind + slot_tag(target ^ binascii.crc_hqx(head + _PAD, 0) % SLOTS) + b"}"
    # '{}' first: the whole key is hashed, and so is the whole companion
    return key + kind + slot_tag(target ^ binascii.crc_hqx(key + kind + _PAD, 0) % SLOTS)


SEMAPHORE_INFIX = b"\x00semaphore\x00"
"""Between the key prefix and the name: a semaphore's keys never meet a lock's of the same name."""


class SemaphoreKeys(NamedTuple):
    """Semaphore *name*'s keys, all in the slot of its widest-limit key (whose name every version has
    used: a client of the layout before 2 reads it first, and refuses a value of this layout)."""

    channel: bytes
    """Where its releases and grants are told."""
    line: bytes
    """Its grant queue's line (a sorted set of waiting tokens)."""
    waits: bytes
    """Its line's entries (a hash: token -> entry)."""
    widest: bytes
    """Its widest-limit key: ``b"<widest limit> layout-2"`` while any permit may be held (a bare number:
    permits of the layout before may be held)."""
    base: bytes
    """What its slots' keys are made from (:meth:`slot_key`)."""
    slot: int
    """The cluster slot of every one of them."""

    def slot_key(self, j: int) -> bytes:
        """The key of permit slot *j* (a string holding the permit's token, ``PX ttl``)."""
        return companion(self.base, b"\x00slot\x00%d" % j, self.slot)

    def slot_keys(self, n: int) -> tuple[bytes, ...]:
        """The keys of slots 0..n-1 (made once per semaphore and count in use: a CRC16 each)."""
        return _slot_keys(self, n)


@functools.lru_cache(maxsize=256)
def _slot_keys(keys: SemaphoreKeys, n: int) -> tuple[bytes, ...]:
    return tuple(keys.slot_key(j) for j in range(n))


LAYOUT_MARK = b" layout-2"
"""What follows the widest limit in the value of a semaphore's widest-limit key (``b"3 layout-2"``): a client
of the layout before reads that value as a number, fails, and so never takes a slot of its own beside
ours; a bare number there is one of its values."""


def widest_limit(value: object) -> int | None:
    """The widest limit a semaphore's widest-limit key holds (0: none); None: a bare number or another value,
    written by a client of the layout before."""
    if value is None:
        return 0
    if isinstance(value, bytes) and value.endswith(LAYOUT_MARK) and value[: -len(LAYOUT_MARK)].isdigit():
        return int(value[: -len(LAYOUT_MARK)])
    return None


@functools.lru_cache(maxsize=1024)
def semaphore_keys(key_prefix: str, name: str | bytes) -> SemaphoreKeys:
    """Semaphore *name*'s keys (:class:`SemaphoreKeys`), after checking the name."""
    base = key_prefix.encode() + SEMAPHORE_INFIX + resource_key("", name)
    widest = base + b"\x00limit"
    slot = slot_of(widest)
    return SemaphoreKeys(
        companion(base, b"\x00words", slot),
        companion(base, b"\x00line", slot),
        companion(base, b"\x00entries", slot),
        widest,
        base,
        slot,
    )


RW_INFIX = b"\x00rw\x00"
"""Between the key prefix and the name: a read/write lock's keys never meet a lock's of the same name."""


def rw_writer_key(key_prefix: str, name: str | bytes) -> bytes:
    """Read/write lock *name*'s writer key (its channel too), after checking the name."""
    return key_prefix.encode() + RW_INFIX + resource_key("", name)


class RwKeys(NamedTuple):
    """A writer key's companions (:func:`rw_keys`)."""

    prefix: bytes
    """The reader keys' prefix of the layout before the readers' hash (a reader's key was this followed by the
    SHA1, hex, of its token): no script of this version names such a key; ``redlock break`` clears them."""
    readers: bytes
    """Its readers' hash: the SHA1 of a reader's token -> ``"<token> <expiry, node ms>"`` (the layout before:
    a set of those digests, its readers' index, under the same name)."""
    writers: bytes
    """Its waiting writers (a sorted set)."""
    line: bytes
    """Its grant queue's line."""
    waits: bytes
    """Its line's entries."""

    def reader(self, token: bytes) -> bytes:
        """The key of the reader holding *token*, in the layout before the readers' hash."""
        return self.prefix + hashlib.sha1(token).hexdigest().encode()


_RW_KINDS = (b"\x00r\x00", b"\x00readers", b"\x00writers", b"\x00queue", b"\x00waits")


@functools.lru_cache(maxsize=4096)
def rw_keys(writer_key: bytes, one_slot: bool = False) -> RwKeys:
    """A writer key's companions (:class:`RwKeys`): each the writer key followed by its kind, as every
    version before named them; *one_slot* (a Redlock with a cluster voter, :func:`one_slot_voters`): each
    ``<key_prefix>\\0rw{T}\\0<kind>\\0<name>`` (a reader's key: then ``\\0`` and its digest), whose hash
    tag ``{T}`` (:func:`slot_base`) is the writer key's cluster slot, whatever the name holds."""
    if not one_slot:
        return RwKeys(*(writer_key + kind for kind in _RW_KINDS))
    at = writer_key.rindex(RW_INFIX)  # (no name holds NUL: the last infix is the name's)
    name = writer_key[at + len(RW_INFIX) :]
    base = slot_base(writer_key[:at] + RW_INFIX[:-1], slot_of(writer_key), "key_prefix")
    prefix, *rest = (base + kind.rstrip(b"\x00") + b"\x00" + name for kind in _RW_KINDS)
    return RwKeys(prefix + b"\x00", *rest)


def reader_key(writer_key: bytes, token: bytes, one_slot: bool = False) -> bytes:
    """The key of the reader holding *token* in the layout before the readers' hash."""
    return rw_keys(writer_key, one_slot).reader(token)


# -- the layout of a Redlock whose voters include a cluster --------------------------------------
# A Redlock whose voters are all standalone names a fencing counter and a read/write lock's companions as
# every version before did (nothing to migrate). One with a redis+cluster:// voter (which no version before
# accepted, so no older client shares its nodes) puts them in one slot with the key they serve: after a
# prefix that carries that slot's hash tag, then NUL and the name, so that a name's braces never matter.

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
"""The URL schemes of a Redis/Valkey Cluster voter."""


def one_slot_voters(nodes: Iterable[object]) -> bool:
    """Whether a Redlock on *nodes* (URLs, or clients: not a cluster) keeps every key of a fencing counter
    and a read/write lock in one cluster slot: when any voter is a ``redis+cluster://`` or
    ``rediss+cluster://`` URL. Pure string work: nothing is parsed or checked here."""
    return any(isinstance(node, str) and node.split("://", 1)[0].lower() in CLUSTER_SCHEMES for node in nodes)


def slot_base(prefix: bytes, slot: int, setting: str) -> bytes:
    """*prefix* and what makes every key that starts with the result and goes on with NUL hash to *slot*:
    ``{T}`` (:func:`slot_tag`) after a prefix without braces, four characters and ``}`` after one with an
    open brace, nothing after one with a hash tag of its own (which must be *slot*'s: ValueError). A
    *prefix* whose first ``{`` is followed at once by ``}`` (a cluster hashes each such key whole) is
    refused: *setting* names the prefix to change."""
    start = prefix.find(b"{")
    if start >= 0 and prefix[start + 1 : start + 2] == b"}":
        raise ValueError(
            f"{setting} {prefix!r} has '{{}}' at its first brace, which makes a Redis Cluster hash each key whole: "
            "on redis+cluster:// voters, a fencing counter or a read/write lock's keys could not share the slot "
            f"of the key they serve. Put text between those braces (a hash tag, e.g. '{{app}}') or drop them"
        )
    return companion(prefix, b"", slot)


def fence_key(fence_prefix: str, name: Name, lock_key: bytes | None = None) -> bytes:
    """The fencing counter of *name*, after checking the name: ``<fence_prefix><name>`` as every version
    named it; with *lock_key* (the one-slot layout: a Redlock with a cluster voter)
    ``<fence_prefix>{T}\\0<name>``, in *lock_key*'s cluster slot (:func:`slot_base`), as is its fencer
    (the counter's key followed by ``\\0by``)."""
    key = resource_key(fence_prefix, name)
    if lock_key is None:
        return key
    raw = key[len(fence_prefix.encode()) :]
    return _fence_base(fence_prefix, slot_of(lock_key)) + b"\x00" + raw


@functools.lru_cache(maxsize=SLOTS)
def _fence_base(fence_prefix: str, slot: int) -> bytes:
    return slot_base(fence_prefix.encode(), slot, "fence_prefix")
