"""What happens to locks, for logs, metrics and traces.

Every acquire, extension, release and loss is one :class:`LockEvent`. Give
``Redlock(..., on_event=callback)`` to receive them (for counters and
histograms: acquire latency, attempts, per-node votes, how late extensions
ran, hold times, losses); the same events are logged by the
``redlock_async.lock`` logger with their fields under the ``redlock``
attribute of the log record (quiet by default: DEBUG, and WARNING for a
lost lock). A callback runs on the event loop, inside the library's own
bookkeeping: keep it short and never block; what it raises is logged and
dropped. Several callbacks (logs, metrics, your own) can listen at once: pass a
sequence of them (see :func:`combine`). Ready-made metrics and traces are in
:mod:`redlock_async.metrics`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias, final

from redlock_async._core import Vote, renamed
from redlock_async.errors import NodeOutcome

__all__ = ["EventKind", "LockEvent", "OnEvent", "as_hook", "combine"]

log = logging.getLogger("redlock_async.lock")


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
    CLOCK = "clock"
    """A node's clock jumped or races (the clock guard, ``clock_guard=True``): not about one lock, so
    :attr:`LockEvent.name` is empty and :attr:`LockEvent.nodes` names the node; ``clock_fault``
    says what it did (``ahead``: it sits out every quorum for the longest ttl plus drift; ``behind``,
    ``frozen``: reported only), ``clock_jump`` by how much (seconds), ``reason`` in words."""
    EVICTED = "evicted"
    """A node evicted keys (its ``maxmemory-policy`` can: ``evicted_keys`` grew, or was above 0 when first
    met): it sits out every quorum a quarantine period, as a restarted node, and every lock that counted it
    drops it. Not about one lock: :attr:`LockEvent.name` is empty, :attr:`LockEvent.nodes` names the node,
    ``reason`` says how many and under which policy."""


_FIELDS = (
    "duration",
    "attempts",
    "held_for",
    "late_by",
    "margin",
    "validity",
    "fencing_token",
    "reason",
    "watchdog",
    "grant",
    "handoff",
    "quarantined",
    "clock_fault",
    "clock_jump",
)


@final
class LockEvent:
    """One thing that happened to one lock. Durations are seconds; None where they do not apply.

    Read-only by convention (made at every acquire and release while someone listens, so it is
    a plain slotted object, cheap to make): the per-node :attr:`outcomes` are built on first
    read; :attr:`nodes` and :attr:`votes` give the same votes without building them.
    """

    __slots__ = (
        "_details",
        "_outcomes",
        "attempts",
        "clock_fault",
        "clock_jump",
        "duration",
        "fencing_token",
        "grant",
        "handoff",
        "held_for",
        "kind",
        "late_by",
        "margin",
        "name",
        "nodes",
        "quarantined",
        "reason",
        "validity",
        "votes",
        "watchdog",
    )

    def __init__(
        self,
        kind: EventKind,
        name: str | None = None,
        outcomes: Sequence[NodeOutcome] = (),
        duration: float | None = None,
        attempts: int | None = None,
        held_for: float | None = None,
        late_by: float | None = None,
        margin: float | None = None,
        validity: float | None = None,
        fencing_token: int | None = None,
        reason: str = "",
        watchdog: bool = False,
        grant: int | None = None,
        handoff: float | None = None,
        quarantined: tuple[str, ...] = (),
        *,
        clock_fault: str = "",
        clock_jump: float | None = None,
        nodes: tuple[str, ...] = (),
        votes: tuple[Vote, ...] = (),
        details: Sequence[str] | None = None,
        resource: str | None = None,
    ) -> None:
        if resource is not None:
            renamed("LockEvent(resource=)", "name=")
            name = resource if name is None else name
        if name is None:
            raise TypeError("LockEvent() needs a name: the lock's name (empty for a clock event)")
        self.kind = kind
        self.name: str = name
        """The lock's name, as text (``lock_many``: its names joined by ``+``; bytes: their repr); empty
        for a clock event."""
        self.duration = duration
        """Acquire: from the call to the grant or the give-up (latency). Extend and release: the round trip."""
        self.attempts = attempts
        """Acquire: rounds of SET sent to the nodes."""
        self.held_for = held_for
        """Released and lost: since the grant."""
        self.late_by = late_by
        """Extended: how long after it was due the extension was sent (watchdog; 0 when on time)."""
        self.margin = margin
        """Extended: validity the old lease still had when the new one was confirmed."""
        self.validity = validity
        """Acquired and extended: seconds the lease can now be trusted."""
        self.fencing_token = fencing_token
        self.reason = reason
        """Lost and not acquired: why, in words. Released: empty, or why the release failed (the
        :class:`~redlock_async.ReleaseFailed` raised: too many nodes answered errors)."""
        self.watchdog = watchdog
        """Extended or lost inside ``async with`` by the watchdog, rather than by an explicit call."""
        self.grant = grant
        """Acquired, extended, released and lost: a number naming the grant (one acquisition), the same on
        each of its events and unique in the process (tells apart two holders of one name, a semaphore's)."""
        self.handoff = handoff
        """Acquired: seconds from the moment a release woke this waiter to its grant; None when the acquire
        was not woken by a release (it got the lock at once, on its fallback timer, or with ``queue=True``)."""
        self.quarantined = quarantined
        """The Redlock's nodes (``host:port``) in restart quarantine when the event was made."""
        self.clock_fault = clock_fault
        """Clock: ``ahead``, ``behind`` or ``frozen`` (:class:`EventKind` ``CLOCK``); empty otherwise."""
        self.clock_jump = clock_jump
        """Clock: how far the node's clock left the real time, at least (seconds; negative behind)."""
        if outcomes:
            self._outcomes: tuple[NodeOutcome, ...] | None = tuple(outcomes)
            nodes = tuple(o.node for o in outcomes)
            votes = tuple(o.vote for o in outcomes)
        else:
            self._outcomes = None if votes else ()
        self.nodes = nodes
        """The nodes (``host:port``) in the order of :attr:`votes`."""
        self.votes = votes
        """Per-node votes of the request that decided it (the last attempt, for an acquire): ``nodes[i]``
        voted ``votes[i]``. The same as :attr:`outcomes`, without their details, and nothing built."""
        self._details = details

    @property
    def resource(self) -> str:
        """Deprecated spelling of :attr:`name`."""
        renamed("LockEvent.resource", ".name")
        return self.name

    @property
    def outcomes(self) -> tuple[NodeOutcome, ...]:
        """Per-node votes of the request that decided it (the last attempt, for an acquire), with details."""
        if self._outcomes is None:
            words = self._details or [""] * len(self.votes)
            self._outcomes = tuple(
                NodeOutcome(node, vote, detail)
                for node, vote, detail in zip(self.nodes, self.votes, words, strict=True)
            )
        return self._outcomes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LockEvent):
            return NotImplemented
        return (
            self.kind is other.kind
            and self.name == other.name
            and self.outcomes == other.outcomes
            and all(getattr(self, name) == getattr(other, name) for name in _FIELDS)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = [f"{self.kind!r}", f"{self.name!r}"]
        shown += [
            f"{name}={getattr(self, name)!r}" for name in _FIELDS if getattr(self, name) not in (None, "", False, ())
        ]
        if self.votes:
            shown.append(f"outcomes={self.outcomes!r}")
        return f"LockEvent({', '.join(shown)})"

    def fields(self) -> dict[str, Any]:
        """Plain values (str, float, int, dict) for structured logs and exporters.

        The lock's name is under ``"name"``, and for this release under ``"resource"`` too (deprecated:
        that key goes in 0.3.0)."""
        fields: dict[str, Any] = {"event": self.kind.value, "name": self.name, "resource": self.name}
        for name in (
            "duration",
            "attempts",
            "held_for",
            "late_by",
            "margin",
            "validity",
            "fencing_token",
            "grant",
            "handoff",
            "clock_jump",
        ):
            value = getattr(self, name)
            if value is not None:
                fields[name] = value
        if self.reason:
            fields["reason"] = self.reason
        if self.clock_fault:
            fields["clock_fault"] = self.clock_fault
        if self.watchdog:
            fields["watchdog"] = True
        if self.votes:
            fields["votes"] = {node: vote.value for node, vote in zip(self.nodes, self.votes, strict=True)}
        if self.quarantined:
            fields["quarantined"] = list(self.quarantined)
        return fields

    def __str__(self) -> str:
        parts = [f"redlock {self.name!r} {self.kind.value}"]
        parts += [f"{key}={value:.6f}" for key, value in self.fields().items() if isinstance(value, float)]
        if self.attempts is not None:
            parts.append(f"attempts={self.attempts}")
        if self.grant is not None:
            parts.append(f"grant={self.grant}")
        if self.reason:
            parts.append(f"({self.reason})")
        if self.outcomes:
            parts.append("votes: " + ", ".join(f"{o.node}={o.vote.value}" for o in self.outcomes))
        return " ".join(parts)


OnEvent: TypeAlias = Callable[[LockEvent], object]


def combine(*callbacks: OnEvent) -> OnEvent:
    """One callback that hands each event to every one of *callbacks*, in order.

    ``Redlock(on_event=[a, b])`` does this for you. What one callback raises is
    logged and dropped, and the others still run.
    """
    hooks = check_callbacks(callbacks)
    if len(hooks) == 1:
        return hooks[0]

    def each(event: LockEvent) -> None:
        for hook in hooks:
            try:
                hook(event)
            except Exception:
                log.exception("redlock %r: on_event callback %r failed", event.name, hook)

    return each


def as_hook(on_event: OnEvent | Iterable[OnEvent] | None) -> OnEvent | None:
    """What ``Redlock(on_event=...)`` takes: None, a callable, or a sequence of callables (combined).

    Anything else is a TypeError that says what to pass.
    """
    if on_event is None or callable(on_event):
        return on_event
    if isinstance(on_event, str | bytes) or not isinstance(on_event, Iterable):
        raise TypeError(
            f"on_event must be a function taking a LockEvent, a list of them, or None; got {type(on_event).__name__}"
        )
    hooks = check_callbacks(on_event)
    return combine(*hooks) if hooks else None


def check_callbacks(callbacks: Iterable[object]) -> tuple[OnEvent, ...]:
    """The callbacks, each checked to be callable (a TypeError saying which one is not)."""
    hooks: list[OnEvent] = []
    for i, hook in enumerate(callbacks):
        if not callable(hook):
            raise TypeError(
                f"on_event[{i}] must be a function taking a LockEvent, got {type(hook).__name__}: "
                "pass a callable, or a list of callables"
            )
        hooks.append(hook)
    return tuple(hooks)
