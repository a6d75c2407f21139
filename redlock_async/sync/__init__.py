"""The blocking API: ``from redlock_async.sync import Redlock``, for threads, Celery and Django workers, scripts.

A thin front over the async library, run on one background event loop thread per process::

    from redlock_async.sync import Redlock

    with Redlock(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"]) as redlock:
        with redlock.lock("orders:42", ttl=10.0) as lock:   # the watchdog extends it while the body runs
            process_order(42)                               # lock.check() between chunks; lock.lost is an Event

The errors are the async API's (re-exported here): ``LockNotAcquired`` when ``with lock:`` cannot
acquire (``NodesUnavailable``, a subclass, when too few nodes could vote rather than the lock being
held elsewhere), ``LockLost`` when the lease was lost while the body ran, ``ReleaseFailed`` when a
release could not run on enough nodes (the key stays until it expires).
"""

from redlock_async.errors import LockLost, LockNotAcquired, NodesUnavailable, RedlockError, ReleaseFailed
from redlock_async.sync._client import Election, Redlock
from redlock_async.sync._lock import Lock
from redlock_async.sync._reentrant import ReentrantLock
from redlock_async.sync._rw import ReadWriteLock, WriteLock

__all__ = [
    "Election",
    "Lock",
    "LockLost",
    "LockNotAcquired",
    "NodesUnavailable",
    "ReadWriteLock",
    "Redlock",
    "RedlockError",
    "ReentrantLock",
    "ReleaseFailed",
    "WriteLock",
]

for _cls in (Election, Lock, ReadWriteLock, Redlock, ReentrantLock, WriteLock):
    _cls.__module__ = __name__
del _cls
