"""Asyncio distributed locks on the Redlock algorithm over N independent Redis masters."""

from redlock_async._core import Settings, Vote
from redlock_async.client import Redlock
from redlock_async.election import Election
from redlock_async.errors import (
    LockLost,
    LockNotAcquired,
    NestedAcquire,
    NodeOutcome,
    NodesUnavailable,
    RedlockError,
    ReleaseFailed,
)
from redlock_async.events import EventKind, LockEvent
from redlock_async.fencing import StaleFencingToken, fenced_set
from redlock_async.inspection import LockInfo, LockState, NodeInfo, NodeState
from redlock_async.lock import Lock
from redlock_async.reentrant import ReentrantLock
from redlock_async.rwlock import ReadWriteLock
from redlock_async.semaphore import Semaphore
from redlock_async.statistics import LockPhase, LockStatistics, NodeStatistics, RedlockStatistics

__version__ = "0.2.0"
"""This release (see CHANGELOG.md); before 1.0, a minor version may change behaviour."""

__all__ = [
    "Election",
    "EventKind",
    "Lock",
    "LockEvent",
    "LockInfo",
    "LockLost",
    "LockNotAcquired",
    "LockPhase",
    "LockState",
    "LockStatistics",
    "NestedAcquire",
    "NodeInfo",
    "NodeOutcome",
    "NodeState",
    "NodeStatistics",
    "NodesUnavailable",
    "ReadWriteLock",
    "Redlock",
    "RedlockError",
    "RedlockStatistics",
    "ReentrantLock",
    "ReleaseFailed",
    "Semaphore",
    "Settings",
    "StaleFencingToken",
    "Vote",
    "fenced_set",
]

# Public classes show as redlock_async.X in tracebacks and reprs.
for _cls in (
    Election,
    EventKind,
    Lock,
    LockEvent,
    LockInfo,
    LockLost,
    LockNotAcquired,
    LockStatistics,
    NestedAcquire,
    NodeInfo,
    NodeOutcome,
    NodeStatistics,
    NodesUnavailable,
    ReadWriteLock,
    Redlock,
    RedlockError,
    RedlockStatistics,
    ReentrantLock,
    ReleaseFailed,
    Semaphore,
    Settings,
    StaleFencingToken,
    Vote,
):
    _cls.__module__ = __name__
del _cls
