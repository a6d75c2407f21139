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


def move(current: Phase, to: Phase) -> Phase:
    """*to*, when the move from *current* is legal; else IllegalMove."""
    if to not in MOVES[current]:
        raise IllegalMove(f"a lock cannot go from {current.value} to {to.value} (a bug in redlock_async)")
    return to
