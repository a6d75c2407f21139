"""What both adapters share: which measurement each event makes, and the counts kept between events.

An event is handed over on the event loop, inside the library's bookkeeping, at every acquire
and release: the adapters must cost little there. So the counters and gauges (votes, losses,
locks held now, nodes in quarantine now) are plain Python counts, kept here and read only when
the metrics are collected (a scrape, an export); the histograms are recorded by the adapter.
Collection may run in another thread (an exporter's, an HTTP server's): it reads copies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from redlock_async._core import Vote
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

_NAME_OF = {id(vote): vote.value for vote in Vote}  # by id: Enum.__hash__ is Python code

_ACQUIRED, _NOT_ACQUIRED = EventKind.ACQUIRED, EventKind.NOT_ACQUIRED
_EXTENDED, _RELEASED, _LOST = EventKind.EXTENDED, EventKind.RELEASED, EventKind.LOST

GRANTS_REMEMBERED: Final = 100_000
"""Grants held at once that an adapter remembers; beyond, the oldest is forgotten (a lock dropped unreleased)."""


def check_name_attribute(name_attribute: NameAttribute | None) -> NameAttribute | None:
    if name_attribute is not None and not callable(name_attribute):
        raise TypeError(
            "name_attribute must be a function mapping a lock's name to a low-cardinality group "
            f"(e.g. lambda name: name.split(':')[0]), or None; got {type(name_attribute).__name__}"
        )
    return name_attribute


class EventMeter:
    """A callable for ``on_event=``: reads each event, counts what it counts, and hands the rest on."""

    def __init__(self, name_attribute: NameAttribute | None) -> None:
        self._group = check_name_attribute(name_attribute)
        self._held: dict[int, str | None] = {}  # grant -> its group, for the grants held now
        self._held_by: dict[str | None, int] = {}  # group -> locks held now
        # group -> locks lost: 0 from the start (without groups) or from a group's first grant, so that a
        # series exists before its first loss and rate()/increase() count that loss too.
        self._lost_by: dict[str | None, int] = {None: 0} if self._group is None else {}
        self._patterns: dict[tuple[int, ...], int] = {}  # (id of nodes, id of each vote) -> events
        self._nodes_of: dict[int, tuple[str, ...]] = {}  # id -> the tuple of node names it is the id of
        self._quarantined: dict[str, bool] = {}  # node -> in quarantine, as of the last event that named it
        self._tells_releases = type(self).released is not EventMeter.released  # else not called at all

    def __call__(self, event: LockEvent) -> None:
        # Written flat (few calls): it runs at every acquire and release, on the event loop.
        kind = event.kind
        group = None if self._group is None else str(self._group(event.name))
        grant = event.grant
        counted = True  # the votes of this event are counted (all but a loss's)
        if kind is _ACQUIRED:
            self.acquired(event, ACQUIRED, group)
            if event.handoff is not None:
                self.handoff(event.handoff, group)
            held = self._held
            if grant is not None and grant not in held:
                if len(held) >= GRANTS_REMEMBERED:
                    self._held_by[held.pop(next(iter(held)))] -= 1  # a lock dropped unreleased: forgotten
                held[grant] = group
                self._held_by[group] = self._held_by.get(group, 0) + 1
                if group not in self._lost_by:
                    self._lost_by[group] = 0
        elif kind is _NOT_ACQUIRED:
            self.acquired(event, NOT_ACQUIRED, group)
        elif kind is _EXTENDED:
            if event.margin is not None:
                self.margin(event.margin, group)
        else:  # released or lost: the grant ends
            if event.held_for is not None:
                self.hold(event.held_for, group)
            if grant is not None and grant in self._held:
                self._held_by[self._held.pop(grant)] -= 1
            if kind is _LOST:
                self._lost_by[group] = self._lost_by.get(group, 0) + 1
                self.lost(event)
                # The votes that decided a loss are left out: they can be a request an earlier event counted.
                counted = False
            elif self._tells_releases:
                self.released(event)
        if counted:
            # Counted by pattern: (the nodes, each one's vote), by identity (a Redlock hands over the same
            # tuple of names each time, and votes are enum members): a tuple of ints made and hashed in C,
            # one dict update. Enum.__hash__ is Python code, and a loop over the nodes at each event cost
            # more than the rest of the adapter. The patterns are few; they are spread per node at collection.
            nodes = event.nodes
            key = (id(nodes), *map(id, event.votes))
            patterns = self._patterns
            count = patterns.get(key)
            if count is None:
                self._nodes_of[id(nodes)] = nodes  # kept alive: its id stays its own
                patterns[key] = 1
            else:
                patterns[key] = count + 1
        if event.quarantined or self._quarantined:
            self._quarantine(event)

    def _quarantine(self, event: LockEvent) -> None:
        quarantined = self._quarantined
        for node in event.quarantined:
            quarantined[node] = True
        # A node leaves quarantine only by the word of an event of its own Redlock (one that has its
        # vote): Redlocks on other nodes, sharing this adapter, know nothing of it.
        for node in event.nodes:
            if quarantined.get(node) and node not in event.quarantined:
                quarantined[node] = False

    # -- read at collection (any thread: copies) ----------------------------------------------

    def votes_now(self) -> list[tuple[str, str, int]]:
        """(node, vote, count) for every vote counted so far."""
        counts: dict[tuple[str, str], int] = {}
        for key, events in list(self._patterns.items()):
            nodes = self._nodes_of[key[0]]
            for node, vote in zip(nodes, key[1:]):  # noqa: B905 (one vote per node)
                pair = (node, _NAME_OF[vote])
                counts[pair] = counts.get(pair, 0) + events
        return [(node, vote, count) for (node, vote), count in counts.items()]

    def lost_now(self) -> list[tuple[str | None, int]]:
        """(group, locks lost so far); the group is None without ``name_attribute``."""
        return list(self._lost_by.items())

    def held_now(self) -> list[tuple[str | None, int]]:
        """(group, locks held now)."""
        return list(self._held_by.items())

    def quarantined_now(self) -> list[tuple[str, bool]]:
        """(node, in restart quarantine now) for every node an event named: False until one says it is."""
        quarantined = dict(self._quarantined)
        for nodes in list(self._nodes_of.values()):
            for node in nodes:
                quarantined.setdefault(node, False)
        return list(quarantined.items())

    # -- what an adapter records at each event --------------------------------------------------

    def acquired(self, event: LockEvent, outcome: str, group: str | None) -> None:
        """An acquire ended (*outcome* is ``acquired`` or ``not_acquired``): its duration, and a span."""
        raise NotImplementedError

    def hold(self, seconds: float, group: str | None) -> None:
        """A grant ended (released or lost) after *seconds*."""
        raise NotImplementedError

    def margin(self, seconds: float, group: str | None) -> None:
        """An extension was confirmed with *seconds* of the old validity left."""
        raise NotImplementedError

    def handoff(self, seconds: float, group: str | None) -> None:
        """A waiter woken by a release was granted the lock *seconds* later."""
        raise NotImplementedError

    def lost(self, event: LockEvent) -> None:
        """A held lock was lost (counted already)."""

    def released(self, event: LockEvent) -> None:
        """A held lock was released."""
