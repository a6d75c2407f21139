"""What happens to locks, for logs, metrics and traces.

Every acquire, extension, release and loss is one :class:`LockEvent`. Give
``Redlock(..., on_event=callback)`` to receive them (for counters and
histograms: acquire latency, attempts, per-node votes, how late extensions
ran, hold times, losses); the same events are logged by the
``redlock_async.lock`` logger with their fields under the ``redlock``
attribute of the log record (quiet by default: DEBUG, and WARNING for a
lost lock). A callback runs on the event loop, inside the library's own
bookkeeping: keep it short and never block; what it raises is logged and
dropped.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from redlock_async.errors import NodeOutcome

__all__ = ["EventKind", "LockEvent", "OnEvent"]


class EventKind(enum.Enum):
    ACQUIRED = "acquired"
    """A majority granted the lock."""
    NOT_ACQUIRED = "not_acquired"
    """An acquire gave up: its timeout ran out, or ``blocking=False`` failed once."""
    EXTENDED = "extended"
    """A majority extended the lease (``extend()`` or the watchdog)."""
    RELEASED = "released"
    """The holder released the lock."""
    LOST = "lost"
    """The lease could not be kept: expired, taken, or not extended in time."""


@dataclass(frozen=True, slots=True)
class LockEvent:
    """One thing that happened to one lock. Durations are seconds; None where they do not apply."""

    kind: EventKind
    resource: str
    outcomes: tuple[NodeOutcome, ...] = ()
    """Per-node votes of the request that decided it (the last attempt, for an acquire)."""
    duration: float | None = None
    """Acquire: from the call to the grant or the give-up (latency). Extend and release: the round trip."""
    attempts: int | None = None
    """Acquire: rounds of SET sent to the nodes."""
    held_for: float | None = None
    """Released and lost: since the grant."""
    late_by: float | None = None
    """Extended: how long after it was due the extension was sent (watchdog; 0 when on time)."""
    margin: float | None = None
    """Extended: validity the old lease still had when the new one was confirmed."""
    validity: float | None = None
    """Acquired and extended: seconds the lease can now be trusted."""
    fencing_token: int | None = None
    reason: str = ""
    """Lost and not acquired: why, in words."""
    watchdog: bool = False
    """Extended or lost inside ``async with`` by the watchdog, rather than by an explicit call."""

    def fields(self) -> dict[str, Any]:
        """Plain values (str, float, int, dict) for structured logs and exporters."""
        fields: dict[str, Any] = {"event": self.kind.value, "resource": self.resource}
        for name in ("duration", "attempts", "held_for", "late_by", "margin", "validity", "fencing_token"):
            value = getattr(self, name)
            if value is not None:
                fields[name] = value
        if self.reason:
            fields["reason"] = self.reason
        if self.watchdog:
            fields["watchdog"] = True
        if self.outcomes:
            fields["votes"] = {o.node: o.vote.value for o in self.outcomes}
        return fields

    def __str__(self) -> str:
        parts = [f"redlock {self.resource!r} {self.kind.value}"]
        parts += [f"{key}={value:.6f}" for key, value in self.fields().items() if isinstance(value, float)]
        if self.attempts is not None:
            parts.append(f"attempts={self.attempts}")
        if self.reason:
            parts.append(f"({self.reason})")
        if self.outcomes:
            parts.append("votes: " + ", ".join(f"{o.node}={o.vote.value}" for o in self.outcomes))
        return " ".join(parts)


OnEvent: TypeAlias = Callable[[LockEvent], object]
