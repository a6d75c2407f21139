"""The exceptions redlock_async raises on purpose.

::

    RedlockError             root of every deliberate failure
     ├── LockNotAcquired     no majority within the acquire timeout
     │    └── NodesUnavailable   ... because too few nodes could vote at all, never contention
     ├── LockLost            the lease ran out or could not be extended
     ├── ReleaseFailed       a release could not run on enough nodes: the key stays until it expires
     └── NestedAcquire       the task already holds what it asks for (also a RuntimeError)

Misuse (releasing a lock that was never acquired, acquiring one twice)
raises ``RuntimeError``; bad settings raise ``ValueError`` when the
``Redlock`` or ``Lock`` is made. Errors of the Redis client never leave the
library: a node that fails is a failed vote, told in :attr:`RedlockError.outcomes`.

Every error survives ``pickle`` and ``copy`` with its message and attributes (a process pool, Celery's
pickle serializer and ``multiprocessing`` send exceptions to another process): it is rebuilt without
calling ``__init__`` (whose keywords a plain exception's pickling would not pass), its attributes set
back as they were, a subclass's own ones too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redlock_async._core import Vote, renamed

__all__ = [
    "LockLost",
    "LockNotAcquired",
    "NestedAcquire",
    "NodeOutcome",
    "NodesUnavailable",
    "RedlockError",
    "ReleaseFailed",
]


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """What one node said in one attempt."""

    node: str
    """The node's address, without any password."""
    vote: Vote
    detail: str = ""
    """The error or refusal in words, empty for a plain yes."""

    def __str__(self) -> str:
        return f"{self.node}: {self.vote.value}" + (f" ({self.detail})" if self.detail else "")


class RedlockError(Exception):
    """Root of every deliberate failure; carries the lock's name and the per-node outcomes.

    Every one survives ``pickle`` and ``copy`` with its message and attributes: a process pool, Celery or
    ``multiprocessing`` hands the caller the error the worker raised.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        outcomes: Sequence[NodeOutcome] = (),
        resource: str | None = None,
    ) -> None:
        super().__init__(message)
        if resource is not None:
            renamed(f"{type(self).__name__}(resource=)", "name=")
            name = resource if name is None else name
        if name is None:
            raise TypeError(f"{type(self).__name__}() needs name=: the name of the lock it is about")
        self.name: str = name
        """The lock's name, as text (``lock_many``: its names joined by ``+``; bytes: their repr)."""
        self.outcomes: tuple[NodeOutcome, ...] = tuple(outcomes)

    @property
    def resource(self) -> str:
        """Deprecated spelling of :attr:`name`."""
        renamed(f"{type(self).__name__}.resource", ".name")
        return self.name

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's own reduce rebuilds as cls(*args), which drops the keyword-only name= and
        # outcomes= (a TypeError on unpickling, in the process that wanted the error). Rebuild through
        # __new__ instead (args as they were), then set the attributes back (BaseException.__setstate__).
        return (_rebuilt, (type(self), self.args), self.__dict__)

    def __str__(self) -> str:
        text = str(self.args[0]) if self.args else ""
        if self.outcomes:
            text += "; votes: " + ", ".join(str(o) for o in self.outcomes)
        return text


class LockNotAcquired(RedlockError):
    """Raised by ``async with lock`` when no majority granted the lock within the acquire timeout.

    ``outcomes`` are the votes of the last attempt.
    """


class NodesUnavailable(LockNotAcquired):
    """Raised by ``async with lock`` when the lock was not acquired because too few nodes could vote.

    The nodes that could not (errors, timeouts, refused connections or AUTH, nodes in restart
    quarantine) were so many in the last attempt that no majority could have granted the lock
    even had no one held it anywhere. Never raised for contention: when a majority could answer
    and the lock was held, it is a plain :class:`LockNotAcquired`. Mixed outcomes (some nodes
    found the lock held, too many others could not answer) are this error: the holder leaving
    would not have let the lock be had, so retry when the nodes are back (an HTTP 503), not
    when the holder is gone (a 409).

    A subclass of :class:`LockNotAcquired`: handlers of that catch this too.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        outcomes: Sequence[NodeOutcome] = (),
        retry_after: float | None = None,
        resource: str | None = None,
    ) -> None:
        super().__init__(message, name=name, outcomes=outcomes, resource=resource)
        self.retry_after = retry_after
        """Seconds until enough nodes leave restart quarantine for a majority to vote again, when
        quarantine is all that stood in the way; None when nodes could not be reached (no one
        can say when they come back)."""


class LockLost(RedlockError):
    """Raised when a held lock can no longer be trusted.

    From ``extend()`` when no majority extended the lease before its validity
    ran out, and from ``async with lock`` when the lease was lost while the
    body ran.
    """


class ReleaseFailed(RedlockError):
    """Raised by ``release()``, and by leaving ``async with`` when the body itself succeeded, when the
    release could not run on so many of the nodes that held the lease (they answered an error: an
    ACL user without the right to run the release, a node down, a replica) that a majority may still
    keep its key: no one can take the lock until the key expires there (at most a ttl later).

    ``outcomes`` are the release's per-node votes (the reasons in ``detail``); a node that said "no"
    (the key was not ours any more: expired, or never set there) is no failure, nor one that did not
    answer within the node timeout (the release may have run). The lock is released all the same as
    far as this client goes: it is no longer held, and a later ``acquire()`` starts anew. When the
    body of ``async with`` raised, its exception is what leaves the block, with this one's words
    added as a note (and logged). The ``released`` event carries the words in ``reason`` either way.
    """


class NestedAcquire(RedlockError, RuntimeError):
    """Raised at once, before any node is asked, when a task asks for what it already holds in an
    enclosing ``async with`` of the same Redlock: the same name (another Lock of it, or the same
    Lock), a ``lock_many`` that contains such a name, a ``campaign()`` of an election it leads, or a
    permit of a semaphore of which it holds every permit. Waiting would wait for itself.

    A misuse, not contention: it is a ``RuntimeError`` and not a ``LockNotAcquired``, so handlers
    that answer "busy, try again" do not catch it; retrying can never succeed. Another task (a
    child task of the holder too) waits as any other. ``outcomes`` is empty: no node was asked.
    In the blocking API (``redlock_async.sync``) the holder is the thread: a thread asking for what
    it holds through ``with`` or ``acquire()`` gets it; another thread waits.
    """


def _rebuilt(cls: type[RedlockError], args: tuple[object, ...]) -> RedlockError:
    """*cls* with *args*, made without its ``__init__`` (unpickling and ``copy``: the attributes follow)."""
    return cls.__new__(cls, *args)
