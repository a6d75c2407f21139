"""What both adapters share: which instrument each event moves, and what must be remembered between events.

An adapter subclasses :class:`EventMeter` and says how to record each measurement on its
instruments; the reading of events (which kind moves what, grants held now, nodes in
quarantine now) is written once, here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from redlock_async.errors import NodeOutcome
from redlock_async.events import EventKind, LockEvent

NameAttribute = Callable[[str], str]
"""Maps a lock's name to a low-cardinality group (``lambda name: name.split(":")[0]``)."""

ACQUIRE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Acquire and hand-off durations: from a fraction of a millisecond (uncontended, local) to the acquire timeout."""
HOLD_BUCKETS: Final = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)
"""Hold durations: a millisecond to hours (a watchdog keeps a lock for as long as its block runs)."""
MARGIN_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Extension margins: validity left when the extension was confirmed; near 0 means a lease nearly lost."""

ACQUIRED: Final = "acquired"
NOT_ACQUIRED: Final = "not_acquired"

_ACQUIRED, _NOT_ACQUIRED = EventKind.ACQUIRED, EventKind.NOT_ACQUIRED
_EXTENDED, _RELEASED, _LOST = EventKind.EXTENDED, EventKind.RELEASED, EventKind.LOST
_GRANTS_REMEMBERED = 100_000
"""Grants held at once that an adapter remembers; beyond, the oldest is forgotten (a lock dropped unreleased)."""


def check_name_attribute(name_attribute: NameAttribute | None) -> NameAttribute | None:
    if name_attribute is not None and not callable(name_attribute):
        raise TypeError(
            "name_attribute must be a function mapping a lock's name to a low-cardinality group "
            f"(e.g. lambda name: name.split(':')[0]), or None; got {type(name_attribute).__name__}"
        )
    return name_attribute


class EventMeter:
    """A callable for ``on_event=``: reads each event, and records it through the methods below."""

    def __init__(self, name_attribute: NameAttribute | None) -> None:
        self._group = check_name_attribute(name_attribute)
        self._held: dict[int, str | None] = {}  # grant -> its group, for the grants held now
        self._quarantined: set[str] = set()  # nodes in quarantine as of the last event that named them

    def __call__(self, event: LockEvent) -> None:
        kind = event.kind
        group = None if self._group is None else self._group(event.resource)
        if kind is _ACQUIRED or kind is _NOT_ACQUIRED:
            acquired = kind is _ACQUIRED
            self.acquired(event, ACQUIRED if acquired else NOT_ACQUIRED, group)
            if acquired:
                if event.handoff is not None:
                    self.handoff(event.handoff, group)
                if event.grant is not None and event.grant not in self._held:
                    if len(self._held) >= _GRANTS_REMEMBERED:
                        self._forget(next(iter(self._held)))
                    self._held[event.grant] = group
                    self.held(1, group)
            self.votes(event.outcomes)
        elif kind is _EXTENDED:
            if event.margin is not None:
                self.margin(event.margin, group)
            self.votes(event.outcomes)
        else:  # released or lost: the grant ends
            if event.held_for is not None:
                self.hold(event.held_for, group)
            if event.grant is not None and event.grant in self._held:
                self.held(-1, self._held.pop(event.grant))
            if kind is _LOST:
                self.lost(event, group)
            else:
                self.released(event)
                # The votes that decided a loss are left out: they can be a request an earlier event counted.
                self.votes(event.outcomes)
        if event.quarantined or self._quarantined:
            self._quarantine(event)

    def _quarantine(self, event: LockEvent) -> None:
        now = set(event.quarantined)
        for node in now - self._quarantined:
            self.quarantined(node, True)
        # A node leaves quarantine only by the word of an event of its own Redlock (one that has its vote):
        # Redlocks on other nodes, sharing this adapter, know nothing of it.
        named = {outcome.node for outcome in event.outcomes}
        for node in self._quarantined - now:
            if node in named:
                self.quarantined(node, False)
                self._quarantined.discard(node)
        self._quarantined |= now

    def _forget(self, grant: int) -> None:
        self.held(-1, self._held.pop(grant))

    # -- what an adapter records ---------------------------------------------------------------

    def acquired(self, event: LockEvent, outcome: str, group: str | None) -> None:
        """An acquire ended (*outcome* is ``acquired`` or ``not_acquired``): its duration, and a span."""
        raise NotImplementedError

    def hold(self, seconds: float, group: str | None) -> None:
        """A grant ended (released or lost) after *seconds*."""
        raise NotImplementedError

    def lost(self, event: LockEvent, group: str | None) -> None:
        """A held lock was lost."""
        raise NotImplementedError

    def released(self, event: LockEvent) -> None:
        """A held lock was released (nothing to record by default)."""

    def votes(self, outcomes: tuple[NodeOutcome, ...]) -> None:
        """The per-node votes of the request that decided an acquire, an extension or a release."""
        raise NotImplementedError

    def margin(self, seconds: float, group: str | None) -> None:
        """An extension was confirmed with *seconds* of the old validity left."""
        raise NotImplementedError

    def handoff(self, seconds: float, group: str | None) -> None:
        """A waiter woken by a release was granted the lock *seconds* later."""
        raise NotImplementedError

    def held(self, delta: int, group: str | None) -> None:
        """Locks held now changed by *delta* (+1 at a grant, -1 when it ends)."""
        raise NotImplementedError

    def quarantined(self, node: str, now: bool) -> None:
        """*node* went into restart quarantine (*now* True) or came out of it."""
        raise NotImplementedError
