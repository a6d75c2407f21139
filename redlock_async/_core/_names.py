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

import hashlib
import os
import socket

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


SEMAPHORE_INFIX = b"\x00semaphore\x00"
"""Between the key prefix and the name: a semaphore's keys never meet a lock's of the same name."""


def semaphore_keys(key_prefix: str, name: str | bytes) -> tuple[bytes, bytes, bytes]:
    """Semaphore *name*'s keys: its base (the permits' channel), its slots' prefix (slot i is this
    followed by i) and its widest-limit key."""
    base = key_prefix.encode() + SEMAPHORE_INFIX + resource_key("", name)
    return base, base + b"\x00", base + b"\x00limit"


RW_INFIX = b"\x00rw\x00"
"""Between the key prefix and the name: a read/write lock's keys never meet a lock's of the same name."""


def rw_writer_key(key_prefix: str, name: str | bytes) -> bytes:
    """Read/write lock *name*'s writer key (its channel too), after checking the name."""
    return key_prefix.encode() + RW_INFIX + resource_key("", name)


def rw_keys(writer_key: bytes) -> tuple[bytes, bytes, bytes]:
    """A writer key's companions: its reader keys' prefix (a reader's key is this followed by the SHA1,
    hex, of its token), its readers' index and its waiting writers."""
    return writer_key + b"\x00r\x00", writer_key + b"\x00readers", writer_key + b"\x00writers"


def reader_key(writer_key: bytes, token: bytes) -> bytes:
    """The key of the reader holding *token* (what the scripts name ``prefix .. redis.sha1hex(token)``)."""
    return rw_keys(writer_key)[0] + hashlib.sha1(token).hexdigest().encode()
