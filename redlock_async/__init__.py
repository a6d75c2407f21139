"""Asyncio distributed locks on the Redlock algorithm over N independent Redis masters."""

from redlock_async.client import Redlock
from redlock_async.errors import LockLost, LockNotAcquired, NodeOutcome, RedlockError
from redlock_async.fencing import StaleFencingToken, fenced_set
from redlock_async.lock import Lock

__all__ = [
    "Lock",
    "LockLost",
    "LockNotAcquired",
    "NodeOutcome",
    "Redlock",
    "RedlockError",
    "StaleFencingToken",
    "fenced_set",
]

# Public classes show as redlock_async.X in tracebacks and reprs.
for _cls in (Lock, LockLost, LockNotAcquired, NodeOutcome, Redlock, RedlockError, StaleFencingToken):
    _cls.__module__ = __name__
del _cls
