"""Faults of the lock itself, for testing code that must survive them."""

from __future__ import annotations

from redlock_async.lock import Lock, keeper_of


def lose(lock: Lock, why: str = "lost (redlock_async.testing.lose)") -> None:
    """Declare *lock* lost now, as the watchdog does when its lease cannot be kept.

    Inside ``async with lock:`` the body is cancelled and the block raises ``LockLost``
    (or ``on_lost`` is told, and the body runs on); the lock's keys are released and a
    ``lost`` event is emitted. Call it from the event loop (a callback or another task):
    for testing how your code handles a lost lock at a moment you choose.
    """
    if not lock.held:
        raise RuntimeError(f"lose() of lock {lock.name!r}, which is not held")
    keeper_of(lock).lose_watched(f"lock {lock.name!r} {why}")
