"""The Lua scripts, one constant each, with the SHA1 that EVALSHA names them by.

Every script checks the token before it touches the key, so a client can
only ever delete or extend its own lease, never another holder's (the
restart quarantine's watch touches only the marker key, and only where none is).

The sources live by primitive (``_lock``: release and extension of one key;
``_fencing``; ``_many``: lock_many; ``_semaphore``; ``_queue``: the grant
queue; ``_queue_many``: its leave for lock_many; ``_permit_line``: its
semaphore lines; ``_rw``: the read/write lock; ``_rw_line``: its line in the grant
queue; ``_marker``: the restart quarantine's watch of a node), each with its
KEYS / ARGV / returns header. This module is the one place that makes them scripts: which of them can create (see
:attr:`Script.creates`), and which a node loads on every new connection.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from redlock_async._scripts import (
    _fencing,
    _lock,
    _many,
    _marker,
    _permit_line,
    _probe,
    _queue,
    _queue_many,
    _rw,
    _rw_line,
    _semaphore,
)
from redlock_async._scripts._fencing import FENCED_BY
from redlock_async._scripts._rw import OLD_READERS, READERS_HOLD, WRITER_HOLDS, WRITER_WAITS
from redlock_async._scripts._semaphore import OLD_LAYOUT, WIDER

__all__ = [
    "ACQUIRE_ALL",
    "ACQUIRE_ALL_FENCED",
    "ACQUIRE_FENCED",
    "ACQUIRE_PERMIT",
    "DROP_LINES",
    "EXTEND",
    "EXTEND_MANY",
    "FENCE",
    "FENCED_BY",
    "FENCED_SET",
    "FENCE_ALL",
    "HANDED_RELEASE",
    "KEEP_LIMIT",
    "NATIVE_PROBE",
    "OLD_LAYOUT",
    "OLD_READERS",
    "PERMISSIONS",
    "PERMIT_ENTER",
    "PERMIT_LEAVE",
    "PERMIT_STAY",
    "QUEUE_ENTER",
    "QUEUE_FENCE",
    "QUEUE_LEAVE",
    "QUEUE_LEAVE_ALL",
    "QUEUE_LEAVE_NATIVE",
    "QUEUE_STAY",
    "RAISE_COUNTER",
    "READERS_HOLD",
    "RELEASE",
    "RELEASE_ALL",
    "RW_DOWNGRADE",
    "RW_ENTER",
    "RW_LEAVE",
    "RW_QUEUE_DOWNGRADE",
    "RW_QUEUE_LEAVE",
    "RW_QUEUE_STAY",
    "RW_READ",
    "RW_READ_EXTEND",
    "RW_READ_RELEASE",
    "RW_WRITE",
    "SCRIPTS",
    "WATCH",
    "WATCH_SHARD",
    "WIDER",
    "WRITER_HOLDS",
    "WRITER_WAITS",
    "Script",
]


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua source and its SHA1 digest (what EVALSHA sends instead of the source)."""

    source: bytes
    creates: bool = False
    """It can give its own token something (a lock key, a place in a line). Sent again as EVAL
    after the server lost it, a script runs after the commands sent later; for such a script, one
    of those may be its own release or leave, which it would undo for a client that has gone (a
    key or an entry held for no one). So it is not sent again when a command on the wire names
    one of its keys, and fails instead (nothing ran). Every other script only takes away what is
    its token's (a release, a leave, an extension, which is sent again asking to take no free
    node): run late, it does no harm, and it is always sent again, since not running can (a leave
    that never ran leaves its waiter in line)."""
    sha: bytes = field(init=False)
    """Every script touches only keys named in its ``KEYS`` (so Dragonfly runs it under its default rules,
    and a cluster shard can: ``tests/test_declared_keys.py`` checks it on a real server)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source).hexdigest().encode())


# One key: release and extension.
RELEASE = Script(_lock.RELEASE)
HANDED_RELEASE = Script(_lock.HANDED_RELEASE)
EXTEND = Script(_lock.EXTEND)
EXTEND_MANY = Script(_lock.EXTEND_MANY)

# Fencing.
ACQUIRE_FENCED = Script(_fencing.ACQUIRE_FENCED, creates=True)
FENCE = Script(_fencing.FENCE)
FENCED_SET = Script(_fencing.FENCED_SET)
RAISE_COUNTER = Script(_fencing.RAISE_COUNTER)  # a node back from a restart, once: not loaded on every connection

# lock_many.
ACQUIRE_ALL = Script(_many.ACQUIRE_ALL, creates=True)
ACQUIRE_ALL_FENCED = Script(_many.ACQUIRE_ALL_FENCED, creates=True)
FENCE_ALL = Script(_many.FENCE_ALL)
RELEASE_ALL = Script(_many.RELEASE_ALL)

# Semaphores.
ACQUIRE_PERMIT = Script(_semaphore.ACQUIRE_PERMIT, creates=True)
KEEP_LIMIT = Script(_semaphore.KEEP_LIMIT)

# The grant queue.
QUEUE_ENTER = Script(_queue.QUEUE_ENTER, creates=True)
QUEUE_LEAVE = Script(_queue.QUEUE_LEAVE)
# Where the node may run DELIFEQ (Node.delifeq): loaded by its first use (EVAL after NOSCRIPT), not on every
# connection, since a server without DELIFEQ never runs it (nor the simulator, whose nodes have none).
QUEUE_LEAVE_NATIVE = Script(_queue.QUEUE_LEAVE_NATIVE)
QUEUE_STAY = Script(_queue.QUEUE_STAY, creates=True)
QUEUE_FENCE = Script(_queue.QUEUE_FENCE)
QUEUE_LEAVE_ALL = Script(_queue_many.QUEUE_LEAVE_ALL)
PERMIT_ENTER = Script(_permit_line.PERMIT_ENTER, creates=True)
PERMIT_LEAVE = Script(_permit_line.PERMIT_LEAVE)
PERMIT_STAY = Script(_permit_line.PERMIT_STAY, creates=True)
DROP_LINES = Script(_queue.DROP_LINES)  # redlock break's alone: not loaded on every connection

# The permissions probe of a connect (run once per node: not loaded on every connection).
PERMISSIONS = Script(_probe.PERMISSIONS)
NATIVE_PROBE = _probe.NATIVE  # the handshake's, sent as EVAL (once per connection)
# The restart quarantine's watch on a node found without marker: rare, so not loaded on every connection.
WATCH = Script(_marker.WATCH)
WATCH_SHARD = Script(_marker.WATCH_SHARD)  # a Cluster voter's shard (its marker names run id and replication id)

# The read/write lock (its writer extends, releases and is fenced with EXTEND, EXTEND_MANY, RELEASE, FENCE; its
# readers, entries of one hash, with RW_READ_EXTEND and RW_READ_RELEASE).
RW_READ = Script(_rw.RW_READ, creates=True)
RW_WRITE = Script(_rw.RW_WRITE, creates=True)
RW_LEAVE = Script(_rw.RW_LEAVE)
RW_READ_RELEASE = Script(_rw.RW_READ_RELEASE)
RW_READ_EXTEND = Script(_rw.RW_READ_EXTEND)
RW_DOWNGRADE = Script(_rw.RW_DOWNGRADE, creates=True)
RW_ENTER = Script(_rw_line.RW_ENTER, creates=True)
RW_QUEUE_LEAVE = Script(_rw_line.RW_QUEUE_LEAVE)
RW_QUEUE_STAY = Script(_rw_line.RW_QUEUE_STAY, creates=True)
RW_QUEUE_DOWNGRADE = Script(_rw_line.RW_QUEUE_DOWNGRADE, creates=True)

SCRIPTS = (
    QUEUE_ENTER,
    QUEUE_LEAVE,
    QUEUE_STAY,
    QUEUE_FENCE,
    QUEUE_LEAVE_ALL,
    PERMIT_ENTER,
    PERMIT_LEAVE,
    PERMIT_STAY,
    HANDED_RELEASE,
    RELEASE,
    EXTEND,
    EXTEND_MANY,
    ACQUIRE_FENCED,
    FENCE,
    ACQUIRE_ALL,
    ACQUIRE_ALL_FENCED,
    FENCE_ALL,
    RELEASE_ALL,
    ACQUIRE_PERMIT,
    KEEP_LIMIT,
    RW_READ,
    RW_WRITE,
    RW_LEAVE,
    RW_READ_RELEASE,
    RW_READ_EXTEND,
    RW_DOWNGRADE,
    RW_ENTER,
    RW_QUEUE_LEAVE,
    RW_QUEUE_STAY,
    RW_QUEUE_DOWNGRADE,
)
"""The scripts a node loads on every new connection (FENCED_SET runs on the protected resource)."""
