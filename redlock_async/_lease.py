"""The life of one lock: its phases and the only moves between them.

Every change of a ``Lock``'s phase goes through :func:`move`, which refuses a move
not in :data:`MOVES`; a refused move is a bug in the library, never a user's
error (those are checked, with their own messages, before any move).

    IDLE ──acquire──▶ ACQUIRING ──majority, valid──▶ HELD ──release──▶ IDLE
      ▲                  │                            │
      └──no majority─────┘                            └──lost──▶ LOST ──acquire──▶ ACQUIRING
       (or cancelled)

HELD goes back to IDLE by ``release()``, or by the exit of ``async with`` that
confirmed an overrun lease on a majority; it goes to LOST when the lease cannot
be kept (an extension refused or expired, the watchdog's verdict, the Redlock
closed under it). LOST stays until the next acquire: ``extend()`` raises its
``LockLost`` again, ``release()`` does nothing.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from redlock_async._algorithm import PENDING, YES, Vote


class Phase(enum.Enum):
    IDLE = "idle"
    """Never acquired, released, or an acquire that failed."""
    ACQUIRING = "acquiring"
    """An acquire is under way (one at a time per Lock)."""
    HELD = "held"
    """Granted by a majority; validity may still run out (``Lock.held`` checks the clock)."""
    LOST = "lost"
    """The lease could not be kept; sticky until the next acquire."""


MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.IDLE: frozenset({Phase.ACQUIRING}),
    Phase.ACQUIRING: frozenset({Phase.HELD, Phase.IDLE}),
    Phase.HELD: frozenset({Phase.IDLE, Phase.LOST}),
    Phase.LOST: frozenset({Phase.ACQUIRING}),
}
"""The legal moves, from each phase."""


class IllegalMove(RuntimeError):
    """A phase change not in MOVES: a bug in redlock_async."""


# Each phase carries its legal targets as a tuple: a move is then checked without hashing an Enum
# (Enum.__hash__ is Python code, and a lock makes three moves per acquire and release).
for _phase, _targets in MOVES.items():
    _phase.targets = tuple(_targets)  # type: ignore[attr-defined]
del _phase, _targets


def move(current: Phase, to: Phase) -> Phase:
    """*to*, when the move from *current* is legal; else IllegalMove."""
    if to not in current.targets:  # type: ignore[attr-defined]
        raise IllegalMove(f"a lock cannot go from {current.value} to {to.value} (a bug in redlock_async)")
    return to


_serials = itertools.count(1)

Late: TypeAlias = "tuple[Sequence[Vote], Sequence[Any], Callable[[Any], Vote]]"
"""A decided request's votes at the decision, its replies as they come (a ``Ballot``'s ``replies``,
which late ones still fill) and how a reply votes."""


class Lease:
    """One acquisition's lease: its token on the nodes, how long it can be trusted, who holds it.

    A Lock gets a new Lease at each grant (and an empty one, without a token, when made).
    The watchdog keeps Leases, not Locks: it reads ``keys``, ``token``, ``ttl_ms``, ``expires``,
    what the next extension takes (``holders``, ``regain``, ``late``) and the fence fields, and calls
    the two hooks the lock set when it began to watch (``due`` at a round's start, ``result`` with
    the round's votes). A round that answers for a lease the lock has since replaced finds it
    superseded, and changes nothing.
    """

    __slots__ = (
        "acquired_at",
        "due",
        "expires",
        "extensions",
        "fence_keys",
        "fence_ttl_ms",
        "fencing_token",
        "fencing_tokens",
        "holders",
        "keeps",
        "keys",
        "late",
        "regain",
        "result",
        "serial",
        "skip",
        "token",
        "ttl_ms",
    )

    def __init__(
        self,
        keys: tuple[bytes, ...],
        token: bytes | None = None,
        *,
        ttl_ms: int = 0,
        acquired_at: float = 0.0,
        expires: float = 0.0,
        holders: list[int] | None = None,
        skip: list[int] | None = None,
        fencing_token: int | None = None,
        fencing_tokens: tuple[int, ...] | None = None,
        keeps: bytes | None = None,
        fence_keys: tuple[bytes, ...] = (),
        fence_ttl_ms: int | None = None,
        regain: list[int] | None = None,
        late: Late | None = None,
    ) -> None:
        self.serial = next(_serials)
        """This acquisition's number, unique in the process: events name their grant by it."""
        self.keys = keys
        """The keys this acquisition holds on the nodes, all with its token: one for a lock, several for
        ``lock_many`` (all or none), the permit's slot for a semaphore."""
        self.token = token
        """The acquisition's random value on the nodes; None once released (or before any grant)."""
        self.ttl_ms = ttl_ms
        self.acquired_at = acquired_at
        """When the first SET went out (monotonic): validity counts from here."""
        self.expires = expires
        """Monotonic time at which validity runs out."""
        self.holders: list[int] = holders if holders is not None else []
        """Nodes that said yes to the grant or the last extension."""
        self.skip: list[int] = skip if skip is not None else []
        """Nodes the SET never went to: nothing there to release."""
        self.extensions = 0
        self.fencing_token = fencing_token
        self.fencing_tokens = fencing_tokens
        """Per key, in the order of ``keys`` (fenced locks); ``fencing_token`` is the first."""
        self.keeps = keeps
        """A key every extension keeps alive a lease longer than this lease's (a permit's: its
        semaphore's widest-limit key, which must exist while any permit may be held); None for most."""
        self.fence_keys = fence_keys
        """Per key, its fencing counter (fenced locks; else empty): an extension that takes a node
        raises them there to ``fencing_tokens`` (with ``fence_ttl_ms``, the counters' ttl)."""
        self.fence_ttl_ms = fence_ttl_ms
        self.regain: list[int] = regain if regain is not None else []
        """Nodes that answered the last watchdog round without a yes (``_algorithm.to_regain``, and late
        noes as they come): the next extension takes them where the key is free, but for the holders
        (:meth:`to_take`)."""
        self.late = late
        """The grant's (or the last explicit extension's) votes and replies, read only by the next
        extension (:meth:`to_take`): nothing is worked out for them on the acquire's path."""
        self.due: Callable[[Lease, float], bool] = _never_due
        """The watchdog asks at a round's start: True to extend now (the lock handles every other case)."""
        self.result: Callable[[Lease, float, float, Sequence[Vote], Sequence[str] | None], None] = _ignore
        """The watchdog's round for this lease was decided: (lease, started, decided_at, votes, details)."""

    def to_take(self) -> list[int]:
        """The nodes the next extension takes where the keys are free: :attr:`regain`, and the nodes of
        :attr:`late` that answered without a yes (``_algorithm.to_regain``) or, pending at its
        decision, whose reply came since without one; never a holder (a key missing there was lost,
        not freed: taking it would hide that)."""
        regain = self.regain
        if self.late is not None:
            votes, replies, vote_of = self.late
            regain = regain + [
                i
                for i, vote in enumerate(votes)
                if vote is not YES and (vote is not PENDING or vote_of(replies[i]) not in (YES, PENDING))
            ]
        holders = self.holders
        return [i for i in regain if i not in holders]


def _never_due(lease: Lease, now: float) -> bool:
    return False


def _ignore(
    lease: Lease, started: float, decided_at: float, votes: Sequence[Vote], details: Sequence[str] | None
) -> None:
    return None
