"""The exceptions redlock_async raises on purpose.

::

    RedlockError             root of every deliberate failure
     ├── LockNotAcquired     no majority within the acquire timeout
     └── LockLost            the lease ran out or could not be extended

Misuse (releasing a lock that was never acquired, acquiring one twice)
raises ``RuntimeError``; bad settings raise ``ValueError`` when the
``Redlock`` or ``Lock`` is made. Errors of the Redis client never leave the
library: a node that fails is a failed vote, told in :attr:`RedlockError.outcomes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redlock_async._algorithm import Vote

__all__ = ["LockLost", "LockNotAcquired", "NodeOutcome", "RedlockError"]


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
    """Root of every deliberate failure; carries the resource and the per-node outcomes."""

    def __init__(self, message: str, *, resource: str, outcomes: Sequence[NodeOutcome] = ()) -> None:
        super().__init__(message)
        self.resource = resource
        self.outcomes: tuple[NodeOutcome, ...] = tuple(outcomes)

    def __str__(self) -> str:
        text = str(self.args[0]) if self.args else ""
        if self.outcomes:
            text += "; votes: " + ", ".join(str(o) for o in self.outcomes)
        return text


class LockNotAcquired(RedlockError):
    """Raised by ``async with lock`` when no majority granted the lock within the acquire timeout.

    ``outcomes`` are the votes of the last attempt.
    """


class LockLost(RedlockError):
    """Raised when a held lock can no longer be trusted.

    From ``extend()`` when no majority extended the lease before its validity
    ran out, and from ``async with lock`` when the lease was lost while the
    body ran.
    """
