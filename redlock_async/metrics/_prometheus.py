"""Prometheus metrics for ``Redlock(on_event=Prometheus())``, through ``prometheus_client``."""

from __future__ import annotations

from typing import final

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from redlock_async.errors import NodeOutcome
from redlock_async.events import LockEvent
from redlock_async.metrics._meter import (
    ACQUIRE_BUCKETS,
    HOLD_BUCKETS,
    MARGIN_BUCKETS,
    EventMeter,
    NameAttribute,
)

__all__ = ["Prometheus"]


@final
class Prometheus(EventMeter):
    """Lock metrics in a ``prometheus_client`` registry (the default one unless *registry* is given).

    Pass it as ``Redlock(..., on_event=Prometheus())``; one instance serves any number of
    Redlocks. Its metrics are registered when it is made: make one per registry (a second
    on the same registry is a ValueError). *name_attribute* adds a ``lock`` label to the
    lock metrics, with the group it maps each lock's name to. The metrics are in docs/metrics.md.
    """

    def __init__(
        self, *, registry: CollectorRegistry | None = REGISTRY, name_attribute: NameAttribute | None = None
    ) -> None:
        super().__init__(name_attribute)
        lock = ["lock"] if self._group is not None else []
        self.registry = registry
        """Where the metrics are registered (None: nowhere, for tests of your own)."""
        made: list[Counter | Gauge | Histogram] = []
        try:
            self._acquire = Histogram(
                "redlock_lock_acquire_duration_seconds",
                "Seconds from an acquire's call to its grant or give-up, by outcome (acquired, not_acquired).",
                ["outcome", *lock],
                registry=registry,
                buckets=ACQUIRE_BUCKETS,
            )
            made.append(self._acquire)
            self._hold = Histogram(
                "redlock_lock_hold_duration_seconds",
                "Seconds from a lock's grant to its release or loss.",
                lock,
                registry=registry,
                buckets=HOLD_BUCKETS,
            )
            made.append(self._hold)
            self._lost = Counter("redlock_lock_lost", "Held locks that were lost.", lock, registry=registry)
            made.append(self._lost)
            self._votes = Counter(
                "redlock_node_votes",
                "Per-node votes of the requests that decided acquires (their last attempt), extensions and releases.",
                ["node", "vote"],
                registry=registry,
            )
            made.append(self._votes)
            self._margin = Histogram(
                "redlock_lock_extension_margin_seconds",
                "Validity the old lease still had when an extension was confirmed (near 0: nearly lost).",
                lock,
                registry=registry,
                buckets=MARGIN_BUCKETS,
            )
            made.append(self._margin)
            self._handoff = Histogram(
                "redlock_lock_handoff_duration_seconds",
                "Seconds from a release waking a waiter of this process to that waiter's grant.",
                lock,
                registry=registry,
                buckets=ACQUIRE_BUCKETS,
            )
            made.append(self._handoff)
            self._held_now = Gauge("redlock_lock_held", "Locks held now.", lock, registry=registry)
            made.append(self._held_now)
            self._quarantine_now = Gauge(
                "redlock_node_quarantined",
                "1 while a node is in restart quarantine (its yes votes count toward no quorum), else 0.",
                ["node"],
                registry=registry,
            )
        except ValueError as exc:
            if registry is not None:
                for metric in made:
                    registry.unregister(metric)
            raise ValueError(
                f"{exc}: these redlock metrics are already registered in this registry. "
                "Share one Prometheus() between Redlocks, or give each its own registry="
            ) from None
        # Children by label values, made once: labels() takes a lock and builds a tuple at each call.
        self._acquire_by: dict[tuple[str, str | None], Histogram] = {}
        self._votes_by: dict[tuple[str, object], Counter] = {}
        if self._group is None:
            self._hold_one, self._margin_one, self._handoff_one = self._hold, self._margin, self._handoff
            self._lost_one, self._held_one = self._lost, self._held_now

    def acquired(self, event: LockEvent, outcome: str, group: str | None) -> None:
        child = self._acquire_by.get((outcome, group))
        if child is None:
            child = self._acquire_by[outcome, group] = self._acquire.labels(outcome, *_labels(group))
        if event.duration is not None:
            child.observe(event.duration)

    def hold(self, seconds: float, group: str | None) -> None:
        (self._hold_one if group is None else self._hold.labels(group)).observe(seconds)

    def lost(self, event: LockEvent, group: str | None) -> None:
        (self._lost_one if group is None else self._lost.labels(group)).inc()

    def votes(self, outcomes: tuple[NodeOutcome, ...]) -> None:
        by = self._votes_by
        for outcome in outcomes:
            key = (outcome.node, outcome.vote)
            child = by.get(key)
            if child is None:
                child = by[key] = self._votes.labels(outcome.node, outcome.vote.value)
            child.inc()

    def margin(self, seconds: float, group: str | None) -> None:
        (self._margin_one if group is None else self._margin.labels(group)).observe(seconds)

    def handoff(self, seconds: float, group: str | None) -> None:
        (self._handoff_one if group is None else self._handoff.labels(group)).observe(seconds)

    def held(self, delta: int, group: str | None) -> None:
        (self._held_one if group is None else self._held_now.labels(group)).inc(delta)

    def quarantined(self, node: str, now: bool) -> None:
        self._quarantine_now.labels(node).set(1 if now else 0)


def _labels(group: str | None) -> tuple[str, ...]:
    return () if group is None else (group,)
