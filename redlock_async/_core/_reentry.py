"""Reentrant locks (``redlock.lock(name, reentrant=True)``): who holds which name, per task, how deep.

A reentrant lock that a task holds is recorded here by (key, task) when it is granted. When the same
task asks again for that name through a reentrant lock of the same Redlock (the same ``Lock`` entered
again, or another one of the name), it joins that hold at once: nothing is sent, the depth grows, and
it shows the holder's lease (``held``, ``validity``, tokens). Leaving a join takes the depth down; the
key is released when the hold itself is (the outermost exit of nested ``async with`` blocks). A join
never outlives the hold it joined: the holder's release while joins are open is refused.

Only the task that was granted it joins. Another task, a child task too (``create_task``, a task
group), waits as for any lock: it runs at the same time as its parent, so letting it in would put two
flows of control under one mutual exclusion, and the parent's exit would release the key under the
child's feet. A task identity is what an asyncio program has for "the same caller" (a thread's is
not: many tasks share one thread).
"""

from __future__ import annotations

import asyncio
from typing import Any


class Hold:
    """One task's hold of one name through a reentrant lock, and how many joins are open on it."""

    __slots__ = ("depth", "lock")

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        """The ``Lock`` whose lease this is (the one that was granted)."""
        self.depth = 0
        """Joins open on it now (the same task asking again); the key is released only at 0."""


class Reentries:
    """The reentrant holds of one Redlock, by (key, task)."""

    __slots__ = ("_holds",)

    def __init__(self) -> None:
        self._holds: dict[tuple[bytes, asyncio.Task[Any]], Hold] = {}

    def find(self, key: bytes, task: asyncio.Task[Any] | None) -> Hold | None:
        """The hold *task* has of *key*, if any."""
        return None if task is None else self._holds.get((key, task))

    def granted(self, key: bytes, task: asyncio.Task[Any] | None, lock: Any) -> None:
        """*lock* (reentrant) was granted *key* in *task*: later asks of that task join it."""
        if task is not None:
            self._holds[(key, task)] = Hold(lock)

    def ended(self, key: bytes, lock: Any) -> None:
        """The hold of *lock* ended (released or lost): no one joins it any more."""
        for where, hold in list(self._holds.items()):
            if where[0] == key and hold.lock is lock:
                del self._holds[where]
